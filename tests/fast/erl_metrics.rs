//! envoyproxy/ratelimit's metrics (`[envoy.metrics]`, or its `USE_PROMETHEUS` variables):
//! the Prometheus listener's series after real gRPC decisions, named and labelled as
//! envoyproxy/ratelimit's built-in mapping names them; and its stats variables refused as it
//! refuses them (and where tollgate cannot honour them).

use std::net::SocketAddr;

use crate::support::grpc::{self, ask, descriptor, request, OK, OVER_LIMIT};
use crate::support::http::HttpClient;
use crate::support::{
    free_port, metric_value, redis_config, tollgate_command, RedisServer, TempDir, Tollgate,
};

/// A gateway's rule as Envoy Gateway writes it: a route's level, then the client's masked
/// address (a CIDR) under it; and two rules whose stats key carries the request's values.
const YAML: &str = "domain: gw
descriptors:
  - key: rule
    value: r0
    descriptors:
      - key: masked_remote_address
        value: 0.0.0.0/0
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 1}
";

fn scrape(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = HttpClient::connect(addr)
        .and_then(|mut c| c.get(path, &[]))
        .expect("the metrics listener answers");
    (response.status, response.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_series_count_decisions_under_envoyproxy_ratelimits_names() {
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-metrics");
    let rules = dir.path().join("config");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("gw.yaml"), YAML).unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let toml = format!(
        "[envoy]\nconfig_dir = {:?}\n[envoy.metrics]\nprometheus_listen = \"{metrics}\"\n",
        rules.display().to_string()
    );
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", &toml));
    let mut client = grpc::client(addr).await;

    let cidr = [("rule", "r0"), ("masked_remote_address", "0.0.0.0/0")];
    let codes: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            let answer = ask(&mut client, request("gw", vec![descriptor(&cidr)])).await;
            codes.push(answer.overall_code);
        }
        codes
    };
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);
    for user in ["alice", "bob", "bob"] {
        ask(
            &mut client,
            request("gw", vec![descriptor(&[("user", user)])]),
        )
        .await;
    }
    let routed = [("route", "checkout"), ("method", "GET")];
    ask(&mut client, request("gw", vec![descriptor(&routed)])).await;

    let (status, text) = scrape(metrics, "/metrics");
    assert_eq!(status, 200);
    let sample = |s: &str| metric_value(&text, s);
    let cidr_labels = "{domain=\"gw\",key1=\"rule_r0\",key2=\"masked_remote_address_0_0_0_0/0\"}";
    // Limit 2, near threshold 1: the 2nd hit is near, the 3rd over.
    for (stat, value) in [
        ("total_hits", 3.0),
        ("within_limit", 2.0),
        ("near_limit", 1.0),
        ("over_limit", 1.0),
    ] {
        let series = format!("ratelimit_service_rate_limit_{stat}{cidr_labels}");
        assert_eq!(sample(&series), value, "{series} in\n{text}");
    }
    // detailed_metric: one series per user, bob's second hit over his limit of 1.
    assert_eq!(
        sample("ratelimit_service_rate_limit_over_limit{domain=\"gw\",key1=\"user_bob\"}"),
        1.0
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_total_hits{domain=\"gw\",key1=\"user_alice\"}"),
        1.0
    );
    // value_to_metric at the route's level only.
    assert_eq!(
        sample(
            "ratelimit_service_rate_limit_total_hits{domain=\"gw\",key1=\"route_checkout\",key2=\"method\"}"
        ),
        1.0
    );
    assert_eq!(
        sample("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}"),
        7.0
    );
    assert_eq!(
        sample("ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"}"),
        7.0
    );
    assert_eq!(sample("ratelimit_service_config_load_success"), 1.0);
    assert!(
        !text.contains("tollgate_"),
        "tollgate's own stay on the admin listener"
    );
    assert!(!tollgate.metrics().contains("ratelimit_service_"));
    assert_eq!(scrape(metrics, "/other").0, 404);
}

