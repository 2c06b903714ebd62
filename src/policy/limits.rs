//! One limit built from the config, and what it decides for one key: match rules, the bucket
//! key, per-key numbers (overrides), the cost, `on_missing`. The compiled set of limits is a
//! [`Policy`](crate::policy::Policy).
//!
//! Building a [`Limit`] from its [`LimitConfig`] is the one place a limit is checked: what
//! exists is valid, and nothing parses the config twice.

use crate::base::calendar::Period;
use crate::base::keys::{self, KeyPart, Source};
use crate::base::rate::{ceil_secs, count_f64};
use crate::config::{
    check_refill, valid_name, Charge, ConfigError, LimitConfig, OnMissing, RateSpec,
    ReservationExpiry, DEFAULT_LEASE_TTL_S, DEFAULT_RESERVATION_TTL_S, MAX_BURST, MAX_COST,
    MAX_LEASE_TTL_S, OVER_COST,
};
use crate::observe::metrics::LimitCounters;
use crate::policy::descriptors::DescriptorRule;
use crate::policy::matcher::Matcher;
use crate::policy::overrides::{Base, Override, Overrides};
use crate::policy::runtime_overrides::{Own, View};
use crate::request::OriginalRequest;
use crate::store::{BucketRequest, Lease, Meter, Reserve};

/// One configured limit, ready for the hot path.
pub struct Limit {
    pub name: String,
    /// Tokens per second; 0 for a quota.
    pub rate: f64,
    /// The bucket's capacity, or the quota.
    pub burst: u64,
    pub meter: Meter,
    pub charge: Charge,
    /// How far a report may drive the bucket below 0.
    pub max_debt: u64,
    pub cost: u64,
    pub cost_header: Option<String>,
    /// A reserving limit's least estimate (`reserve`, else 1), and the header that may raise it.
    pub reserve: u64,
    pub reserve_header: Option<String>,
    pub shadow: bool,
    /// This limit's checks may be answered from slices of borrowed tokens (`limiter::borrow`).
    pub borrow: bool,
    pub on_missing: OnMissing,
    pub key: Vec<KeyPart>,
    pub matcher: Matcher,
    pub overrides: Overrides,
    /// Set for a limit of Envoy's rate limit service: it applies to descriptors, never to
    /// `/check`.
    pub descriptor: Option<DescriptorRule>,
    /// This limit's `RateLimit-Policy` item, `"<name>";q=<burst>;w=<window>` (a quota's
    /// window is its period; a month's length is filled in per decision).
    pub policy_item: String,
    /// Detached until [`Policy::compile`](crate::policy::Policy::compile) gives it the exported counters.
    pub counters: LimitCounters,
}

/// A `RateLimit-Policy` item, `"<name>";q=<quota>;w=<window in seconds>`: the one spelling
/// of it, for the precomputed item of each limit and for a key with numbers of its own.
pub fn policy_item(name: &str, quota: u64, window_secs: u64) -> String {
    format!("\"{name}\";q={quota};w={window_secs}")
}

/// What building a limit takes: its table, and how an IPv6 client is keyed (an override's
/// `ip` value is keyed the same way).
#[derive(Clone, Copy)]
pub struct LimitInput<'a> {
    pub config: &'a LimitConfig,
    pub ipv6_prefix: u8,
    /// Whether a limit that says nothing of `borrow` borrows (the store's default).
    pub borrow: bool,
}

