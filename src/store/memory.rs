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

use super::bucket::{self, Bucket};
use super::held;
use super::{
    BucketOutcome, BucketRequest, Meter, ReportCharge, Reserved, Settle, Settled, Store,
    StoreDecision, StoreError,
};

const SHARDS: usize = 64;

pub use crate::base::clock::{Clock, ManualClock, MonotonicClock};

mod room;
mod shard;

use room::{drop_closest_to_full, drop_refilled};
use shard::{borrowed_now, expired_estimates, lend, Entry, Lent, Reservation, Shard};

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
    /// RLQS shares ([`super::shares`]).
    pools: super::shares::Pools,
}

/// Shard locks held by the caller, with their shard index.
type Held<'a> = [(usize, MutexGuard<'a, Shard>)];

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
            pools: super::shares::Pools::default(),
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

    /// The decision itself, synchronous: a few hash lookups under shard locks.
    pub fn decide_sync(&self, requests: &[BucketRequest]) -> StoreDecision {
        let now = self.now_us();
        if let [request] = requests {
            if !matches!(
                request.meter,
                Meter::Concurrency(_) | Meter::Reserve(_) | Meter::Borrow(_)
            ) {
                if let Some(decided) = self.decide_one(request, now) {
                    return decided;
                }
            }
        }
        let shard_ids: Vec<usize> = requests.iter().map(|r| self.shard_of(&r.key)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.lock(i))).collect();
        // Borrowing buckets: their groups, whether reading them changed anything (a group
        // ended, a slice given back), and the state as stored (kept when nothing changed).
        let mut lent: Vec<Option<Lent>> = vec![None; requests.len()];
        let mut states: Vec<Option<Bucket>> = requests
            .iter()
            .zip(&shard_ids)
            .enumerate()
            .map(|(index, (request, shard))| {
                let guard = &mut guards[order.binary_search(shard).unwrap_or_default()].1;
                let stored =
                    |guard: &Shard| guard.buckets.get(request.key.as_str()).map(|e| e.bucket);
                match request.meter {
                    Meter::Concurrency(_) => Some(Bucket {
                        debt: guard.held_leases(&request.key, now) as u64,
                        ts_us: now,
                    }),
                    // Expired reservations go first, their estimates given back under
                    // `refund`, as the script does before it decides.
                    Meter::Reserve(reserve) => {
                        let back = guard.sweep(&request.key, now, |_| reserve.refund);
                        let mut state = stored(guard);
                        bucket::give_back(&mut state, back, now, request.rate);
                        state
                    }
                    Meter::Borrow(_) | Meter::Bucket
                        if matches!(request.meter, Meter::Borrow(_))
                            || guard.borrowed.contains_key(request.key.as_str()) =>
                    {
                        let give = match request.meter {
                            Meter::Borrow(borrow) => borrow.give,
                            _ => None,
                        };
                        let found = stored(guard);
                        let mut groups = guard
                            .borrowed
                            .get(request.key.as_str())
                            .copied()
                            .unwrap_or_default();
                        let (mut debt, ended) = groups.settle(found, now, request.rate);
                        let gave = give.is_some_and(|give| groups.give_back(&mut debt, give));
                        lent[index] = Some(Lent {
                            groups,
                            changed: ended || gave,
                            found,
                        });
                        Some(Bucket { debt, ts_us: now })
                    }
                    _ => stored(guard),
                }
            })
            .collect();
        let (allowed, mut outcomes) = bucket::decide(requests, &mut states, now);
        let slices = lend(
            requests,
            &mut states,
            &mut outcomes,
            &mut lent,
            allowed,
            now,
        );

        for ((((request, shard), state), outcome), lent) in requests
            .iter()
            .zip(&shard_ids)
            .zip(states)
            .zip(&outcomes)
            .zip(lent)
        {
            let at = order.binary_search(shard).unwrap_or_default();
            if let Some(lent) = lent {
                let shard = &mut guards[at].1;
                if lent.groups.is_empty() {
                    shard.borrowed.remove(request.key.as_str());
                } else {
                    shard.borrowed.insert(request.key.clone(), lent.groups);
                }
            }
            if let Meter::Concurrency(lease) = request.meter {
                self.write_lease(
                    &mut guards,
                    at,
                    request,
                    lease,
                    allowed && outcome.enough,
                    now,
                );
                continue;
            }
            if let Meter::Reserve(reserve) = request.meter {
                if allowed && outcome.enough && request.cost > 0 {
                    guards[at]
                        .1
                        .reservations
                        .entry(request.key.clone())
                        .or_default()
                        .push(Reservation {
                            id: reserve.id,
                            estimate: request.cost,
                            until: now.saturating_add(reserve.ttl_ms.saturating_mul(1000)),
                            refund: reserve.refund,
                        });
                }
            }
            let Some(bucket) = state else { continue };
            let full_at_us = match lent {
                Some(lent) => held::forget_at_us(bucket.debt, now, &lent.groups, request.rate),
                None => bucket.forget_at_us(request),
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
    /// Drops the expired leases of a concurrency key and, when `taken`, adds the one just
    /// taken; the key counts against `max_buckets` while it holds a lease.
    fn write_lease(
        &self,
        guards: &mut Held<'_>,
        at: usize,
        request: &BucketRequest,
        lease: super::Lease,
        taken: bool,
        now: u64,
    ) {
        let shard = &mut guards[at].1;
        if shard.prune_leases(&request.key, now) {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        if !taken {
            return;
        }
        let until = now.saturating_add(lease.ttl_ms.saturating_mul(1000));
        if let Some(set) = shard.leases.get_mut(request.key.as_str()) {
            set.push((lease.id, until));
            return;
        }
        if self.reserve_one() {
            self.make_room(guards, now);
        }
        guards[at]
            .1
            .leases
            .insert(request.key.clone(), vec![(lease.id, until)]);
    }

    /// Gives back one lease; whether it was held (not released before, not expired).
    pub fn release_now(&self, key: &str, member: &str) -> bool {
        let now = self.now_us();
        let Ok(id) = u128::from_str_radix(member, 16) else {
            return false;
        };
        let mut shard = self.lock(self.shard_of(key));
        let held = shard.leases.get_mut(key).is_some_and(|set| {
            let before = set.len();
            set.retain(|(lease, until)| !(*lease == id && *until > now));
            set.len() < before
        });
        if shard.prune_leases(key, now) {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        held
    }

    /// Settles one reservation, at most once, late too (`lua/settle.lua`).
    pub fn settle_now(&self, settle: &Settle) -> Settled {
        let now = self.now_us();
        let request = &settle.bucket;
        let Meter::Reserve(reserve) = request.meter else {
            return Settled {
                held: false,
                outcome: self.peek_now(request),
            };
        };
        let index = self.shard_of(&request.key);
        let mut shard = self.lock(index);
        let back = shard.sweep(&request.key, now, |_| reserve.refund);
        let held = shard.drop_reservations(&request.key, |r| {
            r.id == reserve.id && r.estimate == settle.estimate
        });
        let late = if held {
            None
        } else {
            shard.take_late(&request.key, reserve.id, settle.estimate, now)
        };
        let mut state = shard.buckets.get(request.key.as_str()).map(|e| e.bucket);
        bucket::give_back(&mut state, back, now, request.rate);
        let outcome = if late == Some(true) {
            // Its estimate was given back at expiry (whatever this settle's mode): the whole
            // actual cost is charged.
            let unreserved = Settle {
                estimate: 0,
                ..settle.clone()
            };
            bucket::settle(&unreserved, true, &mut state, now)
        } else {
            bucket::settle(settle, held || late.is_some(), &mut state, now)
        };
        self.write_one(index, shard, request, state, now);
        Settled {
            held: held || late.is_some(),
            outcome,
        }
    }

    /// Stores `state` (if any) as the bucket of `request` in shard `index`, held locked.
    fn write_one(
        &self,
        index: usize,
        mut shard: MutexGuard<'_, Shard>,
        request: &BucketRequest,
        state: Option<Bucket>,
        now: u64,
    ) {
        let Some(bucket) = state else { return };
        let entry = Entry {
            bucket,
            full_at_us: bucket.forget_at_us(request),
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

    /// The reservations held now beside a reserving bucket.
    pub fn reserved_now(&self, request: &BucketRequest) -> Reserved {
        let now = self.now_us();
        let shard = self.lock(self.shard_of(&request.key));
        if let Meter::Borrow(_) = request.meter {
            return borrowed_now(shard.borrowed.get(request.key.as_str()), now);
        }
        shard
            .reservations
            .get(request.key.as_str())
            .map_or_else(Reserved::default, |set| {
                let live = set.iter().filter(|r| r.until > now);
                Reserved {
                    tokens: live.clone().map(|r| r.estimate).sum(),
                    held: live.count() as u64,
                }
            })
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
                let outcome = bucket::report(charge, &mut state, now);
                self.write_one(index, shard, request, state, now);
                outcome
            })
            .collect()
    }

    /// One key as the next decision would find it; nothing is written.
    pub fn peek_now(&self, request: &BucketRequest) -> BucketOutcome {
        let now = self.now_us();
        let shard = self.lock(self.shard_of(&request.key));
        let mut stored = match request.meter {
            Meter::Concurrency(_) => Some(Bucket {
                debt: shard.held_leases(&request.key, now) as u64,
                ts_us: now,
            }),
            _ => shard.buckets.get(request.key.as_str()).map(|e| e.bucket),
        };
        // A borrowing bucket: its held tokens do not refill, and ended groups count as used.
        if matches!(request.meter, Meter::Borrow(_) | Meter::Bucket) {
            let mut groups = shard
                .borrowed
                .get(request.key.as_str())
                .copied()
                .unwrap_or_default();
            let (debt, _) = groups.settle(stored, now, request.rate);
            stored = Some(Bucket { debt, ts_us: now });
        }
        // As the next check finds it: expired reservations given back under `refund`.
        if let (Meter::Reserve(reserve), Some(held)) =
            (request.meter, shard.reservations.get(request.key.as_str()))
        {
            if reserve.refund {
                let back = expired_estimates(held, now);
                bucket::give_back(&mut stored, back, now, request.rate);
            }
        }
        bucket::peek(request, stored, now)
    }

    /// Drops one key (absent reads as full); whether it was held.
    pub fn reset_now(&self, key: &str) -> bool {
        let mut shard = self.lock(self.shard_of(key));
        shard.borrowed.remove(key);
        let removed = shard.buckets.remove(key).is_some() || shard.leases.remove(key).is_some();
        if removed {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// The common case of one limit: one lock, one lookup on a hit, and no allocation beyond
    /// the answer (the general path collects shard ids, guards and states into vectors).
    fn decide_one(&self, request: &BucketRequest, now: u64) -> Option<StoreDecision> {
        let entry_of = |bucket: Bucket| Entry {
            bucket,
            full_at_us: bucket.forget_at_us(request),
        };
        let requests = std::slice::from_ref(request);
        let index = self.shard_of(&request.key);
        let mut shard = self.lock(index);
        if shard.borrowed.contains_key(request.key.as_str()) {
            // Tokens of this bucket are held: the general path reads them.
            return None;
        }
        if let Some(existing) = shard.buckets.get_mut(request.key.as_str()) {
            let mut states = [Some(existing.bucket)];
            let (allowed, buckets) = bucket::decide(requests, &mut states, now);
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
        let (allowed, buckets) = bucket::decide(requests, &mut states, now);
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
    fn make_room(&self, held: &mut Held<'_>, now_us: u64) {
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
        requests: &[super::shares::ShareRequest],
        _deadline: std::time::Instant,
    ) -> Vec<Result<super::shares::Grant, StoreError>> {
        let grants = self.pools.share(requests, self.now_us());
        grants.into_iter().map(Ok).collect()
    }

    async fn shares_of(
        &self,
        key: &str,
    ) -> Result<(u64, Vec<(String, super::shares::Holding)>), StoreError> {
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
}

#[cfg(test)]
mod tests;
