//! Checks that queue on one thread together are decided by one script call (the batch form of
//! `lua/token_bucket.lua`), and each exactly as it would have been alone: in the order they
//! were queued, every one seeing what the ones before it charged. Against a real
//! `redis-server`; the memory store, deciding the same requests one by one, is the reference.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::FutureExt;
use proptest::prelude::*;

use crate::support::commandstats::script_calls;
use crate::support::{redis_store, RedisServer};
use tollgate_core::base::calendar::Period;
use tollgate_core::base::clock::ManualClock;
use tollgate_core::kinds::borrow::Borrow;
use tollgate_core::kinds::{BucketRequest, Meter};
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::redis::{RedisStore, Topology};
use tollgate_core::store::{Store, StoreDecision};

/// Slow enough that the milliseconds between two calls of one test refill nothing that could
/// change a decision, so a frozen clock is a fair reference.
const RATE: f64 = 0.001;

struct Harness {
    redis: RedisServer,
    store: RedisStore,
    runtime: tokio::runtime::Runtime,
}

impl Harness {
    /// A store on a current-thread runtime, the way an HTTP worker runs it.
    fn start() -> Harness {
        Harness::start_with_window(Duration::ZERO)
    }

    /// The same, its checks gathered for `window` (`store.coalesce_window_ms`).
    fn start_with_window(window: Duration) -> Harness {
        let redis = RedisServer::start();
        let (store, runtime) = redis_store(
            &Topology::Single { url: &redis.url() },
            Duration::from_secs(5),
        );
        let store = store.with_coalesce_window(window);
        runtime.block_on(store.warm_up());
        Harness {
            redis,
            store,
            runtime,
        }
    }

    /// Starts every request's decision before any is answered, in order: they queue together.
    fn decide_together(&self, requests: &[Vec<BucketRequest>]) -> Vec<StoreDecision> {
        self.runtime.block_on(async {
            join_all(requests.iter().map(|buckets| self.store.decide(buckets)))
                .await
                .into_iter()
                .map(|decision| decision.expect("decided"))
                .collect()
        })
    }
}

fn bucket(key: &str, burst: f64, cost: u64, shadow: bool) -> BucketRequest {
    let request = BucketRequest::bucket(key, RATE, burst).cost(cost);
    if shadow {
        request.shadow()
    } else {
        request
    }
}

#[test]
fn checks_that_queue_together_share_calls_and_admit_exactly_the_burst() {
    let harness = Harness::start();
    let requests = vec![vec![bucket("tollgate:hot", 50.0, 1, false)]; 200];
    let before = script_calls(&harness.redis);
    let decisions = harness.decide_together(&requests);
    let calls = script_calls(&harness.redis) - before;

    let admitted = decisions.iter().filter(|d| d.allowed).count();
    assert_eq!(admitted, 50, "the burst, no more, no less");
    // In the order they queued: the first 50 drain the bucket one token at a time.
    for (i, decision) in decisions.iter().enumerate() {
        assert_eq!(decision.allowed, i < 50, "check {i}");
        let expected = if i < 50 { 49.0 - i as f64 } else { 0.0 };
        assert!(
            (decision.buckets[0].tokens - expected).abs() < 1e-3,
            "check {i}: {} tokens, expected {expected}",
            decision.buckets[0].tokens
        );
    }
    assert!(
        calls <= 10,
        "200 checks queued together took {calls} script calls"
    );
}

