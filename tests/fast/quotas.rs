//! Quotas per calendar period and costs known after the response, on real Redis and the real
//! binary: period boundaries without sleeping (the shipped script with its one `TIME` replaced
//! by a given instant, and the Rust twin over an injected clock, one table for both), exactness
//! across instances, all-or-nothing with buckets, `POST /report` and its refusals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::{redis_config, RedisServer, Response, Tollgate};
use tollgate::base::calendar::Period;
use tollgate::store::memory::{ManualClock, MemoryStore};
use tollgate::store::{BucketRequest, Meter};

const TOKEN: &str = "test-admin-token-0123456789";

/// Unix seconds of a UTC date and time, counted here without the code under test.
fn utc(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> i64 {
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = |y: i64, m: i64| match m {
        2 if leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let days: i64 = (1970..y)
        .map(|y| if leap(y) { 366 } else { 365 })
        .sum::<i64>()
        + (1..mo).map(|m| month_days(y, m)).sum::<i64>()
        + d
        - 1;
    days * 86_400 + h * 3_600 + mi * 60 + s
}

const DAY: i64 = 86_400;

/// One boundary: the last second of a period and the first of the next, with both periods'
/// lengths. Month ends of 28, 29, 30 and 31 days, a leap day, a year end, ISO week starts.
#[rustfmt::skip]
fn boundaries() -> Vec<(&'static str, Period, i64, i64, i64)> {
    vec![
        // (what, period, first second of the next period, length before, length after)
        ("February of 28 days ends", Period::Month, utc(2027, 3, 1, 0, 0, 0), 28 * DAY, 31 * DAY),
        ("February of 29 days ends", Period::Month, utc(2028, 3, 1, 0, 0, 0), 29 * DAY, 31 * DAY),
        ("a 30-day month ends", Period::Month, utc(2026, 5, 1, 0, 0, 0), 30 * DAY, 31 * DAY),
        ("a 31-day month ends", Period::Month, utc(2026, 9, 1, 0, 0, 0), 31 * DAY, 30 * DAY),
        ("the year ends", Period::Month, utc(2027, 1, 1, 0, 0, 0), 31 * DAY, 31 * DAY),
        ("January begins a leap year's February", Period::Month, utc(2028, 2, 1, 0, 0, 0), 31 * DAY, 29 * DAY),
        ("2100 is no leap year", Period::Month, utc(2100, 3, 1, 0, 0, 0), 28 * DAY, 31 * DAY),
        ("the leap day ends", Period::Day, utc(2028, 3, 1, 0, 0, 0), DAY, DAY),
        ("the leap day begins", Period::Day, utc(2028, 2, 29, 0, 0, 0), DAY, DAY),
        ("an ISO week starts on Monday", Period::Week, utc(2026, 12, 7, 0, 0, 0), 7 * DAY, 7 * DAY),
        ("an ISO week spans the year end", Period::Week, utc(2027, 1, 4, 0, 0, 0), 7 * DAY, 7 * DAY),
        ("a week starts on a leap day", Period::Week, utc(2044, 2, 29, 0, 0, 0), 7 * DAY, 7 * DAY),
        ("an hour ends at the year end", Period::Hour, utc(2027, 1, 1, 0, 0, 0), 3_600, 3_600),
    ]
}

const QUOTA: u64 = 3;

fn quota_request(key: &str, period: Period) -> BucketRequest {
    BucketRequest {
        key: key.into(),
        rate: 0.0,
        burst: QUOTA as f64,
        cost: 1,
        shadow: false,
        limit: 0,
        meter: Meter::Quota(period),
    }
}

/// What one charge answered: what is left, seconds until the period ends, its length.
type Seen = (f64, u64, u64);

/// The instants of one boundary and the answers due there: one charge in the last
/// microsecond of the old period, two in the first microsecond of the new one (the count of
/// the old period is void).
fn script(start_of_next: i64, before: i64, after: i64) -> Vec<(u64, Seen)> {
    let last = (start_of_next as u64 - 1) * 1_000_000 + 999_999;
    let first = start_of_next as u64 * 1_000_000;
    let q = QUOTA as f64;
    vec![
        (last, (q - 1.0, 1, before as u64)),
        (first, (q - 1.0, after as u64, after as u64)),
        (first, (q - 2.0, after as u64, after as u64)),
    ]
}

#[test]
fn period_boundaries_agree_between_the_rust_twin_and_the_shipped_script() {
    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let shipped = tollgate::store::redis::script::BUCKET_SCRIPT;
    const TIME: &str = "redis.call('TIME')";
    assert_eq!(
        shipped.matches(TIME).count(),
        1,
        "the shipped script reads the clock exactly once"
    );

    let clock = Arc::new(ManualClock::default());
    let memory = MemoryStore::with_clock(1_000, clock.clone());
    for (row, (what, period, next, before, after)) in boundaries().into_iter().enumerate() {
        let key = format!("tg:q{row}:{{k}}");
        for (step, (at_us, due)) in script(next, before, after).into_iter().enumerate() {
            // The Rust twin, on a clock set to the instant.
            clock.set_us(at_us);
            let decided = memory.decide_sync(&[quota_request(&key, period)]);
            let outcome = decided.buckets[0];
            let window = outcome.window.expect("a quota reports its window");
            let twin: Seen = (outcome.tokens, window.ends_in_s, window.length_s);
            assert!(decided.allowed, "{what}, step {step}: memory store admits");
            assert_eq!(twin, due, "{what}, step {step}: Rust twin");

            // The shipped script, its clock replaced by the same instant.
            let reply = pinned_eval(
                &mut conn,
                shipped,
                at_us,
                &key,
                &[period.code(), &QUOTA.to_string(), "1", "0"],
            );
            let (allowed, tokens, window) = bucket_reply(&reply);
            assert!(allowed, "{what}, step {step}: Redis admits");
            let (ends_in, length) = window.expect("a quota reports its window");
            let script_seen: Seen = (tokens, ends_in, length);
            assert_eq!(script_seen, due, "{what}, step {step}: shipped script");
        }
    }
}

#[test]
fn a_used_up_period_denies_until_it_ends_on_both_stores() {
    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let shipped = tollgate::store::redis::script::BUCKET_SCRIPT;
    let clock = Arc::new(ManualClock::default());
    let memory = MemoryStore::with_clock(1_000, clock.clone());
    let end = utc(2028, 3, 1, 0, 0, 0) as u64;
    // Used up on Feb 29 at noon: denied through the last microsecond of February.
    let instants = [
        ((end - 12 * 3_600) * 1_000_000, true),
        ((end - 12 * 3_600) * 1_000_000, true),
        ((end - 12 * 3_600) * 1_000_000, true),
        ((end - 12 * 3_600) * 1_000_000, false),
        ((end - 1) * 1_000_000 + 999_999, false),
        (end * 1_000_000, true),
    ];
    for (step, (at_us, admitted)) in instants.into_iter().enumerate() {
        clock.set_us(at_us);
        let memory_says = memory.decide_sync(&[quota_request("tg:m:{k}", Period::Month)]);
        let reply = pinned_eval(&mut conn, shipped, at_us, "tg:m:{k}", &["m", "3", "1", "0"]);
        assert_eq!(memory_says.allowed, admitted, "step {step}: memory store");
        assert_eq!(bucket_reply(&reply).0, admitted, "step {step}: Redis");
    }
    // The counter expires by itself when its period ends: its TTL runs to the end of March
    // as seen from the pinned clock (at most 31 days).
    let ttl: i64 = redis.cli(&["PTTL", "tg:m:{k}"]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 31 * DAY * 1000, "PTTL {ttl}");
}

fn post(addr: std::net::SocketAddr, token: Option<&str>, body: &str) -> Response {
    crate::support::http::admin_json(addr, "POST", "/report", token, body)
}

fn json(response: &Response) -> serde_json::Value {
    serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", response.body))
}

const REPORT_LIMITS: &str = r#"
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

fn with_token(config: &str) -> String {
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
fn without_a_configured_token_report_is_forbidden_and_names_the_setting() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&redis_config(&redis, "", REPORT_LIMITS));
    let answer = post(
        tollgate.admin,
        Some(TOKEN),
        r#"{"limit": "llm-tokens", "key": ["a"], "cost": 1}"#,
    );
    assert_eq!(answer.status, 403);
    assert!(answer.body.contains("admin_token"), "{}", answer.body);
}

#[test]
fn the_token_may_come_from_a_file_or_the_environment_and_never_shows() {
    let redis = RedisServer::start();
    let dir = crate::support::TempDir::new("token");
    let file = dir.write("token", &format!("{TOKEN}\n"));
    let config = format!(
        "admin_token_file = \"{}\"\n{}",
        file.display(),
        redis_config(&redis, "", REPORT_LIMITS)
    );
    let valid = r#"{"limit": "llm-tokens", "key": ["f"], "cost": 1}"#;
    let (from_file, log) = Tollgate::start_logged(&config, &[("RUST_LOG", "debug")]);
    assert_eq!(post(from_file.admin, Some(TOKEN), valid).status, 200);
    assert_eq!(post(from_file.admin, Some("x"), valid).status, 401);

    let digits = "12345678901234567890";
    let from_env = Tollgate::start_with_env(
        &redis_config(&redis, "", REPORT_LIMITS),
        &[("TOLLGATE_ADMIN_TOKEN", digits)],
    );
    assert_eq!(post(from_env.admin, Some(digits), valid).status, 200);

    let validated = crate::support::tollgate_command()
        .args(["validate", "--config"])
        .arg(&from_env.config_path)
        .env("TOLLGATE_ADMIN_TOKEN", digits)
        .output()
        .expect("run validate");
    let shown = String::from_utf8_lossy(&validated.stdout);
    assert!(validated.status.success(), "{shown}");
    assert!(shown.contains("admin_token   set"), "{shown}");
    assert!(!shown.contains(digits), "validate shows the token: {shown}");
    drop(from_file);
    let logs = std::fs::read_to_string(log).unwrap_or_default();
    assert!(!logs.contains(TOKEN), "the token reached the logs");
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

fn month_now() -> (u64, u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let (start, end) = Period::Month.bounds(now);
    ((end - now) as u64, (end - start) as u64)
}

const MONTHLY: &str = r#"
[[limits]]
name = "monthly"
quota = 500
period = "month"
key = ["header:x-api-key"]
"#;

#[test]
fn three_instances_admit_exactly_the_quota() {
    let redis = RedisServer::start();
    let config = redis_config(&redis, "timeout_ms = 2000\non_error = \"deny\"", MONTHLY);
    let instances: Vec<Tollgate> = (0..3).map(|_| Tollgate::start(&config)).collect();
    let admitted = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(32));
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let mut client = instances[i % 3].client();
            let (admitted, denied, other, start) = (
                admitted.clone(),
                denied.clone(),
                other.clone(),
                start.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..40 {
                    let counter = match client.get("/check", &[("x-api-key", "plan")]) {
                        Ok(r) if r.status == 200 && r.header("ratelimit").is_some() => &admitted,
                        Ok(r) if r.status == 429 => &denied,
                        _ => &other,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("client thread");
    }
    assert_eq!(
        other.load(Ordering::Relaxed),
        0,
        "every answer is 200 or 429"
    );
    assert_eq!(admitted.load(Ordering::Relaxed), 500, "exactly the quota");
    assert_eq!(denied.load(Ordering::Relaxed), 32 * 40 - 500);
    let used = redis.cli(&["HGET", "tollgate:monthly:{plan}", "used"]);
    assert_eq!(used.trim(), "500");
}

#[test]
fn quota_headers_show_the_period_and_a_denial_waits_for_its_end() {
    let redis = RedisServer::start();
    let limits = r#"
[[limits]]
name = "monthly"
quota = 2
period = "month"
key = ["header:x-api-key"]
"#;
    let tollgate = Tollgate::start(&redis_config(&redis, "", limits));
    let key = [("x-api-key", "h")];
    let first = tollgate.check(&key);
    let (ends_in, length) = month_now();
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(format!("\"monthly\";q=2;w={length}").as_str())
    );
    let rate_limit = first.header("ratelimit").unwrap().to_string();
    let t: u64 = rate_limit
        .split(";t=")
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap();
    assert!(rate_limit.starts_with("\"monthly\";r=1;t="), "{rate_limit}");
    assert!(t.abs_diff(ends_in) <= 2, "t={t}, month ends in {ends_in}");
    assert_eq!(tollgate.check(&key).status, 200);
    let denied = tollgate.check(&key);
    assert_eq!(denied.status, 429);
    let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!(
        retry.abs_diff(ends_in) <= 2,
        "Retry-After {retry}, month ends in {ends_in}"
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
}

/// An override's quota replaces the limit's for one key; the period stays the limit's, and
/// other keys keep the limit's quota.
#[test]
fn an_override_gives_one_key_its_own_quota() {
    let redis = RedisServer::start();
    let limits = r#"
[[limits]]
name = "daily"
quota = 2
period = "day"
key = ["header:x-api-key"]
[[limits.overrides]]
key = ["big"]
quota = 4
"#;
    let tollgate = Tollgate::start(&redis_config(&redis, "", limits));
    let admitted = |who: &'static str| {
        (0..6)
            .filter(|_| tollgate.check(&[("x-api-key", who)]).status == 200)
            .count()
    };
    assert_eq!(admitted("big"), 4);
    assert_eq!(admitted("small"), 2);
    let first = tollgate.check(&[("x-api-key", "fresh")]);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"daily\";q=2;w=86400")
    );
    let big = tollgate.check(&[("x-api-key", "big")]);
    assert_eq!(big.status, 429);
    assert_eq!(
        big.header("ratelimit-policy"),
        Some("\"daily\";q=4;w=86400")
    );
}

