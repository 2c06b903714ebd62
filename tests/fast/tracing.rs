//! `[tracing]` and envoyproxy/ratelimit's `TRACING_*` variables through the real binary: what
//! `validate` accepts, refuses and prints; and that a collector that is away costs spans,
//! counted, never a decision. (Spans reaching a receiver through a real Envoy: the e2e tier's
//! `tracing`.)

use std::process::Output;
use std::time::Duration;

use crate::support::{free_port, tollgate_command, wait_until, TempDir, Tollgate, SHORT_TIMINGS};

fn validate(config: &str, env: &[(&str, &str)]) -> Output {
    let dir = TempDir::new("tracing");
    tollgate_command()
        .arg("--config")
        .arg(dir.write("tollgate.toml", config))
        .arg("validate")
        .envs(env.iter().copied())
        .output()
        .expect("run tollgate")
}

/// Exit code 2 and one stderr line naming `key`.
fn assert_refused(output: &Output, key: &str) {
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(key), "{key:?} named in: {err}");
}

fn printed(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn validate_shows_the_tracing_table_and_never_a_header_value() {
    let config = "[tracing]\nenabled = true\nprotocol = \"grpc\"\nendpoint = \
                  \"http://collector:4317\"\nsampling_rate = 0.25\nservice_namespace = \"edge\"\n\
                  headers = { \"x-api-key\" = \"s3cret-value\" }\n";
    let shown = printed(&validate(config, &[]));
    assert!(
        shown.contains(
            "tracing       OTLP/gRPC to http://collector:4317, 25% of new traces, service \
             tollgate in edge, headers x-api-key"
        ),
        "{shown}"
    );
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(printed(&validate("", &[])).contains("tracing       off"));
}

#[test]
fn bad_tracing_settings_are_refused_naming_the_key() {
    let table = |line: &str| format!("[tracing]\nenabled = true\n{line}\n");
    for (line, key) in [
        ("sampling_rate = 1.5", "tracing.sampling_rate"),
        ("protocol = \"zipkin\"", "tracing.protocol"),
        (
            "endpoint = \"https://collector:4318/v1/traces\"",
            "tracing.endpoint",
        ),
        ("timeout_ms = 0", "tracing.timeout_ms"),
        ("queue = 0", "tracing.queue"),
        ("colour = \"blue\"", "tracing.colour"),
    ] {
        assert_refused(&validate(&table(line), &[]), key);
    }
    assert_refused(
        &validate("", &[("TOLLGATE_TRACING__SAMPLING_RATE", "2")]),
        "tracing.sampling_rate",
    );
}

#[test]
fn envoyproxy_ratelimits_variables_set_tracing_and_what_cannot_be_honoured_exits_2() {
    let rules = TempDir::new("rules");
    let root = rules.path().display().to_string();
    let erl = |extra: &[(&'static str, &'static str)]| {
        let mut env = vec![
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", ""),
            ("RUNTIME_APPDIRECTORY", ""),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "127.0.0.1:6379"),
            ("TRACING_ENABLED", "true"),
        ];
        env.extend_from_slice(extra);
        validate("", &env)
    };
    let shown = printed(&erl(&[
        ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
        ("TRACING_SAMPLING_RATE", "0.5"),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://otel-collector.monitoring:4318",
        ),
    ]));
    assert!(
        shown.contains(
            "tracing       OTLP/HTTP to http://otel-collector.monitoring:4318/v1/traces, 50% of \
             new traces, service envoy-ratelimit in envoy-gateway-system"
        ),
        "{shown}"
    );
    for (variable, value) in [
        ("TRACING_EXPORTER_PROTOCOL", "thrift"),
        ("TRACING_SAMPLING_RATE", "half"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ca.pem"),
    ] {
        assert_refused(&erl(&[(variable, value)]), variable);
    }
    assert_refused(&erl(&[("TRACING_ENABLED", "yes")]), "TRACING_ENABLED");
}

/// With nothing listening at the endpoint, every check is answered as usual and every
/// sampled span is counted lost (queue full or export failed), none exported.
#[test]
fn a_collector_that_is_away_costs_spans_never_a_decision() {
    let config = format!(
        "[tracing]\nenabled = true\nendpoint = \"http://127.0.0.1:{}/v1/traces\"\nqueue = 4\n\
         timeout_ms = 500\n",
        free_port()
    );
    let tollgate = Tollgate::start_with_env(&config, &[SHORT_TIMINGS]);
    let checks = 20;
    for _ in 0..checks {
        assert_eq!(tollgate.check(&[]).status, 200);
    }
    let lost = |t: &Tollgate| {
        t.metric("tollgate_trace_spans_total{result=\"queue_full\"}")
            + t.metric("tollgate_trace_spans_total{result=\"export_failed\"}")
    };
    let all_lost = wait_until(Duration::from_secs(10), || {
        lost(&tollgate) == f64::from(checks)
    });
    assert!(all_lost, "{}", tollgate.metrics());
    assert_eq!(
        tollgate.metric("tollgate_trace_spans_total{result=\"exported\"}"),
        0.0
    );
}
