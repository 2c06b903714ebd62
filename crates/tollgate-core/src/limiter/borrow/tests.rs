use super::*;
use crate::base::clock::ManualClock;

fn bucket(key: &str) -> BucketRequest {
    BucketRequest::bucket(key, 100.0, 200.0)
}

fn lender() -> (Lender, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    clock.set_us(10_000_000);
    let lender = Lender::with_clock(64, 100_000, clock.clone()).with_min_demand(2);
    (lender, clock)
}

/// A store call's requests and when it was planned, the ask left in flight (answered
/// below through `Lender::learn`, as `Asking::learn` answers).
fn asked(plan: Plan<'_>) -> (Vec<BucketRequest>, u64) {
    match plan {
        Plan::Store(mut asking) => {
            asking.open = false;
            (std::mem::take(&mut asking.buckets), asking.sent_us)
        }
        Plan::Local(_) => panic!("expected a store call"),
    }
}

fn want_of(request: &BucketRequest) -> u64 {
    request.meter.borrow().map_or(0, |borrow| borrow.want)
}

#[test]
fn a_cold_key_asks_for_nothing_and_a_hot_one_for_its_last_horizon() {
    let (lender, clock) = lender();
    let b = [bucket("k")];
    let (first, _) = asked(lender.plan(&b, &[true]).0);
    assert_eq!(want_of(&first[0]), 0, "one request: a cold key");
    clock.advance_us(20_000);
    let (second, sent) = asked(lender.plan(&b, &[true]).0);
    assert_eq!(
        want_of(&second[0]),
        5,
        "two 20 ms apart: five a horizon at that pace"
    );
    // Asking: the next calls ask for nothing until it answers.
    for _ in 0..3 {
        let (again, _) = asked_again(&lender, &b);
        assert_eq!(want_of(&again[0]), 0);
    }
    lender.learn(&second, &[], sent);
    clock.advance_us(100_000);
    let (asked, _) = asked(lender.plan(&b, &[true]).0);
    assert_eq!(want_of(&asked[0]), 5, "five seen in the last horizon");
    clock.advance_us(250_000);
    let (cold, _) = asked_again(&lender, &b);
    assert_eq!(
        want_of(&cold[0]),
        0,
        "nothing in the last two horizons: cold again"
    );
}

#[test]
fn an_ask_dropped_unanswered_lets_the_next_call_ask() {
    let (lender, clock) = lender();
    let b = [bucket("k")];
    let (cold, _) = asked(lender.plan(&b, &[true]).0);
    assert_eq!(want_of(&cold[0]), 0);
    clock.advance_us(50_000);
    let (plan, _) = lender.plan(&b, &[true]);
    let Plan::Store(asking) = plan else {
        panic!("expected a store call")
    };
    assert_eq!(want_of(&asking.buckets()[0]), 2);
    // The store failed, or the check was cancelled: no answer comes.
    drop(asking);
    let (again, _) = asked_again(&lender, &b);
    assert_eq!(
        want_of(&again[0]),
        4,
        "asks again at once (three in 50 ms: four a horizon)"
    );
}

fn asked_again(lender: &Lender, b: &[BucketRequest]) -> (Vec<BucketRequest>, u64) {
    asked(lender.plan(b, &[true]).0)
}

fn grid_of(request: &BucketRequest) -> Option<u64> {
    let borrow = request.meter.borrow()?;
    (borrow.want > 0).then_some(borrow.grid_us)
}

#[test]
fn rungs_are_ten_times_apart_up_to_the_longest() {
    let clock = Arc::new(ManualClock::default());
    let rungs = |horizon_us, longest_us| {
        Lender::with_clock(64, horizon_us, clock.clone())
            .with_longest_horizon(longest_us)
            .grids()
            .to_vec()
    };
    assert_eq!(rungs(100_000, 100_000), [100_000]);
    assert_eq!(rungs(100_000, 10_000_000), [100_000, 1_000_000, 10_000_000]);
    assert_eq!(rungs(100_000, 5_000_000), [100_000, 1_000_000, 5_000_000]);
    assert_eq!(
        rungs(10_000, 60_000_000),
        [10_000, 100_000, 1_000_000, 10_000_000],
        "at most four"
    );
}

