//! One store harness: a scenario written once against [`StoreUnderTest`] runs on the memory
//! store (on a manual clock) and on a real `redis-server` running the Lua scripts (or
//! `valkey-server` with `STORE_UNDER_TEST=valkey`), so the scripts and their Rust twins cannot
//! drift apart. [`every_store!`] makes one test per store from a scenario function.
//!
//! Redis takes its time from `TIME`, which tests cannot set. Instead of sleeping, "advancing
//! the clock by d" ([`StoreUnderTest::advance`]) shifts the stored buckets back by d (their
//! `ts` and their held groups' deadlines), which is the same thing to the script. Real time
//! still passes between steps (milliseconds), so Redis results are compared within
//! [`StoreUnderTest::tolerance`] and rates stay low.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::base::clock::{Clock, ManualClock};
use tollgate_core::kinds::global::Share;
use tollgate_core::kinds::reserve::{Settle, Settled};
use tollgate_core::kinds::{BucketOutcome, BucketRequest, Reserved, Slice};
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::redis::{RedisStore, Topology};
use tollgate_core::store::{Store, StoreDecision};

use super::{redis_store, RedisServer};

/// Runs `$scenario(&dyn StoreUnderTest)` as one test per store: `<scenario>::in_memory` and
/// `<scenario>::on_redis` (Valkey under `STORE_UNDER_TEST=valkey`). Anchor: limitador's
/// `test_with_all_storage_impls!`.
// The e2e binary shares this harness but runs no store scenarios.
#[allow(unused_macros)]
macro_rules! every_store {
    ($($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            #[test]
            fn in_memory() {
                super::$scenario(&$crate::support::stores::Memory::new());
            }

            #[test]
            fn on_redis() {
                super::$scenario(&$crate::support::stores::Redis::start());
            }
        }
    )+};
}
#[allow(unused_imports)]
pub(crate) use every_store;

/// A store a scenario runs on, and the ways a test moves its clock.
pub trait StoreUnderTest {
    fn decide(&self, buckets: &[BucketRequest]) -> StoreDecision;
    /// Each request decided alone, all at once; how many were admitted.
    fn decide_each(&self, requests: &[BucketRequest]) -> usize;
    fn peek(&self, bucket: &BucketRequest) -> BucketOutcome;
    /// The tokens held beside a bucket (reservations, borrowed slices).
    fn reserved(&self, bucket: &BucketRequest) -> Reserved;
    fn settle(&self, settle: &Settle) -> Settled;
    fn reset(&self, key: &str);
    /// Deletes the bucket behind the store's back: no reset message (`FLUSHALL`, `DEL`).
    fn flush(&self, key: &str);
    /// Makes the store's clock `ms` later (earlier when negative) for the buckets `keys`.
    fn advance(&self, ms: i64, keys: &[&str]);
    /// Lets more than `ms` pass on the store's own clock (expiries the store keeps itself).
    fn pass(&self, ms: u64);
    /// A slice's deadline as stored now (Redis's groups move back with each advance).
    fn stored_deadline(&self, key: &str, slice: Slice) -> u64;
    /// Writes a global limit's share for `bucket` through the store's door, ending `for_ms`
    /// from the store's now (earlier when negative); the bucket's level afterwards, tokens.
    fn put_share(&self, bucket: &BucketRequest, rate: f64, size: u64, for_ms: i64) -> f64;
    /// Allowed difference between expected and observed tokens.
    fn tolerance(&self) -> f64;
    fn name(&self) -> &'static str;
}

/// The memory store on a manual clock.
pub struct Memory {
    pub store: MemoryStore<Arc<ManualClock>>,
    pub clock: Arc<ManualClock>,
}

impl Memory {
    pub fn new() -> Memory {
        let clock = Arc::new(ManualClock::default());
        clock.set_us(1_000_000_000_000);
        Memory {
            store: MemoryStore::with_clock(10_000, clock.clone()),
            clock,
        }
    }
}

