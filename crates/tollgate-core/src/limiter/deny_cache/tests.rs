use super::*;
use crate::base::clock::ManualClock;

fn bucket(key: &str, rate: f64, burst: f64, cost: u64) -> BucketRequest {
    BucketRequest::bucket(key, rate, burst).cost(cost)
}

fn drained(tokens: f64) -> BucketOutcome {
    BucketOutcome {
        tokens,
        enough: false,
        window: None,
    }
}

fn cache(capacity: usize) -> (DenyCache, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let cache = DenyCache::with_clock(capacity, Duration::from_millis(50), clock.clone());
    (cache, clock)
}

/// Sends a probe at the clock's time and answers it with `outcomes`.
fn answer(cache: &DenyCache, buckets: &[BucketRequest], outcomes: &[BucketOutcome]) {
    match cache.consult(buckets, true) {
        Consult::Ask(probe) => probe.learn(outcomes),
        _ => panic!("expected to ask the store"),
    }
}

#[test]
fn a_quota_or_a_reported_limit_is_never_cached() {
    let (cache, _) = cache(100);
    let quota = BucketRequest::quota("q", crate::base::calendar::Period::Month, 3);
    let reported = bucket("r", 1.0, 5.0, 0);
    for request in [quota, reported] {
        let requests = [request];
        answer(&cache, &requests, &[drained(0.0)]);
        assert!(cache.denies(&requests).is_none());
    }
    assert!(cache.is_empty());
}

fn is_ask(consult: Consult<'_, '_>) -> bool {
    matches!(consult, Consult::Ask(_))
}

const SEC: u64 = 1_000_000;

#[test]
fn denies_until_the_bucket_can_refill_counting_from_the_send_time() {
    let (cache, clock) = cache(100);
    let b = [bucket("k", 10.0, 5.0, 1)];
    clock.set_us(5 * SEC);
    answer(&cache, &b, &[drained(0.0)]);
    // 10/s: one token 100 ms after the send, less the margins.
    clock.set_us(5 * SEC + 50_000);
    assert!(cache.denies(&b).is_some());
    clock.set_us(5 * SEC + 99_000);
    assert!(cache.denies(&b).is_some());
    clock.set_us(5 * SEC + 99_900);
    assert!(cache.denies(&b).is_none());
}

#[test]
fn one_answer_denies_for_at_most_the_window_cap() {
    let (cache, clock) = cache(100);
    // 1 token a minute: the bound alone would deny for a minute.
    let b = [bucket("k", 1.0 / 60.0, 5.0, 1)];
    answer(&cache, &b, &[drained(0.0)]);
    clock.set_us(MAX_WINDOW_US);
    assert!(cache.denies(&b).is_some());
    clock.advance_us(1);
    assert!(cache.denies(&b).is_none(), "older answers never deny");
}

#[test]
fn a_larger_cost_is_denied_longer() {
    let (cache, clock) = cache(100);
    answer(&cache, &[bucket("k", 10.0, 5.0, 1)], &[drained(0.5)]);
    clock.set_us(60_000);
    assert!(cache.denies(&[bucket("k", 10.0, 5.0, 1)]).is_none());
    let denied = cache.denies(&[bucket("k", 10.0, 5.0, 3)]).unwrap();
    assert!(denied.tokens < 3.0 && denied.tokens > 1.0);
}

#[test]
fn shadow_limits_changed_limits_and_impossible_costs_are_left_to_the_store() {
    let (cache, _) = cache(100);
    answer(&cache, &[bucket("k", 10.0, 5.0, 1)], &[drained(0.0)]);
    let mut shadow = bucket("k", 10.0, 5.0, 1);
    shadow.shadow = true;
    assert!(cache.denies(&[shadow]).is_none());
    assert!(cache.denies(&[bucket("k", 20.0, 5.0, 1)]).is_none());
    assert!(cache.denies(&[bucket("k", 10.0, 5.0, 9)]).is_none());
}

#[test]
fn the_denying_bucket_of_a_multi_limit_request_is_named() {
    let (cache, _) = cache(100);
    let reqs = [bucket("a", 10.0, 5.0, 1), bucket("b", 10.0, 5.0, 1)];
    let spare = BucketOutcome {
        tokens: 4.0,
        enough: true,
        window: None,
    };
    answer(&cache, &reqs, &[spare, drained(0.0)]);
    assert_eq!(cache.denies(&reqs).map(|d| d.bucket), Some(1));
    assert!(cache.denies(&reqs[..1]).is_none());
}

#[test]
fn a_reset_bucket_is_forgotten_and_others_are_kept() {
    let (cache, clock) = cache(100);
    let slow = |key| [bucket(key, 1.0 / 60.0, 5.0, 1)];
    answer(&cache, &slow("a"), &[drained(0.0)]);
    answer(&cache, &slow("b"), &[drained(0.0)]);
    clock.advance_us(10);
    cache.forget("a");
    assert!(cache.denies(&slow("a")).is_none());
    assert!(cache.denies(&slow("b")).is_some());
    cache.forget_all();
    assert!(cache.denies(&slow("b")).is_none());
}

