use super::*;

fn env(pairs: &[(&str, &str)]) -> ErlEnv {
    ErlEnv::of(pairs)
}

fn applied(
    pairs: &'static [(&'static str, &'static str)],
) -> Result<crate::config::trace::TracingConfig, ConfigError> {
    let mut config = Config::default();
    apply(&mut config, &env(pairs))?;
    Ok(config.tracing)
}

#[test]
fn envoy_gateways_variables_turn_tracing_on_as_it_sets_them() {
    let tracing = applied(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
        ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-7d9f-abcde"),
        ("TRACING_SAMPLING_RATE", "0.1"),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://otel-collector.monitoring:4318",
        ),
    ])
    .unwrap();
    assert!(tracing.enabled);
    assert_eq!(tracing.protocol, Protocol::Http);
    assert_eq!(tracing.service_name, "envoy-ratelimit");
    assert_eq!(
        tracing.service_namespace.as_deref(),
        Some("envoy-gateway-system")
    );
    assert_eq!(
        tracing.service_instance_id.as_deref(),
        Some("envoy-ratelimit-7d9f-abcde")
    );
    assert_eq!(tracing.sampling_rate, 0.1);
    assert_eq!(
        tracing.endpoint.as_deref(),
        Some("http://otel-collector.monitoring:4318/v1/traces")
    );
}

#[test]
fn erls_defaults_apply_when_only_enabled_is_set() {
    let tracing = applied(&[("TRACING_ENABLED", "1")]).unwrap();
    assert_eq!(tracing.service_name, "RateLimit");
    assert_eq!(tracing.sampling_rate, 1.0);
    assert_eq!(tracing.endpoint_url(), "http://localhost:4318/v1/traces");
    assert!(!applied(&[("TRACING_ENABLED", "false")]).unwrap().enabled);
    assert!(!applied(&[]).unwrap().enabled);
}

#[test]
fn grpc_takes_the_endpoint_as_an_address_and_the_signals_own_variable_wins() {
    let grpc = applied(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
    ])
    .unwrap();
    assert_eq!(grpc.endpoint_url(), "http://collector:4317");
    let signal = applied(&[
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4318"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://traces:4318/custom",
        ),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b,other=2"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
    ])
    .unwrap();
    assert_eq!(signal.endpoint_url(), "http://traces:4318/custom");
    assert_eq!(signal.headers["api-key"].0, "a b");
    assert_eq!(signal.timeout_ms, 2500);
    let bare = applied(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
        ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
    ])
    .unwrap();
    assert_eq!(bare.endpoint_url(), "http://collector:4317");
}

#[test]
fn sampling_rates_outside_zero_to_one_are_the_nearest_as_in_the_go_sdk() {
    let rate = |text: &'static str| sampling_rate(text);
    assert_eq!(rate("2").unwrap(), 1.0);
    assert_eq!(rate("-1").unwrap(), 0.0);
    assert_eq!(rate("0.01").unwrap(), 0.01);
    assert_eq!(rate("NaN").unwrap_err().key, "TRACING_SAMPLING_RATE");
    assert_eq!(rate("ten").unwrap_err().key, "TRACING_SAMPLING_RATE");
}

#[test]
fn what_tollgate_cannot_honour_is_refused_naming_the_variable() {
    let key = |pairs: &'static [(&'static str, &'static str)]| applied(pairs).unwrap_err().key;
    assert_eq!(key(&[("TRACING_ENABLED", "yes")]), "TRACING_ENABLED");
    assert_eq!(
        key(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "HTTP")
        ]),
        "TRACING_EXPORTER_PROTOCOL"
    );
    assert_eq!(
        key(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")
        ]),
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    );
    assert_eq!(
        key(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318")
        ]),
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    );
    assert_eq!(
        key(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        ]),
        "OTEL_EXPORTER_OTLP_COMPRESSION"
    );
    assert_eq!(
        key(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/ca.pem")
        ]),
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"
    );
    assert_eq!(
        key(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue")
        ]),
        "OTEL_EXPORTER_OTLP_HEADERS"
    );
    assert_eq!(
        key(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")
        ]),
        "OTEL_EXPORTER_OTLP_TIMEOUT"
    );
    // Nothing is read, nor refused, while tracing is off.
    assert!(applied(&[
        ("TRACING_ENABLED", "false"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    ])
    .is_ok());
}