const BOTH: &str = r#"
[[limits]]
name = "burst"
rate = 0.001
burst = 3
key = ["header:x-api-key", "header:x-client"]

[[limits]]
name = "daily"
quota = 5
period = "day"
key = ["header:x-api-key"]
"#;

/// A bucket that denies charges no quota, and a used-up quota charges no bucket.
fn assert_all_or_nothing(tollgate: &Tollgate) {
    let client = |c: &'static str| [("x-api-key", "both"), ("x-client", c)];
    for _ in 0..3 {
        assert_eq!(tollgate.check(&client("a")).status, 200);
    }
    let denied = tollgate.check(&client("a"));
    assert_eq!(denied.status, 429);
    assert!(denied.body.contains("\"burst\""), "{}", denied.body);
    assert!(denied
        .header("ratelimit-policy")
        .unwrap()
        .contains("\"daily\";q=5;w=86400"));
    // The bucket's denial left the quota at 3 used: another client gets exactly two more.
    assert_eq!(tollgate.check(&client("b")).status, 200);
    let last = tollgate.check(&client("b"));
    assert_eq!(last.status, 200);
    assert!(last
        .header("ratelimit")
        .unwrap()
        .starts_with("\"daily\";r=0;t="));
    let over = tollgate.check(&client("b"));
    assert_eq!(over.status, 429);
    assert!(over.body.contains("\"daily\""), "{}", over.body);
}

