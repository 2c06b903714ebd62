//! Serving envoyproxy/ratelimit's rules as it does: a ConfigMap's symlink swap, its
//! variables and HTTP endpoints, and the dynamic metadata of the passed rules.

use super::*;

/// A ConfigMap's layout: the files link through `..data`, a link to a timestamped directory
/// that the kubelet swaps for a new one.
fn configmap(root: &std::path::Path, version: &str, yaml: &str) {
    let data = root.join(format!("..{version}"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("config.yaml"), yaml).unwrap();
    let next = root.join("..data_tmp");
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(format!("..{version}"), &next).unwrap();
    std::fs::rename(&next, root.join("..data")).unwrap();
    let file = root.join("config.yaml");
    if std::fs::symlink_metadata(&file).is_err() {
        std::os::unix::fs::symlink("..data/config.yaml", &file).unwrap();
    }
}

/// envoyproxy/ratelimit's runtime reload (RUNTIME_WATCH_ROOT, a Kubernetes ConfigMap): after
/// a symlink swap the new rules are served, without a restart or a signal; a swap to a file it
/// would refuse keeps the running rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_symlink_swap_is_served_without_a_restart() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-configmap");
    let root = dir.path().join("config");
    std::fs::create_dir_all(&root).unwrap();
    let rule = |n: u32| {
        format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n")
    };
    configmap(&root, "v1", &rule(1));
    let toml = format!("[envoy]\nconfig_dir = {:?}\n", root.display().to_string());
    // The directory is looked at every `watch_every` (1 s; here 100 ms).
    let short = [crate::support::SHORT_TIMINGS];
    let (tollgate, addr) = grpc::tollgate_with_env(&redis_config(&redis, "", &toml), &short);
    let watch_every = crate::support::short_timings().watch_every;
    let mut client = grpc::client(addr).await;
    let limit_of = |r: &RateLimitResponse| r.statuses[0].current_limit.clone().unwrap_or_default();
    assert_eq!(
        limit_of(&one(&mut client, "d", &[("k", "a")]).await).requests_per_unit,
        1
    );

    configmap(&root, "v2", &rule(7));
    let mut served = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        served = limit_of(&one(&mut client, "d", &[("k", "b")]).await).requests_per_unit;
        if served == 7 {
            break;
        }
        tokio::time::sleep(watch_every / 5).await;
    }
    assert_eq!(served, 7, "the swapped rules are served");

    let refused = || tollgate.metric(r#"tollgate_config_reloads_total{result="failure"}"#);
    assert_eq!(refused(), 0.0);
    configmap(
        &root,
        "v3",
        "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n",
    );
    // Read and refused, then given two and a half more looks (production's 2.5 s, scaled).
    assert!(
        crate::support::wait_until(std::time::Duration::from_secs(10), || refused() == 1.0),
        "the broken file was never read"
    );
    tokio::time::sleep(watch_every * 5 / 2).await;
    assert_eq!(
        refused(),
        1.0,
        "a refused file is not read again until it changes"
    );
    let kept = one(&mut client, "d", &[("k", "c")]).await;
    assert_eq!(
        limit_of(&kept).requests_per_unit,
        7,
        "a refused file changes nothing"
    );
}

