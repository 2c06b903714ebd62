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
//!
//! Each rule also carries envoyproxy/ratelimit's stats key ([`StatsKey`]): what its metrics
//! are named by, spelled as it spells them for the same configuration and request.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

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
    /// What envoyproxy/ratelimit's metrics of this rule are named by.
    pub stats: StatsKey,
}

/// envoyproxy/ratelimit's stats key of a rule: `domain.` and one segment per level of its
/// path, `key_value` or `key` as the configuration spells the node, except where its
/// `value_to_metric` (a key-only or wildcard node) or the rule's `detailed_metric` put the
/// request's value in; `share_threshold` keeps the wildcard pattern. Sanitized as it
/// sanitizes stat names (`:` and `|`, and the dots of IPv4 addresses, become `_`).
#[derive(Debug, Clone, PartialEq)]
pub enum StatsKey {
    /// The same for every request: built once, sanitized.
    Fixed(Arc<str>),
    /// Built per request from its entries, one segment per level.
    PerRequest {
        domain: String,
        segments: Vec<Segment>,
    },
}

/// One level of a [`StatsKey::PerRequest`].
#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    /// As the configuration spells the node.
    Config(String),
    /// The entry's `key_value`; `key` alone for an empty value unless `underscore`
    /// (`detailed_metric` without a shared wildcard writes `key_` then).
    Value { underscore: bool },
}

impl StatsKey {
    /// The key for a descriptor this rule limits; `scratch` holds a key built per request.
    pub fn spell<'a>(&'a self, entries: &[Entry], scratch: &'a mut String) -> &'a str {
        match self {
            StatsKey::Fixed(key) => key,
            StatsKey::PerRequest { domain, segments } => {
                scratch.clear();
                scratch.push_str(domain);
                for (segment, entry) in segments.iter().zip(entries) {
                    scratch.push('.');
                    match segment {
                        Segment::Config(text) => scratch.push_str(text),
                        Segment::Value { underscore } => {
                            scratch.push_str(&entry.key);
                            if *underscore || !entry.value.is_empty() {
                                scratch.push('_');
                                scratch.push_str(&entry.value);
                            }
                        }
                    }
                }
                sanitize(scratch);
                scratch
            }
        }
    }
}

/// The stats key of a descriptor decided by its own `limit` (sent by Envoy): every entry's
/// `key_value` (`key` for an empty value), as envoyproxy/ratelimit keys it.
pub fn request_limit_stats_key(domain: &str, entries: &[Entry], into: &mut String) {
    into.clear();
    into.push_str(domain);
    into.push('.');
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            into.push('.');
        }
        into.push_str(&entry.key);
        if !entry.value.is_empty() {
            into.push('_');
            into.push_str(&entry.value);
        }
    }
    sanitize(into);
}