impl TryFrom<LimitInput<'_>> for Limit {
    type Error = ConfigError;

    fn try_from(input: LimitInput<'_>) -> Result<Limit, ConfigError> {
        let config = input.config;
        if !valid_name(&config.name) {
            return Err(ConfigError::new(
                "limits.name",
                format!(
                    "{:?} must match [a-z0-9_-]+ (at most 64 characters)",
                    config.name
                ),
            ));
        }
        let at = format!("limits.{}", config.name);
        let (rate, meter) = checked_meter(config, &at)?;
        check_charge(config, &at)?;
        let meter = match checked_reservation(config, &at)? {
            Some(reserve) => Meter::Reserve(reserve),
            None => meter,
        };
        let cost_header = header_name(config.cost_header.as_deref(), &at, "cost_header")?;
        let descriptor = DescriptorRule::compile(config);
        let borrow = checked_borrow(config, meter, descriptor.is_some(), &at)?
            .unwrap_or(input.borrow && borrowable(config, meter, descriptor.is_some()).is_ok());
        let reserve_header = header_name(config.reserve_header.as_deref(), &at, "reserve_header")?;
        let key = key_parts(&config.key, &at)?;
        let matcher = Matcher::compile(&config.matching, &format!("{at}.match"))?;
        DescriptorRule::check(config, &at)?;
        let base = Base {
            rate,
            burst: config.capacity(),
            cost: config.cost,
            debt: match config.charge {
                Charge::Report => config.max_debt(),
                Charge::Request => 0,
            },
            ipv6_prefix: input.ipv6_prefix,
            quota: matches!(meter, Meter::Quota(_)),
        };
        let overrides = Overrides::compile(
            &config.overrides,
            config.overrides_file.as_deref(),
            &key,
            base,
            &at,
        )?;
        Ok(Limit {
            name: config.name.clone(),
            rate,
            burst: config.capacity(),
            meter,
            charge: config.charge,
            max_debt: config.max_debt(),
            cost: config.cost,
            cost_header,
            reserve: config.reserve.unwrap_or(1),
            reserve_header,
            shadow: config.shadow,
            borrow,
            on_missing: config.on_missing,
            key,
            matcher,
            descriptor,
            overrides,
            policy_item: match meter {
                Meter::Bucket | Meter::Reserve(_) | Meter::Borrow(_) => policy_item(
                    &config.name,
                    config.burst,
                    ceil_secs(count_f64(config.burst) / rate),
                ),
                Meter::Quota(period) => policy_item(
                    &config.name,
                    config.capacity(),
                    period.fixed_secs().unwrap_or(30 * 86_400),
                ),
                Meter::Lease(lease) => {
                    policy_item(&config.name, config.capacity(), lease.ttl_ms / 1000)
                }
            },
            counters: LimitCounters::detached(),
        })
    }
}

/// A header name as the request reader looks it up (lower case), or a refusal naming `field`.
fn header_name(header: Option<&str>, at: &str, field: &str) -> Result<Option<String>, ConfigError> {
    header
        .map(|header| {
            actix_web::http::header::HeaderName::try_from(header)
                .map(|name| name.as_str().to_string())
                .map_err(|_| {
                    ConfigError::new(format!("{at}.{field}"), "is not a valid header name")
                })
        })
        .transpose()
}

