//! envoyproxy/ratelimit's descriptor tree, matched as it matches: a descriptor's entries are
//! walked in order from the domain's root; at each level the node for the entry's exact value
//! wins, then the first wildcard node (in file order) whose pattern matches, then the node for
//! the key alone. Only the node reached by the last entry can limit the descriptor, and only
//! if it has a `rate_limit`: a node without one means "no limit" even where the key alone has
//! one. A walk that finds no node, or a node without nested rules before the last entry, ends
//! with no limit.
//!
//! Matching allocates nothing unless a level has wildcards (then one string per descriptor,
//! reused across its entries) or a `share_threshold` wildcard matched.

use std::collections::{HashMap, HashSet};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::google::protobuf::value::Kind as ValueKind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use crate::config::envoy::{unit, RuleConfig, Step};
use crate::config::{
    valid_name, Charge, ConfigError, LimitConfig, MatchConfig, OnMissing, RateSpec,
};

/// What `limit_remaining` shows for an unlimited descriptor, as envoyproxy/ratelimit does.
pub const UNLIMITED_REMAINING: u32 = u32::MAX;

/// What a rule does to a descriptor it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A node without `rate_limit`: not limited.
    NoLimit,
    /// `unlimited: true`: OK, remaining 4294967295; its `replaces` still apply.
    Unlimited,
    /// `requests_per_unit: 0`: over the limit whenever it is charged.
    Zero,
    /// A bucket of `requests_per_unit` per `unit`, burst `requests_per_unit`.
    Bucket,
}

/// One rule with a `rate_limit` (or without: [`Kind::NoLimit`]).
#[derive(Debug, Clone)]
pub struct Rule {
    pub kind: Kind,
    /// The rule's own name, shown in `current_limit` (empty when it has none).
    pub name: String,
    pub replaces: Vec<String>,
    pub requests_per_unit: u32,
    /// Envoy's unit number (`RateLimitResponse.RateLimit.Unit`) and its length in seconds.
    pub unit: i32,
    pub unit_secs: u64,
    pub shadow: bool,
    pub quota: bool,
    /// The policy's limit for a [`Kind::Bucket`] rule.
    pub limit: usize,
    /// The rule's `metadata`, for `dynamic_metadata`.
    pub metadata: Option<Struct>,
}

#[derive(Debug, Default)]
struct Level {
    by_key: HashMap<String, Keyed>,
    /// Every node whose `key_value` holds a `*`, in file order, its pattern split on `*`.
    wildcards: Vec<(Vec<String>, usize)>,
}

#[derive(Debug, Default)]
struct Keyed {
    by_value: HashMap<String, usize>,
    any: Option<usize>,
}

#[derive(Debug)]
struct Node {
    rule: Option<usize>,
    children: Level,
    /// With `share_threshold`: the value pattern all matched values count as.
    shared: Option<String>,
    /// Set once the node's own rule was read (not only made as a parent of one).
    declared: bool,
}

/// The compiled rules of every envoyproxy/ratelimit domain.
#[derive(Debug, Default)]
pub struct EnvoyRules {
    domains: HashMap<String, Level>,
    nodes: Vec<Node>,
    pub rules: Vec<Rule>,
    /// The policy's limit for buckets of a descriptor's own `limit` (sent by Envoy).
    pub request_limit: Option<usize>,
    /// Global shadow mode: a request is never OVER_LIMIT.
    pub shadow_mode: bool,
    /// Global quota mode: every descriptor (unlimited ones aside) is in quota mode.
    pub quota_mode: bool,
    /// Whether answers carry `dynamic_metadata`.
    pub dynamic_metadata: bool,
    /// Whether gRPC answers carry the `ratelimit` header family.
    pub response_headers: bool,
    /// Rules come from an xDS server that has sent none yet: every request is answered with
    /// an error, as envoyproxy/ratelimit answers before its first configuration.
    pub awaiting_config: bool,
    /// While awaiting it, whether the instance says it is ready (`envoy.xds.ready_before_config`).
    pub ready_while_awaiting: bool,
}

