//! The admin API against real processes: `GET /v1/limits`, and `GET`/`DELETE /v1/buckets` on
//! three instances sharing one real Redis with their deny caches on, on the memory store, with
//! and without an admin token, and under hostile query strings.

use std::time::{Duration, Instant};

use crate::support::{
    commandstats, redis_config, short_timings, tollgate_command, HttpClient, RedisServer, Tollgate,
    QUIET_POLL, SHORT_TIMINGS,
};

mod access;
mod buckets;

const TOKEN: &str = "s3cr3t-admin-token-for-tests";
const BEARER: &str = "Bearer s3cr3t-admin-token-for-tests";

/// One token a minute: within a test, buckets change only by checks and resets.
const LIMITS: &str = r#"
[[exempt]]
name = "office"
cidrs = ["10.9.0.0/16"]

[[limits]]
name = "per-key"
rate = "1/min"
burst = 5
key = ["header:x-api-key"]
[[limits.overrides]]
key = ["vip"]
rate = "100/s"
burst = 50

[[limits]]
name = "per-ip"
rate = "1/min"
burst = 1000
key = ["ip"]
"#;

/// How long after the call that taught it a cached denial surely still denies: the cache's
/// `MAX_WINDOW_US` (a second), less a margin for the clock readings around it.
const CACHED_WINDOW: Duration = Duration::from_millis(900);

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// `?key=v1&key=v2`, each value percent-encoded but for unreserved characters.
fn query(values: &[&str]) -> String {
    let encoded: Vec<String> = values
        .iter()
        .map(|value| {
            let mut out = String::from("key=");
            for byte in value.bytes() {
                if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                    out.push(char::from(byte));
                } else {
                    out.push_str(&format!("%{byte:02X}"));
                }
            }
            out
        })
        .collect();
    format!("?{}", encoded.join("&"))
}

fn admin_call(
    tollgate: &Tollgate,
    method: &str,
    path: &str,
    auth: Option<&str>,
) -> crate::support::Response {
    let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
    HttpClient::connect(tollgate.admin)
        .and_then(|mut c| c.request(method, path, &headers))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn peek(tollgate: &Tollgate, limit: &str, key: &[&str], auth: Option<&str>) -> serde_json::Value {
    let answer = admin_call(
        tollgate,
        "GET",
        &format!("/v1/buckets/{limit}{}", query(key)),
        auth,
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    json(&answer.body)
}

fn check_key(tollgate: &Tollgate, key: &str) -> crate::support::Response {
    tollgate.check(&[("x-api-key", key), ("x-forwarded-for", "192.0.2.50")])
}

/// A bucket as Redis holds it, `"<debt> <ts>"` (empty when absent).
fn stored(redis: &RedisServer, key: &str) -> String {
    redis.cli(&["GET", key]).trim().to_string()
}

/// Waits until `count` instances listen on the reset channel.
fn wait_for_listeners(redis: &RedisServer, count: usize) {
    let listening = || {
        let out = redis.cli(&["PUBSUB", "NUMSUB", "tollgate:resets"]);
        out.lines()
            .nth(1)
            .and_then(|n| n.trim().parse::<usize>().ok())
            == Some(count)
    };
    assert!(
        crate::support::wait_until(Duration::from_secs(10), listening),
        "{count} instances never subscribed to the reset channel"
    );
}