#[test]
fn an_answer_sent_before_a_reset_is_not_learned() {
    let (cache, clock) = cache(100);
    let b = [bucket("k", 1.0 / 60.0, 5.0, 1)];
    // Sent before the reset, answered (drained) after it was heard.
    let Consult::Ask(probe) = cache.consult(&b, true) else {
        panic!("expected to ask the store")
    };
    clock.advance_us(10);
    cache.forget("k");
    probe.learn(&[drained(0.0)]);
    assert!(cache.denies(&b).is_none());
    // Sent after it: learned as ever.
    clock.advance_us(10);
    answer(&cache, &b, &[drained(0.0)]);
    assert!(cache.denies(&b).is_some());
}

#[test]
fn when_a_window_ends_one_request_probes_and_the_others_wait() {
    let (cache, clock) = cache(100);
    let b = [bucket("k", 10.0, 5.0, 1)];
    answer(&cache, &b, &[drained(0.0)]);
    clock.set_us(10_000);
    assert!(matches!(cache.consult(&b, false), Consult::Deny(_)));
    clock.set_us(200_000);
    let Consult::Ask(probe) = cache.consult(&b, false) else {
        panic!("the first request after the window probes");
    };
    clock.set_us(200_100);
    assert!(matches!(cache.consult(&b, false), Consult::Wait));
    assert!(
        is_ask(cache.consult(&b, true)),
        "a waiter is never told to wait twice"
    );
    // The probe's answer: it took the token; the bucket is denied again.
    probe.learn(&[drained(0.0)]);
    clock.set_us(200_200);
    assert!(matches!(cache.consult(&b, false), Consult::Deny(_)));
}

#[test]
fn a_dropped_probe_lets_the_next_request_probe() {
    let (cache, clock) = cache(100);
    let b = [bucket("k", 10.0, 5.0, 1)];
    answer(&cache, &b, &[drained(0.0)]);
    clock.set_us(200_000);
    let probe = cache.consult(&b, false);
    assert!(matches!(cache.consult(&b, false), Consult::Wait));
    drop(probe);
    assert!(is_ask(cache.consult(&b, false)));
}

#[test]
fn an_older_answer_landing_late_ends_the_probes_it_covers_only() {
    let (cache, clock) = cache(100);
    let b = [bucket("k", 10.0, 5.0, 1)];
    answer(&cache, &b, &[drained(0.0)]);
    clock.set_us(200_000);
    let Consult::Ask(early) = cache.consult(&b, false) else {
        panic!("probes");
    };
    clock.set_us(300_000);
    let Consult::Ask(late) = cache.consult(&b, true) else {
        panic!("a waiter asks");
    };
    late.learn(&[drained(0.0)]);
    clock.set_us(300_001);
    assert!(matches!(cache.consult(&b, false), Consult::Deny(_)));
    // The earlier answer is older than what the cache holds: it changes nothing.
    early.learn(&[drained(0.9)]);
    assert!(matches!(cache.consult(&b, false), Consult::Deny(_)));
}

#[test]
fn waiters_wake_when_the_probe_answers_by_any_path() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // A long wait: the test proves a wake-up, not a timeout.
    let clock = Arc::new(ManualClock::default());
    let cache = DenyCache {
        probe_wait: Duration::from_secs(60),
        ..DenyCache::with_clock(100, Duration::from_secs(1), clock.clone())
    };
    let b = [bucket("k", 10.0, 5.0, 1)];
    let spare = BucketOutcome {
        tokens: 3.0,
        enough: true,
        window: None,
    };
    // Answered and kept, answered and forgotten, abandoned.
    let endings: [&dyn Fn(Probe<'_, '_>); 3] = [
        &|p: Probe<'_, '_>| p.learn(&[drained(0.0)]),
        &|p: Probe<'_, '_>| p.learn(&[spare]),
        &|p: Probe<'_, '_>| drop(p),
    ];
    for (i, end) in endings.iter().enumerate() {
        clock.advance_us(10 * SEC);
        answer(&cache, &b, &[drained(0.0)]);
        clock.advance_us(SEC / 2);
        let Consult::Ask(probe) = cache.consult(&b, false) else {
            panic!("probes");
        };
        assert!(matches!(cache.consult(&b, false), Consult::Wait));
        let started = std::time::Instant::now();
        runtime.block_on(async {
            let waiter = cache.wait(&b);
            let answer = async {
                tokio::task::yield_now().await;
                end(probe);
            };
            tokio::join!(waiter, answer);
        });
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "ending {i} woke"
        );
    }
}

#[test]
fn a_bucket_with_tokens_to_spare_is_forgotten() {
    let (cache, _) = cache(100);
    let b = [bucket("k", 10.0, 5.0, 1)];
    answer(&cache, &b, &[drained(0.0)]);
    let plenty = BucketOutcome {
        tokens: 3.0,
        enough: true,
        window: None,
    };
    // A call sent before the cache denied (or another instance's view): learned all the same.
    cache.learn(&b, &[plenty], 10);
    assert!(cache.is_empty());
    assert!(is_ask(cache.consult(&b, false)));
}

#[test]
fn memory_is_capped_and_useless_entries_make_room() {
    let (cache, clock) = cache(320);
    for i in 0..10_000u64 {
        answer(
            &cache,
            &[bucket(&format!("k{i}"), 1_000.0, 5.0, 1)],
            &[drained(0.0)],
        );
    }
    assert!(cache.len() <= 320, "held {}", cache.len());
    clock.advance_ms(5);
    let new = [bucket("new", 1.0, 5.0, 1)];
    answer(&cache, &new, &[drained(0.0)]);
    assert!(cache.denies(&new).is_some());
}
