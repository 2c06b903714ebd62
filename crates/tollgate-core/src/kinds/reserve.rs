//! A reserving bucket: a token bucket (`charge = "report"`) whose check charges an estimate
//! and holds it as a reservation beside the bucket, until `POST /report` settles it with the
//! actual cost, once; an unsettled one expires after `reservation_ttl_s`, its estimate kept or
//! given back (`on_reservation_expiry`), and can still be settled late within a grace.

use serde::Serialize;

use super::tokens::{self, bucket_outcome, charged_debt, debt_now, give_back, write_debt};
use super::twin::{Beside, Found, Keep, Kept, Reservation, Stored};
use super::{
    BucketOutcome, BucketRequest, Configured, Kind, LimitView, Meter, PeekView, Peeked, Reserved,
    ScriptArg, Window,
};
use crate::config::{
    Charge, ConfigError, LimitConfig, ReservationExpiry, DEFAULT_RESERVATION_TTL_S, MAX_COST,
    MAX_LEASE_TTL_S,
};

/// How long after its expiry a reservation can still be settled, once (`LATE_GRACE_US` in
/// `lua/bounds.lua`).
pub const LATE_SETTLE_GRACE_US: u64 = 86_400 * 1_000_000;

/// The most expired reservations one bucket keeps for a late settle (`MAX_LATE` in
/// `lua/bounds.lua`); the oldest go first.
pub const MAX_LATE_SETTLES: usize = 10_000;

/// One reservation a check asks for: its id (unique per check), how long it is held
/// unsettled, and what happens to its estimate then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve {
    pub ttl_ms: u64,
    pub id: u128,
    /// An unsettled reservation's estimate is given back when it expires (else it is kept:
    /// the request is taken to have cost its estimate).
    pub refund: bool,
}

impl Reserve {
    /// The reservation as stored beside its bucket: `<id in 32 hex digits>:<estimate>`. The
    /// estimate is part of the member, so a settle names exactly what was held.
    pub fn member(&self, estimate: u64) -> String {
        format!("{:032x}:{estimate}", self.id)
    }

    /// The reservation a member names (as a client gives it back, any case), with its
    /// estimate; `None` when it is not one.
    pub fn of_member(self, member: &str) -> Option<(Reserve, u64)> {
        let (id, estimate) = member.split_once(':')?;
        let hex = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
        let digits = !estimate.is_empty() && estimate.bytes().all(|b| b.is_ascii_digit());
        (hex && digits).then_some(())?;
        let id = u128::from_str_radix(id, 16).ok()?;
        let estimate: u64 = estimate.parse().ok()?;
        (estimate <= MAX_COST).then_some((Reserve { id, ..self }, estimate))
    }

    /// What happens to an unsettled estimate at expiry, as the scripts read it: `r` refunded,
    /// `k` kept.
    pub fn expiry_code(&self) -> &'static str {
        if self.refund {
            "r"
        } else {
            "k"
        }
    }
}

impl From<Reserve> for Meter {
    fn from(reserve: Reserve) -> Meter {
        Meter::Reserve(reserve)
    }
}