#[test]
fn a_quota_and_a_bucket_are_decided_all_or_nothing_on_redis_and_in_memory() {
    let redis = RedisServer::start();
    let on_redis = Tollgate::start(&redis_config(&redis, "", BOTH));
    assert_all_or_nothing(&on_redis);
    assert_eq!(
        redis.cli(&["HGET", "tollgate:daily:{both}", "used"]).trim(),
        "5"
    );
    // The quota's denial charged client b's bucket nothing: 3 - 2 = 1 left.
    let left = redis
        .stored_tokens("tollgate:burst:{both|b}", 3.0)
        .expect("stored");
    assert!((1.0..1.01).contains(&left), "tokens {left}");
    let in_memory = Tollgate::start(BOTH);
    assert_all_or_nothing(&in_memory);
}

#[test]
fn a_quota_limit_is_charged_by_reports_on_the_memory_store_too() {
    let limits = format!(
        "admin_token = \"{TOKEN}\"\n{}",
        r#"
[[limits]]
name = "monthly-tokens"
quota = 1000
period = "month"
charge = "report"
key = ["header:x-api-key"]
"#
    );
    let tollgate = Tollgate::start(&limits);
    let key = [("x-api-key", "m")];
    assert_eq!(tollgate.check(&key).status, 200);
    let body = r#"{"limit": "monthly-tokens", "key": ["m"], "cost": 999}"#;
    let answer = json(&post(tollgate.admin, Some(TOKEN), body));
    assert_eq!(answer["remaining"], 1);
    assert_eq!(tollgate.check(&key).status, 200, "1 left: still admitted");
    let answer = json(&post(tollgate.admin, Some(TOKEN), body));
    assert_eq!(answer["remaining"], 0);
    let (ends_in, _) = month_now();
    let retry = answer["retry_after"].as_u64().unwrap();
    assert!(retry.abs_diff(ends_in) <= 2, "retry_after {retry}");
    let denied = tollgate.check(&key);
    assert_eq!(denied.status, 429);
}

