//! envoyproxy/ratelimit's YAML: one file read as it reads it, into the rules of one domain.

use serde::Deserialize;

use super::{check, yaml_bounds, RateLimitConfig, RuleConfig, Step};
use crate::config::ConfigError;

/// The fields envoyproxy/ratelimit accepts anywhere in its YAML.
const YAML_FIELDS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

#[derive(Deserialize)]
struct YamlRoot {
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    descriptors: Option<Vec<YamlNode>>,
}

#[derive(Deserialize)]
struct YamlNode {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    descriptors: Option<Vec<YamlNode>>,
    #[serde(default)]
    shadow_mode: Option<bool>,
    #[serde(default)]
    quota_mode: Option<bool>,
    #[serde(default)]
    detailed_metric: Option<bool>,
    #[serde(default)]
    value_to_metric: Option<bool>,
    #[serde(default)]
    share_threshold: Option<bool>,
    #[serde(default)]
    metadata: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
struct YamlRateLimit {
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    unlimited: Option<bool>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Option<Vec<YamlReplaces>>,
}

#[derive(Deserialize)]
struct YamlReplaces {
    #[serde(default)]
    name: Option<String>,
}

/// One YAML file as envoyproxy/ratelimit reads it: the domain, and its tree as rules in the
/// file's order. Refuses (naming `file`) what it refuses: YAML it cannot parse, a field it
/// does not know at any depth (metadata aside), a list of something else than maps, a value
/// of another type than string, integer or bool, and everything [`check`] refuses; and,
/// before parsing, a text past the [`yaml_bounds`].
pub fn from_yaml(file: &str, text: &str) -> Result<(String, Vec<RuleConfig>), ConfigError> {
    let refuse = |why: String| ConfigError::new(file, why);
    yaml_bounds::check(text).map_err(refuse)?;
    let generic: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| refuse(format!("error loading config file: {e}")))?;
    match &generic {
        serde_yaml::Value::Mapping(map) => check_yaml_keys(map).map_err(refuse)?,
        serde_yaml::Value::Null => {}
        _ => return Err(refuse("config error, the file is not a map".into())),
    }
    let root: YamlRoot = serde_yaml::from_value(generic)
        .map_err(|e| refuse(format!("error loading config file: {e}")))?;
    let domain = root.domain.unwrap_or_default();
    if domain.is_empty() {
        return Err(refuse("config file cannot have empty domain".into()));
    }
    let mut rules = Vec::new();
    flatten(
        &domain,
        &[],
        root.descriptors.unwrap_or_default(),
        &mut rules,
    );
    check(&rules, |_| file.to_string())?;
    Ok((domain, rules))
}

fn check_yaml_keys(map: &serde_yaml::Mapping) -> Result<(), String> {
    for (key, value) in map {
        let Some(key) = key.as_str() else {
            return Err(format!(
                "config error, key is not of type string: {}",
                yaml_text(key)
            ));
        };
        if !YAML_FIELDS.contains(&key) {
            return Err(format!("config error, unknown key {key:?}"));
        }
        if key == "metadata" {
            continue;
        }
        check_yaml_value(value)?;
    }
    Ok(())
}

fn check_yaml_value(value: &serde_yaml::Value) -> Result<(), String> {
    use serde_yaml::Value;
    match value {
        Value::Sequence(items) => {
            for item in items {
                let Value::Mapping(map) = item else {
                    return Err(format!(
                        "config error, yaml file contains list of type other than map: {}",
                        yaml_text(item)
                    ));
                };
                check_yaml_keys(map)?;
            }
            Ok(())
        }
        Value::Mapping(map) => check_yaml_keys(map),
        Value::String(_) | Value::Bool(_) | Value::Null => Ok(()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(()),
        _ => Err("error checking config".into()),
    }
}

fn yaml_text(value: &serde_yaml::Value) -> String {
    serde_yaml::to_string(value)
        .map(|text| text.trim_end().to_string())
        .unwrap_or_default()
}

fn flatten(domain: &str, path: &[Step], nodes: Vec<YamlNode>, rules: &mut Vec<RuleConfig>) {
    for node in nodes {
        let mut here = path.to_vec();
        here.push(Step {
            key: node.key.unwrap_or_default(),
            value: node.value.filter(|value| !value.is_empty()),
        });
        rules.push(RuleConfig {
            domain: domain.to_string(),
            path: here.clone(),
            rate_limit: node.rate_limit.map(|limit| RateLimitConfig {
                requests_per_unit: limit.requests_per_unit.unwrap_or(0),
                unit: limit.unit.unwrap_or_default(),
                unlimited: limit.unlimited.unwrap_or(false),
                name: limit.name.unwrap_or_default(),
                replaces: limit
                    .replaces
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| r.name.unwrap_or_default())
                    .collect(),
            }),
            shadow_mode: node.shadow_mode.unwrap_or(false),
            quota_mode: node.quota_mode.unwrap_or(false),
            share_threshold: node.share_threshold.unwrap_or(false),
            detailed_metric: node.detailed_metric.unwrap_or(false),
            value_to_metric: node.value_to_metric.unwrap_or(false),
            metadata: node
                .metadata
                .and_then(|m| serde_json::to_value(m).ok())
                .and_then(|v| match v {
                    serde_json::Value::Object(map) => Some(map),
                    _ => None,
                }),
            limit: None,
        });
        flatten(domain, &here, node.descriptors.unwrap_or_default(), rules);
    }
}