#[test]
fn a_key_too_slow_for_the_horizon_borrows_on_the_shortest_rung_it_fills() {
    let clock = Arc::new(ManualClock::default());
    clock.set_us(10_000_000);
    let lender = Lender::with_clock(64, 100_000, clock.clone())
        .with_longest_horizon(10_000_000)
        .with_min_demand(3);
    let b = [bucket("slow")];
    // One request every 200 ms: never 3 in 100 ms; in a second, a pace of 5 from the second.
    let mut grids = Vec::new();
    for _ in 0..4 {
        let (call, sent) = asked(lender.plan(&b, &[true]).0);
        grids.push(grid_of(&call[0]));
        lender.learn(&call, &[], sent);
        clock.advance_us(200_000);
    }
    assert_eq!(
        grids,
        [None, Some(1_000_000), Some(1_000_000), Some(1_000_000)]
    );
    // The same key, now hot: three in one short horizon borrow on it.
    for _ in 0..2 {
        let (call, sent) = asked(lender.plan(&b, &[true]).0);
        lender.learn(&call, &[], sent);
    }
    let (call, _) = asked(lender.plan(&b, &[true]).0);
    assert_eq!(grid_of(&call[0]), Some(100_000));
    assert_eq!(
        want_of(&call[0]),
        10,
        "three at once: its pace over the short horizon, at most what it refills"
    );
}

#[test]
fn a_slice_serves_until_half_way_to_its_deadline_then_goes_back() {
    let (lender, clock) = lender();
    let b = [bucket("k")];
    let (asked, sent) = asked(lender.plan(&b, &[true]).0);
    let slice = Slice {
        bucket: 0,
        tokens: 3,
        deadline_us: 1_200_000,
        now_us: 1_000_000,
        incarnation: 900_000,
    };
    assert_eq!(lender.learn(&asked, &[slice], sent), 3);
    for left in [2.0, 1.0, 0.0] {
        match lender.plan(&b, &[true]).0 {
            Plan::Local(tokens) => assert_eq!(tokens, vec![left]),
            Plan::Store(_) => panic!("served from the slice"),
        }
    }
    let (asked, _) = asked_again(&lender, &b);
    let Some(borrow) = asked[0].meter.borrow() else {
        panic!("a borrowing request")
    };
    assert_eq!(
        borrow.give,
        Some(GiveBack {
            deadline_us: 1_200_000,
            taken: 3,
            unused: 0,
            incarnation: 900_000,
        })
    );
    // A new slice, then time passes beyond half the way to its deadline: not used.
    lender.learn(&asked, &[slice], clock.now_us());
    clock.advance_us(99_900);
    assert!(matches!(lender.plan(&b, &[true]).0, Plan::Store(_)));
}

#[test]
fn a_request_is_served_locally_only_when_every_bucket_can_be() {
    let (lender, _) = lender();
    let b = [bucket("a"), bucket("b")];
    let (asked, sent) = asked(lender.plan(&b, &[true, true]).0);
    let slice = |i| Slice {
        bucket: i,
        tokens: 2,
        deadline_us: 1_200_000,
        now_us: 1_000_000,
        incarnation: 900_000,
    };
    lender.learn(&asked, &[slice(0)], sent);
    // "a" holds 2, "b" nothing: to the store, "a"'s slice given back whole.
    let (asked, _) = asked_again(&lender, &b);
    let Some(borrow) = asked[0].meter.borrow() else {
        panic!()
    };
    assert_eq!(borrow.give.map(|g| g.unused), Some(2));
    assert_eq!(lender.held("a"), 0);
    // A limit that does not borrow sends the whole request to the store.
    assert!(matches!(lender.plan(&b, &[true, false]).0, Plan::Store(_)));
}

