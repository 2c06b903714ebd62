//! A limit's kind built from its config and checked: the numbers the store must represent,
//! how it is charged, what it holds. Each kind checks its own keys in its file; here they are
//! tried in turn, so every limit's kind is chosen in one place.

use super::{bucket, concurrency, quota, reserve, Meter};
use crate::config::{Charge, ConfigError, LimitConfig, MAX_BURST};

/// A limit's rate (0 for a quota or a concurrency limit) and meter, built from its config
/// and checked: the numbers the store must represent, how it is charged, what it holds.
/// `descriptor`: the limit applies to Envoy's rate limit service, not to `/check`.
pub fn checked(
    config: &LimitConfig,
    descriptor: bool,
    at: &str,
) -> Result<(f64, Meter), ConfigError> {
    let (rate, meter) = checked_meter(config, descriptor, at)?;
    check_charge(config, at)?;
    Ok(match reserve::checked(config, descriptor, at)? {
        Some(reserve) => (rate, Meter::Reserve(reserve)),
        None => (rate, meter),
    })
}

/// Tokens per second (0 for a quota) and the meter, after checking the numbers the store must
/// represent: rate, burst or quota, refill time, cost.
fn checked_meter(
    config: &LimitConfig,
    descriptor: bool,
    at: &str,
) -> Result<(f64, Meter), ConfigError> {
    if config.lease_ttl_s.is_some() && config.concurrency.is_none() {
        return Err(ConfigError::new(
            format!("{at}.lease_ttl_s"),
            "applies only to a concurrency limit (concurrency = N)",
        ));
    }
    if config.concurrency.is_some() {
        let lease = concurrency::checked(config, descriptor, at)?;
        return Ok((0.0, Meter::Concurrency(lease)));
    }
    let (rate, meter) = if config.quota.is_some() || config.period.is_some() {
        (0.0, Meter::Quota(quota::checked(config, at)?))
    } else {
        (bucket::checked(config, at)?, Meter::Bucket)
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
