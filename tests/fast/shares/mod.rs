//! RLQS shares: the allocator (`store::rlqs::allocate`) against random demand sequences,
//! and `lua/rlqs.lua` against its Rust twin on the same pools.
//!
//! The bound: at every instant, what every holder of a pool may hold (each assignment counted
//! until its expiry, even once replaced) sums to at most the pool's rate and size units.

use std::time::Duration;

use proptest::prelude::*;

use crate::support::{redis_store, RedisServer};
use tollgate_core::base::clock::ManualClock;
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::redis::{RedisStore, Topology};
use tollgate_core::store::rlqs::{
    Escrow, Grant, Holding, Member, Pool, Sent, ShareRequest, ESCROW_FIELD,
};
use tollgate_core::store::Store;

mod streams;
mod twin;

const S: u64 = 1_000_000;

/// A report of one bucket (the holder's only member); [`allocate`] fills in what it was last
/// sent.
fn request(holder: &str, requests: u64, rate_units: u64, size_units: u64) -> ShareRequest {
    ShareRequest {
        key: "pool".into(),
        holder: holder.into(),
        members: vec![Member {
            reported: true,
            requests,
            last: Sent::default(),
        }],
        rate_units,
        size_units,
        reserve_rate: rate_units / 20,
        reserve_size: size_units / 20,
        fill_interval_s: 3600,
        hold_us: 11 * S,
        max_holders: 1024,
    }
}

/// `tollgate`'s allocator, for a one-bucket holder whose stream remembers what it was last
/// sent: the newest steps of its holding.
fn allocate(pool: &mut Pool, request: &ShareRequest, now: u64) -> Grant {
    let mut request = request.clone();
    if let [member] = &mut request.members[..] {
        member.last = last_sent(pool, &request.holder);
    }
    tollgate_core::store::rlqs::allocate(pool, &request, now)
}

/// What a one-bucket holder was last sent, read from its newest steps.
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

/// What every holder may hold at `now`, summed.
fn counted(pool: &[(String, Holding)], now: u64) -> (u64, u64) {
    pool.iter().fold((0, 0), |(r, s), (_, h)| {
        let (hr, hs) = h.counted(now);
        (r + hr, s + hs)
    })
}

/// Holders report every 5 s (each at its own phase) with the given demands (requests per
/// second) for `rounds`; returns the pool and the last grant of each.
fn steady(demands: &[u64], units: (u64, u64), rounds: u64) -> (Pool, Vec<Grant>) {
    steady_filled(demands, units, rounds, 3600)
}

/// [`steady`] with rate units counted per `fill_interval_s`.
fn steady_filled(
    demands: &[u64],
    units: (u64, u64),
    rounds: u64,
    fill_interval_s: u64,
) -> (Pool, Vec<Grant>) {
    let mut pool = Pool::default();
    let mut grants = vec![Grant::default(); demands.len()];
    for round in 0..rounds {
        for (i, demand) in demands.iter().enumerate() {
            let now = 1_000 * S + round * 5 * S + i as u64 * 100_000;
            let id = format!("h{i}");
            let report = ShareRequest {
                fill_interval_s,
                ..request(&id, demand * 5, units.0, units.1)
            };
            grants[i] = allocate(&mut pool, &report, now);
            let (r, s) = counted(&pool.holders, now);
            assert!(
                r <= units.0 && s <= units.1,
                "round {round}: {r}/{s} of {units:?}"
            );
        }
    }
    (pool, grants)
}

#[test]
fn a_single_envoy_gets_the_limit_less_the_reserve() {
    let (_, grants) = steady(&[500], (36_000, 100), 3);
    assert_eq!((grants[0].rate, grants[0].size), (34_200, 95));
}

#[test]
fn shares_follow_an_80_15_5_split_within_two_rounds() {
    // 10 per second in all; 40 per second asked, 80/15/5.
    let (_, grants) = steady(&[32, 6, 2], (36_000, 100), 4);
    let budget = 34_200.0 - 3.0;
    for (grant, part) in grants.iter().zip([0.80, 0.15, 0.05]) {
        let want = 1.0 + budget * part;
        assert!(
            (grant.rate as f64 - want).abs() <= 2.0,
            "{} rate units for a {part} share, want about {want}",
            grant.rate
        );
    }
    let sizes: u64 = grants.iter().map(|g| g.size).sum();
    assert!(sizes <= 100 && grants[0].size > grants[1].size && grants[1].size > grants[2].size);
}

#[test]
fn demand_below_the_limit_gets_demand_and_headroom() {
    // 10 units per second in all (36,000 per hour); demands of 1 and 2 per second.
    let (_, grants) = steady(&[1, 2], (36_000, 100), 4);
    for (grant, demand) in grants.iter().zip([1.0, 2.0]) {
        assert!(grant.rate as f64 >= demand * 3600.0 * 1.25, "{grant:?}");
    }
}

#[test]
fn more_holders_than_units_deny_the_least_demanding() {
    // Units per second, so the escrow refills the sizes the newcomers need within a round
    // (at 3 units an hour it would take hours: a global bucket's truth).
    let (_, grants) = steady_filled(&[5, 1, 9], (3, 10), 6, 1);
    // Reserve 0 of 3 units: all three get one.
    assert!(grants.iter().all(|g| g.rate == 1), "{grants:?}");
    let (_, grants) = steady_filled(&[5, 1, 9], (2, 10), 6, 1);
    assert_eq!(grants[1].rate, 0, "{grants:?}");
    assert!(grants[0].rate == 1 && grants[2].rate == 1, "{grants:?}");
}

