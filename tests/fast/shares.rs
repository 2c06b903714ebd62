//! RLQS shares: the allocator (`store::rlqs::allocate`) against random demand sequences,
//! and `lua/rlqs.lua` against its Rust twin on the same pools.
//!
//! The bound: at every instant, what every holder of a pool may hold (each assignment counted
//! until its expiry, even once replaced) sums to at most the pool's rate and size units.

use std::time::Duration;

use proptest::prelude::*;

use crate::support::{redis_store, RedisServer};
use tollgate::base::clock::ManualClock;
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::{RedisStore, Topology};
use tollgate::store::rlqs::{
    Escrow, Grant, Holding, Member, Pool, Sent, ShareRequest, ESCROW_FIELD,
};
use tollgate::store::Store;

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
    tollgate::store::rlqs::allocate(pool, &request, now)
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

/// The script and its twin on the same pool: seeded into Redis, the script run, the reporter's
/// `last_us` read back (the script's `now`), and the twin run on the seed at that instant.
struct Twin {
    _server: RedisServer,
    store: RedisStore,
    runtime: tokio::runtime::Runtime,
    raw: std::cell::RefCell<redis::Connection>,
}

impl Twin {
    fn start() -> Twin {
        let server = RedisServer::start();
        let (store, runtime) = redis_store(
            &Topology::Single { url: &server.url() },
            Duration::from_secs(2),
        );
        let raw = redis::Client::open(server.url())
            .and_then(|client| client.get_connection())
            .expect("a connection to seed pools");
        Twin {
            _server: server,
            store,
            runtime,
            raw: std::cell::RefCell::new(raw),
        }
    }

    fn redis_now_us(&self) -> u64 {
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query(&mut *self.raw.borrow_mut())
            .expect("TIME");
        s * S + us
    }

    fn seed(&self, key: &str, pool: &[(String, Holding)], escrow: Option<Escrow>) {
        let mut raw = self.raw.borrow_mut();
        let _: () = redis::cmd("DEL").arg(key).query(&mut *raw).expect("DEL");
        if let Some(escrow) = escrow {
            let _: () = redis::cmd("HSET")
                .arg(key)
                .arg(ESCROW_FIELD)
                .arg(escrow.encode())
                .query(&mut *raw)
                .expect("HSET");
        }
        for (id, holding) in pool {
            let _: () = redis::cmd("HSET")
                .arg(key)
                .arg(id)
                .arg(holding.encode())
                .query(&mut *raw)
                .expect("HSET");
        }
    }

    /// Runs both on `seed` (times relative to Redis's now) and compares.
    fn escrow(&self, key: &str) -> Option<Escrow> {
        let text: Option<String> = redis::cmd("HGET")
            .arg(key)
            .arg(ESCROW_FIELD)
            .query(&mut *self.raw.borrow_mut())
            .expect("HGET");
        text.and_then(|text| Escrow::decode(&text))
    }

