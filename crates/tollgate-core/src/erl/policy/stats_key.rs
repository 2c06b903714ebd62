//! envoyproxy/ratelimit's stats keys: what its metrics of a rule are named by, spelled and
//! sanitized as it spells them.

use std::fmt::Write as _;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The longest request value (or, in a descriptor's own limit, key) a stats key spells as it
/// is; a longer one is spelled by its hash (`h_` and 16 hex digits), so a key stays short
/// whatever a client sends.
pub const MAX_SPELLED_BYTES: usize = 64;

/// The last segment of the key a rule's metrics count into once the stats keys that carry
/// request values are at their cap (see `observe::erl_stats`).
pub const OVERFLOW_SEGMENT: &str = "overflow";

/// envoyproxy/ratelimit's stats key of a rule: `domain.` and one segment per level of its
/// path, `key_value` or `key` as the configuration spells the node, except where its
/// `value_to_metric` (a key-only or wildcard node) or the rule's `detailed_metric` put the
/// request's value in; `share_threshold` keeps the wildcard pattern. Sanitized as it
/// sanitizes stat names (`:` and `|`, and the dots of IPv4 addresses, become `_`), and
/// control characters too (see [`sanitize`]).
#[derive(Debug, Clone, PartialEq)]
pub enum StatsKey {
    /// The same for every request: built once, sanitized.
    Fixed(Arc<str>),
    /// Built per request from its entries, one segment per level.
    PerRequest {
        domain: String,
        segments: Vec<Segment>,
        /// `domain.<the rule's path as configured>.overflow`, sanitized: where the rule counts
        /// once the keys carrying request values are at their cap.
        overflow: Arc<str>,
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
    /// The key for a descriptor this rule limits, its entries `(key, value)` in order;
    /// `scratch` holds a key built per request.
    pub fn spell<'a, 'e>(
        &'a self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
        scratch: &'a mut String,
    ) -> &'a str {
        match self {
            StatsKey::Fixed(key) => key,
            StatsKey::PerRequest {
                domain, segments, ..
            } => {
                scratch.clear();
                scratch.push_str(domain);
                for (segment, (key, value)) in segments.iter().zip(entries) {
                    scratch.push('.');
                    match segment {
                        Segment::Config(text) => scratch.push_str(text),
                        Segment::Value { underscore } => {
                            scratch.push_str(key);
                            if *underscore || !value.is_empty() {
                                scratch.push('_');
                                push_part(scratch, value);
                            }
                        }
                    }
                }
                sanitize(scratch);
                scratch
            }
        }
    }

    /// Where this rule counts once the keys carrying request values are at their cap; `None`
    /// for a key the configuration spells alone (one per rule: never capped).
    pub fn overflow(&self) -> Option<&str> {
        match self {
            StatsKey::Fixed(_) => None,
            StatsKey::PerRequest { overflow, .. } => Some(overflow),
        }
    }
}

/// The overflow key of a rule of `domain` whose levels the configuration spells `path`:
/// `domain.<path joined by dots>.overflow`, sanitized.
pub fn rule_overflow_key(domain: &str, path: &[String]) -> Arc<str> {
    let mut key = domain.to_string();
    for level in path {
        key.push('.');
        key.push_str(level);
    }
    key.push('.');
    key.push_str(OVERFLOW_SEGMENT);
    sanitize(&mut key);
    Arc::from(key)
}

/// The overflow key of descriptors carrying their own `limit` in `domain`:
/// `domain.overflow`, sanitized.
pub fn request_limit_overflow_key(domain: &str, into: &mut String) {
    into.clear();
    into.push_str(domain);
    into.push('.');
    into.push_str(OVERFLOW_SEGMENT);
    sanitize(into);
}

/// A request's `part` as a stats key spells it: as it is up to [`MAX_SPELLED_BYTES`]; longer,
/// `h_` and the first 16 hex digits of its SHA-256, the same on every instance and release.
fn push_part(into: &mut String, part: &str) {
    if part.len() <= MAX_SPELLED_BYTES {
        into.push_str(part);
        return;
    }
    let digest = Sha256::digest(part.as_bytes());
    into.push_str("h_");
    for byte in &digest[..8] {
        let _ = write!(into, "{byte:02x}");
    }
}

/// The stats key of a descriptor decided by its own `limit` (sent by Envoy): every entry's
/// `key_value` (`key` for an empty value), as envoyproxy/ratelimit keys it; a key or value
/// longer than [`MAX_SPELLED_BYTES`] by its hash.
pub fn request_limit_stats_key<'e>(
    domain: &str,
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    into: &mut String,
) {
    into.clear();
    into.push_str(domain);
    into.push('.');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            into.push('.');
        }
        push_part(into, key);
        if !value.is_empty() {
            into.push('_');
            push_part(into, value);
        }
    }
    sanitize(into);
}

/// envoyproxy/ratelimit's stat name sanitizing: `:` and `|` become `_`, and so do the dots of
/// anything shaped as an IPv4 address (four runs of 1 to 3 digits joined by dots, found left
/// to right), so such a value stays one segment of the name. Every ASCII control character
/// (below 0x20, and DEL) becomes `_` too: a newline in a client's value would otherwise end
/// the statsd line and start one of the client's choosing.
pub fn sanitize(name: &mut String) {
    if !name
        .bytes()
        .any(|b| matches!(b, b':' | b'|' | b'.') || b.is_ascii_control())
    {
        return;
    }
    let mut bytes = std::mem::take(name).into_bytes();
    for b in &mut bytes {
        if matches!(*b, b':' | b'|') || b.is_ascii_control() {
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
