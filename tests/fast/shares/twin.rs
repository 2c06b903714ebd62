//! The script and its Rust twin on the same pools, and the memory store's pools.

use super::*;

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
        let expected = tollgate_core::store::rlqs::allocate(&mut twin, &report, now);
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
