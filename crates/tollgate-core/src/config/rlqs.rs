//! `[rlqs]`: Envoy's quota service (`rate_limit_quota`), whose bucket ids `[[rlqs.buckets]]`
//! map to a limit and a key. The ranges are checked here; the rules against the limits they
//! name where the policy is built (`crate::policy::rlqs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlqsConfig {
    /// What a bucket id no rule maps gets.
    pub unmatched: Unmatched,
    /// A bucket without requests for this long is abandoned (Envoy forgets it).
    pub abandon_after_s: u64,
    /// The TTL of every assignment sent, whole seconds.
    pub assignment_ttl_s: u64,
    /// The part of a limit never handed out by demand, so a newcomer is served at once.
    pub reserve: f64,
    /// How long one message's reports may take in the store, waiting for their turn
    /// included; RLQS's own deadline, apart from a check's `store.timeout_ms`.
    pub timeout_ms: u64,
    /// The most holders (Envoy streams) one limit and key is shared among; a stream new to a
    /// full pool is given nothing until a holder leaves. It bounds what one report costs the
    /// store.
    pub max_holders: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<RlqsBucketConfig>,
}

impl Default for RlqsConfig {
    fn default() -> Self {
        RlqsConfig {
            unmatched: Unmatched::Allow,
            abandon_after_s: 300,
            assignment_ttl_s: 8,
            reserve: 0.05,
            timeout_ms: 1000,
            max_holders: 64,
            buckets: Vec::new(),
        }
    }
}

/// One rule: bucket ids of `domain` (any when absent) whose entries equal `match` are shares
/// of `limit`, keyed by the values of the `key` entries (one per part of the limit's key that
/// is not a `const:`, in order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlqsBucketConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(rename = "match", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub matching: BTreeMap<String, String>,
    pub limit: String,
    #[serde(default)]
    pub key: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unmatched {
    #[default]
    Allow,
    Deny,
}

/// The longest one message's reports may take in the store (`rlqs.timeout_ms`).
pub const MAX_TIMEOUT_MS: u64 = 5000;

/// The most `rlqs.max_holders` may be: a report's pass over the holders stays short.
pub const MAX_HOLDERS: u64 = 1024;

/// The longest TTL an assignment may have (an hour): a departed Envoy's share counts that long.
pub const MAX_ASSIGNMENT_TTL_S: u64 = 3600;

impl RlqsConfig {
    pub fn is_default(&self) -> bool {
        *self == RlqsConfig::default()
    }

    pub fn check(&self, grpc_listen: bool) -> Result<(), ConfigError> {
        if !(1..=MAX_ASSIGNMENT_TTL_S).contains(&self.assignment_ttl_s) {
            return Err(ConfigError::new(
                "rlqs.assignment_ttl_s",
                format!(
                    "must be between 1 and {MAX_ASSIGNMENT_TTL_S} (whole seconds; Envoy reports \
                     every 5 s, so under 6 lets assignments lapse between reports)"
                ),
            ));
        }
        if !(1..=86_400).contains(&self.abandon_after_s) {
            return Err(ConfigError::new(
                "rlqs.abandon_after_s",
                "must be between 1 and 86400",
            ));
        }
        if !(0.0..=0.5).contains(&self.reserve) {
            return Err(ConfigError::new(
                "rlqs.reserve",
                "must be between 0 and 0.5 (a fraction of each limit)",
            ));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(ConfigError::new(
                "rlqs.timeout_ms",
                format!(
                    "must be between 1 and {MAX_TIMEOUT_MS} (Envoy reports every 5 s: a message \
                     is answered within this)"
                ),
            ));
        }
        if !(2..=MAX_HOLDERS).contains(&self.max_holders) {
            return Err(ConfigError::new(
                "rlqs.max_holders",
                format!(
                    "must be between 2 and {MAX_HOLDERS} (Envoy streams sharing one limit and key)"
                ),
            ));
        }
        if !self.buckets.is_empty() && !grpc_listen {
            return Err(ConfigError::new(
                "rlqs.buckets",
                "Envoy's quota service is served on grpc_listen: set it",
            ));
        }
        for (i, rule) in self.buckets.iter().enumerate() {
            if rule.key.iter().any(String::is_empty) {
                return Err(ConfigError::new(
                    format!("rlqs.buckets[{i}].key"),
                    "a bucket id entry name must not be empty",
                ));
            }
            if rule.domain.as_deref() == Some("") {
                return Err(ConfigError::new(
                    format!("rlqs.buckets[{i}].domain"),
                    "must not be empty (leave it out for any domain)",
                ));
            }
        }
        Ok(())
    }
}
