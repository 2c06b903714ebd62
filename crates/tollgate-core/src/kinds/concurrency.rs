//! Leases held at once: at most `concurrency` (the request's `burst`), each check taking one
//! lease that lives `lease_ttl_s` unless given back before (`POST /release`); the rate is
//! unused. The key is its set of leases, each expiring on its own.

use serde::Serialize;

use super::twin::{Beside, Found, Keep, Kept, Stored};
use super::{
    can_pay, BucketOutcome, BucketRequest, Configured, Kind, LimitView, Meter, PeekView, Peeked,
    ReportCharge, ScriptArg, Window,
};
use crate::base::rate::count_f64;
use crate::base::rate::RateSpec;
use crate::config::{
    Charge, ConfigError, LimitConfig, DEFAULT_LEASE_TTL_S, MAX_BURST, MAX_LEASE_TTL_S,
};

/// One lease a check asks for: its id (unique per check), and how long it lives unreleased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub ttl_ms: u64,
    pub id: u128,
}

impl Lease {
    /// The id as stored (a member of the key's set): 32 lower-case hex digits.
    pub fn member(&self) -> String {
        format!("{:032x}", self.id)
    }

    /// A lease's member as a client gives it back (any case), as stored; `None` when it is
    /// not one.
    pub fn member_of(text: &str) -> Option<String> {
        (text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| text.to_ascii_lowercase())
    }

    /// A concurrency key's window as the headers show it: a slot frees whenever a holder
    /// releases, which no store can foresee, so a denial asks to retry in 1 s; the policy's
    /// window is the lease's lifetime.
    pub fn window(&self) -> Window {
        Window {
            ends_in_s: 1,
            length_s: self.ttl_ms.div_ceil(1000),
        }
    }
}

/// A concurrency limit's lease (its id is drawn per check), after checking that it has
/// `concurrency` and nothing of a bucket or a quota, and is charged by `/check` one lease at a
/// time (`descriptor`: the limit would apply to Envoy's rate limit service, which has no way
/// to release).
pub fn checked(config: &LimitConfig, descriptor: bool, at: &str) -> Result<Lease, ConfigError> {
    const ONE_OF: &str =
        "a concurrency limit takes concurrency (and lease_ttl_s), not rate, burst, quota or period (use two limits for both)";
    let concurrency = config.concurrency.unwrap_or_default();
    if concurrency == 0 || concurrency > MAX_BURST {
        return Err(ConfigError::new(
            format!("{at}.concurrency"),
            format!("must be between 1 and {MAX_BURST}"),
        ));
    }
    let other = [
        ("rate", config.rate != RateSpec::default()),
        ("burst", config.burst != 0),
        ("quota", config.quota.is_some()),
        ("period", config.period.is_some()),
    ];
    if let Some((key, _)) = other.iter().find(|(_, given)| *given) {
        return Err(ConfigError::new(format!("{at}.{key}"), ONE_OF));
    }
    let refused = [
        (
            "charge",
            config.charge != Charge::Request,
            "a concurrency limit is taken by /check and given back by POST /release",
        ),
        (
            "max_debt",
            config.max_debt.is_some(),
            "applies to buckets only",
        ),
        (
            "cost",
            config.cost != 1,
            "a request holds one lease of a concurrency limit",
        ),
        (
            "cost_header",
            config.cost_header.is_some(),
            "a request holds one lease of a concurrency limit",
        ),
        (
            "overrides",
            !config.overrides.is_empty() || config.overrides_file.is_some(),
            "are not supported on a concurrency limit yet",
        ),
        (
            "key",
            descriptor,
            "a concurrency limit applies to /check only: the gRPC service has no way to release",
        ),
    ];
    if let Some((key, _, why)) = refused.iter().find(|(_, given, _)| *given) {
        return Err(ConfigError::new(format!("{at}.{key}"), *why));
    }
    let ttl_s = config.lease_ttl_s.unwrap_or(DEFAULT_LEASE_TTL_S);
    if ttl_s == 0 || ttl_s > MAX_LEASE_TTL_S {
        return Err(ConfigError::new(
            format!("{at}.lease_ttl_s"),
            format!("must be between 1 and {MAX_LEASE_TTL_S} seconds"),
        ));
    }
    Ok(Lease {
        ttl_ms: ttl_s * 1000,
        id: 0,
    })
}

/// The free slots of a concurrency key whose leases the store counted as `stored` (absent:
/// all free).
#[expect(clippy::cast_precision_loss, reason = "leases held are at most 10^9")]
fn free(stored: Option<Stored>, burst: f64) -> f64 {
    stored.map_or(burst, |state| burst - state.debt as f64)
}

impl Kind for Lease {
    fn is_token_bucket(&self) -> bool {
        false
    }

    /// A lease with an id of its own.
    fn for_check(&self) -> Meter {
        Meter::Concurrency(Lease {
            id: super::fresh_id(),
            ..*self
        })
    }

    fn policy_window_secs(&self, _rate: f64, _burst: u64) -> u64 {
        self.ttl_ms / 1000
    }