/// envoyproxy/ratelimit's stat name sanitizing: `:` and `|` become `_`, and so do the dots of
/// anything shaped as an IPv4 address (four runs of 1 to 3 digits joined by dots, found left
/// to right), so such a value stays one segment of the name.
pub fn sanitize(name: &mut String) {
    if !name.bytes().any(|b| matches!(b, b':' | b'|' | b'.')) {
        return;
    }
    let mut bytes = std::mem::take(name).into_bytes();
    for b in &mut bytes {
        if matches!(*b, b':' | b'|') {
            *b = b'_';
        }
    }
    let mut i = 0;
    while i < bytes.len() {
        match ipv4_end(&bytes, i, 0) {
            Some(end) => {
                for b in &mut bytes[i..end] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes: still UTF-8.
    *name = String::from_utf8(bytes).unwrap_or_default();
}

/// Where an IPv4-shaped run starting at `at` ends: group `group` of four, each 1 to 3 digits,
/// the longest first, as a greedy regular expression tries them.
fn ipv4_end(bytes: &[u8], at: usize, group: usize) -> Option<usize> {
    let digits = bytes[at..]
        .iter()
        .take(3)
        .take_while(|b| b.is_ascii_digit())
        .count();
    (1..=digits).rev().find_map(|len| {
        let end = at + len;
        if group == 3 {
            return Some(end);
        }
        (bytes.get(end) == Some(&b'.'))
            .then(|| ipv4_end(bytes, end + 1, group + 1))
            .flatten()
    })
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
    /// How the node is reached, and its `value_to_metric`: how its level of a stats key is
    /// spelled.
    reached: Reached,
    value_to_metric: bool,
}

/// How a node is reached from its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reached {
    /// By its exact value: the request's value is the configured one.
    Value,
    /// By its wildcard pattern.
    Wildcard,
    /// By the key alone.
    Key,
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
        let mut stats_paths = Vec::new();
        for (i, config) in rules.iter().enumerate() {
            let at = format!("envoy.rules[{i}]");
            let path = tree.insert(config);
            let node = path.last().copied().unwrap_or(0);
            if tree.nodes[node].declared {
                return Err(ConfigError::new(
                    at,
                    format!("{}: duplicate descriptor", config.describe()),
                ));
            }
            tree.nodes[node].declared = true;
            tree.nodes[node].value_to_metric = config.value_to_metric;
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
            stats_paths.push((config, path));
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
                stats: StatsKey::Fixed(Arc::from("")),
            });
        }
        // Once every node is known: a parent's `value_to_metric` may follow its child's rule.
        for (rule, (config, path)) in stats_paths.into_iter().enumerate() {
            tree.rules[rule].stats = tree.stats_key(config, &path);
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

    /// The nodes from the domain's root to the rule's, made where missing.
    fn insert(&mut self, config: &RuleConfig) -> Vec<usize> {
        let mut parent: Option<usize> = None;
        let mut path = Vec::with_capacity(config.path.len());
        for step in &config.path {
            let found = self
                .level(&config.domain, parent)
                .and_then(|l| l.find(step));
            let node = match found {
                Some(node) => node,
                None => {
                    let node = self.nodes.len();
                    let reached = match &step.value {
                        None => Reached::Key,
                        Some(value) if value.contains('*') => Reached::Wildcard,
                        Some(_) => Reached::Value,
                    };
                    self.nodes.push(Node {
                        rule: None,
                        children: Level::default(),
                        shared: None,
                        declared: false,
                        reached,
                        value_to_metric: false,
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
            path.push(node);
        }
        path
    }

    /// The stats key of the rule of `config`, whose nodes are `path` (see [`StatsKey`]).
    fn stats_key(&self, config: &RuleConfig, path: &[usize]) -> StatsKey {
        // A wildcard level matched by a literal value equal to its pattern spells the same
        // either way, so each level's spelling is known from its node alone.
        let any_shared = path.iter().any(|&n| self.nodes[n].shared.is_some());
        let segments: Vec<Segment> = config
            .path
            .iter()
            .zip(path)
            .map(|(step, &n)| {
                let node = &self.nodes[n];
                let from_request = match node.reached {
                    Reached::Value => false,
                    _ if node.shared.is_some() => false,
                    _ => config.detailed_metric || node.value_to_metric,
                };
                if from_request {
                    Segment::Value {
                        underscore: config.detailed_metric && !any_shared,
                    }
                } else {
                    Segment::Config(RuleConfig::composite(step))
                }
            })
            .collect();
        if segments.iter().all(|s| matches!(s, Segment::Config(_))) {
            let mut key = config.domain.clone();
            for segment in &segments {
                if let Segment::Config(text) = segment {
                    key.push('.');
                    key.push_str(text);
                }
            }
            sanitize(&mut key);
            return StatsKey::Fixed(Arc::from(key));
        }
        StatsKey::PerRequest {
            domain: config.domain.clone(),
            segments,
        }
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
        borrow: None,
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

    /// The stats key of the rule a descriptor reaches, spelled for that descriptor.
    fn stats_key(tree: &EnvoyRules, domain: &str, pairs: &[(&str, &str)]) -> String {
        let wanted = entries(pairs);
        let rule = tree
            .lookup(domain, &wanted)
            .and_then(|f| f.rule)
            .expect("a rule");
        let mut scratch = String::new();
        tree.rules[rule]
            .stats
            .spell(&wanted, &mut scratch)
            .to_string()
    }

    /// envoyproxy/ratelimit test/config/config_test.go: TestDetailedMetric.
    #[test]
    fn detailed_metric_puts_the_request_values_in_the_stats_key() {
        let tree = tree(
            "domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key-1
    descriptors:
      - key: key-2
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain
    descriptors:
      - key: sub
        rate_limit: {unit: minute, requests_per_unit: 5}
",
        );
        let key = |pairs: &[(&str, &str)]| stats_key(&tree, "nested", pairs);
        assert_eq!(
            key(&[("key_1", "value-for-key-1")]),
            "nested.key_1_value-for-key-1"
        );
        assert_eq!(key(&[("key_2", "key-2-value")]), "nested.key_2_key-2-value");
        assert_eq!(
            key(&[("key_2", "key-2-value"), ("key_3", "requested-key3-value")]),
            "nested.key_2_key-2-value.key_3_requested-key3-value"
        );
        assert_eq!(
            key(&[("key-1", "value-1"), ("key-2", "value-2")]),
            "nested.key-1_value-1.key-2_value-2"
        );
        assert_eq!(
            key(&[("plain", "value-1"), ("sub", "value-2")]),
            "nested.plain.sub"
        );
        // An empty value still gets its underscore, as there.
        assert_eq!(key(&[("key_1", "")]), "nested.key_1_");
        let fixed = tree.lookup("nested", &entries(&[("plain", "a"), ("sub", "b")]));
        let rule = &tree.rules[fixed.unwrap().rule.unwrap()];
        assert!(matches!(rule.stats, StatsKey::Fixed(_)));
    }

    /// TestValueToMetric_*: a key-only or wildcard node with value_to_metric spells the
    /// request's value at its level, and only there.
    #[test]
    fn value_to_metric_spells_the_value_at_its_own_level() {
        let tree = tree(
            "domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: fixed
    value: v
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
",
        );
        let key = |pairs: &[(&str, &str)]| stats_key(&tree, "domain", pairs);
        assert_eq!(
            key(&[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]),
            "domain.route_draw.http_method_GET.subject_id"
        );
        assert_eq!(key(&[("k1", "A"), ("k2", "foo")]), "domain.k1_A.k2");
        assert_eq!(key(&[("k1", ""), ("k2", "foo")]), "domain.k1.k2");
        assert_eq!(key(&[("fixed", "v"), ("k2", "x")]), "domain.fixed_v.k2");
    }

    /// TestWildcardStatsBehavior: a wildcard keeps its pattern unless value_to_metric, and
    /// share_threshold keeps it even then; detailed_metric with a shared wildcard keeps the
    /// pattern at that level only.
    #[test]
    fn wildcards_keep_their_pattern_unless_asked() {
        let tree = tree(
            "domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
  - key: told
    value: foo*bar*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: shared
    value: foo*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: files
    value: f*
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 20}
",
        );
        let key = |pairs: &[(&str, &str)]| stats_key(&tree, "test-domain", pairs);
        assert_eq!(key(&[("wild", "foo1")]), "test-domain.wild_foo*");
        assert_eq!(
            key(&[("wild", "foo1"), ("other", "bar"), ("limit", "X")]),
            "test-domain.wild_foo*.other_bar.limit"
        );
        assert_eq!(
            key(&[("told", "foo123bar456")]),
            "test-domain.told_foo123bar456"
        );
        assert_eq!(key(&[("shared", "foo1")]), "test-domain.shared_foo*");
        assert_eq!(
            key(&[("files", "f1"), ("user", "")]),
            "test-domain.files_f*.user"
        );
        assert_eq!(
            key(&[("files", "f1"), ("user", "u")]),
            "test-domain.files_f*.user_u"
        );
    }

    /// envoyproxy/ratelimit's stat names: `:` and `|` and the dots of IPv4 addresses become
    /// `_`; a CIDR's `/` and other dots stay (Envoy Gateway's e2e test reads
    /// `masked_remote_address_0_0_0_0/0`).
    #[test]
    fn stats_keys_are_sanitized_as_stat_names() {
        let sanitized = |text: &str| {
            let mut name = text.to_string();
            sanitize(&mut name);
            name
        };
        assert_eq!(
            sanitized("d.masked_remote_address_0.0.0.0/0"),
            "d.masked_remote_address_0_0_0_0/0"
        );
        assert_eq!(sanitized("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(sanitized("d.ip_192.168.10.200.x"), "d.ip_192_168_10_200.x");
        // The longest run that still makes an address, then the next one.
        assert_eq!(sanitized("d.v_1234.5.6.7"), "d.v_1234_5_6_7");
        assert_eq!(sanitized("d.v_1.2.3"), "d.v_1.2.3");
        assert_eq!(sanitized("1.2.3.4.5.6.7.8"), "1_2_3_4.5_6_7_8");
        let mut own = String::new();
        request_limit_stats_key("d", &entries(&[("ip", "10.0.0.1"), ("k", "")]), &mut own);
        assert_eq!(own, "d.ip_10_0_0_1.k");
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
