//! Runtime overrides end to end (`/v1/overrides/{limit}` on the admin listener), with the real
//! binary and a real Redis: three instances share one Redis; an override set on one is
//! enforced by all within a second, beats the file's, expires on its TTL, survives a Redis
//! restart and a SIGHUP; without the token nothing changes; hostile input is a 4xx.

use std::time::{Duration, Instant};

use crate::support::http::admin_json;
use crate::support::{redis_config, wait_until, RedisServer, Response, Tollgate};

mod changes;
mod durability;
mod refusals;

pub(super) const TOKEN: &str = "s3cret-admin-token";

/// `roomy` barely drains while polled (its headers show whose numbers apply); `tight` counts
/// admissions exactly (it refills one token in 1000 s). Each applies to its own `x-plan`.
const LIMITS: &str = r#"
[[limits]]
name = "roomy"
rate = 1000
burst = 1000
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["roomy"] }

[[limits]]
name = "tight"
rate = 0.001
burst = 2
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["tight"] }
[[limits.overrides]]
key = ["file-key"]
burst = 3

[[limits]]
name = "monthly"
quota = 3
period = "month"
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["monthly"] }

[[limits]]
name = "per-ip"
rate = 1000
burst = 1000
key = ["ip", "header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["per-ip"] }
"#;

fn config(redis: &RedisServer, token: Option<&str>) -> String {
    let token = token
        .map(|t| format!("admin_token = \"{t}\"\n"))
        .unwrap_or_default();
    format!("{token}{}", redis_config(redis, "", LIMITS))
}

fn memory_config() -> String {
    format!("admin_token = \"{TOKEN}\"\n[store]\nbackend = \"memory\"\n{LIMITS}")
}

pub(super) fn put(tollgate: &Tollgate, limit: &str, key: &str, body: &str) -> Response {
    admin_json(
        tollgate.admin,
        "PUT",
        &format!("/v1/overrides/{limit}?key={key}"),
        Some(TOKEN),
        body,
    )
}

fn listed(tollgate: &Tollgate, limit: &str, token: Option<&str>) -> serde_json::Value {
    let answer = admin_json(
        tollgate.admin,
        "GET",
        &format!("/v1/overrides/{limit}"),
        token,
        "",
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    serde_json::from_str::<serde_json::Value>(&answer.body).expect("JSON")["overrides"].clone()
}

/// The first key value of every runtime override of `limit` on `tollgate`, sorted.
pub(super) fn keys_on(tollgate: &Tollgate, limit: &str) -> Vec<String> {
    let mut keys: Vec<String> = listed(tollgate, limit, Some(TOKEN))
        .as_array()
        .expect("a list")
        .iter()
        .map(|entry| entry["key"][0].as_str().unwrap_or_default().to_string())
        .collect();
    keys.sort();
    keys
}

fn check(tollgate: &Tollgate, plan: &str, key: &str) -> Response {
    tollgate.check(&[("x-plan", plan), ("x-api-key", key)])
}

fn policy_of(tollgate: &Tollgate, plan: &str, key: &str) -> String {
    check(tollgate, plan, key)
        .header("ratelimit-policy")
        .unwrap_or_default()
        .to_string()
}

/// Admissions of `n` checks of `key` on `tight`, spread round-robin over `instances`.
fn admitted(instances: &[&Tollgate], key: &str, n: usize) -> usize {
    (0..n)
        .filter(|i| check(instances[i % instances.len()], "tight", key).status == 200)
        .count()
}

fn three(redis: &RedisServer, token: Option<&str>) -> [Tollgate; 3] {
    [(); 3].map(|_| Tollgate::start(&config(redis, token)))
}