/// An Envoy reporting far more requests than the limit could admit (a bug, or a lie) counts
/// as four times the limit: an Envoy with real demand beside it keeps a share in proportion.
#[test]
fn a_lying_envoy_cannot_starve_the_others() {
    let mut pool = Pool::default();
    let mut honest = Grant::default();
    for round in 0..6u64 {
        let now = 1_000 * S + round * 5 * S;
        allocate(&mut pool, &request("liar", u64::MAX, 72_000, 100), now);
        // 10 requests per second, half the limit of 20.
        honest = allocate(&mut pool, &request("honest", 50, 72_000, 100), now + S);
    }
    // 10 against 80 (the liar's 1.8 million per second, capped): a ninth of the budget.
    let budget = 72_000 - 3600;
    assert!(
        honest.rate >= budget / 10 && honest.size >= 5,
        "the honest Envoy's share: {honest:?}"
    );
}

#[test]
fn a_departed_envoys_share_counts_until_its_expiry() {
    let mut pool = Pool::default();
    allocate(&mut pool, &request("a", 5000, 36_000, 100), 0);
    let b = allocate(&mut pool, &request("b", 5000, 36_000, 100), S);
    assert_eq!(
        b.rate, 900,
        "half the reserve, all that is free, for a newcomer"
    );
    // a stops reporting: its 34,200 count until 11 s.
    let b = allocate(&mut pool, &request("b", 5000, 36_000, 100), 6 * S);
    assert_eq!(b.rate, 1800, "no newcomer any more: all that is free");
    let b = allocate(&mut pool, &request("b", 5000, 36_000, 100), 11 * S);
    assert_eq!((b.rate, b.holders), (34_200, 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random holders, demands, gaps, pool numbers (changed midway, as an override does):
    /// the sums never pass the pool, at the report and at every later report.
    #[test]
    fn the_sums_never_pass_the_pool(
        units in (1u64..5000, 1u64..200),
        lowered in (1u64..5000, 1u64..200),
        steps in prop::collection::vec((0usize..6, 0u64..100_000, 0u64..8_000_000), 1..120),
    ) {
        let mut pool = Pool::default();
        let mut now = 1_000 * S;
        for (i, (holder, requests, gap)) in steps.iter().enumerate() {
            now += gap;
            // Halfway the limit changes; the invariant holds from the moment every
            // assignment made under the old numbers has expired.
            let (rate_units, size_units) = if i < steps.len() / 2 { units } else { lowered };
            let changed_at = steps.len() / 2;
            let grant = allocate(
                &mut pool,
                &request(&format!("h{holder}"), *requests, rate_units, size_units),
                now,
            );
            prop_assert!((grant.rate == 0) == (grant.size == 0));
            prop_assert!(grant.rate <= rate_units && grant.size <= size_units);
            let (r, s) = counted(&pool.holders, now);
            prop_assert_eq!((r, s), (grant.counted_rate, grant.counted_size));
            if i < changed_at {
                prop_assert!(r <= rate_units && s <= size_units, "{} {} of {:?}", r, s, units);
            }
        }
    }

    /// After a lowered limit, the sums never rise while over the new numbers, and once every
    /// older assignment has lapsed they fit the new numbers again and keep fitting them.
    #[test]
    fn a_lowered_limit_binds_once_older_assignments_lapse(
        demands in prop::collection::vec(0u64..2000, 1..6),
        from in (100u64..5000, 10u64..200),
        to in (1u64..100, 1u64..10),
    ) {
        let mut pool = Pool::default();
        for round in 0..8u64 {
            let units = if round < 3 { from } else { to };
            for (i, demand) in demands.iter().enumerate() {
                let now = 1_000 * S + round * 5 * S + i as u64 * 100_000;
                let before = counted(&pool.holders, now);
                allocate(&mut pool, &request(&format!("h{i}"), demand * 5, units.0, units.1), now);
                // Over the numbers, a report never raises the sum; within them, never past.
                let after = counted(&pool.holders, now);
                prop_assert!(after.0 <= before.0.max(units.0) && after.1 <= before.1.max(units.1),
                    "{:?} -> {:?} with {:?}", before, after, units);
                if round >= 6 {
                    let (r, s) = counted(&pool.holders, now);
                    prop_assert!(r <= to.0 && s <= to.1, "{} {} of {:?}", r, s, to);
                }
            }
        }
    }

    /// Steady demands: every holder with demand gets a unit when the pool has one per
    /// holder, and shares are proportional to demand within rounding, capped at demand plus
    /// headroom. The rate refills the burst at least four times a second, so the escrow
    /// serves every newcomer's size within a round.
    #[test]
    fn steady_shares_are_proportional_and_never_empty(
        (units, demands) in (10u64..500)
            .prop_flat_map(|size| (size * 14_400..size * 40_000, Just(size)))
            .prop_flat_map(|units| {
                // Demands up to the cap, four times the pool's rate: proportions hold below it.
                let most = units.0 * 4 / 3600;
                (Just(units), prop::collection::vec(1u64..most, 1..6))
            }),
    ) {
        let (_, grants) = steady(&demands, units, 4);
        let n = demands.len() as f64;
        let budget = (units.0 - units.0 / 20) as f64;
        let total: f64 = demands.iter().map(|d| *d as f64 * 3600.0).sum();
        for (grant, demand) in grants.iter().zip(&demands) {
            prop_assert!(grant.rate >= 1 && grant.size >= 1, "{:?}", grant);
            let wanted = *demand as f64 * 3600.0;
            let spare = budget - n;
            let proportional = 1.0 + spare * wanted / total;
            if total * 1.25 >= spare {
                prop_assert!((grant.rate as f64 - proportional).abs() <= 2.0,
                    "{} for {} of {}", grant.rate, wanted, total);
            } else {
                prop_assert!(grant.rate as f64 >= wanted * 1.25, "{:?} for {}", grant, wanted);
            }
        }
    }
}
