//! `[log] denials = "sampled"`: one JSON line per denied (limit, key) at most every
//! [`PER_KEY`], at most [`LINES_PER_S`] lines a second in all, on the `tollgate::denials` log
//! target. Each line says how many denials went unlogged since the previous line.
//!
//! Key values that are not IP addresses are logged as fingerprints: logs are read by more
//! people than those holding the admin token. Recording never waits: the per-key memory is
//! sharded and taken with `try_lock`; a denial that finds its shard busy is only counted (its
//! key is denied again a moment later, so a flooding key is still logged).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::base::clock::{Clock, MonotonicClock};
use crate::base::redact::{Caller, Salt};
use crate::observe::top::parts;

/// The shortest time between two lines about one (limit, key).
pub const PER_KEY: Duration = Duration::from_secs(10);
/// Lines per second over all keys, in bursts of at most as many.
pub const LINES_PER_S: u64 = 100;
/// The log target, so the lines can be routed or filtered (`RUST_LOG=tollgate::denials=off`).
pub const TARGET: &str = "tollgate::denials";

const SHARDS: usize = 16;
/// (limit, key) pairs remembered per shard: bounded whatever the number of keys. When a shard
/// is full of keys logged within [`PER_KEY`], further new keys wait for room (and are counted).
const REMEMBERED: usize = 1024;

pub struct DenialLog {
    /// Per shard: hash of (limit, key) -> when it was last logged, in clock microseconds.
    recent: [Mutex<HashMap<u64, u64>>; SHARDS],
    /// The line budget as a GCRA: the time at which the budget is next full again.
    budget_full_at: AtomicU64,
    suppressed: AtomicU64,
    clock: Arc<dyn Clock>,
}

/// A line to write, or nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Line(pub serde_json::Value);

impl Default for DenialLog {
    fn default() -> Self {
        DenialLog::with_clock(Arc::new(MonotonicClock::default()))
    }
}

impl DenialLog {
    pub fn with_clock(clock: Arc<dyn Clock>) -> DenialLog {
        DenialLog {
            recent: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            budget_full_at: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            clock,
        }
    }

    /// Logs a denial by `limit` of the key whose store tail is `tail`, if it is its turn; key
    /// values that are not addresses are fingerprinted with `salt`.
    pub fn note(&self, limit: &str, tail: &str, retry_after_s: Option<u64>, salt: &Salt) {
        if let Some(Line(line)) = self.line(limit, tail, retry_after_s, salt) {
            log::info!(target: TARGET, "{line}");
        }
    }

    /// The line to log for this denial, if any; otherwise the denial is counted as suppressed.
    pub fn line(
        &self,
        limit: &str,
        tail: &str,
        retry_after_s: Option<u64>,
        salt: &Salt,
    ) -> Option<Line> {
        if self.turn(limit, tail) {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            let key: Vec<String> = parts(tail)
                .iter()
                .map(|part| salt.shown(part, Caller::Anonymous).into_owned())
                .collect();
            return Some(Line(json!({
                "limit": limit,
                "key": key,
                "retry_after_s": retry_after_s,
                "suppressed": suppressed,
            })));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Whether this (limit, key) may be logged now; if so, it is remembered as logged.
    fn turn(&self, limit: &str, tail: &str) -> bool {
        let now = self.clock.now_us();
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one((limit, tail));
        let Ok(mut recent) =
            self.recent[usize::try_from(hash % SHARDS as u64).unwrap_or_default()].try_lock()
        else {
            return false;
        };
        let per_key = u64::try_from(PER_KEY.as_micros()).unwrap_or(u64::MAX);
        if let Some(&last) = recent.get(&hash) {
            if now.saturating_sub(last) < per_key {
                return false;
            }
        }
        if recent.len() >= REMEMBERED && !recent.contains_key(&hash) {
            recent.retain(|_, &mut last| now.saturating_sub(last) < per_key);
            if recent.len() >= REMEMBERED {
                return false;
            }
        }
        if !self.spend_line(now) {
            return false;
        }
        recent.insert(hash, now);
        true
    }

    /// Takes one line from the global budget ([`LINES_PER_S`] a second, bursts as large).
    fn spend_line(&self, now: u64) -> bool {
        let interval = 1_000_000 / LINES_PER_S;
        let burst = 1_000_000;
        let mut full_at = self.budget_full_at.load(Ordering::Relaxed);
        loop {
            let next = full_at.max(now) + interval;
            if next > now + burst {
                return false;
            }
            match self.budget_full_at.compare_exchange_weak(
                full_at,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => full_at = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn salt() -> Salt {
        Salt::configured("denial-log-test-salt")
    }
    use crate::base::clock::ManualClock;

    fn log_on(clock: &Arc<ManualClock>) -> DenialLog {
        clock.set_us(1_000_000_000);
        DenialLog::with_clock(clock.clone())
    }

    #[test]
    fn one_line_per_key_every_ten_seconds() {
        let clock = Arc::new(ManualClock::default());
        let log = log_on(&clock);
        assert!(log
            .line("per-ip", "203.0.113.9", Some(3), &salt())
            .is_some());
        assert!(log
            .line("per-ip", "203.0.113.9", Some(3), &salt())
            .is_none());
        // The same key under another limit is another pair; it reports the denial held back.
        let Line(other) = log
            .line("per-key", "203.0.113.9", Some(3), &salt())
            .expect("first");
        assert_eq!(other["suppressed"], 1);
        clock.advance_ms(9_999);
        assert!(log
            .line("per-ip", "203.0.113.9", Some(3), &salt())
            .is_none());
        assert!(log
            .line("per-key", "203.0.113.9", Some(3), &salt())
            .is_none());
        clock.advance_ms(1);
        let Line(line) = log
            .line("per-ip", "203.0.113.9", Some(2), &salt())
            .expect("its turn");
        assert_eq!(line["suppressed"], 2);
        assert_eq!(line["retry_after_s"], 2);
        assert_eq!(line["key"], json!(["203.0.113.9"]));
    }

    #[test]
    fn at_most_a_hundred_lines_a_second_in_all() {
        let clock = Arc::new(ManualClock::default());
        let log = log_on(&clock);
        let logged = |from: usize| {
            (from..from + 1000)
                .filter(|i| {
                    log.line(
                        "per-ip",
                        &format!("10.0.{}.{}", i / 256, i % 256),
                        None,
                        &salt(),
                    )
                    .is_some()
                })
                .count()
        };
        assert_eq!(logged(0), 100);
        clock.advance_ms(500);
        assert_eq!(logged(1000), 50);
    }

    #[test]
    fn keys_that_are_not_addresses_are_fingerprinted() {
        let clock = Arc::new(ManualClock::default());
        let log = log_on(&clock);
        let Line(line) = log
            .line("per-key", "sk_live_secret|GET", None, &salt())
            .expect("first");
        let key = line["key"].as_array().expect("parts");
        assert_eq!(key[0], salt().fingerprint("sk_live_secret"));
        assert_eq!(key[1], salt().fingerprint("GET"));
        assert!(!line.to_string().contains("sk_live_secret"));
    }

    #[test]
    fn memory_stays_bounded_under_many_keys() {
        let clock = Arc::new(ManualClock::default());
        let log = log_on(&clock);
        for i in 0..100_000u64 {
            let _ = log.line("per-ip", &format!("key-{i}"), None, &salt());
            clock.advance_us(10_000);
        }
        let remembered: usize = log.recent.iter().map(|r| r.lock().unwrap().len()).sum();
        assert!(remembered <= SHARDS * REMEMBERED, "{remembered}");
    }
}