fn refused(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = tollgate_command()
        .arg("validate")
        .env("RUNTIME_ROOT", "/nonexistent")
        .envs(env.iter().copied())
        .output()
        .expect("run tollgate");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// envoyproxy/ratelimit stops on two sinks at once (USE_STATSD is true unless set false) and
/// on a bool it cannot read; tollgate stops on those and on what it cannot honour.
#[test]
fn stats_variables_envoyproxy_ratelimit_or_tollgate_cannot_honour_are_refused() {
    let dir = TempDir::new("mapper");
    let other_mapping = dir.write("mapper.yaml", "mappings:\n- match: a.b\n  name: c\n");
    let other_mapping = other_mapping.display().to_string();
    for (env, named) in [
        (vec![("USE_PROMETHEUS", "true")], "USE_PROMETHEUS"),
        (
            vec![("USE_PROMETHEUS", "on"), ("USE_STATSD", "false")],
            "USE_PROMETHEUS",
        ),
        (vec![("USE_DOG_STATSD", "true")], "USE_DOG_STATSD"),
        (vec![("STATSD_PROTOCOL", "quic")], "STATSD_PROTOCOL"),
        (
            vec![
                ("USE_PROMETHEUS", "true"),
                ("USE_STATSD", "false"),
                ("PROMETHEUS_MAPPER_YAML", other_mapping.as_str()),
            ],
            "PROMETHEUS_MAPPER_YAML",
        ),
    ] {
        let (code, stderr) = refused(&env);
        assert_eq!(code, Some(2), "{env:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(named), "{named} named in: {stderr}");
    }
    let bad_toml = dir.write(
        "tollgate.toml",
        "[envoy.metrics]\nprometheus_path = \"metrics\"\n",
    );
    let output = tollgate_command()
        .args(["validate", "--config"])
        .arg(bad_toml)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("envoy.metrics.prometheus_path"));
}

/// A tollgate in envoyproxy/ratelimit's environment: its runtime directory holds `yaml`
/// (domain files under `<dir>/rl/config`), its store is `redis`, plus `more` variables.
fn erl_tollgate(dir: &TempDir, yaml: &str, redis: &RedisServer, more: &[(&str, &str)]) -> Tollgate {
    let config = dir.path().join("rl").join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("rules.yaml"), yaml).unwrap();
    let root = dir.path().display().to_string();
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let grpc_port = free_port().to_string();
    let mut env = vec![
        ("RUNTIME_ROOT", root.as_str()),
        ("RUNTIME_SUBDIRECTORY", "rl"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis_url.as_str()),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", grpc_port.as_str()),
        ("TOLLGATE_STORE__TIMEOUT_MS", "2000"),
    ];
    env.extend_from_slice(more);
    Tollgate::start_with_env("", &env)
}

/// envoyproxy/ratelimit's `POST /json` with `body`; its status.
fn post_json(http: &mut HttpClient, body: &str) -> u16 {
    let raw = format!(
        "POST /json HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http.send_raw(raw.as_bytes()).expect("/json answers").status
}

/// A descriptor value carrying newlines (and a `\r`, a NUL, a DEL) must not forge statsd lines:
/// every byte below 0x20 and 0x7f becomes `_` in the stats key, so what a UDP statsd receives
/// is one well-formed `name:N|c` line per counter, none of them another domain's.
#[test]
fn control_characters_in_a_value_forge_no_statsd_line() {
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-statsd-forge");
    let statsd = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    statsd
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let port = statsd.local_addr().unwrap().port().to_string();
    let yaml = "domain: d\ndescriptors:\n  - key: user\n    detailed_metric: true\n    \
                rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let tollgate = erl_tollgate(
        &dir,
        yaml,
        &redis,
        &[
            ("STATSD_PROTOCOL", "udp"),
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", port.as_str()),
            ("STATS_FLUSH_INTERVAL", "100ms"),
        ],
    );
    // The reproduction's value (spelled by its hash: it is longer than 64 bytes), and one
    // short enough to be spelled as it is.
    let long = "x\\nratelimit.service.rate_limit.prod.checkout.over_limit:999999|c\\n\
                ratelimit.service.rate_limit.prod.checkout";
    let short = "x\\nratelimit.service.rate_limit.p.over_limit:999|c\\n\\r\\u0000\\u007f\\u001b";
    let body = |value: &str| {
        format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}]}}"#
        )
    };
    let mut http = tollgate.client();
    for value in [long, short] {
        let statuses: Vec<u16> = (0..6).map(|_| post_json(&mut http, &body(value))).collect();
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    }

    // Every line received until the twelve hits have arrived.
    let mut lines: Vec<String> = Vec::new();
    let mut hits = 0;
    let arrived = crate::support::wait_until(std::time::Duration::from_secs(10), || {
        let mut buf = [0u8; 65_536];
        while let Ok(n) = statsd.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            for line in text.split('\n').filter(|l| !l.is_empty()) {
                if line.contains(".total_hits:") {
                    hits += line
                        .rsplit_once(':')
                        .and_then(|(_, n)| n.strip_suffix("|c")?.parse::<u32>().ok())
                        .unwrap_or(0);
                }
                lines.push(line.to_string());
            }
        }
        hits >= 12
    });
    assert!(arrived, "twelve hits not received: {lines:#?}");
    for line in &lines {
        let (name, value) = line
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("not a statsd line (forged by a newline): {line:?}"));
        assert!(
            value
                .strip_suffix("|c")
                .is_some_and(|n| n.parse::<u64>().is_ok()),
            "not a counter line: {line:?}"
        );
        assert!(
            !name.contains(':')
                && !name.contains('|')
                && !name.bytes().any(|b| b < 0x20 || b == 0x7f),
            "a forged or raw line: {line:?}"
        );
        assert!(
            !name.starts_with("ratelimit.service.rate_limit.prod.")
                && !name.starts_with("ratelimit.service.rate_limit.p."),
            "another domain's counter forged: {line:?}"
        );
    }
    let short_key = "ratelimit.service.rate_limit.d.user_x_ratelimit.service.rate_limit.p.\
                     over_limit_999_c_____";
    let long_key = "ratelimit.service.rate_limit.d.user_h_";
    for key in [short_key, long_key] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(key) && l.ends_with(".over_limit:1|c")),
            "{key}….over_limit missing: {lines:#?}"
        );
    }
}

