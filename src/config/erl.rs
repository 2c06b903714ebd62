//! `[envoy]`: envoyproxy/ratelimit's descriptor rules, one `[[envoy.rules]]` table per node of
//! its YAML tree, and the YAML itself read into the same rules. Both are checked here against
//! what envoyproxy/ratelimit refuses when it loads a configuration, so a file it would not
//! load is not served here either.
//!
//! A rule is one node: the domain, the path of entries from the root to the node (each a key
//! and, unless the node matches every value, a value that may hold `*` wildcards), and the
//! node's own settings. The order of the rules is the order of the YAML: a level's wildcards
//! are tried in that order.

use std::collections::HashSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::erl_metrics::ErlMetricsConfig;
use super::xds::XdsConfig;
use super::ConfigError;

mod dir;
mod merge_and_headers_env;
pub mod yaml_bounds;

pub use dir::{fingerprint as dir_fingerprint, read_dir, read_file};

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
    /// `policy::descriptors::erl::StatsKey`); tollgate's own metrics never are.
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

/// Whether tollgate runs in envoyproxy/ratelimit's environment (see [`apply_erl_env`]).
pub fn in_erl_env(var: impl Fn(&str) -> Option<String>) -> bool {
    // CONFIG_TYPE counts only with one of its own values: another program's variable of that
    // name must not turn this on.
    // Spelled exactly, as ERL compares them: `file` stops it.
    let erl_config_type =
        var("CONFIG_TYPE").is_some_and(|kind| kind == "FILE" || kind == "GRPC_XDS_SOTW");
    var("RUNTIME_ROOT").is_some() || var("RUNTIME_SUBDIRECTORY").is_some() || erl_config_type
}