#[test]
fn a_put_back_never_reaches_a_slice_that_replaced_the_one_paid_from() {
    let (lender, _) = lender();
    let a = [bucket("a")];
    let (asked, sent) = asked(lender.plan(&a, &[true]).0);
    let slice = Slice {
        bucket: 0,
        tokens: 4,
        deadline_us: 1_200_000,
        now_us: 1_000_000,
        incarnation: 900_000,
    };
    lender.learn(&asked, &[slice], sent);
    // A check of "a" and "b" pays from "a"'s slice; meanwhile "a"'s slice is replaced by
    // one partly used. "b" cannot pay: the token goes back to the slice it came from only.
    let id = lender
        .shard("a")
        .keys
        .get("a")
        .and_then(|h| h.slice)
        .map(|h| h.id);
    lender.learn(&asked, &[slice], sent);
    let _ = lender.serve_all(&a, &[true]);
    lender.put_back(&a[0], id.unwrap_or_default());
    assert_eq!(lender.held("a"), 3, "the new slice keeps what it had");
}

#[test]
fn a_changed_rate_or_burst_does_not_use_the_old_slice() {
    let (lender, _) = lender();
    let b = [bucket("k")];
    let (asked, sent) = asked(lender.plan(&b, &[true]).0);
    let slice = Slice {
        bucket: 0,
        tokens: 5,
        deadline_us: 1_200_000,
        now_us: 1_000_000,
        incarnation: 900_000,
    };
    lender.learn(&asked, &[slice], sent);
    let lowered = [BucketRequest {
        burst: 50.0,
        ..bucket("k")
    }];
    assert!(matches!(lender.plan(&lowered, &[true]).0, Plan::Store(_)));
    lender.learn(&asked, &[slice], sent);
    lender.forget("k");
    assert!(matches!(lender.plan(&b, &[true]).0, Plan::Store(_)));
}

#[test]
fn a_put_back_never_reaches_a_slice_installed_after_a_reset() {
    // A token served from a key's first slice is put back (the request's other limit
    // refused) after a reset dropped the key and a second slice was installed: it must not
    // land in the second slice, which never paid for it.
    let (lender, _) = lender();
    let b = [bucket("k")];
    let slice = Slice {
        bucket: 0,
        tokens: 3,
        deadline_us: 1_200_000,
        now_us: 1_000_000,
        incarnation: 900_000,
    };
    let install = || {
        asked(lender.plan(&b, &[true]).0);
        let (asked, sent) = asked(lender.plan(&b, &[true]).0);
        assert_eq!(lender.learn(&asked, &[slice], sent), 3);
    };
    install();
    let first = lender.shard("k").keys["k"].slice.expect("a slice").id;
    lender.forget("k");
    install();
    assert_eq!(
        lender.serve(&b, 0),
        Some(vec![2.0]),
        "served from the second slice"
    );
    lender.put_back(&b[0], first);
    assert_eq!(lender.held("k"), 2, "the first slice's token went nowhere");
}

/// A slice of 3 taken by a request that asked for 10 on the 100 ms horizon; usable until
/// 100 ms after it was sent (a deadline 200 ms ahead).
fn take_three(lender: &Lender) -> Slice {
    let b = [bucket("k")];
    let _ = asked(lender.plan(&b, &[true]).0);
    let (asked, sent) = asked(lender.plan(&b, &[true]).0);
    assert_eq!(
        want_of(&asked[0]),
        10,
        "two at once: the pace of a tenth of the horizon"
    );
    let slice = Slice {
        bucket: 0,
        tokens: 3,
        deadline_us: 1_200_000,
        now_us: 1_000_000,
        incarnation: 900_000,
    };
    assert_eq!(lender.learn(&asked, &[slice], sent), 3);
    slice
}

