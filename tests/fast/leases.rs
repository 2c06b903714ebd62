//! Concurrency limits: at most N leases held per key, across instances, on real Redis and the
//! real binary; a lease given back by `POST /release` (once), or expiring by itself; all or
//! nothing with the other limits; and the memory store's twin over random interleavings.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use crate::support::{assert_denied, limit, redis_config, RedisServer, Response, Tollgate};
use tollgate_core::base::clock::ManualClock;
use tollgate_core::kinds::concurrency::Lease;
use tollgate_core::kinds::BucketRequest;
use tollgate_core::store::memory::MemoryStore;

const TOKEN: &str = "test-admin-token-0123456789";

fn concurrency(name: &str, n: u64, ttl_s: u64) -> String {
    format!(
        "[[limits]]\nname = {name:?}\nconcurrency = {n}\nlease_ttl_s = {ttl_s}\nkey = [\"header:x-api-key\"]\n"
    )
}

fn start(redis: &RedisServer, limits: &str) -> Tollgate {
    Tollgate::start(&format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(redis, "", limits)
    ))
}

fn release(tollgate: &Tollgate, lease: &str) -> Response {
    let body = serde_json::json!({ "lease": lease }).to_string();
    crate::support::http::admin_json(tollgate.admin, "POST", "/release", Some(TOKEN), &body)
}

fn released(response: &Response) -> u64 {
    assert_eq!(response.status, 200, "{}", response.body);
    let body: serde_json::Value = serde_json::from_str(&response.body).expect("JSON");
    body["released"].as_u64().expect("a count")
}

/// The leases held in Redis under the one concurrency key of `limit`.
fn held(redis: &RedisServer, limit: &str) -> (String, u64) {
    let keys = redis.cli(&["KEYS", &format!("*:{limit}:*")]);
    let key = keys.lines().next().unwrap_or_default().trim().to_string();
    if key.is_empty() {
        return (key, 0);
    }
    let count = redis.cli(&["ZCARD", &key]).trim().parse().expect("ZCARD");
    (key, count)
}

