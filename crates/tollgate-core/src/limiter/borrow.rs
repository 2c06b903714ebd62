//! Borrowed tokens, the instance's side (`docs/DESIGN.md`, "Borrowed tokens"): the slices
//! of hot keys this instance took from the store, and the requests it admits from them
//! without calling the store.
//!
//! Exactness rests on these choices:
//! - a slice's tokens were charged to the bucket (and held there, not refilling) before any
//!   is used, so every admission from a slice was paid for;
//! - a slice is used only until `sent + (deadline - now) / 2` on the local monotonic clock
//!   (`sent`: when the call that took it was sent, no later than when the store decided;
//!   `now`, `deadline`: the store's clock), padded by the deny cache's [`DRIFT`] and
//!   [`MARGIN_US`], so never past its group's end, when the store counts it used;
//! - a slice is used only for the rate and burst it was taken under;
//! - a request is served locally only when every one of its buckets can be (all-or-nothing,
//!   as the store decides); a slice given back is emptied here before the call is sent, and
//!   what it says was unused is never used afterwards.
//!
//! The slice a key asks for follows its local demand: the requests this instance saw for
//! it in the last horizon, or in this one so far if more, or this one's pace so far (the
//! requests after its first, over the time since, counted as at least a tenth of the horizon)
//! if more still, so that a fresh instance learns a key's demand from its first few requests
//! rather than from a whole horizon of them (a key with fewer than [`MIN_DEMAND`] asks for
//! nothing: cold keys never borrow); at most half its burst, and at most what it refills over
//! the horizon or a 64th of its burst, whichever is more; the store grants at most half of
//! what is left. A key too slow for the horizon may borrow for a
//! longer one: the horizons are rungs ten times apart, up to the longest configured, and a key
//! borrows on the shortest rung over which it saw [`MIN_DEMAND`] requests (a slow key's slice
//! lasts as long as it takes the key to use it).
//!
//! Memory is bounded: sharded maps with a cap each; an entry with no slice and no recent
//! demand is dropped to make room, and a full shard with no such entry stops borrowing for
//! new keys. One lock per shard, never two at once.
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::base::clock::{Clock, MonotonicClock};
use crate::base::rate::count_f64;
use crate::kinds::borrow::{Borrow, GiveBack};
use crate::kinds::{BucketRequest, Slice};
use crate::limiter::deny_cache::{DRIFT, MARGIN_US};

const SHARDS: usize = 32;
/// The fewest requests of a key in a horizon for this instance to borrow: a smaller slice
/// saves fewer store calls than holding it costs the store (measured:
/// docs/benchmarks/borrowing.md).
pub const MIN_DEMAND: u64 = 8;
/// Most horizons a lender borrows on (the configured one and longer rungs).
const MAX_RUNGS: usize = 4;
/// How much longer each rung's horizon is than the one before.
const RUNG_STEP: u64 = 10;

/// A slice this instance holds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Held {
    /// Which slice of its key this is (a put-back goes to the slice it came from only).
    id: u64,
    /// Its group's end, on the store's clock, and the groups' incarnation (both named when it
    /// is given back).
    deadline_us: u64,
    incarnation: u64,
    taken: u64,
    left: u64,
    /// Used until then, on the local clock.
    until_us: u64,
    rate: f64,
    burst: f64,
}

/// A key's requests over one rung's horizon: in the current window (from `start_us`) and
/// the last one.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    seen: u64,
    seen_before: u64,
    start_us: u64,
}

impl Window {
    fn count(&mut self, now_us: u64, grid_us: u64) {
        let age = now_us.saturating_sub(self.start_us);
        if age >= grid_us {
            self.seen_before = if age < 2 * grid_us { self.seen } else { 0 };
            self.seen = 0;
            self.start_us = now_us;
        }
        self.seen += 1;
    }

