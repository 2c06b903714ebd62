//! One table of decision scenarios, run on every store (`support::stores`: the memory store
//! and a real `redis-server` running `lua/token_bucket.lua`), so the two implementations of
//! the bucket arithmetic cannot drift apart; then Redis's own keys (expiry, stored debt) and
//! the memory store's cap. The stored forms of other releases: `store_formats`.

use std::sync::Arc;
use std::time::Duration;

use crate::support::stores::{every_store, Redis, StoreUnderTest};
use tollgate_core::base::clock::ManualClock;
use tollgate_core::kinds::twin::Stored;
use tollgate_core::kinds::{BucketOutcome, BucketRequest};
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::StoreDecision;

/// A bucket used in a step: (key, rate, burst, cost, shadow).
type Bucket = (&'static str, f64, f64, u64, bool);

struct Step {
    /// Clock change before the step, in ms; negative moves the clock backwards.
    advance_ms: i64,
    buckets: &'static [Bucket],
    allowed: bool,
    /// Tokens left in each bucket after the step.
    tokens: &'static [f64],
}

const fn step(
    advance_ms: i64,
    buckets: &'static [Bucket],
    allowed: bool,
    tokens: &'static [f64],
) -> Step {
    Step {
        advance_ms,
        buckets,
        allowed,
        tokens,
    }
}

const A13: &[Bucket] = &[("a", 1.0, 3.0, 1, false)];
const HALF: &[Bucket] = &[("half", 0.5, 1.0, 1, false)];
const CAP: &[Bucket] = &[("cap", 2.0, 2.0, 1, false)];
const COST3: &[Bucket] = &[("cost", 1.0, 5.0, 3, false)];
const COST2: &[Bucket] = &[("cost", 1.0, 5.0, 2, false)];
const HUGE: &[Bucket] = &[("huge", 1.0, 5.0, 6, false)];
const BACK: &[Bucket] = &[("back", 1.0, 2.0, 1, false)];
const PAIR: &[Bucket] = &[("tight", 1.0, 1.0, 1, false), ("loose", 1.0, 5.0, 1, false)];
const SHADOWED: &[Bucket] = &[("real", 1.0, 5.0, 1, false), ("shadow", 1.0, 1.0, 1, true)];
/// One key whose numbers change (an override, a reload): they apply to its debt.
const RAISE3: &[Bucket] = &[("raise", 0.001, 3.0, 1, false)];
const RAISE10: &[Bucket] = &[("raise", 0.001, 10.0, 1, false)];
const LOWER10: &[Bucket] = &[("lower", 0.001, 10.0, 1, false)];
const LOWER3: &[Bucket] = &[("lower", 0.001, 3.0, 1, false)];

const SCENARIOS: &[(&str, &[Step])] = &[
    (
        "a burst runs out, then refills at the rate",
        &[
            step(0, A13, true, &[2.0]),
            step(0, A13, true, &[1.0]),
            step(0, A13, true, &[0.0]),
            step(0, A13, false, &[0.0]),
            step(1000, A13, true, &[0.0]),
            step(500, A13, false, &[0.5]),
        ],
    ),
    (
        "a fractional rate of 0.5/s needs two seconds per token",
        &[
            step(0, HALF, true, &[0.0]),
            step(1000, HALF, false, &[0.5]),
            step(1000, HALF, true, &[0.0]),
        ],
    ),
    (
        "refill is capped at the burst",
        &[step(0, CAP, true, &[1.0]), step(60_000, CAP, true, &[1.0])],
    ),
    (
        "a cost above one takes several tokens, and a denial keeps them",
        &[
            step(0, COST3, true, &[2.0]),
            step(0, COST3, false, &[2.0]),
            step(0, COST2, true, &[0.0]),
        ],
    ),
    (
        "a cost above the burst never passes",
        &[
            step(0, HUGE, false, &[5.0]),
            step(60_000, HUGE, false, &[5.0]),
        ],
    ),
    (
        "a clock going backwards adds no tokens",
        &[
            step(0, BACK, true, &[1.0]),
            step(-5_000, BACK, true, &[0.0]),
            step(0, BACK, false, &[0.0]),
        ],
    ),
    (
        "several limits are all-or-nothing",
        &[
            step(0, PAIR, true, &[0.0, 4.0]),
            step(0, PAIR, false, &[0.0, 4.0]),
        ],
    ),
    (
        "a raised burst grants the difference at once, on a drained bucket",
        &[
            step(0, RAISE3, true, &[2.0]),
            step(0, RAISE3, true, &[1.0]),
            step(0, RAISE3, true, &[0.0]),
            step(0, RAISE3, false, &[0.0]),
            step(0, RAISE10, true, &[6.0]),
            step(0, RAISE10, true, &[5.0]),
        ],
    ),
    (
        "a lowered burst binds at the next check",
        &[
            step(0, LOWER10, true, &[9.0]),
            step(0, LOWER10, true, &[8.0]),
            step(0, LOWER3, true, &[0.0]),
            step(0, LOWER3, false, &[0.0]),
            step(0, LOWER10, true, &[6.0]),
        ],
    ),
    (
        "a shadow limit never denies and is charged only when it can pay",
        &[
            step(0, SHADOWED, true, &[4.0, 0.0]),
            step(0, SHADOWED, true, &[3.0, 0.0]),
        ],
    ),
];

fn requests(prefix: &str, buckets: &[Bucket]) -> Vec<BucketRequest> {
    buckets
        .iter()
        .enumerate()
        .map(|(i, &(key, rate, burst, cost, shadow))| {
            let request = BucketRequest::bucket(format!("{prefix}:{key}"), rate, burst)
                .cost(cost)
                .limit(i);
            if shadow {
                request.shadow()
            } else {
                request
            }
        })
        .collect()
}

fn scenarios(harness: &dyn StoreUnderTest) {
    let prefix = harness.name();
    for (name, steps) in SCENARIOS {
        let prefix = format!("{prefix}:{}", name.replace(' ', "_"));
        for (i, step) in steps.iter().enumerate() {
            let requests = requests(&prefix, step.buckets);
            let keys: Vec<&str> = requests.iter().map(|r| r.key.as_str()).collect();
            harness.advance(step.advance_ms, &keys);
            let peeked: Vec<BucketOutcome> = requests.iter().map(|r| harness.peek(r)).collect();
            let decision = harness.decide(&requests);
            assert_eq!(decision.allowed, step.allowed, "{name}, step {i}: allowed");
            assert_peek_foretold(
                harness,
                &requests,
                &peeked,
                &decision,
                &format!("{name}, step {i}"),
            );
            for (j, (outcome, expected)) in decision.buckets.iter().zip(step.tokens).enumerate() {
                assert!(
                    (outcome.tokens - expected).abs() <= harness.tolerance(),
                    "{name}, step {i}, bucket {j}: {} tokens, expected {expected}",
                    outcome.tokens
                );
            }
        }
    }
}

/// What a peek found just before a decision is what the decision found: each bucket's
/// `enough`, and its tokens less what the decision charged.
fn assert_peek_foretold(
    harness: &dyn StoreUnderTest,
    requests: &[BucketRequest],
    peeked: &[BucketOutcome],
    decision: &StoreDecision,
    at: &str,
) {
    for (j, ((request, peek), outcome)) in requests
        .iter()
        .zip(peeked)
        .zip(&decision.buckets)
        .enumerate()
    {
        assert_eq!(
            peek.enough, outcome.enough,
            "{at}, bucket {j}: peek's enough"
        );
        let charged = if decision.allowed && outcome.enough {
            request.cost as f64
        } else {
            0.0
        };
        assert!(
            (peek.tokens - charged - outcome.tokens).abs() <= harness.tolerance(),
            "{at}, bucket {j}: peeked {} tokens, the decision left {} after charging {charged}",
            peek.tokens,
            outcome.tokens
        );
    }
}

every_store!(scenarios);

fn request(key: &str, rate: f64, burst: f64, cost: u64) -> BucketRequest {
    BucketRequest::bucket(key, rate, burst).cost(cost)
}

impl Redis {
    /// The stored bucket: (debt, ts) as written, parsed.
    fn stored(&self, key: &str) -> Stored {
        self.stored_and_expiry(key).expect("the bucket is stored").0
    }

    /// The stored bucket and its expiry (ms), read at one instant; `None` once it expired.
    fn stored_and_expiry(&self, key: &str) -> Option<(Stored, i64)> {
        let (stored, expires): (Option<String>, i64) = redis::pipe()
            .atomic()
            .get(key)
            .cmd("PEXPIRETIME")
            .arg(key)
            .query(&mut *self.raw.borrow_mut())
            .expect("read the bucket");
        let stored = stored?;
        let stored = Stored::parse(&stored).ok().flatten();
        Some((stored.expect("\"v1:<debt> <ts>\""), expires))
    }
}

#[test]
fn redis_buckets_expire_the_millisecond_after_they_are_full_again() {
    let redis = Redis::start();
    for (key, rate, burst, cost) in [
        ("ttl:a", 4.0, 10.0, 1),
        ("ttl:b", 0.3, 7.0, 2),
        ("ttl:c", 7.0, 3.0, 2),
        ("ttl:d", 1.0 / 60.0, 100.0, 3),
    ] {
        // A machine that stalls for longer than the bucket takes to refill (ttl:c: 0.4 s)
        // lets the key expire before it is read: that run shows nothing, so try again.
        let read = (0..5).find_map(|attempt| {
            let key = format!("{key}:{attempt}");
            redis.decide(&[request(&key, rate, burst, 1)]);
            redis.decide(&[request(&key, rate, burst, cost)]);
            redis.stored_and_expiry(&key)
        });
        let (stored, expires_ms) =
            read.expect("the machine never read the bucket before it expired");
        // The memory store drops a bucket at `full_at_us`; Redis deletes the key once its
        // millisecond clock passes the deadline, so never before that moment.
        let full_at_ms = (stored.full_at_us(rate) / 1000) as i64;
        assert_eq!(expires_ms, full_at_ms + 1, "{key}");
    }
}

#[test]
fn an_expired_bucket_decides_as_the_full_one_it_was() {
    let redis = Redis::start();
    // 100 tokens/s: one token is back after 10 ms, and then the key is gone.
    let bucket = request("ttl:fast", 100.0, 10.0, 1);
    assert_eq!(
        redis.decide(std::slice::from_ref(&bucket)).buckets[0].tokens,
        9.0
    );
    assert!(crate::support::wait_until(Duration::from_secs(5), || {
        redis.server.cli(&["EXISTS", "ttl:fast"]).trim() == "0"
    }));
    assert_eq!(redis.decide(&[bucket]).buckets[0].tokens, 9.0);
}

#[test]
fn a_denial_on_a_full_bucket_still_expires() {
    let redis = Redis::start();
    // A cost above burst never passes; the bucket it writes is full and must not linger.
    let decision = redis.decide(&[request("ttl:huge", 1.0, 5.0, 6)]);
    assert!(!decision.allowed);
    let pttl: i64 = redis
        .server
        .cli(&["PTTL", "ttl:huge"])
        .trim()
        .parse()
        .unwrap();
    assert!(pttl != -1 && pttl <= 2, "PTTL {pttl}");
}

#[test]
fn tokens_in_the_reply_are_exactly_burst_less_the_stored_debt() {
    let redis = Redis::start();
    let bucket = request("exact:k", 0.3, 7.0, 1);
    for _ in 0..5 {
        let decision = redis.decide(std::slice::from_ref(&bucket));
        let debt = redis.stored("exact:k").debt;
        assert_eq!(decision.buckets[0].tokens, (7e6 - debt as f64) / 1e6);
    }
    // One string key of two integers, nothing else.
    assert_eq!(redis.server.cli(&["TYPE", "exact:k"]).trim(), "string");
}

/// One token, refilled in 1000 s: a single allowed check drains it for the whole test.
fn slow_bucket(key: String) -> BucketRequest {
    BucketRequest::bucket(key, 0.001, 1.0)
}

/// Drains `count` clients named `<prefix><i>`, then asks each once more and returns how many
/// came back full (were allowed again).
fn drain_then_count_refilled(
    store: &MemoryStore<Arc<ManualClock>>,
    prefix: &str,
    count: usize,
) -> usize {
    for i in 0..count {
        let drained = store.decide_sync(&[slow_bucket(format!("{prefix}{i}"))]);
        assert!(drained.allowed, "{prefix}{i} starts full");
    }
    (0..count)
        .filter(|i| {
            store
                .decide_sync(&[slow_bucket(format!("{prefix}{i}"))])
                .allowed
        })
        .count()
}

#[test]
fn the_memory_store_keeps_every_bucket_below_its_cap() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(100_000, clock);
    let came_back_full = drain_then_count_refilled(&store, "client-", 95_000);
    assert_eq!(
        came_back_full, 0,
        "of 95,000 drained clients under a cap of 100,000"
    );
    assert_eq!(store.len(), 95_000);
}