#[test]
fn held_leases_never_exceed_the_limit_with_several_instances() {
    const N: u64 = 3;
    let redis = RedisServer::start();
    let limits = concurrency("conc", N, 60);
    let instances: Vec<Tollgate> = (0..3).map(|_| start(&redis, &limits)).collect();
    let holding = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let over = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        for worker in 0..9 {
            let (holding, most, denied, over) =
                (holding.clone(), most.clone(), denied.clone(), over.clone());
            let instances = &instances;
            scope.spawn(move || {
                for round in 0..40 {
                    let at = &instances[(worker + round) % instances.len()];
                    let answer = at.check(&[("x-api-key", "acme")]);
                    if answer.status != 200 {
                        assert_denied(&answer, Some(1));
                        denied.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let lease = answer.header("x-tollgate-lease").expect("a lease id");
                    // Held from before this line until after the release below, in Redis.
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    if now > N {
                        over.store(true, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    holding.fetch_sub(1, Ordering::SeqCst);
                    let back = &instances[(worker + round + 1) % instances.len()];
                    assert_eq!(released(&release(back, lease)), 1, "held until released");
                }
            });
        }
    });
    let most = most.load(Ordering::SeqCst);
    assert!(
        !over.load(Ordering::SeqCst),
        "{most} leases held at once, limit {N}"
    );
    assert!(
        denied.load(Ordering::Relaxed) > 0,
        "nine workers on three slots were never denied: the limit was not enforced"
    );
    assert_eq!(held(&redis, "conc").1, 0, "every lease was given back");
    // All N slots are free again, and no more.
    let ids: Vec<String> = (0..N)
        .map(|_| {
            let answer = instances[0].check(&[("x-api-key", "acme")]);
            assert_eq!(answer.status, 200);
            answer
                .header("x-tollgate-lease")
                .expect("lease")
                .to_string()
        })
        .collect();
    assert_eq!(instances[1].check(&[("x-api-key", "acme")]).status, 429);
    assert_eq!(held(&redis, "conc").1, N);
    // Another key has slots of its own.
    assert_eq!(instances[2].check(&[("x-api-key", "other")]).status, 200);
    for id in ids {
        assert_eq!(released(&release(&instances[2], &id)), 1);
    }
}

#[test]
fn a_release_is_idempotent_and_frees_the_slot() {
    let redis = RedisServer::start();
    let tollgate = start(&redis, &concurrency("one", 1, 60));
    let first = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(first.status, 200);
    let lease = first.header("x-tollgate-lease").expect("lease").to_string();
    assert!(lease.starts_with("one."), "{lease}");
    let denied = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(denied.status, 429);
    assert!(denied.header("x-tollgate-lease").is_none());

    assert_eq!(released(&release(&tollgate, &lease)), 1);
    assert_eq!(
        released(&release(&tollgate, &lease)),
        0,
        "a second release changes nothing"
    );
    assert_eq!(held(&redis, "one").1, 0);
    let again = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(again.status, 200, "the released slot is free");
    assert_ne!(again.header("x-tollgate-lease"), Some(lease.as_str()));
    // The old id, released before, does not give back the new lease.
    assert_eq!(released(&release(&tollgate, &lease)), 0);
    assert_eq!(tollgate.check(&[("x-api-key", "acme")]).status, 429);

    // Refusals: no token, a malformed id, a limit that is not a concurrency limit.
    let body = serde_json::json!({ "lease": lease }).to_string();
    let anonymous =
        crate::support::http::admin_json(tollgate.admin, "POST", "/release", None, &body);
    assert_eq!(anonymous.status, 401);
    for bad in [
        "nonsense",
        "one.zz.0123",
        "nope.61.0123456789abcdef0123456789abcdef",
    ] {
        let answer = release(&tollgate, bad);
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
        assert!(answer.body.contains("lease"), "{}", answer.body);
    }
}

#[test]
fn an_expired_lease_frees_its_slot_and_the_key_expires_with_its_last_lease() {
    let redis = RedisServer::start();
    let tollgate = start(&redis, &concurrency("ttl", 1, 30));
    let first = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(first.status, 200);
    let (key, count) = held(&redis, "ttl");
    assert_eq!(count, 1);
    let pttl: i64 = redis.cli(&["PTTL", &key]).trim().parse().expect("PTTL");
    assert!(
        pttl > 0 && pttl <= 30_001,
        "the key lives as long as its lease: {pttl}"
    );
    assert_eq!(tollgate.check(&[("x-api-key", "acme")]).status, 429);

    // The lease's expiry, moved into the past (as if 30 s had passed): the next check drops it.
    let member = redis.cli(&["ZRANGE", &key, "0", "0"]).trim().to_string();
    redis.cli(&["ZADD", &key, "XX", "1", &member]);
    let after = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(after.status, 200, "an expired lease holds no slot");
    assert_eq!(held(&redis, "ttl").1, 1, "the expired lease was dropped");
    // Releasing the expired one gives back nothing, and leaves the live one held.
    let old = first.header("x-tollgate-lease").expect("lease");
    assert_eq!(released(&release(&tollgate, old)), 0);
    assert_eq!(tollgate.check(&[("x-api-key", "acme")]).status, 429);
}

#[test]
fn a_request_denied_by_another_limit_takes_no_lease_and_one_without_a_lease_pays_nothing() {
    let redis = RedisServer::start();
    let limits = format!(
        "{}{}",
        concurrency("slots", 1, 60),
        limit("budget", 0.001, 2, &["header:x-api-key"])
    );
    let tollgate = start(&redis, &limits);
    let tokens = |redis: &RedisServer| -> f64 {
        let keys = redis.cli(&["KEYS", "*:budget:*"]);
        let key = keys.lines().next().unwrap_or_default().trim().to_string();
        // Absent: full.
        redis.stored_tokens(&key, 2.0).unwrap_or(2.0)
    };

    // Takes the one slot and one of two tokens.
    let first = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(first.status, 200);
    let lease = first.header("x-tollgate-lease").expect("lease").to_string();
    // Denied for lack of a slot: the token stays.
    let no_slot = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(no_slot.status, 429);
    assert!(no_slot.body.contains("slots"), "{}", no_slot.body);
    assert!(
        (tokens(&redis) - 1.0).abs() < 0.01,
        "charged: {}",
        tokens(&redis)
    );

    // The slot back; the last token goes with the next lease, which is given back too.
    assert_eq!(released(&release(&tollgate, &lease)), 1);
    let second = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(second.status, 200);
    let lease = second
        .header("x-tollgate-lease")
        .expect("lease")
        .to_string();
    assert_eq!(released(&release(&tollgate, &lease)), 1);

    // Now the budget denies: no lease is taken although a slot is free.
    let no_budget = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(no_budget.status, 429);
    assert!(no_budget.body.contains("budget"), "{}", no_budget.body);
    assert!(no_budget.header("x-tollgate-lease").is_none());
    assert_eq!(
        held(&redis, "slots").1,
        0,
        "a denied request holds no lease"
    );
}

// The memory store's twin, over random interleavings on a manual clock.

const N: u64 = 3;
const TTL_MS: u64 = 1_000;

fn lease_request(key: &str, id: u128) -> BucketRequest {
    BucketRequest::lease(key, N, Lease { ttl_ms: TTL_MS, id })
}

#[derive(Debug, Clone)]
enum Op {
    /// A check on key `0` or `1`.
    Take(usize),
    /// Release the held lease at this position (modulo), or one released before.
    Release(usize, bool),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize).prop_map(Op::Take),
        3 => (0..8usize, any::<bool>()).prop_map(|(i, again)| Op::Release(i, again)),
        1 => (1..1_500u64).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Held leases never exceed N; a take succeeds exactly when fewer than N are held;
    /// a release gives back a held lease once and nothing else.
    #[test]
    fn memory_leases_match_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::with_clock(1_000, clock.clone());
        let keys = ["tg:c:{a}", "tg:c:{b}"];
        // The model: per key, (id, expiry in ms) of each held lease.
        let mut model: [Vec<(u128, u64)>; 2] = [Vec::new(), Vec::new()];
        let mut gone: Vec<(usize, u128)> = Vec::new();
        let mut now_ms = 0u64;
        let mut next_id = 1u128;
        for op in ops {
            for set in &mut model {
                set.retain(|(_, until)| *until > now_ms);
            }
            match op {
                Op::Take(k) => {
                    let id = next_id;
                    next_id += 1;
                    let decided = store.decide_sync(&[lease_request(keys[k], id)]);
                    let room = (model[k].len() as u64) < N;
                    prop_assert_eq!(decided.allowed, room, "take with {} held", model[k].len());
                    if room {
                        model[k].push((id, now_ms + TTL_MS));
                    }
                    let free = N as f64 - model[k].len() as f64;
                    prop_assert_eq!(decided.buckets[0].tokens, free);
                }
                Op::Release(i, again) => {
                    let all: Vec<(usize, u128)> = (0..2)
                        .flat_map(|k| model[k].iter().map(move |(id, _)| (k, *id)))
                        .collect();
                    if again && !gone.is_empty() {
                        let (k, id) = gone[i % gone.len()];
                        let member = format!("{id:032x}");
                        prop_assert!(!store.release_now(keys[k], &member), "released twice");
                    } else if !all.is_empty() {
                        let (k, id) = all[i % all.len()];
                        let member = format!("{id:032x}");
                        prop_assert!(store.release_now(keys[k], &member), "a held lease");
                        model[k].retain(|(held, _)| *held != id);
                        gone.push((k, id));
                    }
                }
                Op::Advance(ms) => {
                    clock.advance_ms(ms);
                    now_ms += ms;
                    for (k, set) in model.iter().enumerate() {
                        for (id, until) in set {
                            if *until <= now_ms {
                                gone.push((k, *id));
                            }
                        }
                    }
                }
            }
            for (k, key) in keys.iter().enumerate() {
                let live = model[k].iter().filter(|(_, until)| *until > now_ms).count() as u64;
                prop_assert!(live <= N);
                let peeked = store.peek_now(&lease_request(key, 0));
                prop_assert_eq!(peeked.tokens, (N - live) as f64, "key {}", k);
            }
        }
    }
}

