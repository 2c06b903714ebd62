//! Tracing end to end: a real Envoy (1.40) with its own OpenTelemetry tracer calls tollgate
//! through the shipped `config/envoy/` files; Envoy and tollgate both export their spans to
//! one OTLP receiver that decodes them with the OpenTelemetry project's own messages
//! (`support::otlp`). The client sends a W3C `traceparent`; tollgate's span must be in that
//! trace, the child of the span Envoy made for its call, with the decision's attributes.
//!
//! - `ratelimit_*`: `ratelimit.yaml`, the rate limit filter over gRPC; tollgate exports over
//!   OTLP/gRPC.
//! - `ext_authz_*`: `envoy.yaml`, ext_authz calling `/check`; tollgate exports over
//!   OTLP/HTTP.
//!
//! Envoy's own tracing is the only line each test adds to the shipped file (and a cluster for
//! the receiver), with the addresses and the call timeout the other Envoy tests change.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::Value;

use crate::support::envoy::Envoy;
use crate::support::otlp::{assert_span, service, OtlpReceiver};
use crate::support::proxies::backend::{send_from, Backend};
use crate::support::proxies::{read_shipped, template};
use crate::support::{grpc, RedisServer, Response, TempDir, Tollgate, SHORT_TIMINGS};

const CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Envoy exports its spans every 5 s; tollgate (with the short test timings) every 0.5 s.
const SPANS_WITHIN: Duration = Duration::from_secs(30);

/// The HTTP connection manager's line in both shipped Envoy configs, and Envoy's tracing
/// added after it: its OpenTelemetry tracer, exporting to the `otlp` cluster.
const HCM_LINE: &str = "                stat_prefix: ingress\n";
const ENVOY_TRACING: &str = "                stat_prefix: ingress\n                tracing: { provider: { name: envoy.tracers.opentelemetry, typed_config: { \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig, grpc_service: { envoy_grpc: { cluster_name: otlp }, timeout: 2s }, service_name: envoy } } }\n";

/// The `otlp` cluster (HTTP/2, the receiver's gRPC port), first of the shipped clusters.
fn otlp_cluster(receiver: &OtlpReceiver) -> String {
    format!(
        "  clusters:\n    - name: otlp\n      type: STATIC\n      connect_timeout: 1s\n      \
         typed_extension_protocol_options: {{ envoy.extensions.upstreams.http.v3.HttpProtocolOptions: \
         {{ \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, \
         explicit_http_config: {{ http2_protocol_options: {{}} }} }} }}\n      \
         load_assignment: {{ cluster_name: otlp, endpoints: [{{ lb_endpoints: [{{ endpoint: \
         {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }} }}] }}] }}\n",
        receiver.grpc.port()
    )
}

/// A trace id and the client's span id, sampled.
fn traceparent(trace: &str) -> String {
    format!("00-{trace}-00f067aa0ba902b7-01")
}

fn get(envoy: &Envoy, headers: &[(&str, &str)]) -> Response {
    send_from(CLIENT, envoy.addr, "GET", "/", headers)
        .unwrap_or_else(|e| panic!("GET / through Envoy: {e}\n{}", envoy.log()))
}

/// tollgate's span named `name` in `trace`, and Envoy's span that is its parent.
fn tollgate_span_under_envoys(spans: &[Value], trace: &str, name: &str) -> Option<(Value, Value)> {
    let ours = spans.iter().find(|span| {
        service(span) == Some("tollgate") && span["traceId"] == trace && span["name"] == name
    })?;
    let parent = spans
        .iter()
        .find(|span| service(span) == Some("envoy") && span["spanId"] == ours["parentSpanId"])?;
    Some((ours.clone(), parent.clone()))
}

