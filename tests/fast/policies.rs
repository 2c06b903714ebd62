//! Policies end to end, with the real binary and a real Redis: readable rates, `[[exempt]]`
//! rules, tiers chosen by a header, per-key overrides (inline and from a file reloaded with
//! SIGHUP), and how overrides meet the deny cache and the `on_error = "local"` fallback.

use std::time::Duration;

use crate::support::{
    assert_denied, redis_config, wait_until, RedisServer, Response, TempDir, Tollgate,
};

fn key(value: &str) -> [(&str, &str); 1] {
    [("x-api-key", value)]
}

fn statuses(tollgate: &Tollgate, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut client = tollgate.client();
    (0..n)
        .map(|_| client.get("/check", headers).expect("answered").status)
        .collect()
}

fn allowed_count(tollgate: &Tollgate, headers: &[(&str, &str)], n: usize) -> usize {
    statuses(tollgate, headers, n)
        .iter()
        .filter(|&&s| s == 200)
        .count()
}

fn assert_no_quota_headers(response: &Response) {
    for name in [
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
        "retry-after",
    ] {
        assert_eq!(response.header(name), None, "{name} in {response:?}");
    }
}

fn redis_keys(redis: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis
        .cli(&["--scan", "--pattern", "tollgate:*"])
        .lines()
        .filter(|l| !l.ends_with(":instances"))
        .map(str::to_string)
        .collect();
    keys.sort();
    keys
}

#[test]
fn a_rate_written_per_minute_refills_at_that_rate_and_shows_its_window() {
    let redis = RedisServer::start();
    let limits = "[[limits]]\nname = \"per-key\"\nrate = \"6/min\"\nburst = 2\nkey = [\"header:x-api-key\"]\n";
    let tollgate = Tollgate::start(&redis_config(&redis, "", limits));
    let first = tollgate.check(&key("a"));
    // 6/min is 0.1 token/s: a burst of 2 takes 20 s to fill.
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"per-key\";q=2;w=20")
    );
    assert_eq!(tollgate.check(&key("a")).status, 200);
    let denied = tollgate.check(&key("a"));
    // One token per 10 s.
    assert_denied(&denied, Some(10));
}

const EXEMPT: &str = r#"
[[exempt]]
name = "office"
cidrs = ["10.20.0.0/16"]
[[exempt]]
name = "probes"
methods = ["GET"]
path_prefix = "/healthz"
[[exempt]]
name = "batch"
headers = { "x-job" = ["nightly"] }
[[exempt]]
name = "office-too"
cidrs = ["10.20.30.0/24"]

[[limits]]
name = "per-ip"
rate = 1
burst = 1
key = ["ip"]
"#;

#[test]
fn exempt_requests_are_admitted_without_headers_or_a_store_call_and_are_counted_by_rule() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&redis_config(&redis, "", EXEMPT));
    // The client address after the trusted-proxy walk (the harness connects from loopback).
    let office = [("x-forwarded-for", "10.20.30.40")];
    for _ in 0..5 {
        let response = tollgate.check(&office);
        assert_eq!(response.status, 200, "{response:?}");
        assert_no_quota_headers(&response);
    }
    let probe = [
        ("x-forwarded-for", "198.51.100.1"),
        ("x-forwarded-uri", "/healthz/ready"),
        ("x-forwarded-method", "GET"),
    ];
    assert_eq!(allowed_count(&tollgate, &probe, 4), 4);
    let job = [("x-forwarded-for", "198.51.100.2"), ("x-job", "nightly")];
    assert_eq!(allowed_count(&tollgate, &job, 3), 3);
    assert!(redis_keys(&redis).is_empty(), "{:?}", redis_keys(&redis));

    // Everyone else is limited; a rule holds only when all its conditions do.
    let outsider = [("x-forwarded-for", "198.51.100.3")];
    assert_eq!(statuses(&tollgate, &outsider, 2), [200, 429]);
    let post_probe = [
        ("x-forwarded-for", "198.51.100.4"),
        ("x-forwarded-uri", "/healthz"),
        ("x-forwarded-method", "POST"),
    ];
    assert_eq!(statuses(&tollgate, &post_probe, 2), [200, 429]);
    let daytime_job = [("x-forwarded-for", "198.51.100.5"), ("x-job", "daily")];
    assert_eq!(statuses(&tollgate, &daytime_job, 2), [200, 429]);
    // A client cannot claim the office network: an untrusted hop ends the walk.
    let spoofed = [("x-forwarded-for", "10.20.30.40, 198.51.100.6")];
    assert_eq!(statuses(&tollgate, &spoofed, 2), [200, 429]);

    let metrics = tollgate.metrics();
    let value = |sample: &str| crate::support::metric_value(&metrics, sample);
    assert_eq!(value("tollgate_checks_total{result=\"exempt\"}"), 12.0);
    assert_eq!(value("tollgate_exempt_total{rule=\"office\"}"), 5.0);
    assert_eq!(value("tollgate_exempt_total{rule=\"probes\"}"), 4.0);
    assert_eq!(value("tollgate_exempt_total{rule=\"batch\"}"), 3.0);
    assert_eq!(
        value("tollgate_exempt_total{rule=\"office-too\"}"),
        0.0,
        "the first matching rule admits"
    );
    assert_eq!(value("tollgate_checks_total{result=\"allowed\"}"), 4.0);
}