#[test]
fn a_peek_shows_the_leases_held_and_v1_limits_the_concurrency() {
    let redis = RedisServer::start();
    let tollgate = start(&redis, &concurrency("peeked", 4, 45));
    for _ in 0..3 {
        assert_eq!(tollgate.check(&[("x-api-key", "acme")]).status, 200);
    }
    let peek = crate::support::http::admin_json(
        tollgate.admin,
        "GET",
        "/v1/buckets/peeked?key=acme",
        Some(TOKEN),
        "",
    );
    assert_eq!(peek.status, 200, "{}", peek.body);
    let body: serde_json::Value = serde_json::from_str(&peek.body).expect("JSON");
    let text = body.to_string();
    assert!(
        text.contains("\"held\":3.0") || text.contains("\"held\":3"),
        "{text}"
    );
    assert!(text.contains("\"remaining\":1"), "{text}");
    assert!(text.contains("\"lease_ttl_s\":45"), "{text}");
    assert_eq!(held(&redis, "peeked").1, 3, "a peek takes no lease");

    let limits =
        crate::support::http::admin_json(tollgate.admin, "GET", "/v1/limits", Some(TOKEN), "");
    assert!(
        limits.body.contains("\"concurrency\": 4") && limits.body.contains("\"lease_ttl_s\": 45"),
        "{}",
        limits.body
    );
}

/// A Redis Cluster decides a request spanning slots one slot at a time and refunds the slots
/// that charged when another denies: a lease is refunded by removing it.
#[test]
fn a_cross_slot_refund_gives_the_lease_back() {
    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let lease = "L60000:000000000000000000000000000000ab";
    let taken: String = redis::cmd("EVAL")
        .arg(tollgate_core::store::redis::script::BUCKET_SCRIPT)
        .arg(1)
        .arg("tg:c:{k}")
        .arg(&[lease, "2", "1", "0"])
        .query(&mut conn)
        .expect("take");
    let fields: Vec<&str> = taken.split(' ').collect();
    assert_eq!(
        (fields[0], fields[2], fields[3]),
        ("1", "1", "1"),
        "{taken}"
    );
    assert_eq!(held(&redis, "c").1, 1);
    let refunded: Vec<String> = redis::cmd("EVAL")
        .arg(tollgate_core::store::redis::script::REFUND_SCRIPT)
        .arg(1)
        .arg("tg:c:{k}")
        .arg(&[lease, "2", "1", fields[1]])
        .query(&mut conn)
        .expect("refund");
    assert_eq!(refunded, vec!["2".to_string()]);
    assert_eq!(held(&redis, "c").1, 0, "the refunded lease is gone");
}