/// A descriptor matched in a known domain: its rule, if any, and for entries matched by a
/// `share_threshold` wildcard, the pattern keyed in place of their value.
#[derive(Debug, Default)]
pub struct Found {
    pub rule: Option<usize>,
    pub shared: Vec<(usize, usize)>,
}

impl EnvoyRules {
    /// Builds the tree from rules already checked (`config::envoy::check`); the limits that
    /// rules with a bucket need are returned, numbered from `first_limit`, their names unique
    /// among `taken` (which gains them).
    pub fn compile(
        rules: &[RuleConfig],
        first_limit: usize,
        taken: &mut HashSet<String>,
    ) -> Result<(EnvoyRules, Vec<LimitConfig>), ConfigError> {
        let mut tree = EnvoyRules::default();
        let mut limits = Vec::new();
        let mut suffixes = HashMap::new();
        let domains: Vec<String> = {
            let mut seen: Vec<String> = rules.iter().map(|r| r.domain.clone()).collect();
            seen.sort_unstable();
            seen.dedup();
            seen
        };
        for (i, config) in rules.iter().enumerate() {
            let at = format!("envoy.rules[{i}]");
            let node = tree.insert(config);
            if tree.nodes[node].declared {
                return Err(ConfigError::new(
                    at,
                    format!("{}: duplicate descriptor", config.describe()),
                ));
            }
            tree.nodes[node].declared = true;
            if config.share_threshold {
                let last = config.path.last().map(RuleConfig::composite);
                let key = config.path.last().map_or("", |s| s.key.as_str());
                tree.nodes[node].shared = last.map(|composite| {
                    composite
                        .strip_prefix(&format!("{key}_"))
                        .unwrap_or(&composite)
                        .to_string()
                });
            }
            let Some(rate_limit) = &config.rate_limit else {
                continue;
            };
            let (unit_number, unit_secs) = unit(&rate_limit.unit).unwrap_or((0, 1));
            let kind = if rate_limit.unlimited {
                Kind::Unlimited
            } else if rate_limit.requests_per_unit == 0 {
                Kind::Zero
            } else {
                Kind::Bucket
            };
            let mut limit = 0;
            if kind == Kind::Bucket {
                let name = unique(
                    limit_name(config),
                    config.limit.is_some(),
                    taken,
                    &mut suffixes,
                    &at,
                )?;
                limit = first_limit + limits.len();
                limits.push(bucket_limit(
                    name,
                    u64::from(rate_limit.requests_per_unit),
                    unit_secs,
                    &config.path,
                    config.shadow_mode || config.quota_mode,
                    &domains,
                ));
            }
            tree.nodes[node].rule = Some(tree.rules.len());
            tree.rules.push(Rule {
                kind,
                name: rate_limit.name.clone(),
                replaces: rate_limit.replaces.clone(),
                requests_per_unit: rate_limit.requests_per_unit,
                unit: unit_number,
                unit_secs,
                shadow: config.shadow_mode,
                quota: config.quota_mode,
                limit,
                metadata: config.metadata.as_ref().map(struct_of),
            });
        }
        if !domains.is_empty() {
            let name = unique(
                "envoy-request-limit".into(),
                false,
                taken,
                &mut suffixes,
                "envoy",
            )?;
            tree.request_limit = Some(first_limit + limits.len());
            let mut request = bucket_limit(name, 1, 1, &[], false, &domains);
            request.key = vec!["descriptor:limit".into()];
            limits.push(request);
        }
        Ok((tree, limits))
    }