const TIERS: &str = r#"
[[limits]]
name = "free"
rate = "1/min"
burst = 2
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["free", ""] }

[[limits]]
name = "pro"
rate = "1/min"
burst = 5
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["pro", "enterprise"] }
"#;

#[test]
fn the_tier_header_picks_the_limit_and_an_absent_header_is_the_free_tier() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&redis_config(&redis, "", TIERS));
    let free = [("x-api-key", "f"), ("x-plan", "free")];
    assert_eq!(allowed_count(&tollgate, &free, 4), 2);
    assert_eq!(allowed_count(&tollgate, &key("anon"), 4), 2, "absent");
    let empty = [("x-api-key", "e"), ("x-plan", "")];
    assert_eq!(allowed_count(&tollgate, &empty, 4), 2, "empty");
    let pro = [("x-api-key", "p"), ("x-plan", "pro")];
    let first = tollgate.check(&pro);
    assert_eq!(first.header("ratelimit-policy"), Some("\"pro\";q=5;w=300"));
    assert_eq!(allowed_count(&tollgate, &pro, 6), 4);
    // A plan no limit names is limited by none (the proxy in front decides what is sent).
    let unknown = [("x-api-key", "u"), ("x-plan", "gold")];
    assert_eq!(allowed_count(&tollgate, &unknown, 8), 8);
}

const OVERRIDDEN: &str = r#"
[[limits]]
name = "per-key"
rate = "1/min"
burst = 2
key = ["header:x-api-key"]
[[limits.overrides]]
key = ["acme"]
burst = 6
[[limits.overrides]]
key = ["ops"]
unlimited = true
[[limits.overrides]]
key = ["acme"]
burst = 1
"#;

#[test]
fn an_overridden_key_keeps_its_bucket_and_shows_its_own_policy() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&redis_config(&redis, "", OVERRIDDEN));
    let first = tollgate.check(&key("acme"));
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"per-key\";q=6;w=360"),
        "the first entry for a key wins"
    );
    assert_eq!(first.header("x-ratelimit-limit"), Some("6"));
    assert_eq!(first.header("ratelimit"), Some("\"per-key\";r=5;t=60"));
    assert_eq!(allowed_count(&tollgate, &key("acme"), 7), 5);
    assert_eq!(allowed_count(&tollgate, &key("other"), 4), 2);
    let other = tollgate.check(&key("other2"));
    assert_eq!(
        other.header("ratelimit-policy"),
        Some("\"per-key\";q=2;w=120")
    );
    // The same store key as without the override: a reload removing it keeps the bucket.
    assert_eq!(
        redis_keys(&redis),
        [
            "tollgate:per-key:{acme}",
            "tollgate:per-key:{other2}",
            "tollgate:per-key:{other}"
        ]
    );

    for _ in 0..10 {
        let unlimited = tollgate.check(&key("ops"));
        assert_eq!(unlimited.status, 200);
        assert_no_quota_headers(&unlimited);
    }
    assert!(!redis_keys(&redis).iter().any(|k| k.contains("ops")));
}