    fn refuses_overrides(&self) -> Option<&'static str> {
        Some("is a concurrency limit")
    }

    fn limit_view(&self, limit: &Configured<'_>) -> LimitView {
        LimitView::Concurrency(Shown {
            concurrency: limit.burst,
            lease_ttl_s: self.ttl_ms / 1000,
        })
    }

    /// `L<ttl>:<lease>`.
    fn script_arg(&self, _rate: f64) -> ScriptArg {
        ScriptArg::Text(format!("L{}:{}", self.ttl_ms, self.member()))
    }

    fn peek_arg(&self, _rate: f64) -> ScriptArg {
        ScriptArg::Code("L")
    }

    fn level_scale(&self) -> f64 {
        1.0
    }

    /// Its lease's, whatever the reply.
    fn read_window(&self, _: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Window>> {
        Some(Some(self.window()))
    }

    fn find(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        _now_us: u64,
    ) -> (BucketOutcome, u64) {
        let tokens = free(stored, request.burst);
        let outcome = BucketOutcome {
            tokens,
            enough: can_pay(tokens, request.cost),
            window: Some(self.window()),
        };
        (outcome, 0)
    }

    /// The store adds the lease to its set itself (it knows the lease's id).
    fn charge(
        &self,
        request: &BucketRequest,
        _debt: u64,
        outcome: &mut BucketOutcome,
        _state: &mut Option<Stored>,
        _now_us: u64,
    ) {
        outcome.tokens -= count_f64(request.cost);
    }

    /// Never reported (a concurrency limit is charged by /check only): nothing changes.
    fn report(
        &self,
        charge: &ReportCharge,
        state: &mut Option<Stored>,
        _now_us: u64,
    ) -> BucketOutcome {
        let tokens = free(*state, charge.bucket.burst);
        BucketOutcome {
            tokens,
            enough: tokens >= 1.0,
            window: Some(self.window()),
        }
    }

    fn forget_at_us(&self, stored: &Stored, _rate: f64) -> u64 {
        stored.ts_us.saturating_add(self.ttl_ms * 1000)
    }

    /// Its leases held now, counted as the debt.
    fn find_in(
        &self,
        request: &BucketRequest,
        _stored: Option<Stored>,
        beside: &mut Beside,
        now_us: u64,
    ) -> Found {
        Found::stored(Some(Stored {
            debt: beside.held_leases(&request.key, now_us) as u64,
            ts_us: now_us,
        }))
    }

    /// Drops the expired leases and, when taken, adds this one; the key counts against the
    /// store's cap while it holds a lease, and its state is its leases.
    fn keep_in(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept {
        let key = &keep.request.key;
        let key_went = beside.prune_leases(key, keep.now_us);
        let mut key_came = false;
        if keep.allowed && keep.outcome.enough {
            let until = keep.now_us.saturating_add(self.ttl_ms.saturating_mul(1000));
            match beside.leases.get_mut(key.as_str()) {
                Some(set) => set.push((self.id, until)),
                None => {
                    beside.leases.insert(key.clone(), vec![(self.id, until)]);
                    key_came = true;
                }
            }
        }
        Kept {
            key_went,
            key_came,
            ..Kept::default()
        }
    }

    fn peek_in(
        &self,
        request: &BucketRequest,
        _stored: Option<Stored>,
        beside: &Beside,
        now_us: u64,
    ) -> BucketOutcome {
        let held = Stored {
            debt: beside.held_leases(&request.key, now_us) as u64,
            ts_us: now_us,
        };
        self.find(request, Some(held), now_us).0
    }

    fn peek_view(&self, request: &BucketRequest, peeked: &Peeked) -> PeekView {
        PeekView::Concurrency(Peek {
            concurrency: request.burst,
            held: request.burst - peeked.outcome.tokens,
            remaining: peeked.remaining,
            lease_ttl_s: self.ttl_ms / 1000,
        })
    }
}

impl Beside {
    /// Forgets a concurrency key's leases (a reset); whether it held any.
    pub fn forget_leases(&mut self, key: &str) -> bool {
        self.leases.remove(key).is_some()
    }

    /// Drops the concurrency keys whose leases all expired by `now_us` (as good as absent; a
    /// held lease is never dropped, that would admit one more than the limit); how many.
    pub(super) fn drop_expired_leases(&mut self, now_us: u64) -> usize {
        let before = self.leases.len();
        self.leases
            .retain(|_, set| set.iter().any(|(_, until)| *until > now_us));
        before - self.leases.len()
    }

    /// Leases of `key` held at `now_us`.
    fn held_leases(&self, key: &str, now_us: u64) -> usize {
        self.leases.get(key).map_or(0, |set| {
            set.iter().filter(|(_, until)| *until > now_us).count()
        })
    }

    /// Drops the expired leases of `key`, and the key once none is left; whether it went.
    fn prune_leases(&mut self, key: &str, now_us: u64) -> bool {
        let Some(set) = self.leases.get_mut(key) else {
            return false;
        };
        set.retain(|(_, until)| *until > now_us);
        if set.is_empty() {
            self.leases.remove(key);
            return true;
        }
        false
    }

    /// Gives back the lease `member` of `key` (`lua/release.lua`): whether it was held (not
    /// released before, not expired), and whether the key went with it (its last lease).
    pub fn release_lease(&mut self, key: &str, member: &str, now_us: u64) -> (bool, bool) {
        let Ok(id) = u128::from_str_radix(member, 16) else {
            return (false, false);
        };
        let held = self.leases.get_mut(key).is_some_and(|set| {
            let before = set.len();
            set.retain(|(lease, until)| !(*lease == id && *until > now_us));
            set.len() < before
        });
        (held, self.prune_leases(key, now_us))
    }
}

/// A concurrency limit as `GET /v1/limits` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shown {
    pub concurrency: u64,
    pub lease_ttl_s: u64,
}

/// A concurrency key as `GET /v1/buckets` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peek {
    pub concurrency: f64,
    /// Leases held now (unexpired, unreleased).
    pub held: f64,
    pub remaining: u64,
    pub lease_ttl_s: u64,
}
