//! Building a [`Limit`] from its config, and checking it: its kind (each kind checks its own
//! keys, [`kinds::build::checked`]), then its borrowing, headers and key parts. Each refusal
//! names the key at fault, so building a [`Limit`] is the one place a limit is checked.

use super::{policy_item, Limit};
use crate::base::keys::KeyPart;
use crate::config::{valid_name, Backend, Charge, ConfigError, LimitConfig, StoreConfig};
use crate::kinds::{self, Kind, Meter};
use crate::observe::metrics::LimitCounters;
use crate::policy::descriptors::DescriptorRule;
use crate::policy::matcher::Matcher;
use crate::policy::overrides::{Base, Overrides};

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
        let grpc = DescriptorRule::is_descriptor_limit(config);
        let (rate, meter) = kinds::build::checked(config, grpc, &at)?;
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
            quota: meter.period().is_some(),
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
            policy_item: policy_item(
                &config.name,
                config.capacity(),
                meter.policy_window_secs(rate, config.capacity()),
            ),
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
            http::HeaderName::try_from(header)
                .map(|name| name.as_str().to_string())
                .map_err(|_| {
                    ConfigError::new(format!("{at}.{field}"), "is not a valid header name")
                })
        })
        .transpose()
}

/// Why a limit cannot borrow, if it cannot (this round): borrowing serves plain buckets
/// charged one token per `/check` request.
pub fn borrowable(
    config: &LimitConfig,
    meter: Meter,
    descriptor: bool,
) -> Result<(), &'static str> {
    why_not_borrowing(
        meter,
        config.charge,
        config.shadow,
        config.cost,
        config.cost_header.is_some(),
        descriptor,
    )
}

/// [`borrowable`] from a limit's parts, so that a built [`Limit`] can say it too.
fn why_not_borrowing(
    meter: Meter,
    charge: Charge,
    shadow: bool,
    cost: u64,
    cost_header: bool,
    descriptor: bool,
) -> Result<(), &'static str> {
    if !meter.lends() {
        return Err("applies only to a rate limit (not a quota, concurrency or reserving limit)");
    }
    if charge != Charge::Request {
        return Err("does not apply to a charge = \"report\" limit");
    }
    if shadow {
        return Err("does not apply to a shadow limit");
    }
    if cost != 1 || cost_header {
        return Err("applies only to a cost of one token per request (no cost, no cost_header)");
    }
    if descriptor {
        return Err("does not apply to a limit of Envoy's rate limit service (descriptors)");
    }
    Ok(())
}

impl Limit {
    /// Whether this limit borrows and, when it does not, why (what `tollgate validate` prints
    /// for it): `store` is the store it was built for.
    pub fn borrowing(&self, store: &StoreConfig) -> String {
        if self.borrow {
            return "on".into();
        }
        if let Err(why) = why_not_borrowing(
            self.meter,
            self.charge,
            self.shadow,
            self.cost,
            self.cost_header.is_some(),
            self.descriptor.is_some(),
        ) {
            return format!("off: borrowing {why}");
        }
        if store.backend != Backend::Redis {
            return "off: only the Redis store borrows".into();
        }
        if matches!(self.meter, Meter::Global(_)) {
            return format!(
                "off: a global limit borrows only with limits.{}.borrow = true",
                self.name
            );
        }
        if store.borrow {
            return format!("off: limits.{}.borrow = false", self.name);
        }
        "off: store.borrow = false".into()
    }
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