#[test]
fn a_batch_decides_requests_of_every_shape_as_separate_calls_would() {
    let harness = Harness::start();
    let quota = |key: &str, limit: f64, cost: u64| BucketRequest {
        meter: Meter::Quota(Period::Day),
        ..bucket(key, limit, cost, false)
    };
    let requests = vec![
        // Two limits, both with room.
        vec![
            bucket("tollgate:a", 3.0, 1, false),
            bucket("tollgate:b", 1.0, 1, false),
        ],
        // b is empty now: denied, and a is not charged.
        vec![
            bucket("tollgate:a", 3.0, 1, false),
            bucket("tollgate:b", 1.0, 1, false),
        ],
        // A shadow limit that cannot pay does not deny, and is not charged.
        vec![
            bucket("tollgate:a", 3.0, 1, false),
            bucket("tollgate:b", 1.0, 1, true),
        ],
        // Cost 0 (charged later by a report): admitted while there is anything left.
        vec![bucket("tollgate:a", 3.0, 0, false)],
        // A cost larger than what is left.
        vec![bucket("tollgate:a", 3.0, 2, false)],
        // Quotas: counted per calendar day, then refused once used up.
        vec![quota("tollgate:q", 2.0, 2)],
        vec![
            quota("tollgate:q", 2.0, 1),
            bucket("tollgate:c", 5.0, 1, false),
        ],
    ];
    let decisions = harness.decide_together(&requests);

    let shape: Vec<(bool, Vec<f64>)> = decisions
        .iter()
        .map(|d| (d.allowed, d.buckets.iter().map(|b| b.tokens).collect()))
        .collect();
    let expected: Vec<(bool, Vec<f64>)> = vec![
        (true, vec![2.0, 0.0]),
        (false, vec![2.0, 0.0]),
        (true, vec![1.0, 0.0]),
        (true, vec![1.0]),
        (false, vec![1.0]),
        (true, vec![0.0]),
        (false, vec![0.0, 5.0]),
    ];
    for (i, ((allowed, tokens), (want_allowed, want_tokens))) in
        shape.iter().zip(&expected).enumerate()
    {
        assert_eq!(allowed, want_allowed, "request {i}: {decisions:?}");
        for (got, want) in tokens.iter().zip(want_tokens) {
            assert!((got - want).abs() < 1e-3, "request {i}: {tokens:?}");
        }
    }
    let window = decisions[5].buckets[0].window.expect("a quota's window");
    assert_eq!(window.length_s, 86_400);
}

#[test]
fn a_window_gathers_checks_queued_turns_apart_into_one_call() {
    // Without a window the first check's call goes once its worker has polled again, so the
    // second, queued turns later, goes in a call of its own; with one, it joins the first.
    for (window, expected_calls) in [(Duration::from_secs(2), 1), (Duration::ZERO, 2)] {
        let harness = Harness::start_with_window(window);
        let first = vec![bucket("tollgate:w1", 5.0, 1, false)];
        let second = vec![bucket("tollgate:w2", 5.0, 1, false)];
        let before = script_calls(&harness.redis);
        let (a, b) = harness.runtime.block_on(async {
            tokio::join!(harness.store.decide(&first), async {
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
                harness.store.decide(&second).await
            })
        });
        let calls = script_calls(&harness.redis) - before;
        assert!(a.expect("decided").allowed && b.expect("decided").allowed);
        assert_eq!(calls, expected_calls, "window {window:?}");
    }
}

#[test]
fn a_check_whose_caller_left_does_not_hold_up_its_batch() {
    let harness = Harness::start();
    let request = vec![bucket("tollgate:left", 10.0, 1, false)];
    let decisions = harness.runtime.block_on(async {
        // Queued, then dropped before its batch goes out: its client went away.
        assert!(harness.store.decide(&request).now_or_never().is_none());
        join_all((0..9).map(|_| harness.store.decide(&request))).await
    });
    let tokens: Vec<f64> = decisions
        .into_iter()
        .map(|d| d.expect("answered").buckets[0].tokens)
        .collect();
    // Queued is sent: the check that was left charged its token like any other.
    for (i, left) in tokens.iter().enumerate() {
        assert!((left - (8.0 - i as f64)).abs() < 1e-3, "{tokens:?}");
    }
}

