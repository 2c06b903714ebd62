//! envoyproxy/ratelimit's xDS config source (`CONFIG_TYPE=GRPC_XDS_SOTW`): the real binary
//! follows a real management server (tests/support/xds.rs) and answers `ShouldRateLimit`
//! with what it sent, as envoyproxy/ratelimit's test/integration/xds_sotw_integration_test.go
//! and test/provider/xds_grpc_sotw_provider_test.go exercise it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};

use crate::support::grpc::{self, ask, descriptor, request, Client, OK, OVER_LIMIT};
use crate::support::xds::XdsServer;
use crate::support::{free_port, RedisServer, TempDir, Tollgate};

/// Long enough for a loaded machine; a passing run waits a fraction of it.
const PATIENCE: Duration = Duration::from_secs(20);

/// A tollgate started as envoyproxy/ratelimit is (its variables only), its gRPC address, and
/// the directory RUNTIME_ROOT names; `yaml`, if any, is the one file of its config directory.
fn erl_tollgate(
    redis: &RedisServer,
    env: &[(&str, &str)],
    yaml: Option<&str>,
) -> (TempDir, Tollgate, SocketAddr) {
    let root = TempDir::new("erl-xds");
    if let Some(yaml) = yaml {
        let dir = root.path().join("ratelimit").join("config");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.yaml"), yaml).unwrap();
    }
    let grpc_port = free_port().to_string();
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let root_text = root.path().display().to_string();
    let mut all = vec![
        ("RUNTIME_ROOT", root_text.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis_url.as_str()),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", grpc_port.as_str()),
    ];
    all.extend_from_slice(env);
    let tollgate = Tollgate::start_with_env("", &all);
    let addr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    (root, tollgate, addr)
}

/// The variables of a client of `server`, retrying every 100 ms.
fn xds_env(server: SocketAddr) -> Vec<(&'static str, String)> {
    vec![
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        ("CONFIG_GRPC_XDS_SERVER_URL", server.to_string()),
        ("CONFIG_GRPC_XDS_NODE_ID", "test-node".into()),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,team=rl".into()),
        (
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "100ms".into(),
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "x-tenant:blue".into(),
        ),
    ]
}

