//! A local cache of denials that stays exact: once the store says a bucket held `tokens` after
//! a call, that bucket cannot hold more than `tokens + rate * elapsed` later on (it only
//! refills with time; every other change is a charge). So while that bound is below a
//! request's cost, the store would deny the request too, and asking it is wasted work; under a
//! flood of one key, this keeps the flood off Redis.
//!
//! Exactness rests on these choices:
//! - `elapsed` is counted from when the request was *sent* (local monotonic clock), which is
//!   no later than when the store evaluated it: any delay or clock offset only shortens the
//!   cached window;
//! - elapsed time is padded by [`MARGIN_US`] and [`DRIFT`] to cover the store clock's
//!   microsecond resolution, float rounding, and a store clock slewed faster than ours;
//! - an entry is used only for the same rate and burst it was learned with (a reload that
//!   changes a limit must not reuse the old bound);
//! - only buckets nothing but time can raise are cached: the caller must not consult the cache
//!   for a bucket that a refund may raise (on a Redis Cluster, any bucket of a policy whose
//!   limits are keyed on different parts: another request, here or on another instance, may
//!   charge it in one slot and give it back when another slot denies);
//! - a store clock that steps forward refills its buckets at once, which no local clock sees:
//!   one answer is used for at most [`MAX_WINDOW_US`], so such a step denies too much for at
//!   most that long (and a step backwards only makes the store refill later: still exact).
//!
//! When a cached window ends, every request in flight would otherwise rush to the store at
//! once. Instead the first one becomes the *probe* ([`Probe`]) and the others wait briefly for
//! its answer, then consult the cache again. How waiting and a waiter's own store call share
//! time: a waiter waits at most [`DenyCache::probe_wait`] (a few ms, at most a tenth of the
//! store timeout), and its own call, if it still needs one, gets the store's full timeout. So
//! a store that answers every call in time never makes a waiter fail, and any answer comes
//! within the store timeout plus that short wait. A slow store (round trip above the wait)
//! sees the rush: correct, only more calls.
//!
//! The probe protocol is closed in [`Probe`]: only a probe can teach the cache, it learns by
//! value (once), and dropping it unanswered (store error, timeout, cancellation) abandons the
//! probe. Every path that ends a probe wakes that bucket's waiters.
//!
//! Memory is bounded: sharded maps with a cap each; an entry is dropped once it can no longer
//! deny anything, and a full shard that has no such entry simply stops caching.
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::base::clock::{Clock, MonotonicClock};
use crate::base::rate::count_f64;
use crate::kinds::{BucketOutcome, BucketRequest};

const SHARDS: usize = 32;
/// Padding added to every elapsed time: the store's clock ticks in whole µs (two truncated
/// readings can be up to 1 µs further apart than the real interval), and the float sums of the
/// Lua script and of this file may round apart. Small, because at a high rate a wide pad
/// would leave nothing to cache (1 ms is 1.6 tokens at 1,600/s).
pub const MARGIN_US: f64 = 10.0;
/// Relative padding: NTP slews a clock by at most 500 ppm; twice that, to be safe.
pub const DRIFT: f64 = 0.001;
/// Longest one store answer is used to deny: the most a store clock stepping forward can make
/// the cache deny what the store would allow.
pub const MAX_WINDOW_US: u64 = 1_000_000;
/// Longest a check waits for another check's probe (further capped at a tenth of the store
/// timeout).
pub const MAX_PROBE_WAIT: Duration = Duration::from_millis(5);

/// What the store last said about one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    /// Tokens the bucket held after the call.
    tokens: f64,
    /// When that call was sent, in µs of [`DenyCache`]'s clock.
    sent_us: u64,
    rate: f64,
    burst: f64,
    /// From this time on the bucket may pay what it was asked for: the entry is worth little.
    useless_at_us: u64,
    /// When the window ended, the request sent to learn what came next (see module docs).
    probe_sent_us: Option<u64>,
}

