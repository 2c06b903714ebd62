//! Reservations: a `charge = "report"` bucket that takes an estimate at `/check` and settles it
//! by id at `POST /report`. The same scenarios run against the memory store (a manual clock)
//! and a real `redis-server` (`lua/token_bucket.lua`, `lua/settle.lua`); then the real binary
//! end to end, several instances on one Redis; then random interleavings against the memory
//! store, checking the bound at every step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use crate::support::{redis_config, redis_store, RedisServer, Response, Tollgate};
use tollgate::base::clock::ManualClock;
use tollgate::kinds::reserve::{Reserve, Settle, Settled, MAX_LATE_SETTLES};
use tollgate::kinds::{BucketRequest, Meter, Reserved};
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::Topology;
use tollgate::store::Store;

const TOKEN: &str = "test-admin-token-0123456789";
/// Slow enough that the milliseconds a Redis step takes refill nothing visible.
const RATE: f64 = 0.001;
const BURST: f64 = 10.0;

fn reserve(key: &str, id: u128, estimate: u64, ttl_ms: u64, refund: bool) -> BucketRequest {
    BucketRequest::reserve(key, RATE, BURST, Reserve { ttl_ms, id, refund }).cost(estimate)
}

fn settle(request: &BucketRequest, estimate: u64, actual: u64) -> Settle {
    Settle {
        bucket: request.clone().cost(actual),
        estimate,
        max_debt: BURST,
    }
}

/// A store and a way to let time pass past a reservation's expiry.
trait Harness {
    fn decide(&self, buckets: &[BucketRequest]) -> (bool, Vec<f64>);
    /// Each request decided alone, all at once; how many were admitted.
    fn decide_each(&self, requests: &[BucketRequest]) -> usize;
    fn settle(&self, settle: &Settle) -> Settled;
    fn reserved(&self, bucket: &BucketRequest) -> Reserved;
    fn peek(&self, bucket: &BucketRequest) -> f64;
    /// Lets more than `ms` pass on the store's clock.
    fn pass(&self, ms: u64);
}

struct Memory {
    store: MemoryStore<Arc<ManualClock>>,
    clock: Arc<ManualClock>,
}

impl Harness for Memory {
    fn decide(&self, buckets: &[BucketRequest]) -> (bool, Vec<f64>) {
        let decided = self.store.decide_sync(buckets);
        (
            decided.allowed,
            decided.buckets.iter().map(|b| b.tokens).collect(),
        )
    }
    fn decide_each(&self, requests: &[BucketRequest]) -> usize {
        requests
            .iter()
            .filter(|request| {
                self.store
                    .decide_sync(std::slice::from_ref(request))
                    .allowed
            })
            .count()
    }
    fn settle(&self, settle: &Settle) -> Settled {
        self.store.settle_now(settle)
    }
    fn reserved(&self, bucket: &BucketRequest) -> Reserved {
        self.store.reserved_now(bucket)
    }
    fn peek(&self, bucket: &BucketRequest) -> f64 {
        self.store.peek_now(bucket).tokens
    }
    fn pass(&self, ms: u64) {
        self.clock.advance_ms(ms + 1);
    }
}

struct Redis {
    server: RedisServer,
    store: tollgate::store::redis::RedisStore,
    runtime: tokio::runtime::Runtime,
}

impl Harness for Redis {
    fn decide(&self, buckets: &[BucketRequest]) -> (bool, Vec<f64>) {
        let decided = self
            .runtime
            .block_on(self.store.decide(buckets))
            .expect("decided");
        (
            decided.allowed,
            decided.buckets.iter().map(|b| b.tokens).collect(),
        )
    }
    fn decide_each(&self, requests: &[BucketRequest]) -> usize {
        // Concurrent: the store sends them in a few calls, as it would a burst of checks.
        let decided = self.runtime.block_on(futures_util::future::join_all(
            requests
                .iter()
                .map(|request| self.store.decide(std::slice::from_ref(request))),
        ));
        decided
            .into_iter()
            .filter(|decided| decided.as_ref().expect("decided").allowed)
            .count()
    }
    fn settle(&self, settle: &Settle) -> Settled {
        self.runtime
            .block_on(self.store.settle(settle))
            .expect("settled")
    }
    fn reserved(&self, bucket: &BucketRequest) -> Reserved {
        self.runtime
            .block_on(self.store.reserved(bucket))
            .expect("peeked")
    }
    fn peek(&self, bucket: &BucketRequest) -> f64 {
        self.runtime
            .block_on(self.store.peek(bucket))
            .expect("peeked")
            .tokens
    }
    fn pass(&self, ms: u64) {
        // Redis's own clock cannot be set: a sleep is a lower bound on the time it sees pass.
        std::thread::sleep(Duration::from_millis(ms + 5));
    }
}