    fn insert(&mut self, config: &RuleConfig) -> usize {
        let mut parent: Option<usize> = None;
        let mut node = 0;
        for step in &config.path {
            let found = self
                .level(&config.domain, parent)
                .and_then(|l| l.find(step));
            node = match found {
                Some(node) => node,
                None => {
                    let node = self.nodes.len();
                    self.nodes.push(Node {
                        rule: None,
                        children: Level::default(),
                        shared: None,
                        declared: false,
                    });
                    let level = match parent {
                        None => self.domains.entry(config.domain.clone()).or_default(),
                        Some(p) => &mut self.nodes[p].children,
                    };
                    level.add(step, node);
                    node
                }
            };
            parent = Some(node);
        }
        node
    }

    fn level(&self, domain: &str, parent: Option<usize>) -> Option<&Level> {
        match parent {
            None => self.domains.get(domain),
            Some(p) => Some(&self.nodes[p].children),
        }
    }

    /// Whether the domain has rules here (then they alone decide its descriptors).
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rule a descriptor reaches in a known domain (see the module docs).
    pub fn lookup(&self, domain: &str, entries: &[Entry]) -> Option<Found> {
        let mut level = self.domains.get(domain)?;
        let mut found = Found::default();
        let mut composite = String::new();
        let last = entries.len().saturating_sub(1);
        for (i, entry) in entries.iter().enumerate() {
            let keyed = level.by_key.get(&entry.key);
            let mut next = keyed.and_then(|k| k.by_value.get(&entry.value)).copied();
            let mut by_wildcard = false;
            if next.is_none() && !level.wildcards.is_empty() {
                composite.clear();
                composite.push_str(&entry.key);
                composite.push('_');
                composite.push_str(&entry.value);
                next = level
                    .wildcards
                    .iter()
                    .find(|(parts, _)| wildcard_match(parts, &composite))
                    .map(|&(_, node)| node);
                by_wildcard = next.is_some();
            }
            let Some(node) = next.or_else(|| keyed.and_then(|k| k.any)) else {
                break;
            };
            let node_ref = &self.nodes[node];
            if by_wildcard && node_ref.shared.is_some() {
                found.shared.push((i, node));
            }
            if i == last {
                found.rule = node_ref.rule;
            }
            if node_ref.children.by_key.is_empty() {
                break;
            }
            level = &node_ref.children;
        }
        Some(found)
    }

    /// The value a bucket keys entry `i` on: a shared wildcard's pattern, else the value.
    pub fn keyed_value<'a>(&'a self, found: &Found, i: usize, entry: &'a Entry) -> &'a [u8] {
        found
            .shared
            .iter()
            .find(|(index, _)| *index == i)
            .and_then(|&(_, node)| self.nodes[node].shared.as_deref())
            .unwrap_or(&entry.value)
            .as_bytes()
    }
}

impl Level {
    fn find(&self, step: &Step) -> Option<usize> {
        let keyed = self.by_key.get(&step.key)?;
        match &step.value {
            Some(value) => keyed.by_value.get(value).copied(),
            None => keyed.any,
        }
    }

    fn add(&mut self, step: &Step, node: usize) {
        let keyed = self.by_key.entry(step.key.clone()).or_default();
        match &step.value {
            Some(value) => {
                keyed.by_value.insert(value.clone(), node);
            }
            None => keyed.any = Some(node),
        }
        let composite = RuleConfig::composite(step);
        if composite.contains('*') {
            let parts = composite.split('*').map(str::to_string).collect();
            self.wildcards.push((parts, node));
        }
    }
}

/// A JSON object as a protobuf `Struct` (numbers as doubles, as protobuf holds them).
pub fn struct_of(map: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(key, value)| (key.clone(), value_of(value)))
            .collect(),
    }
}

fn value_of(value: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match value {
        J::Null => ValueKind::NullValue(0),
        J::Bool(b) => ValueKind::BoolValue(*b),
        J::Number(n) => ValueKind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => ValueKind::StringValue(s.clone()),
        J::Array(items) => ValueKind::ListValue(ListValue {
            values: items.iter().map(value_of).collect(),
        }),
        J::Object(map) => ValueKind::StructValue(struct_of(map)),
    };
    Value { kind: Some(kind) }
}

