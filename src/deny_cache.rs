//! A local cache of denials that stays exact: once the store says a bucket held `tokens` after
//! a call, that bucket cannot hold more than `tokens + rate * elapsed` later on (it only
//! refills with time; every other change is a charge). So while that bound is below a
//! request's cost, the store would deny the request too, and asking it is wasted work; under a
//! flood of one key, this keeps the flood off Redis.
//!
//! Exactness rests on three choices:
//! - `elapsed` is counted from when the request was *sent* (local monotonic clock), which is
//!   no later than when the store evaluated it: any delay or clock offset only shortens the
//!   cached window;
//! - elapsed time is padded by [`MARGIN_US`] and [`DRIFT`] to cover the store clock's
//!   microsecond resolution, float rounding, and a store clock slewed faster than ours;
//! - an entry is used only for the same rate and burst it was learned with (a reload that
//!   changes a limit must not reuse the old bound).
//!
//! Memory is bounded: sharded maps with a cap each; an entry is dropped once it can no longer
//! deny anything, and a full shard that has no such entry simply stops caching.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::store::{BucketOutcome, BucketRequest};

const SHARDS: usize = 32;
/// Padding added to every elapsed time: the store's clock ticks in whole µs (two truncated
/// readings can be up to 1 µs further apart than the real interval), and the float sums of the
/// Lua script and of this file may round apart. Small, because at a high rate a wide pad
/// would leave nothing to cache (1 ms is 1.6 tokens at 1,600/s).
pub const MARGIN_US: f64 = 10.0;
/// Relative padding: NTP slews a clock by at most 500 ppm; twice that, to be safe.
pub const DRIFT: f64 = 0.001;

/// What the store last said about one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    /// Tokens the bucket held after the call.
    tokens: f64,
    /// When that call was sent, in µs of [`DenyCache`]'s monotonic clock.
    sent_us: u64,
    rate: f64,
    burst: f64,
    /// From this time on the bucket may pay what it was asked for: the entry is worth little.
    useless_at_us: u64,
}

impl Entry {
    /// The most tokens the bucket can hold at `now_us`.
    fn ceiling(&self, now_us: u64) -> f64 {
        let elapsed = now_us.saturating_sub(self.sent_us) as f64 * (1.0 + DRIFT) + MARGIN_US;
        (self.tokens + elapsed * self.rate / 1_000_000.0).min(self.burst)
    }
}

/// A bucket the cache denies: what its headers show.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachedDenial {
    /// Index of the bucket in the request.
    pub bucket: usize,
    /// Upper bound of its tokens now (below the cost).
    pub tokens: f64,
}

pub struct DenyCache {
    shards: Box<[Mutex<HashMap<String, Entry>>]>,
    hasher: std::hash::RandomState,
    shard_cap: usize,
    epoch: Instant,
}