impl StoreUnderTest for Memory {
    fn decide(&self, buckets: &[BucketRequest]) -> StoreDecision {
        self.store.decide_sync(buckets)
    }
    fn decide_each(&self, requests: &[BucketRequest]) -> usize {
        requests
            .iter()
            .filter(|request| {
                self.store
                    .decide_sync(std::slice::from_ref(request))
                    .allowed
            })
            .count()
    }
    fn peek(&self, bucket: &BucketRequest) -> BucketOutcome {
        self.store.peek_now(bucket)
    }
    fn reserved(&self, bucket: &BucketRequest) -> Reserved {
        self.store.reserved_now(bucket)
    }
    fn settle(&self, settle: &Settle) -> Settled {
        self.store.settle_now(settle)
    }
    fn reset(&self, key: &str) {
        self.store.reset_now(key);
    }
    fn flush(&self, key: &str) {
        self.store.reset_now(key);
        // Redis's clock moves on between two calls; the manual one must be moved.
        self.advance(1, &[]);
    }
    fn advance(&self, ms: i64, _keys: &[&str]) {
        let now = self.clock.now_us() as i64;
        self.clock.set_us((now + ms * 1000) as u64);
    }
    fn pass(&self, ms: u64) {
        self.clock.advance_ms(ms + 1);
    }
    fn stored_deadline(&self, _key: &str, slice: Slice) -> u64 {
        slice.deadline_us
    }
    fn put_share(&self, bucket: &BucketRequest, rate: f64, size: u64, for_ms: i64) -> f64 {
        let until_us = (self.clock.now_us() as i64 + for_ms * 1000) as u64;
        let share = Share {
            rate,
            size,
            until_us,
        };
        let (level, _) = self
            .store
            .put_share_now(bucket, share)
            .expect("a global key");
        level / 1e6
    }
    fn tolerance(&self) -> f64 {
        1e-9
    }
    fn name(&self) -> &'static str {
        "memory"
    }
}

/// A real Redis (or Valkey) of its own, and the store on it.
pub struct Redis {
    pub server: RedisServer,
    pub store: RedisStore,
    pub runtime: tokio::runtime::Runtime,
    /// Shifts buckets in time (see [`SHIFT`]) and reads them raw, without a process per call.
    pub raw: RefCell<redis::Connection>,
    /// How far each key was shifted back, µs.
    shifted: RefCell<HashMap<String, u64>>,
}

/// Moves each existing bucket's `ts`, the deadlines of the groups it holds and the end of
/// its global share, ARGV[1] µs back (a bucket is `"v1:<debt> <ts>[ <deadline> <held>]...[
/// i<incarnation>]"`, written only by
/// a charge, so its `ts` may be several steps old): the next call then refills by that much
/// more. A bucket written since the last shift had `ts` at `TIME`; one not written keeps the
/// shifts it had. Real time between steps adds a little refill (see `tolerance`).
const SHIFT: &str = r"
for _, key in ipairs(KEYS) do
  local stored = redis.call('GET', key)
  if stored then
    local mark, debt, at, rest = string.match(stored, '^(v1:)(%d+) (%d+)(.*)$')
    if not mark then mark, debt, at, rest = '', string.match(stored, '^(%d+) (%d+)(.*)$') end
    local shifted = mark .. debt .. ' ' .. string.format('%d', at - tonumber(ARGV[1]))
    for d, h in string.gmatch(rest, '(%d+) (%d+)') do
      shifted = shifted .. string.format(' %d %s', d - tonumber(ARGV[1]), h)
    end
    -- The groups' incarnation: a name, not a time to shift.
    redis.call('SET', key, shifted .. (string.match(rest, ' i%d+$') or ''), 'KEEPTTL')
  end
  -- A global limit's share beside it (lua/global.lua): its end moves back as well.
  local share = redis.call('GET', key .. ':g')
  if share then
    local r, c, u = string.match(share, '^(%S+) (%d+) (%d+)$')
    redis.call('SET', key .. ':g', string.format('%s %s %d', r, c, u - tonumber(ARGV[1])), 'KEEPTTL')
  end