#[test]
fn validate_refuses_mixed_or_incomplete_quota_limits_naming_the_key() {
    let dir = crate::support::TempDir::new("quota-config");
    let cases = [
        ("quota = 5\nperiod = \"month\"\nrate = 1\n", "limits.q.rate"),
        ("quota = 5\n", "limits.q.period"),
        ("period = \"day\"\n", "limits.q.quota"),
        ("quota = 5\nperiod = \"fortnight\"\n", "period"),
        ("quota = 0\nperiod = \"day\"\n", "limits.q.quota"),
        (
            "quota = 5\nperiod = \"day\"\nmax_debt = 3\ncharge = \"report\"\n",
            "limits.q.max_debt",
        ),
        ("rate = 1\nburst = 5\nmax_debt = 3\n", "limits.q.max_debt"),
        (
            "rate = 1\nburst = 5\ncharge = \"report\"\ncost_header = \"x-cost\"\n",
            "limits.q.cost_header",
        ),
        ("quota = 5\nperiod = \"day\"\ncost = 6\n", "limits.q.cost"),
    ];
    for (body, key) in cases {
        let path = dir.write(
            "t.toml",
            &format!("[[limits]]\nname = \"q\"\nkey = [\"ip\"]\n{body}"),
        );
        let out = crate::support::tollgate_command()
            .args(["validate", "--config"])
            .arg(&path)
            .output()
            .expect("run validate");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{body}: {stderr}");
        assert!(stderr.contains(key), "{body}: {stderr}");
    }
    let path = dir.write(
        "ok.toml",
        "[[limits]]\nname = \"q\"\nkey = [\"ip\"]\nquota = 100000\nperiod = \"month\"\n",
    );
    let out = crate::support::tollgate_command()
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .expect("run validate");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("quota 100000 per month"), "{stdout}");
}

