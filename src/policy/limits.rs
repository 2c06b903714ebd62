//! Limits built from the config, and which of them apply to a request: match rules, the
//! bucket key, per-key overrides, the cost, `on_missing`. The compiled set is a [`Policy`],
//! swapped whole on reload.
//!
//! Building a [`Limit`] from its [`LimitConfig`] is the one place a limit is checked: what
//! exists is valid, and nothing parses the config twice.
// Token and second arithmetic: every float <-> integer conversion is checked, and allowed only
// where a bound makes it exact (see rate::count_f64 and rate::whole).
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

use std::collections::HashSet;
use std::sync::Arc;

use crate::base::calendar::Period;
use crate::base::keys::{self, KeyPart};
use crate::base::rate::{ceil_secs, count_f64};
use crate::config::{
    check_refill, valid_name, Charge, Config, ConfigError, LimitConfig, OnMissing, RateSpec,
    ResponseConfig, MAX_BURST,
};
use crate::observe::metrics::{LimitCounters, Metrics};
use crate::policy::descriptors::envoy::EnvoyRules;
use crate::policy::descriptors::DescriptorRule;
use crate::policy::exempt::{ExemptRule, Exemptions};
use crate::policy::matcher::Matcher;
use crate::policy::overrides::{Base, Override, Overrides};
use crate::policy::runtime_overrides::{Own, RuntimeOverrides, View};
use crate::request::{ClientIpPolicy, OriginalRequest};
use crate::store::{BucketRequest, Meter};

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
    pub shadow: bool,
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
    /// Detached until [`Policy::compile`] gives it the exported counters.
    pub counters: LimitCounters,
}

/// `"<name>";q=<burst>;w=<seconds to fill>`.
pub fn policy_item(name: &str, rate: f64, burst: u64) -> String {
    format!(
        "\"{name}\";q={burst};w={}",
        ceil_secs(count_f64(burst) / rate)
    )
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
        let (rate, meter) = checked_meter(config, &at)?;
        check_charge(config, &at)?;
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
            burst: config.capacity(),
            cost: config.cost,
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
            shadow: config.shadow,
            on_missing: config.on_missing,
            key,
            matcher,
            descriptor: DescriptorRule::compile(config),
            overrides,
            policy_item: match meter {
                Meter::Bucket => policy_item(&config.name, rate, config.burst),
                Meter::Quota(period) => format!(
                    "\"{}\";q={};w={}",
                    config.name,
                    config.capacity(),
                    period.fixed_secs().unwrap_or(30 * 86_400)
                ),
            },
            counters: LimitCounters::detached(),
        })
    }
}

/// Tokens per second (0 for a quota) and the meter, after checking the numbers the store must
/// represent: rate, burst or quota, refill time, cost.
fn checked_meter(config: &LimitConfig, at: &str) -> Result<(f64, Meter), ConfigError> {
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
    const NEEDS: &str = "(a bucket takes rate and burst; a quota, quota and period)";
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
    check_refill(rate, config.burst + debt, &format!("{at}.rate"))?;
    Ok(rate)
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
    /// The numbers a runtime override keeps for what it leaves out.
    pub fn own(&self) -> Own {
        Own {
            rate: self.rate,
            burst: self.burst,
            quota: matches!(self.meter, Meter::Quota(_)),
        }
    }

    /// The rate and burst of the bucket whose key ends in `tail`: a runtime override's, else
    /// the file's, else the limit's own; `None` when an override makes the key unlimited.
    pub fn numbers_for(&self, runtime: &View<'_>, tail: &[u8]) -> Option<(f64, u64)> {
        let found = runtime
            .get(&self.name, self.own(), tail)
            .or_else(|| self.overrides.get(tail));
        match found {
            Some(Override::Unlimited) => None,
            Some(Override::Bucket { rate, burst }) => Some((rate, burst)),
            None => Some((self.rate, self.burst)),
        }
    }

    /// What this limit charges at `/check`: nothing for a `charge = "report"` limit (0 admits
    /// while it is not used up), else [`Limit::cost_of`].
    fn check_cost(&self, request: &OriginalRequest<'_>) -> u64 {
        match self.charge {
            Charge::Report => 0,
            Charge::Request => self.cost_of(request),
        }
    }

    /// The cost of this request: the `cost_header` value when it is an integer above the
    /// configured `cost`, else `cost`. The configured cost is the minimum: neither a smaller
    /// nor a malformed header makes a request cheaper.
    fn cost_of(&self, request: &OriginalRequest<'_>) -> u64 {
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
    /// The bearer token mutating admin requests need; `None` refuses them.
    pub admin_token: Option<String>,
    /// Overrides set through the admin API: they beat the file's, and every policy a reload
    /// installs shares the running one's ([`crate::limiter::Limiter::replace_policy`]).
    pub runtime: Arc<RuntimeOverrides>,
    /// envoyproxy/ratelimit's rules: they alone decide the descriptors of their domains.
    pub envoy: EnvoyRules,
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
            if !names.insert(limit_config.name.clone()) {
                return Err(ConfigError::new(
                    format!("limits.{}.name", limit.name),
                    format!("duplicate limit name {:?}", limit.name),
                ));
            }
            limit.counters = metrics.limit_counters(&limit.name);
            limits.push(limit);
        }
        let rules = crate::config::envoy::all_rules(&config.envoy)?;
        let (mut envoy, envoy_limits) = EnvoyRules::compile(&rules, limits.len(), &mut names)?;
        envoy.shadow_mode = config.envoy.shadow_mode;
        envoy.quota_mode = config.envoy.quota_mode;
        envoy.dynamic_metadata = config.envoy.dynamic_metadata;
        for limit_config in &envoy_limits {
            let mut limit = Limit::try_from(LimitInput {
                config: limit_config,
                ipv6_prefix: config.client_ip.ipv6_prefix,
            })
            .map_err(|e| e.within("envoy"))?;
            limit.counters = metrics.limit_counters(&limit.name);
            limits.push(limit);
        }
        Ok(Policy {
            exemptions,
            limits,
            client_ip: ClientIpPolicy::from(&config.client_ip),
            response: config.response.clone(),
            key_prefix: config.store.key_prefix.clone(),
            admin_token: config.admin_token()?,
            runtime: Arc::new(RuntimeOverrides::new(Some(
                metrics.runtime_overrides.clone(),
            ))),
            envoy,
        })
    }

    /// The `[[exempt]]` rule that admits this request, if any.
    pub fn exempt(&self, request: &OriginalRequest<'_>) -> Option<&ExemptRule> {
        self.exemptions.first_match(request)
    }

    /// The buckets this request must draw from, in limit order, each tagged with the index of
    /// its limit and carrying its key's policy (an override's numbers, if any: a runtime one
    /// before the file's). Fails with the
    /// index of a limit whose key is missing under `on_missing = "deny"`.
    pub fn applicable(&self, request: &OriginalRequest<'_>) -> Result<Vec<BucketRequest>, usize> {
        let mut buckets = Vec::with_capacity(self.limits.len());
        let runtime = self.runtime.view();
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
            let Some((rate, burst)) = limit.numbers_for(&runtime, &tail) else {
                continue;
            };
            buckets.push(BucketRequest {
                key: keys::assemble(&self.key_prefix, &limit.name, &tail),
                rate,
                burst: count_f64(burst),
                cost: limit.check_cost(request),
                shadow: limit.shadow,
                limit: index,
                meter: limit.meter,
            });
        }
        Ok(buckets)
    }
}
