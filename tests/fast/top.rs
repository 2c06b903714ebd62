//! `GET /v1/top` and the sampled deny log, on the real binary against a real redis-server:
//! every denial counts (the deny cache's included), key values are fingerprints without the
//! admin token, and the log keeps to one line per (limit, key) every 10 s.

use std::time::{Duration, Instant};

use crate::support::fixtures::PER_IP_AND_PER_KEY_PER_MINUTE;
use crate::support::http::HttpClient;
use crate::support::{redis_config, RedisServer, Tollgate};
use serde_json::Value;

const TOKEN: &str = "top-secret-admin-token";

fn start(redis: &RedisServer, log: &str) -> (Tollgate, std::path::PathBuf) {
    let config = format!(
        "admin_token = \"{TOKEN}\"\n[log]\ndenials = \"{log}\"\n{}",
        redis_config(redis, "", PER_IP_AND_PER_KEY_PER_MINUTE)
    );
    Tollgate::start_logged(&config, &[("RUST_LOG", "warn,tollgate::denials=info")])
}

/// `times` checks from `ip`, with `x-api-key: api_key` when given, on one connection.
fn checks(tollgate: &Tollgate, ip: &str, api_key: Option<&str>, times: usize) {
    let mut client = tollgate.client();
    let mut headers = vec![("X-Forwarded-For", ip)];
    headers.extend(api_key.map(|key| ("X-Api-Key", key)));
    for _ in 0..times {
        let answer = client.get("/check", &headers).expect("check answered");
        assert!(matches!(answer.status, 200 | 429), "{answer:?}");
    }
}

fn top(tollgate: &Tollgate, query: &str, token: Option<&str>) -> (u16, Value) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|b| ("Authorization", b.as_str()))
        .collect();
    let answer = HttpClient::connect(tollgate.admin)
        .and_then(|mut c| c.get(&format!("/v1/top{query}"), &headers))
        .expect("admin answered");
    let body = serde_json::from_str(&answer.body).expect("JSON");
    (answer.status, body)
}

fn limit<'v>(answer: &'v Value, name: &str) -> &'v Value {
    answer["limits"]
        .as_array()
        .and_then(|limits| limits.iter().find(|l| l["limit"] == name))
        .unwrap_or_else(|| panic!("no {name} in {answer}"))
}