    /// The demand over a horizon: the last whole one's, or this one's at its pace so far
    /// (the gaps between its requests, over at least a tenth of the horizon).
    fn demand(&self, now_us: u64, grid_us: u64) -> u64 {
        let age = now_us
            .saturating_sub(self.start_us)
            .max(grid_us / RUNG_STEP)
            .max(1);
        let pace = u128::from(self.seen.saturating_sub(1)) * u128::from(grid_us) / u128::from(age);
        let pace = u64::try_from(pace).unwrap_or(u64::MAX);
        self.seen.max(self.seen_before).max(pace)
    }
}

/// What this instance knows of one key.
#[derive(Debug, Clone, Copy, Default)]
struct Holding {
    slice: Option<Held>,
    /// Requests seen over each rung's horizon (the lender's `grids`).
    windows: [Window; MAX_RUNGS],
    /// A call asking for a slice is in flight since then (others ask for none meanwhile).
    asking_since_us: Option<u64>,
}

impl Holding {
    fn count(&mut self, now_us: u64, grids: &[u64]) {
        for (window, &grid_us) in self.windows.iter_mut().zip(grids) {
            window.count(now_us, grid_us);
        }
    }

    /// Nothing worth keeping: no slice, no demand in the last two (shortest) horizons,
    /// nothing asked. A full shard drops such entries first, slow keys' counts with them.
    fn idle(&self, now_us: u64, grid_us: u64) -> bool {
        self.slice.is_none()
            && self.asking_since_us.is_none()
            && now_us.saturating_sub(self.windows[0].start_us) >= 2 * grid_us
    }
}

type Map = HashMap<String, Holding>;

/// One shard: its keys, and when their slices fall quiet (the give-backs no request made).
#[derive(Default)]
struct Shard {
    keys: Map,
    due: quiet::Due,
}

/// The borrowed tokens of one instance.
pub struct Lender {
    shards: Box<[Mutex<Shard>]>,
    hasher: std::hash::RandomState,
    shard_cap: usize,
    /// The rungs' horizons, shortest first: `grids[..rungs]`.
    grids: [u64; MAX_RUNGS],
    rungs: usize,
    min_demand: u64,
    clock: Arc<dyn Clock>,
    /// Slices installed so far, every key's: the id of the next. One count for the lender,
    /// not one per key, so a key's entry dropped (reset, evicted) and made again never hands
    /// a new slice an id a put-back of an older one still carries.
    installed: AtomicU64,
}

/// What [`Lender::plan`] decided for one request.
pub enum Plan<'l> {
    /// Admitted from slices: each bucket's tokens left in its slice, in request order.
    Local(Vec<f64>),
    /// Ask the store, then hand its answer to the ask.
    Store(Asking<'l>),
}

/// A store call on its way that may take slices: its requests (borrowing ones carry their
/// give-back and want). [`Asking::learn`] installs the slices the store's answer took;
/// dropped without it (the store failed, or the check was cancelled), it abandons the ask, so
/// other calls for its keys may ask again. The lender's protocol closed in a type, as the deny
/// cache's probe: a caller cannot learn twice, or forget to abandon.
#[must_use = "hand the store's answer to `learn`; dropping abandons the ask"]
pub struct Asking<'l> {
    lender: &'l Lender,
    buckets: Vec<BucketRequest>,
    /// When the call was planned, on the lender's clock.
    sent_us: u64,
    open: bool,
}

impl Asking<'_> {
    /// The requests to send the store.
    pub fn buckets(&self) -> &[BucketRequest] {
        &self.buckets
    }

    /// The store's answer: installs the slices it took. Returns the tokens borrowed.
    pub fn learn(mut self, slices: &[Slice]) -> u64 {
        self.open = false;
        self.lender.learn(&self.buckets, slices, self.sent_us)
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if self.open {
            self.lender.abandon(&self.buckets);
        }
    }
}

/// Tokens a plan or an answer moved, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    pub borrowed: u64,
    pub returned: u64,
}