/// envoyproxy/ratelimit's environment, read when `RUNTIME_ROOT` or `RUNTIME_SUBDIRECTORY` is
/// set, or `CONFIG_TYPE` is `FILE` or `GRPC_XDS_SOTW` (deployments fed over xDS often set no
/// `RUNTIME_*`); never otherwise, so that a generic `PORT` never moves a tollgate that is not
/// standing in for it. What it sets wins over the file:
///
/// - `RUNTIME_ROOT` (default `/srv/runtime_data/current`), `RUNTIME_SUBDIRECTORY`,
///   `RUNTIME_APPDIRECTORY` (default `config`): `envoy.config_dir`, unless the file sets it;
/// - `GRPC_HOST`/`GRPC_PORT` (default `0.0.0.0:8081`): `grpc_listen`; `HOST`/`PORT`: `listen`;
/// - `REDIS_*`: the store, as envoyproxy/ratelimit reads them (see `config::erl_redis`);
///   an unset `REDIS_URL` is refused. A store failure answers an error, as there
///   (`store.on_error = "error"`), unless the file or `TOLLGATE_STORE__ON_ERROR` says
///   otherwise (`Config::load` knows what they said).
///
/// - `SHADOW_MODE`, `QUOTA_MODE`: `envoy.shadow_mode`, `envoy.quota_mode`.
/// - `CONFIG_TYPE=GRPC_XDS_SOTW` and its `CONFIG_GRPC_XDS_*`: `envoy.xds` instead of
///   `envoy.config_dir` (see [`super::xds::from_erl_env`]).
/// - `GRPC_SERVER_USE_TLS` true and its `GRPC_SERVER_TLS_*`, `GRPC_CLIENT_TLS_*`: `grpc_tls`
///   (see [`super::grpc_tls::from_erl_env`]).
/// - `TRACING_*` and `OTEL_EXPORTER_OTLP_*`: `tracing` (see [`super::trace::apply_erl_env`]).
///
/// - `MERGE_DOMAIN_CONFIG`, `LIMIT_RESPONSE_HEADERS_ENABLED` and its `LIMIT_*_HEADER` names
///   (see `merge_and_headers_env`).
///
/// A setting tollgate cannot honour without deciding differently is refused: `BACKEND_TYPE`
/// other than `redis` or empty, `CONFIG_TYPE` other than `FILE` or `GRPC_XDS_SOTW`, and those
/// `config::erl_refused` lists. Its other variables (tuning) are ignored.
pub fn apply_erl_env(
    config: &mut super::Config,
    var: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    if !in_erl_env(&var) {
        return Ok(());
    }
    // ERL reads its booleans with Go's strconv.ParseBool: anything else stops it, so it
    // stops tollgate too, rather than meaning false.
    let flag = |name: &str| {
        var(name).map_or(Ok(false), |text| {
            crate::base::go::parse_bool(&text)
                .ok_or_else(|| ConfigError::new(name, format!("{text:?} is not a bool")))
        })
    };
    // ERL takes `redis` and the empty string, nothing else, for its Redis backend.
    if let Some(backend) = var("BACKEND_TYPE").filter(|b| !b.is_empty() && b != "redis") {
        return Err(ConfigError::new(
            "BACKEND_TYPE",
            format!("{backend:?}: tollgate keeps its buckets in Redis only"),
        ));
    }
    match var("CONFIG_TYPE") {
        None => {}
        Some(kind) if kind == "FILE" => {}
        Some(kind) if kind == "GRPC_XDS_SOTW" => {
            config.envoy.xds = Some(super::xds::from_erl_env(&var)?);
        }
        Some(kind) => {
            return Err(ConfigError::new(
                "CONFIG_TYPE",
                format!("{kind:?} is neither FILE nor GRPC_XDS_SOTW"),
            ))
        }
    }
    super::erl_metrics::from_erl_env(&mut config.envoy.metrics, &var)?;
    let use_tls = flag("GRPC_SERVER_USE_TLS")?;
    config.grpc_tls = super::grpc_tls::from_erl_env(&var, use_tls)?.or(config.grpc_tls.take());
    merge_and_headers_env::apply(config, &var)?;
    config.envoy.shadow_mode |= flag("SHADOW_MODE")?;
    config.envoy.quota_mode |= flag("QUOTA_MODE")?;
    config.envoy.dynamic_metadata |= flag("RESPONSE_DYNAMIC_METADATA")?;
    super::trace::apply_erl_env(config, &var)?;
    if config.envoy.config_dir.is_none() && config.envoy.xds.is_none() {
        let mut dir = PathBuf::from(
            var("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into()),
        );
        dir.push(var("RUNTIME_SUBDIRECTORY").unwrap_or_default());
        dir.push(var("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
        config.envoy.config_dir = Some(dir);
    }
    // The variable at fault is named: the port unless it is plain decimal (a leading 0 is
    // octal to Go, so it is refused rather than read as decimal), else the host.
    let address = |host_var: &str, port_var: &str, default_port: &str| {
        let host = var(host_var).unwrap_or_else(|| "0.0.0.0".into());
        let port = var(port_var).unwrap_or_else(|| default_port.into());
        let decimal = port.bytes().all(|b| b.is_ascii_digit())
            && (port == "0" || !port.starts_with('0'))
            && port.parse::<u16>().is_ok();
        let text = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        match text.parse::<std::net::SocketAddr>() {
            Ok(address) if decimal => Ok(address),
            _ => Err(ConfigError::new(
                if decimal { host_var } else { port_var },
                format!("{text:?} is not a listen address"),
            )),
        }
    };
    if var("GRPC_HOST").is_some() || var("GRPC_PORT").is_some() || config.grpc_listen.is_none() {
        config.grpc_listen = Some(address("GRPC_HOST", "GRPC_PORT", "8081")?);
    }
    if var("HOST").is_some() || var("PORT").is_some() {
        config.listen = address("HOST", "PORT", "8080")?;
    }
    super::erl_redis::apply(config, &var)?;
    super::erl_refused::refuse_unsupported(&var)?;
    Ok(())
}

#[cfg(test)]
mod tests;
