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
//! A descriptor's entries come in as `(key, value)` pairs borrowed from the request, whatever
//! carried it.
//!
//! Each rule also carries envoyproxy/ratelimit's stats key ([`StatsKey`]): what its metrics
//! are named by, spelled as it spells them for the same configuration and request.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::config::{ConfigError, LimitConfig};
use crate::erl::config::{unit, RuleConfig, Step};

mod limits;
mod stats_key;

use limits::{bucket_limit, limit_name, unique};
pub use stats_key::{
    request_limit_overflow_key, request_limit_stats_key, sanitize, Segment, StatsKey,
    MAX_SPELLED_BYTES, OVERFLOW_SEGMENT,
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
    /// The rule's `metadata`, for `dynamic_metadata` (made a protobuf `Struct` by the
    /// service that answers).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// What envoyproxy/ratelimit's metrics of this rule are named by.
    pub stats: StatsKey,
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
pub struct ErlRules {
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

impl ErlRules {
    /// Builds the tree from rules already checked (`config::erl::check`); the limits that
    /// rules with a bucket need are returned, numbered from `first_limit`, their names unique
    /// among `taken` (which gains them).
    pub fn compile(
        rules: &[RuleConfig],
        first_limit: usize,
        taken: &mut HashSet<String>,
    ) -> Result<(ErlRules, Vec<LimitConfig>), ConfigError> {
        let mut tree = ErlRules::default();
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
                metadata: config.metadata.clone(),
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
        let configured: Vec<String> = config.path.iter().map(RuleConfig::composite).collect();
        StatsKey::PerRequest {
            domain: config.domain.clone(),
            segments,
            overflow: stats_key::rule_overflow_key(&config.domain, &configured),
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

    /// The rule a descriptor reaches in a known domain (see the module docs), its entries
    /// `(key, value)` in order.
    pub fn lookup<'e>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<Found> {
        let mut level = self.domains.get(domain)?;
        let mut found = Found::default();
        let mut composite = String::new();
        let mut entries = entries.into_iter().enumerate().peekable();
        while let Some((i, (key, value))) = entries.next() {
            let keyed = level.by_key.get(key);
            let mut next = keyed.and_then(|k| k.by_value.get(value)).copied();
            let mut by_wildcard = false;
            if next.is_none() && !level.wildcards.is_empty() {
                composite.clear();
                composite.push_str(key);
                composite.push('_');
                composite.push_str(value);
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
            // The last entry's node.
            if entries.peek().is_none() {
                found.rule = node_ref.rule;
            }
            if node_ref.children.by_key.is_empty() {
                break;
            }
            level = &node_ref.children;
        }
        Some(found)
    }

    /// The value a bucket keys entry `i` on: a shared wildcard's pattern, else its `value`.
    pub fn keyed_value<'a>(&'a self, found: &Found, i: usize, value: &'a str) -> &'a [u8] {
        found
            .shared
            .iter()
            .find(|(index, _)| *index == i)
            .and_then(|&(_, node)| self.nodes[node].shared.as_deref())
            .unwrap_or(value)
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

#[cfg(test)]
mod tests;