/// Whether `text` matches a pattern split on `*`, each `*` standing for any run of
/// characters (none included).
fn wildcard_match(parts: &[String], text: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|only| only == text);
    };
    if first.len() + last.len() > text.len()
        || !text.starts_with(first.as_str())
        || !text.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The limit name of a rule with a bucket: its `limit`, else its own name, else its domain and
/// path, spelled as a limit name.
fn limit_name(config: &RuleConfig) -> String {
    if let Some(name) = &config.limit {
        return name.clone();
    }
    let own = config.rate_limit.as_ref().map_or("", |r| r.name.as_str());
    let words = if own.is_empty() {
        let mut words = vec![config.domain.clone()];
        for step in &config.path {
            words.push(step.key.clone());
            words.extend(step.value.clone());
        }
        words.join("-")
    } else {
        own.to_string()
    };
    let name: String = words
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
            _ => '-',
        })
        .take(56)
        .collect();
    if name.is_empty() {
        "envoy".into()
    } else {
        name
    }
}

/// `name`, or (unless `exact`) `name-2`, `name-3`... whichever is free. `suffixes` holds,
/// per name, the suffix to try next: thousands of rules whose names agree in their first 56
/// characters (a deep tree's leaves) would otherwise try every suffix taken before, each time.
fn unique(
    name: String,
    exact: bool,
    taken: &mut HashSet<String>,
    suffixes: &mut HashMap<String, usize>,
    at: &str,
) -> Result<String, ConfigError> {
    if exact && (!valid_name(&name) || taken.contains(&name)) {
        return Err(ConfigError::new(
            format!("{at}.limit"),
            format!("{name:?} must be a valid limit name ([a-z0-9_-]+) used by no other limit"),
        ));
    }
    let mut candidate = name.clone();
    let next = suffixes.entry(name.clone()).or_insert(2);
    while taken.contains(&candidate) {
        candidate = format!("{name}-{next}");
        *next += 1;
    }
    taken.insert(candidate.clone());
    Ok(candidate)
}

