//! envoyproxy/ratelimit's metrics out of a tollgate started in its environment, behind a real
//! Envoy (the shipped `config/envoy/ratelimit.yaml`, its actions changed where a test says):
//!
//! - Envoy Gateway's way: `USE_PROMETHEUS=true`, `PROMETHEUS_ADDR`, its mapping file; the
//!   series its e2e test polls for (`ratelimit_service_rate_limit_over_limit{key2=...}`) moves,
//!   and `promtool` reads the exposition.
//! - envoyproxy/ratelimit's own integration script `value-included-in-stats-key-when-
//!   unspecified.sh` (its `unspec` rule with `detailed_metric`, two per minute, three requests):
//!   a real statsd daemon receives `...rl.unspec_unspecified_value.over_limit` = 1, over TCP
//!   (the default there) and, from a second tollgate, over UDP.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::support::deploy::{run, text};
use crate::support::envoy::Envoy;
use crate::support::grpc::{self, ask, descriptor, request};
use crate::support::http::HttpClient;
use crate::support::proxies::backend::{send, Backend};
use crate::support::statsd::Statsd;
use crate::support::{free_port, redis_config, wait_until, RedisServer, TempDir, Tollgate};

/// The action line of the shipped ratelimit.yaml that the tests replace.
const REMOTE_ADDRESS_ACTION: &str = "- remote_address: {}";
/// The same indentation, for a second action in that list.
const NEXT_ACTION: &str = "\n                            - ";

/// envoyproxy/ratelimit's built-in statsd mapping without the response time's scale, as Envoy
/// Gateway mounts it at PROMETHEUS_MAPPER_YAML (spelled here in block style, ordered as there).
fn envoy_gateway_mapping() -> String {
    let stats = [
        "near_limit",
        "over_limit",
        "total_hits",
        "within_limit",
        "shadow_mode",
    ];
    let mut yaml = String::from("mappings:\n");
    for stat in stats {
        yaml.push_str(&format!(
            "  - match: \"ratelimit.service.rate_limit.*.*.{stat}\"\n    \
             name: \"ratelimit_service_rate_limit_{stat}\"\n    timer_type: \"histogram\"\n    \
             labels:\n      domain: \"$1\"\n      key1: \"$2\"\n"
        ));
    }
    for stat in stats {
        yaml.push_str(&format!(
            "  - match: \"ratelimit\\\\.service\\\\.rate_limit\\\\.([^\\\\.]*)\\\\.([^\\\\.]*)\\\\.([^\\\\.]*)(\\\\..*)?\\\\.{stat}\"\n    \
             match_type: regex\n    name: \"ratelimit_service_rate_limit_{stat}\"\n    \
             timer_type: \"histogram\"\n    labels:\n      domain: \"$1\"\n      key1: \"$2\"\n      key2: \"$3\"\n"
        ));
    }
    yaml.push_str(
        "  - match: \"ratelimit.service.call.should_rate_limit.*\"\n    \
         name: \"ratelimit_service_should_rate_limit_error\"\n    match_metric_type: counter\n    \
         labels:\n      err_type: \"$1\"\n\
         \x20 - match: \"ratelimit_server.*.total_requests\"\n    \
         name: \"ratelimit_service_total_requests\"\n    match_metric_type: counter\n    \
         labels:\n      grpc_method: \"$1\"\n\
         \x20 - match: \"ratelimit_server.*.response_time\"\n    \
         name: \"ratelimit_service_response_time_seconds\"\n    timer_type: histogram\n    \
         labels:\n      grpc_method: \"$1\"\n\
         \x20 - match: \"ratelimit.service.config_load_success\"\n    \
         name: \"ratelimit_service_config_load_success\"\n    match_metric_type: counter\n\
         \x20 - match: \"ratelimit.service.config_load_error\"\n    \
         name: \"ratelimit_service_config_load_error\"\n    match_metric_type: counter\n",
    );
    yaml
}

