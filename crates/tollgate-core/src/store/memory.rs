//! In-process buckets: the embedded default store, and the `on_error = "local"` fallback.
//!
//! Buckets are sharded over independently locked maps, so workers rarely contend and there is
//! no global lock. A multi-bucket decision locks its shards in index order (no deadlock) and is
//! as atomic as the Lua script.
//!
//! Memory is bounded by `max_buckets` over the whole store, counted by one atomic that only a
//! new bucket touches. Nothing is dropped below that cap. Past it, the store makes room once for
//! many inserts: first every bucket that has refilled (equivalent to an absent one: lossless),
//! then, if that freed less than a 64th of the cap, the buckets closest to full make up the
//! difference (a dropped bucket restarts full, so this is the only place the memory store can
//! over-admit, and only past `max_buckets` live keys). Making room takes the shards it does not
//! already hold with `try_lock` only, so it never waits for a lock and cannot deadlock with a
//! decision that holds several.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use super::region::{RegionOp, RegionReply};
use super::{Store, StoreDecision, StoreError};
use crate::base::clock::{Clock, MonotonicClock};
use crate::kinds::global::{self, Share};
use crate::kinds::reserve::{self, Settle, Settled};
use crate::kinds::twin::{self, Found, Keep, Stored};
use crate::kinds::{BucketOutcome, BucketRequest, Kind, Meter, ReportCharge, Reserved};

const SHARDS: usize = 64;

mod room;
mod shard;

use room::{drop_closest_to_full, drop_refilled};
use shard::{Entry, Shard};

/// One shard per cache line pair: adjacent shard locks would otherwise share a line, and two
/// workers on different shards would still contend on it (false sharing).
#[repr(align(128))]
struct PaddedShard(Mutex<Shard>);

pub struct MemoryStore<C: Clock = MonotonicClock> {
    shards: Box<[PaddedShard]>,
    hasher: RandomState,
    max_buckets: usize,
    /// Buckets held by all shards. Raised before a new bucket is inserted, lowered after
    /// buckets are dropped, each under the lock of a shard concerned.
    held: AtomicUsize,
    clock: C,
    /// Unix time (µs) when `clock` read 0: quotas count calendar periods in UTC. Buckets see
    /// only differences, which the shift leaves alone.
    epoch_us: u64,
    /// RLQS shares ([`super::rlqs`]).
    pools: super::rlqs::Pools,
    /// A region's demand and reporter lease ([`super::region`]).
    books: Box<super::region::Books>,
}

/// Shard locks held by the caller, with their shard index.
type Locked<'a> = [(usize, MutexGuard<'a, Shard>)];

impl MemoryStore<MonotonicClock> {
    pub fn new(max_buckets: usize) -> Self {
        let clock = MonotonicClock::default();
        let unix_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let mut store = MemoryStore::with_clock(max_buckets, clock);
        store.epoch_us = unix_us;
        store
    }
}

