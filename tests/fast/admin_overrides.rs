//! Runtime overrides end to end (`/v1/overrides/{limit}` on the admin listener), with the real
//! binary and a real Redis: three instances share one Redis; an override set on one is
//! enforced by all within a second, beats the file's, expires on its TTL, survives a Redis
//! restart and a SIGHUP; without the token nothing changes; hostile input is a 4xx.

use std::time::{Duration, Instant};

use crate::support::http::admin_json;
use crate::support::{redis_config, wait_until, RedisServer, Response, Tollgate};

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

#[test]
fn an_override_set_on_one_instance_is_enforced_by_all_three_within_a_second() {
    let redis = RedisServer::start();
    let [a, b, c] = three(&redis, Some(TOKEN));
    for tollgate in [&a, &b, &c] {
        assert!(policy_of(tollgate, "roomy", "acme").contains("q=1000"));
    }

    let started = Instant::now();
    let answer = put(&a, "roomy", "acme", r#"{"burst": 5000}"#);
    assert_eq!(answer.status, 200, "{answer:?}");
    let mut seen_after = Vec::new();
    for tollgate in [&a, &b, &c] {
        assert!(
            wait_until(Duration::from_secs(3), || policy_of(
                tollgate, "roomy", "acme"
            )
            .contains("q=5000")),
            "an instance never applied the override"
        );
        seen_after.push(started.elapsed());
    }
    let slowest = seen_after.iter().max().copied().unwrap_or_default();
    println!("override in force on all three after {slowest:?} ({seen_after:?})");
    assert!(slowest <= Duration::from_secs(1), "took {slowest:?}");
    assert!(
        policy_of(&b, "roomy", "other").contains("q=1000"),
        "other keys keep the limit"
    );

    // Counted exactly: a fresh key gets the override's burst across the three, no more.
    assert_eq!(put(&b, "tight", "big", r#"{"burst": 5}"#).status, 200);
    for tollgate in [&a, &b, &c] {
        assert!(wait_until(Duration::from_secs(3), || listed(
            tollgate,
            "tight",
            Some(TOKEN)
        )
        .as_array()
        .is_some_and(|l| l.len() == 1)));
    }
    assert_eq!(admitted(&[&a, &b, &c], "big", 9), 5);
    assert_eq!(
        admitted(&[&a, &b, &c], "small", 9),
        2,
        "the limit's own burst"
    );

    // The runtime override beats the file's (burst 3) for the same key.
    assert_eq!(put(&c, "tight", "file-key", r#"{"burst": 6}"#).status, 200);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(admitted(&[&a, &b, &c], "file-key", 9), 6);
}

#[test]
fn get_shows_key_values_to_the_token_holder_and_fingerprints_to_others() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&config(&redis, Some(TOKEN)));
    assert_eq!(
        put(
            &tollgate,
            "tight",
            "sk_live_abc",
            r#"{"rate": "2/s", "burst": 7, "ttl_s": 600}"#
        )
        .status,
        200
    );
    let mine = listed(&tollgate, "tight", Some(TOKEN));
    assert_eq!(mine[0]["key"][0], "sk_live_abc");
    assert_eq!(mine[0]["burst"], 7);
    assert_eq!(mine[0]["rate_per_s"], 2.0);
    let left = mine[0]["expires_in_s"].as_u64().expect("an expiry");
    assert!((590..=600).contains(&left), "{left}");
    let theirs = listed(&tollgate, "tight", None);
    let shown = theirs[0]["key"][0].as_str().unwrap();
    assert_eq!(shown.len(), 12);
    assert_ne!(shown, "sk_live_abc");
    assert!(!theirs.to_string().contains("sk_live_abc"));
    let wrong = listed(&tollgate, "tight", Some("not-the-token"));
    assert_eq!(
        wrong[0]["key"][0], shown,
        "a wrong token reads as anonymous"
    );

    // An IP part is normalised as /check keys it (an IPv6 client by its /64) and shown as is.
    let answer = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/per-ip?key=2001:DB8:0:0::1&key=acme",
        Some(TOKEN),
        r#"{"unlimited": true}"#,
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        listed(&tollgate, "per-ip", None)[0]["key"][0],
        "2001:DB8:0:0::1"
    );
}

#[test]
fn unlimited_and_ttl_expire_everywhere_and_delete_restores_the_limit() {
    let redis = RedisServer::start();
    let [a, b, c] = three(&redis, Some(TOKEN));
    assert_eq!(
        put(&a, "tight", "vip", r#"{"unlimited": true, "ttl_s": 2}"#).status,
        200
    );
    let set_at = Instant::now();
    for tollgate in [&a, &b, &c] {
        assert!(wait_until(Duration::from_secs(1), || {
            listed(tollgate, "tight", None)
                .as_array()
                .is_some_and(|l| l.len() == 1)
        }));
    }
    let unlimited = check(&b, "tight", "vip");
    assert_eq!(unlimited.status, 200);
    assert_eq!(
        unlimited.header("ratelimit-policy"),
        None,
        "no limit applied"
    );
    assert_eq!(admitted(&[&a, &b, &c], "vip", 12), 12);
    assert_eq!(
        redis
            .cli(&["--scan", "--pattern", "tollgate:tight:*"])
            .trim(),
        "",
        "an unlimited key makes no store call"
    );

    // After its TTL every instance enforces the limit's own numbers again.
    let left = Duration::from_millis(2100).saturating_sub(set_at.elapsed());
    std::thread::sleep(left);
    assert_eq!(admitted(&[&a, &b, &c], "vip", 6), 2);
    for tollgate in [&a, &b, &c] {
        assert_eq!(listed(tollgate, "tight", None), serde_json::json!([]));
    }
    // The expired entry leaves the store too (dropped by the next load), not kept forever.
    assert!(wait_until(Duration::from_secs(2), || redis
        .cli(&["HLEN", "tollgate:{tollgate:overrides}:limit:tight"])
        .trim()
        == "0"));

    // DELETE restores the limit on every instance.
    assert_eq!(put(&a, "tight", "gone", r#"{"burst": 50}"#).status, 200);
    assert_eq!(admitted(&[&a], "gone", 3), 3);
    let deleted = admin_json(
        c.admin,
        "DELETE",
        "/v1/overrides/tight?key=gone",
        Some(TOKEN),
        "",
    );
    assert_eq!(deleted.status, 204, "{deleted:?}");
    std::thread::sleep(Duration::from_secs(1));
    // The bucket kept its debt (3 taken); back under burst 2 the limit's own numbers bind at
    // once: 2 - 3 is below empty, and nothing passes until the refill (0.001/s).
    assert_eq!(admitted(&[&a, &b, &c], "gone", 6), 0);
    let again = admin_json(
        c.admin,
        "DELETE",
        "/v1/overrides/tight?key=gone",
        Some(TOKEN),
        "",
    );
    assert_eq!(again.status, 404);
}

#[test]
fn a_quota_limit_takes_a_quota_override_only() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&config(&redis, Some(TOKEN)));
    let refused = put(&tollgate, "monthly", "acme", r#"{"burst": 10}"#);
    assert_eq!(refused.status, 400);
    assert!(
        refused.body.contains("\"field\":\"burst\""),
        "{}",
        refused.body
    );
    assert_eq!(
        put(&tollgate, "monthly", "acme", r#"{"quota": 5}"#).status,
        200
    );
    let admitted = (0..7)
        .filter(|_| check(&tollgate, "monthly", "acme").status == 200)
        .count();
    assert_eq!(admitted, 5);
    let refused = put(&tollgate, "tight", "acme", r#"{"quota": 5}"#);
    assert_eq!(refused.status, 400);
    assert!(
        refused.body.contains("\"field\":\"quota\""),
        "{}",
        refused.body
    );
}

#[test]
fn without_a_token_every_change_is_refused_and_nothing_changes() {
    let redis = RedisServer::start();
    let [a, b, _c] = three(&redis, None);
    for (method, body) in [("PUT", r#"{"unlimited": true}"#), ("DELETE", "")] {
        let answer = admin_json(
            a.admin,
            method,
            "/v1/overrides/tight?key=acme",
            Some(TOKEN),
            body,
        );
        assert_eq!(answer.status, 403, "{method}: {answer:?}");
        assert!(answer.body.contains("admin_token"), "{}", answer.body);
    }
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(listed(&b, "tight", None), serde_json::json!([]));
    assert_eq!(admitted(&[&a, &b], "acme", 4), 2, "still limited");
    assert_eq!(
        redis.cli(&["--scan", "--pattern", "*overrides*"]).trim(),
        "",
        "nothing written to the store"
    );

    // With a token configured, a wrong or missing one is 401 and changes nothing either.
    let guarded = Tollgate::start(&config(&redis, Some(TOKEN)));
    for token in [Some("wrong"), None] {
        let answer = admin_json(
            guarded.admin,
            "PUT",
            "/v1/overrides/tight?key=acme",
            token,
            r#"{"unlimited": true}"#,
        );
        assert_eq!(answer.status, 401, "{answer:?}");
        assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
    }
    assert_eq!(
        listed(&guarded, "tight", Some(TOKEN)),
        serde_json::json!([])
    );
}

#[test]
fn hostile_requests_are_answered_400_or_404_never_5xx() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&config(&redis, Some(TOKEN)));
    let huge = "k".repeat(20_000);
    let cases: Vec<(&str, String, &str, u16)> = vec![
        (
            "PUT",
            "/v1/overrides/nope?key=a".into(),
            r#"{"burst":5}"#,
            404,
        ),
        ("GET", "/v1/overrides/nope".into(), "", 404),
        ("DELETE", "/v1/overrides/nope?key=a".into(), "", 404),
        ("PUT", "/v1/overrides/tight".into(), r#"{"burst":5}"#, 400),
        (
            "PUT",
            "/v1/overrides/tight?key=a&key=b".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/per-ip?key=a".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/per-ip?key=not-an-ip&key=a".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?kye=a".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            format!("/v1/overrides/tight?key={}", "k".repeat(2000)),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            format!("/v1/overrides/tight?{}", "key=a&".repeat(500)),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=%ff%fe".into(),
            r#"{"brust":5}"#,
            400,
        ),
        ("PUT", "/v1/overrides/tight?key=a".into(), "not json", 400),
        ("PUT", "/v1/overrides/tight?key=a".into(), "[1]", 400),
        ("PUT", "/v1/overrides/tight?key=a".into(), "{}", 400),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":0}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":-1}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":1e30}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"rate":"5/fortnight"}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"rate":"0/s"}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"rate":[1]}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"unlimited":true,"burst":4}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"unlimited":"yes"}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":0}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":-3}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":315360001}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":1.5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":"60"}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"x":"#,
            400,
        ),
    ];
    for (method, path, body, expected) in &cases {
        let answer = admin_json(tollgate.admin, method, path, Some(TOKEN), body);
        assert_eq!(
            answer.status,
            *expected,
            "{method} {}: {}",
            &path[..path.len().min(80)],
            answer.body
        );
    }
    // A request line too long for the server is refused before any handler, still not a 5xx.
    let answer = admin_json(
        tollgate.admin,
        "PUT",
        &format!("/v1/overrides/tight?key={huge}"),
        Some(TOKEN),
        r#"{"burst":5}"#,
    );
    assert!((400..500).contains(&answer.status), "{}", answer.status);
    // Field names come back in the answer.
    let answer = put(&tollgate, "tight", "a", r#"{"burst":5,"ttl_s":0}"#);
    assert!(
        answer.body.contains("\"field\":\"ttl_s\""),
        "{}",
        answer.body
    );
    let answer = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/tight?key=a&key=b",
        Some(TOKEN),
        "{}",
    );
    assert!(answer.body.contains("\"field\":\"key\""), "{}", answer.body);
    // Nothing of it reached the store or the instance.
    assert_eq!(
        listed(&tollgate, "tight", Some(TOKEN)),
        serde_json::json!([])
    );
    assert_eq!(
        listed(&tollgate, "per-ip", Some(TOKEN)),
        serde_json::json!([])
    );
}

#[test]
fn overrides_outlive_a_redis_restart_and_a_reload() {
    let mut redis = RedisServer::start();
    let [a, b, c] = three(&redis, Some(TOKEN));
    assert_eq!(put(&a, "roomy", "acme", r#"{"burst": 4000}"#).status, 200);
    for tollgate in [&a, &b, &c] {
        assert!(wait_until(Duration::from_secs(2), || policy_of(
            tollgate, "roomy", "acme"
        )
        .contains("q=4000")));
    }

    // Redis down: a change is refused with 503 + Retry-After; instances keep what they know.
    redis.kill();
    let refused = put(&b, "roomy", "beta", r#"{"burst": 3000}"#);
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"));
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(listed(&c, "roomy", Some(TOKEN))[0]["burst"], 4000);

    // Redis back, empty (no persistence): the instances write back what they held.
    redis.restart();
    assert!(
        wait_until(Duration::from_secs(5), || redis
            .cli(&["HLEN", "tollgate:{tollgate:overrides}:limit:roomy"])
            .trim()
            == "1"),
        "the overrides were not written back"
    );
    let fresh = Tollgate::start(&config(&redis, Some(TOKEN)));
    assert!(wait_until(Duration::from_secs(3), || policy_of(
        &fresh, "roomy", "acme"
    )
    .contains("q=4000")));
    for tollgate in [&a, &b, &c] {
        assert!(wait_until(Duration::from_secs(3), || policy_of(
            tollgate, "roomy", "acme"
        )
        .contains("q=4000")));
    }

    // A reload of the file keeps them.
    a.signal("HUP");
    std::thread::sleep(Duration::from_millis(500));
    assert!(policy_of(&a, "roomy", "acme").contains("q=4000"));
    assert_eq!(
        a.metric("tollgate_config_reloads_total{result=\"success\"}"),
        1.0
    );
    assert_eq!(a.metric("tollgate_runtime_overrides{limit=\"roomy\"}"), 1.0);
}

/// A limit holds at most 10,000 runtime overrides: one more is refused with 409 and changes
/// nothing; once one is gone there is room again.
#[test]
fn a_full_limit_refuses_one_more_override_with_409() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&config(&redis, Some(TOKEN)));
    let hash = "tollgate:{tollgate:overrides}:limit:tight";
    // 10,000 entries written straight into the store, as 10,000 PUTs would leave them.
    redis.cli(&[
        "EVAL",
        "for i = 1, tonumber(ARGV[1]) do \
           redis.call('HSET', KEYS[1], 'filler' .. i, cjson.encode({k = {'filler' .. i}, b = 5})) \
         end",
        "1",
        hash,
        "10000",
    ]);

    let refused = put(&tollgate, "tight", "newcomer", r#"{"burst": 4}"#);
    assert_eq!(refused.status, 409, "{refused:?}");
    assert!(refused.body.contains("10000"), "{}", refused.body);
    assert_eq!(
        redis.cli(&["HLEN", hash]).trim(),
        "10000",
        "nothing written"
    );
    assert_eq!(
        admitted(&[&tollgate], "newcomer", 4),
        2,
        "the file's burst still"
    );

    redis.cli(&["HDEL", hash, "filler1"]);
    assert_eq!(
        put(&tollgate, "tight", "newcomer", r#"{"burst": 4}"#).status,
        200
    );
    assert!(
        wait_until(Duration::from_secs(3), || policy_of(
            &tollgate, "tight", "newcomer"
        )
        .contains("q=4")),
        "the override applies once there was room"
    );
}

#[test]
fn the_memory_store_offers_the_same_api() {
    let tollgate = Tollgate::start(&memory_config());
    assert_eq!(
        put(&tollgate, "tight", "big", r#"{"burst": 5}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "big", 8), 5);
    assert_eq!(
        put(
            &tollgate,
            "tight",
            "file-key",
            r#"{"burst": 4, "ttl_s": 1}"#
        )
        .status,
        200
    );
    assert_eq!(
        listed(&tollgate, "tight", Some(TOKEN))
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        put(&tollgate, "tight", "vip", r#"{"unlimited": true}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "vip", 10), 10);
    // A reload of the file keeps them: here no store could bring them back.
    tollgate.signal("HUP");
    assert!(wait_until(Duration::from_secs(3), || tollgate
        .metric("tollgate_config_reloads_total{result=\"success\"}")
        == 1.0));
    assert_eq!(admitted(&[&tollgate], "vip", 10), 10);
    let deleted = admin_json(
        tollgate.admin,
        "DELETE",
        "/v1/overrides/tight?key=vip",
        Some(TOKEN),
        "",
    );
    assert_eq!(deleted.status, 204);
    assert_eq!(admitted(&[&tollgate], "vip", 4), 2);
    std::thread::sleep(Duration::from_millis(1100));
    // The TTL passed: back to the file's override (burst 3).
    assert_eq!(admitted(&[&tollgate], "file-key", 5), 3);
    let refused = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/tight?key=a&key=b",
        Some(TOKEN),
        "{}",
    );
    assert_eq!(refused.status, 400);
}

/// A multi-process Redis: second tier (see `e2e` below).
#[cfg(feature = "e2e")]
fn on_a_redis_cluster_an_override_and_its_version_share_a_slot() {
    let cluster = crate::support::cluster::RedisCluster::start();
    let seeds: Vec<String> = cluster.seeds().iter().map(|s| format!("\"{s}\"")).collect();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ncluster = [{}]\ntimeout_ms = 2000\n{LIMITS}",
        seeds.join(", ")
    );
    let (a, b) = (Tollgate::start(&config), Tollgate::start(&config));
    let answer = put(&a, "tight", "big", r#"{"burst": 4, "ttl_s": 600}"#);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(wait_until(Duration::from_secs(1), || listed(
        &b,
        "tight",
        Some(TOKEN)
    )
    .as_array()
    .is_some_and(|l| l.len() == 1)));
    assert_eq!(admitted(&[&a, &b], "big", 8), 4);
    let deleted = admin_json(
        b.admin,
        "DELETE",
        "/v1/overrides/tight?key=big",
        Some(TOKEN),
        "",
    );
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert!(wait_until(Duration::from_secs(1), || listed(
        &a, "tight", None
    ) == serde_json::json!(
        []
    )));
}

/// The store loses its last write (a lossy failover, an older RDB): the version goes back to
/// the one before, and the entry written last is gone. An instance that held the lost entry
/// must still see the next change: a version is never handed out twice, so the next write's
/// version differs from the one that instance holds, and it reloads.
#[test]
fn after_the_store_loses_a_write_the_next_change_still_reaches_every_instance() {
    let redis = RedisServer::start();
    let a = Tollgate::start(&config(&redis, Some(TOKEN)));
    let b = Tollgate::start(&config(&redis, Some(TOKEN)));
    let versions = "tollgate:{tollgate:overrides}:versions";
    let hash = "tollgate:{tollgate:overrides}:limit:tight";
    assert_eq!(put(&a, "tight", "first", r#"{"burst": 5}"#).status, 200);
    let before_lost = redis.cli(&["HGET", versions, "tight"]).trim().to_string();
    assert_eq!(
        put(&a, "tight", "lost", r#"{"unlimited": true}"#).status,
        200
    );
    let keys_on = |tollgate: &Tollgate| keys_on(tollgate, "tight");
    assert!(
        wait_until(Duration::from_secs(5), || keys_on(&b) == ["first", "lost"]),
        "b learns both: {:?}",
        keys_on(&b)
    );
    // The last write is lost: its entry, its version and their traces in the change log and
    // the history of versions (the store as it was before that write).
    redis.cli(&["HDEL", hash, "lost"]);
    redis.cli(&["HSET", versions, "tight", &before_lost]);
    redis.cli(&["ZREM", "tollgate:{tollgate:overrides}:log:tight", "lost"]);
    let after_lost = format!("({before_lost}");
    redis.cli(&[
        "ZREMRANGEBYSCORE",
        "tollgate:{tollgate:overrides}:history:tight",
        &after_lost,
        "+inf",
    ]);
    // The next change, made through another instance.
    assert_eq!(put(&a, "tight", "next", r#"{"burst": 7}"#).status, 200);
    assert!(
        wait_until(Duration::from_secs(5), || keys_on(&b) == ["first", "next"]),
        "b forgets the lost entry and learns the new one: {:?}",
        keys_on(&b)
    );
    assert_eq!(check(&b, "tight", "lost").status, 200);
    assert_eq!(check(&b, "tight", "lost").status, 200);
    assert_eq!(
        check(&b, "tight", "lost").status,
        429,
        "no longer unlimited"
    );
}

/// After Redis lost its data, a deletion wins over an instance that missed it. `b` is paused
/// through the DELETE and through the restart, then polls first: it finds the store empty and
/// writes back the entry it still holds. `a`, which saw the deletion (a newer version of the
/// limit), then writes back its own view, and every instance ends without the entry.
#[test]
fn after_redis_loses_its_data_a_deletion_wins_over_a_stale_instance() {
    let mut redis = RedisServer::start();
    let a = Tollgate::start(&config(&redis, Some(TOKEN)));
    let b = Tollgate::start(&config(&redis, Some(TOKEN)));
    let hash = "tollgate:{tollgate:overrides}:limit:tight";
    assert_eq!(put(&a, "tight", "x", r#"{"unlimited": true}"#).status, 200);
    assert!(
        wait_until(Duration::from_secs(10), || keys_on(&b, "tight") == ["x"]),
        "b learns the override"
    );
    b.signal("STOP");
    let deleted = admin_json(
        a.admin,
        "DELETE",
        "/v1/overrides/tight?key=x",
        Some(TOKEN),
        "",
    );
    assert_eq!(deleted.status, 204, "{deleted:?}");
    a.signal("STOP");
    redis.restart();
    b.signal("CONT");
    assert!(
        wait_until(Duration::from_secs(10), || redis
            .cli(&["HLEN", hash])
            .trim()
            == "1"),
        "b writes back the entry it still holds"
    );
    a.signal("CONT");
    for (name, tollgate) in [("a", &a), ("b", &b)] {
        assert!(
            wait_until(Duration::from_secs(10), || keys_on(tollgate, "tight")
                .is_empty()),
            "{name} still holds the deleted override: {:?}",
            keys_on(tollgate, "tight")
        );
    }
    assert_eq!(redis.cli(&["HLEN", hash]).trim(), "0");
    for tollgate in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(10), || !policy_of(
                tollgate, "roomy", "probe"
            )
            .is_empty()),
            "deciding through Redis again"
        );
    }
    assert_eq!(admitted(&[&a, &b], "x", 5), 2, "x is limited again");
}

/// A change made after Redis lost its data stands: the instances that held the limit before
/// the loss find it changed since and write nothing back over it.
#[test]
fn after_redis_loses_its_data_a_change_made_since_stands_against_a_write_back() {
    let mut redis = RedisServer::start();
    let a = Tollgate::start(&config(&redis, Some(TOKEN)));
    assert_eq!(
        put(&a, "tight", "old", r#"{"unlimited": true}"#).status,
        200
    );
    a.signal("STOP");
    redis.restart();
    let fresh = Tollgate::start(&config(&redis, Some(TOKEN)));
    assert_eq!(put(&fresh, "tight", "new", r#"{"burst": 5}"#).status, 200);
    a.signal("CONT");
    for (name, tollgate) in [("a", &a), ("fresh", &fresh)] {
        assert!(
            wait_until(Duration::from_secs(10), || keys_on(tollgate, "tight")
                == ["new"]),
            "{name} holds {:?}",
            keys_on(tollgate, "tight")
        );
    }
    let hash = "tollgate:{tollgate:overrides}:limit:tight";
    assert_eq!(redis.cli(&["HKEYS", hash]).lines().count(), 1);
}

/// Second tier (`cargo test --features e2e`): tests that start more than one Redis process.
/// One module, so scripts/test.sh runs exactly these by `e2e::`.
#[cfg(feature = "e2e")]
mod e2e {
    #[test]
    fn on_a_redis_cluster_an_override_and_its_version_share_a_slot() {
        super::on_a_redis_cluster_an_override_and_its_version_share_a_slot();
    }
}

/// Admissions of `key` on `tight` by checks on `tollgate` until its answers carry
/// `policy` (the override reached it), and whether they ever did.
fn admitted_until_policy(tollgate: &Tollgate, key: &str, policy: &str) -> (usize, bool) {
    let mut admitted = 0;
    let seen = wait_until(Duration::from_secs(3), || {
        let answer = check(tollgate, "tight", key);
        if answer.status == 200 {
            admitted += 1;
        }
        answer
            .header("ratelimit-policy")
            .is_some_and(|p| p.contains(policy))
    });
    (admitted, seen)
}

/// A bucket is stored as its debt, so a raised burst applies to it: a drained key of burst 2
/// raised to 10 admits 8 more at once, on every instance, not after a slow refill (0.001/s).
#[test]
fn a_raised_burst_on_a_drained_key_grants_the_difference_at_once_everywhere() {
    let redis = RedisServer::start();
    let [a, b, c] = three(&redis, Some(TOKEN));
    assert_eq!(admitted(&[&a, &b, &c], "drained", 6), 2);
    assert_eq!(put(&a, "tight", "drained", r#"{"burst": 10}"#).status, 200);
    let mut after = 0;
    for tollgate in [&a, &b, &c] {
        let (admitted, seen) = admitted_until_policy(tollgate, "drained", "q=10");
        assert!(seen, "an instance never applied the override");
        after += admitted;
    }
    after += admitted(&[&a, &b, &c], "drained", 12);
    assert_eq!(after, 8, "burst 10 less the 2 already taken");
}

#[test]
fn on_the_memory_store_a_raised_burst_grants_the_difference_and_a_lowered_one_binds() {
    // The memory store applies an override at once: counts are exact.
    let tollgate = Tollgate::start(&memory_config());
    assert_eq!(admitted(&[&tollgate], "raised", 4), 2);
    assert_eq!(
        put(&tollgate, "tight", "raised", r#"{"burst": 5}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "raised", 6), 3);

    // Lowered: 1 of 10 taken, then burst 2 leaves 1, not 2.
    assert_eq!(
        put(&tollgate, "tight", "lowered", r#"{"burst": 10}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "lowered", 1), 1);
    assert_eq!(
        put(&tollgate, "tight", "lowered", r#"{"burst": 2}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "lowered", 4), 1);
}