/// A request drawn from a small pool of keys, so requests in one batch collide. Costs are 1
/// or more: a batch past 32 checks goes in several calls, a few microseconds apart, and
/// the refill between them (tiny, but above 0) would admit a cost-0 check on a bucket the
/// frozen reference holds at exactly 0 (the shape test covers cost 0 within one call).
fn request() -> impl Strategy<Value = Vec<BucketRequest>> {
    let one = (0..4usize, 1..4u64, any::<bool>()).prop_map(|(key, cost, shadow)| {
        let burst = [1.0, 2.0, 3.0, 5.0][key];
        bucket(&format!("tollgate:p{key}"), burst, cost, shadow)
    });
    proptest::collection::vec(one, 1..4).prop_filter("distinct keys in one request", |b| {
        let mut keys: Vec<&str> = b.iter().map(|b| b.key.as_str()).collect();
        keys.sort_unstable();
        keys.windows(2).all(|w| w[0] != w[1])
    })
}

/// A request of one key from a small pool, as a batch mixes them: a plain bucket, a borrowing
/// one (which takes a slice when there is room: the script decides it beside plain ones while
/// its key holds none, and in its general form once it holds some), or a quota (always the
/// general form). The requests after one decided in the general form are plain again.
fn mixed_request() -> impl Strategy<Value = Vec<BucketRequest>> {
    (0..5usize, 1..3u64, 0..4u64, 0..3usize).prop_map(|(key, cost, want, shape)| {
        if key == 4 {
            return vec![BucketRequest {
                meter: Meter::Quota(Period::Day),
                ..bucket("tollgate:mq", 6.0, cost, false)
            }];
        }
        let burst = [2.0, 4.0, 8.0, 16.0][key];
        let plain = bucket(&format!("tollgate:m{key}"), burst, cost, false);
        if shape == 0 {
            return vec![plain];
        }
        vec![BucketRequest {
            meter: Meter::Borrow(Borrow {
                grid_us: 1_000_000,
                want,
                give: None,
            }),
            ..plain
        }]
    })
}

/// Decides `requests` together on Redis and one by one in memory (a frozen clock); both must
/// agree on every decision, every level and every slice's size.
fn agree(harness: &Harness, requests: &[Vec<BucketRequest>]) -> Result<(), TestCaseError> {
    harness.redis.cli(&["FLUSHDB"]);
    let batched = harness.decide_together(requests);
    let reference = MemoryStore::with_clock(1_000, Arc::new(ManualClock::default()));
    for (i, (buckets, got)) in requests.iter().zip(&batched).enumerate() {
        let want = harness
            .runtime
            .block_on(reference.decide(buckets))
            .expect("memory decides");
        prop_assert_eq!(got.allowed, want.allowed, "request {}", i);
        for (g, w) in got.buckets.iter().zip(&want.buckets) {
            prop_assert_eq!(g.enough, w.enough, "request {}", i);
            prop_assert!(
                (g.tokens - w.tokens).abs() < 1e-3,
                "request {}: {:?} vs {:?}",
                i,
                got,
                want
            );
        }
        let sizes = |d: &StoreDecision| -> Vec<(usize, u64)> {
            d.slices.iter().map(|s| (s.bucket, s.tokens)).collect()
        };
        prop_assert_eq!(sizes(got), sizes(&want), "request {}", i);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Random sequences, queued together on Redis and decided one by one in memory, agree.
    #[test]
    fn batches_agree_with_one_call_per_check(requests in proptest::collection::vec(request(), 1..60)) {
        thread_local! {
            static HARNESS: Harness = Harness::start();
        }
        HARNESS.with(|harness| agree(harness, &requests))?;
    }

    /// The same with borrowing requests and quotas among the plain ones.
    #[test]
    fn batches_mixing_borrowing_and_quotas_agree_with_one_call_per_check(
        requests in proptest::collection::vec(mixed_request(), 1..60)
    ) {
        thread_local! {
            static HARNESS: Harness = Harness::start();
        }
        HARNESS.with(|harness| agree(harness, &requests))?;
    }
}
