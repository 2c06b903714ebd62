//! Quotas per calendar period, on real Redis and the real binary: period boundaries without
//! sleeping (the shipped script with its one `TIME` replaced by a given instant, and the Rust
//! twin over an injected clock, one table for both), exactness across instances,
//! all-or-nothing with buckets, a Cluster and a Sentinel.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::support::{redis_config, RedisServer, Tollgate};
use tollgate_core::base::calendar::Period;
use tollgate_core::base::clock::ManualClock;
use tollgate_core::kinds::BucketRequest;
use tollgate_core::store::memory::MemoryStore;

use crate::reports::{json, post, TOKEN};

mod periods;
// The reports tests read replies and pin the script's clock as these do.
pub(crate) use periods::{bucket_reply, pinned_eval, report_reply, utc};
#[cfg(feature = "e2e")]
mod topologies;

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

#[test]
fn the_guide_s_quota_and_report_examples_validate() {
    let guide = include_str!("../../../docs/GUIDE.md");
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
