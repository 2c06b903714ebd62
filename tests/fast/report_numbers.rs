//! `POST /report`, peek and `/check` take a key's numbers from one place: an override (runtime
//! before the file's) binds the reports of its key, not only its checks. On real Redis and the
//! real binary, plus the key a report names compared with the key a check builds.

use figment::providers::{Format, Toml};
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::support::http::admin_json;
use crate::support::{redis_config, RedisServer, Response, Tollgate};
use tollgate_core::config::Config;
use tollgate_core::limiter::report;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::policy::Policy;
use tollgate_core::request::OriginalRequest;

const TOKEN: &str = "report-numbers-token-0123";

/// A roomy reported limit (100/s, burst 1000) with a throttled key in the file (`slow`: 10
/// tokens that barely refill) and a raised one (`big`: burst 100,000); a daily quota of 100
/// with a key held to 5.
const LIMITS: &str = r#"
[[limits]]
name = "llm"
rate = 100
burst = 1000
charge = "report"
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["llm"] }
[[limits.overrides]]
key = ["slow"]
rate = "1/hour"
burst = 10
[[limits.overrides]]
key = ["big"]
burst = 100000

[[limits]]
name = "daily"
quota = 100
period = "day"
charge = "report"
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["daily"] }
[[limits.overrides]]
key = ["five"]
quota = 5
"#;

fn start(redis: &RedisServer) -> Tollgate {
    Tollgate::start(&format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(redis, "", LIMITS)
    ))
}

