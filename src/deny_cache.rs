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
//! When a cached window ends, every request in flight would otherwise rush to the store at
//! once (a flood of 64 connections sent ~64 calls per window). Instead the first one probes
//! and the others wait for its answer (at most the store timeout), then consult the cache
//! again: waiting changes no decision, it only saves the calls.
//!
//! Memory is bounded: sharded maps with a cap each; an entry is dropped once it can no longer
//! deny anything, and a full shard that has no such entry simply stops caching.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::store::memory::{Clock, MonotonicClock};
use crate::store::{BucketOutcome, BucketRequest, Meter};

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
    /// When the window ended, the request sent to learn what came next (see module docs).
    probe_sent_us: Option<u64>,
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

/// What the cache knows of a request's buckets.
#[derive(Default)]
struct Look {
    /// The first bucket the store would surely deny.
    denial: Option<CachedDenial>,
    /// Another request is asking the store about one of them.
    probe_in_flight: bool,
    /// At least one of them has an entry.
    known: bool,
}

/// What to do with a request, per the cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Consult {
    /// The store would surely deny it.
    Deny(CachedDenial),
    /// A window of one of its buckets just ended and another request is asking the store:
    /// wait for that answer ([`DenyCache::wait_for_answer`]), then consult again.
    Wait,
    /// Ask the store.
    Ask,
}

pub struct DenyCache {
    shards: Box<[Mutex<HashMap<String, Entry>>]>,
    hasher: std::hash::RandomState,
    shard_cap: usize,
    clock: MonotonicClock,
    /// How long a probe may be waited for: the store's own timeout.
    probe_timeout: Duration,
    /// Woken whenever a probe's answer (or failure) arrives.
    answered: Notify,
}

