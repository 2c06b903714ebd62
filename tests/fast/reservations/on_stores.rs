//! The reservation scenarios on every store (`support::stores`), and a late settle an earlier
//! release filed.

use super::*;

fn run_scenarios(store: &dyn StoreUnderTest, prefix: &str) {
    let key = format!("{prefix}:settle");
    let (a, b, c) = (
        reserve(&key, 0xa, 4, 60_000, false),
        reserve(&key, 0xb, 4, 60_000, false),
        reserve(&key, 0xc, 4, 60_000, false),
    );
    let step = |request: &BucketRequest| {
        let (allowed, tokens) = decide(store, std::slice::from_ref(request));
        (allowed, whole(tokens[0]))
    };
    assert_eq!(step(&a), (true, 6.0), "the estimate is taken at once");
    assert_eq!(step(&b), (true, 2.0));
    assert_eq!(step(&c), (false, 2.0), "a third estimate does not fit");
    assert_eq!(store.reserved(&a), Reserved { tokens: 8, held: 2 });

    let first = store.settle(&settle(&a, 4, 1));
    assert!(first.held);
    assert_eq!(whole(first.outcome.tokens), 5.0, "3 of 4 given back");
    let again = store.settle(&settle(&a, 4, 1));
    assert!(!again.held, "a retried settle changes nothing");
    assert_eq!(whole(again.outcome.tokens), 5.0);
    let forged = store.settle(&settle(&b, 3, 0));
    assert!(!forged.held, "an id with another estimate names nothing");
    assert_eq!(whole(forged.outcome.tokens), 5.0);
    let over = store.settle(&settle(&b, 4, 9));
    assert!(over.held);
    assert_eq!(
        whole(over.outcome.tokens),
        0.0,
        "5 more than estimated, charged"
    );
    assert_eq!(store.reserved(&a), Reserved::default());
    assert!(!step(&reserve(&key, 0xd, 1, 60_000, false)).0);

    // Past the bound of max_debt, a settle charges down to -max_debt and no further.
    let deep = format!("{prefix}:deep");
    let big = reserve(&deep, 0xe, 10, 60_000, false);
    assert_eq!(step(&big), (true, 0.0));
    let settled = store.settle(&settle(&big, 10, 1_000));
    assert!(settled.held);
    assert_eq!(whole(settled.outcome.tokens), -BURST);

    // All or nothing with the other limits: a denied request holds no reservation.
    let tight = format!("{prefix}:tight");
    let drained = BucketRequest::bucket(tight, RATE, 1.0).limit(1);
    assert!(decide(store, std::slice::from_ref(&drained)).0);
    let pair = [
        reserve(&format!("{prefix}:pair"), 0xf, 2, 60_000, false),
        drained,
    ];
    let (allowed, tokens) = decide(store, &pair);
    assert!(!allowed);
    assert_eq!(
        whole(tokens[0]),
        BURST,
        "nothing taken from the reserving bucket"
    );
    assert_eq!(store.reserved(&pair[0]), Reserved::default());

    // Unsettled past its ttl: kept (the default) or given back.
    let kept = reserve(&format!("{prefix}:kept"), 0x10, 4, 40, false);
    let refunded = reserve(&format!("{prefix}:refunded"), 0x11, 4, 40, true);
    assert_eq!(step(&kept), (true, 6.0));
    assert_eq!(step(&refunded), (true, 6.0));
    store.pass(40);
    assert_eq!(store.reserved(&kept), Reserved::default());
    assert_eq!(store.reserved(&refunded), Reserved::default());
    assert_eq!(whole(peek(store, &kept)), 6.0, "the estimate is kept");
    assert_eq!(
        whole(peek(store, &refunded)),
        BURST,
        "the estimate comes back"
    );
    let next = reserve(&format!("{prefix}:refunded"), 0x12, 4, 40, true);
    assert_eq!(
        step(&next),
        (true, 6.0),
        "the next check finds it given back"
    );

    // The request outlived its reservation: its settle still applies the difference, once.
    // Kept: the estimate stood, so the difference is charged (or given back).
    let late = store.settle(&settle(&kept, 4, 7));
    assert!(late.held, "an expired reservation is still settled, late");
    assert_eq!(
        whole(late.outcome.tokens),
        3.0,
        "3 above the estimate, charged"
    );
    let again = store.settle(&settle(&kept, 4, 7));
    assert!(!again.held, "a late settle applies once");
    assert_eq!(whole(again.outcome.tokens), 3.0);
    // Given back: the whole actual cost is charged.
    let late = store.settle(&settle(&refunded, 4, 5));
    assert!(
        late.held,
        "an expired, refunded reservation is still settled"
    );
    assert_eq!(
        whole(late.outcome.tokens),
        1.0,
        "5 charged, the estimate long given back"
    );
    let again = store.settle(&settle(&refunded, 4, 5));
    assert!(!again.held, "a late settle applies once");
    assert_eq!(whole(again.outcome.tokens), 1.0);
    // A late settle below the estimate gives the difference back, and never more.
    let cheap = reserve(&format!("{prefix}:cheap"), 0x13, 4, 40, false);
    assert_eq!(step(&cheap), (true, 6.0));
    store.pass(40);
    let late = store.settle(&settle(&cheap, 4, 1));
    assert!(late.held);
    assert_eq!(whole(late.outcome.tokens), 9.0, "3 of 4 given back");
    assert!(!store.settle(&settle(&cheap, 4, 0)).held);
    assert_eq!(whole(peek(store, &cheap)), 9.0);
}