impl DenyCache {
    /// A cache holding at most about `capacity` buckets.
    pub fn new(capacity: usize) -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::hash::RandomState::new(),
            shard_cap: capacity.div_ceil(SHARDS).max(1),
            epoch: Instant::now(),
        }
    }

    /// Microseconds on the cache's monotonic clock: take it just before sending to the store.
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, Entry>> {
        let index = (self.hasher.hash_one(key) as usize) % SHARDS;
        // Entries are plain values written whole: a poisoned shard is still consistent.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the store would surely deny `buckets` now: the first non-shadow bucket whose
    /// ceiling is below its cost.
    pub fn denies(&self, buckets: &[BucketRequest], now_us: u64) -> Option<CachedDenial> {
        buckets.iter().enumerate().find_map(|(index, bucket)| {
            if bucket.shadow || bucket.cost as f64 > bucket.burst {
                // Shadow limits never deny; an impossible cost is the store's to explain.
                return None;
            }
            let entry = *self.shard(&bucket.key).get(bucket.key.as_str())?;
            if entry.rate != bucket.rate || entry.burst != bucket.burst {
                return None;
            }
            let tokens = entry.ceiling(now_us);
            (tokens < bucket.cost as f64).then_some(CachedDenial {
                bucket: index,
                tokens,
            })
        })
    }

    /// Learns from the store's answer to a call sent at `sent_us`: every bucket left unable to
    /// pay one token (or, when it refused, this request's cost) is cached until it may again.
    pub fn learn(&self, buckets: &[BucketRequest], outcomes: &[BucketOutcome], sent_us: u64) {
        for (bucket, outcome) in buckets.iter().zip(outcomes) {
            let need = if outcome.enough {
                1.0
            } else {
                (bucket.cost as f64).min(bucket.burst)
            };
            if outcome.tokens >= need || outcome.tokens.is_nan() {
                // Could serve the requests seen: nothing to save. A stale entry may remain,
                // but it still bounds the bucket from above.
                continue;
            }
            let mut entry = Entry {
                tokens: outcome.tokens,
                sent_us,
                rate: bucket.rate,
                burst: bucket.burst,
                useless_at_us: 0,
            };
            let wait_us = (need - entry.tokens) / bucket.rate * 1_000_000.0;
            entry.useless_at_us = sent_us.saturating_add(wait_us.min(u64::MAX as f64) as u64);
            let now = self.now_us();
            let mut shard = self.shard(&bucket.key);
            if let Some(existing) = shard.get_mut(bucket.key.as_str()) {
                // Any answer bounds the bucket; keep the later one, it is the tighter.
                if existing.sent_us <= sent_us {
                    *existing = entry;
                }
                continue;
            }
            if shard.len() >= self.shard_cap {
                shard.retain(|_, e| e.useless_at_us > now);
                if shard.len() >= self.shard_cap {
                    // Full of live denials: skip; the store still decides exactly.
                    continue;
                }
            }
            shard.insert(bucket.key.clone(), entry);
        }
    }

    /// Entries held (for tests and bounds).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(key: &str, rate: f64, burst: f64, cost: u64) -> BucketRequest {
        BucketRequest {
            key: key.into(),
            rate,
            burst,
            cost,
            shadow: false,
            limit: 0,
        }
    }

    fn drained(tokens: f64) -> BucketOutcome {
        BucketOutcome {
            tokens,
            enough: false,
        }
    }

    const SEC: u64 = 1_000_000;

    #[test]
    fn denies_until_the_bucket_can_refill_counting_from_the_send_time() {
        let cache = DenyCache::new(100);
        let b = [bucket("k", 10.0, 5.0, 1)];
        cache.learn(&b, &[drained(0.0)], 5 * SEC);
        // 10/s: one token 100 ms after the send, less the margins.
        assert!(cache.denies(&b, 5 * SEC + 50_000).is_some());
        assert!(cache.denies(&b, 5 * SEC + 99_000).is_some());
        assert!(cache.denies(&b, 5 * SEC + 99_900).is_none());
        assert!(cache.denies(&b, 6 * SEC).is_none());
    }

    #[test]
    fn a_larger_cost_is_denied_longer() {
        let cache = DenyCache::new(100);
        cache.learn(&[bucket("k", 10.0, 5.0, 1)], &[drained(0.5)], 0);
        assert!(cache.denies(&[bucket("k", 10.0, 5.0, 1)], 60_000).is_none());
        let denied = cache.denies(&[bucket("k", 10.0, 5.0, 3)], 60_000).unwrap();
        assert!(denied.tokens < 3.0 && denied.tokens > 1.0);
    }

    #[test]
    fn shadow_limits_changed_limits_and_impossible_costs_are_left_to_the_store() {
        let cache = DenyCache::new(100);
        cache.learn(&[bucket("k", 10.0, 5.0, 1)], &[drained(0.0)], 0);
        let mut shadow = bucket("k", 10.0, 5.0, 1);
        shadow.shadow = true;
        assert!(cache.denies(&[shadow], 0).is_none());
        assert!(cache.denies(&[bucket("k", 20.0, 5.0, 1)], 0).is_none());
        assert!(cache.denies(&[bucket("k", 10.0, 5.0, 9)], 0).is_none());
    }

    #[test]
    fn the_denying_bucket_of_a_multi_limit_request_is_named() {
        let cache = DenyCache::new(100);
        let reqs = [bucket("a", 10.0, 5.0, 1), bucket("b", 10.0, 5.0, 1)];
        cache.learn(
            &reqs,
            &[
                BucketOutcome {
                    tokens: 4.0,
                    enough: true,
                },
                drained(0.0),
            ],
            0,
        );
        assert_eq!(cache.denies(&reqs, 0).map(|d| d.bucket), Some(1));
        assert!(cache.denies(&reqs[..1], 0).is_none());
    }

    #[test]
    fn memory_is_capped_and_useless_entries_make_room() {
        let cache = DenyCache::new(320);
        for i in 0..10_000u64 {
            let b = [bucket(&format!("k{i}"), 1_000.0, 5.0, 1)];
            cache.learn(&b, &[drained(0.0)], cache.now_us());
        }
        assert!(cache.len() <= 320, "held {}", cache.len());
        std::thread::sleep(std::time::Duration::from_millis(5));
        cache.learn(
            &[bucket("new", 1.0, 5.0, 1)],
            &[drained(0.0)],
            cache.now_us(),
        );
        assert!(cache
            .denies(&[bucket("new", 1.0, 5.0, 1)], cache.now_us())
            .is_some());
    }
}