/// A reserving limit's reservation (its id is drawn per check), after checking that the limit
/// is a `charge = "report"` bucket of `/check` (`descriptor`: it applies to Envoy's rate limit
/// service instead) and the estimate fits its burst; `None` when the limit reserves nothing.
pub fn checked(
    config: &LimitConfig,
    descriptor: bool,
    at: &str,
) -> Result<Option<Reserve>, ConfigError> {
    let reserves = config.reserve.is_some() || config.reserve_header.is_some();
    if !reserves {
        let stray = [
            ("reservation_ttl_s", config.reservation_ttl_s.is_some()),
            (
                "on_reservation_expiry",
                config.on_reservation_expiry.is_some(),
            ),
        ];
        if let Some((key, _)) = stray.iter().find(|(_, given)| *given) {
            return Err(ConfigError::new(
                format!("{at}.{key}"),
                "applies only to a reserving limit (reserve or reserve_header)",
            ));
        }
        return Ok(None);
    }
    let field = if config.reserve.is_some() {
        "reserve"
    } else {
        "reserve_header"
    };
    if config.charge != Charge::Report {
        return Err(ConfigError::new(
            format!("{at}.{field}"),
            "applies only with charge = \"report\": the estimate is settled by POST /report",
        ));
    }
    if config.concurrency.is_some() || config.quota.is_some() {
        return Err(ConfigError::new(
            format!("{at}.{field}"),
            "applies to token buckets (rate and burst) only",
        ));
    }
    if descriptor {
        return Err(ConfigError::new(
            format!("{at}.{field}"),
            "applies to /check only: a gRPC answer carries no reservation id",
        ));
    }
    if let Some(reserve) = config.reserve {
        if reserve == 0 || reserve > config.burst {
            return Err(ConfigError::new(
                format!("{at}.reserve"),
                format!(
                    "must be between 1 and the burst ({}): a larger estimate could never be reserved",
                    config.burst
                ),
            ));
        }
    }
    let ttl_s = config
        .reservation_ttl_s
        .unwrap_or(DEFAULT_RESERVATION_TTL_S);
    if ttl_s == 0 || ttl_s > MAX_LEASE_TTL_S {
        return Err(ConfigError::new(
            format!("{at}.reservation_ttl_s"),
            format!("must be between 1 and {MAX_LEASE_TTL_S} seconds"),
        ));
    }
    Ok(Some(Reserve {
        ttl_ms: ttl_s * 1000,
        id: 0,
        refund: config.on_reservation_expiry == Some(ReservationExpiry::Refund),
    }))
}

// A check charges the bucket the estimate, as a token bucket is charged (the trait's default);
// its reservation's record is the store's to write (it knows the id).
impl Kind for Reserve {
    fn is_token_bucket(&self) -> bool {
        true
    }

    /// A reservation with an id of its own.
    fn for_check(&self) -> Meter {
        Meter::Reserve(Reserve {
            id: super::fresh_id(),
            ..*self
        })
    }

    fn policy_window_secs(&self, rate: f64, burst: u64) -> u64 {
        tokens::policy_window_secs(rate, burst)
    }

    fn limit_view(&self, limit: &Configured<'_>) -> LimitView {
        LimitView::Reserving(Shown {
            rate_per_s: limit.rate,
            burst: limit.burst,
            reserve: limit.reserve,
            reserve_header: limit.reserve_header.map(str::to_owned),
            reservation_ttl_s: self.ttl_ms / 1000,
            on_reservation_expiry: if self.refund { "refund" } else { "keep" },
        })
    }

    /// `R<ttl>:<id>:<r|k>:<rate>`.
    fn script_arg(&self, rate: f64) -> ScriptArg {
        ScriptArg::Text(format!(
            "R{}:{:032x}:{}:{}",
            self.ttl_ms,
            self.id,
            self.expiry_code(),
            rate
        ))
    }

    /// `R<r|k><rate>`.
    fn peek_arg(&self, rate: f64) -> ScriptArg {
        ScriptArg::Text(format!("R{}{}", self.expiry_code(), rate))
    }

    fn level_scale(&self) -> f64 {
        tokens::MICRO
    }

