//! The headers of answers served from slices of borrowed tokens (on by default): a request's
//! `X-RateLimit-Remaining` never promises a request the bucket would refuse.

use crate::support::{limit, redis_config, RedisServer, Tollgate, QUIET_POLL};

/// Burst 60, and a rate that refills nothing while the test runs (one token in 1,000 s).
const BURST: usize = 60;

/// Drives key `k` through `instances` in turn until each refused it twice in a row (its
/// slice, if any, used up or given back, and the bucket empty); per answer, the status and
/// the remaining it promised.
fn drain(instances: &[Tollgate]) -> Vec<(u16, usize)> {
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
    answers
}

/// After an answer that says `remaining = r`, at least `r` more requests of the key are
/// admitted (nothing refills meanwhile): a slice's answer shows what is surely there.
fn assert_truthful(answers: &[(u16, usize)], what: &str) {
    let admitted: Vec<usize> = answers
        .iter()
        .map(|&(s, _)| usize::from(s == 200))
        .collect();
    let total: usize = admitted.iter().sum();
    assert!(
        total <= BURST,
        "{what}: {total} admitted of a burst of {BURST}"
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
    let limits = limit("api", 0.001, BURST, &["header:x-api-key"]);
    let config = redis_config(&redis, QUIET_POLL, &limits);
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