/// A reserving limit's reservation (its id is drawn per check), after checking that the limit
/// is a `charge = "report"` bucket and the estimate fits its burst; `None` when the limit
/// reserves nothing.
fn checked_reservation(config: &LimitConfig, at: &str) -> Result<Option<Reserve>, ConfigError> {
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
    if DescriptorRule::is_descriptor_limit(config) {
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

/// Tokens per second (0 for a quota) and the meter, after checking the numbers the store must
/// represent: rate, burst or quota, refill time, cost.
fn checked_meter(config: &LimitConfig, at: &str) -> Result<(f64, Meter), ConfigError> {
    if config.lease_ttl_s.is_some() && config.concurrency.is_none() {
        return Err(ConfigError::new(
            format!("{at}.lease_ttl_s"),
            "applies only to a concurrency limit (concurrency = N)",
        ));
    }
    if config.concurrency.is_some() {
        return Ok((0.0, Meter::Lease(checked_concurrency(config, at)?)));
    }
    let (rate, meter) = if config.quota.is_some() || config.period.is_some() {
        (0.0, Meter::Quota(checked_quota(config, at)?))
    } else {
        (checked_bucket(config, at)?, Meter::Bucket)
    };
    if config.cost == 0 {
        return Err(ConfigError::new(format!("{at}.cost"), "must be >= 1"));
    }
    if config.cost > config.capacity() && config.charge == Charge::Request {
        return Err(ConfigError::new(
            format!("{at}.cost"),
            format!(
                "cost {} exceeds {} {}: no request could ever pass",
                config.cost,
                if config.quota.is_some() {
                    "quota"
                } else {
                    "burst"
                },
                config.capacity()
            ),
        ));
    }
    Ok((rate, meter))
}

/// A bucket's rate in tokens per second, after checking its burst and refill time.
fn checked_bucket(config: &LimitConfig, at: &str) -> Result<f64, ConfigError> {
    const NEEDS: &str =
        "(a bucket takes rate and burst; a quota, quota and period; a concurrency limit, concurrency)";
    let rate = config
        .rate
        .per_second()
        .map_err(|why| ConfigError::new(format!("{at}.rate"), format!("{why} {NEEDS}")))?;
    if config.burst == 0 || config.burst > MAX_BURST {
        return Err(ConfigError::new(
            format!("{at}.burst"),
            format!("must be between 1 and {MAX_BURST} {NEEDS}"),
        ));
    }
    // A bucket in debt refills its burst and its debt before the store may forget it.
    let debt = match config.charge {
        Charge::Report => config.max_debt(),
        Charge::Request => 0,
    };
    check_refill(rate, config.burst, debt, &format!("{at}.rate"))?;
    Ok(rate)
}

/// A concurrency limit's lease (its id is drawn per check), after checking that it has
/// `concurrency` and nothing of a bucket or a quota, and is charged by `/check` one lease at a
/// time.
fn checked_concurrency(config: &LimitConfig, at: &str) -> Result<Lease, ConfigError> {
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
            DescriptorRule::is_descriptor_limit(config),
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

/// A quota's period, after checking that it has quota and period and nothing of a bucket.
fn checked_quota(config: &LimitConfig, at: &str) -> Result<Period, ConfigError> {
    let Some(quota) = config.quota else {
        return Err(ConfigError::new(
            format!("{at}.quota"),
            "is required with period: at most this many per period",
        ));
    };
    let Some(period) = config.period else {
        return Err(ConfigError::new(
            format!("{at}.period"),
            "is required with quota: \"hour\", \"day\", \"week\" or \"month\"",
        ));
    };
    if quota == 0 || quota > MAX_BURST {
        return Err(ConfigError::new(
            format!("{at}.quota"),
            format!("must be between 1 and {MAX_BURST}"),
        ));
    }
    if config.rate != RateSpec::default() || config.burst != 0 {
        let key = if config.rate != RateSpec::default() {
            "rate"
        } else {
            "burst"
        };
        return Err(ConfigError::new(
            format!("{at}.{key}"),
            "a quota limit takes quota and period, not rate and burst (use two limits for both)",
        ));
    }
    if config.max_debt.is_some() {
        return Err(ConfigError::new(
            format!("{at}.max_debt"),
            "applies to buckets only: a report counts in full against a quota",
        ));
    }
    Ok(period)
}

/// Why a limit cannot borrow, if it cannot (this round): borrowing serves plain buckets
/// charged one token per `/check` request.
fn borrowable(config: &LimitConfig, meter: Meter, descriptor: bool) -> Result<(), &'static str> {
    if !matches!(meter, Meter::Bucket) {
        return Err("applies only to a rate limit (not a quota, concurrency or reserving limit)");
    }
    if config.charge != Charge::Request {
        return Err("does not apply to a charge = \"report\" limit");
    }
    if config.shadow {
        return Err("does not apply to a shadow limit");
    }
    if config.cost != 1 || config.cost_header.is_some() {
        return Err("applies only to a cost of one token per request (no cost, no cost_header)");
    }
    if descriptor {
        return Err("does not apply to a limit of Envoy's rate limit service (descriptors)");
    }
    Ok(())
}

/// `borrow` as the limit says it: `true` on a limit that cannot borrow is refused.
fn checked_borrow(
    config: &LimitConfig,
    meter: Meter,
    descriptor: bool,
    at: &str,
) -> Result<Option<bool>, ConfigError> {
    match config.borrow {
        Some(true) => borrowable(config, meter, descriptor)
            .map(|()| Some(true))
            .map_err(|why| ConfigError::new(format!("{at}.borrow"), why)),
        other => Ok(other),
    }
}

/// What `charge` allows: `max_debt` only with reports, no `cost_header` on a reported limit.
fn check_charge(config: &LimitConfig, at: &str) -> Result<(), ConfigError> {
    if config.charge == Charge::Request {
        if config.max_debt.is_some() {
            return Err(ConfigError::new(
                format!("{at}.max_debt"),
                "applies only with charge = \"report\"",
            ));
        }
        return Ok(());
    }
    if config.cost_header.is_some() {
        return Err(ConfigError::new(
            format!("{at}.cost_header"),
            "a charge = \"report\" limit is charged by POST /report, not by /check",
        ));
    }
    if config.max_debt.is_some_and(|debt| debt > MAX_BURST) {
        return Err(ConfigError::new(
            format!("{at}.max_debt"),
            format!("must be at most {MAX_BURST}"),
        ));
    }
    Ok(())
}

/// The key parts, at least one.
fn key_parts(parts: &[String], at: &str) -> Result<Vec<KeyPart>, ConfigError> {
    if parts.is_empty() {
        return Err(ConfigError::new(
            format!("{at}.key"),
            "needs at least one part, e.g. [\"ip\"]",
        ));
    }
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            KeyPart::parse(part).map_err(|why| ConfigError::new(format!("{at}.key[{i}]"), why))
        })
        .collect()
}