/// envoyproxy/ratelimit's settings (src/settings/settings.go) read from its own variables:
/// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config holds the YAML, REDIS_URL (host:port) the store,
/// GRPC_HOST/GRPC_PORT the gRPC listener; and its HTTP `POST /json` (429 when over, the
/// response in protobuf's JSON form) and `GET /healthcheck`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_variables_and_http_endpoints_work_as_its_own() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("erl-env");
    let config = dir.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("shop.yaml"),
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}\n",
    )
    .unwrap();
    let grpc_port = crate::support::free_port().to_string();
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let root = dir.path().display().to_string();
    let tollgate = Tollgate::start_with_env(
        "",
        &[
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", redis_url.as_str()),
            ("REDIS_TYPE", "SINGLE"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", grpc_port.as_str()),
        ],
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let mut client = grpc::client(addr).await;
    let first = one(&mut client, "shop", &[("user", "u")]).await;
    assert_eq!(shown(&first), [(OK, 2, MINUTE, "per-user".into(), 1)]);
    // The bucket is in the Redis REDIS_URL names.
    let keys = crate::support::redis_cli(redis.port, &["KEYS", "tollgate:*"]).unwrap();
    assert!(keys.contains("per-user"), "{keys}");

    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let post = |body: &str| {
        let mut http = crate::support::http::HttpClient::connect(tollgate.addr).unwrap();
        let raw = format!(
            "POST /json HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        http.send_raw(raw.as_bytes()).unwrap()
    };
    let ok = post(body);
    assert_eq!(ok.status, 200, "{}", ok.body);
    let json: serde_json::Value = serde_json::from_str(&ok.body).unwrap();
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["currentLimit"]["name"], "per-user");
    assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert!(
        json["statuses"][0].get("limitRemaining").is_none(),
        "0 is left out"
    );
    let over = post(body);
    assert_eq!(over.status, 429, "{}", over.body);
    let json: serde_json::Value = serde_json::from_str(&over.body).unwrap();
    assert_eq!(json["overallCode"], "OVER_LIMIT");
    assert_eq!(post("{not json").status, 400);

    let mut http = crate::support::http::HttpClient::connect(tollgate.addr).unwrap();
    let health = http.get("/healthcheck", &[]).unwrap();
    assert_eq!((health.status, health.body.as_str()), (200, "OK"));
}

/// The string a protobuf `Value` holds, or its number as text; `None` for anything else.
fn text_of(value: Option<&envoy_types::pb::google::protobuf::Value>) -> Option<String> {
    use envoy_types::pb::google::protobuf::value::Kind;
    match value?.kind.as_ref()? {
        Kind::StringValue(s) => Some(s.clone()),
        Kind::NumberValue(n) => Some(n.to_string()),
        _ => None,
    }
}

fn field<'s>(
    fields: &'s envoy_types::pb::google::protobuf::Struct,
    path: &[&str],
) -> Option<&'s envoy_types::pb::google::protobuf::Value> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let (last, parents) = path.split_last()?;
    let mut at = fields;
    for name in parents {
        match at.fields.get(*name)?.kind.as_ref()? {
            Kind::StructValue(inner) => at = inner,
            _ => return None,
        }
    }
    at.fields.get(*last)
}

/// ratelimit_test.go TestMetadataReturnedForPassedDescriptors,
/// TestMetadataReturnedForAllPassedDescriptors and TestOverlappingMetadataReturnsTheFirstValue
/// (RESPONSE_DYNAMIC_METADATA): the domain, the descriptors' entries, the request's hits, and
/// the merged `metadata` of the rules that passed (the first value of a key kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_metadata_carries_the_passed_rules_metadata() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let yaml = "domain: d
descriptors:
  - key: a
    metadata: {team: {name: alpha, tier: 1}, owner: x}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    metadata: {team: {name: beta, region: eu}}
    rate_limit: {unit: minute, requests_per_unit: 5}
";
    let (_dir, _tollgate, addr) = serve_yaml_with(&redis, yaml, "dynamic_metadata = true\n");
    let mut client = grpc::client(addr).await;
    let both = || {
        let mut r = request(
            "d",
            vec![descriptor(&[("a", "1")]), descriptor(&[("b", "2")])],
        );
        r.hits_addend = 1;
        r
    };
    let first = ask(&mut client, both()).await;
    let meta = first.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(text_of(field(&meta, &["domain"])), Some("d".into()));
    assert_eq!(text_of(field(&meta, &["hitsAddend"])), Some("1".into()));
    assert_eq!(
        text_of(field(&meta, &["metadata", "team", "name"])),
        Some("alpha".into())
    );
    assert_eq!(
        text_of(field(&meta, &["metadata", "team", "region"])),
        Some("eu".into())
    );
    assert_eq!(
        text_of(field(&meta, &["metadata", "owner"])),
        Some("x".into())
    );
    let second = ask(&mut client, both()).await;
    assert_eq!(second.overall_code, OVER_LIMIT);
    let meta = second.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(
        text_of(field(&meta, &["metadata", "team", "name"])),
        Some("beta".into())
    );
    assert!(
        field(&meta, &["metadata", "owner"]).is_none(),
        "a did not pass"
    );
}
