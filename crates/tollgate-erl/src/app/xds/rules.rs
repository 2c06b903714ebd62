//! The `RateLimitConfig` resources of envoyproxy/ratelimit's xDS config source decoded and
//! turned into the rules a YAML file of its config directory becomes (`tollgate_core::erl::config`). Each resource is one domain, as
//! each file is; the whole set is checked as a directory is, by [`check`], so a resource set
//! is refused exactly where the same YAML would be.

use std::collections::HashMap;

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Any, Struct, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig as XdsRateLimitConfig, RateLimitDescriptor, RateLimitUnit,
};
use prost::Message as _;

use tollgate_core::config::ConfigError;
use tollgate_core::erl::config::{check, RateLimitConfig, RuleConfig, Step};

/// The type of the resources asked for and accepted.
pub const RESOURCE_TYPE: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Deepest descriptor a resource may nest: the protocol allows about 100 levels, and every
/// node is a rule that holds its whole path.
pub const MAX_DEPTH: usize = 16;
/// Most descriptors one resource set may hold, all resources together: each is a rule, and a
/// rule with a rate is a limit with its own metric series.
pub const MAX_NODES: usize = 10_000;
/// Most bytes the rules' paths (every node's keys and values from the root) may take, all
/// together: a long key high in a deep tree is copied into every rule below it.
pub const MAX_PATH_BYTES: usize = 16 << 20;

/// The rules of a set of `RateLimitConfig` resources, in the order received. Refuses (naming
/// the resource) a resource of another type or that does not decode, an empty domain, a
/// domain in two resources, and everything [`check`] refuses in a YAML file.
pub fn rules_from_resources(resources: &[Any]) -> Result<Vec<RuleConfig>, ConfigError> {
    let mut configs = Vec::with_capacity(resources.len());
    for (i, resource) in resources.iter().enumerate() {
        let at = format!("xds resource {i}");
        if resource.type_url != RESOURCE_TYPE {
            return Err(ConfigError::new(
                at,
                format!("type {:?} is not {RESOURCE_TYPE}", resource.type_url),
            ));
        }
        let config = XdsRateLimitConfig::decode(resource.value.as_slice())
            .map_err(|e| ConfigError::new(at, format!("does not decode: {e}")))?;
        configs.push(config);
    }
    rules_from_configs(&configs)
}

/// [`rules_from_resources`] once decoded.
pub fn rules_from_configs(configs: &[XdsRateLimitConfig]) -> Result<Vec<RuleConfig>, ConfigError> {
    check_size(configs)?;
    let mut rules = Vec::new();
    let mut owners = Vec::new();
    let mut domains: HashMap<&str, &str> = HashMap::new();
    for config in configs {
        let at = format!("xds config {:?}", config.name);
        if config.domain.is_empty() {
            return Err(ConfigError::new(at, "config file cannot have empty domain"));
        }
        if let Some(first) = domains.insert(&config.domain, &config.name) {
            return Err(ConfigError::new(
                at,
                format!(
                    "duplicate domain {:?} in config file (also in {first:?})",
                    config.domain
                ),
            ));
        }
        let before = rules.len();
        flatten(&config.domain, &[], &config.descriptors, &mut rules);
        owners.extend(std::iter::repeat_n(at, rules.len() - before));
    }
    check(&rules, |i| owners.get(i).cloned().unwrap_or_default())?;
    Ok(rules)
}

/// Refuses, before anything is built, a set deeper than [`MAX_DEPTH`], with more than
/// [`MAX_NODES`] descriptors, or whose rules' paths would take more than [`MAX_PATH_BYTES`]:
/// what a set costs grows with its nodes times their depth, and one response of a few
/// hundred kB could otherwise take gigabytes.
fn check_size(configs: &[XdsRateLimitConfig]) -> Result<(), ConfigError> {
    let mut nodes = 0usize;
    let mut path_bytes = 0usize;
    for config in configs {
        let refuse =
            |reason: String| ConfigError::new(format!("xds config {:?}", config.name), reason);
        // (node, its depth, the bytes of its parent's path): iterative, whatever the depth.
        let mut pending: Vec<(&RateLimitDescriptor, usize, usize)> =
            config.descriptors.iter().map(|node| (node, 1, 0)).collect();
        while let Some((node, depth, above)) = pending.pop() {
            nodes += 1;
            if nodes > MAX_NODES {
                return Err(refuse(format!(
                    "the resources hold more than {MAX_NODES} descriptors"
                )));
            }
            if depth > MAX_DEPTH {
                return Err(refuse(format!(
                    "descriptors nest more than {MAX_DEPTH} deep (key {:?} at depth {depth})",
                    node.key
                )));
            }
            let here = above
                .saturating_add(node.key.len())
                .saturating_add(node.value.len());
            path_bytes = path_bytes.saturating_add(here);
            if path_bytes > MAX_PATH_BYTES {
                return Err(refuse(format!(
                    "the descriptors' paths take more than {MAX_PATH_BYTES} bytes"
                )));
            }
            pending.extend(
                node.descriptors
                    .iter()
                    .map(|child| (child, depth + 1, here)),
            );
        }
    }
    Ok(())
}

/// A descriptor tree as its nodes, depth first in the order given, each field where a YAML
/// node's field of the same name goes. The protocol has no `share_threshold` and no
/// `value_to_metric`: they stay off, as there.
fn flatten(
    domain: &str,
    path: &[Step],
    nodes: &[RateLimitDescriptor],
    rules: &mut Vec<RuleConfig>,
) {
    for node in nodes {
        let mut here = path.to_vec();
        here.push(Step {
            key: node.key.clone(),
            value: Some(node.value.clone()).filter(|value| !value.is_empty()),
        });
        rules.push(RuleConfig {
            domain: domain.to_string(),
            path: here.clone(),
            rate_limit: node.rate_limit.as_ref().map(|limit| RateLimitConfig {
                requests_per_unit: limit.requests_per_unit,
                unit: unit_name(limit.unit),
                unlimited: limit.unlimited,
                name: limit.name.clone(),
                replaces: limit.replaces.iter().map(|r| r.name.clone()).collect(),
            }),
            shadow_mode: node.shadow_mode,
            quota_mode: node.quota_mode,
            share_threshold: false,
            detailed_metric: node.detailed_metric,
            value_to_metric: false,
            metadata: node.metadata.as_ref().map(struct_to_json),
            limit: None,
        });
        flatten(domain, &here, &node.descriptors, rules);
    }
}

/// The enum's name as the YAML spells a unit; `UNKNOWN`, the protocol's unset value, is the
/// YAML's unit left out. A number the enum does not know stays a number, which no unit is.
fn unit_name(number: i32) -> String {
    match RateLimitUnit::try_from(number) {
        Ok(RateLimitUnit::Unknown) => String::new(),
        Ok(unit) => unit.as_str_name().to_ascii_lowercase(),
        Err(_) => number.to_string(),
    }
}

fn struct_to_json(value: &Struct) -> serde_json::Map<String, serde_json::Value> {
    value
        .fields
        .iter()
        .map(|(key, value)| (key.clone(), value_to_json(value)))
        .collect()
}

fn value_to_json(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => serde_json::Value::Object(struct_to_json(s)),
        Some(Kind::ListValue(list)) => {
            serde_json::Value::Array(list.values.iter().map(value_to_json).collect())
        }
    }
}

#[cfg(test)]
mod tests;