impl Limit {
    /// How far below 0 a key of this limit may go: `max_debt` for a `charge = "report"`
    /// limit, else 0. Whatever numbers a key gets, its bucket must refill this debt too within
    /// what the store can express.
    pub fn debt(&self) -> u64 {
        match self.charge {
            Charge::Report => self.max_debt,
            Charge::Request => 0,
        }
    }

    /// The numbers a runtime override keeps for what it leaves out.
    pub fn own(&self) -> Own {
        Own {
            rate: self.rate,
            burst: self.burst,
            debt: self.debt(),
            quota: matches!(self.meter, Meter::Quota(_)),
        }
    }

    /// The numbers of the bucket whose key ends in `tail`: a runtime override's, else the
    /// file's, else the limit's own; `None` when an override makes the key unlimited.
    ///
    /// The one place a key's numbers come from: `/check`, gRPC, `POST /report`, peek, reset
    /// and refund all ask here, so an override binds wherever the key is charged or read.
    pub fn numbers_for(&self, runtime: &View<'_>, tail: &[u8]) -> Option<Numbers> {
        let found = runtime
            .get(&self.name, self.own(), tail)
            .or_else(|| self.overrides.get(tail));
        match found {
            Some(Override::Unlimited) => None,
            Some(Override::Bucket { rate, burst }) => Some(Numbers {
                rate,
                burst,
                overridden: true,
            }),
            None => Some(self.own_numbers()),
        }
    }

    /// The limit's own numbers, as configured, whatever the overrides say.
    pub fn own_numbers(&self) -> Numbers {
        Numbers {
            rate: self.rate,
            burst: self.burst,
            overridden: false,
        }
    }

    /// The store key of this limit's bucket whose key ends in `tail`.
    pub fn store_key(&self, prefix: &str, tail: &[u8]) -> String {
        keys::assemble(prefix, &self.name, tail)
    }