impl DenyCache {
    /// A cache holding at most about `capacity` buckets; a probe is waited for at most
    /// `probe_timeout`.
    pub fn new(capacity: usize, probe_timeout: Duration) -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::hash::RandomState::new(),
            shard_cap: capacity.div_ceil(SHARDS).max(1),
            clock: MonotonicClock::default(),
            probe_timeout,
            answered: Notify::new(),
        }
    }

    /// Microseconds on the cache's monotonic clock: take it just before sending to the store.
    pub fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, Entry>> {
        let index = (self.hasher.hash_one(key) as usize) % SHARDS;
        // Entries are plain values written whole: a poisoned shard is still consistent.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The buckets the cache may speak for: not shadow (never deny), cost within burst (an
    /// impossible cost is the store's to explain), and an entry learned with the same limit.
    fn cached<'b>(
        &self,
        buckets: &'b [BucketRequest],
    ) -> impl Iterator<Item = (usize, &'b BucketRequest)> {
        buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| !b.shadow && b.cost as f64 <= b.burst && Self::cacheable(b))
    }

    /// Only a bucket charged by its checks: a quota does not refill with time (its bound is
    /// the period's end, not `rate * elapsed`), and a `charge = "report"` limit (cost 0) is
    /// drawn by reports the cache never sees. The store decides those every time.
    fn cacheable(bucket: &BucketRequest) -> bool {
        bucket.meter == Meter::Bucket && bucket.cost >= 1
    }

    fn usable(entry: &Entry, bucket: &BucketRequest) -> bool {
        entry.rate == bucket.rate && entry.burst == bucket.burst
    }

    /// Whether the store would surely deny `buckets` now: the first non-shadow bucket whose
    /// ceiling is below its cost.
    pub fn denies(&self, buckets: &[BucketRequest], now_us: u64) -> Option<CachedDenial> {
        self.look(buckets, now_us).denial
    }

    /// One pass over the buckets' entries, one lock each: on the hot path most buckets have
    /// no entry at all, and this is then the whole cost of the cache.
    fn look(&self, buckets: &[BucketRequest], now_us: u64) -> Look {
        let timeout = self.probe_timeout.as_micros() as u64;
        let mut look = Look::default();
        for (index, bucket) in self.cached(buckets) {
            let Some(entry) = self.shard(&bucket.key).get(bucket.key.as_str()).copied() else {
                continue;
            };
            look.known = true;
            look.probe_in_flight |= entry
                .probe_sent_us
                .is_some_and(|sent| now_us.saturating_sub(sent) < timeout);
            if look.denial.is_none() && Self::usable(&entry, bucket) {
                let tokens = entry.ceiling(now_us);
                if tokens < bucket.cost as f64 {
                    look.denial = Some(CachedDenial {
                        bucket: index,
                        tokens,
                    });
                }
            }
        }
        look
    }

    /// Deny, wait for a probe, or ask the store; in the last case this request becomes the
    /// probe of every bucket whose window has ended.
    pub fn consult(&self, buckets: &[BucketRequest], now_us: u64) -> Consult {
        let look = self.look(buckets, now_us);
        if let Some(denial) = look.denial {
            return Consult::Deny(denial);
        }
        if look.probe_in_flight {
            return Consult::Wait;
        }
        if look.known {
            for (_, bucket) in self.cached(buckets) {
                if let Some(entry) = self.shard(&bucket.key).get_mut(bucket.key.as_str()) {
                    entry.probe_sent_us = Some(now_us);
                }
            }
        }
        Consult::Ask
    }

    /// The store timeout: how long a probe may be waited for, and the budget of a whole check
    /// that waited (see [`crate::limiter`]).
    pub fn timeout(&self) -> Duration {
        self.probe_timeout
    }

    /// Waits until a probe about `buckets` is answered, at most `budget`.
    pub async fn wait_for_answer(&self, buckets: &[BucketRequest], budget: Duration) {
        let notified = std::pin::pin!(self.answered.notified());
        let mut notified = notified;
        // Registered before looking again, so an answer landing in between is not missed.
        notified.as_mut().enable();
        if self.look(buckets, self.now_us()).probe_in_flight {
            let _ = tokio::time::timeout(budget, notified).await;
        }
    }

    /// The store failed a call sent at `sent_us`: its probes are over.
    pub fn abandon(&self, buckets: &[BucketRequest], sent_us: u64) {
        let mut woke = false;
        for bucket in buckets {
            if let Some(entry) = self.shard(&bucket.key).get_mut(bucket.key.as_str()) {
                if entry.probe_sent_us.is_some_and(|p| p <= sent_us) {
                    entry.probe_sent_us = None;
                    woke = true;
                }
            }
        }
        if woke {
            self.answered.notify_waiters();
        }
    }

    /// Learns from the store's answer to a call sent at `sent_us`: every bucket left unable to
    /// pay one token (or, when it refused, this request's cost) is cached until it may again;
    /// a bucket with tokens to spare is forgotten.
    pub fn learn(&self, buckets: &[BucketRequest], outcomes: &[BucketOutcome], sent_us: u64) {
        let mut woke = false;
        for (bucket, outcome) in buckets.iter().zip(outcomes) {
            if !Self::cacheable(bucket) {
                continue;
            }
            let need = if outcome.enough {
                1.0
            } else {
                (bucket.cost as f64).min(bucket.burst)
            };
            let mut shard = self.shard(&bucket.key);
            let existing = shard.get(bucket.key.as_str()).copied();
            woke |= existing.is_some_and(|e| e.probe_sent_us.is_some_and(|p| p <= sent_us));
            if existing.is_some_and(|e| e.sent_us > sent_us) {
                // A later answer is already known; it bounds the bucket at least as tightly.
                continue;
            }
            if outcome.tokens >= need || outcome.tokens.is_nan() {
                // Could serve the requests seen: nothing to save, and no probe to wait for.
                shard.remove(bucket.key.as_str());
                continue;
            }
            let wait_us = (need - outcome.tokens) / bucket.rate * 1_000_000.0;
            let entry = Entry {
                tokens: outcome.tokens,
                sent_us,
                rate: bucket.rate,
                burst: bucket.burst,
                useless_at_us: sent_us.saturating_add(wait_us.min(u64::MAX as f64) as u64),
                probe_sent_us: None,
            };
            if existing.is_none() && shard.len() >= self.shard_cap {
                let now = self.now_us();
                shard.retain(|_, e| e.useless_at_us > now);
                if shard.len() >= self.shard_cap {
                    // Full of live denials: skip; the store still decides exactly.
                    continue;
                }
            }
            shard.insert(bucket.key.clone(), entry);
        }
        if woke {
            self.answered.notify_waiters();
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
            meter: Default::default(),
        }
    }

    fn drained(tokens: f64) -> BucketOutcome {
        BucketOutcome {
            tokens,
            enough: false,
            window: None,
        }
    }

    const SEC: u64 = 1_000_000;

    #[test]
    fn denies_until_the_bucket_can_refill_counting_from_the_send_time() {
        let cache = DenyCache::new(100, Duration::from_millis(50));
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
        let cache = DenyCache::new(100, Duration::from_millis(50));
        cache.learn(&[bucket("k", 10.0, 5.0, 1)], &[drained(0.5)], 0);
        assert!(cache.denies(&[bucket("k", 10.0, 5.0, 1)], 60_000).is_none());
        let denied = cache.denies(&[bucket("k", 10.0, 5.0, 3)], 60_000).unwrap();
        assert!(denied.tokens < 3.0 && denied.tokens > 1.0);
    }

    #[test]
    fn shadow_limits_changed_limits_and_impossible_costs_are_left_to_the_store() {
        let cache = DenyCache::new(100, Duration::from_millis(50));
        cache.learn(&[bucket("k", 10.0, 5.0, 1)], &[drained(0.0)], 0);
        let mut shadow = bucket("k", 10.0, 5.0, 1);
        shadow.shadow = true;
        assert!(cache.denies(&[shadow], 0).is_none());
        assert!(cache.denies(&[bucket("k", 20.0, 5.0, 1)], 0).is_none());
        assert!(cache.denies(&[bucket("k", 10.0, 5.0, 9)], 0).is_none());
    }

    #[test]
    fn the_denying_bucket_of_a_multi_limit_request_is_named() {
        let cache = DenyCache::new(100, Duration::from_millis(50));
        let reqs = [bucket("a", 10.0, 5.0, 1), bucket("b", 10.0, 5.0, 1)];
        cache.learn(
            &reqs,
            &[
                BucketOutcome {
                    tokens: 4.0,
                    enough: true,
                    window: None,
                },
                drained(0.0),
            ],
            0,
        );
        assert_eq!(cache.denies(&reqs, 0).map(|d| d.bucket), Some(1));
        assert!(cache.denies(&reqs[..1], 0).is_none());
    }

    #[test]
    fn when_a_window_ends_one_request_probes_and_the_others_wait() {
        let cache = DenyCache::new(100, Duration::from_millis(50));
        let b = [bucket("k", 10.0, 5.0, 1)];
        cache.learn(&b, &[drained(0.0)], 0);
        assert!(matches!(cache.consult(&b, 10_000), Consult::Deny(_)));
        assert_eq!(cache.consult(&b, 200_000), Consult::Ask);
        assert_eq!(cache.consult(&b, 200_100), Consult::Wait);
        // The probe's answer: it took the token; the bucket is denied again.
        cache.learn(&b, &[drained(0.0)], 200_000);
        assert!(matches!(cache.consult(&b, 200_200), Consult::Deny(_)));
        // A probe that never answers is waited for only up to the timeout.
        assert_eq!(cache.consult(&b, 400_000), Consult::Ask);
        assert_eq!(cache.consult(&b, 460_000), Consult::Ask);
    }

    #[test]
    fn a_bucket_with_tokens_to_spare_is_forgotten() {
        let cache = DenyCache::new(100, Duration::from_millis(50));
        let b = [bucket("k", 10.0, 5.0, 1)];
        cache.learn(&b, &[drained(0.0)], 0);
        let plenty = BucketOutcome {
            tokens: 3.0,
            enough: true,
            window: None,
        };
        cache.learn(&b, &[plenty], 10);
        assert!(cache.is_empty());
        assert_eq!(cache.consult(&b, 20), Consult::Ask);
    }

    #[test]
    fn memory_is_capped_and_useless_entries_make_room() {
        let cache = DenyCache::new(320, Duration::from_millis(50));
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