/// A late settle applies what the expiry did, whatever mode the settling instance (reloaded
/// since, or another instance) runs: given back at expiry, the whole actual cost is charged;
/// kept, the difference applies. Never the estimate back a second time, never kept twice.
fn late_settles_follow_what_the_expiry_did(store: &dyn StoreUnderTest, prefix: &str) {
    let step = |request: &BucketRequest| {
        let (allowed, tokens) = decide(store, std::slice::from_ref(request));
        (allowed, whole(tokens[0]))
    };
    // Given back under 'refund', settled under 'keep'.
    let key = format!("{prefix}:refunded-then-keep");
    let first = reserve(&key, 0x20, 4, 40, true);
    assert_eq!(step(&first), (true, 6.0));
    store.pass(40);
    // The next check sweeps the first: 4 back, 4 taken.
    assert_eq!(step(&reserve(&key, 0x21, 4, 60_000, true)), (true, 6.0));
    let kept_now = reserve(&key, 0x20, 4, 40, false);
    let late = store.settle(&settle(&kept_now, 4, 1));
    assert!(late.held, "settled late");
    assert_eq!(
        whole(late.outcome.tokens),
        5.0,
        "1 charged: the estimate was given back at expiry, not again now"
    );
    // Kept under 'keep', settled under 'refund'.
    let key = format!("{prefix}:kept-then-refund");
    let first = reserve(&key, 0x22, 4, 40, false);
    assert_eq!(step(&first), (true, 6.0));
    store.pass(40);
    assert_eq!(step(&reserve(&key, 0x23, 4, 60_000, false)), (true, 2.0));
    let refund_now = reserve(&key, 0x22, 4, 40, true);
    let late = store.settle(&settle(&refund_now, 4, 1));
    assert!(late.held, "settled late");
    assert_eq!(
        whole(late.outcome.tokens),
        5.0,
        "3 of the kept 4 given back: the request cost 1, not 5"
    );
}

/// A bucket keeps at most MAX_LATE_SETTLES expired reservations for a late settle, the
/// oldest dropped first: settling one of those changes nothing (its expiry's outcome stands).
fn late_settles_are_bounded_per_bucket(store: &dyn StoreUnderTest, prefix: &str) {
    let key = format!("{prefix}:many");
    let burst = (MAX_LATE_SETTLES + 1) as f64;
    let one = |id: u128| BucketRequest {
        burst,
        ..reserve(&key, id, 1, 40, false)
    };
    // The oldest first, then the rest together.
    assert!(decide(store, std::slice::from_ref(&one(0))).0);
    store.pass(1);
    let rest: Vec<BucketRequest> = (1..=MAX_LATE_SETTLES as u128).map(one).collect();
    assert_eq!(store.decide_each(&rest), MAX_LATE_SETTLES);
    store.pass(40);
    let settle = |id: u128| Settle {
        max_debt: 0.0,
        ..settle(&one(id), 1, 0)
    };
    let newest = store.settle(&settle(MAX_LATE_SETTLES as u128));
    assert!(newest.held, "the newest expired reservation settles late");
    let oldest = store.settle(&settle(0));
    assert!(!oldest.held, "past the cap, the oldest is gone");
    // Nothing but refill between the two calls: on Redis, real time passes at 0.001 token a
    // second (0.001 after half a second on a loaded machine); a settle would move whole tokens.
    let moved = oldest.outcome.tokens - newest.outcome.tokens;
    assert!(
        (-1e-9..0.5).contains(&moved),
        "and changes nothing: {} then {}",
        newest.outcome.tokens,
        oldest.outcome.tokens
    );
}

/// The scenarios above, on one store.
fn reservation_scenarios(store: &dyn StoreUnderTest) {
    let prefix = store.name();
    run_scenarios(store, prefix);
    late_settles_follow_what_the_expiry_did(store, prefix);
    late_settles_are_bounded_per_bucket(store, prefix);
}

every_store!(reservation_scenarios);

/// An expired reservation filed by an earlier release, without the flag saying what its expiry
/// did, settles as given back: the whole actual cost is charged and nothing is returned, so an
/// estimate that may have come back already never comes back twice.
fn unflagged_late_settles_charge_the_actual_cost(store: &Redis) {
    let key = "redis:unflagged";
    let first = reserve(key, 0x30, 4, 40, false);
    assert!(decide(store, std::slice::from_ref(&first)).0);
    store.pass(40);
    // A check sweeps the first (kept): 10 - 4 - 4.
    assert!(decide(store, &[reserve(key, 0x31, 4, 60_000, false)]).0);
    let late = format!("{key}:x");
    let member = format!("{:032x}:4", 0x30);
    let filed = store.server.cli(&["ZSCORE", &late, &format!("{member}:k")]);
    let score = filed.trim();
    assert!(score.parse::<f64>().is_ok(), "filed as kept: {filed:?}");
    // As the earlier release filed it.
    store.server.cli(&["ZREM", &late, &format!("{member}:k")]);
    store.server.cli(&["ZADD", &late, score, &member]);
    let settled = store.settle(&settle(&first, 4, 1));
    assert!(
        settled.held,
        "an unflagged expired reservation still settles"
    );
    assert_eq!(
        whole(settled.outcome.tokens),
        1.0,
        "its actual cost charged, nothing given back"
    );
    assert!(!store.settle(&settle(&first, 4, 1)).held, "once");
}

#[test]
fn unflagged_late_settles_charge_the_actual_cost_on_redis() {
    unflagged_late_settles_charge_the_actual_cost(&Redis::start());
}
