//! Limits compiled from the config, and which of them apply to a request: match rules, the
//! bucket key, the cost, `on_missing`. The compiled set is a [`Policy`], swapped whole on
//! reload.

use crate::config::{Config, ConfigError, LimitConfig, MatchConfig, OnMissing, ResponseConfig};
use crate::grpc::DescriptorRule;
use crate::keys::{self, KeyPart};
use crate::metrics::{LimitCounters, Metrics};
use crate::request::{ClientIpPolicy, Described};
use crate::store::BucketRequest;

/// One configured limit, ready for the hot path.
pub struct Limit {
    pub name: String,
    pub rate: f64,
    pub burst: u64,
    pub cost: u64,
    pub cost_header: Option<String>,
    pub shadow: bool,
    pub on_missing: OnMissing,
    pub key: Vec<KeyPart>,
    pub matcher: Matcher,
    /// Set for a limit of Envoy's rate limit service: it applies to descriptors, never to
    /// `/check`.
    pub descriptor: Option<DescriptorRule>,
    /// This limit's `RateLimit-Policy` item, `"<name>";q=<burst>;w=<window>`.
    pub policy_item: String,
    pub counters: LimitCounters,
}

/// `[limits.match]`: every given condition must hold.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    hosts: Vec<String>,
    methods: Vec<String>,
    path_prefix: Option<String>,
}

impl Matcher {
    fn new(config: &MatchConfig) -> Matcher {
        Matcher {
            hosts: config
                .hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            methods: config
                .methods
                .iter()
                .map(|m| m.to_ascii_uppercase())
                .collect(),
            path_prefix: config.path_prefix.clone(),
        }
    }

    pub fn matches(&self, request: &Described<'_>) -> bool {
        let host = request.host_without_port();
        (self.hosts.is_empty() || self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)))
            && (self.methods.is_empty()
                || self
                    .methods
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(request.method)))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|prefix| request.path.starts_with(prefix))
    }
}

impl Limit {
    fn compile(config: &LimitConfig, metrics: &Metrics) -> Limit {
        Limit {
            name: config.name.clone(),
            rate: config.rate,
            burst: config.burst,
            cost: config.cost,
            cost_header: config.cost_header.as_ref().map(|h| h.to_ascii_lowercase()),
            shadow: config.shadow,
            on_missing: config.on_missing,
            key: config
                .key
                .iter()
                .filter_map(|part| KeyPart::parse(part).ok())
                .collect(),
            matcher: Matcher::new(&config.matching),
            descriptor: DescriptorRule::compile(config),
            policy_item: format!(
                "\"{}\";q={};w={}",
                config.name,
                config.burst,
                crate::decision::ceil_secs(config.burst as f64 / config.rate)
            ),
            counters: metrics.limit_counters(&config.name),
        }
    }

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
    pub limits: Vec<Limit>,
    pub client_ip: ClientIpPolicy,
    pub response: ResponseConfig,
    pub key_prefix: String,
}

impl Policy {
    /// Compiles a validated config. Also re-validates, so a reload can never install a policy
    /// that start-up would refuse.
    pub fn compile(config: &Config, metrics: &Metrics) -> Result<Policy, ConfigError> {
        config.validate()?;
        Ok(Policy {
            limits: config
                .limits
                .iter()
                .map(|l| Limit::compile(l, metrics))
                .collect(),
            client_ip: ClientIpPolicy::from(&config.client_ip),
            response: config.response.clone(),
            key_prefix: config.store.key_prefix.clone(),
        })
    }

    /// The buckets this request must draw from, in limit order, each tagged with the index of
    /// its limit. Fails with the index of a limit whose key is missing under
    /// `on_missing = "deny"`.
    pub fn applicable(&self, request: &Described<'_>) -> Result<Vec<BucketRequest>, usize> {
        let mut buckets = Vec::with_capacity(self.limits.len());
        for (index, limit) in self.limits.iter().enumerate() {
            if limit.descriptor.is_some() || !limit.matcher.matches(request) {
                continue;
            }
            let anonymous = limit.on_missing == OnMissing::Anonymous;
            let key = match keys::bucket_key(
                &self.key_prefix,
                &limit.name,
                &limit.key,
                request,
                anonymous,
                self.client_ip.ipv6_prefix,
            ) {
                Ok(key) => key,
                Err(keys::MissingPart) if limit.on_missing == OnMissing::Deny => return Err(index),
                Err(keys::MissingPart) => continue,
            };
            buckets.push(BucketRequest {
                key,
                rate: limit.rate,
                burst: limit.burst as f64,
                cost: limit.cost_of(request),
                shadow: limit.shadow,
                limit: index,
            });
        }
        Ok(buckets)
    }
}
