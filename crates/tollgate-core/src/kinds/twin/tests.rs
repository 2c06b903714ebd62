use super::*;
use crate::base::rate::count_f64;

const MICROS: u64 = 1_000_000;

fn request(rate: f64, burst: f64, cost: u64) -> BucketRequest {
    BucketRequest::bucket("k", rate, burst).cost(cost)
}

const SECOND: u64 = 1_000_000;

/// A bucket holding `tokens` of `burst`, written `age` µs before `now`.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn stored_at(burst: f64, tokens: f64, now: u64, age: i64) -> Stored {
    Stored {
        debt: ((burst - tokens) * 1e6) as u64,
        ts_us: now.saturating_add_signed(-age),
    }
}

/// (stored tokens, age of the stored state in µs (negative: in the future), rate, burst,
/// cost) → (allowed, tokens after).
#[allow(clippy::type_complexity)]
const CASES: &[(&str, Option<(f64, i64)>, f64, f64, u64, bool, f64)] = &[
    ("absent bucket is full", None, 10.0, 5.0, 1, true, 4.0),
    (
        "refill over one second",
        Some((0.0, 1_000_000)),
        2.0,
        5.0,
        1,
        true,
        1.0,
    ),
    (
        "refill is capped at burst",
        Some((1.0, 3_600_000_000)),
        2.0,
        5.0,
        1,
        true,
        4.0,
    ),
    (
        "fractional rate: 0.5/s after 1s is not enough",
        Some((0.0, 1_000_000)),
        0.5,
        1.0,
        1,
        false,
        0.5,
    ),
    (
        "fractional rate: 0.5/s after 2s is enough",
        Some((0.0, 2_000_000)),
        0.5,
        1.0,
        1,
        true,
        0.0,
    ),
    (
        "cost above one takes several tokens",
        Some((5.0, 0)),
        1.0,
        5.0,
        3,
        true,
        2.0,
    ),
    (
        "cost above the tokens left denies and keeps them",
        Some((2.0, 0)),
        1.0,
        5.0,
        3,
        false,
        2.0,
    ),
    (
        "cost above burst never passes",
        None,
        1.0,
        5.0,
        6,
        false,
        5.0,
    ),
    (
        "clock going backwards adds nothing",
        Some((1.0, -5_000_000)),
        100.0,
        5.0,
        1,
        true,
        0.0,
    ),
];

#[test]
fn bucket_arithmetic_table() {
    let now = 10_000 * SECOND;
    for &(name, stored, rate, burst, cost, allowed, after) in CASES {
        let mut states = [stored.map(|(tokens, age)| stored_at(burst, tokens, now, age))];
        let (ok, outcomes) = decide(&[request(rate, burst, cost)], &mut states, now);
        assert_eq!(ok, allowed, "{name}: allowed");
        assert!(
            (outcomes[0].tokens - after).abs() < 1e-9,
            "{name}: tokens {}",
            outcomes[0].tokens
        );
        if allowed {
            assert_eq!(
                states[0].map(|b| b.ts_us),
                Some(now),
                "{name}: ts persisted"
            );
        }
    }
}

#[test]
fn a_peek_finds_what_the_next_decision_finds_and_writes_nothing() {
    let now = 10_000 * SECOND;
    for &(name, stored, rate, burst, cost, allowed, after) in CASES {
        let stored = stored.map(|(tokens, age)| stored_at(burst, tokens, now, age));
        let request = request(rate, burst, cost);
        let peeked = request.meter.find(&request, stored, now).0;
        assert_eq!(peeked.enough, allowed, "{name}: enough");
        let charged = if allowed { count_f64(cost) } else { 0.0 };
        assert!(
            (peeked.tokens - charged - after).abs() < 1e-9,
            "{name}: peeked {}",
            peeked.tokens
        );
    }
}

#[test]
fn one_denying_bucket_charges_none() {
    let reqs = [request(1.0, 5.0, 1), request(1.0, 5.0, 1)];
    let mut states = [
        None,
        Some(Stored {
            debt: 5 * MICROS,
            ts_us: 0,
        }),
    ];
    let (ok, outcomes) = decide(&reqs, &mut states, 0);
    assert!(!ok);
    assert_eq!(outcomes[0].tokens, 5.0);
    assert!(outcomes[0].enough && !outcomes[1].enough);
}

#[test]
fn a_shadow_bucket_never_denies() {
    let mut shadow = request(1.0, 5.0, 1);
    shadow.shadow = true;
    let reqs = [request(1.0, 5.0, 1), shadow];
    let mut states = [
        None,
        Some(Stored {
            debt: 5 * MICROS,
            ts_us: 0,
        }),
    ];
    let (ok, outcomes) = decide(&reqs, &mut states, 0);
    assert!(ok);
    assert_eq!(outcomes[0].tokens, 4.0);
    assert!(!outcomes[1].enough);
}

#[test]
fn full_at_is_when_the_bucket_refills() {
    let bucket = Stored {
        debt: 4 * MICROS,
        ts_us: 10 * SECOND,
    };
    assert_eq!(bucket.full_at_us(2.0), 12 * SECOND);
}

#[test]
fn a_raised_burst_grants_the_difference_at_once() {
    let mut states = [None];
    for _ in 0..3 {
        assert!(decide(&[request(0.001, 3.0, 1)], &mut states, 0).0);
    }
    assert!(!decide(&[request(0.001, 3.0, 1)], &mut states, 0).0);
    // Burst 3 -> 10 with the same debt of 3: 7 more now.
    let admitted = (0..10)
        .filter(|_| decide(&[request(0.001, 10.0, 1)], &mut states, 0).0)
        .count();
    assert_eq!(admitted, 7);
}

#[test]
fn a_lowered_burst_binds_at_the_next_check() {
    let mut states = [None];
    for _ in 0..2 {
        assert!(decide(&[request(0.001, 10.0, 1)], &mut states, 0).0);
    }
    // Debt 2 of a burst lowered to 3: one more, then denied.
    let (ok, outcomes) = decide(&[request(0.001, 3.0, 1)], &mut states, 0);
    assert!(ok);
    assert_eq!(outcomes[0].tokens, 0.0);
    assert!(!decide(&[request(0.001, 3.0, 1)], &mut states, 0).0);
}

#[test]
fn a_denial_writes_nothing_so_no_refill_is_rounded_away() {
    // 1 token per hour: 0.83 micro-tokens per 3 ms. Checked every 3 ms, a write per check
    // would round each refill down to nothing and the bucket would never refill.
    let rate = 1.0 / 3600.0;
    let mut states = [None];
    assert!(decide(&[request(rate, 1.0, 1)], &mut states, 0).0);
    let mut now = 0;
    let mut admitted = 0;
    while now <= 3_600 * SECOND {
        now += 3_000;
        if decide(&[request(rate, 1.0, 1)], &mut states, now).0 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 1, "refilled once in the hour");
}
