//! `[envoy]`: envoyproxy/ratelimit's descriptor rules, one `[[envoy.rules]]` table per node of
//! its YAML tree, and the YAML itself read into the same rules (`yaml`, a directory of it in
//! `dir`). Both are checked here against what envoyproxy/ratelimit refuses when it loads a
//! configuration, so a file it would not load is not served here either. Beside them: its
//! metrics' settings ([`metrics`]), its xDS source's ([`xds`]; what that source sends is
//! decoded into these rules beside its client, in `tollgate_erl::app::xds::rules`), and its
//! environment ([`env`](mod@env)).
//!
//! A rule is one node: the domain, the path of entries from the root to the node (each a key
//! and, unless the node matches every value, a value that may hold `*` wildcards), and the
//! node's own settings. The order of the rules is the order of the YAML: a level's wildcards
//! are tried in that order.

use std::collections::HashSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use metrics::ErlMetricsConfig;
use xds::XdsConfig;

mod dir;
pub mod env;
pub mod metrics;
pub mod xds;
mod yaml;
pub mod yaml_bounds;

pub use dir::{fingerprint as dir_fingerprint, read_dir, read_file};
pub use yaml::from_yaml;

/// `[envoy]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErlConfig {
    /// envoyproxy/ratelimit YAML files, every file of this directory and its subdirectories
    /// not named `.*` (one domain each), read at start and whenever they change, served after
    /// `rules`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_dir: Option<PathBuf>,
    /// Its `MERGE_DOMAIN_CONFIG`: files of `config_dir` that name one domain add their
    /// descriptors to it (a descriptor declared twice is refused); else a domain in two files
    /// is refused.
    #[serde(skip_serializing_if = "is_false")]
    pub merge_domains: bool,
    /// envoyproxy/ratelimit's xDS config source: the rules of the `RateLimitConfig`
    /// resources a management server sends, served after `rules`. Not with `config_dir`:
    /// one source of the same rules, as there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xds: Option<XdsConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleConfig>,
    /// envoyproxy/ratelimit's global shadow mode (`SHADOW_MODE`): the request is always OK;
    /// descriptors still show OVER_LIMIT.
    #[serde(skip_serializing_if = "is_false")]
    pub shadow_mode: bool,
    /// Its global quota mode (`QUOTA_MODE`): every descriptor in quota mode.
    #[serde(skip_serializing_if = "is_false")]
    pub quota_mode: bool,
    /// Its `RESPONSE_DYNAMIC_METADATA`: answers carry `dynamic_metadata` (the domain, the
    /// descriptors, and the `metadata` of the rules of the descriptors that passed).
    #[serde(skip_serializing_if = "is_false")]
    pub dynamic_metadata: bool,
    /// Its `LIMIT_RESPONSE_HEADERS_ENABLED`: gRPC answers carry the `ratelimit` header family
    /// (named by `[response.ratelimit_names]`) besides `[response] headers`.
    #[serde(skip_serializing_if = "is_false")]
    pub response_headers: bool,
    /// envoyproxy/ratelimit's metrics, served under its names (`[envoy.metrics]`).
    #[serde(skip_serializing_if = "ErlMetricsConfig::is_default")]
    pub metrics: ErlMetricsConfig,
}

impl ErlConfig {
    /// The xDS settings, and that only one source of YAML rules is set.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.metrics.check()?;
        let Some(xds) = &self.xds else {
            return Ok(());
        };
        if self.config_dir.is_some() {
            return Err(ConfigError::new(
                "envoy.xds",
                "set config_dir or xds, not both: they are two sources of the same rules",
            ));
        }
        xds.check()
    }

    pub fn is_empty(&self) -> bool {
        self.config_dir.is_none()
            && self.xds.is_none()
            && self.rules.is_empty()
            && !self.shadow_mode
            && !self.quota_mode
            && !self.dynamic_metadata
            && !self.merge_domains
            && !self.response_headers
            && self.metrics.is_default()
    }
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub domain: String,
    /// The entries from the root to this node; the last one is the node itself.
    pub path: Vec<Step>,
    /// No `rate_limit`: a descriptor ending here is not limited (its nested rules still apply
    /// to longer descriptors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitConfig>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub shadow_mode: bool,
    /// Over its limit, the descriptor is OVER_LIMIT but the request is denied only when every
    /// quota-mode descriptor of it is.
    #[serde(default, skip_serializing_if = "is_false")]
    pub quota_mode: bool,
    /// One bucket for every value this node's wildcard matches.
    #[serde(default, skip_serializing_if = "is_false")]
    pub share_threshold: bool,
    /// envoyproxy/ratelimit's metrics of this rule are named by the request's values (see
    /// `erl::policy::StatsKey`); tollgate's own metrics never are.
    #[serde(default, skip_serializing_if = "is_false")]
    pub detailed_metric: bool,
    /// This key-only or wildcard node's level of that name is the request's value.
    #[serde(default, skip_serializing_if = "is_false")]
    pub value_to_metric: bool,
    /// Sent back in `dynamic_metadata` when this rule's descriptor passes (a table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The tollgate limit (metrics, overrides, store keys) of a rule with a rate: by default
    /// made from the rule's name, else its domain and path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