/// Whole tokens, as the rate refills at most a few micro-tokens during a Redis step.
fn whole(tokens: f64) -> f64 {
    (tokens * 1000.0).round() / 1000.0
}

fn run_scenarios(store: &dyn Harness, prefix: &str) {
    let key = format!("{prefix}:settle");
    let (a, b, c) = (
        reserve(&key, 0xa, 4, 60_000, false),
        reserve(&key, 0xb, 4, 60_000, false),
        reserve(&key, 0xc, 4, 60_000, false),
    );
    let step = |request: &BucketRequest| {
        let (allowed, tokens) = store.decide(std::slice::from_ref(request));
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
    assert!(store.decide(std::slice::from_ref(&drained)).0);
    let pair = [
        reserve(&format!("{prefix}:pair"), 0xf, 2, 60_000, false),
        drained,
    ];
    let (allowed, tokens) = store.decide(&pair);
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
    assert_eq!(whole(store.peek(&kept)), 6.0, "the estimate is kept");
    assert_eq!(
        whole(store.peek(&refunded)),
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
    assert_eq!(whole(store.peek(&cheap)), 9.0);
}

/// A late settle applies what the expiry did, whatever mode the settling instance (reloaded
/// since, or another instance) runs: given back at expiry, the whole actual cost is charged;
/// kept, the difference applies. Never the estimate back a second time, never kept twice.
fn late_settles_follow_what_the_expiry_did(store: &dyn Harness, prefix: &str) {
    let step = |request: &BucketRequest| {
        let (allowed, tokens) = store.decide(std::slice::from_ref(request));
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
fn late_settles_are_bounded_per_bucket(store: &dyn Harness, prefix: &str) {
    let key = format!("{prefix}:many");
    let burst = (MAX_LATE_SETTLES + 1) as f64;
    let one = |id: u128| BucketRequest {
        burst,
        ..reserve(&key, id, 1, 40, false)
    };
    // The oldest first, then the rest together.
    assert!(store.decide(std::slice::from_ref(&one(0))).0);
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

#[test]
fn reservations_on_the_memory_store() {
    let clock = Arc::new(ManualClock::default());
    clock.set_us(1_000_000_000_000);
    let harness = Memory {
        store: MemoryStore::with_clock(10_000, clock.clone()),
        clock,
    };
    run_scenarios(&harness, "mem");
    late_settles_follow_what_the_expiry_did(&harness, "mem");
    late_settles_are_bounded_per_bucket(&harness, "mem");
}

/// An expired reservation filed by an earlier release, without the flag saying what its expiry
/// did, settles as given back: the whole actual cost is charged and nothing is returned, so an
/// estimate that may have come back already never comes back twice.
fn unflagged_late_settles_charge_the_actual_cost(store: &Redis) {
    let key = "redis:unflagged";
    let first = reserve(key, 0x30, 4, 40, false);
    assert!(store.decide(std::slice::from_ref(&first)).0);
    store.pass(40);
    // A check sweeps the first (kept): 10 - 4 - 4.
    assert!(store.decide(&[reserve(key, 0x31, 4, 60_000, false)]).0);
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
fn reservations_on_redis() {
    let server = RedisServer::start();
    // A budget, not a figure: the cap scenario decides 10,000 reservations at once, which a
    // loaded machine may take seconds over.
    let (store, runtime) = redis_store(
        &Topology::Single { url: &server.url() },
        Duration::from_secs(30),
    );
    let harness = Redis {
        server,
        store,
        runtime,
    };
    run_scenarios(&harness, "redis");
    late_settles_follow_what_the_expiry_did(&harness, "redis");
    unflagged_late_settles_charge_the_actual_cost(&harness);
    late_settles_are_bounded_per_bucket(&harness, "redis");
}

fn reserving(extra: &str) -> String {
    format!(
        "[[limits]]\nname = \"tokens\"\nrate = \"100/m\"\nburst = 100\ncharge = \"report\"\nmax_debt = 0\nreserve = 10\nreserve_header = \"x-estimate\"\nkey = [\"header:x-api-key\"]\n{extra}"
    )
}

fn start(redis: &RedisServer, limits: &str) -> Tollgate {
    Tollgate::start(&format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(redis, "", limits)
    ))
}

fn report(tollgate: &Tollgate, body: &serde_json::Value) -> Response {
    crate::support::http::admin_json(
        tollgate.admin,
        "POST",
        "/report",
        Some(TOKEN),
        &body.to_string(),
    )
}

fn json(response: &Response) -> serde_json::Value {
    assert_eq!(response.status, 200, "{}", response.body);
    serde_json::from_str(&response.body).expect("JSON")
}

/// The in-flight overshoot, closed: requests that each end up costing 30 tokens, all in
/// flight before the first report, against a budget of 100. Plain reports admit every one
/// of them; with `reserve = 30` at most the budget is ever taken, across three instances.
#[test]
fn in_flight_requests_never_take_more_than_the_budget() {
    let redis = RedisServer::start();
    let limits = reserving("").replace("reserve = 10", "reserve = 30");
    let instances: Vec<Tollgate> = (0..3).map(|_| start(&redis, &limits)).collect();
    let admitted = AtomicU64::new(0);
    let ids = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for worker in 0..6 {
            let (instances, admitted, ids) = (&instances, &admitted, &ids);
            scope.spawn(move || {
                for round in 0..4 {
                    let at = &instances[(worker + round) % instances.len()];
                    let answer = at.check(&[("x-api-key", "acme")]);
                    if answer.status == 200 {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        let id = answer.header("x-tollgate-reservation").expect("an id");
                        ids.lock().expect("ids").push(id.to_owned());
                    } else {
                        assert_eq!(answer.status, 429, "{}", answer.body);
                    }
                }
            });
        }
    });
    // 100 tokens and 100/min of refill over the few seconds this took: at most 3 estimates
    // of 30 fit, and at least 3 did (the first three found a full bucket).
    assert_eq!(admitted.load(Ordering::SeqCst), 3);
    // Settled at their true cost, from another instance each: the difference comes back.
    for (i, id) in ids.into_inner().expect("ids").iter().enumerate() {
        let answer = json(&report(
            &instances[i % 3],
            &serde_json::json!({ "reservation": id, "cost": 5 }),
        ));
        assert_eq!(answer["settled"], true, "{answer}");
        let again = json(&report(
            &instances[(i + 1) % 3],
            &serde_json::json!({ "reservation": id, "cost": 5 }),
        ));
        assert_eq!(
            again["settled"], false,
            "a retry never settles twice: {again}"
        );
    }
    // 3 × 25 given back: 85 or more tokens now, so two more estimates of 30 fit.
    for _ in 0..2 {
        assert_eq!(instances[0].check(&[("x-api-key", "acme")]).status, 200);
    }
}

#[test]
fn the_header_raises_the_estimate_and_peek_shows_what_is_held() {
    let redis = RedisServer::start();
    let tollgate = start(&redis, &reserving(""));
    let answer = tollgate.check(&[("x-api-key", "acme"), ("x-estimate", "40")]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let id = answer.header("x-tollgate-reservation").expect("an id");
    assert!(id.starts_with("tokens.") && id.ends_with(":40"), "{id}");
    // A smaller or malformed header reserves the configured least.
    for estimate in ["3", "many", "-5"] {
        let answer = tollgate.check(&[("x-api-key", "acme"), ("x-estimate", estimate)]);
        let id = answer.header("x-tollgate-reservation").expect("an id");
        assert!(id.ends_with(":10"), "{estimate}: {id}");
    }
    let peek = crate::support::http::admin_json(
        tollgate.admin,
        "GET",
        "/v1/buckets/tokens?key=acme",
        Some(TOKEN),
        "",
    );
    let peek = json(&peek);
    assert_eq!(peek["reservations"], 4, "{peek}");
    assert_eq!(peek["reserved"], 70, "{peek}");
    assert_eq!(peek["remaining"], 30, "{peek}");
    // An estimate past the burst is never admitted, whatever the bucket holds.
    let huge = tollgate.check(&[("x-api-key", "other"), ("x-estimate", "101")]);
    assert_eq!(huge.status, 429, "{}", huge.body);
}

#[test]
fn a_report_names_reservations_and_leases_or_is_refused_with_the_field() {
    let redis = RedisServer::start();
    let limits = format!(
        "{}[[limits]]\nname = \"slots\"\nconcurrency = 1\nkey = [\"header:x-api-key\"]\n",
        reserving("")
    );
    let tollgate = start(&redis, &limits);
    let answer = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let reservation = answer.header("x-tollgate-reservation").expect("an id");
    let lease = answer.header("x-tollgate-lease").expect("a lease");
    let both = json(&report(
        &tollgate,
        &serde_json::json!([
            { "reservation": reservation, "cost": 0 },
            { "lease": lease },
        ]),
    ));
    assert_eq!(both[0]["settled"], true, "{both}");
    assert_eq!(both[0]["remaining"], 100, "{both}");
    assert_eq!(both[1]["released"], true, "{both}");
    assert_eq!(tollgate.check(&[("x-api-key", "acme")]).status, 200);

    // A request that holds no reservation (its check failed open) is charged by key, as a
    // debt: the balance is never lost.
    let by_key = json(&report(
        &tollgate,
        &serde_json::json!({ "limit": "tokens", "key": ["acme"], "cost": 30 }),
    ));
    assert_eq!(by_key["remaining"], 60, "{by_key}");

    let refused = [
        (
            serde_json::json!({ "reservation": "tokens.00.zz", "cost": 1 }),
            "reservation",
        ),
        (serde_json::json!({ "reservation": reservation }), "cost"),
        (
            serde_json::json!({ "reservation": reservation, "cost": 1, "limit": "x" }),
            "limit",
        ),
        (
            serde_json::json!({ "reservation": lease, "cost": 1 }),
            "reservation",
        ),
        (serde_json::json!({ "lease": reservation }), "lease"),
    ];
    for (body, field) in refused {
        let answer = report(&tollgate, &body);
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert!(answer.body.contains(field), "{body}: {}", answer.body);
    }
}

/// A request that outlives `reservation_ttl_s` (a slow reader, a long generation) still pays
/// its actual cost: its settle applies late, once, under both expiry modes.
#[test]
fn a_request_that_outlives_its_reservation_still_pays() {
    let redis = RedisServer::start();
    let limits = format!(
        "{}reservation_ttl_s = 1\n{}",
        reserving(""),
        reserving("reservation_ttl_s = 1\non_reservation_expiry = \"refund\"\n")
            .replace("name = \"tokens\"", "name = \"refunded\"")
            .replace("x-api-key", "x-other")
    );
    let tollgate = start(&redis, &limits);
    let answer = tollgate.check(&[("x-api-key", "carol"), ("x-other", "dave")]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let ids: Vec<&str> = answer
        .header("x-tollgate-reservation")
        .expect("ids")
        .split(',')
        .map(str::trim)
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    std::thread::sleep(Duration::from_millis(1_500));
    let body = serde_json::json!([
        { "reservation": ids[0], "cost": 90 },
        { "reservation": ids[1], "cost": 90 },
    ]);
    let late = json(&report(&tollgate, &body));
    for settled in late.as_array().expect("a list") {
        assert_eq!(settled["settled"], true, "{late}");
        // 100 tokens, 90 charged (a few refilled in the meantime).
        let remaining = settled["remaining"].as_u64().expect("remaining");
        assert!((10..=15).contains(&remaining), "{late}");
    }
    let again = json(&report(&tollgate, &body));
    for settled in again.as_array().expect("a list") {
        assert_eq!(settled["settled"], false, "once only: {again}");
    }
}

/// A reserving limit whose reservations expire after a second, `on_reservation_expiry = mode`;
/// its refill (one token an hour) moves nothing a test reads.
fn expiring(mode: &str) -> String {
    format!(
        "[[limits]]\nname = \"llm\"\nrate = \"1/h\"\nburst = 100\ncharge = \"report\"\nreserve = 10\nreservation_ttl_s = 1\non_reservation_expiry = \"{mode}\"\nkey = [\"header:x-user\"]\n"
    )
}

/// A reservation expires and is given back by `sweeper` (under `refund`); the user then spends
/// the whole bucket; `between` runs; `settler` settles the expired reservation late at cost 0.
/// Its estimate came back once already: the bucket stays empty and the next check is denied.
fn settle_late_across(sweeper: &Tollgate, settler: &Tollgate, between: impl FnOnce()) {
    let user = [("x-user", "ada")];
    let first = sweeper.check(&user);
    assert_eq!(first.status, 200, "{}", first.body);
    let expired = first
        .header("x-tollgate-reservation")
        .expect("an id")
        .to_owned();
    std::thread::sleep(Duration::from_millis(1_500));
    // Sweeps the first (its 10 back) and reserves 10 more.
    assert_eq!(sweeper.check(&user).status, 200);
    let spent = json(&report(
        sweeper,
        &serde_json::json!({ "limit": "llm", "key": ["ada"], "cost": 90 }),
    ));
    assert_eq!(spent["remaining"], 0, "{spent}");
    between();
    let late = json(&report(
        settler,
        &serde_json::json!({ "reservation": expired, "cost": 0 }),
    ));
    assert_eq!(late["settled"], true, "{late}");
    assert_eq!(
        late["remaining"], 0,
        "the estimate was given back at expiry, never again: {late}"
    );
    let next = settler.check(&user);
    assert_eq!(next.status, 429, "{}", next.body);
}

/// `on_reservation_expiry` changed from `refund` to `keep` by a reload between a reservation's
/// expiry and its late settle.
#[test]
fn a_late_settle_across_a_reload_of_the_expiry_mode_gives_back_once() {
    let redis = RedisServer::start();
    let tollgate = start(&redis, &expiring("refund"));
    settle_late_across(&tollgate, &tollgate, || {
        let text = std::fs::read_to_string(&tollgate.config_path).expect("config");
        std::fs::write(
            &tollgate.config_path,
            text.replace("\"refund\"", "\"keep\""),
        )
        .expect("rewrite config");
        tollgate.signal("HUP");
        assert!(crate::support::wait_until(Duration::from_secs(5), || {
            tollgate.metric("tollgate_config_reloads_total{result=\"success\"}") == 1.0
        }));
    });
}

/// Two instances on one Redis, one on `refund` (which expired the reservation) and one on
/// `keep` (which settles it): a rollout changing the mode.
#[test]
fn a_late_settle_on_an_instance_with_another_expiry_mode_gives_back_once() {
    let redis = RedisServer::start();
    let refunding = start(&redis, &expiring("refund"));
    let keeping = start(&redis, &expiring("keep"));
    settle_late_across(&refunding, &keeping, || {});
}

/// One step of a random interleaving: a check reserving `estimate`, a settle of the n-th
/// open reservation at `actual`, or time passing. A check or settle comes from an instance
/// whose `on_reservation_expiry` is `refund` when its flag says so (in the mixed runs).
#[derive(Debug, Clone)]
enum Op {
    Check(u64, bool),
    Settle(usize, u64, bool),
    Pass(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..=6, any::<bool>()).prop_map(|(estimate, refund)| Op::Check(estimate, refund)),
        (0usize..8, 0u64..=8, any::<bool>())
            .prop_map(|(n, actual, refund)| Op::Settle(n, actual, refund)),
        (1u64..=3_000).prop_map(Op::Pass),
    ]
}

/// Where an unsettled reservation stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expiry {
    Live,
    /// Expired, not yet moved by a check or settle: its estimate still charged.
    Due,
    Kept,
    GivenBack,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever checks, settles (retried, late or not), expiries and refunds interleave, on
    /// instances with one expiry mode or each with its own: a check is admitted exactly when
    /// the bucket holds its estimate, a settle finds its reservation exactly when it was never
    /// settled (live, or expired and settled late), and what is held, settled and kept never
    /// exceeds burst + rate × t (max_debt 0: a settle above its estimate charges only down to
    /// 0).
    #[test]
    fn held_and_settled_never_exceed_the_bound(
        ops in proptest::collection::vec(op(), 1..60),
        // 0: every instance keeps, 1: every one refunds, 2: each op's own.
        modes in 0u8..3,
    ) {
        const RATE_PER_S: f64 = 1.0;
        const BURST: f64 = 8.0;
        const TTL_MS: u64 = 2_000;
        let clock = Arc::new(ManualClock::default());
        clock.set_us(1_000_000_000_000);
        let store = MemoryStore::with_clock(1_000, clock.clone());
        let mode = |own: bool| match modes {
            0 => false,
            1 => true,
            _ => own,
        };
        let request = |estimate: u64, id: u128, refund: bool| BucketRequest {
            key: "k".into(),
            rate: RATE_PER_S,
            burst: BURST,
            cost: estimate,
            shadow: false,
            limit: 0,
            meter: Meter::Reserve(Reserve { ttl_ms: TTL_MS, id, refund }),
        };
        // A check or settle first moves the due ones, as its own mode says.
        let sweep = |open: &mut Vec<(u128, u64, u64, Expiry)>, spent: &mut f64, refund: bool| {
            for (_, estimate, _, expiry) in open.iter_mut() {
                if *expiry == Expiry::Due {
                    *expiry = if refund {
                        *spent -= *estimate as f64;
                        Expiry::GivenBack
                    } else {
                        Expiry::Kept
                    };
                }
            }
        };
        // Unsettled reservations: (id, estimate, taken at ms, where it stands); and the
        // settled ones (id, estimate). `spent` is what was taken for good: settled costs as
        // charged, estimates expired and not given back.
        let mut open: Vec<(u128, u64, u64, Expiry)> = Vec::new();
        let mut settled: Vec<(u128, u64)> = Vec::new();
        let mut spent = 0.0;
        let mut now_ms = 0u64;
        let mut next_id = 1u128;
        for op in ops {
            match op {
                Op::Check(estimate, own) => {
                    let asked = request(estimate, next_id, mode(own));
                    next_id += 1;
                    let before = store.peek_now(&asked).tokens;
                    let decided = store.decide_sync(std::slice::from_ref(&asked));
                    prop_assert_eq!(decided.allowed, before >= estimate as f64);
                    sweep(&mut open, &mut spent, mode(own));
                    if decided.allowed {
                        open.push((next_id - 1, estimate, now_ms, Expiry::Live));
                    }
                }
                Op::Settle(n, actual, own) => {
                    // An unsettled one, or (one time in three) one settled before: a retry.
                    let retry = n % 3 == 2 && !settled.is_empty();
                    let (id, estimate) = if retry {
                        settled[n % settled.len()]
                    } else if let Some((id, estimate, _, _)) = open.get(n % open.len().max(1)) {
                        (*id, *estimate)
                    } else {
                        continue;
                    };
                    let asked = request(estimate, id, mode(own));
                    let before = store.peek_now(&asked).tokens;
                    let done = store.settle_now(&Settle {
                        bucket: BucketRequest { cost: actual, ..asked },
                        estimate,
                        max_debt: 0.0,
                    });
                    prop_assert_eq!(done.held, !retry);
                    sweep(&mut open, &mut spent, mode(own));
                    if done.held {
                        let expiry = open
                            .iter()
                            .find(|(open_id, ..)| *open_id == id)
                            .map(|(.., expiry)| *expiry);
                        // What the check's charge stands for now: the estimate, unless it was
                        // given back at expiry (whatever this settle's mode).
                        let standing = match expiry {
                            Some(Expiry::GivenBack) => 0,
                            _ => estimate,
                        };
                        if expiry == Some(Expiry::Kept) {
                            spent -= estimate as f64;
                        }
                        let extra = (actual.saturating_sub(standing) as f64).min(before.max(0.0));
                        spent += actual.min(standing) as f64 + extra;
                        open.retain(|(open_id, ..)| *open_id != id);
                        settled.push((id, estimate));
                    }
                }
                Op::Pass(ms) => {
                    clock.advance_ms(ms);
                    now_ms += ms;
                    // Expired ones cost their estimate until a check or settle gives it back
                    // (under `refund`) or a late settle replaces it by the actual cost.
                    for (_, estimate, at, expiry) in &mut open {
                        if *expiry == Expiry::Live && *at + TTL_MS <= now_ms {
                            *expiry = Expiry::Due;
                            spent += *estimate as f64;
                        }
                    }
                }
            }
            let held: u64 = open
                .iter()
                .filter(|(.., expiry)| *expiry == Expiry::Live)
                .map(|(_, estimate, _, _)| estimate)
                .sum();
            prop_assert_eq!(store.reserved_now(&request(1, 0, false)).tokens, held);
            let bound = BURST + RATE_PER_S * now_ms as f64 / 1000.0;
            prop_assert!(
                held as f64 + spent <= bound + 1e-6,
                "held {} + spent {} > {}", held, spent, bound
            );
        }
    }
}
