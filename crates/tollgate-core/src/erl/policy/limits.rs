//! The tollgate limits that rules with a bucket become: their names, made unique, and their
//! numbers.

use std::collections::{HashMap, HashSet};

use crate::base::rate::RateSpec;
use crate::config::{valid_name, Charge, ConfigError, LimitConfig, MatchConfig, OnMissing};
use crate::erl::config::{RuleConfig, Step};

/// The limit name of a rule with a bucket: its `limit`, else its own name, else its domain and
/// path, spelled as a limit name.
pub fn limit_name(config: &RuleConfig) -> String {
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
pub fn unique(
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
pub fn bucket_limit(
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
        scope: crate::config::regions::Scope::Local,
    }
}
