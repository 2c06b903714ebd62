//! Quotas per calendar period, on real Redis and the real binary: period boundaries without
//! sleeping (the shipped script with its one `TIME` replaced by a given instant, and the Rust
//! twin over an injected clock, one table for both), exactness across instances,
//! all-or-nothing with buckets, a Cluster and a Sentinel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::support::{redis_config, RedisServer, Tollgate};
use tollgate::base::calendar::Period;
use tollgate::base::clock::ManualClock;
use tollgate::kinds::BucketRequest;
use tollgate::store::memory::MemoryStore;

use crate::reports::{json, post, TOKEN};

/// Unix seconds of a UTC date and time, counted here without the code under test.
pub(crate) fn utc(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> i64 {
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
    BucketRequest::quota(key, period, QUOTA)
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
pub(crate) fn pinned_eval(
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
pub(crate) fn bucket_reply(reply: &redis::Value) -> (bool, f64, Option<(u64, u64)>) {
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
pub(crate) fn report_reply(reply: &redis::Value) -> f64 {
    match reply {
        redis::Value::Array(items) => text(&items[0]).parse().expect("tokens"),
        other => text(other)
            .split(' ')
            .next()
            .and_then(|t| t.parse().ok())
            .expect("tokens"),
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
        crate::support::wait_until(std::time::Duration::from_secs(10), || tollgate
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
        crate::support::wait_until(std::time::Duration::from_secs(10), || tollgate
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