/// One entry of a path: a key, and the value unless the node matches every value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A node's `rate_limit`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    #[serde(default)]
    pub requests_per_unit: u32,
    /// second, minute, hour, day, week, month (30 days) or year (365 days), any case.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unit: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub unlimited: bool,
    /// Reported in `current_limit`; what other rules' `replaces` name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Rules (by name) switched off in a request that this rule applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// Units as Envoy's `RateLimitResponse.RateLimit.Unit` numbers them, with their length in
/// seconds (envoyproxy/ratelimit counts a month as 30 days and a year as 365).
pub const UNITS: [(&str, i32, u64); 7] = [
    ("second", 1, 1),
    ("minute", 2, 60),
    ("hour", 3, 3_600),
    ("day", 4, 86_400),
    ("month", 5, 30 * 86_400),
    ("year", 6, 365 * 86_400),
    ("week", 7, 7 * 86_400),
];

/// The unit's Envoy number and length in seconds; `None` for what is not a unit.
pub fn unit(name: &str) -> Option<(i32, u64)> {
    UNITS
        .iter()
        .find(|(unit, _, _)| unit.eq_ignore_ascii_case(name))
        .map(|&(_, number, seconds)| (number, seconds))
}

impl RuleConfig {
    /// `domain (k1, v1) (k2, *)`: how refusals name a rule.
    pub fn describe(&self) -> String {
        let mut text = self.domain.clone();
        for step in &self.path {
            match &step.value {
                Some(value) => text.push_str(&format!(" ({}, {value})", step.key)),
                None => text.push_str(&format!(" ({}, *)", step.key)),
            }
        }
        text
    }

    /// The node's map key as envoyproxy/ratelimit spells it: `key_value`, or `key`.
    pub fn composite(step: &Step) -> String {
        match &step.value {
            Some(value) if !value.is_empty() => format!("{}_{value}", step.key),
            _ => step.key.clone(),
        }
    }
}

/// What envoyproxy/ratelimit refuses in a set of rules (the nodes of one or more domains): an
/// empty domain or key, one node twice at a level, a unit it does not know (or one with
/// `unlimited`), an empty `replaces` or one naming its own rule, `share_threshold` without a
/// wildcard. `at(i)` names rule `i` in the error.
pub fn check(rules: &[RuleConfig], at: impl Fn(usize) -> String) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for (i, rule) in rules.iter().enumerate() {
        let refuse = |what: String| Err(ConfigError::new(at(i), what));
        if rule.domain.is_empty() {
            return refuse("the domain must not be empty".into());
        }
        let Some(last) = rule.path.last() else {
            return refuse(format!("{}: a rule needs a path", rule.describe()));
        };
        if rule.path.iter().any(|step| step.key.is_empty()) {
            return refuse(format!("{}: descriptor has an empty key", rule.describe()));
        }
        let composites: Vec<String> = rule.path.iter().map(RuleConfig::composite).collect();
        if !seen.insert((rule.domain.clone(), composites.clone())) {
            return refuse(format!(
                "{}: duplicate descriptor composite key {:?}",
                rule.describe(),
                format!("{}.{}", rule.domain, composites.join("."))
            ));
        }
        if let Some(limit) = &rule.rate_limit {
            let known = unit(&limit.unit).is_some();
            if limit.unlimited && known {
                return refuse(format!(
                    "{}: should not specify rate limit unit when unlimited",
                    rule.describe()
                ));
            }
            if !limit.unlimited && !known {
                return refuse(format!(
                    "{}: invalid rate limit unit {:?}",
                    rule.describe(),
                    limit.unit
                ));
            }
            for replaced in &limit.replaces {
                if replaced.is_empty() {
                    return refuse(format!(
                        "{}: should not have an empty replaces entry",
                        rule.describe()
                    ));
                }
                if *replaced == limit.name {
                    return refuse(format!(
                        "{}: replaces should not contain name of same descriptor",
                        rule.describe()
                    ));
                }
            }
        }
        if rule.share_threshold && !RuleConfig::composite(last).contains('*') {
            return refuse(format!(
                "{}: share_threshold can only be used with wildcard values",
                rule.describe()
            ));
        }
    }
    Ok(())
}

/// The `[[envoy.rules]]` and then those of `config_dir`, checked.
pub fn all_rules(config: &ErlConfig) -> Result<Vec<RuleConfig>, ConfigError> {
    check(&config.rules, |i| format!("envoy.rules[{i}]"))?;
    let mut rules = config.rules.clone();
    if let Some(dir) = &config.config_dir {
        rules.extend(read_dir(dir, config.merge_domains)?);
        let written = config.rules.len();
        check(&rules, |i| {
            if i < written {
                format!("envoy.rules[{i}]")
            } else {
                "envoy.config_dir".to_string()
            }
        })?;
    }
    Ok(rules)
}

/// [`all_rules`] and then `fed` (the rules an xDS server sent, checked on their own), checked
/// together: an xDS domain may not repeat a node of `[[envoy.rules]]`.
pub fn with_fed(config: &ErlConfig, fed: &[RuleConfig]) -> Result<Vec<RuleConfig>, ConfigError> {
    let mut rules = all_rules(config)?;
    if fed.is_empty() {
        return Ok(rules);
    }
    let written = rules.len();
    rules.extend_from_slice(fed);
    check(&rules, |i| {
        if i < written {
            format!("envoy.rules[{i}]")
        } else {
            "envoy.xds".to_string()
        }
    })?;
    Ok(rules)
}

#[cfg(test)]
mod tests;