/// The `ratelimit_service_rate_limit_*` samples of an exposition, by stat.
fn stats_samples(exposition: &str) -> Vec<(&str, f64)> {
    exposition
        .lines()
        .filter(|line| line.starts_with("ratelimit_service_rate_limit_"))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series, value.parse().ok()?))
        })
        .collect()
}

/// `requests` bodies of `/json`, each of 64 descriptors carrying their own limit and a
/// 3,500-byte value of their own, as a client floods a domain's stats keys.
fn flood_body(request: usize, value_bytes: usize) -> String {
    let descriptors: Vec<String> = (0..64)
        .map(|j| {
            let value = format!("{request}-{j}-{}", "x".repeat(value_bytes));
            format!(
                r#"{{"entries":[{{"key":"anything","value":"{value}"}}],"limit":{{"requests_per_unit":1000,"unit":"SECOND"}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"domain":"d","descriptors":[{}]}}"#,
        descriptors.join(",")
    )
}

/// A tollgate in envoyproxy/ratelimit's environment serving its Prometheus metrics (no
/// statsd) for a domain `d`, plus `more` variables; its metrics address.
fn prometheus_tollgate(
    dir: &TempDir,
    redis: &RedisServer,
    more: &[(&str, &str)],
) -> (Tollgate, SocketAddr) {
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let metrics_addr = metrics.to_string();
    let mut env = vec![
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", metrics_addr.as_str()),
    ];
    env.extend_from_slice(more);
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    (erl_tollgate(dir, yaml, redis, &env), metrics)
}

/// Sends `requests` flooding `/json` requests ([`flood_body`]); the exposition after them.
fn flood(tollgate: &Tollgate, metrics: SocketAddr, requests: usize) -> String {
    let mut http = tollgate.client();
    for request in 0..requests {
        assert_eq!(post_json(&mut http, &flood_body(request, 3_500)), 200);
    }
    let (status, text) = scrape(metrics, "/metrics");
    assert_eq!(status, 200);
    text
}

/// What the flood of `requests` left under a cap of `max_keys`: at most `max_keys` keys
/// carrying values plus the domain's overflow key, each at most 5 series; every hit counted
/// once, those past the cap in `d.overflow`; no value spelled whole.
fn assert_bounded(text: &str, requests: usize, max_keys: usize) {
    let samples = stats_samples(text);
    let keys = max_keys + 1;
    assert!(
        samples.len() <= 5 * keys,
        "{} series for at most {keys} keys",
        samples.len()
    );
    let hits = |series: &str| series.starts_with("ratelimit_service_rate_limit_total_hits{");
    let total: f64 = samples
        .iter()
        .filter(|(s, _)| hits(s))
        .map(|(_, n)| n)
        .sum();
    let asked = (requests * 64) as f64;
    assert_eq!(total, asked, "every hit counted once");
    let overflow = metric_value(
        text,
        "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"overflow\"}",
    );
    assert_eq!(overflow, asked - max_keys as f64);
    assert!(
        samples.iter().all(|(series, _)| series.len() < 200),
        "a value spelled whole"
    );
}

/// Stats keys built from client values are capped (`envoy.metrics.max_keys`, lowered here):
/// 20 `/json` requests of 64 descriptors with their own limit and long distinct values ask for
/// 1,280 keys; 500 are kept, the rest count in the domain's overflow key. The full
/// reproduction (1,000 requests, the default cap, the resident set) is in the second tier.
#[test]
fn client_values_leave_a_bounded_number_of_series() {
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-cardinality");
    let (tollgate, metrics) = prometheus_tollgate(
        &dir,
        &redis,
        &[("TOLLGATE_ENVOY__METRICS__MAX_KEYS", "500")],
    );
    let text = flood(&tollgate, metrics, 20);
    assert_bounded(&text, 20, 500);
}

#[cfg(feature = "e2e")]
mod e2e {
    use super::*;
    use crate::support::wait_until;

    /// The resident set's high-water mark of process `pid`, in bytes (Linux).
    fn peak_rss(pid: u32) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmHWM in kB")
            * 1024
    }

    /// The whole reproduction, at the default cap of 10,000: 1,000 requests ask for 64,000
    /// keys of 3,500-byte values; at most 10,001 keys (5 series each) are left, and the
    /// process's peak resident set stays under 256 MiB (it reached 1.6 GB without the cap).
    #[test]
    fn a_flood_of_client_values_leaves_bounded_series_and_memory() {
        let redis = RedisServer::start();
        let dir = TempDir::new("erl-cardinality-full");
        let (tollgate, metrics) = prometheus_tollgate(&dir, &redis, &[]);
        let text = flood(&tollgate, metrics, 1_000);
        assert_bounded(&text, 1_000, 10_000);
        let rss = peak_rss(tollgate.pid());
        eprintln!(
            "{} series, {} kB exposition, peak RSS {} MiB",
            stats_samples(&text).len(),
            text.len() / 1024,
            rss >> 20
        );
        assert!(rss < 256 << 20, "peak RSS {} MiB", rss >> 20);
    }

    /// Keys carrying values that count nothing for 30 flush intervals are dropped (the
    /// overflow key stays), and their places are free again: new values get keys of their own.
    #[test]
    fn idle_keys_of_client_values_are_dropped_and_their_places_reused() {
        let redis = RedisServer::start();
        let dir = TempDir::new("erl-idle");
        let (tollgate, metrics) = prometheus_tollgate(
            &dir,
            &redis,
            &[
                ("TOLLGATE_ENVOY__METRICS__MAX_KEYS", "32"),
                ("TOLLGATE_ENVOY__METRICS__FLUSH_INTERVAL_MS", "50"),
            ],
        );
        let overflow = "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"overflow\"}";
        // One request of 64 new values: 32 keys, 32 hits in the overflow key.
        let text = flood(&tollgate, metrics, 1);
        assert_eq!(metric_value(&text, overflow), 32.0, "{text}");
        let value_series = |text: &str| {
            stats_samples(text)
                .iter()
                .filter(|(s, _)| s.contains("key1=\"anything_"))
                .count()
        };
        let mut text = String::new();
        let dropped = wait_until(std::time::Duration::from_secs(20), || {
            text = scrape(metrics, "/metrics").1;
            value_series(&text) == 0
        });
        assert!(dropped, "idle keys kept:\n{text}");
        assert_eq!(
            metric_value(&text, overflow),
            32.0,
            "the overflow key stays"
        );
        // Their places are free: a new value counts under its own key.
        let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"anything","value":"new"}],"limit":{"requests_per_unit":1000,"unit":"SECOND"}}]}"#;
        assert_eq!(post_json(&mut tollgate.client(), body), 200);
        let text = scrape(metrics, "/metrics").1;
        let own = "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"anything_new\"}";
        assert_eq!(metric_value(&text, own), 1.0, "{text}");
        assert_eq!(metric_value(&text, overflow), 32.0);
    }
}
