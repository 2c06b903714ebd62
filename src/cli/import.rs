//! `tollgate import envoy-ratelimit FILE...`: envoyproxy/ratelimit's YAML as tollgate TOML.
//!
//! Every node of a domain's descriptor tree becomes one `[[envoy.rules]]` table (its domain,
//! the path of entries from the root to it, its settings), in the file's order, so tollgate
//! walks the same tree envoyproxy/ratelimit walks and decides what the YAML decides. A file
//! envoyproxy/ratelimit would refuse is refused (exit 2, one line naming the file and the
//! rule), and so is a domain in two files unless `merge_domains` (envoyproxy/ratelimit's
//! `MERGE_DOMAIN_CONFIG`: the files' descriptors join one domain, a descriptor two of them
//! declare is refused). A file larger than 1 MiB, or nested deeper than the YAML parser's limit,
//! is refused before it is parsed, as in serving. What is accepted but has no effect here (the
//! metric flags) is named in a comment.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use tollgate_core::config::{Config, ConfigError};
use tollgate_core::erl::config::{self as erl, RuleConfig};
use tollgate_core::erl::policy::ErlRules;

/// A file that could not be read, parsed or accepted: its path and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ImportError(ConfigError);

/// Reads and converts the files, in order, into one TOML document.
pub fn envoy_ratelimit(
    files: &[impl AsRef<Path>],
    merge_domains: bool,
) -> Result<String, ImportError> {
    let mut rules = Vec::new();
    let mut sources = Vec::new();
    let mut domains = BTreeMap::new();
    for file in files {
        let name = file.as_ref().display().to_string();
        let (domain, file_rules) = erl::read_file(file.as_ref()).map_err(ImportError)?;
        let merged = match domains.insert(domain.clone(), name.clone()) {
            Some(first) if !merge_domains => {
                return Err(ImportError(ConfigError::new(
                    name,
                    format!("duplicate domain {domain:?} in config file (also in {first})"),
                )));
            }
            Some(_) => true,
            None => false,
        };
        sources.push((
            name.clone(),
            domain,
            rules.len()..rules.len() + file_rules.len(),
        ));
        rules.extend(file_rules);
        if merged {
            erl::check(&rules, |_| name.clone()).map_err(ImportError)?;
        }
    }
    // The limit names tollgate would give the rules beside its default limits, written out
    // so that the store keys stay put when rules are added later.
    let mut taken: HashSet<String> = Config::default()
        .limits
        .iter()
        .map(|l| l.name.clone())
        .collect();
    let (_, limits) = ErlRules::compile(&rules, 0, &mut taken).map_err(ImportError)?;
    let mut names = limits.iter().map(|l| l.name.clone());
    let mut text = String::from(
        "# Converted from envoyproxy/ratelimit configuration by `tollgate import envoy-ratelimit`.\n\
         # Serve it to Envoy with grpc_listen. Each rule is a node of the YAML's tree, matched as\n\
         # envoyproxy/ratelimit matches it; a window of N per unit became a token bucket of N per\n\
         # unit with a burst of N, which never admits 2N across a window's edge.\n",
    );
    for (file, domain, range) in &sources {
        let _ = writeln!(text, "\n# ---- {file}: domain {domain:?}");
        for rule in &rules[range.clone()] {
            let mut rule = rule.clone();
            if rule
                .rate_limit
                .as_ref()
                .is_some_and(|r| !r.unlimited && r.requests_per_unit > 0)
            {
                rule.limit = names.next();
            }
            write_rule(&mut text, &rule);
        }
    }
    Ok(text)
}

fn write_rule(text: &mut String, rule: &RuleConfig) {
    let _ = writeln!(text, "\n# {}", rule.describe());
    if rule.detailed_metric || rule.value_to_metric {
        let _ = writeln!(
            text,
            "# detailed_metric/value_to_metric: accepted, no effect (metrics carry no descriptor values)"
        );
    }
    let _ = writeln!(text, "[[envoy.rules]]");
    let _ = writeln!(text, "domain = {}", quoted(&rule.domain));
    let steps: Vec<String> = rule
        .path
        .iter()
        .map(|step| match &step.value {
            Some(value) => format!(
                "{{ key = {}, value = {} }}",
                quoted(&step.key),
                quoted(value)
            ),
            None => format!("{{ key = {} }}", quoted(&step.key)),
        })
        .collect();
    let _ = writeln!(text, "path = [{}]", steps.join(", "));
    if let Some(limit) = &rule.limit {
        let _ = writeln!(text, "limit = {}", quoted(limit));
    }
    for (flag, on) in [
        ("shadow_mode", rule.shadow_mode),
        ("quota_mode", rule.quota_mode),
        ("share_threshold", rule.share_threshold),
        ("detailed_metric", rule.detailed_metric),
        ("value_to_metric", rule.value_to_metric),
    ] {
        if on {
            let _ = writeln!(text, "{flag} = true");
        }
    }
    if let Some(limit) = &rule.rate_limit {
        let mut fields = Vec::new();
        if limit.unlimited {
            fields.push("unlimited = true".to_string());
        }
        if !limit.unlimited || limit.requests_per_unit > 0 {
            fields.push(format!("requests_per_unit = {}", limit.requests_per_unit));
        }
        if !limit.unit.is_empty() {
            fields.push(format!(
                "unit = {}",
                quoted(&limit.unit.to_ascii_lowercase())
            ));
        }
        if !limit.name.is_empty() {
            fields.push(format!("name = {}", quoted(&limit.name)));
        }
        if !limit.replaces.is_empty() {
            let names: Vec<String> = limit.replaces.iter().map(|n| quoted(n)).collect();
            fields.push(format!("replaces = [{}]", names.join(", ")));
        }
        let _ = writeln!(text, "rate_limit = {{ {} }}", fields.join(", "));
    }
    if let Some(metadata) = &rule.metadata {
        let _ = writeln!(
            text,
            "metadata = {}",
            inline(&serde_json::Value::Object(metadata.clone()))
        );
    }
}

/// A JSON value as a TOML inline value; TOML has no null, so a null becomes `""` (the
/// metadata only travels back to Envoy in `dynamic_metadata`).
fn inline(value: &serde_json::Value) -> String {
    use serde_json::Value as J;
    match value {
        J::Null => "\"\"".into(),
        J::Bool(b) => b.to_string(),
        J::Number(n) => n.to_string(),
        J::String(s) => quoted(s),
        J::Array(items) => format!(
            "[{}]",
            items.iter().map(inline).collect::<Vec<_>>().join(", ")
        ),
        J::Object(map) => format!(
            "{{ {} }}",
            map.iter()
                .map(|(k, v)| format!("{} = {}", quoted(k), inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A TOML basic string (JSON's escaping is valid TOML).
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}