/// Proves, through ratelimit.yaml with Envoy's tracing on: Envoy passes the client's trace to
/// the rate limit call, and tollgate's `ShouldRateLimit` span is in it, the child of Envoy's
/// span for that call, exported over OTLP/gRPC with the domain, the decision, the limits
/// applied; the denial names the limit that denied.
#[test]
fn ratelimit_filter_call_is_a_span_in_the_clients_trace_under_envoys() {
    let receiver = OtlpReceiver::start();
    let redis = RedisServer::start();
    let url = format!("url        = \"{}\"", redis.url());
    let config = template(
        &read_shipped("config/envoy/tollgate-grpc.toml"),
        &[
            ("url        = \"redis://redis:6379/0\"", url.as_str()),
            ("rate  = 20\nburst = 100", "rate  = 0.001\nburst = 1"),
        ],
    );
    let config = format!("{config}\n{}", receiver.tracing_table("grpc"));
    let (_tollgate, grpc_addr) = grpc::tollgate_with_env(&config, &[SHORT_TIMINGS]);
    let app = Backend::start();
    let cluster = otlp_cluster(&receiver);
    let envoy = Envoy::ratelimit(
        grpc_addr,
        app.addr,
        &[
            (" timeout: 0.1s", " timeout: 1s"),
            (HCM_LINE, ENVOY_TRACING),
            ("  clusters:\n", cluster.as_str()),
        ],
    );

    let allowed_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let allowed = get(&envoy, &[("traceparent", &traceparent(allowed_trace))]);
    assert_eq!(allowed.status, 200, "{allowed:?}");
    let denied_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let denied = get(&envoy, &[("traceparent", &traceparent(denied_trace))]);
    assert_eq!(denied.status, 429, "{denied:?}");

    let (span, parent) = receiver.wait_for(SPANS_WITHIN, |spans| {
        tollgate_span_under_envoys(spans, allowed_trace, "ShouldRateLimit")
    });
    assert_eq!(span["protocol"], "grpc");
    assert_eq!(span["kind"], "SPAN_KIND_SERVER");
    assert_eq!(parent["traceId"], allowed_trace);
    assert_span(
        &span,
        &[
            ("tollgate.domain", Some("edge")),
            ("tollgate.decision", Some("allowed")),
            ("tollgate.limits", Some("per-ip")),
            ("tollgate.on_error", Some("false")),
            ("tollgate.denied_by", None),
        ],
    );

    let (span, _) = receiver.wait_for(SPANS_WITHIN, |spans| {
        tollgate_span_under_envoys(spans, denied_trace, "ShouldRateLimit")
    });
    assert_span(
        &span,
        &[
            ("tollgate.decision", Some("denied")),
            ("tollgate.denied_by", Some("per-ip")),
        ],
    );
    assert_eq!(
        span["resource"]["service.name"]["stringValue"], "tollgate",
        "{span:#}"
    );
}

/// Proves, through envoy.yaml with Envoy's tracing on: Envoy passes the client's trace to the
/// ext_authz call, and tollgate's `check` span is in it, the child of Envoy's span for that
/// call, exported over OTLP/HTTP with the decision, the limit that denied and the status
/// answered.
#[test]
fn ext_authz_check_is_a_span_in_the_clients_trace_under_envoys() {
    let receiver = OtlpReceiver::start();
    let redis = RedisServer::start();
    let config = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n\n[client_ip]\ntrusted_proxies = \
         [\"127.0.0.1/32\"]\n\n[[limits]]\nname = \"per-ip\"\nrate = 0.001\nburst = 1\nkey = \
         [\"ip\"]\n\n{}",
        redis.url(),
        receiver.tracing_table("http")
    );
    let tollgate = Tollgate::start_with_env(&config, &[SHORT_TIMINGS]);
    let app = Backend::start();
    let cluster = otlp_cluster(&receiver);
    let envoy = Envoy::ext_authz(
        tollgate.addr,
        app.addr,
        &[
            (" timeout: 0.5s", " timeout: 2s"),
            (HCM_LINE, ENVOY_TRACING),
            ("  clusters:\n", cluster.as_str()),
        ],
    );
    redis.cli(&["FLUSHALL"]);

    let allowed_trace = "6bf92f3577b34da6a3ce929d0e0e4738";
    assert_eq!(
        get(&envoy, &[("traceparent", &traceparent(allowed_trace))]).status,
        200
    );
    let denied_trace = "7bf92f3577b34da6a3ce929d0e0e4739";
    assert_eq!(
        get(&envoy, &[("traceparent", &traceparent(denied_trace))]).status,
        429
    );

    let (span, parent) = receiver.wait_for(SPANS_WITHIN, |spans| {
        tollgate_span_under_envoys(spans, allowed_trace, "check")
    });
    assert_eq!(span["protocol"], "http");
    assert_eq!(parent["traceId"], allowed_trace);
    assert_span(
        &span,
        &[
            ("tollgate.decision", Some("allowed")),
            ("http.response.status_code", Some("200")),
        ],
    );
    let (span, _) = receiver.wait_for(SPANS_WITHIN, |spans| {
        tollgate_span_under_envoys(spans, denied_trace, "check")
    });
    assert_span(
        &span,
        &[
            ("tollgate.decision", Some("denied")),
            ("tollgate.denied_by", Some("per-ip")),
            ("http.response.status_code", Some("429")),
        ],
    );
}