/// Runs a shipped script on real Redis with its clock pinned at `at_us`: its one `TIME` call
/// is replaced by that instant, so the shipped arithmetic is what runs.
fn pinned_eval(
    conn: &mut redis::Connection,
    shipped: &str,
    at_us: u64,
    key: &str,
    args: &[&str],
) -> redis::Value {
    const TIME: &str = "redis.call('TIME')";
    assert_eq!(shipped.matches(TIME).count(), 1, "one clock read");
    let instant = format!("{{'{}', '{}'}}", at_us / 1_000_000, at_us % 1_000_000);
    redis::cmd("EVAL")
        .arg(shipped.replacen(TIME, &instant, 1))
        .arg(1)
        .arg(key)
        .arg(args)
        .query(conn)
        .expect("script runs")
}

fn text(value: &redis::Value) -> String {
    match value {
        redis::Value::Int(n) => n.to_string(),
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => panic!("unexpected {other:?}"),
    }
}

/// A one-key `token_bucket.lua` reply as (allowed, level, quota window), read from either
/// shape the script has had: the array `{allowed, tokens, enough, now, t, w}` or the string
/// `"allowed now level enough t w"`. The level is what a quota has left, or a bucket's tokens
/// in micro-tokens.
fn bucket_reply(reply: &redis::Value) -> (bool, f64, Option<(u64, u64)>) {
    let fields: Vec<String> = match reply {
        redis::Value::Array(items) => {
            let mut fields: Vec<String> = items.iter().map(text).collect();
            let now = fields.remove(3);
            fields.insert(1, now);
            fields
        }
        other => text(other).split(' ').map(str::to_string).collect(),
    };
    let window =
        (fields.len() == 6).then(|| (fields[4].parse().expect("t"), fields[5].parse().expect("w")));
    (fields[0] == "1", fields[2].parse().expect("tokens"), window)
}