impl<C: Clock> MemoryStore<C> {
    pub fn with_clock(max_buckets: usize, clock: C) -> Self {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| PaddedShard(Mutex::new(Shard::default())))
                .collect(),
            hasher: RandomState::new(),
            max_buckets: max_buckets.max(1),
            held: AtomicUsize::new(0),
            clock,
            epoch_us: 0,
            pools: super::rlqs::Pools::default(),
            books: Box::default(),
        }
    }

    /// Now on this store's clock, as Unix µs (an injected clock is read as Unix time).
    fn now_us(&self) -> u64 {
        self.clock.now_us().saturating_add(self.epoch_us)
    }

    /// Buckets currently held.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).buckets.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard_of(&self, key: &str) -> usize {
        usize::try_from(self.hasher.hash_one(key) % SHARDS as u64).unwrap_or_default()
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // A panic while holding a shard cannot leave a bucket half-written (plain field
        // stores), so a poisoned lock is still safe to use.
        self.shards[shard]
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The decision itself, synchronous: a few hash lookups under shard locks. Each key's kind
    /// reads it before the decision and keeps what it must after.
    pub fn decide_sync(&self, requests: &[BucketRequest]) -> StoreDecision {
        let now = self.now_us();
        if let [request] = requests {
            if let Some(decided) = self.decide_one(request, now) {
                return decided;
            }
        }
        let shard_ids: Vec<usize> = requests.iter().map(|r| self.shard_of(&r.key)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.lock(i))).collect();
        let at = |shard: &usize| order.binary_search(shard).unwrap_or_default();
        let found: Vec<Found> = requests
            .iter()
            .zip(&shard_ids)
            .map(|(request, shard)| {
                let shard = &mut guards[at(shard)].1;
                let stored = shard.buckets.get(request.key.as_str()).map(|e| e.bucket);
                request
                    .meter
                    .find_in(request, stored, &mut shard.beside, now)
            })
            .collect();
        let mut states: Vec<Option<Stored>> = found.iter().map(|found| found.state).collect();
        let (allowed, mut outcomes) = twin::decide(requests, &mut states, now);
        let mut slices = Vec::new();
        for (index, (request, shard)) in requests.iter().zip(&shard_ids).enumerate() {
            let at = at(shard);
            let keep = Keep {
                request,
                index,
                allowed,
                found: found[index],
                state: &mut states[index],
                outcome: &mut outcomes[index],
                now_us: now,
            };
            let kept = request.meter.keep_in(keep, &mut guards[at].1.beside);
            slices.extend(kept.slice);
            if kept.key_went {
                self.held.fetch_sub(1, Ordering::Relaxed);
            }
            if kept.key_came && self.reserve_one() {
                self.make_room(&mut guards, now);
            }
            let (Some(bucket), Some(full_at_us)) = (states[index], kept.forget_at_us) else {
                continue;
            };
            let entry = Entry { bucket, full_at_us };
            if let Some(existing) = guards[at].1.buckets.get_mut(request.key.as_str()) {
                *existing = entry;
                continue;
            }
            if self.reserve_one() {
                self.make_room(&mut guards, now);
            }
            guards[at].1.buckets.insert(request.key.clone(), entry);
        }
        StoreDecision {
            allowed,
            buckets: outcomes,
            slices,
        }
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Gives back one lease; whether it was held (not released before, not expired).
    pub fn release_now(&self, key: &str, member: &str) -> bool {
        let now = self.now_us();
        let mut shard = self.lock(self.shard_of(key));
        let (held, key_went) = shard.beside.release_lease(key, member, now);
        if key_went {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        held
    }

    /// Settles one reservation, at most once, late too (`lua/settle.lua`).
    pub fn settle_now(&self, settle: &Settle) -> Settled {
        let now = self.now_us();
        let request = &settle.bucket;
        let Some(reservation) = request.meter.reserve() else {
            return Settled {
                held: false,
                outcome: self.peek_now(request),
            };
        };
        let index = self.shard_of(&request.key);
        let mut shard = self.lock(index);
        let stored = shard.buckets.get(request.key.as_str()).map(|e| e.bucket);
        let (state, settled) =
            reserve::settle_in(settle, reservation, stored, &mut shard.beside, now);
        self.write_one(index, shard, request, state, now);
        settled
    }

    /// Stores `state` (if any) as the key of `request` in shard `index`, held locked.
    fn write_one(
        &self,
        index: usize,
        mut shard: MutexGuard<'_, Shard>,
        request: &BucketRequest,
        state: Option<Stored>,
        now: u64,
    ) {
        let Some(bucket) = state else { return };
        let entry = Entry {
            bucket,
            full_at_us: request.meter.forget_at_us(&bucket, request.rate),
        };
        if let Some(existing) = shard.buckets.get_mut(request.key.as_str()) {
            *existing = entry;
            return;
        }
        if self.reserve_one() {
            let mut held = [(index, shard)];
            self.make_room(&mut held, now);
            [(_, shard)] = held;
        }
        shard.buckets.insert(request.key.clone(), entry);
    }

    /// What is held aside beside a key now: a reserving bucket's reservations, a borrowing
    /// bucket's live slices.
    pub fn reserved_now(&self, request: &BucketRequest) -> Reserved {
        let now = self.now_us();
        let shard = self.lock(self.shard_of(&request.key));
        request.meter.held_in(&request.key, &shard.beside, now)
    }

    /// Applies reports one key at a time (each under its shard's lock).
    pub fn report_now(&self, charges: &[ReportCharge]) -> Vec<BucketOutcome> {
        let now = self.now_us();
        charges
            .iter()
            .map(|charge| {
                let request = &charge.bucket;
                let index = self.shard_of(&request.key);
                let shard = self.lock(index);
                let mut state = shard.buckets.get(request.key.as_str()).map(|e| e.bucket);
                let outcome = request.meter.report(charge, &mut state, now);
                self.write_one(index, shard, request, state, now);
                outcome
            })
            .collect()
    }

    /// One key as the next decision would find it; nothing is written.
    pub fn peek_now(&self, request: &BucketRequest) -> BucketOutcome {
        let now = self.now_us();
        let shard = self.lock(self.shard_of(&request.key));
        let stored = shard.buckets.get(request.key.as_str()).map(|e| e.bucket);
        request.meter.peek_in(request, stored, &shard.beside, now)
    }

    /// Writes a global limit's share beside its key (`lua/global_share.lua`'s twin).
    pub fn put_share_now(
        &self,
        request: &BucketRequest,
        share: Share,
    ) -> Result<(f64, u64), StoreError> {
        let Meter::Global(global) = request.meter else {
            return Err(StoreError::Other("not a global limit's key".into()));
        };
        let now = self.now_us();
        let index = self.shard_of(&request.key);
        let mut shard = self.lock(index);
        let stored = shard.buckets.get(request.key.as_str()).map(|e| e.bucket);
        let (level, write) =
            global::put_share(global, request, stored, &mut shard.beside, share, now);
        if let Some((bucket, full_at_us)) = write {
            let entry = Entry { bucket, full_at_us };
            if let Some(existing) = shard.buckets.get_mut(request.key.as_str()) {
                *existing = entry;
            } else {
                if self.reserve_one() {
                    let mut held = [(index, shard)];
                    self.make_room(&mut held, now);
                    [(_, shard)] = held;
                }
                shard.buckets.insert(request.key.clone(), entry);
            }
        }
        Ok((level, now))
    }

    /// Drops one key (absent reads as full); whether it was held.
    pub fn reset_now(&self, key: &str) -> bool {
        let mut shard = self.lock(self.shard_of(key));
        shard.beside.forget_borrowed(key);
        let removed = shard.buckets.remove(key).is_some() || shard.beside.forget_leases(key);
        if removed {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// The common case of one limit whose key is its stored state alone: one lock, one
    /// lookup on a hit, and no allocation beyond the answer (the general path collects shard
    /// ids, guards and states into vectors). `None` when the key's kind keeps something
    /// beside it.
    fn decide_one(&self, request: &BucketRequest, now: u64) -> Option<StoreDecision> {
        let meter = &request.meter;
        let entry_of = |bucket: Stored| Entry {
            bucket,
            full_at_us: meter.forget_at_us(&bucket, request.rate),
        };
        let requests = std::slice::from_ref(request);
        let index = self.shard_of(&request.key);
        let mut shard = self.lock(index);
        if !meter.alone(&request.key, &shard.beside) {
            return None;
        }
        if let Some(existing) = shard.buckets.get_mut(request.key.as_str()) {
            let mut states = [Some(existing.bucket)];
            let (allowed, buckets) = twin::decide(requests, &mut states, now);
            if let [Some(bucket)] = states {
                *existing = entry_of(bucket);
            }
            return Some(StoreDecision {
                allowed,
                buckets,
                slices: Vec::new(),
            });
        }
        let mut states = [None];
        let (allowed, buckets) = twin::decide(requests, &mut states, now);
        if let [Some(bucket)] = states {
            if self.reserve_one() {
                let mut held = [(index, shard)];
                self.make_room(&mut held, now);
                [(_, shard)] = held;
            }
            shard.buckets.insert(request.key.clone(), entry_of(bucket));
        }
        Some(StoreDecision {
            allowed,
            buckets,
            slices: Vec::new(),
        })
    }

    /// Counts a bucket about to be inserted; true when that takes the store past its cap.
    fn reserve_one(&self) -> bool {
        self.held.fetch_add(1, Ordering::Relaxed) >= self.max_buckets
    }

    /// Brings the store back under its cap, and a 64th of it below, so the next inserts need
    /// no sweep: refilled buckets first, then those closest to full. `held` are the shard locks
    /// the caller owns; the other shards are taken only if free (a busy one is skipped, and
    /// the store may stay over its cap by a few buckets until the next sweep).
    fn make_room(&self, held: &mut Locked<'_>, now_us: u64) {
        let excess = self
            .held
            .load(Ordering::Relaxed)
            .saturating_sub(self.max_buckets);
        if excess == 0 {
            return;
        }
        let mut others: Vec<MutexGuard<'_, Shard>> = (0..SHARDS)
            .filter(|i| held.iter().all(|(h, _)| h != i))
            .filter_map(|i| self.try_lock(i))
            .collect();
        let mut shards: Vec<&mut Shard> = held
            .iter_mut()
            .map(|(_, guard)| &mut **guard)
            .chain(others.iter_mut().map(|guard| &mut **guard))
            .collect();
        let wanted = excess.max(self.max_buckets / SHARDS).max(1);
        let mut freed = drop_refilled(&mut shards, now_us);
        if freed < wanted {
            freed += drop_closest_to_full(&mut shards, wanted - freed);
            log::debug!(
                "memory store at its cap of {}: dropped the buckets closest to full",
                self.max_buckets
            );
        }
        self.held.fetch_sub(freed, Ordering::Relaxed);
    }

    fn try_lock(&self, shard: usize) -> Option<MutexGuard<'_, Shard>> {
        match self.shards[shard].0.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    async fn decide(&self, buckets: &[BucketRequest]) -> Result<StoreDecision, StoreError> {
        Ok(self.decide_sync(buckets))
    }

    async fn share(
        &self,
        requests: &[super::rlqs::ShareRequest],
        _deadline: std::time::Instant,
    ) -> Vec<Result<super::rlqs::Grant, StoreError>> {
        let grants = self.pools.share(requests, self.now_us());
        grants.into_iter().map(Ok).collect()
    }

    async fn shares_of(
        &self,
        key: &str,
    ) -> Result<(u64, Vec<(String, super::rlqs::Holding)>), StoreError> {
        let now = self.now_us();
        Ok((now, self.pools.holders(key, now)))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn report(&self, charges: &[ReportCharge]) -> Result<Vec<BucketOutcome>, StoreError> {
        Ok(self.report_now(charges))
    }

    async fn peek(&self, bucket: &BucketRequest) -> Result<BucketOutcome, StoreError> {
        Ok(self.peek_now(bucket))
    }

    async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.reset_now(key))
    }

    async fn release(&self, key: &str, member: &str) -> Result<bool, StoreError> {
        Ok(self.release_now(key, member))
    }

    async fn settle(&self, settle: &Settle) -> Result<Settled, StoreError> {
        Ok(self.settle_now(settle))
    }

    async fn reserved(&self, bucket: &BucketRequest) -> Result<Reserved, StoreError> {
        Ok(self.reserved_now(bucket))
    }

    async fn put_share(
        &self,
        bucket: &BucketRequest,
        share: Share,
    ) -> Result<(f64, u64), StoreError> {
        self.put_share_now(bucket, share)
    }

    async fn region(&self, op: RegionOp) -> Result<RegionReply, StoreError> {
        let now_us = self.now_us();
        if let RegionOp::Share { key } = &op {
            let shard = self.lock(self.shard_of(key));
            return Ok(RegionReply::Share {
                now_us,
                share: shard.beside.share_of(key),
            });
        }
        Ok(self.books.apply(op, now_us))
    }
}

#[cfg(test)]
mod tests;
