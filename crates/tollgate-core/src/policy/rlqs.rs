//! `[[rlqs.buckets]]` compiled: which limit and key an Envoy quota bucket id stands for.
//! A rule naming a limit that does not exist, a limit that is no token bucket, or a key that
//! does not give one entry per part of the limit's key, is refused here (`validate` exits 2).

use std::collections::HashMap;

use crate::base::keys::KeyPart;
use crate::config::rlqs::{RlqsConfig, Unmatched};
use crate::config::ConfigError;
use crate::policy::limit::Limit;

/// The rules and settings of Envoy's quota service.
#[derive(Debug, Clone)]
pub struct RlqsRules {
    pub rules: Vec<RlqsRule>,
    pub unmatched: Unmatched,
    pub abandon_after_s: u64,
    pub assignment_ttl_s: u64,
    pub reserve: f64,
    /// How long one message's reports may take in the store (`rlqs.timeout_ms`).
    pub timeout: std::time::Duration,
    /// The most holders one pool takes (`rlqs.max_holders`).
    pub max_holders: u64,
}

/// One `[[rlqs.buckets]]`.
#[derive(Debug, Clone)]
pub struct RlqsRule {
    domain: Option<String>,
    matching: Vec<(String, String)>,
    /// The limit's index in the policy.
    pub limit: usize,
    /// The bucket id entries whose values are the limit's non-const key parts, in order.
    key: Vec<String>,
}

/// What a bucket id stands for: a limit (its index) and the key tail of its pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    pub limit: usize,
    pub tail: Vec<u8>,
}

/// No rules, and the settings' defaults (not zeros: a pool of at most 0 holders takes none).
impl Default for RlqsRules {
    fn default() -> Self {
        RlqsRules::settings(&RlqsConfig::default(), Vec::new())
    }
}

impl RlqsRules {
    pub fn compile(config: &RlqsConfig, limits: &[Limit]) -> Result<RlqsRules, ConfigError> {
        let mut rules = Vec::with_capacity(config.buckets.len());
        for (i, rule) in config.buckets.iter().enumerate() {
            let at = |field: &str| format!("rlqs.buckets[{i}].{field}");
            let Some(index) = limits.iter().position(|l| l.name == rule.limit) else {
                return Err(ConfigError::new(
                    at("limit"),
                    format!("no limit is named {:?}", rule.limit),
                ));
            };
            let limit = &limits[index];
            if !limit.meter.is_plain_bucket() {
                return Err(ConfigError::new(
                    at("limit"),
                    format!(
                        "limit {:?} is not a token bucket (a quota, concurrency or reserving \
                         limit cannot be shared among Envoys)",
                        limit.name
                    ),
                ));
            }
            let parts: Vec<&KeyPart> = limit
                .key
                .iter()
                .filter(|part| !matches!(part, KeyPart::Const(_)))
                .collect();
            if parts.len() != rule.key.len() {
                let names: Vec<String> = parts.iter().map(ToString::to_string).collect();
                return Err(ConfigError::new(
                    at("key"),
                    format!(
                        "limit {:?} is keyed on {} part(s) besides constants [{}]: give one \
                         bucket id entry per part, in that order (got {})",
                        limit.name,
                        parts.len(),
                        names.join(", "),
                        rule.key.len()
                    ),
                ));
            }
            rules.push(RlqsRule {
                domain: rule.domain.clone(),
                matching: rule
                    .matching
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                limit: index,
                key: rule.key.clone(),
            });
        }
        Ok(RlqsRules::settings(config, rules))
    }

    /// The rules with `config`'s settings.
    fn settings(config: &RlqsConfig, rules: Vec<RlqsRule>) -> RlqsRules {
        RlqsRules {
            rules,
            unmatched: config.unmatched,
            abandon_after_s: config.abandon_after_s,
            assignment_ttl_s: config.assignment_ttl_s,
            reserve: config.reserve,
            timeout: std::time::Duration::from_millis(config.timeout_ms),
            max_holders: config.max_holders,
        }
    }

    /// The first rule that applies to `bucket` in `domain`, and the key it gives; `None`
    /// when no rule applies or the one that does finds a key value missing or unusable.
    pub fn find(
        &self,
        domain: &str,
        bucket: &HashMap<String, String>,
        limits: &[Limit],
    ) -> Option<Mapped> {
        let rule = self.rules.iter().find(|rule| {
            rule.domain.as_deref().is_none_or(|d| d == domain)
                && rule
                    .matching
                    .iter()
                    .all(|(k, v)| bucket.get(k).is_some_and(|got| got == v))
        })?;
        let limit = limits.get(rule.limit)?;
        let mut entries = rule.key.iter();
        let values: Vec<String> = limit
            .key
            .iter()
            .map(|part| match part {
                KeyPart::Const(text) => Some(text.clone()),
                _ => entries
                    .next()
                    .and_then(|name| bucket.get(name))
                    .filter(|value| !value.is_empty())
                    .cloned(),
            })
            .collect::<Option<_>>()?;
        let tail = limit.tail_of_given(&values, 128).ok()?;
        Some(Mapped {
            limit: rule.limit,
            tail,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::observe::metrics::Metrics;
    use crate::policy::Policy;

    fn policy(toml: &str) -> Policy {
        use figment::providers::Format as _;
        let config: Config = figment::Figment::new()
            .merge(figment::providers::Toml::string(toml))
            .extract()
            .expect("a config");
        Policy::compile(&config, &Metrics::new()).expect("a valid config")
    }

    fn bucket(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_first_rule_whose_domain_and_match_hold_maps_the_id_with_constants_in_place() {
        let policy = policy(
            r#"
[[rlqs.buckets]]
domain = "edge"
match = { name = "route" }
limit = "per-route"
key = ["tenant", "route"]
[[rlqs.buckets]]
limit = "per-tenant"
key = ["tenant"]
[[limits]]
name = "per-route"
rate = 1
burst = 1
key = ["descriptor:tenant", "const:v1", "descriptor:route"]
[[limits]]
name = "per-tenant"
rate = 1
burst = 1
key = ["descriptor:tenant"]
"#,
        );
        let rules = &policy.rlqs;
        let limits = &policy.limits;
        let routed = bucket(&[("name", "route"), ("tenant", "acme"), ("route", "/a")]);
        let found = rules.find("edge", &routed, limits).expect("mapped");
        assert_eq!(found.limit, 0);
        assert_eq!(found.tail, b"acme|v1|/a".to_vec());
        // Another domain falls through to the catch-all rule.
        let found = rules.find("other", &routed, limits).expect("mapped");
        assert_eq!((found.limit, found.tail), (1, b"acme".to_vec()));
        // A missing or empty key entry is unmatched.
        assert_eq!(rules.find("other", &bucket(&[("name", "x")]), limits), None);
        assert_eq!(
            rules.find("other", &bucket(&[("tenant", "")]), limits),
            None
        );
        // Values are escaped as every key tail is.
        let odd = rules
            .find("other", &bucket(&[("tenant", "a|b")]), limits)
            .expect("mapped");
        assert_eq!(odd.tail, b"a%7Cb".to_vec());
    }
}