/// The tokens of a one-key `report.lua` reply.
fn report_reply(reply: &redis::Value) -> f64 {
    match reply {
        redis::Value::Array(items) => text(&items[0]).parse().expect("tokens"),
        other => text(other)
            .split(' ')
            .next()
            .and_then(|t| t.parse().ok())
            .expect("tokens"),
    }
}

#[test]
fn a_reported_bucket_is_used_up_below_one_token_and_admits_from_one_on_both_stores() {
    use tollgate::store::ReportCharge;
    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let clock = Arc::new(ManualClock::default());
    let memory = MemoryStore::with_clock(100, clock.clone());
    let check = BucketRequest {
        key: "tg:r:{k}".into(),
        rate: 1.0,
        burst: 100.0,
        cost: 0,
        shadow: false,
        limit: 0,
        meter: Meter::Bucket,
    };
    let report = |cost: u64| ReportCharge {
        bucket: BucketRequest {
            cost,
            ..check.clone()
        },
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
                    tollgate::store::redis::script::REPORT_SCRIPT,
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
                    tollgate::store::redis::script::BUCKET_SCRIPT,
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

/// A quota per tenant and a bucket per user: keyed on different parts, so on a Cluster they
/// live in different slots and a denial in one slot must refund the quota charged in the other.
#[cfg(feature = "e2e")]
const ACROSS_SLOTS: &str = r#"
[[limits]]
name = "per-user"
rate = 0.001
burst = 2
key = ["header:x-user"]

[[limits]]
name = "tenant-daily"
quota = 5
period = "day"
key = ["header:x-tenant"]

[[limits]]
name = "tenant-tokens"
quota = 1000
period = "month"
charge = "report"
key = ["header:x-tenant"]

[[limits]]
name = "user-tokens"
rate = 0.001
burst = 100
charge = "report"
key = ["header:x-user"]
"#;

/// The bucket denies while the quota (another slot) admits: the quota must count nothing. With
/// the deny cache on, the denial may come from the cache, which charges nothing either; the
/// Cluster test turns it off so the refund runs.
#[cfg(feature = "e2e")]
fn assert_quota_refunded_across_slots(tollgate: &Tollgate) {
    let from = |user: &'static str| [("x-tenant", "acme"), ("x-user", user)];
    assert_eq!(tollgate.check(&from("u1")).status, 200);
    assert_eq!(tollgate.check(&from("u1")).status, 200);
    let denied = tollgate.check(&from("u1"));
    assert_eq!(denied.status, 429, "{}", denied.body);
    assert!(denied.body.contains("\"per-user\""), "{}", denied.body);
    // The quota counted 2: three more for the tenant, then no more.
    for user in ["u2", "u2", "u3"] {
        assert_eq!(tollgate.check(&from(user)).status, 200, "{user}");
    }
    let over = tollgate.check(&from("u3"));
    assert_eq!(over.status, 429);
    assert!(over.body.contains("\"tenant-daily\""), "{}", over.body);
}

#[cfg(feature = "e2e")]
fn on_a_cluster_quotas_refund_across_slots_and_reports_span_slots() {
    let cluster = crate::support::cluster::RedisCluster::start();
    let seeds: Vec<String> = cluster.seeds().iter().map(|s| format!("\"{s}\"")).collect();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ncluster = [{}]\n\
         timeout_ms = 2000\non_error = \"deny\"\ndeny_cache = false\n{ACROSS_SLOTS}",
        seeds.join(", ")
    );
    let tollgate = Tollgate::start(&config);
    assert!(
        crate::support::wait_until(Duration::from_secs(10), || tollgate
            .check(&[("x-tenant", "warmup"), ("x-user", "warmup")])
            .header("ratelimit")
            .is_some()),
        "the cluster decides"
    );
    assert_quota_refunded_across_slots(&tollgate);
    // One report body charging keys in two slots.
    let answer = post(
        tollgate.admin,
        Some(TOKEN),
        r#"[{"limit": "tenant-tokens", "key": ["acme"], "cost": 1000},
            {"limit": "user-tokens", "key": ["u9"], "cost": 150}]"#,
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answers = json(&answer);
    assert_eq!(answers[0]["remaining"], 0);
    assert_eq!(answers[1]["remaining"], 0);
    assert!(answers[1]["retry_after"].as_u64().unwrap() > 40_000);
    let denied = tollgate.check(&[("x-tenant", "acme"), ("x-user", "u9")]);
    assert_eq!(denied.status, 429);
}

#[cfg(feature = "e2e")]
fn behind_sentinel_quotas_and_reports_work() {
    let setup = crate::support::cluster::SentinelSetup::start();
    let urls: Vec<String> = setup.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ntimeout_ms = 2000\n\
         on_error = \"deny\"\nsentinel = {{ master = \"{}\", urls = [{}] }}\n{ACROSS_SLOTS}",
        crate::support::cluster::MASTER_NAME,
        urls.join(", ")
    );
    let tollgate = Tollgate::start(&config);
    assert!(
        crate::support::wait_until(Duration::from_secs(10), || tollgate
            .check(&[("x-tenant", "warmup"), ("x-user", "warmup")])
            .header("ratelimit")
            .is_some()),
        "the master decides"
    );
    assert_quota_refunded_across_slots(&tollgate);
    let answer = post(
        tollgate.admin,
        Some(TOKEN),
        r#"{"limit": "tenant-tokens", "key": ["acme"], "cost": 1000}"#,
    );
    assert_eq!(json(&answer)["remaining"], 0, "{}", answer.body);
    assert_eq!(
        tollgate
            .check(&[("x-tenant", "acme"), ("x-user", "u7")])
            .status,
        429
    );
}

