use super::*;

fn from(vars: &[(&str, &str)]) -> Result<ErlMetricsConfig, ConfigError> {
    let mut metrics = ErlMetricsConfig::default();
    apply(&mut metrics, &ErlEnv::of(vars)).map(|()| metrics)
}

/// The mapping in YAML of its own spelling (flow style, keys in another order): what
/// counts is what it says.
fn mapping_file(scale: &str) -> String {
    let stats = [
        "near_limit",
        "over_limit",
        "total_hits",
        "within_limit",
        "shadow_mode",
    ];
    let mut text = String::from("mappings:\n");
    for stat in stats {
        text.push_str(&format!(
            "- {{name: ratelimit_service_rate_limit_{stat}, labels: {{key1: $2, domain: $1}}, \
             timer_type: histogram, match: 'ratelimit.service.rate_limit.*.*.{stat}'}}\n"
        ));
    }
    for stat in stats {
        text.push_str(&format!(
            "- match: 'ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.{stat}'\n  \
             match_type: regex\n  name: ratelimit_service_rate_limit_{stat}\n  \
             timer_type: histogram\n  labels: {{domain: $1, key1: $2, key2: $3}}\n"
        ));
    }
    text.push_str(
        "- {match: ratelimit.service.call.should_rate_limit.*, name: ratelimit_service_should_rate_limit_error, match_metric_type: counter, labels: {err_type: $1}}\n\
         - {match: ratelimit_server.*.total_requests, name: ratelimit_service_total_requests, match_metric_type: counter, labels: {grpc_method: $1}}\n",
    );
    text.push_str(&format!(
        "- {{match: ratelimit_server.*.response_time, name: ratelimit_service_response_time_seconds, timer_type: histogram{scale}, labels: {{grpc_method: $1}}}}\n"
    ));
    text.push_str(
        "- {match: ratelimit.service.config_load_success, name: ratelimit_service_config_load_success, match_metric_type: counter}\n\
         - {match: ratelimit.service.config_load_error, name: ratelimit_service_config_load_error, match_metric_type: counter}\n",
    );
    text
}

#[test]
fn envoy_gateways_variables_serve_prometheus_on_its_port() {
    let dir = std::env::temp_dir().join(format!("tollgate-mapper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unscaled = dir.join("eg.yaml");
    std::fs::write(&unscaled, mapping_file("")).unwrap();
    let scaled = dir.join("erl.yaml");
    std::fs::write(&scaled, mapping_file(", scale: 0.001")).unwrap();
    let other = dir.join("other.yaml");
    std::fs::write(&other, mapping_file("").replace("key2: $3", "key3: $3")).unwrap();

    let eg = from(&[
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("PROMETHEUS_MAPPER_YAML", unscaled.to_str().unwrap()),
    ])
    .unwrap();
    assert_eq!(eg.prometheus_listen, Some("0.0.0.0:19001".parse().unwrap()));
    assert_eq!(eg.prometheus_path, "/metrics");
    assert!(eg.response_time_ms);
    assert_eq!(eg.statsd, None);
    let erl = from(&[
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_MAPPER_YAML", scaled.to_str().unwrap()),
    ])
    .unwrap();
    assert_eq!(erl.prometheus_listen, Some("0.0.0.0:9090".parse().unwrap()));
    assert!(!erl.response_time_ms);

    let refused = |vars: &[(&str, &str)]| from(vars).unwrap_err().to_string();
    let mapped = [
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_MAPPER_YAML", other.to_str().unwrap()),
    ];
    assert!(refused(&mapped).contains("PROMETHEUS_MAPPER_YAML"));
    assert!(refused(&[("USE_PROMETHEUS", "true")]).contains("USE_STATSD"));
    assert!(
        refused(&[("USE_STATSD", "false"), ("USE_PROMETHEUS", "yes")]).contains("USE_PROMETHEUS")
    );
    assert!(refused(&[("USE_DOG_STATSD", "true")]).contains("USE_DOG_STATSD"));
    assert!(refused(&[("EXTRA_TAGS", "a:b")]).contains("EXTRA_TAGS"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn statsd_is_on_unless_told_otherwise_as_in_envoyproxy_ratelimit() {
    let plain = from(&[]).unwrap();
    assert_eq!(plain.statsd.as_deref(), Some("localhost:8125"));
    assert_eq!(plain.statsd_protocol, StatsdProtocol::Tcp);
    assert_eq!(plain.flush_interval_ms, 10_000);
    let set = from(&[
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", "9125"),
        ("STATSD_PROTOCOL", "udp"),
        ("STATS_FLUSH_INTERVAL", "1.5s"),
        ("NEAR_LIMIT_RATIO", "0.9"),
    ])
    .unwrap();
    assert_eq!(set.statsd.as_deref(), Some("127.0.0.1:9125"));
    assert_eq!(set.statsd_protocol, StatsdProtocol::Udp);
    assert_eq!(set.flush_interval_ms, 1_500);
    assert!((set.near_limit_ratio - 0.9).abs() < f32::EPSILON);
    assert!(!from(&[("USE_STATSD", "false")]).unwrap().enabled());
    assert!(!from(&[("DISABLE_STATS", "true")]).unwrap().enabled());
    for bad in [
        ("STATSD_PORT", "x"),
        ("STATSD_PROTOCOL", "sctp"),
        ("STATS_FLUSH_INTERVAL", "10"),
        ("NEAR_LIMIT_RATIO", "lots"),
    ] {
        assert!(
            from(&[bad]).unwrap_err().to_string().contains(bad.0),
            "{bad:?}"
        );
    }
}