impl Entry {
    /// The most tokens the bucket can hold at `now_us`; `None` once the answer is too old to
    /// speak for the bucket (see [`MAX_WINDOW_US`]).
    fn ceiling(&self, now_us: u64) -> Option<f64> {
        let age = now_us.saturating_sub(self.sent_us);
        if age > MAX_WINDOW_US {
            return None;
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "age is at most MAX_WINDOW_US here, exact in f64"
        )]
        let elapsed = age as f64 * (1.0 + DRIFT) + MARGIN_US;
        Some((self.tokens + elapsed * self.rate / 1_000_000.0).min(self.burst))
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
pub enum Consult<'c, 'b> {
    /// The store would surely deny it.
    Deny(CachedDenial),
    /// A window of one of its buckets just ended and another request is asking the store:
    /// [`DenyCache::wait`], then consult again.
    Wait,
    /// Ask the store, then hand its answer to the probe.
    Ask(Probe<'c, 'b>),
}

/// A request on its way to the store. [`Probe::learn`] teaches the cache the store's answer;
/// dropped without it (the store failed, or the check was cancelled), it abandons the probe.
/// Either way, checks waiting on these buckets are woken.
#[must_use = "hand the store's answer to `learn`; dropping abandons the probe"]
pub struct Probe<'c, 'b> {
    cache: &'c DenyCache,
    buckets: &'b [BucketRequest],
    sent_us: u64,
    open: bool,
}

impl Probe<'_, '_> {
    /// The store's answer to this request.
    pub fn learn(mut self, outcomes: &[BucketOutcome]) {
        self.open = false;
        self.cache.learn(self.buckets, outcomes, self.sent_us);
    }
}

impl Drop for Probe<'_, '_> {
    fn drop(&mut self) {
        if self.open {
            self.cache.abandon(self.buckets, self.sent_us);
        }
    }
}

struct Shard {
    entries: Mutex<HashMap<String, Entry>>,
    /// Woken whenever a probe on one of its entries ends.
    answered: Notify,
    /// Just after a bucket of this shard was last reset (µs of the cache's clock; written and
    /// read under `entries`' lock): answers to calls sent before then may describe the bucket
    /// before its reset, and are not learned.
    learn_from_us: AtomicU64,
}

pub struct DenyCache {
    shards: Box<[Shard]>,
    hasher: std::hash::RandomState,
    shard_cap: usize,
    clock: Arc<dyn Clock>,
    probe_wait: Duration,
    store_timeout: Duration,
}

impl DenyCache {
    /// A cache holding at most about `capacity` buckets, for a store that answers within
    /// `store_timeout`.
    pub fn new(capacity: usize, store_timeout: Duration) -> DenyCache {
        DenyCache::with_clock(capacity, store_timeout, Arc::new(MonotonicClock::default()))
    }

    /// [`DenyCache::new`] reading `clock` (tests advance a manual one).
    pub fn with_clock(
        capacity: usize,
        store_timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> DenyCache {
        DenyCache {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    entries: Mutex::new(HashMap::new()),
                    answered: Notify::new(),
                    learn_from_us: AtomicU64::new(0),
                })
                .collect(),
            hasher: std::hash::RandomState::new(),
            shard_cap: capacity.div_ceil(SHARDS).max(1),
            clock,
            probe_wait: MAX_PROBE_WAIT.min(store_timeout / 10),
            store_timeout,
        }
    }

    /// How long a check waits for another's probe (see the module docs).
    pub fn probe_wait(&self) -> Duration {
        self.probe_wait
    }

    /// The store's own timeout: the budget of a waiter's own call.
    pub fn store_timeout(&self) -> Duration {
        self.store_timeout
    }

    fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "a hash: only its low bits choose the shard"
    )]
    fn shard_of(&self, key: &str) -> &Shard {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    fn lock(shard: &Shard) -> MutexGuard<'_, HashMap<String, Entry>> {
        // Entries are plain values written whole: a poisoned shard is still consistent.
        shard
            .entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn entry(&self, key: &str) -> Option<Entry> {
        Self::lock(self.shard_of(key)).get(key).copied()
    }

    /// The buckets the cache may speak for: not shadow (never deny), cost within burst (an
    /// impossible cost is the store's to explain).
    fn cached<'b>(
        &self,
        buckets: &'b [BucketRequest],
    ) -> impl Iterator<Item = (usize, &'b BucketRequest)> {
        buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| !b.shadow && count_f64(b.cost) <= b.burst && Self::cacheable(b))
    }

    /// Only a bucket charged by its checks: a quota does not refill with time (its bound is
    /// the period's end, not `rate * elapsed`), a `charge = "report"` limit (cost 0) is drawn
    /// by reports the cache never sees, and a reserving one is raised by settles it never
    /// sees either. The store decides those every time.
    fn cacheable(bucket: &BucketRequest) -> bool {
        bucket.meter.is_plain_bucket() && bucket.cost >= 1
    }

    /// An entry speaks only for the limit it was learned with.
    fn usable(entry: &Entry, bucket: &BucketRequest) -> bool {
        entry.rate == bucket.rate && entry.burst == bucket.burst
    }

    /// Whether the store would surely deny `buckets` now: the first non-shadow bucket whose
    /// ceiling is below its cost.
    pub fn denies(&self, buckets: &[BucketRequest]) -> Option<CachedDenial> {
        self.look(buckets, self.now_us()).denial
    }

    /// One pass over the buckets' entries, one lock each: on the hot path most buckets have
    /// no entry at all, and this is then the whole cost of the cache.
    fn look(&self, buckets: &[BucketRequest], now_us: u64) -> Look {
        let mut look = Look::default();
        for (index, bucket) in self.cached(buckets) {
            let Some(entry) = self.entry(&bucket.key) else {
                continue;
            };
            look.known = true;
            look.probe_in_flight |= entry.probe_sent_us.is_some();
            if look.denial.is_none() && Self::usable(&entry, bucket) {
                match entry.ceiling(now_us) {
                    Some(tokens) if tokens < count_f64(bucket.cost) => {
                        look.denial = Some(CachedDenial {
                            bucket: index,
                            tokens,
                        });
                    }
                    _ => {}
                }
            }
        }
        look
    }

    /// Deny, wait for a probe, or ask the store; in the last case this request becomes the
    /// probe of every known bucket. After one wait, pass `waited`: then it is never told to
    /// wait again (a key under constant contention still gets answered).
    pub fn consult<'c, 'b>(
        &'c self,
        buckets: &'b [BucketRequest],
        waited: bool,
    ) -> Consult<'c, 'b> {
        // Taken before sending: the store evaluates the call later, so a bound counted from
        // here is never too tight.
        let now_us = self.now_us();
        let look = self.look(buckets, now_us);
        if let Some(denial) = look.denial {
            return Consult::Deny(denial);
        }
        if look.probe_in_flight && !waited {
            return Consult::Wait;
        }
        if look.known {
            for (_, bucket) in self.cached(buckets) {
                if let Some(entry) =
                    Self::lock(self.shard_of(&bucket.key)).get_mut(bucket.key.as_str())
                {
                    entry.probe_sent_us = Some(now_us);
                }
            }
        }
        Consult::Ask(Probe {
            cache: self,
            buckets,
            sent_us: now_us,
            open: true,
        })
    }

    /// Waits until the probe in flight on one of `buckets` ends, at most [`Self::probe_wait`].
    pub async fn wait(&self, buckets: &[BucketRequest]) {
        let probed = self.cached(buckets).find(|(_, b)| {
            self.entry(&b.key)
                .is_some_and(|e| e.probe_sent_us.is_some())
        });
        let Some((_, bucket)) = probed else {
            return;
        };
        let shard = self.shard_of(&bucket.key);
        let mut notified = std::pin::pin!(shard.answered.notified());
        // Registered before looking again, so an answer landing in between is not missed.
        notified.as_mut().enable();
        let still = Self::lock(shard)
            .get(bucket.key.as_str())
            .is_some_and(|e| e.probe_sent_us.is_some());
        if still {
            let _ = tokio::time::timeout(self.probe_wait, notified).await;
        }
    }

    /// The probe sent at `sent_us` failed: its marks are cleared and its waiters woken.
    fn abandon(&self, buckets: &[BucketRequest], sent_us: u64) {
        for bucket in buckets {
            let shard = self.shard_of(&bucket.key);
            let ended = match Self::lock(shard).get_mut(bucket.key.as_str()) {
                Some(entry) if entry.probe_sent_us.is_some_and(|p| p <= sent_us) => {
                    entry.probe_sent_us = None;
                    true
                }
                _ => false,
            };
            if ended {
                shard.answered.notify_waiters();
            }
        }
    }

    /// Learns from the store's answer to a call sent at `sent_us`: every bucket left unable to
    /// pay one token (or, when it refused, this request's cost) is cached until it may again;
    /// a bucket with tokens to spare is forgotten. Every probe this answer ends is woken.
    fn learn(&self, buckets: &[BucketRequest], outcomes: &[BucketOutcome], sent_us: u64) {
        for (bucket, outcome) in buckets.iter().zip(outcomes) {
            if !Self::cacheable(bucket) {
                continue;
            }
            let shard = self.shard_of(&bucket.key);
            let woke = self.learn_one(shard, bucket, outcome, sent_us);
            if woke {
                shard.answered.notify_waiters();
            }
        }
    }

    /// [`Self::learn`] for one bucket; returns whether waiters must be woken.
    fn learn_one(
        &self,
        shard: &Shard,
        bucket: &BucketRequest,
        outcome: &BucketOutcome,
        sent_us: u64,
    ) -> bool {
        let mut entries = Self::lock(shard);
        if sent_us < shard.learn_from_us.load(Ordering::Relaxed) {
            // Sent before a reset was heard: the answer may describe the bucket before it.
            return match entries.get_mut(bucket.key.as_str()) {
                Some(entry) if entry.probe_sent_us.is_some_and(|p| p <= sent_us) => {
                    entry.probe_sent_us = None;
                    true
                }
                _ => false,
            };
        }
        let existing = entries.get(bucket.key.as_str()).copied();
        let probed = existing.is_some_and(|e| e.probe_sent_us.is_some());
        // A probe sent after this call is still out: its mark stays.
        let later_probe = existing
            .and_then(|e| e.probe_sent_us)
            .filter(|&p| p > sent_us);
        if let Some(known) = existing.filter(|e| e.sent_us > sent_us) {
            // A later answer is already known; it bounds the bucket at least as tightly.
            if let Some(entry) = entries.get_mut(bucket.key.as_str()) {
                entry.probe_sent_us = later_probe;
            }
            return probed && known.probe_sent_us != later_probe;
        }
        let need = if outcome.enough {
            1.0
        } else {
            count_f64(bucket.cost).min(bucket.burst)
        };
        if outcome.tokens >= need || outcome.tokens.is_nan() {
            // Could serve the requests seen: nothing to save, and no probe to wait for.
            entries.remove(bucket.key.as_str());
            return probed;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "tokens < need, so the wait is > 0; capped at MAX_WINDOW_US, exact in f64"
        )]
        let wait_us =
            ((need - outcome.tokens) / bucket.rate * 1_000_000.0).min(MAX_WINDOW_US as f64) as u64;
        let entry = Entry {
            tokens: outcome.tokens,
            sent_us,
            rate: bucket.rate,
            burst: bucket.burst,
            useless_at_us: sent_us.saturating_add(wait_us),
            probe_sent_us: later_probe,
        };
        if existing.is_none() && entries.len() >= self.shard_cap {
            let now = self.now_us();
            entries.retain(|_, e| e.useless_at_us > now);
            if entries.len() >= self.shard_cap {
                // Full of live denials: skip; the store still decides exactly.
                return false;
            }
        }
        entries.insert(bucket.key.clone(), entry);
        probed && later_probe.is_none()
    }

    /// Forgets what is known of one bucket, which was just reset, and ignores answers to
    /// calls sent before now (they may describe the bucket before the reset). Checks waiting
    /// on it are woken, so they ask the store.
    pub fn forget(&self, key: &str) {
        let shard = self.shard_of(key);
        {
            let mut entries = Self::lock(shard);
            shard
                .learn_from_us
                .store(self.now_us() + 1, Ordering::Relaxed);
            entries.remove(key);
        }
        shard.answered.notify_waiters();
    }

    /// [`DenyCache::forget`] for every bucket: resets may have gone unheard.
    pub fn forget_all(&self) {
        for shard in self.shards.iter() {
            {
                let mut entries = Self::lock(shard);
                shard
                    .learn_from_us
                    .store(self.now_us() + 1, Ordering::Relaxed);
                entries.clear();
            }
            shard.answered.notify_waiters();
        }
    }

    /// Entries held (for tests and bounds).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.entries.lock().map_or(0, |m| m.len()))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