#[test]
fn the_guide_s_quota_and_report_examples_validate() {
    let guide = include_str!("../../docs/GUIDE.md");
    let dir = crate::support::TempDir::new("readme");
    let token = dir.write("token", TOKEN);
    let blocks: Vec<&str> = guide
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .filter(|block| block.contains("quota") || block.contains("charge"))
        .collect();
    assert!(blocks.len() >= 3, "found {} examples", blocks.len());
    for block in blocks {
        let config = block.replace(
            "/var/run/secrets/tollgate/admin-token",
            &token.display().to_string(),
        );
        let path = dir.write("example.toml", &config);
        let out = crate::support::tollgate_command()
            .args(["validate", "--config"])
            .arg(&path)
            .output()
            .expect("run validate");
        assert!(
            out.status.success(),
            "{block}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn sighup_rotates_the_admin_token() {
    let dir = crate::support::TempDir::new("rotate");
    let file = dir.write("token", TOKEN);
    let config = format!("admin_token_file = \"{}\"\n{REPORT_LIMITS}", file.display());
    let tollgate = Tollgate::start(&config);
    let body = r#"{"limit": "llm-tokens", "key": ["r"], "cost": 1}"#;
    assert_eq!(post(tollgate.admin, Some(TOKEN), body).status, 200);
    let rotated = "rotated-token-9876543210";
    dir.write("token", rotated);
    tollgate.signal("HUP");
    assert!(
        crate::support::wait_until(Duration::from_secs(5), || post(
            tollgate.admin,
            Some(rotated),
            body
        )
        .status
            == 200),
        "the new token is accepted after SIGHUP"
    );
    assert_eq!(post(tollgate.admin, Some(TOKEN), body).status, 401);
}

/// Second tier (`cargo test --features e2e`): a Redis Cluster of six nodes, a Sentinel setup.
/// One module, so scripts/test.sh runs exactly these by the `e2e::` prefix.
#[cfg(feature = "e2e")]
mod e2e {
    #[test]
    fn on_a_cluster_quotas_refund_across_slots_and_reports_span_slots() {
        super::on_a_cluster_quotas_refund_across_slots_and_reports_span_slots();
    }

    #[test]
    fn behind_sentinel_quotas_and_reports_work() {
        super::behind_sentinel_quotas_and_reports_work();
    }
}