    fn read_window(&self, _: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Window>> {
        Some(None)
    }

    fn holds_aside(&self) -> bool {
        true
    }

    /// Its reservations' estimates and how many hold them.
    fn read_held(&self, numbers: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Reserved>> {
        let tokens = numbers()?;
        let held = numbers()?;
        Some(Some(Reserved { tokens, held }))
    }

    /// Expired reservations go first, their estimates given back under `refund`, as the
    /// script does before it decides.
    fn find_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &mut Beside,
        now_us: u64,
    ) -> Found {
        let back = beside.sweep(&request.key, now_us, |_| self.refund);
        let mut state = stored;
        give_back(&mut state, back, now_us, request.rate);
        Found::stored(state)
    }

    /// A charged check holds its estimate as this reservation.
    fn keep_in(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept {
        if keep.charged() {
            beside
                .reservations
                .entry(keep.request.key.clone())
                .or_default()
                .push(Reservation {
                    id: self.id,
                    estimate: keep.request.cost,
                    until: keep.now_us.saturating_add(self.ttl_ms.saturating_mul(1000)),
                    refund: self.refund,
                });
        }
        let rate = keep.request.rate;
        Kept::stored(keep.state, |state| state.full_at_us(rate))
    }

    /// As the next check finds it: expired reservations given back under `refund`.
    fn peek_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &Beside,
        now_us: u64,
    ) -> BucketOutcome {
        let mut stored = stored;
        if let (true, Some(held)) = (self.refund, beside.reservations.get(request.key.as_str())) {
            let back = expired_estimates(held, now_us);
            give_back(&mut stored, back, now_us, request.rate);
        }
        tokens::find(request, stored, now_us).0
    }

    /// The reservations held now, and their estimates' sum.
    fn held_in(&self, key: &str, beside: &Beside, now_us: u64) -> Reserved {
        beside
            .reservations
            .get(key)
            .map_or_else(Reserved::default, |set| {
                let live = set.iter().filter(|r| r.until > now_us);
                Reserved {
                    tokens: live.clone().map(|r| r.estimate).sum(),
                    held: live.count() as u64,
                }
            })
    }

    fn peek_view(&self, request: &BucketRequest, peeked: &Peeked) -> PeekView {
        let held = peeked.held.unwrap_or_default();
        PeekView::Reserving(Peek {
            tokens: peeked.outcome.tokens,
            remaining: peeked.remaining,
            burst: request.burst,
            rate_per_s: request.rate,
            full_in_s: peeked.reset_secs,
            reservations: held.held,
            reserved: held.tokens,
            reservation_ttl_s: self.ttl_ms / 1000,
        })
    }
}

/// What the reservations of `held` expired by `now_us` had reserved.
fn expired_estimates(held: &[Reservation], now_us: u64) -> u64 {
    held.iter()
        .filter(|r| r.until <= now_us)
        .map(|r| r.estimate)
        .sum()
}

impl Beside {
    /// Moves the expired reservations of buckets gone full (`bucket`: whether a key is still
    /// stored) to the late ones: they have nothing left to give back, and go after their grace
    /// as Redis would find them; drops the late ones past it.
    pub(super) fn drop_idle_reservations(&mut self, now_us: u64, bucket: impl Fn(&str) -> bool) {
        let idle: Vec<String> = self
            .reservations
            .iter()
            .filter(|(key, set)| !set.iter().any(|r| r.until > now_us) && !bucket(key))
            .map(|(key, _)| key.clone())
            .collect();
        for key in idle {
            self.sweep(&key, now_us, |r| r.refund);
        }
        self.late.retain(|_, set| {
            set.retain(|r| r.until > now_us);
            !set.is_empty()
        });
    }

    /// Moves the expired reservations of bucket `key` to its late ones, each given back when
    /// `refund` says so, as `sweep` in `lua/stored.lua`; the tokens given back.
    pub(super) fn sweep(
        &mut self,
        key: &str,
        now_us: u64,
        refund: impl Fn(&Reservation) -> bool,
    ) -> u64 {
        let Some(held) = self.reservations.get_mut(key) else {
            return 0;
        };
        let (mut gone, live): (Vec<Reservation>, Vec<Reservation>) =
            held.iter().partition(|r| r.until <= now_us);
        if gone.is_empty() {
            return 0;
        }
        for r in &mut gone {
            r.refund = refund(r);
        }
        let back = gone.iter().filter(|r| r.refund).map(|r| r.estimate).sum();
        if live.is_empty() {
            self.reservations.remove(key);
        } else {
            *held = live;
        }
        let late = self.late.entry(key.to_owned()).or_default();
        late.retain(|r| r.until > now_us);
        late.extend(gone.into_iter().map(|r| Reservation {
            until: r.until.saturating_add(LATE_SETTLE_GRACE_US),
            ..r
        }));
        if late.len() > MAX_LATE_SETTLES {
            late.sort_unstable_by_key(|r| r.until);
            late.drain(..late.len() - MAX_LATE_SETTLES);
        }
        back
    }

    /// Settles the late reservation `id` of bucket `key` (expired, within its grace, not
    /// settled before): `None` when it is not there, else whether its expiry gave it back.
    fn take_late(&mut self, key: &str, id: u128, estimate: u64, now_us: u64) -> Option<bool> {
        let late = self.late.get_mut(key)?;
        late.retain(|r| r.until > now_us);
        let found = late
            .iter()
            .position(|r| r.id == id && r.estimate == estimate)
            .map(|at| late.swap_remove(at).refund);
        if late.is_empty() {
            self.late.remove(key);
        }
        found
    }