    fn compare(
        &self,
        key: &str,
        seed: &[(String, Holding)],
        escrow: Option<Escrow>,
        report: &ShareRequest,
    ) {
        let base = self.redis_now_us() as i64;
        let at = |offset: u64| (base + offset as i64 - OFFSET) as u64;
        let pool: Vec<(String, Holding)> = seed
            .iter()
            .map(|(id, h)| {
                let shift = |steps: &[(u64, u64)]| -> Vec<(u64, u64)> {
                    steps.iter().map(|(u, t)| (*u, at(*t))).collect()
                };
                let h = Holding {
                    demand_milli: h.demand_milli,
                    last_us: at(h.last_us),
                    rate_steps: shift(&h.rate_steps),
                    size_steps: shift(&h.size_steps),
                };
                (id.clone(), h)
            })
            .collect();
        let escrow = escrow.map(|e| Escrow {
            at_us: at(e.at_us),
            ..e
        });
        self.seed(key, &pool, escrow);
        let mut report = ShareRequest {
            key: key.into(),
            ..report.clone()
        };
        for member in &mut report.members {
            if member.last.until_us != 0 {
                member.last.until_us = at(member.last.until_us);
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let grant = self
            .runtime
            .block_on(self.store.share(std::slice::from_ref(&report), deadline))
            .remove(0)
            .expect("the script runs");
        let (_, after) = self
            .runtime
            .block_on(self.store.shares_of(key))
            .expect("the pool reads");
        let now = grant.now_us;
        // A newcomer to a full pool (holders 0) is not written.
        let refused = grant.holders == 0;
        assert_eq!(
            after
                .iter()
                .find(|(id, _)| *id == report.holder)
                .map(|(_, h)| h.last_us),
            (!refused).then_some(now),
            "the reporter's last report is the script's now"
        );
        let mut twin = Pool {
            holders: pool.clone(),
            escrow,
            expires_us: 0,
        };
        let expected = tollgate::store::rlqs::allocate(&mut twin, &report, now);
        assert_eq!(
            grant, expected,
            "grant for {seed:?} / {escrow:?} / {report:?}"
        );
        twin.holders.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(after, twin.holders, "pool after {seed:?} / {report:?}");
        assert_eq!(
            self.escrow(key),
            twin.escrow,
            "escrow after {seed:?} / {escrow:?}"
        );
        if refused {
            return;
        }
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query(&mut *self.raw.borrow_mut())
            .expect("PTTL");
        let expected_ms = (twin.expires_us / 1000 + 1).saturating_sub(now / 1000) as i64;
        assert!(
            (expected_ms - pttl).abs() <= 50,
            "PTTL {pttl} ms, the twin's {expected_ms}"
        );
    }
}

/// Seeds' times are offsets from Redis's now plus this (so they are unsigned).
const OFFSET: i64 = 1_000_000_000;

#[test]
fn the_script_and_its_twin_agree_on_random_pools() {
    let twin = Twin::start();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(128));
    // Times are whole tenths of a second from Redis's now and never within 200 ms of it, so
    // the milliseconds between reading Redis's clock and the script's run change nothing.
    let tenth = || {
        (-150i64..150).prop_map(|t| {
            let t = if (-2..=2).contains(&t) { t + 5 } else { t };
            (t * 100_000 + OFFSET) as u64
        })
    };
    let steps = || prop::collection::vec((0u64..4000, tenth()), 0..4);
    let holder = (0u64..3_000_000, tenth(), steps(), steps());
    // A holder's buckets: whether each reported, its requests, and what it was last sent.
    let member = (
        any::<bool>(),
        0u64..20_000,
        (0u64..4000, 0u64..200, prop::option::of(tenth())),
    );
    let strategy = (
        prop::collection::vec(holder, 0..6),
        0usize..7,
        prop::collection::vec(member, 1..5),
        (0u64..5000, 0u64..200),
        prop::option::of((0u64..250_000_000, 0u64..5000, tenth())),
        2u64..8,
    );
    runner
        .run(
            &strategy,
            |(holders, reporter, members, units, escrow, max_holders)| {
                let seed: Vec<(String, Holding)> = holders
                    .into_iter()
                    .enumerate()
                    .map(|(i, (demand_milli, last, rate_steps, size_steps))| {
                        let holding = Holding {
                            demand_milli,
                            // A report in the past.
                            last_us: last.min(OFFSET as u64 - 300_000),
                            rate_steps,
                            size_steps,
                        };
                        (format!("h{i}"), holding)
                    })
                    .collect();
                let report = ShareRequest {
                    members: members
                        .into_iter()
                        .enumerate()
                        .map(|(i, (reported, requests, (rate, size, until)))| Member {
                            // At least one bucket reports: a holder is decided for those.
                            reported: reported || i == 0,
                            requests,
                            last: Sent {
                                rate,
                                size,
                                until_us: until.unwrap_or(0),
                            },
                        })
                        .collect(),
                    max_holders,
                    ..request(&format!("h{reporter}"), 0, units.0, units.1)
                };
                let escrow = escrow.map(|(micro, free_rate, at)| Escrow {
                    micro,
                    free_rate,
                    // An update in the past.
                    at_us: at.min(OFFSET as u64 - 300_000),
                });
                twin.compare("tollgate:t:{x}:s", &seed, escrow, &report);
                Ok(())
            },
        )
        .expect("the script and its twin agree");
}

#[test]
fn the_memory_store_keeps_pools_apart_and_forgets_lapsed_ones() {
    let clock = std::sync::Arc::new(ManualClock::default());
    clock.set_us(1_000 * S);
    let store = MemoryStore::with_clock(100, clock.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let share = |key: &str, holder: &str| {
        let report = ShareRequest {
            key: key.into(),
            ..request(holder, 100, 36_000, 100)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        runtime
            .block_on(store.share(std::slice::from_ref(&report), deadline))
            .remove(0)
            .expect("memory shares")
    };
    assert_eq!(share("a", "x").rate, 34_200);
    assert_eq!(share("b", "x").rate, 34_200, "another pool is untouched");
    assert_eq!(share("a", "y").rate, 900);
    clock.set_us(1_012 * S);
    assert!(runtime
        .block_on(store.shares_of("a"))
        .expect("peek")
        .1
        .is_empty());
    assert_eq!(share("a", "y").rate, 34_200);
}

/// Envoy 1.40's bucket for one holder, as the simulation models it: a token bucket applied on
/// receipt, a changed one keeping its fill fraction, a first one (or one after a denial)
/// starting full; an expired assignment denies (Envoy's fallbacks are outside the bound).
#[derive(Debug, Default, Clone)]
struct Envoy {
    /// (tokens per fill interval, max tokens, expiry µs); None: no assignment or deny all.
    bucket: Option<(u64, u64, u64)>,
    tokens: f64,
    at: u64,
    since_report: u64,
    /// How often its stream was opened again (on another replica): each stream is a new
    /// holder, while Envoy keeps its bucket and the assignment it applies.
    stream: u32,
}

impl Envoy {
    fn refill(&mut self, now: u64) {
        if let Some((rate, size, _)) = self.bucket {
            let gained = rate as f64 / 3600.0 * (now - self.at) as f64 / S as f64;
            self.tokens = (self.tokens + gained).min(size as f64);
        }
        self.at = now;
    }

    fn apply(&mut self, grant: &Grant, now: u64, ttl_us: u64) {
        self.refill(now);
        if grant.size == 0 {
            self.bucket = None;
            self.tokens = 0.0;
            return;
        }
        self.tokens = match self.bucket {
            Some((_, old, until)) if until > now => grant.size as f64 * (self.tokens / old as f64),
            _ => grant.size as f64,
        };
        self.bucket = Some((grant.rate, grant.size, now + ttl_us));
    }

    /// Up to `wanted` requests at `now`; returns how many were admitted.
    fn spend(&mut self, wanted: u64, now: u64) -> u64 {
        self.refill(now);
        let live = matches!(self.bucket, Some((_, _, until)) if until > now);
        let mut admitted = 0;
        while live && admitted < wanted && self.tokens >= 1.0 {
            self.tokens -= 1.0;
            admitted += 1;
        }
        self.since_report += wanted;
        admitted
    }
}

/// The most any window of the admissions `(µs, count)` passes `burst + rate × W` by.
fn worst_excess(admissions: &[(u64, u64)], rate_per_s: f64, burst: f64) -> f64 {
    let mut worst = f64::MIN;
    for (i, (start, _)) in admissions.iter().enumerate() {
        let mut total = 0;
        for (end, count) in &admissions[i..] {
            total += count;
            let allowed = burst + rate_per_s * (end - start) as f64 / S as f64;
            worst = worst.max(total as f64 - allowed);
        }
    }
    worst
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Envoys modelled as Envoy 1.40 behaves, random reports, spending, cuts, growths and
    /// streams opened again (a replica died: the Envoy reports as a new holder while it keeps
    /// its bucket) on a manual clock: in every window, what they all admitted is at most
    /// `burst + rate × W`.
    #[test]
    fn simulated_envoys_never_admit_past_the_limit(
        rate_per_s in 1u64..20,
        burst in 1u64..60,
        events in prop::collection::vec((0usize..4, 0u64..4_000_000, 0u8..9, 0u64..80), 1..160),
    ) {
        let ttl_us = 10 * S;
        let mut pool = Pool::default();
        let mut envoys = vec![Envoy::default(); 4];
        let mut admissions = Vec::new();
        let mut now = 1_000 * S;
        for (holder, gap, kind, wanted) in events {
            now += gap;
            let envoy = &mut envoys[holder];
            if kind == 0 {
                envoy.stream += 1;
            } else if kind < 5 {
                let id = format!("h{holder}.{}", envoy.stream);
                let mut ask = request(&id, envoy.since_report, rate_per_s * 3600, burst);
                ask.hold_us = ttl_us + S;
                let grant = allocate(&mut pool, &ask, now);
                envoy.since_report = 0;
                envoy.apply(&grant, now, ttl_us);
            } else {
                let admitted = envoy.spend(wanted, now);
                if admitted > 0 {
                    admissions.push((now, admitted));
                }
            }
        }
        let excess = worst_excess(&admissions, rate_per_s as f64, burst as f64);
        prop_assert!(excess <= 1e-6, "{} past burst + rate × W: {:?}", excess, admissions);
    }
}

/// The smallest case the simulation found before the escrow existed: one Envoy spends its
/// full first bucket; once its assignment expired, the size it held went to a second Envoy
/// whose first bucket started full: 35 requests in 9.9 s of a 1/s, burst 25 limit.
#[test]
fn a_size_freed_by_an_expiry_is_handed_out_empty() {
    let ttl_us = 10 * S;
    let mut pool = Pool::default();
    let mut ask = |holder: &str, now: u64| {
        let mut ask = request(holder, 0, 3600, 25);
        ask.hold_us = ttl_us + S;
        allocate(&mut pool, &ask, now)
    };
    let (mut first, mut second) = (Envoy::default(), Envoy::default());
    let start = 1_000 * S;
    first.apply(&ask("h3", start), start, ttl_us);
    let spent = first.spend(24, start + 1_088_799);
    assert_eq!(spent, 24, "a full bucket of 23 and a token refilled");
    let later = start + 11 * S;
    let grant = ask("h2", later);
    second.apply(&grant, later, ttl_us);
    let admitted = spent + second.spend(11, later);
    let window = (later - start - 1_088_799) as f64 / S as f64;
    assert!(
        admitted as f64 <= 25.0 + window,
        "{admitted} admitted in {window} s; the second Envoy was given {grant:?}"
    );
    assert!(
        grant.size >= 1,
        "the escrow had refilled a token: {grant:?}"
    );
}

/// The rate of an assignment that expired refills the escrow from its expiry on, not from the
/// next report: an Envoy whose assignment expired refills nothing, so the pool's rate is all
/// the escrow's again. Here one holder held all but the reserve until 1,009 s; a newcomer
/// reporting at 1,012 s finds the 3 s since filled at the whole rate (20/s, capped at the
/// burst), where the reserve's 1/s (the rate free at the last report) would give it 4 tokens.
#[test]
fn an_expired_rate_refills_the_escrow_at_once() {
    let ask = |holder: &str| ShareRequest {
        hold_us: 9 * S,
        ..request(holder, 100, 72_000, 20)
    };
    let mut pool = Pool::default();
    let first = allocate(&mut pool, &ask("a.0"), 1_000 * S);
    assert_eq!((first.rate, first.size), (68_400, 19));
    // a's Envoy spends its 19 tokens; its stream ends (its replica died) and it never reports
    // again. The escrow holds 1 token and refills at the reserve's 1/s while a counts.
    let newcomer = allocate(&mut pool, &ask("b.0"), 1_012 * S);
    assert_eq!(
        newcomer.size, 19,
        "the escrow refilled at 20/s once a's assignment expired at 1,009 s: {newcomer:?}"
    );
}

/// A replica dies: three Envoys at equal demand open their streams again on the other
/// replica as new holders while their old assignments still count (9 s from their last
/// report). No new holder is denied: the first to report takes what the reserve refilled,
/// and each old assignment that expires before the others report frees its rate into the
/// escrow at that instant (counted only from the next report, the third Envoy was denied for
/// a round: sizes `[1, 1, 0]`). From the first report after every old one expired, each has
/// at least a third of the burst less rounding.
#[test]
fn holders_on_a_new_stream_are_served_and_regain_their_sizes() {
    let ask = |holder: &str| ShareRequest {
        hold_us: 9 * S,
        ..request(holder, 100, 72_000, 20)
    };
    let mut pool = Pool::default();
    let envoys = ["a", "b", "c"];
    for round in 0..4u64 {
        for (i, envoy) in envoys.iter().enumerate() {
            let now = 1_000 * S + round * 5 * S + i as u64 * 1_700_000;
            allocate(&mut pool, &ask(&format!("{envoy}.0")), now);
        }
    }
    // The old assignments were sent by 1,018.4 s: they count until 1,027.4 s at most.
    let mut sizes = Vec::new();
    for round in 0..4u64 {
        let mut of_round = Vec::new();
        for (i, envoy) in envoys.iter().enumerate() {
            let now = 1_021 * S + round * 5 * S + i as u64 * 1_700_000;
            of_round.push(allocate(&mut pool, &ask(&format!("{envoy}.1")), now).size);
        }
        sizes.push(of_round);
    }
    assert!(
        sizes.iter().flatten().all(|s| *s >= 1),
        "a new holder was denied: sizes per round after the move {sizes:?}"
    );
    // Reports from 1,031 s on come after every old assignment expired.
    assert!(
        sizes[2].iter().all(|s| *s >= 5),
        "sizes per round after the move: {sizes:?}"
    );
}

/// Pools of many holders are decided a few to a call: the script stops before the holders it
/// would read pass its budget, and the store sends the pools left again; every pool is
/// answered. (All in one call, a report of many full pools held Redis for tens of ms.)
#[test]
fn full_pools_are_decided_a_few_to_a_call() {
    let server = RedisServer::start();
    let (store, runtime) = redis_store(
        &Topology::Single { url: &server.url() },
        Duration::from_secs(2),
    );
    let mut raw = redis::Client::open(server.url())
        .and_then(|client| client.get_connection())
        .expect("a connection to seed pools");
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut raw).expect("TIME");
    let now = s * S + us;
    let keys: Vec<String> = (0..3).map(|p| format!("tollgate:t:{{p{p}}}:s")).collect();
    for key in &keys {
        let mut hset = redis::cmd("HSET");
        hset.arg(key);
        for h in 0..200 {
            let holding = Holding {
                demand_milli: 1000,
                last_us: now,
                rate_steps: Vec::new(),
                size_steps: Vec::new(),
            };
            hset.arg(format!("h{h}")).arg(holding.encode());
        }
        let _: () = hset.query(&mut raw).expect("HSET");
    }
    let requests: Vec<ShareRequest> = keys
        .iter()
        .map(|key| ShareRequest {
            key: key.clone(),
            ..request("h0", 10, 36_000, 100)
        })
        .collect();
    let before = crate::support::commandstats::script_calls(&server);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let grants = runtime.block_on(store.share(&requests, deadline));
    let holders: Vec<u64> = grants
        .into_iter()
        .map(|grant| grant.expect("decided").holders)
        .collect();
    assert_eq!(holders, [200, 200, 200]);
    assert_eq!(
        crate::support::commandstats::script_calls(&server) - before,
        3,
        "a call per pool of 200 holders"
    );
}