    /// The request for this limit's (at `index` in its policy) bucket at `key`, with the key's
    /// `numbers` ([`Limit::numbers_for`]) and a `cost`: built alike for every path.
    ///
    /// A concurrency limit's request carries a fresh lease id: each check takes its own lease.
    pub fn bucket(&self, key: String, index: usize, numbers: Numbers, cost: u64) -> BucketRequest {
        let meter = match self.meter {
            Meter::Lease(lease) => Meter::Lease(Lease {
                id: fresh_lease_id(),
                ..lease
            }),
            Meter::Reserve(reserve) => Meter::Reserve(Reserve {
                id: fresh_lease_id(),
                ..reserve
            }),
            other => other,
        };
        BucketRequest {
            key,
            rate: numbers.rate,
            burst: count_f64(numbers.burst),
            cost,
            shadow: self.shadow,
            limit: index,
            meter,
        }
    }

    /// The id a client is given for the lease `lease` of this limit at store key `key`
    /// (`X-Tollgate-Lease`): `<limit>.<key tail in hex>.<lease id>`, visible ASCII, and all
    /// [`Policy::lease_of`](crate::policy::Policy::lease_of) needs to find the lease again.
    pub fn lease_id(&self, prefix: &str, key: &str, lease: Lease) -> String {
        self.held_id(prefix, key, &lease.member())
    }

    /// The id a client is given for the reservation of `estimate` tokens that a check took
    /// from this limit's bucket at `key` (`X-Tollgate-Reservation`): as a lease's,
    /// `<limit>.<key tail in hex>.<id>:<estimate>`, the last part as the store keeps it.
    pub fn reservation_id(
        &self,
        prefix: &str,
        key: &str,
        reserve: Reserve,
        estimate: u64,
    ) -> String {
        self.held_id(prefix, key, &reserve.member(estimate))
    }

    fn held_id(&self, prefix: &str, key: &str, member: &str) -> String {
        let tail = crate::observe::top::tail_of(key, prefix, &self.name);
        let mut id = String::with_capacity(self.name.len() + 2 * tail.len() + member.len() + 2);
        id.push_str(&self.name);
        id.push('.');
        for byte in tail.bytes() {
            id.push_str(&format!("{byte:02x}"));
        }
        id.push('.');
        id.push_str(member);
        id
    }

    /// The key tail of part values given explicitly (an admin query, a `POST /report` body),
    /// one per part in order: the tail `/check` builds for a request carrying them
    /// ([`keys::tail_of`] of typed values), an empty value standing for an absent part only under
    /// `on_missing = "anonymous"`, a `const` part's value its text. Fails with the index of the
    /// value at fault and why.
    pub fn tail_of_given(
        &self,
        values: &[String],
        ipv6_prefix: u8,
    ) -> Result<Vec<u8>, (usize, String)> {
        if values.len() != self.key.len() {
            let parts: Vec<String> = self.key.iter().map(ToString::to_string).collect();
            return Err((
                values.len().min(self.key.len()),
                format!(
                    "limit {:?} is keyed on {} part(s) [{}]: give one value per part, in that order (got {})",
                    self.name,
                    self.key.len(),
                    parts.join(", "),
                    values.len()
                ),
            ));
        }
        for (i, (part, value)) in self.key.iter().zip(values).enumerate() {
            if let KeyPart::Const(text) = part {
                if text != value {
                    return Err((i, format!("is the constant part {part}: give {text:?}")));
                }
            }
        }
        let anonymous = self.on_missing == OnMissing::Anonymous;
        keys::tail_of(&self.key, Source::Typed(values), anonymous, ipv6_prefix)
            .map_err(|bad| (bad.index, format!("({}) {}", self.key[bad.index], bad.why)))
    }

    /// What an override of this limit keeps for what it leaves out, and what it must fit.
    pub fn base(&self, ipv6_prefix: u8) -> Base {
        Base {
            rate: self.rate,
            burst: self.burst,
            cost: self.cost,
            debt: self.debt(),
            ipv6_prefix,
            quota: matches!(self.meter, Meter::Quota(_)),
        }
    }