#[test]
fn past_its_cap_the_memory_store_drops_refilled_buckets_first() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(10_000, clock.clone());
    assert_eq!(drain_then_count_refilled(&store, "old-", 6_000), 0);
    clock.advance_ms(2_000_000); // the old buckets are full again
    assert_eq!(drain_then_count_refilled(&store, "new-", 6_000), 0);
    assert!(store.len() <= 10_000, "held {}", store.len());
}

#[test]
fn past_its_cap_the_memory_store_drops_the_buckets_closest_to_full() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(10_000, clock.clone());
    assert_eq!(drain_then_count_refilled(&store, "early-", 5_000), 0);
    clock.advance_ms(500_000); // half refilled: these are the closest to full
    assert_eq!(drain_then_count_refilled(&store, "late-", 5_000), 0);
    // 1,000 more clients: room is made among the early ones only.
    assert_eq!(drain_then_count_refilled(&store, "extra-", 1_000), 0);
    let late_refilled = (0..5_000)
        .filter(|i| {
            store
                .decide_sync(&[slow_bucket(format!("late-{i}"))])
                .allowed
        })
        .count();
    assert_eq!(late_refilled, 0);
    assert!(store.len() <= 10_000, "held {}", store.len());
}

/// Multi-bucket decisions hold several shard locks while making room; room is made with
/// `try_lock` only, so threads doing that at once never deadlock, and the cap holds.
#[test]
fn concurrent_multi_bucket_decisions_at_the_cap_neither_deadlock_nor_overgrow() {
    let clock = Arc::new(ManualClock::default());
    let store = Arc::new(MemoryStore::with_clock(2_000, clock));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..5_000 {
                    let pair: Vec<_> = (0..3)
                        .map(|j| slow_bucket(format!("t{t}-{i}-{j}")))
                        .collect();
                    store.decide_sync(&pair);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("no panic");
    }
    // A sweep may skip a shard another thread holds: a few buckets over, never more.
    assert!(store.len() <= 2_000 + 4 * 3, "held {}", store.len());
}

