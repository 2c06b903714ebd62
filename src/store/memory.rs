//! In-process buckets: the embedded default store, and the `on_error = "local"` fallback.
//!
//! Buckets are sharded over independently locked maps, so workers rarely contend and there is
//! no global lock. A multi-bucket decision locks its shards in index order (no deadlock) and is
//! as atomic as the Lua script. Memory is bounded: a bucket that has refilled to full is
//! equivalent to an absent one and is dropped when its shard needs room; if a shard is still
//! at its cap, the buckets closest to full are dropped (a dropped bucket restarts full, so this
//! is the only place the memory store can over-admit, and only past `max_buckets` live keys).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

use super::bucket::{self, Bucket};
use super::{BucketRequest, Store, StoreDecision, StoreError};

const SHARDS: usize = 64;

pub use crate::clock::{Clock, ManualClock, MonotonicClock};

struct Entry {
    bucket: Bucket,
    full_at_us: u64,
}

#[derive(Default)]
struct Shard {
    buckets: HashMap<String, Entry>,
}

/// One shard per cache line pair: adjacent shard locks would otherwise share a line, and two
/// workers on different shards would still contend on it (false sharing).
#[repr(align(128))]
struct PaddedShard(Mutex<Shard>);

pub struct MemoryStore<C: Clock = MonotonicClock> {
    shards: Box<[PaddedShard]>,
    hasher: RandomState,
    shard_cap: usize,
    clock: C,
}

impl MemoryStore<MonotonicClock> {
    pub fn new(max_buckets: usize) -> Self {
        MemoryStore::with_clock(max_buckets, MonotonicClock::default())
    }
}

impl<C: Clock> MemoryStore<C> {
    pub fn with_clock(max_buckets: usize, clock: C) -> Self {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| PaddedShard(Mutex::new(Shard::default())))
                .collect(),
            hasher: RandomState::new(),
            shard_cap: max_buckets.div_ceil(SHARDS).max(1),
            clock,
        }
    }

    /// Buckets currently held.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).buckets.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // A panic while holding a shard cannot leave a bucket half-written (plain field
        // stores), so a poisoned lock is still safe to use.
        self.shards[shard]
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The decision itself, synchronous: a few hash lookups under shard locks.
    pub fn decide_now(&self, requests: &[BucketRequest]) -> StoreDecision {
        let now = self.clock.now_us();
        if let [request] = requests {
            return self.decide_one(request, now);
        }
        let shard_ids: Vec<usize> = requests.iter().map(|r| self.shard_of(&r.key)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.lock(i))).collect();

        let mut states: Vec<Option<Bucket>> = requests
            .iter()
            .zip(&shard_ids)
            .map(|(request, shard)| {
                let guard = &guards[order.binary_search(shard).unwrap_or_default()].1;
                guard.buckets.get(request.key.as_str()).map(|e| e.bucket)
            })
            .collect();
        let (allowed, outcomes) = bucket::decide(requests, &mut states, now);

        for ((request, shard), state) in requests.iter().zip(&shard_ids).zip(states) {
            let Some(bucket) = state else { continue };
            let guard = &mut guards[order.binary_search(shard).unwrap_or_default()].1;
            let entry = Entry {
                bucket,
                full_at_us: bucket.full_at_us(request.rate, request.burst),
            };
            if let Some(existing) = guard.buckets.get_mut(request.key.as_str()) {
                *existing = entry;
            } else {
                make_room(&mut guard.buckets, self.shard_cap, now);
                guard.buckets.insert(request.key.clone(), entry);
            }
        }
        StoreDecision {
            allowed,
            buckets: outcomes,
        }
    }
}

