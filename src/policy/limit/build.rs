//! Building a [`Limit`] from its config, and checking it: one function per meter kind
//! (`checked_bucket`, `checked_quota`, `checked_concurrency`, `checked_reservation`), then its
//! charge, headers and key parts. Each refusal names the key at fault, so building a
//! [`Limit`] is the one place a limit is checked.

use super::{policy_item, Limit};
use crate::base::calendar::Period;
use crate::base::keys::KeyPart;
use crate::base::rate::{ceil_secs, count_f64};
use crate::config::{
    check_refill, valid_name, Charge, ConfigError, LimitConfig, RateSpec, ReservationExpiry,
    DEFAULT_LEASE_TTL_S, DEFAULT_RESERVATION_TTL_S, MAX_BURST, MAX_LEASE_TTL_S,
};
use crate::observe::metrics::LimitCounters;
use crate::policy::descriptors::DescriptorRule;
use crate::policy::matcher::Matcher;
use crate::policy::overrides::{Base, Overrides};
use crate::store::{Lease, Meter, Reserve};

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
                Meter::Concurrency(lease) => {
                    policy_item(&config.name, config.capacity(), lease.ttl_ms / 1000)
                }
            },
            counters: LimitCounters::detached(),
        })
    }
}

/// A header name as the request reader looks it up (lower case), or a refusal naming `field`.
pub fn header_name(
    header: Option<&str>,
    at: &str,
    field: &str,
) -> Result<Option<String>, ConfigError> {
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
pub fn checked_reservation(config: &LimitConfig, at: &str) -> Result<Option<Reserve>, ConfigError> {
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
pub fn checked_meter(config: &LimitConfig, at: &str) -> Result<(f64, Meter), ConfigError> {
    if config.lease_ttl_s.is_some() && config.concurrency.is_none() {
        return Err(ConfigError::new(
            format!("{at}.lease_ttl_s"),
            "applies only to a concurrency limit (concurrency = N)",
        ));
    }
    if config.concurrency.is_some() {
        return Ok((0.0, Meter::Concurrency(checked_concurrency(config, at)?)));
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
pub fn borrowable(
    config: &LimitConfig,
    meter: Meter,
    descriptor: bool,
) -> Result<(), &'static str> {
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
pub fn checked_borrow(
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
pub fn check_charge(config: &LimitConfig, at: &str) -> Result<(), ConfigError> {
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
pub fn key_parts(parts: &[String], at: &str) -> Result<Vec<KeyPart>, ConfigError> {
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