fn file_config(redis: &RedisServer, dir: &TempDir) -> String {
    let limits = format!(
        "[[limits]]\nname = \"per-key\"\nrate = \"1/min\"\nburst = 1\nkey = [\"header:x-api-key\"]\noverrides_file = \"{}\"\n",
        dir.path().join("keys.toml").display()
    );
    redis_config(redis, "", &limits)
}

#[test]
fn the_overrides_file_is_read_again_on_sighup_and_a_broken_one_keeps_the_running_overrides() {
    let redis = RedisServer::start();
    let dir = TempDir::new("overrides");
    dir.write("keys.toml", "[[overrides]]\nkey = [\"acme\"]\nburst = 3\n");
    let tollgate = Tollgate::start(&file_config(&redis, &dir));
    assert_eq!(allowed_count(&tollgate, &key("acme"), 4), 3);
    assert_eq!(allowed_count(&tollgate, &key("beta"), 2), 1);

    dir.write(
        "keys.toml",
        "[[overrides]]\nkey = [\"acme\"]\nburst = 3\n[[overrides]]\nkey = [\"beta\"]\nunlimited = true\n",
    );
    tollgate.signal("HUP");
    assert!(
        wait_until(Duration::from_secs(5), || {
            tollgate.metric("tollgate_config_reloads_total{result=\"success\"}") == 1.0
        }),
        "reloaded"
    );
    assert_eq!(allowed_count(&tollgate, &key("beta"), 5), 5);

    dir.write(
        "keys.toml",
        "[[overrides]]\nkey = [\"beta\", \"extra\"]\nunlimited = true\n",
    );
    tollgate.signal("HUP");
    assert!(
        wait_until(Duration::from_secs(5), || {
            tollgate.metric("tollgate_config_reloads_total{result=\"failure\"}") == 1.0
        }),
        "the broken file was refused"
    );
    assert_eq!(
        allowed_count(&tollgate, &key("beta"), 5),
        5,
        "still unlimited"
    );
}

#[test]
fn a_denial_cached_under_the_limits_rate_is_not_applied_under_an_overrides_rate() {
    let redis = RedisServer::start();
    let dir = TempDir::new("overrides-cache");
    dir.write("keys.toml", "");
    // Deny cache on (the default for Redis): the drained bucket is remembered for ~60 s.
    let tollgate = Tollgate::start(&file_config(&redis, &dir));
    assert_eq!(statuses(&tollgate, &key("acme"), 3), [200, 429, 429]);

    dir.write(
        "keys.toml",
        "[[overrides]]\nkey = [\"acme\"]\nrate = \"1000/s\"\nburst = 1\n",
    );
    tollgate.signal("HUP");
    assert!(wait_until(Duration::from_secs(5), || {
        tollgate.metric("tollgate_config_reloads_total{result=\"success\"}") == 1.0
    }));
    // At 1000/s the same bucket holds a token again within a millisecond.
    std::thread::sleep(Duration::from_millis(20));
    let response = tollgate.check(&key("acme"));
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(
        response.header("ratelimit-policy"),
        Some("\"per-key\";q=1;w=1")
    );
}

#[test]
fn the_local_fallback_enforces_the_overrides_numbers() {
    let mut redis = RedisServer::start();
    let limits = "[[limits]]\nname = \"per-key\"\nrate = \"1/min\"\nburst = 1\nkey = [\"header:x-api-key\"]\n\
                  [[limits.overrides]]\nkey = [\"acme\"]\nburst = 4\n";
    let config = redis_config(&redis, "on_error = \"local\"\ntimeout_ms = 200\n", limits);
    let tollgate = Tollgate::start(&config);
    assert_eq!(tollgate.check(&key("warm")).status, 200);
    redis.kill();
    assert_eq!(allowed_count(&tollgate, &key("acme"), 6), 4);
    assert_eq!(allowed_count(&tollgate, &key("beta"), 3), 1);
    let degraded = tollgate.check(&key("acme"));
    assert_eq!(
        degraded.header("ratelimit-policy"),
        Some("\"per-key\";q=4;w=240")
    );
}