    /// What this limit charges at `/check`: its configured cost or the cost header's; for a
    /// `charge = "report"` limit nothing (0 admits while it is not used up), or, when it
    /// reserves, the estimate.
    pub fn check_cost(&self, request: &OriginalRequest<'_>) -> u64 {
        match (self.charge, self.meter) {
            (Charge::Report, Meter::Reserve(_)) => self.estimate_of(request),
            (Charge::Report, _) => 0,
            (Charge::Request, _) => self.cost_of(request),
        }
    }

    /// A reserving limit's estimate: the `reserve_header` value when it is an integer above
    /// `reserve`, else `reserve` (as [`Limit::check_cost`] reads a cost header).
    fn estimate_of(&self, request: &OriginalRequest<'_>) -> u64 {
        self.reserve_header
            .as_deref()
            .and_then(|name| request.header(name))
            .and_then(header_cost)
            .map_or(self.reserve, |estimate| estimate.max(self.reserve))
    }

    /// The cost of this request: the `cost_header` value when it is an integer above the
    /// configured `cost`, else `cost`. The configured cost is the minimum: neither a smaller
    /// nor a malformed header makes a request cheaper. An integer above [`MAX_COST`] (however
    /// many digits) is [`OVER_COST`]: above every burst, so denied, never charged.
    fn cost_of(&self, request: &OriginalRequest<'_>) -> u64 {
        self.cost_header
            .as_deref()
            .and_then(|name| request.header(name))
            .and_then(header_cost)
            .map_or(self.cost, |cost| cost.max(self.cost))
    }
}

/// A lease id no other check draws: 128 random bits (from the OS; should it fail, from a
/// per-process random hasher over a counter and the time).
fn fresh_lease_id() -> u128 {
    let mut bytes = [0u8; 16];
    if getrandom::getrandom(&mut bytes).is_ok() {
        return u128::from_le_bytes(bytes);
    }
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let state = std::hash::RandomState::new();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (u128::from(state.hash_one((count, nanos))) << 64) | u128::from(state.hash_one((nanos, count)))
}

/// A cost header's value: ASCII digits (surrounding spaces allowed), at most [`MAX_COST`], or
/// [`OVER_COST`] for more digits than that; `None` for anything else. Allocates nothing.
fn header_cost(raw: &[u8]) -> Option<u64> {
    let digits = raw.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut cost: u64 = 0;
    for digit in digits {
        cost = cost * 10 + u64::from(digit - b'0');
        if cost > MAX_COST {
            return Some(OVER_COST);
        }
    }
    Some(cost)
}

/// A key's numbers, wherever they come from ([`Limit::numbers_for`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Numbers {
    /// Tokens per second; 0 for a quota.
    pub rate: f64,
    /// The bucket's capacity, or the quota.
    pub burst: u64,
    /// An override (runtime or file) gave them, not the limit itself.
    pub overridden: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_header_past_the_largest_cost_is_over_it_not_malformed() {
        assert_eq!(header_cost(b"4"), Some(4));
        assert_eq!(header_cost(b" 17 "), Some(17));
        assert_eq!(header_cost(b"1000000000"), Some(MAX_COST));
        assert_eq!(header_cost(b"1000000001"), Some(OVER_COST));
        assert_eq!(header_cost(b"18446744073709551615"), Some(OVER_COST));
        assert_eq!(header_cost(b"18446744073709551616"), Some(OVER_COST));
        assert_eq!(header_cost(&[b'9'; 4096]), Some(OVER_COST));
        for malformed in [&b""[..], b"-3", b"1.5", b"abc", b"1e9", b" ", b"+5"] {
            assert_eq!(header_cost(malformed), None, "{malformed:?}");
        }
    }
}
