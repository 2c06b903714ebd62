//! Limits built from the config, and which of them apply to a request: match rules, the
//! bucket key, per-key overrides, the cost, `on_missing`. The compiled set is a [`Policy`],
//! swapped whole on reload.
//!
//! Building a [`Limit`] from its [`LimitConfig`] is the one place a limit is checked: what
//! exists is valid, and nothing parses the config twice.

use std::collections::HashSet;

use crate::config::{
    check_burst, check_refill, valid_name, Config, ConfigError, LimitConfig, OnMissing,
    ResponseConfig,
};
use crate::exempt::{ExemptRule, Exemptions};
use crate::grpc::DescriptorRule;
use crate::keys::{self, KeyPart};
use crate::matcher::Matcher;
use crate::metrics::{LimitCounters, Metrics};
use crate::overrides::{Base, Override, Overrides};
use crate::rate::ceil_secs;
use crate::request::{ClientIpPolicy, Described};
use crate::store::BucketRequest;

/// One configured limit, ready for the hot path.
pub struct Limit {
    pub name: String,
    /// Tokens per second.
    pub rate: f64,
    pub burst: u64,
    pub cost: u64,
    pub cost_header: Option<String>,
    pub shadow: bool,
    pub on_missing: OnMissing,
    pub key: Vec<KeyPart>,
    pub matcher: Matcher,
    pub overrides: Overrides,
    /// Set for a limit of Envoy's rate limit service: it applies to descriptors, never to
    /// `/check`.
    pub descriptor: Option<DescriptorRule>,
    /// This limit's `RateLimit-Policy` item, `"<name>";q=<burst>;w=<window>`.
    pub policy_item: String,
    /// Detached until [`Policy::compile`] gives it the exported counters.
    pub counters: LimitCounters,
}

/// `"<name>";q=<burst>;w=<seconds to fill>`.
pub fn policy_item(name: &str, rate: f64, burst: u64) -> String {
    format!("\"{name}\";q={burst};w={}", ceil_secs(burst as f64 / rate))
}

/// What building a limit takes: its table, and how an IPv6 client is keyed (an override's
/// `ip` value is keyed the same way).
#[derive(Clone, Copy)]
pub struct LimitInput<'a> {
    pub config: &'a LimitConfig,
    pub ipv6_prefix: u8,
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
        let rate = checked_rate(config, &at)?;
        let cost_header = config
            .cost_header
            .as_deref()
            .map(|header| {
                actix_web::http::header::HeaderName::try_from(header)
                    .map(|name| name.as_str().to_string())
                    .map_err(|_| {
                        ConfigError::new(format!("{at}.cost_header"), "is not a valid header name")
                    })
            })
            .transpose()?;
        let key = key_parts(&config.key, &at)?;
        let matcher = Matcher::compile(&config.matching, &format!("{at}.match"))?;
        DescriptorRule::check(config, &at)?;
        let base = Base {
            rate,
            burst: config.burst,
            cost: config.cost,
            ipv6_prefix: input.ipv6_prefix,
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
            burst: config.burst,
            cost: config.cost,
            cost_header,
            shadow: config.shadow,
            on_missing: config.on_missing,
            key,
            matcher,
            descriptor: DescriptorRule::compile(config),
            overrides,
            policy_item: policy_item(&config.name, rate, config.burst),
            counters: LimitCounters::detached(),
        })
    }
}