fn borrowed<'e>(env: &'e [(&'static str, String)]) -> Vec<(&'static str, &'e str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Domain `shop`: `user` (any value) at `per_minute` a minute, named `per-user`.
fn shop(per_minute: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: "shop-config".into(),
        domain: "shop".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: per_minute,
                name: "per-user".into(),
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

async fn try_ask(
    client: &mut Client,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    client
        .should_rate_limit(request)
        .await
        .map(|r| r.into_inner())
}

fn user(name: &str) -> RateLimitRequest {
    request("shop", vec![descriptor(&[("user", name)])])
}

/// The limit a fresh user of `shop` is shown, once one is shown at all.
async fn shown_limit(client: &mut Client, probe: &str) -> Option<u32> {
    let answer = try_ask(client, user(probe)).await.ok()?;
    answer
        .statuses
        .first()?
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

/// Polls until a fresh user of `shop` is shown `limit` (each poll a new user, so none is
/// over); fails after [`PATIENCE`].
async fn until_limit(client: &mut Client, limit: u32, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    for probe in 0.. {
        if shown_limit(client, &format!("probe-{limit}-{probe}")).await == Some(limit) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: limit {limit} never shown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `allowed` requests of `name` pass, the next one is OVER_LIMIT.
async fn assert_allows(client: &mut Client, name: &str, allowed: u32) {
    for i in 0..allowed {
        let answer = ask(client, user(name)).await;
        assert_eq!(
            answer.overall_code,
            OK,
            "{name}: request {} of {allowed}",
            i + 1
        );
    }
    let over = ask(client, user(name)).await;
    assert_eq!(
        over.overall_code,
        OVER_LIMIT,
        "{name}: request {}",
        allowed + 1
    );
}

/// The status of `/readyz`.
fn readiness(tollgate: &Tollgate) -> u16 {
    let mut http = crate::support::HttpClient::connect(tollgate.addr).expect("connect");
    http.get("/readyz", &[]).expect("an answer").status
}

/// Blocking waits of the server's, off the test's runtime threads.
async fn answer_to(
    server: &XdsServer,
    version: &str,
) -> envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
    tokio::task::block_in_place(|| server.answer_to(version, PATIENCE))
        .unwrap_or_else(|| panic!("no answer to version {version}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_follow_the_management_server_through_updates_refusals_and_restarts() {
    let redis = RedisServer::start();
    // The client starts before the server listens: it answers UNAVAILABLE, as
    // envoyproxy/ratelimit answers an error before its first configuration, and retries.
    let server_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let env = xds_env(server_addr);
    let (_root, tollgate, addr) = erl_tollgate(&redis, &borrowed(&env), None);
    let mut client = grpc::client(addr).await;
    let waiting = try_ask(&mut client, user("early")).await.unwrap_err();
    assert_eq!(waiting.code(), tonic::Code::Unavailable, "{waiting:?}");
    assert_eq!(
        readiness(&tollgate),
        503,
        "not ready before the first configuration"
    );

    let mut server = XdsServer::start_at(server_addr);
    server.set("1", &[shop(3)]);
    until_limit(&mut client, 3, "the first snapshot").await;
    assert_eq!(readiness(&tollgate), 200);
    assert_allows(&mut client, "alice", 3).await;
    let ack = answer_to(&server, "1").await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("1", None));
    let first = server
        .received()
        .into_iter()
        .next()
        .expect("a first request");
    assert_eq!(first.request.type_url, crate::support::xds::RESOURCE_TYPE);
    let node = first.request.node.expect("the node");
    assert_eq!(node.id, "test-node");
    let metadata = node.metadata.expect("node metadata");
    let zone = metadata.fields["zone"].kind.clone();
    assert_eq!(
        zone,
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
            "a".into()
        ))
    );
    assert_eq!(
        first.metadata.get("x-tenant").and_then(|v| v.to_str().ok()),
        Some("blue")
    );

    // A new snapshot applies without a restart.
    server.set("2", &[shop(5)]);
    until_limit(&mut client, 5, "the second snapshot").await;
    assert_allows(&mut client, "bob", 5).await;
    assert_eq!(answer_to(&server, "2").await.error_detail, None);

    // A refused snapshot: NACKed with the reason and the version still running; the running
    // rules stay, and the refusal is counted as a failed reload.
    let mut twice = shop(9);
    twice.descriptors.push(twice.descriptors[0].clone());
    server.set("3", &[twice]);
    let nack = answer_to(&server, "3").await;
    assert_eq!(nack.version_info, "2", "the version still running");
    let detail = nack.error_detail.expect("a NACK carries error_detail");
    assert!(detail.message.contains("duplicate"), "{}", detail.message);
    assert_eq!(shown_limit(&mut client, "carol").await, Some(5));
    assert!(tollgate.metric("tollgate_config_reloads_total{result=\"failure\"}") >= 1.0);

    // The server dies: the last rules keep serving; once it is back with a new snapshot,
    // the client reconnects and applies it.
    server.kill();
    assert_eq!(shown_limit(&mut client, "dave").await, Some(5));
    server.set("4", &[shop(7)]);
    server.restart();
    until_limit(&mut client, 7, "the snapshot after a restart").await;
    let back = answer_to(&server, "4").await;
    assert_eq!(back.error_detail, None);
    assert!(
        server
            .received()
            .iter()
            .any(|r| r.request.response_nonce.is_empty() && r.request.version_info == "2"),
        "the reconnecting client asks by the version it runs"
    );
}

/// A chain of `depth` descriptors whose last one has `leaves` leaves (`a` = i, 1/min each).
fn deep_and_wide(depth: usize, leaves: usize) -> RateLimitConfig {
    let leaf = |i: usize| RateLimitDescriptor {
        key: "a".into(),
        value: i.to_string(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Minute as i32,
            requests_per_unit: 1,
            ..RateLimitPolicy::default()
        }),
        ..RateLimitDescriptor::default()
    };
    let mut node = RateLimitDescriptor {
        key: "k".into(),
        value: "v".into(),
        descriptors: (0..leaves).map(leaf).collect(),
        ..RateLimitDescriptor::default()
    };
    for _ in 1..depth {
        node = RateLimitDescriptor {
            key: "k".into(),
            value: "v".into(),
            descriptors: vec![node],
            ..RateLimitDescriptor::default()
        };
    }
    RateLimitConfig {
        name: "huge".into(),
        domain: "huge".into(),
        descriptors: vec![node],
    }
}

/// One response of a few hundred kB could once take most of a gigabyte and half a minute of
/// the main thread: a set too deep or too large is refused before anything is built, NACKed
/// with the reason, and the running rules stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_resource_set_is_refused_with_the_reason_and_the_rules_stay() {
    let redis = RedisServer::start();
    let server = XdsServer::start();
    server.set("1", &[shop(3)]);
    let env = xds_env(server.addr);
    let (_root, tollgate, addr) = erl_tollgate(&redis, &borrowed(&env), None);
    let mut client = grpc::client(addr).await;
    until_limit(&mut client, 3, "the first snapshot").await;

    let refusals = [
        ("2", deep_and_wide(95, 20_000), "nest more than 16 deep"),
        ("3", deep_and_wide(1, 10_000), "more than 10000 descriptors"),
    ];
    for (version, huge, reason) in refusals {
        let started = Instant::now();
        server.set(version, &[shop(9), huge]);
        let nack = answer_to(&server, version).await;
        eprintln!("version {version} refused after {:?}", started.elapsed());
        assert_eq!(nack.version_info, "1", "the version still running");
        let detail = nack.error_detail.expect("a NACK carries error_detail");
        assert!(detail.message.contains(reason), "{}", detail.message);
        assert_eq!(
            shown_limit(&mut client, &format!("after-{version}")).await,
            Some(3)
        );
    }
    // Within the bounds: installed.
    server.set("4", &[shop(5), deep_and_wide(15, 500)]);
    until_limit(&mut client, 5, "a large set within the bounds").await;
    assert_eq!(answer_to(&server, "4").await.error_detail, None);
    // The next set drops them, series included: per-user, the request limit and the
    // config's own per-ip are left.
    server.set("5", &[shop(7)]);
    until_limit(&mut client, 7, "the set after the large one").await;
    let series = || {
        tollgate
            .metrics()
            .lines()
            .filter(|line| line.starts_with("tollgate_limit_decisions_total{"))
            .count()
    };
    // Dropped right after the swap, which a check may see first.
    assert!(
        crate::support::wait_until(PATIENCE, || series() == 3 * 3),
        "three limits, three decisions each: {:?}",
        tollgate
            .metrics()
            .lines()
            .filter(|line| line.starts_with("tollgate_limit_decisions_total{"))
            .collect::<Vec<_>>()
    );
    drop(tollgate);
}

/// Envoy Gateway's server speaks only mutual TLS: envoyproxy/ratelimit's TLS variables make
/// the client check the server's certificate against the CA and show its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_reaches_a_server_that_asks_for_the_client_certificate() {
    let certs = TempDir::new("xds-tls");
    crate::support::make_certificates(certs.path());
    let file = |name: &str| certs.path().join(name).display().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("cert.pem"), file("key.pem"));
    let server = XdsServer::start_tls(certs.path());
    server.set("1", &[shop(2)]);
    let redis = RedisServer::start();
    let mut env = xds_env(server.addr);
    env.extend([
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_string()),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key),
    ]);
    let (_root, _tollgate, addr) = erl_tollgate(&redis, &borrowed(&env), None);
    let mut client = grpc::client(addr).await;
    until_limit(&mut client, 2, "the snapshot over mutual TLS").await;
    assert_allows(&mut client, "erin", 2).await;
}