#[test]
fn a_quiet_keys_slice_goes_back_a_quarter_of_a_horizon_before_its_group_ends() {
    let (lender, clock) = lender();
    take_three(&lender);
    assert!(matches!(
        lender.plan(&[bucket("k")], &[true]).0,
        Plan::Local(_)
    ));
    // Usable until 100 ms minus the padding; its group ends 200 ms (less the padding) after
    // the call was sent: due a quarter horizon before that.
    clock.advance_us(170_000);
    assert!(matches!(
        lender.plan(&[bucket("other")], &[true]).0,
        Plan::Store(_)
    ));
    assert!(lender.quiet(10).requests.is_empty(), "not due yet");
    clock.advance_us(5_000);
    let quiet = lender.quiet(10);
    assert_eq!(quiet.unused, 2);
    let [request] = quiet.requests.as_slice() else {
        panic!("one give-back: {:?}", quiet.requests)
    };
    assert_eq!((request.key.as_str(), request.cost), ("k", 0));
    let borrow = request.meter.borrow().expect("a borrowing request");
    assert_eq!(
        (borrow.want, borrow.grid_us, borrow.give),
        (
            0,
            100_000,
            Some(GiveBack {
                deadline_us: 1_200_000,
                taken: 3,
                unused: 2,
                incarnation: 900_000,
            })
        )
    );
    assert!(lender.quiet(10).requests.is_empty(), "given back once");
    let (next, _) = asked_again(&lender, &[bucket("k")]);
    assert_eq!(
        next[0].meter.borrow().and_then(|b| b.give),
        None,
        "the next request has nothing left to give back"
    );
}

#[test]
fn a_slice_a_request_gave_back_or_used_up_is_not_given_back_again() {
    let (lender, clock) = lender();
    take_three(&lender);
    clock.advance_us(100_000);
    let (asked, _) = asked_again(&lender, &[bucket("k")]);
    assert!(asked[0].meter.borrow().and_then(|b| b.give).is_some());
    clock.advance_us(1_000_000);
    assert!(
        lender.quiet(10).requests.is_empty(),
        "a request gave it back"
    );

    take_three(&lender);
    for _ in 0..3 {
        assert!(matches!(
            lender.plan(&[bucket("k")], &[true]).0,
            Plan::Local(_)
        ));
    }
    clock.advance_us(1_000_000);
    let quiet = lender.quiet(10);
    assert!(
        quiet.requests.is_empty() && quiet.unused == 0,
        "every token used: nothing to give back"
    );
}

#[test]
fn a_slice_is_at_most_a_horizon_s_refill_or_a_64th_of_the_burst() {
    let (lender, _) = lender();
    let slow = BucketRequest::bucket("slow", 0.01, 15.0);
    let modest = BucketRequest::bucket("modest", 30.0, 200.0);
    // Each ask dropped unanswered, so the next may ask.
    for _ in 0..20 {
        drop(lender.plan(std::slice::from_ref(&slow), &[true]));
    }
    let (asked, _) = asked_again(&lender, std::slice::from_ref(&slow));
    assert_eq!(want_of(&asked[0]), 0, "0.01/s refills nothing in 10 s");
    for _ in 0..20 {
        drop(lender.plan(std::slice::from_ref(&modest), &[true]));
    }
    let (asked, _) = asked_again(&lender, std::slice::from_ref(&modest));
    assert_eq!(want_of(&asked[0]), 3, "30/s refills 3 in 100 ms");
    let large = BucketRequest::bucket("large", 30.0, 6_400.0);
    for _ in 0..20 {
        drop(lender.plan(std::slice::from_ref(&large), &[true]));
    }
    let (asked, _) = asked_again(&lender, std::slice::from_ref(&large));
    assert_eq!(
        want_of(&asked[0]),
        100,
        "a 64th of a large burst: 21 at once, a pace of 200 a horizon, at most 100"
    );
}
