use proptest::prelude::*;

use super::*;

/// A report of one bucket: the holder's only member, last sent what the pool says it was.
fn request(pool: &Pool, holder: &str, requests: u64) -> ShareRequest {
    ShareRequest {
        key: "pool".into(),
        holder: holder.into(),
        rate_units: 1000,
        size_units: 100,
        reserve_rate: 50,
        reserve_size: 5,
        fill_interval_s: 100,
        hold_us: 11_000_000,
        max_holders: 1024,
        members: vec![Member {
            reported: true,
            requests,
            last: last_sent(pool, holder),
        }],
    }
}

/// What a one-member holder was last sent, read from its newest steps.
fn last_sent(pool: &Pool, holder: &str) -> Sent {
    pool.holders
        .iter()
        .find(|(id, _)| id == holder)
        .and_then(|(_, h)| {
            let (rate, _) = *h.rate_steps.last()?;
            let (size, until_us) = *h.size_steps.last()?;
            Some(Sent {
                rate,
                size,
                until_us,
            })
        })
        .unwrap_or_default()
}

#[test]
fn a_single_envoy_gets_all_but_the_reserve() {
    let mut pool = Pool::default();
    let ask = request(&pool, "a", 100);
    let grant = allocate(&mut pool, &ask, 1_000_000);
    assert_eq!((grant.rate, grant.size), (950, 95));
    assert_eq!(grant.members, vec![(950, 95)]);
    let ask = request(&pool, "a", 100);
    let grant = allocate(&mut pool, &ask, 6_000_000);
    assert_eq!((grant.rate, grant.size), (950, 95));
}

#[test]
fn a_cut_counts_until_the_assignment_it_replaces_expires() {
    let mut pool = Pool::default();
    let mut report = |holder: &str, requests: u64, now: u64| {
        let ask = request(&pool, holder, requests);
        allocate(&mut pool, &ask, now)
    };
    report("a", 1000, 0);
    // b arrives: only the reserve is free, and a newcomer takes half of it.
    let b = report("b", 1000, 1_000_000);
    assert_eq!((b.rate, b.size), (25, 2));
    // a reports: its target is half; it is cut at once...
    let a = report("a", 1000, 5_000_000);
    assert_eq!(a.rate, 475);
    // ...but its old 950 counts until 11 s: b cannot grow before.
    let b = report("b", 1000, 6_000_000);
    assert_eq!(b.rate, 50);
    let b = report("b", 1000, 11_000_001);
    assert_eq!(b.rate, 475);
    assert!(b.counted_rate <= 1000);
}

#[test]
fn a_holders_grant_is_split_among_its_buckets_by_their_requests() {
    let mut pool = Pool::default();
    let member = |requests| Member {
        reported: true,
        requests,
        last: Sent::default(),
    };
    let ask = ShareRequest {
        members: vec![member(299), member(99), member(0)],
        ..request(&pool, "a", 0)
    };
    let grant = allocate(&mut pool, &ask, 1_000_000);
    // One unit each, then 947 and 92 in proportion to 300 : 100 : 1, floored.
    assert_eq!(grant.members, vec![(709, 69), (237, 23), (3, 1)]);
    assert_eq!((grant.rate, grant.size), (949, 93));
    assert_eq!(pool.holders.len(), 1, "one holder for the three buckets");
}

#[test]
fn a_silent_bucket_keeps_its_part_within_the_holders_share() {
    let mut pool = Pool::default();
    let first = ShareRequest {
        members: vec![
            Member {
                reported: true,
                requests: 10,
                last: Sent::default(),
            },
            Member {
                reported: true,
                requests: 10,
                last: Sent::default(),
            },
        ],
        ..request(&pool, "a", 0)
    };
    let grant = allocate(&mut pool, &first, 1_000_000);
    let (rate, size) = grant.members[1];
    // Only the first bucket reports next: the second still holds its part until it expires.
    let until_us = grant.now_us + first.hold_us;
    let next = ShareRequest {
        members: vec![
            Member {
                reported: true,
                requests: 10,
                last: Sent {
                    rate: grant.members[0].0,
                    size: grant.members[0].1,
                    until_us,
                },
            },
            Member {
                reported: false,
                requests: 0,
                last: Sent {
                    rate,
                    size,
                    until_us,
                },
            },
        ],
        ..first.clone()
    };
    let again = allocate(&mut pool, &next, 6_000_000);
    assert_eq!(again.members.len(), 1);
    assert_eq!(again.members[0].0 + rate, again.rate);
    assert!(again.rate <= 950 && again.size <= 95, "{again:?}");
}

#[test]
fn demand_counts_up_to_four_times_the_pools_rate() {
    let mut pool = Pool::default();
    // 1000 units per 100 s: 10 requests per second; a report of any size is at most 40/s.
    let ask = request(&pool, "liar", u64::MAX);
    allocate(&mut pool, &ask, 1_000_000);
    let liar = pool.holders[0].1.demand_milli;
    assert_eq!(liar, 40_000);
}

