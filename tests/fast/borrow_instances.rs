//! Borrowed tokens (on by default) through tollgate processes: the headers of answers served
//! from slices (`X-RateLimit-Remaining` never promises a request the bucket would refuse),
//! and a quiet key's last slice given back without a request.

use std::time::{Duration, Instant};

use crate::support::{limit, redis_config, wait_until, RedisServer, Tollgate};

/// Burst 60, and a rate of one token a second: slices are at most what the bucket refills
/// over their horizon, so the horizon is 10 s (slices of up to 10), and the drain refills
/// about a token.
const BURST: usize = 60;
const RATE: f64 = 1.0;
const TEN_SECOND_HORIZON: &str =
    "override_poll_ms = 60000\nborrow_horizon_ms = 10000\nborrow_longest_horizon_ms = 10000";

/// Drives key `k` through `instances` in turn until each refused it twice in a row (its
/// slice, if any, used up or given back, and the bucket empty); per answer, the status and
/// the remaining it promised, and the tokens refilled at most meanwhile.
fn drain(instances: &[Tollgate]) -> (Vec<(u16, usize)>, usize) {
    let began = Instant::now();
    let mut clients: Vec<_> = instances.iter().map(Tollgate::client).collect();
    let mut answers = Vec::new();
    let (mut refused, n) = (0, clients.len());
    for i in 0..4 * BURST {
        let client = &mut clients[i % n];
        let answer = client
            .get("/check", &[("x-api-key", "k")])
            .expect("answered");
        let remaining = answer
            .header("x-ratelimit-remaining")
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("answer {i}: no remaining: {:?}", answer.status));
        answers.push((answer.status, remaining));
        refused = if answer.status == 200 { 0 } else { refused + 1 };
        if refused == 2 * n {
            break;
        }
    }
    // Read after the last answer: at least the time the drain took.
    let refilled = (RATE * began.elapsed().as_secs_f64()).ceil() as usize;
    (answers, refilled)
}

/// After an answer that says `remaining = r`, at least `r` more requests of the key are
/// admitted: a slice's answer shows what is surely there.
fn assert_truthful((answers, refilled): &(Vec<(u16, usize)>, usize), what: &str) {
    let admitted: Vec<usize> = answers
        .iter()
        .map(|&(s, _)| usize::from(s == 200))
        .collect();
    let total: usize = admitted.iter().sum();
    assert!(
        total <= BURST + refilled,
        "{what}: {total} admitted of a burst of {BURST} and {refilled} refilled"
    );
    assert!(
        total >= BURST - 1,
        "{what}: only {total} of {BURST} admitted"
    );
    let mut after = total;
    for (i, &(status, remaining)) in answers.iter().enumerate() {
        after -= admitted[i];
        assert!(
            remaining <= after,
            "{what}: answer {i} ({status}) promised {remaining}, {after} more were admitted: \
             {answers:?}"
        );
    }
}

#[test]
fn remaining_never_promises_what_the_bucket_would_refuse() {
    let redis = RedisServer::start();
    let limits = limit("api", RATE, BURST, &["header:x-api-key"]);
    let config = redis_config(&redis, TEN_SECOND_HORIZON, &limits);
    let one = [Tollgate::start(&config)];
    let answers = drain(&one);
    assert_truthful(&answers, "one instance");
    let used = one[0].metric("tollgate_borrowed_tokens_total{event=\"used\"}");
    assert!(used > 0.0, "answers were served from slices");

    // Two instances taking turns: each one's slice answers with its own remaining only.
    redis.cli(&["FLUSHALL"]);
    let two = [Tollgate::start(&config), Tollgate::start(&config)];
    let answers = drain(&two);
    assert_truthful(&answers, "two instances");
}

/// The tokens slices hold in the bucket records of `redis`: a record is
/// `v1:<debt> <ts>[ <deadline> <micro-tokens>]... i<incarnation>`.
fn held_in(redis: &RedisServer) -> u64 {
    let mut held = 0;
    for key in redis.cli(&["KEYS", "*"]).lines() {
        let value = redis.cli(&["GET", key]);
        let Some(record) = value.trim().strip_prefix("v1:") else {
            continue;
        };
        let fields: Vec<&str> = record.split(' ').filter(|f| !f.starts_with('i')).collect();
        held += fields
            .iter()
            .skip(3)
            .step_by(2)
            .map(|micro| micro.parse::<u64>().expect("micro-tokens") / 1_000_000)
            .sum::<u64>();
    }
    held
}

#[test]
fn a_quiet_keys_last_slice_goes_back_without_a_request() {
    let redis = RedisServer::start();
    // A 1 s horizon: a slice is used for at most half a second or so, then given back an
    // quarter of a horizon later; its group ends 1 to 2 s after it was taken.
    let store =
        "override_poll_ms = 60000\nborrow_horizon_ms = 1000\nborrow_longest_horizon_ms = 1000";
    let limits = limit("api", 100, 1000, &["header:x-api-key"]);
    let tollgate = Tollgate::start(&redis_config(&redis, store, &limits));
    let mut client = tollgate.client();
    for i in 0..20 {
        let answer = client
            .get("/check", &[("x-api-key", "k")])
            .expect("answered");
        assert_eq!(answer.status, 200, "request {i}");
    }
    let borrowed = tollgate.metric("tollgate_borrowed_tokens_total{event=\"borrowed\"}");
    let used = tollgate.metric("tollgate_borrowed_tokens_total{event=\"used\"}");
    assert!(
        borrowed > used,
        "a slice with tokens left: borrowed {borrowed}, used {used}"
    );
    assert!(held_in(&redis) > 0, "the bucket holds the slice's tokens");

    // No request comes: the instance gives back what it did not use, on its own timer.
    let returned = || tollgate.metric("tollgate_borrowed_tokens_total{event=\"returned\"}");
    assert!(
        wait_until(Duration::from_secs(10), || returned() >= borrowed - used),
        "unused tokens given back: {} of {}",
        returned(),
        borrowed - used
    );
    assert_eq!(
        held_in(&redis),
        0,
        "no token held until the group ends: the give-back un-held them"
    );
}