/// Proves, with envoyproxy/ratelimit's variables as Envoy Gateway sets them (the general
/// `OTEL_EXPORTER_OTLP_ENDPOINT`, to which OTLP/HTTP adds `/v1/traces`): `/check` spans are
/// children of B3's single and multi headers, carry the service name, namespace and instance
/// id given, and a caller's "not sampled" records nothing.
#[test]
fn envoyproxy_ratelimits_variables_export_children_of_b3_headers() {
    let receiver = OtlpReceiver::start();
    let redis = RedisServer::start();
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let rules = TempDir::new("rules");
    let root = rules.path().display().to_string();
    let endpoint = format!("http://{}", receiver.http);
    let (tollgate, _grpc) = grpc::tollgate_with_env(
        "",
        &[
            SHORT_TIMINGS,
            ("RUNTIME_ROOT", &root),
            ("RUNTIME_SUBDIRECTORY", ""),
            ("RUNTIME_APPDIRECTORY", ""),
            ("USE_STATSD", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-0"),
            ("TRACING_SAMPLING_RATE", "1.0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ],
    );
    let unsampled_trace = "90f198ee56343ba864fe8b2a57d3eff0";
    let unsampled = format!("{unsampled_trace}-e457b5a2e4d86bd1-0");
    assert_eq!(tollgate.check(&[("b3", &unsampled)]).status, 200);
    let single_trace = "80f198ee56343ba864fe8b2a57d3eff7";
    let single = format!("{single_trace}-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90");
    assert_eq!(tollgate.check(&[("b3", &single)]).status, 200);
    let multi_trace = "a0f198ee56343ba864fe8b2a57d3eff8";
    let multi = [
        ("x-b3-traceid", multi_trace),
        ("x-b3-spanid", "a457b5a2e4d86bd2"),
        ("x-b3-sampled", "1"),
    ];
    assert_eq!(tollgate.check(&multi).status, 200);

    let in_trace =
        |spans: &[Value], trace: &str| spans.iter().find(|span| span["traceId"] == trace).cloned();
    let span = receiver.wait_for(SPANS_WITHIN, |spans| in_trace(spans, single_trace));
    assert_eq!(span["parentSpanId"], "e457b5a2e4d86bd1");
    assert_eq!(span["protocol"], "http");
    assert_eq!(service(&span), Some("envoy-ratelimit"));
    assert_eq!(
        span["resource"]["service.namespace"]["stringValue"],
        "envoy-gateway-system"
    );
    assert_eq!(
        span["resource"]["service.instance.id"]["stringValue"],
        "envoy-ratelimit-0"
    );
    assert_span(&span, &[("tollgate.decision", Some("allowed"))]);
    let span = receiver.wait_for(SPANS_WITHIN, |spans| in_trace(spans, multi_trace));
    assert_eq!(span["parentSpanId"], "a457b5a2e4d86bd2");
    // Every span of that batch has arrived by now: the unsampled one was never sent.
    assert!(
        in_trace(&receiver.spans(), unsampled_trace).is_none(),
        "{:#?}",
        receiver.spans()
    );
}