/// An envoyproxy/ratelimit runtime directory holding `yaml`, and the variables that point
/// tollgate at it, at `redis` and at a gRPC port of its own (returned), plus `more`.
fn erl_env(
    dir: &TempDir,
    yaml: &str,
    redis: &RedisServer,
    grpc_port: u16,
) -> Vec<(String, String)> {
    let config = dir.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("rules.yaml"), yaml).unwrap();
    [
        ("RUNTIME_ROOT", dir.path().display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc_port.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn start(env: &[(String, String)]) -> Tollgate {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Tollgate::start_with_env("", &pairs)
}

/// Envoy on the shipped ratelimit.yaml pointed at tollgate's gRPC port, its call timeout
/// raised (a loaded machine must still see tollgate's answer), with `more` replacements.
fn envoy(grpc_port: u16, app: &Backend, more: &[(&str, &str)]) -> Envoy {
    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let mut replacements = vec![(" timeout: 0.1s", " timeout: 1s")];
    replacements.extend_from_slice(more);
    Envoy::ratelimit(grpc, app.addr, &replacements)
}

fn scrape(addr: SocketAddr) -> String {
    HttpClient::connect(addr)
        .and_then(|mut c| c.get("/metrics", &[]))
        .map(|r| r.body)
        .unwrap_or_default()
}

/// The value of the first sample of `name` whose labels include `label`.
fn sample_with(exposition: &str, name: &str, label: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let labels = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = labels.split_once("} ")?;
        labels
            .split(',')
            .any(|l| l == label)
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// promtool reads the exposition; the one thing it may say is that counters lack `_total`,
/// which envoyproxy/ratelimit's names (which dashboards query as they are) do lack.
fn assert_promtool_reads(exposition: &str) {
    let output = run(
        Command::new("promtool").args(["check", "metrics"]),
        exposition,
    );
    let said = text(&output);
    let only_suffix_lint = said.lines().all(|line| {
        line.starts_with("ratelimit_service_")
            && line.ends_with("counter metrics should have \"_total\" suffix")
    });
    assert!(
        only_suffix_lint && matches!(output.status.code(), Some(0 | 3)),
        "promtool check metrics ({:?}): {said}\n{exposition}",
        output.status.code()
    );
}

#[test]
fn envoy_gateways_e2e_query_finds_the_over_limit_series_on_prometheus_addr() {
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-prom");
    // Envoy Gateway's shape: a route rule's level, then the client's masked address.
    let yaml = "domain: edge
descriptors:
  - key: rule
    value: r0
    descriptors:
      - key: masked_remote_address
        value: 0.0.0.0/0
        rate_limit: {unit: minute, requests_per_unit: 2}
";
    let grpc_port = free_port();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mapper = dir.write("statsd-exporter.yaml", &envoy_gateway_mapping());
    let mut env = erl_env(&dir, yaml, &redis, grpc_port);
    env.extend(
        [
            ("USE_STATSD", "false".to_string()),
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", metrics.to_string()),
            ("PROMETHEUS_MAPPER_YAML", mapper.display().to_string()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    let _tollgate = start(&env);
    let app = Backend::start();
    let action = format!(
        "- generic_key: {{ descriptor_key: rule, descriptor_value: r0 }}{NEXT_ACTION}\
         masked_remote_address: {{ v4_prefix_mask_len: 0 }}"
    );
    let envoy = envoy(grpc_port, &app, &[(REMOTE_ADDRESS_ACTION, action.as_str())]);

    let statuses: Vec<u16> = (0..3)
        .map(|_| send(envoy.addr, "GET", "/", &[]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429], "{}", envoy.log());

    // Envoy Gateway's e2e: poll until the query has a sample.
    let key2 = "key2=\"masked_remote_address_0_0_0_0/0\"";
    let over = "ratelimit_service_rate_limit_over_limit";
    let mut exposition = String::new();
    let seen = wait_until(Duration::from_secs(10), || {
        exposition = scrape(metrics);
        sample_with(&exposition, over, key2).is_some()
    });
    assert!(seen, "no {over}{{{key2}}} in:\n{exposition}");
    assert_eq!(sample_with(&exposition, over, key2), Some(1.0));
    let hits = "ratelimit_service_rate_limit_total_hits";
    assert_eq!(
        sample_with(&exposition, hits, "key1=\"rule_r0\""),
        Some(3.0)
    );
    assert_eq!(
        sample_with(&exposition, hits, "domain=\"edge\""),
        Some(3.0),
        "{exposition}"
    );
    // Envoy's health checks are not ShouldRateLimit calls.
    let requests = "ratelimit_service_total_requests";
    assert_eq!(
        sample_with(&exposition, requests, "grpc_method=\"ShouldRateLimit\""),
        Some(3.0)
    );
    assert_promtool_reads(&exposition);
}

/// envoyproxy/ratelimit's `unspec` rule (examples/ratelimit/config, domain `rl`).
const UNSPEC: &str = "domain: rl
descriptors:
  - key: unspec
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
";

#[test]
fn a_real_statsd_receives_the_keys_of_envoyproxy_ratelimits_integration_script() {
    let statsd = Statsd::start();
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-statsd");
    let grpc_port = free_port();
    let mut env = erl_env(&dir, UNSPEC, &redis, grpc_port);
    // USE_STATSD is true unless set otherwise, over TCP unless STATSD_PROTOCOL says.
    env.extend(
        [
            ("STATSD_HOST", "127.0.0.1".to_string()),
            ("STATSD_PORT", statsd.tcp_port.to_string()),
            ("STATS_FLUSH_INTERVAL", "200ms".into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    let _tollgate = start(&env);
    let app = Backend::start();
    let unspec_action = "- request_headers: { header_name: unspec, descriptor_key: unspec }";
    let envoy = envoy(
        grpc_port,
        &app,
        &[
            ("domain: edge", "domain: rl"),
            (REMOTE_ADDRESS_ACTION, unspec_action),
        ],
    );
    let header = [("unspec", "unspecified_value")];
    let statuses: Vec<u16> = (0..3)
        .map(|_| send(envoy.addr, "GET", "/unspec", &header).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429], "{}", envoy.log());

    let key = "ratelimit.service.rate_limit.rl.unspec_unspecified_value";
    let over = format!("{key}.over_limit");
    let arrived = wait_until(Duration::from_secs(10), || statsd.counter(&over) == 1);
    assert!(arrived, "{over} is not 1 in:\n{}", statsd.log_text());
    assert_eq!(statsd.counter(&format!("{key}.total_hits")), 3);
    assert_eq!(statsd.counter(&format!("{key}.within_limit")), 2);
    assert_eq!(statsd.counter(&format!("{key}.near_limit")), 1);
    assert_eq!(
        statsd.counter("ratelimit_server.ShouldRateLimit.total_requests"),
        3
    );
    assert_eq!(statsd.counter("statsd.bad_lines_seen"), 0);

    // The same keys over UDP, from a tollgate configured in TOML.
    let rules = dir.path().join("ratelimit").join("config");
    let toml = format!(
        "[envoy]\nconfig_dir = {:?}\n[envoy.metrics]\nstatsd = \"127.0.0.1:{}\"\n\
         statsd_protocol = \"udp\"\nflush_interval_ms = 200\n",
        rules.display().to_string(),
        statsd.udp_port
    );
    let (_by_udp, addr) = grpc::tollgate(&redis_config(&redis, "", &toml));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = grpc::client(addr).await;
        ask(
            &mut client,
            request("rl", vec![descriptor(&[("unspec", "udp")])]),
        )
        .await;
    });
    let hits = "ratelimit.service.rate_limit.rl.unspec_udp.total_hits";
    let arrived = wait_until(Duration::from_secs(10), || statsd.counter(hits) == 1);
    assert!(arrived, "{hits} is not 1 in:\n{}", statsd.log_text());
    assert_eq!(statsd.counter("statsd.bad_lines_seen"), 0);
}