/// The limit of a bucket of `count` per `unit_secs` seconds, burst `count`, keyed on one
/// value per entry of `path`, served only in the rules' `domains`.
fn bucket_limit(
    name: String,
    count: u64,
    unit_secs: u64,
    path: &[Step],
    shadow: bool,
    domains: &[String],
) -> LimitConfig {
    let mut seen = HashSet::new();
    let key = path
        .iter()
        .enumerate()
        .map(|(i, step)| {
            if seen.insert(step.key.as_str()) {
                format!("descriptor:{}", step.key)
            } else {
                format!("descriptor:{}#{i}", step.key)
            }
        })
        .collect();
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts and unit lengths are far below 2^52"
    )]
    let rate = count as f64 / unit_secs as f64;
    LimitConfig {
        name,
        rate: RateSpec::PerSecond(rate),
        burst: count,
        key,
        quota: None,
        period: None,
        concurrency: None,
        lease_ttl_s: None,
        charge: Charge::Request,
        max_debt: None,
        cost: 1,
        cost_header: None,
        reserve: None,
        reserve_header: None,
        reservation_ttl_s: None,
        on_reservation_expiry: None,
        shadow,
        on_missing: OnMissing::Anonymous,
        matching: MatchConfig {
            domains: domains.to_vec(),
            ..MatchConfig::default()
        },
        overrides: Vec::new(),
        overrides_file: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::envoy::from_yaml;

    fn tree(yaml: &str) -> EnvoyRules {
        let (_, rules) = from_yaml("t.yaml", yaml).expect("valid yaml");
        EnvoyRules::compile(&rules, 0, &mut HashSet::new())
            .expect("compiles")
            .0
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
        pairs
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect()
    }

    /// The rule's requests_per_unit, 0 for none.
    fn reached(tree: &EnvoyRules, pairs: &[(&str, &str)]) -> u32 {
        tree.lookup("d", &entries(pairs))
            .and_then(|f| f.rule)
            .map_or(0, |r| tree.rules[r].requests_per_unit)
    }

    const BASIC: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    value: bare
  - key: k
    value: parent
    descriptors:
      - key: sub
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: w
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: w
    value: foobar
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: m
    value: a*b*c
    rate_limit: {unit: minute, requests_per_unit: 6}
";

    /// envoyproxy/ratelimit test/config/config_test.go: TestBasicConfig (value beats key),
    /// TestWildcardConfig (prefix, middle and multiple wildcards; exact beats wildcard), and a
    /// value without rate_limit meaning no limit.
    #[test]
    fn the_most_specific_node_of_each_level_decides() {
        let tree = tree(BASIC);
        assert_eq!(reached(&tree, &[("k", "v")]), 2);
        assert_eq!(reached(&tree, &[("k", "other")]), 1);
        assert_eq!(reached(&tree, &[("k", "bare")]), 0);
        assert_eq!(reached(&tree, &[("k", "parent")]), 0);
        assert_eq!(reached(&tree, &[("k", "parent"), ("sub", "x")]), 3);
        // The default node has no nested rules: a longer descriptor ends with no limit.
        assert_eq!(reached(&tree, &[("k", "other"), ("sub", "x")]), 0);
        assert_eq!(reached(&tree, &[("w", "foo")]), 4);
        assert_eq!(reached(&tree, &[("w", "foozzz")]), 4);
        assert_eq!(reached(&tree, &[("w", "foobar")]), 5);
        assert_eq!(reached(&tree, &[("w", "fo")]), 0);
        assert_eq!(reached(&tree, &[("m", "abc")]), 6);
        assert_eq!(reached(&tree, &[("m", "a-b-c")]), 6);
        assert_eq!(reached(&tree, &[("m", "acb")]), 0);
        assert_eq!(reached(&tree, &[("nothing", "x")]), 0);
        assert!(tree.lookup("unknown", &entries(&[("k", "v")])).is_none());
    }

    #[test]
    fn wildcards_match_like_envoyproxy_ratelimit() {
        let parts = |p: &str| p.split('*').map(str::to_string).collect::<Vec<_>>();
        assert!(wildcard_match(&parts("k_foo*"), "k_foo"));
        assert!(wildcard_match(&parts("k_*bar"), "k_xbar"));
        assert!(!wildcard_match(&parts("k_a*a"), "k_a"));
        assert!(wildcard_match(&parts("k_a*a"), "k_aa"));
        assert!(wildcard_match(&parts("k_x*y*z"), "k_xyz"));
        assert!(!wildcard_match(&parts("k_x*y*z"), "k_xzy"));
        assert!(wildcard_match(&parts("exact"), "exact"));
    }

    /// envoyproxy/ratelimit test/config share_threshold.yaml: every value a shared wildcard
    /// matches keys on the pattern; an explicit value still wins over it.
    #[test]
    fn a_shared_wildcard_keys_on_its_pattern() {
        let tree = tree(
            "domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
",
        );
        let wanted = entries(&[("files", "files/a.txt")]);
        let found = tree.lookup("d", &wanted).unwrap();
        assert_eq!(tree.keyed_value(&found, 0, &wanted[0]), b"files/*");
        let plain = entries(&[("file", "test1")]);
        let found = tree.lookup("d", &plain).unwrap();
        assert_eq!(tree.keyed_value(&found, 0, &plain[0]), b"test1");
    }

    #[test]
    fn limit_names_are_the_rules_own_else_the_path() {
        let (_, rules) = from_yaml("t.yaml", BASIC).unwrap();
        let mut taken = HashSet::new();
        let (_, limits) = EnvoyRules::compile(&rules, 0, &mut taken).unwrap();
        let names: Vec<&str> = limits.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "d-k",
                "d-k-v",
                "d-k-parent-sub",
                "d-w-foo-",
                "d-w-foobar",
                "d-m-a-b-c",
                "envoy-request-limit"
            ]
        );
    }
}