impl Lender {
    /// Slices of at most about `capacity` keys, on a horizon of `horizon_us` (only: see
    /// [`Lender::with_longest_horizon`]).
    pub fn new(capacity: usize, horizon_us: u64) -> Lender {
        Lender::with_clock(capacity, horizon_us, Arc::new(MonotonicClock::default()))
    }

    /// [`Lender::new`] reading `clock` (tests advance a manual one).
    pub fn with_clock(capacity: usize, horizon_us: u64, clock: Arc<dyn Clock>) -> Lender {
        Lender {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: std::hash::RandomState::new(),
            shard_cap: capacity.div_ceil(SHARDS).max(1),
            grids: [horizon_us.max(1_000); MAX_RUNGS],
            rungs: 1,
            min_demand: MIN_DEMAND,
            clock,
            installed: AtomicU64::new(0),
        }
    }

    /// Borrows for keys that saw at least `requests` in a horizon (at least 2), instead of
    /// [`MIN_DEMAND`] (tests exercise slices with fewer requests).
    pub fn with_min_demand(mut self, requests: u64) -> Lender {
        self.min_demand = requests.max(2);
        self
    }

    /// Lets keys too slow for the horizon borrow for longer: rungs ten times longer each, the
    /// last at most `longest_us` (the longest is a rung of its own when the steps miss it).
    pub fn with_longest_horizon(mut self, longest_us: u64) -> Lender {
        let mut rungs = 1;
        while rungs < MAX_RUNGS && self.grids[rungs - 1] < longest_us {
            self.grids[rungs] = self.grids[rungs - 1]
                .saturating_mul(RUNG_STEP)
                .min(longest_us);
            rungs += 1;
        }
        self.rungs = rungs;
        self
    }

    pub fn horizon_us(&self) -> u64 {
        self.grids[0]
    }