/// envoyproxy/ratelimit turns each resource into its YAML form and loads that: the same tree
/// as a YAML file of the config directory and as an xDS resource decides the same way,
/// request by request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xds_resource_decides_as_the_same_yaml_in_a_config_directory() {
    const YAML: &str = "domain: mixed
descriptors:
  - key: client
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 4, name: gold}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 2, name: gold-path, replaces: [{name: gold}]}
  - key: client
    value: free*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: vip
    rate_limit: {unlimited: true}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata: {team: blue}
  - key: counted
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: empty
";
    let asked: Vec<Vec<Vec<(&str, &str)>>> = vec![
        vec![vec![("client", "gold")]],
        vec![vec![("client", "gold"), ("path", "/a")]],
        vec![vec![("client", "free-1")], vec![("client", "free-2")]],
        vec![vec![("client", "other")]],
        vec![vec![("vip", "x")], vec![("client", "gold")]],
        vec![vec![("shadowed", "s")]],
        vec![vec![("counted", "c")], vec![("client", "third")]],
        vec![vec![("empty", "e")], vec![("unknown", "u")]],
    ];
    let file_redis = RedisServer::start();
    let (_file_root, _file_tollgate, file_addr) = erl_tollgate(
        &file_redis,
        &[("RESPONSE_DYNAMIC_METADATA", "true")],
        Some(YAML),
    );
    let file_client = grpc::client(file_addr).await;

    let xds_redis = RedisServer::start();
    let server = XdsServer::start();
    server.set("1", &[proto_from_yaml("mixed-config", YAML)]);
    let mut env = xds_env(server.addr);
    env.push(("RESPONSE_DYNAMIC_METADATA", "true".into()));
    // As Envoy Gateway starts it: ready before its first configuration.
    env.push(("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()));
    let (_xds_root, _xds_tollgate, xds_addr) = erl_tollgate(&xds_redis, &borrowed(&env), None);
    let mut xds_client = grpc::client(xds_addr).await;
    let deadline = Instant::now() + PATIENCE;
    while try_ask(
        &mut xds_client,
        request("mixed", vec![descriptor(&[("vip", "probe")])]),
    )
    .await
    .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the xDS snapshot was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let from_file = decisions(file_client, &asked).await;
    let from_xds = decisions(xds_client, &asked).await;
    assert!(
        from_file.iter().any(|d| d.1 == OVER_LIMIT),
        "the scenario reaches limits"
    );
    assert_eq!(from_xds.len(), from_file.len());
    for (xds, file) in from_xds.iter().zip(&from_file) {
        assert_eq!(xds, file, "{}", file.0);
    }
}

/// One answer: what was asked, the overall code, each status (code, limit shown,
/// remaining), the dynamic metadata.
type Decision = (
    String,
    i32,
    Vec<(i32, Option<RateLimit>, u32)>,
    Option<envoy_types::pb::google::protobuf::Struct>,
);

/// Every answer to five rounds of `asked` (each request a list of descriptors, each a list
/// of entries).
async fn decisions(mut client: Client, asked: &[Vec<Vec<(&str, &str)>>]) -> Vec<Decision> {
    let mut seen = Vec::new();
    for round in 0..5 {
        for descriptors in asked {
            let request = request(
                "mixed",
                descriptors
                    .iter()
                    .map(|entries| descriptor(entries))
                    .collect(),
            );
            let answer = ask(&mut client, request).await;
            let statuses = answer
                .statuses
                .iter()
                .map(|s| (s.code, s.current_limit.clone(), s.limit_remaining))
                .collect();
            seen.push((
                format!("round {round} {descriptors:?}"),
                answer.overall_code,
                statuses,
                answer.dynamic_metadata,
            ));
        }
    }
    seen
}

/// The resource envoyproxy/ratelimit's xDS server would send for a YAML file, built field by
/// field from the YAML (every field the protocol has).
fn proto_from_yaml(name: &str, yaml: &str) -> RateLimitConfig {
    let root: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
    RateLimitConfig {
        name: name.into(),
        domain: root["domain"].as_str().unwrap_or_default().into(),
        descriptors: nodes(&root["descriptors"]),
    }
}

fn nodes(list: &serde_yaml::Value) -> Vec<RateLimitDescriptor> {
    let text = |v: &serde_yaml::Value| v.as_str().unwrap_or_default().to_string();
    let flag = |v: &serde_yaml::Value| v.as_bool().unwrap_or(false);
    list.as_sequence()
        .map(|items| {
            items
                .iter()
                .map(|node| RateLimitDescriptor {
                    key: text(&node["key"]),
                    value: text(&node["value"]),
                    rate_limit: node.get("rate_limit").map(|limit| RateLimitPolicy {
                        unit: limit["unit"]
                            .as_str()
                            .and_then(|u| RateLimitUnit::from_str_name(&u.to_ascii_uppercase()))
                            .unwrap_or(RateLimitUnit::Unknown) as i32,
                        requests_per_unit: limit["requests_per_unit"].as_u64().unwrap_or(0) as u32,
                        unlimited: flag(&limit["unlimited"]),
                        name: text(&limit["name"]),
                        replaces: limit["replaces"]
                            .as_sequence()
                            .into_iter()
                            .flatten()
                            .map(|r| RateLimitReplace {
                                name: text(&r["name"]),
                            })
                            .collect(),
                    }),
                    descriptors: nodes(&node["descriptors"]),
                    shadow_mode: flag(&node["shadow_mode"]),
                    detailed_metric: flag(&node["detailed_metric"]),
                    quota_mode: flag(&node["quota_mode"]),
                    metadata: node.get("metadata").map(yaml_struct),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn yaml_struct(map: &serde_yaml::Value) -> envoy_types::pb::google::protobuf::Struct {
    use envoy_types::pb::google::protobuf::{value::Kind, Value};
    let fields = map
        .as_mapping()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let kind = Kind::StringValue(v.as_str().unwrap_or_default().into());
            (
                k.as_str().unwrap_or_default().to_string(),
                Value { kind: Some(kind) },
            )
        })
        .collect();
    envoy_types::pb::google::protobuf::Struct { fields }
}

/// Second tier (`cargo test --features e2e`): runs for more than a few seconds.
#[cfg(feature = "e2e")]
mod e2e {
    use super::*;

    /// The largest set the bounds let through installs, and what it costs: resident memory
    /// per rule (print with `-- --nocapture`; docs/REFERENCE.md quotes it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_set_at_the_bounds_installs_and_its_memory_per_rule_is_printed() {
        let redis = RedisServer::start();
        let server = XdsServer::start();
        server.set("1", &[shop(3)]);
        let env = xds_env(server.addr);
        let (_root, tollgate, addr) = erl_tollgate(&redis, &borrowed(&env), None);
        let mut client = grpc::client(addr).await;
        until_limit(&mut client, 3, "the first snapshot").await;
        let rss = || crate::support::chaos::rss_kib(tollgate.pid());
        let before = rss();
        // 9,015 descriptors 16 deep: the deepest and nearly the largest set allowed.
        server.set("2", &[shop(5), deep_and_wide(15, 9_000)]);
        until_limit(&mut client, 5, "a set at the bounds").await;
        assert_eq!(answer_to(&server, "2").await.error_detail, None);
        let after = rss();
        eprintln!(
            "RSS {before} KiB with 1 rule, {after} KiB with 9,015 rules 16 deep ({} KiB per rule)",
            after.saturating_sub(before) / 9_015
        );
        assert!(after > before, "{after} KiB after, {before} KiB before");
    }
}
