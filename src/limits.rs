//! Limits compiled from the config, and which of them apply to a request: match rules, the
//! bucket key, the cost, `on_missing`. The compiled set is a [`Policy`], swapped whole on
//! reload.

use std::borrow::Cow;

use crate::config::{Config, ConfigError, LimitConfig, MatchConfig, OnMissing, ResponseConfig};
use crate::grpc::DescriptorRule;
use crate::keys::{self, KeyPart};
use crate::metrics::{LimitCounters, Metrics};
use crate::request::{normalise, ClientIpPolicy, Described};
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
            // Spelled like a request's host is normalised: lower-case, no trailing dot.
            hosts: config
                .hosts
                .iter()
                .map(|h| h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase())
                .collect(),
            methods: config
                .methods
                .iter()
                .map(|m| m.to_ascii_uppercase())
                .collect(),
            // Spelled like a request's path is normalised, so `/api/./v1/` still matches.
            path_prefix: config
                .path_prefix
                .as_deref()
                .map(|prefix| normalise::path(Cow::Borrowed(prefix)).into_owned()),
        }
    }

    pub fn matches(&self, request: &Described<'_>) -> bool {
        // The request's host and path are normalised (lower-case host without port or trailing
        // dot; path without dot segments, doubled slashes or escaped unreserved characters).
        (self.hosts.is_empty() || self.hosts.iter().any(|h| *h == request.host))
            && (self.methods.is_empty()
                || self
                    .methods
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(&request.method)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};

    fn described<'a>(headers: &'a HeaderMap) -> Described<'a> {
        Described::new(headers, "GET", "/", "127.0.0.1".parse().unwrap())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn the_match_rules_are_spelled_like_the_normalised_request() {
        let matcher = Matcher::new(&MatchConfig {
            hosts: vec!["API.example.com.".into()],
            methods: vec!["post".into()],
            path_prefix: Some("/api/./v1/".into()),
            ..MatchConfig::default()
        });
        for (host, uri) in [
            ("api.example.com", "/api/v1/items"),
            ("Api.Example.com.:8443", "//api/%76%31/items"),
            ("api.example.com.", "/x/../api/v1/./items"),
        ] {
            let h = headers(&[
                ("x-forwarded-method", "POST"),
                ("x-forwarded-host", host),
                ("x-forwarded-uri", uri),
            ]);
            assert!(matcher.matches(&described(&h)), "{host} {uri}");
        }
        let h = headers(&[
            ("x-forwarded-method", "POST"),
            ("x-forwarded-host", "api.example.com"),
            ("x-forwarded-uri", "/api/v2/items"),
        ]);
        assert!(!matcher.matches(&described(&h)));
    }
}
