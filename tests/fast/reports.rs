//! Costs known after the response: `POST /report`, its refusals, reported buckets and their
//! debt bound, on real Redis and the real binary, and the shipped report script against its
//! Rust twin.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::support::{redis_config, RedisServer, Response, Tollgate};
use tollgate_core::base::clock::ManualClock;
use tollgate_core::kinds::BucketRequest;
use tollgate_core::store::memory::MemoryStore;

use crate::quotas::{bucket_reply, pinned_eval, report_reply, utc};

pub(crate) const TOKEN: &str = "test-admin-token-0123456789";

pub(crate) fn post(addr: std::net::SocketAddr, token: Option<&str>, body: &str) -> Response {
    crate::support::http::admin_json(addr, "POST", "/report", token, body)
}

pub(crate) fn json(response: &Response) -> serde_json::Value {
    serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", response.body))
}

pub(crate) const REPORT_LIMITS: &str = r#"
[[limits]]
name = "llm-tokens"
rate = 0.001
burst = 100
max_debt = 100
charge = "report"
key = ["header:x-api-key"]

[[limits]]
name = "per-key"
rate = 1000
burst = 1000
key = ["header:x-api-key"]
"#;

pub(crate) fn with_token(config: &str) -> String {
    format!("admin_token = \"{TOKEN}\"\n{config}")
}