#[test]
fn top_lists_the_most_denied_keys_of_each_limit_with_every_denial_counted() {
    let redis = RedisServer::start();
    let (tollgate, _) = start(&redis, "off");
    checks(&tollgate, "203.0.113.9", None, 60);
    // One API key from ten fresh addresses: only its own limit denies it.
    for i in 0..10 {
        checks(&tollgate, &format!("192.0.2.{i}"), Some("sk_live_flood"), 1);
    }
    checks(&tollgate, "198.51.100.7", None, 21);
    checks(&tollgate, "198.51.100.8", None, 6);

    let (status, answer) = top(&tollgate, "?window=5m&n=2", None);
    assert_eq!(status, 200, "{answer}");
    let per_ip = limit(&answer, "per-ip");
    let keys = per_ip["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 2, "n is honoured: {answer}");
    assert_eq!(keys[0]["key"], serde_json::json!(["203.0.113.9"]));
    assert_eq!(keys[0]["denied"], 59);
    assert_eq!(keys[1]["key"], serde_json::json!(["198.51.100.7"]));
    assert_eq!(keys[1]["denied"], 20);
    // The deny cache answered most of these without Redis: they count all the same, as in
    // the metric of the limit.
    let denied_metric =
        tollgate.metric(r#"tollgate_limit_decisions_total{decision="denied",limit="per-ip"}"#);
    assert_eq!(per_ip["denied"], 84);
    assert_eq!(denied_metric, 84.0);
    let store_calls = crate::support::commandstats::script_calls(&redis);
    assert!(
        store_calls < 60,
        "the deny cache answered most of the flood: {store_calls} calls"
    );
    let share = keys[0]["share"].as_f64().expect("share");
    assert!((share - 59.0 / 84.0).abs() < 0.01, "{share}");
    assert!(keys[0]["denied_per_min"].as_f64().expect("rate") > 0.0);

    // An API key is shown as its fingerprint, except to the holder of the admin token.
    let per_key = limit(&answer, "per-key");
    assert_eq!(per_key["keys"][0]["denied"], 9, "{answer}");
    let anonymous = per_key["keys"][0]["key"][0].clone();
    assert_eq!(anonymous.as_str().map(str::len), Some(12), "{answer}");
    assert!(!answer.to_string().contains("sk_live_flood"));
    let (_, operator) = top(&tollgate, "?window=1m", Some(TOKEN));
    assert_eq!(
        limit(&operator, "per-key")["keys"][0]["key"],
        serde_json::json!(["sk_live_flood"])
    );
}

#[test]
fn top_refuses_an_unknown_window_or_size_with_400() {
    let redis = RedisServer::start();
    let (tollgate, _) = start(&redis, "off");
    for query in [
        "?window=2m",
        "?window=60s",
        "?n=0",
        "?n=100000",
        "?n=x",
        "?window=1m&n=-3",
    ] {
        let (status, answer) = top(&tollgate, query, None);
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(answer["field"].is_string(), "{query}: {answer}");
    }
    assert_eq!(top(&tollgate, "", None).0, 200);
}

fn denial_lines(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .expect("log readable")
        .lines()
        .filter_map(|line| line.split_once("tollgate::denials] "))
        .map(|(_, json)| serde_json::from_str(json).expect("one JSON object per line"))
        .collect()
}

#[test]
fn the_sampled_deny_log_writes_one_line_per_denied_key_every_ten_seconds() {
    let redis = RedisServer::start();
    let (tollgate, log) = start(&redis, "sampled");
    // A flood of two keys from four connections for about 2.5 s.
    let until = Instant::now() + Duration::from_millis(2500);
    std::thread::scope(|scope| {
        for ip in ["203.0.113.1", "203.0.113.2", "203.0.113.1", "203.0.113.2"] {
            let tollgate = &tollgate;
            scope.spawn(move || {
                while Instant::now() < until {
                    checks(tollgate, ip, None, 20);
                }
            });
        }
    });
    let denied =
        tollgate.metric(r#"tollgate_limit_decisions_total{decision="denied",limit="per-ip"}"#);
    assert!(denied > 100.0, "the flood was denied: {denied}");
    let lines = denial_lines(&log);
    assert_eq!(lines.len(), 2, "{lines:?}");
    let mut keys: Vec<String> = lines.iter().map(|l| l["key"][0].to_string()).collect();
    keys.sort();
    assert_eq!(keys, ["\"203.0.113.1\"", "\"203.0.113.2\""]);
    for line in &lines {
        assert_eq!(line["limit"], "per-ip");
        assert!(
            line["retry_after_s"].as_u64().is_some_and(|s| s >= 1),
            "{line}"
        );
        assert!(line["suppressed"].is_u64(), "{line}");
    }
}

#[test]
fn the_sampled_deny_log_writes_at_most_a_hundred_lines_a_second() {
    let redis = RedisServer::start();
    let (tollgate, log) = start(&redis, "sampled");
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let tollgate = &tollgate;
            scope.spawn(move || {
                for i in 0..150 {
                    // Each key once allowed, then denied: 600 keys denied once each.
                    checks(
                        tollgate,
                        &format!("10.{thread}.{}.{}", i / 200, i % 200),
                        None,
                        2,
                    );
                }
            });
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let lines = denial_lines(&log).len();
    let allowed = 100 + (100.0 * elapsed).ceil() as usize;
    assert!(lines >= 100, "the first hundred keys are logged: {lines}");
    assert!(lines <= allowed.min(600), "{lines} lines in {elapsed:.1} s");
    if elapsed < 4.0 {
        assert!(
            lines < 600,
            "the budget held some back: {lines} lines in {elapsed:.1} s"
        );
    }
}

#[test]
fn denials_are_not_logged_by_default() {
    let redis = RedisServer::start();
    let (tollgate, log) = start(&redis, "off");
    checks(&tollgate, "203.0.113.3", None, 5);
    assert!(denial_lines(&log).is_empty());
}

/// `tollgate validate` of `config`, written into `dir`.
fn validate(dir: &crate::support::TempDir, config: &str) -> std::process::Output {
    let path = dir.write("tollgate.toml", config);
    crate::support::tollgate_command()
        .arg("validate")
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run tollgate validate")
}

#[test]
fn validate_shows_whether_denials_are_logged() {
    let dir = crate::support::TempDir::new("top-validate");
    for (config, shown) in [
        ("", "log denials   off"),
        ("[log]\ndenials = \"sampled\"\n", "log denials   sampled"),
    ] {
        let output = validate(&dir, config);
        assert_eq!(output.status.code(), Some(0));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains(shown), "{stdout}");
    }
}

#[test]
fn an_unknown_deny_log_mode_is_refused_naming_the_key() {
    let dir = crate::support::TempDir::new("top-config");
    let output = validate(&dir, "[log]\ndenials = \"everything\"\n");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("log.denials"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