    fn grids(&self) -> &[u64] {
        &self.grids[..self.rungs]
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let index = usize::try_from(self.hasher.hash_one(key) % SHARDS as u64).unwrap_or(0);
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Serves the request from slices when every bucket can be (`lends[i]`: bucket i's
    /// limit borrows), else builds the store call: each borrowing bucket gives back its
    /// slice and asks for a new one. Also counts each borrowing key's demand.
    pub fn plan(&self, buckets: &[BucketRequest], lends: &[bool]) -> (Plan<'_>, Moved) {
        if let Some(left) = self.serve_all(buckets, lends) {
            return (Plan::Local(left), Moved::default());
        }
        let (asking, moved) = self.ask_store(buckets, lends);
        (Plan::Store(asking), moved)
    }

    /// The request admitted from slices, if every bucket's limit borrows and its slice can
    /// pay: each bucket's tokens left in its slice.
    pub fn serve_all(&self, buckets: &[BucketRequest], lends: &[bool]) -> Option<Vec<f64>> {
        if !buckets
            .iter()
            .zip(lends)
            .all(|(b, &lend)| lend && b.cost > 0)
        {
            return None;
        }
        self.serve(buckets, self.clock.now_us())
    }

    /// The store call for a request not served from slices: each borrowing bucket gives back
    /// its slice and asks for a new one.
    pub fn ask_store(&self, buckets: &[BucketRequest], lends: &[bool]) -> (Asking<'_>, Moved) {
        let now = self.clock.now_us();
        let mut moved = Moved::default();
        let mut asked = Vec::with_capacity(buckets.len());
        for (bucket, &lend) in buckets.iter().zip(lends) {
            let mut bucket = bucket.clone();
            if lend && bucket.meter.lends() {
                let (borrow, returned) = self.ask(&bucket, now);
                moved.returned += returned;
                // Nothing to give back or ask for: a plain check (the store still reads the
                // tokens others hold of this bucket).
                if borrow.want > 0 || borrow.give.is_some() {
                    bucket = bucket.borrowing(borrow);
                }
            }
            asked.push(bucket);
        }
        let asking = Asking {
            lender: self,
            buckets: asked,
            sent_us: now,
            open: true,
        };
        (asking, moved)
    }

    /// Takes one request's cost from each bucket's slice, all or none.
    fn serve(&self, buckets: &[BucketRequest], now: u64) -> Option<Vec<f64>> {
        let mut left = Vec::with_capacity(buckets.len());
        // The slice each bucket paid from, to put back to that slice only.
        let mut paid = Vec::with_capacity(buckets.len());
        for (i, bucket) in buckets.iter().enumerate() {
            let mut shard = self.shard(&bucket.key);
            let took = shard.keys.get_mut(bucket.key.as_str()).and_then(|holding| {
                let held = holding.slice.as_mut()?;
                let usable = held.until_us > now
                    && held.left >= bucket.cost
                    && held.rate.to_bits() == bucket.rate.to_bits()
                    && held.burst.to_bits() == bucket.burst.to_bits();
                if !usable {
                    return None;
                }
                held.left -= bucket.cost;
                let taken = (held.left, held.id);
                holding.count(now, self.grids());
                Some(taken)
            });
            drop(shard);
            match took {
                Some((tokens, id)) => {
                    left.push(count_f64(tokens));
                    paid.push(id);
                }
                None => {
                    // Put back what the buckets before this one took. A slice replaced since
                    // (given back with that token counted as used) gets nothing.
                    for (earlier, &id) in buckets[..i].iter().zip(&paid) {
                        self.put_back(earlier, id);
                    }
                    return None;
                }
            }
        }
        Some(left)
    }

    fn put_back(&self, bucket: &BucketRequest, id: u64) {
        let mut shard = self.shard(&bucket.key);
        if let Some(held) = shard
            .keys
            .get_mut(bucket.key.as_str())
            .and_then(|h| h.slice.as_mut())
            .filter(|held| held.id == id)
        {
            held.left = (held.left + bucket.cost).min(held.taken);
        }
    }

    /// The borrow part of a store call for `bucket`: its slice given back (emptied here), and
    /// what to ask for. Returns the tokens given back unused too.
    fn ask(&self, bucket: &BucketRequest, now: u64) -> (Borrow, u64) {
        let mut shard = self.shard(&bucket.key);
        if !shard.keys.contains_key(bucket.key.as_str()) && !self.make_room(&mut shard.keys, now) {
            let plain = Borrow {
                grid_us: self.grids[0],
                want: 0,
                give: None,
            };
            return (plain, 0);
        }
        let holding = shard.keys.entry(bucket.key.clone()).or_default();
        holding.count(now, self.grids());
        let give = holding.slice.take().map(|held| GiveBack {
            deadline_us: held.deadline_us,
            taken: held.taken,
            unused: held.left,
            incarnation: held.incarnation,
        });
        let asking = holding
            .asking_since_us
            .is_some_and(|since| now.saturating_sub(since) < self.grids[0]);
        // The shortest rung over which the key saw enough requests, and that demand.
        let rung = holding
            .windows
            .iter()
            .zip(self.grids())
            .map(|(window, &grid_us)| (window.demand(now, grid_us), grid_us))
            .find(|&(demand, _)| demand >= self.min_demand);
        let (want, grid_us) = match rung {
            Some((demand, grid_us)) if !asking => {
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "a burst is at most 10^9"
                )]
                let half = (bucket.burst / 2.0).floor() as u64;
                // At most what the bucket refills over the slice's horizon, or a 64th of its
                // burst if more: a slice held unused while other instances deny costs them at
                // most that, so a slow limit with a small burst (a few per minute) never
                // borrows, and a key that spends a large burst faster than its rate is not
                // held to one horizon's refill per store call.
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss,
                    reason = "a rate times a horizon in s, clamped at 0 by the cast"
                )]
                let refill = (bucket.rate * grid_us as f64 / 1e6).floor() as u64;
                (demand.min(half).min(refill.max(half / 32)), grid_us)
            }
            _ => (0, self.grids[0]),
        };
        if want > 0 {
            holding.asking_since_us = Some(now);
        }
        let returned = give.map_or(0, |g| g.unused);
        let borrow = Borrow {
            grid_us,
            want,
            give,
        };
        (borrow, returned)
    }

    /// Drops idle entries of a full shard; whether there is room for one more.
    fn make_room(&self, shard: &mut Map, now: u64) -> bool {
        if shard.len() < self.shard_cap {
            return true;
        }
        shard.retain(|_, holding| !holding.idle(now, self.grids[0]));
        shard.len() < self.shard_cap
    }

    /// The store's answer to a call planned at `sent_us`: installs the slices it took.
    /// Returns the tokens borrowed.
    fn learn(&self, buckets: &[BucketRequest], slices: &[Slice], sent_us: u64) -> u64 {
        let mut borrowed = 0;
        for bucket in buckets {
            if bucket.meter.borrow().is_none_or(|b| b.want == 0) {
                continue;
            }
            let mut shard = self.shard(&bucket.key);
            let Some(holding) = shard.keys.get_mut(bucket.key.as_str()) else {
                continue;
            };
            holding.asking_since_us = None;
        }
        for slice in slices {
            let Some(bucket) = buckets.get(slice.bucket) else {
                continue;
            };
            let mut shard = self.shard(&bucket.key);
            let Some(holding) = shard.keys.get_mut(bucket.key.as_str()) else {
                continue;
            };
            borrowed += slice.tokens;
            let id = self.installed.fetch_add(1, Ordering::Relaxed) + 1;
            let until_us = sent_us + usable_for_us(slice);
            // A slice still here was installed by a concurrent call: it is dropped (its
            // tokens count as used at its deadline), never merged.
            holding.slice = Some(Held {
                id,
                deadline_us: slice.deadline_us,
                incarnation: slice.incarnation,
                taken: slice.tokens,
                left: slice.tokens,
                until_us,
                rate: bucket.rate,
                burst: bucket.burst,
            });
            shard.due.push(slice, sent_us, id, bucket);
        }
        borrowed
    }

    /// The store call planned for `buckets` failed: no slice came; others may ask again.
    fn abandon(&self, buckets: &[BucketRequest]) {
        for bucket in buckets {
            if bucket.meter.borrow().is_some() {
                if let Some(holding) = self.shard(&bucket.key).keys.get_mut(bucket.key.as_str()) {
                    holding.asking_since_us = None;
                }
            }
        }
    }

    /// Forgets the slices of one key, whose bucket was just reset.
    pub fn forget(&self, key: &str) {
        self.shard(key).keys.remove(key);
    }

    /// Forgets every slice (a reload; resets may have gone unheard). Their tokens count as
    /// used when their groups end.
    pub fn forget_all(&self) {
        for shard in &self.shards {
            shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .keys
                .clear();
        }
    }

    /// Tokens held now, unused, in live slices of `key` (peek).
    pub fn held(&self, key: &str) -> u64 {
        let now = self.clock.now_us();
        self.shard(key)
            .keys
            .get(key)
            .and_then(|h| h.slice)
            .filter(|held| held.until_us > now)
            .map_or(0, |held| held.left)
    }
}

/// How long, on the local clock, a slice may be used: half the time to its deadline on the
/// store's clock, less the drift and margin the deny cache allows for.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "a horizon in µs, far below 2^53; the result is clamped at 0"
)]
fn usable_for_us(slice: &Slice) -> u64 {
    let half = slice.deadline_us.saturating_sub(slice.now_us) / 2;
    (half as f64 * (1.0 - DRIFT) - MARGIN_US).max(0.0) as u64
}

mod quiet;
#[cfg(test)]
mod tests;