/// The escrow's refill as it was first written: every stretch sums every holder again.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the same double operations as the script"
)]
fn refilled_by_rescanning(
    e: Escrow,
    holders: &[(String, Holding)],
    request: &ShareRequest,
    now_us: u64,
) -> u64 {
    let cap_at = |t: u64| -> f64 {
        let used = holders
            .iter()
            .map(|(_, h)| level(&h.size_steps, t))
            .fold(0u64, u64::saturating_add);
        request
            .size_units
            .saturating_sub(used)
            .saturating_mul(MICRO) as f64
    };
    let rate_at = |t: u64, refilling_only: bool| -> u64 {
        holders
            .iter()
            .filter(|(_, h)| !refilling_only || level(&h.size_steps, t) > 0)
            .map(|(_, h)| level(&h.rate_steps, t))
            .fold(0u64, u64::saturating_add)
    };
    let ceiling = e
        .free_rate
        .saturating_add(rate_at(e.at_us, false))
        .min(request.rate_units);
    let fill = request.fill_interval_s.max(1) as f64;
    let mut times: Vec<u64> = holders
        .iter()
        .flat_map(|(_, h)| h.rate_steps.iter().chain(&h.size_steps))
        .map(|(_, until)| *until)
        .filter(|until| *until > e.at_us && *until < now_us)
        .collect();
    times.sort_unstable();
    times.dedup();
    times.push(now_us);
    let mut tokens = e.micro as f64;
    let mut t = e.at_us;
    for tau in times {
        let free = ceiling.saturating_sub(rate_at(t, true));
        let refill = (free as f64 * tau.saturating_sub(t) as f64 / fill).floor();
        tokens = (tokens + refill).min(cap_at(t));
        t = tau;
    }
    tokens.min(cap_at(now_us)) as u64
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The sweep reaches the tokens rescanning every holder at every expiry reached.
    #[test]
    fn the_sweep_refills_as_rescanning_does(
        holders in prop::collection::vec(
            (
                prop::collection::vec((0u64..500, 0u64..40), 0..5),
                prop::collection::vec((0u64..60, 0u64..40), 0..5),
            ),
            0..8,
        ),
        escrow in (0u64..60_000_000, 0u64..1000, 0u64..20),
        units in (1u64..1000, 1u64..60),
        now in 0u64..45,
    ) {
        let s = 1_000_000;
        let staircase = |steps: Vec<(u64, u64)>| -> Vec<(u64, u64)> {
            let mut steps: Vec<(u64, u64)> = steps.into_iter().map(|(u, t)| (u, t * s)).collect();
            steps.sort_by_key(|(_, t)| *t);
            steps
        };
        let holders: Vec<(String, Holding)> = holders
            .into_iter()
            .enumerate()
            .map(|(i, (rate, size))| {
                (format!("h.{i}"), Holding {
                    rate_steps: staircase(rate),
                    size_steps: staircase(size),
                    ..Holding::default()
                })
            })
            .collect();
        let e = Escrow { micro: escrow.0, free_rate: escrow.1, at_us: escrow.2 * s };
        let ask = ShareRequest {
            rate_units: units.0,
            size_units: units.1,
            ..request(&Pool::default(), "x", 0)
        };
        prop_assert_eq!(
            escrow::refilled(Some(e), false, &holders, &ask, now * s),
            refilled_by_rescanning(e, &holders, &ask, now * s)
        );
    }
}

/// A pool of `max_holders` live holders gives a newcomer nothing and stays as it was; once a
/// holder has lapsed, the newcomer takes its place.
#[test]
fn a_full_pool_gives_a_newcomer_nothing_until_a_holder_lapses() {
    let mut pool = Pool::default();
    let full = |pool: &Pool, holder: &str| ShareRequest {
        max_holders: 2,
        ..request(pool, holder, 10)
    };
    for (i, holder) in ["a", "b"].into_iter().enumerate() {
        let ask = full(&pool, holder);
        let grant = allocate(&mut pool, &ask, 1_000_000 + i as u64);
        assert!(grant.holders > 0 && grant.rate > 0, "{holder}: {grant:?}");
    }
    let before = pool.clone();
    let ask = full(&pool, "c");
    let refused = allocate(&mut pool, &ask, 2_000_000);
    assert_eq!((refused.holders, refused.rate, refused.size), (0, 0, 0));
    assert_eq!(refused.members, vec![(0, 0)]);
    assert_eq!(pool, before, "a refusal writes nothing");
    // A holder already in the pool is still served.
    let ask = full(&pool, "a");
    assert!(allocate(&mut pool, &ask, 2_000_000).holders == 2);
    // Long after b's last report, b has lapsed and c is taken in.
    let later = 2_000_000 + 10 * ask.hold_us;
    let ask = full(&pool, "a");
    allocate(&mut pool, &ask, later);
    let ask = full(&pool, "c");
    let grant = allocate(&mut pool, &ask, later + 1);
    assert_eq!(grant.holders, 2, "c took b's place: {grant:?}");
}