/// Tokens per second, after checking the numbers the store must represent: rate, burst,
/// refill time, cost.
fn checked_rate(config: &LimitConfig, at: &str) -> Result<f64, ConfigError> {
    let rate = config
        .rate
        .per_second()
        .map_err(|why| ConfigError::new(format!("{at}.rate"), why))?;
    if config.cost == 0 {
        return Err(ConfigError::new(format!("{at}.cost"), "must be >= 1"));
    }
    check_burst(config.burst, 1, &format!("{at}.burst"))?;
    check_refill(rate, config.burst, &format!("{at}.rate"))?;
    if config.cost > config.burst {
        return Err(ConfigError::new(
            format!("{at}.cost"),
            format!(
                "cost {} exceeds burst {}: no request could ever pass",
                config.cost, config.burst
            ),
        ));
    }
    Ok(rate)
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
    /// The cost of this request: the `cost_header` value when it is an integer above the
    /// configured `cost`, else `cost`. The configured cost is the minimum: neither a smaller
    /// nor a malformed header makes a request cheaper.
    fn cost_of(&self, request: &Described<'_>) -> u64 {
        self.cost_header
            .as_deref()
            .and_then(|name| request.header(name))
            .and_then(|raw| std::str::from_utf8(raw).ok())
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map_or(self.cost, |cost| cost.max(self.cost))
    }
}

/// Everything a check needs that a reload may change.
pub struct Policy {
    pub exemptions: Exemptions,
    pub limits: Vec<Limit>,
    pub client_ip: ClientIpPolicy,
    pub response: ResponseConfig,
    pub key_prefix: String,
}

impl Policy {
    /// Builds every exemption and limit of a loaded config (which checked the rest) and
    /// resolves their counters; the first refused one is the error.
    pub fn compile(config: &Config, metrics: &Metrics) -> Result<Policy, ConfigError> {
        let exemptions = Exemptions::compile(&config.exempt, metrics)?;
        let mut names = HashSet::new();
        let mut limits = Vec::with_capacity(config.limits.len());
        for limit_config in &config.limits {
            let mut limit = Limit::try_from(LimitInput {
                config: limit_config,
                ipv6_prefix: config.client_ip.ipv6_prefix,
            })?;
            if !names.insert(limit_config.name.as_str()) {
                return Err(ConfigError::new(
                    format!("limits.{}.name", limit.name),
                    format!("duplicate limit name {:?}", limit.name),
                ));
            }
            limit.counters = metrics.limit_counters(&limit.name);
            limits.push(limit);
        }
        Ok(Policy {
            exemptions,
            limits,
            client_ip: ClientIpPolicy::from(&config.client_ip),
            response: config.response.clone(),
            key_prefix: config.store.key_prefix.clone(),
        })
    }

    /// The `[[exempt]]` rule that admits this request, if any.
    pub fn exempt(&self, request: &Described<'_>) -> Option<&ExemptRule> {
        self.exemptions.first_match(request)
    }

    /// The buckets this request must draw from, in limit order, each tagged with the index of
    /// its limit and carrying its key's policy (an override's numbers, if any). Fails with the
    /// index of a limit whose key is missing under `on_missing = "deny"`.
    pub fn applicable(&self, request: &Described<'_>) -> Result<Vec<BucketRequest>, usize> {
        let mut buckets = Vec::with_capacity(self.limits.len());
        for (index, limit) in self.limits.iter().enumerate() {
            if limit.descriptor.is_some() || !limit.matcher.matches(request) {
                continue;
            }
            let anonymous = limit.on_missing == OnMissing::Anonymous;
            let tail =
                match keys::bucket_tail(&limit.key, request, anonymous, self.client_ip.ipv6_prefix)
                {
                    Ok(tail) => tail,
                    Err(keys::MissingPart) if limit.on_missing == OnMissing::Deny => {
                        return Err(index)
                    }
                    Err(keys::MissingPart) => continue,
                };
            let (rate, burst) = match limit.overrides.get(&tail) {
                Some(Override::Unlimited) => continue,
                Some(Override::Bucket { rate, burst }) => (rate, burst),
                None => (limit.rate, limit.burst),
            };
            buckets.push(BucketRequest {
                key: keys::assemble(&self.key_prefix, &limit.name, &tail),
                rate,
                burst: burst as f64,
                cost: limit.cost_of(request),
                shadow: limit.shadow,
                limit: index,
            });
        }
        Ok(buckets)
    }
}