impl<C: Clock> MemoryStore<C> {
    /// The common case of one limit: one lock, one lookup on a hit, and no allocation beyond
    /// the answer (the general path collects shard ids, guards and states into vectors).
    fn decide_one(&self, request: &BucketRequest, now: u64) -> StoreDecision {
        let entry_of = |bucket: Bucket| Entry {
            bucket,
            full_at_us: bucket.full_at_us(request.rate, request.burst),
        };
        let requests = std::slice::from_ref(request);
        let mut shard = self.lock(self.shard_of(&request.key));
        if let Some(existing) = shard.buckets.get_mut(request.key.as_str()) {
            let mut states = [Some(existing.bucket)];
            let (allowed, buckets) = bucket::decide(requests, &mut states, now);
            if let [Some(bucket)] = states {
                *existing = entry_of(bucket);
            }
            return StoreDecision { allowed, buckets };
        }
        let mut states = [None];
        let (allowed, buckets) = bucket::decide(requests, &mut states, now);
        if let [Some(bucket)] = states {
            make_room(&mut shard.buckets, self.shard_cap, now);
            shard.buckets.insert(request.key.clone(), entry_of(bucket));
        }
        StoreDecision { allowed, buckets }
    }
}

/// Frees space in a full shard: first every bucket that has refilled (lossless), then, if that
/// was not enough, the eighth of the shard closest to full.
fn make_room(buckets: &mut HashMap<String, Entry>, cap: usize, now_us: u64) {
    if buckets.len() < cap {
        return;
    }
    buckets.retain(|_, entry| entry.full_at_us > now_us);
    if buckets.len() < cap {
        return;
    }
    let mut full_at: Vec<u64> = buckets.values().map(|e| e.full_at_us).collect();
    let cut = (full_at.len() / 8).max(1).min(full_at.len() - 1);
    let (_, threshold, _) = full_at.select_nth_unstable(cut);
    let threshold = *threshold;
    buckets.retain(|_, entry| entry.full_at_us > threshold);
    log::debug!("memory store shard at its cap of {cap}: dropped the buckets closest to full");
}

impl<C: Clock> Store for MemoryStore<C> {
    async fn decide(&self, buckets: &[BucketRequest]) -> Result<StoreDecision, StoreError> {
        Ok(self.decide_now(buckets))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn request(key: &str) -> BucketRequest {
        BucketRequest {
            key: key.into(),
            rate: 1.0,
            burst: 2.0,
            cost: 1,
            shadow: false,
            limit: 0,
        }
    }

    #[test]
    fn memory_is_bounded_by_max_buckets() {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::with_clock(640, clock.clone());
        for i in 0..100_000 {
            store.decide_now(&[request(&format!("k{i}"))]);
        }
        assert!(store.len() <= 640, "held {}", store.len());
    }

    #[test]
    fn refilled_buckets_are_dropped_first() {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::with_clock(64, clock.clone());
        store.decide_now(&[request("old")]);
        clock.advance_ms(10_000);
        for i in 0..1000 {
            store.decide_now(&[request(&format!("k{i}"))]);
        }
        assert!(store.len() <= 64);
    }

    #[test]
    fn a_single_bucket_drains_and_refills_like_the_script() {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::with_clock(1000, clock.clone());
        let one = [request("solo")];
        assert!(store.decide_now(&one).allowed);
        assert_eq!(store.decide_now(&one).buckets[0].tokens, 0.0);
        let denied = store.decide_now(&one);
        assert!(!denied.allowed && !denied.buckets[0].enough);
        clock.advance_ms(1000);
        assert!(store.decide_now(&one).allowed);
        assert!(!store.decide_now(&one).allowed);
    }

    #[test]
    fn buckets_in_different_shards_are_decided_together() {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::with_clock(1000, clock);
        let reqs: Vec<_> = (0..10).map(|i| request(&format!("multi{i}"))).collect();
        assert!(store.decide_now(&reqs).allowed);
        assert!(store.decide_now(&reqs).allowed);
        let third = store.decide_now(&reqs);
        assert!(!third.allowed);
        assert!(third.buckets.iter().all(|b| !b.enough));
    }
}