#[test]
fn report_refusals_name_what_is_wrong() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&with_token(&redis_config(&redis, "", REPORT_LIMITS)));
    let cases: &[(&str, u16, &str)] = &[
        ("{not json", 400, "body"),
        ("42", 400, "body"),
        ("[]", 400, "body"),
        (r#"{"key": ["a"], "cost": 1}"#, 400, "limit"),
        (r#"{"limit": 7, "key": ["a"], "cost": 1}"#, 400, "limit"),
        (r#"{"limit": "llm-tokens", "cost": 1}"#, 400, "key"),
        (
            r#"{"limit": "llm-tokens", "key": "a", "cost": 1}"#,
            400,
            "key",
        ),
        (
            r#"{"limit": "llm-tokens", "key": ["a", "b"], "cost": 1}"#,
            400,
            "key",
        ),
        (
            r#"{"limit": "llm-tokens", "key": [1], "cost": 1}"#,
            400,
            "key[0]",
        ),
        (r#"{"limit": "llm-tokens", "key": ["a"]}"#, 400, "cost"),
        (
            r#"{"limit": "llm-tokens", "key": ["a"], "cost": -1}"#,
            400,
            "cost",
        ),
        (
            r#"{"limit": "llm-tokens", "key": ["a"], "cost": 1.5}"#,
            400,
            "cost",
        ),
        (
            r#"{"limit": "llm-tokens", "key": ["a"], "cost": "9"}"#,
            400,
            "cost",
        ),
        (
            r#"{"limit": "llm-tokens", "key": ["a"], "cost": 1, "tokens": 3}"#,
            400,
            "tokens",
        ),
        (
            r#"[{"limit": "llm-tokens", "key": ["a"], "cost": 1}, 5]"#,
            400,
            "[1]",
        ),
        (
            r#"[{"limit": "llm-tokens", "key": ["a"], "cost": 1}, {"limit": "nope", "key": ["a"], "cost": 1}]"#,
            400,
            "[1].limit",
        ),
        (
            r#"{"limit": "nope", "key": ["a"], "cost": 1}"#,
            400,
            "limit",
        ),
        (
            r#"{"limit": "per-key", "key": ["a"], "cost": 1}"#,
            404,
            "limit",
        ),
    ];
    for (body, status, field) in cases {
        let answer = post(tollgate.admin, Some(TOKEN), body);
        assert_eq!(answer.status, *status, "{body}: {}", answer.body);
        assert_eq!(json(&answer)["field"], *field, "{body}: {}", answer.body);
    }
    // A refused list charges nothing, not even its valid items.
    let check = tollgate.check(&[("x-api-key", "a")]);
    assert_eq!(check.status, 200);
    let left = post(
        tollgate.admin,
        Some(TOKEN),
        r#"{"limit": "llm-tokens", "key": ["a"], "cost": 0}"#,
    );
    assert_eq!(json(&left)["remaining"], 100, "{}", left.body);
    // Without the token, with a wrong one, or not on the admin listener: refused.
    let valid = r#"{"limit": "llm-tokens", "key": ["a"], "cost": 1}"#;
    assert_eq!(post(tollgate.admin, None, valid).status, 401);
    assert_eq!(
        post(tollgate.admin, Some("wrong-token-0123456789"), valid).status,
        401
    );
    assert_eq!(
        post(tollgate.addr, Some(TOKEN), valid).status,
        404,
        "not on the public listener"
    );
}

#[test]
fn a_reported_bucket_admits_while_a_token_is_left_and_its_debt_stops_at_max_debt() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&with_token(&redis_config(&redis, "", REPORT_LIMITS)));
    let key = [("x-api-key", "acme")];
    // /check charges nothing: a hundred checks leave the bucket full.
    for _ in 0..100 {
        assert_eq!(tollgate.check(&key).status, 200);
    }
    let report = |cost: u64| {
        post(
            tollgate.admin,
            Some(TOKEN),
            &format!(r#"{{"limit": "llm-tokens", "key": ["acme"], "cost": {cost}}}"#),
        )
    };
    let first = report(60);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(json(&first)["remaining"], 40);
    assert!(json(&first).get("retry_after").is_none());
    assert_eq!(tollgate.check(&key).status, 200);
    // 40 - 500 stops at the debt bound: -100, which refills to one token at 0.001/s in
    // 101,000 s.
    let second = report(500);
    assert_eq!(json(&second)["remaining"], 0);
    assert_eq!(json(&second)["retry_after"], 101_000, "{}", second.body);
    let denied = tollgate.check(&key);
    assert_eq!(denied.status, 429);
    // A moment later it has refilled a little: 100,999 or 101,000 s.
    let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!((100_999..=101_000).contains(&retry), "Retry-After {retry}");
    let level = redis
        .stored_tokens("tollgate:llm-tokens:{acme}", 100.0)
        .expect("stored");
    assert!((-100.0..-99.99).contains(&level), "tokens {level}");
    // The debt outlives twice the burst's refill time: the key expires only once full again.
    let ttl: i64 = redis
        .cli(&["PTTL", "tollgate:llm-tokens:{acme}"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl >= 199_000_000, "PTTL {ttl}");
    // A list answers a list, in order.
    let both = post(
        tollgate.admin,
        Some(TOKEN),
        r#"[{"limit": "llm-tokens", "key": ["b"], "cost": 1}, {"limit": "llm-tokens", "key": ["c"], "cost": 2}]"#,
    );
    let answers = json(&both);
    assert_eq!(answers[0]["remaining"], 99);
    assert_eq!(answers[1]["remaining"], 98);
}

#[test]
fn concurrent_checks_and_reports_never_admit_past_the_debt_bound() {
    let redis = RedisServer::start();
    let config = with_token(&redis_config(&redis, "on_error = \"deny\"", REPORT_LIMITS));
    let tollgate = Tollgate::start(&config);
    let start = Arc::new(Barrier::new(12));
    let origin = Instant::now();
    // (sent, admitted) of every check; the moment the first report saw the bucket used up.
    let checks = Arc::new(Mutex::new(Vec::new()));
    let used_up_at = Arc::new(AtomicU64::new(u64::MAX));
    let mut threads = Vec::new();
    for _ in 0..8 {
        let (start, checks) = (start.clone(), checks.clone());
        let mut client = tollgate.client();
        threads.push(std::thread::spawn(move || {
            start.wait();
            for _ in 0..300 {
                let sent = origin.elapsed().as_micros() as u64;
                let answer = client.get("/check", &[("x-api-key", "race")]).unwrap();
                assert!(answer.status == 200 || answer.status == 429, "{answer:?}");
                checks.lock().unwrap().push((sent, answer.status == 200));
            }
        }));
    }
    for _ in 0..4 {
        let (start, used_up_at) = (start.clone(), used_up_at.clone());
        let admin = tollgate.admin;
        threads.push(std::thread::spawn(move || {
            start.wait();
            for _ in 0..10 {
                let answer = post(
                    admin,
                    Some(TOKEN),
                    r#"{"limit": "llm-tokens", "key": ["race"], "cost": 30}"#,
                );
                assert_eq!(answer.status, 200, "{}", answer.body);
                if json(&answer).get("retry_after").is_some() {
                    let at = origin.elapsed().as_micros() as u64;
                    used_up_at.fetch_min(at, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
    }
    for thread in threads {
        thread.join().expect("client thread");
    }
    let used_up = used_up_at.load(Ordering::SeqCst);
    assert!(used_up < u64::MAX, "the reports used the bucket up");
    let checks = checks.lock().unwrap();
    let late_admissions = checks
        .iter()
        .filter(|(sent, admitted)| *admitted && *sent > used_up)
        .count();
    // Reports of 30 from 100: the first used-up answer saw -20 or less, which a rate of
    // 0.001/s cannot bring back above 0 within the test.
    assert_eq!(
        late_admissions, 0,
        "a check admitted after the bucket was used up"
    );
    assert!(
        checks.iter().any(|(_, admitted)| !admitted),
        "checks were denied"
    );
    let level = redis
        .stored_tokens("tollgate:llm-tokens:{race}", 100.0)
        .expect("stored");
    assert!(
        (-100.0..-99.9).contains(&level),
        "40 reports of 30 stop at the debt bound: tokens {level}"
    );
}

#[test]
fn a_report_while_the_store_is_down_is_refused_with_503_not_lost() {
    let mut redis = RedisServer::start();
    let config = with_token(&redis_config(&redis, "timeout_ms = 200", REPORT_LIMITS));
    let tollgate = Tollgate::start(&config);
    let body = r#"{"limit": "llm-tokens", "key": ["down"], "cost": 7}"#;
    assert_eq!(post(tollgate.admin, Some(TOKEN), body).status, 200);
    redis.kill();
    let refused = post(tollgate.admin, Some(TOKEN), body);
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.header("retry-after"), Some("1"));
}

#[test]
fn a_reported_bucket_is_used_up_below_one_token_and_admits_from_one_on_both_stores() {
    use tollgate_core::kinds::ReportCharge;
    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let clock = Arc::new(ManualClock::default());
    let memory = MemoryStore::with_clock(100, clock.clone());
    let check = BucketRequest::bucket("tg:r:{k}", 1.0, 100.0).cost(0);
    let report = |cost: u64| ReportCharge {
        bucket: check.clone().cost(cost),
        max_debt: 100.0,
    };
    let t0 = utc(2027, 6, 1, 12, 0, 0) as u64 * 1_000_000;
    // (at, report cost or a check, tokens after, admitted)
    #[rustfmt::skip]
    let steps: [(u64, Option<u64>, f64, bool); 7] = [
        (t0, Some(100), 0.0, false),
        (t0, None, 0.0, false),
        (t0, Some(500), -100.0, false),
        (t0 + 100_000_000, None, 0.0, false),
        (t0 + 100_999_999, None, 0.999999, false),
        (t0 + 101_000_000, None, 1.0, true),
        (t0 + 101_000_000, Some(0), 1.0, true),
    ];
    for (step, (at, cost, tokens, admitted)) in steps.into_iter().enumerate() {
        clock.set_us(at);
        let (twin, script) = match cost {
            Some(cost) => {
                let twin = memory.report_now(&[report(cost)])[0];
                let reply = pinned_eval(
                    &mut conn,
                    tollgate_core::store::redis::script::REPORT_SCRIPT,
                    at,
                    &check.key,
                    &["1", "100", &cost.to_string(), "100"],
                );
                ((twin.tokens, twin.enough), (report_reply(&reply), None))
            }
            None => {
                let twin = memory.decide_sync(std::slice::from_ref(&check));
                let reply = pinned_eval(
                    &mut conn,
                    tollgate_core::store::redis::script::BUCKET_SCRIPT,
                    at,
                    &check.key,
                    &["1", "100", "0", "0"],
                );
                ((twin.buckets[0].tokens, twin.allowed), {
                    let (allowed, micro_tokens, _) = bucket_reply(&reply);
                    (micro_tokens / 1e6, Some(allowed))
                })
            }
        };
        assert!(
            (twin.0 - tokens).abs() < 1e-9,
            "step {step}: twin tokens {}",
            twin.0
        );
        assert_eq!(twin.1, admitted, "step {step}: twin");
        assert!(
            (script.0 - tokens).abs() < 1e-9,
            "step {step}: script tokens {}",
            script.0
        );
        if let Some(allowed) = script.1 {
            assert_eq!(allowed, admitted, "step {step}: script");
        }
    }
}