/// The extremes `validate` accepts decide like any bucket on a real Redis, and every key keeps a
/// TTL: a ten-year refill, a burst of 10^9, and a rate of 10^300.
#[test]
fn redis_decides_the_most_extreme_accepted_buckets_and_keeps_their_ttl() {
    let redis = Redis::start();
    let bucket = |key: &str, rate: f64, burst: f64, cost: u64| {
        BucketRequest::bucket(key, rate, burst).cost(cost)
    };
    let pttl = |key: &str| -> i64 { redis.server.cli(&["PTTL", key]).trim().parse().unwrap() };

    let decade = bucket("x:decade", 3.2e-9, 1.0, 1);
    assert!(redis.decide(std::slice::from_ref(&decade)).allowed);
    let again = redis.decide(&[decade]);
    assert!(!again.allowed && again.buckets[0].tokens < 1e-6);
    // Full again after 1 / 3.2e-9 s = 312,500,000 s: the expiry, in ms, is an integer Redis took.
    let ttl = pttl("x:decade");
    assert!(
        (312_499_000_000..=312_500_001_000).contains(&ttl),
        "PTTL {ttl}"
    );

    let huge = bucket("x:huge", 3.2, 1e9, 1);
    let first = redis.decide(std::slice::from_ref(&huge));
    assert!(first.allowed);
    assert_eq!(first.buckets[0].tokens, 999_999_999.0, "exact at 10^9");
    let all = redis.decide(&[bucket("x:huge", 3.2, 1e9, 1_000_000_000)]);
    assert!(!all.allowed, "one token short of the whole burst");
    assert!(pttl("x:huge") > 0);

    let instant = bucket("x:instant", 1e300, 1.0, 1);
    assert!(redis.decide(&[instant]).allowed);
    // Full again within a millisecond: gone already (-2) or about to be (0 in its last
    // millisecond); never without TTL (-1).
    let ttl = pttl("x:instant");
    assert!(ttl == -2 || (0..=1_000).contains(&ttl), "PTTL {ttl}");

    // The store stayed healthy: an ordinary bucket beside them is decided as usual.
    assert!(redis.decide(&[bucket("x:plain", 1.0, 5.0, 1)]).allowed);
}

#[test]
fn a_quota_peeks_alike_on_redis_and_in_memory() {
    let redis = Redis::start();
    let memory = MemoryStore::new(100);
    let quota = BucketRequest::quota("peek-quota", tollgate_core::base::calendar::Period::Day, 3);
    for _ in 0..2 {
        assert!(redis.decide(std::slice::from_ref(&quota)).allowed);
        assert!(memory.decide_sync(std::slice::from_ref(&quota)).allowed);
    }
    let (on_redis, in_memory) = (redis.peek(&quota), memory.peek_now(&quota));
    assert_eq!(on_redis.tokens, 1.0);
    assert_eq!(in_memory.tokens, 1.0);
    assert!(on_redis.enough && in_memory.enough);
    let (a, b) = (on_redis.window.unwrap(), in_memory.window.unwrap());
    assert_eq!(a.length_s, 86_400);
    assert_eq!(a.length_s, b.length_s);
    assert!(a.ends_in_s.abs_diff(b.ends_in_s) <= 1, "{a:?} vs {b:?}");
    assert!(redis.decide(std::slice::from_ref(&quota)).allowed);
    assert!(
        !redis.peek(&quota).enough,
        "a used-up quota peeks as denied"
    );
}
