//! `tollgate import envoy-ratelimit FILE...`: envoyproxy/ratelimit's YAML as tollgate TOML.
//!
//! Each node of a domain's descriptor tree that has a `rate_limit` becomes one limit: the path
//! from the root to it gives the entries a descriptor must carry (a node with a value becomes
//! `match.descriptors`, a node without one a `descriptor:<key>` part of the bucket key), and
//! the domain becomes `match.domains`. A fixed window of N per unit becomes a token bucket
//! refilling N per unit with a burst of N. What has no tollgate equivalent is named in a
//! comment next to the limit it concerns, never dropped silently.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

/// A file that could not be read or parsed: its path and why.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct ImportError {
    pub file: String,
    pub reason: String,
}

#[derive(Debug, Deserialize)]
struct RatelimitFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Node>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
struct Node {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    descriptors: Vec<Node>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
struct RateLimit {
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaces>,
    unit: Option<String>,
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
struct Replaces {
    name: Option<String>,
}

/// Reads and converts the files, in order, into one TOML document.
pub fn envoy_ratelimit(files: &[impl AsRef<Path>]) -> Result<String, ImportError> {
    let mut out = Output::default();
    let _ = writeln!(
        out.text,
        "# Converted from envoyproxy/ratelimit configuration by `tollgate import envoy-ratelimit`.\n\
         # Serve these limits to Envoy with grpc_listen; each fixed window became a token bucket\n\
         # of the same rate whose burst is the window's count."
    );
    for file in files {
        let path = file.as_ref();
        let error = |reason: String| ImportError {
            file: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        let parsed: RatelimitFile =
            serde_yaml::from_str(&text).map_err(|e| error(e.to_string()))?;
        if parsed.domain.is_empty() {
            return Err(error("domain must not be empty".into()));
        }
        out.file(&path.display().to_string(), &parsed);
    }
    Ok(out.text)
}

/// One descriptor entry on the path from the root: key, and the value if the node has one.
type Step<'a> = (&'a str, Option<&'a str>);

#[derive(Default)]
struct Output {
    text: String,
    names: HashSet<String>,
}

impl Output {
    fn file(&mut self, path: &str, file: &RatelimitFile) {
        let _ = writeln!(self.text, "\n# ---- {path}: domain {:?}", file.domain);
        for key in file.other.keys() {
            let _ = writeln!(self.text, "# not carried over: top-level field {key:?}");
        }
        self.level(&file.domain, &[], &file.descriptors);
    }

    fn level(&mut self, domain: &str, path: &[Step<'_>], nodes: &[Node]) {
        for node in nodes {
            let mut here = path.to_vec();
            here.push((node.key.as_str(), node.value.as_deref()));
            // envoyproxy/ratelimit prefers a sibling rule for the exact value over a rule
            // without a value; tollgate applies every matching limit.
            let specific: Vec<&str> = if node.value.is_none() {
                nodes
                    .iter()
                    .filter(|n| n.key == node.key)
                    .filter_map(|n| n.value.as_deref())
                    .collect()
            } else {
                Vec::new()
            };
            if let Some(rate_limit) = &node.rate_limit {
                self.limit(domain, &here, node, rate_limit, &specific);
            } else {
                self.notes_without_limit(domain, &here, node);
            }
            self.level(domain, &here, &node.descriptors);
        }
    }

    fn notes_without_limit(&mut self, domain: &str, path: &[Step<'_>], node: &Node) {
        let mut notes = unknown_fields(&node.other);
        if node.shadow_mode || node.detailed_metric {
            notes.push(
                "shadow_mode/detailed_metric on a node without rate_limit: nothing to carry over"
                    .into(),
            );
        }
        if !notes.is_empty() {
            self.comment_block(domain, path, &notes);
        }
    }

    fn limit(
        &mut self,
        domain: &str,
        path: &[Step<'_>],
        node: &Node,
        rate_limit: &RateLimit,
        specific: &[&str],
    ) {
        let mut notes = unknown_fields(&node.other);
        notes.extend(unknown_fields(&rate_limit.other));
        if rate_limit.unlimited {
            notes.push(
                "unlimited: no limit emitted (a descriptor that no limit applies to is answered OK); \
                 limits without this value still apply to it in tollgate"
                    .into(),
            );
            return self.comment_block(domain, path, &notes);
        }
        let Some((rate, burst, written)) = window(rate_limit) else {
            notes.push(format!("not converted: {}", why_no_window(rate_limit)));
            return self.comment_block(domain, path, &notes);
        };
        if let Some(why) = unsupported_path(path) {
            notes.push(format!("not converted: {why}"));
            return self.comment_block(domain, path, &notes);
        }
        for replaced in &rate_limit.replaces {
            notes.push(format!(
                "replaces {:?}: not carried over; tollgate applies both limits",
                replaced.name.as_deref().unwrap_or("")
            ));
        }
        if node.detailed_metric {
            notes.push(
                "detailed_metric: not carried over; tollgate never labels metrics with descriptor values"
                    .into(),
            );
        }
        if !specific.is_empty() {
            notes.push(format!(
                "envoyproxy/ratelimit lets the rules for {:?} = {specific:?} replace this one; tollgate applies both",
                node.key
            ));
        }
        let name = self.unique_name(rate_limit.name.as_deref(), domain, path);
        self.comment_block(domain, path, &notes);
        let mut parts: Vec<String> = path
            .iter()
            .filter(|(_, value)| value.is_none())
            .map(|(key, _)| quoted(&format!("descriptor:{key}")))
            .collect();
        if parts.is_empty() {
            // Every entry has a fixed value: one bucket for all such descriptors.
            parts.push(quoted("const:all"));
        }
        let text = &mut self.text;
        let _ = writeln!(text, "[[limits]]");
        let _ = writeln!(text, "name = {}", quoted(&name));
        let _ = writeln!(text, "rate = {rate}   # {written}");
        let _ = writeln!(text, "burst = {burst}");
        let _ = writeln!(text, "key = [{}]", parts.join(", "));
        if node.shadow_mode {
            let _ = writeln!(text, "shadow = true");
        }
        let _ = writeln!(text, "[limits.match]");
        let _ = writeln!(text, "domains = [{}]", quoted(domain));
        let fixed: Vec<String> = path
            .iter()
            .filter_map(|(key, value)| value.map(|v| format!("{} = [{}]", quoted(key), quoted(v))))
            .collect();
        if !fixed.is_empty() {
            let _ = writeln!(text, "[limits.match.descriptors]");
            for line in fixed {
                let _ = writeln!(text, "{line}");
            }
        }
    }

    fn comment_block(&mut self, domain: &str, path: &[Step<'_>], notes: &[String]) {
        let _ = writeln!(self.text, "\n# {domain}: {}", describe(path));
        for note in notes {
            let _ = writeln!(self.text, "# {note}");
        }
    }

    /// The rule's own name if it has one, else the domain and path; made a valid, unused
    /// limit name.
    fn unique_name(&mut self, own: Option<&str>, domain: &str, path: &[Step<'_>]) -> String {
        let base = match own {
            Some(name) if !name.is_empty() => sanitize(name),
            _ => {
                let mut words = vec![domain.to_string()];
                for (key, value) in path {
                    words.push(key.to_string());
                    words.extend(value.map(str::to_string));
                }
                sanitize(&words.join("-"))
            }
        };
        let base: String = base.chars().take(56).collect();
        let mut name = base.clone();
        let mut n = 2;
        while !self.names.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    }
}

/// Tokens per second, burst, and the window as written; `None` for what has no equivalent.
fn window(rate_limit: &RateLimit) -> Option<(f64, u64, String)> {
    let unit = rate_limit.unit.as_deref()?.to_ascii_lowercase();
    let count = rate_limit.requests_per_unit.filter(|&n| n >= 1)?;
    let seconds: f64 = match unit.as_str() {
        "second" => 1.0,
        "minute" => 60.0,
        "hour" => 3_600.0,
        "day" => 86_400.0,
        "week" => 604_800.0,
        "month" => 30.0 * 86_400.0,
        "year" => 365.0 * 86_400.0,
        _ => return None,
    };
    let approximate = if matches!(unit.as_str(), "month" | "year") {
        " (a month counted as 30 days, a year as 365)"
    } else {
        ""
    };
    Some((
        crate::base::rate::count_f64(count) / seconds,
        count,
        format!("{count} per {unit}{approximate}"),
    ))
}

/// Why [`window`] found no equivalent.
fn why_no_window(rate_limit: &RateLimit) -> String {
    match (rate_limit.unit.as_deref(), rate_limit.requests_per_unit) {
        (_, Some(0)) => {
            "requests_per_unit 0 denies every request; a tollgate limit admits at least its burst"
                .into()
        }
        (Some(unit), Some(_)) => {
            format!("unit {unit:?} is none of second, minute, hour, day, week, month, year")
        }
        _ => "rate_limit needs unit and requests_per_unit (or unlimited)".into(),
    }
}

/// Why a path cannot become a limit: a wildcard value, or one entry key twice.
fn unsupported_path(path: &[Step<'_>]) -> Option<String> {
    if let Some((key, Some(value))) = path
        .iter()
        .find(|(_, v)| v.is_some_and(|v| v.ends_with('*')))
    {
        return Some(format!(
            "{key} = {value:?} is a prefix wildcard; tollgate matches whole values only"
        ));
    }
    let mut seen = HashSet::new();
    path.iter()
        .find(|(key, _)| !seen.insert(*key))
        .map(|(key, _)| format!("entry key {key:?} appears twice on one path"))
}

fn unknown_fields(other: &BTreeMap<String, serde_yaml::Value>) -> Vec<String> {
    other
        .keys()
        .map(|key| format!("not carried over: unknown field {key:?}"))
        .collect()
}

fn describe(path: &[Step<'_>]) -> String {
    path.iter()
        .map(|(key, value)| match value {
            Some(value) => format!("({key}, {value})"),
            None => format!("({key}, *)"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `[a-z0-9_-]`, other characters as `-`, never empty.
fn sanitize(text: &str) -> String {
    let name: String = text
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
            _ => '-',
        })
        .collect();
    if name.is_empty() {
        "limit".into()
    } else {
        name
    }
}

/// A TOML basic string (JSON's escaping is valid TOML).
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_become_rates_with_the_count_as_burst() {
        let limit = |unit: &str, n: u64| RateLimit {
            name: None,
            replaces: Vec::new(),
            unit: Some(unit.into()),
            requests_per_unit: Some(n),
            unlimited: false,
            other: BTreeMap::new(),
        };
        assert_eq!(window(&limit("second", 500)).unwrap().0, 500.0);
        assert_eq!(window(&limit("MINUTE", 120)).unwrap().0, 2.0);
        assert_eq!(window(&limit("day", 5)).unwrap().1, 5);
        assert!(window(&limit("minute", 0)).is_none());
        assert!(window(&limit("fortnight", 1)).is_none());
    }

    #[test]
    fn names_are_valid_and_unique() {
        let mut out = Output::default();
        let path = [("remote_address", None)];
        assert_eq!(
            out.unique_name(None, "edge.proxy", &path),
            "edge-proxy-remote_address"
        );
        assert_eq!(
            out.unique_name(None, "edge.proxy", &path),
            "edge-proxy-remote_address-2"
        );
        assert_eq!(
            out.unique_name(Some("Specific Limit"), "d", &path),
            "specific-limit"
        );
    }
}