    /// Drops the reservations of bucket `key` that `gone` picks, and the key's set once empty;
    /// whether any was dropped.
    fn drop_reservations(&mut self, key: &str, gone: impl Fn(&Reservation) -> bool) -> bool {
        let Some(held) = self.reservations.get_mut(key) else {
            return false;
        };
        let before = held.len();
        held.retain(|r| !gone(r));
        let dropped = held.len() < before;
        if held.is_empty() {
            self.reservations.remove(key);
        }
        dropped
    }
}

/// A settle (`POST /report` with a reservation id): the reservation of the bucket `bucket`
/// (its numbers as a check finds them; `cost` is the actual cost) is replaced by the actual
/// cost: the difference refunded, or charged down to `-max_debt` at most.
#[derive(Debug, Clone, PartialEq)]
pub struct Settle {
    pub bucket: BucketRequest,
    /// The estimate the check charged.
    pub estimate: u64,
    pub max_debt: f64,
}

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settled {
    /// The reservation was open (held, or expired within [`LATE_SETTLE_GRACE_US`]) and is
    /// now settled; false when it was settled before or is unknown (then nothing was charged
    /// or refunded).
    pub held: bool,
    /// The bucket afterwards.
    pub outcome: BucketOutcome,
}

impl Settled {
    /// `lua/settle.lua`'s reply, `"held tokens"`; `None` when it is not one.
    pub fn read(reply: &str) -> Option<Settled> {
        let (held, tokens) = reply.split_once(' ')?;
        let tokens: f64 = tokens.parse().ok()?;
        Some(Settled {
            held: held == "1",
            outcome: BucketOutcome {
                tokens,
                enough: tokens >= 1.0,
                window: None,
            },
        })
    }
}

/// Settles a reservation that was `held` (else changes nothing): the actual cost replaces the
/// estimate, the difference given back or charged down to `-max_debt` at most. Mirrors
/// `lua/settle.lua`.
pub fn settle(
    settle: &Settle,
    held: bool,
    state: &mut Option<Stored>,
    now_us: u64,
) -> BucketOutcome {
    let request = &settle.bucket;
    let actual = request.cost;
    if held && actual < settle.estimate {
        give_back(state, settle.estimate - actual, now_us, request.rate);
    } else if held && actual > settle.estimate {
        let debt = debt_now(*state, now_us, request.rate);
        let charged = charged_debt(debt, request, actual - settle.estimate, settle.max_debt);
        write_debt(state, debt, charged, now_us);
    }
    bucket_outcome(request, debt_now(*state, now_us, request.rate))
}

/// Settles `reservation` of the bucket stored as `stored` in the memory store, at most once,
/// late too (`lua/settle.lua`): the bucket's state afterwards, and what the settle did.
pub fn settle_in(
    settle: &Settle,
    reservation: Reserve,
    stored: Option<Stored>,
    beside: &mut Beside,
    now_us: u64,
) -> (Option<Stored>, Settled) {
    let request = &settle.bucket;
    let back = beside.sweep(&request.key, now_us, |_| reservation.refund);
    let held = beside.drop_reservations(&request.key, |r| {
        r.id == reservation.id && r.estimate == settle.estimate
    });
    let late = if held {
        None
    } else {
        beside.take_late(&request.key, reservation.id, settle.estimate, now_us)
    };
    let mut state = stored;
    give_back(&mut state, back, now_us, request.rate);
    let outcome = if late == Some(true) {
        // Its estimate was given back at expiry (whatever this settle's mode): the whole
        // actual cost is charged.
        let unreserved = Settle {
            estimate: 0,
            ..settle.clone()
        };
        self::settle(&unreserved, true, &mut state, now_us)
    } else {
        self::settle(settle, held || late.is_some(), &mut state, now_us)
    };
    let settled = Settled {
        held: held || late.is_some(),
        outcome,
    };
    (state, settled)
}

/// A reserving limit as `GET /v1/limits` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shown {
    pub rate_per_s: f64,
    pub burst: u64,
    pub reserve: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_header: Option<String>,
    pub reservation_ttl_s: u64,
    pub on_reservation_expiry: &'static str,
}

/// A reserving bucket as `GET /v1/buckets` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peek {
    /// Tokens held now, the reservations' estimates already taken out.
    pub tokens: f64,
    pub remaining: u64,
    pub burst: f64,
    pub rate_per_s: f64,
    pub full_in_s: u64,
    /// Reservations held now (unexpired, unsettled), and their estimates' sum.
    pub reservations: u64,
    pub reserved: u64,
    pub reservation_ttl_s: u64,
}