fn report(tollgate: &Tollgate, limit: &str, key: &str, cost: u64) -> serde_json::Value {
    let answer = admin_json(
        tollgate.admin,
        "POST",
        "/report",
        Some(TOKEN),
        &format!(r#"{{"limit": "{limit}", "key": ["{key}"], "cost": {cost}}}"#),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).expect("JSON")
}

fn check(tollgate: &Tollgate, plan: &str, key: &str) -> Response {
    tollgate.check(&[("x-plan", plan), ("x-api-key", key)])
}

/// check → upstream → report of 4, forty times: the key's 10 tokens (refilling one an hour)
/// admit three rounds at most (10, 6, 2 are above 0; then -2), whatever the limit allows.
fn assert_throttled_loop(tollgate: &Tollgate, key: &str) {
    let first = report(tollgate, "llm", key, 4);
    assert_eq!(first["remaining"], 6, "the key's burst of 10, not 1000");
    let admitted = (0..40)
        .filter(|_| {
            let allowed = check(tollgate, "llm", key).status == 200;
            if allowed {
                report(tollgate, "llm", key, 4);
            }
            allowed
        })
        .count();
    assert!(
        admitted <= 2,
        "admitted {admitted} of 40 past the key's own burst"
    );
    let last = report(tollgate, "llm", key, 0);
    assert_eq!(last["remaining"], 0);
    assert!(last["retry_after"].as_u64().unwrap() > 60, "{last}");
}

#[test]
fn a_file_override_bounds_the_reports_of_a_throttled_key() {
    let redis = RedisServer::start();
    let tollgate = start(&redis);
    assert_throttled_loop(&tollgate, "slow");
}

#[test]
fn a_runtime_override_bounds_the_reports_of_a_throttled_key() {
    let redis = RedisServer::start();
    let tollgate = start(&redis);
    let put = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/llm?key=held",
        Some(TOKEN),
        r#"{"rate": "1/hour", "burst": 10}"#,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    assert_throttled_loop(&tollgate, "held");
    // A runtime override beats the file's for the same key.
    let put = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/llm?key=big",
        Some(TOKEN),
        r#"{"burst": 20}"#,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(report(&tollgate, "llm", "big", 5)["remaining"], 15);
}

#[test]
fn a_raised_override_burst_is_honoured_by_reports_and_peeks() {
    let redis = RedisServer::start();
    let tollgate = start(&redis);
    let after = report(&tollgate, "llm", "big", 50_000);
    assert_eq!(after["remaining"], 50_000, "{after}");
    assert!(after.get("retry_after").is_none(), "{after}");
    assert_eq!(check(&tollgate, "llm", "big").status, 200);
    let peek = admin_json(
        tollgate.admin,
        "GET",
        "/v1/buckets/llm?key=big",
        Some(TOKEN),
        "",
    );
    let peek: serde_json::Value = serde_json::from_str(&peek.body).expect("JSON");
    assert_eq!(peek["burst"], 100_000.0, "{peek}");
    assert_eq!(peek["override"]["burst"], 100_000, "{peek}");
}

#[test]
fn a_quota_override_sets_what_a_report_leaves() {
    let redis = RedisServer::start();
    let tollgate = start(&redis);
    assert_eq!(report(&tollgate, "daily", "five", 1)["remaining"], 4);
    assert_eq!(report(&tollgate, "daily", "other", 1)["remaining"], 99);
    let used_up = report(&tollgate, "daily", "five", 4);
    assert_eq!(used_up["remaining"], 0);
    assert!(used_up["retry_after"].as_u64().unwrap() >= 1, "{used_up}");
    assert_eq!(check(&tollgate, "daily", "five").status, 429);
}

#[test]
fn a_key_an_override_makes_unlimited_is_charged_nothing_by_a_report() {
    let redis = RedisServer::start();
    let tollgate = start(&redis);
    let put = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/llm?key=free",
        Some(TOKEN),
        r#"{"unlimited": true}"#,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    let after = report(&tollgate, "llm", "free", 1_000_000);
    assert_eq!(after["unlimited"], true, "{after}");
    assert_eq!(
        redis.cli(&["EXISTS", "tollgate:llm:{free}"]).trim(),
        "0",
        "no bucket written"
    );
    assert_eq!(check(&tollgate, "llm", "free").status, 200);
}

const KEYED: &str = r#"
[[limits]]
name = "reported"
rate = 10
burst = 100
charge = "report"
key = ["ip", "host", "path", "method", "header:x-api-key"]
"#;

/// The key a report names for some values is the key `/check` builds for a request carrying
/// them, however they are spelled: one tail builder for both.
#[test]
fn a_report_names_the_bucket_a_check_with_the_same_values_draws_from() {
    let toml = format!("[store]\nbackend = \"memory\"\n{KEYED}\n");
    let config: Config =
        figment::Figment::from(figment::providers::Serialized::defaults(Config::default()))
            .merge(Toml::string(&toml))
            .extract()
            .expect("test config parses");
    let policy = Policy::compile(&config, &Metrics::new()).expect("compiles");
    #[rustfmt::skip]
    let cases: &[[&str; 5]] = &[
        ["203.0.113.9", "example.com", "/a", "GET", "plain"],
        ["2001:db8:1:2::9", "Example.COM.", "/a/./b//c/../d", "POST", "a|b%7C{x}#"],
        ["::ffff:192.0.2.1", "api.example.com", "/caf\u{e9}/%7euser", "DELETE", "k"],
        ["192.0.2.1", "h\u{f6}st.example", "/", "GET", "caf\u{e9}"],
    ];
    for case in cases {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("x-forwarded-host", case[1]),
            ("x-forwarded-uri", case[2]),
            ("x-forwarded-method", case[3]),
            ("x-api-key", case[4]),
        ] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_bytes(value.as_bytes()).unwrap(),
            );
        }
        let request = OriginalRequest::new(&headers, "GET", "/", case[0].parse().unwrap());
        let checked = policy.applicable(&request).expect("applies");
        let body = serde_json::json!({"limit": "reported", "key": case, "cost": 1}).to_string();
        let reported = report::parse(body.as_bytes(), &policy).expect("a valid report");
        assert_eq!(reported.charges[0].bucket.key, checked[0].key, "{case:?}");
    }
    // An IPv6 client's network, as an operator may write it, is that client's key.
    let body =
        r#"{"limit": "reported", "key": ["2001:db8:1:2::/64", "h", "/", "GET", "k"], "cost": 1}"#;
    let reported = report::parse(body.as_bytes(), &policy).expect("a network is an ip value");
    assert_eq!(
        reported.charges[0].bucket.key,
        "tollgate:reported:{2001:db8:1:2::/64|h|/|GET|k}"
    );
}