end
return 0
";

impl Redis {
    pub fn start() -> Redis {
        let server = RedisServer::start();
        // A budget, not a figure: a scenario may decide 10,000 reservations at once, which a
        // loaded machine may take seconds over.
        let (store, runtime) = redis_store(
            &Topology::Single { url: &server.url() },
            Duration::from_secs(30),
        );
        let raw = redis::Client::open(server.url())
            .and_then(|client| client.get_connection())
            .expect("a connection to shift buckets");
        Redis {
            server,
            store,
            runtime,
            raw: RefCell::new(raw),
            shifted: RefCell::default(),
        }
    }
}

impl StoreUnderTest for Redis {
    fn decide(&self, buckets: &[BucketRequest]) -> StoreDecision {
        self.runtime
            .block_on(self.store.decide(buckets))
            .expect("redis decides")
    }
    fn decide_each(&self, requests: &[BucketRequest]) -> usize {
        // Concurrent: the store sends them in a few calls, as it would a burst of checks.
        let decided = self.runtime.block_on(futures_util::future::join_all(
            requests
                .iter()
                .map(|request| self.store.decide(std::slice::from_ref(request))),
        ));
        decided
            .into_iter()
            .filter(|decided| decided.as_ref().expect("decided").allowed)
            .count()
    }
    fn peek(&self, bucket: &BucketRequest) -> BucketOutcome {
        self.runtime
            .block_on(self.store.peek(bucket))
            .expect("redis peeks")
    }
    fn reserved(&self, bucket: &BucketRequest) -> Reserved {
        self.runtime
            .block_on(self.store.reserved(bucket))
            .expect("redis tells what is held")
    }
    fn settle(&self, settle: &Settle) -> Settled {
        self.runtime
            .block_on(self.store.settle(settle))
            .expect("settled")
    }
    fn reset(&self, key: &str) {
        self.runtime
            .block_on(self.store.reset(key))
            .expect("redis resets");
    }
    fn flush(&self, _key: &str) {
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut *self.raw.borrow_mut())
            .expect("flushed");
        self.shifted.borrow_mut().clear();
    }
    /// Makes each bucket's last write `ms` older in Redis's time (see [`SHIFT`]): the memory
    /// store's clock advances by `ms` between two steps, and so does Redis's, as far as the
    /// buckets can tell.
    fn advance(&self, ms: i64, keys: &[&str]) {
        for key in keys {
            let mut shifted = self.shifted.borrow_mut();
            let by = shifted.entry((*key).to_owned()).or_default();
            *by = by.wrapping_add_signed(ms * 1000);
        }
        let _: i64 = redis::Script::new(SHIFT)
            .key(keys)
            .arg(ms * 1000)
            .invoke(&mut *self.raw.borrow_mut())
            .expect("shift runs");
    }
    fn pass(&self, ms: u64) {
        // Redis's own clock cannot be set: a sleep is a lower bound on the time it sees pass.
        std::thread::sleep(Duration::from_millis(ms + 5));
    }
    fn stored_deadline(&self, key: &str, slice: Slice) -> u64 {
        slice.deadline_us - self.shifted.borrow().get(key).copied().unwrap_or(0)
    }
    fn put_share(&self, bucket: &BucketRequest, rate: f64, size: u64, for_ms: i64) -> f64 {
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query(&mut *self.raw.borrow_mut())
            .expect("redis tells the time");
        let until_us = ((s * 1_000_000 + us) as i64 + for_ms * 1000) as u64;
        let share = Share {
            rate,
            size,
            until_us,
        };
        let (level, _) = self
            .runtime
            .block_on(self.store.put_share(bucket, share))
            .expect("redis writes the share");
        level / 1e6
    }
    fn tolerance(&self) -> f64 {
        // Real time between a shift and the next call (a peek and a round trip: well under a
        // few milliseconds), at rates of at most 10/s.
        0.15
    }
    fn name(&self) -> &'static str {
        "redis"
    }
}
