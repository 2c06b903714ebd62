//! envoyproxy/ratelimit's YAML served over gRPC (`[envoy] config_dir`), answered as
//! envoyproxy/ratelimit answers. Each test names the envoyproxy/ratelimit case it mirrors
//! (test/config/config_test.go, test/service/ratelimit_test.go); the YAML is written here.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::support::grpc::{self, ask, descriptor, request, Client, OK, OVER_LIMIT};
use crate::support::{redis_config, RedisServer, TempDir, Tollgate};

/// Envoy's unit numbers.
const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const DAY: i32 = 4;

/// Runs these tests one after another: each starts a Redis and a tollgate.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A tollgate serving `yaml` as the one file of an envoyproxy/ratelimit config directory.
pub fn serve_yaml(redis: &RedisServer, yaml: &str) -> (TempDir, Tollgate, std::net::SocketAddr) {
    serve_yaml_with(redis, yaml, "")
}

/// [`serve_yaml`] with more `[envoy]` settings.
fn serve_yaml_with(
    redis: &RedisServer,
    yaml: &str,
    envoy: &str,
) -> (TempDir, Tollgate, std::net::SocketAddr) {
    let dir = TempDir::new("erl");
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), yaml).unwrap();
    let toml = format!(
        "[envoy]\nconfig_dir = {:?}\n{envoy}",
        config.display().to_string()
    );
    let (tollgate, addr) = grpc::tollgate(&redis_config(redis, "", &toml));
    (dir, tollgate, addr)
}

fn with_hits(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.hits_addend = Some(UInt64Value { value: hits });
    descriptor
}

/// (code, requests_per_unit, unit, name, remaining) of every descriptor.
fn shown(response: &RateLimitResponse) -> Vec<(i32, u32, i32, String, u32)> {
    response
        .statuses
        .iter()
        .map(|s| {
            let limit = s.current_limit.clone().unwrap_or_default();
            (
                s.code,
                limit.requests_per_unit,
                limit.unit,
                limit.name,
                s.limit_remaining,
            )
        })
        .collect()
}

async fn one(client: &mut Client, domain: &str, entries: &[(&str, &str)]) -> RateLimitResponse {
    ask(client, request(domain, vec![descriptor(entries)])).await
}

const BASIC: &str = "domain: d
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 2, name: specific}
  - key: key1
    value: free
  - key: key2
    value: value2
    descriptors:
      - key: subkey
        rate_limit: {unit: day, requests_per_unit: 3}
  - key: key3
    rate_limit: {unlimited: true}
  - key: key4
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: key5
    rate_limit: {unit: minute, requests_per_unit: 5}
";

/// config_test.go TestBasicConfig: the value's rule beats the key's (only it is charged and
/// shown), a value without rate_limit is not limited, nested rules need the whole path, and
/// the unit and name are the configured ones (60/MINUTE stays MINUTE; unnamed is "").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_most_specific_rule_alone_decides_and_is_shown_as_configured() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_dir, _tollgate, addr) = serve_yaml(&redis, BASIC);
    let mut client = grpc::client(addr).await;
    let specific = one(&mut client, "d", &[("key1", "value1")]).await;
    assert_eq!(specific.overall_code, OK);
    assert_eq!(shown(&specific), [(OK, 2, MINUTE, "specific".into(), 1)]);
    let second = one(&mut client, "d", &[("key1", "value1")]).await;
    assert_eq!(second.statuses[0].limit_remaining, 0);
    let third = one(&mut client, "d", &[("key1", "value1")]).await;
    assert_eq!(third.overall_code, OVER_LIMIT);
    assert_eq!(
        shown(&third),
        [(OVER_LIMIT, 2, MINUTE, "specific".into(), 0)]
    );
    // The key's own rule was never charged by value1: another value finds it full.
    let other = one(&mut client, "d", &[("key1", "other")]).await;
    assert_eq!(shown(&other), [(OK, 5, SECOND, String::new(), 4)]);
    for _ in 0..10 {
        let free = one(&mut client, "d", &[("key1", "free")]).await;
        assert_eq!(free.overall_code, OK);
        assert_eq!(free.statuses[0].current_limit, None);
    }
    let nested = one(&mut client, "d", &[("key2", "value2"), ("subkey", "s")]).await;
    assert_eq!(shown(&nested), [(OK, 3, DAY, String::new(), 2)]);
    let partial = one(&mut client, "d", &[("key2", "value2")]).await;
    assert_eq!(partial.statuses[0].current_limit, None);
    let longer = one(&mut client, "d", &[("key1", "x"), ("subkey", "s")]).await;
    assert_eq!(longer.statuses[0].current_limit, None);
    let unknown = one(&mut client, "elsewhere", &[("key1", "value1")]).await;
    assert_eq!(unknown.overall_code, OK);
}

/// ratelimit_test.go TestUnlimited and config_test.go's requests_per_unit 0: an unlimited
/// descriptor is OK with 4294967295 left; 0 per unit is always over (a look with hits 0 is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_reports_the_maximum_and_zero_per_unit_is_always_over() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_dir, _tollgate, addr) = serve_yaml(&redis, BASIC);
    let mut client = grpc::client(addr).await;
    for _ in 0..3 {
        let unlimited = one(&mut client, "d", &[("key3", "anything")]).await;
        assert_eq!(unlimited.overall_code, OK);
        assert_eq!(unlimited.statuses[0].limit_remaining, 4_294_967_295);
        assert_eq!(unlimited.statuses[0].current_limit, None);
    }
    let zero = one(&mut client, "d", &[("key4", "x")]).await;
    assert_eq!(zero.overall_code, OVER_LIMIT);
    assert_eq!(shown(&zero), [(OVER_LIMIT, 0, MINUTE, String::new(), 0)]);
    let look = ask(
        &mut client,
        request("d", vec![with_hits(descriptor(&[("key4", "x")]), 0)]),
    )
    .await;
    assert_eq!(look.overall_code, OK);
    // A request that 0 per unit denies charges nothing elsewhere.
    let both = ask(
        &mut client,
        request(
            "d",
            vec![descriptor(&[("key1", "z")]), descriptor(&[("key4", "x")])],
        ),
    )
    .await;
    assert_eq!(both.overall_code, OVER_LIMIT);
    assert_eq!(both.statuses[0].limit_remaining, 5);
}

/// config_test.go TestWildcardConfig and share_threshold.yaml: a prefix or middle wildcard
/// matches, an explicit value wins over it, and with share_threshold every matched value
/// draws from one bucket (without it, each value has its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_match_and_share_threshold_shares_one_bucket() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let yaml = "domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: own
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: own
    value: foobar
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: mid
    value: /api*v1
    rate_limit: {unit: minute, requests_per_unit: 4}
";
    let (_dir, _tollgate, addr) = serve_yaml(&redis, yaml);
    let mut client = grpc::client(addr).await;
    let remaining = |r: RateLimitResponse| r.statuses[0].limit_remaining;
    assert_eq!(
        remaining(one(&mut client, "d", &[("files", "files/a")]).await),
        2
    );
    assert_eq!(
        remaining(one(&mut client, "d", &[("files", "files/b")]).await),
        1
    );
    assert_eq!(
        remaining(one(&mut client, "d", &[("files", "files/c")]).await),
        0
    );
    let fourth = one(&mut client, "d", &[("files", "files/d")]).await;
    assert_eq!(fourth.overall_code, OVER_LIMIT);
    // Not shared: each value its own bucket.
    assert_eq!(
        remaining(one(&mut client, "d", &[("own", "foo1")]).await),
        2
    );
    assert_eq!(
        remaining(one(&mut client, "d", &[("own", "foo2")]).await),
        2
    );
    assert_eq!(
        remaining(one(&mut client, "d", &[("own", "foobar")]).await),
        6
    );
    assert_eq!(
        remaining(one(&mut client, "d", &[("mid", "/api/x/v1")]).await),
        3
    );
    let miss = one(&mut client, "d", &[("mid", "/api/x/v2")]).await;
    assert_eq!(miss.statuses[0].current_limit, None);
}

/// ratelimit_test.go TestReplaces (basic_config.yaml's "replaces"): a rule that replaces a
/// named rule switches it off in the requests where both apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaces_switches_the_named_rule_off() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let yaml = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, name: per-user}
  - key: premium
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces: [{name: per-user}]
";
    let (_dir, _tollgate, addr) = serve_yaml(&redis, yaml);
    let mut client = grpc::client(addr).await;
    let both = || {
        request(
            "d",
            vec![
                descriptor(&[("user", "u")]),
                descriptor(&[("premium", "u")]),
            ],
        )
    };
    for _ in 0..3 {
        let answer = ask(&mut client, both()).await;
        assert_eq!(answer.overall_code, OK);
        assert_eq!(answer.statuses[0].current_limit, None);
    }
    assert_eq!(
        one(&mut client, "d", &[("user", "u")]).await.overall_code,
        OK
    );
    assert_eq!(
        one(&mut client, "d", &[("user", "u")]).await.overall_code,
        OVER_LIMIT
    );
}

/// ratelimit_test.go TestServiceQuotaMode*: a quota-mode descriptor over its limit is
/// OVER_LIMIT, the request only when every quota-mode descriptor is; shadow_mode
/// (TestShadowMode) answers OK however far over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_denies_only_when_every_quota_is_over_and_shadow_never_denies() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let yaml = "domain: d
descriptors:
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let (_dir, _tollgate, addr) = serve_yaml(&redis, yaml);
    let mut client = grpc::client(addr).await;
    let quotas = || {
        request(
            "d",
            vec![descriptor(&[("q1", "a")]), descriptor(&[("q2", "a")])],
        )
    };
    assert_eq!(ask(&mut client, quotas()).await.overall_code, OK);
    let one_over = ask(&mut client, quotas()).await;
    assert_eq!(one_over.overall_code, OK);
    assert_eq!(one_over.statuses[0].code, OVER_LIMIT);
    assert_eq!(one_over.statuses[1].code, OK);
    let all_over = ask(&mut client, quotas()).await;
    assert_eq!(all_over.overall_code, OVER_LIMIT);
    assert_eq!(all_over.statuses[1].code, OVER_LIMIT);
    for _ in 0..3 {
        let watched = one(&mut client, "d", &[("watched", "w")]).await;
        assert_eq!(watched.overall_code, OK);
        assert_eq!(watched.statuses[0].code, OK);
    }
}

/// ratelimit_test.go TestServiceHitsAddend / per-descriptor hits_addend: a descriptor's own
/// addend wins (0 looks without charging), else the request's (0 counts as 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_per_descriptor_and_per_request() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_dir, _tollgate, addr) = serve_yaml(&redis, BASIC);
    let mut client = grpc::client(addr).await;
    let key = || descriptor(&[("key2", "value2"), ("subkey", "h")]);
    for _ in 0..3 {
        let look = ask(&mut client, request("d", vec![with_hits(key(), 0)])).await;
        assert_eq!(look.statuses[0].limit_remaining, 3);
    }
    let mut two = request("d", vec![key()]);
    two.hits_addend = 2;
    assert_eq!(ask(&mut client, two).await.statuses[0].limit_remaining, 1);
    let too_many = ask(&mut client, request("d", vec![with_hits(key(), 2)])).await;
    assert_eq!(too_many.overall_code, OVER_LIMIT);
    let last = ask(&mut client, request("d", vec![with_hits(key(), 1)])).await;
    assert_eq!(shown(&last), [(OK, 3, DAY, String::new(), 0)]);
    // Used up: a look is over, though the bucket refills a sliver every moment.
    let look = ask(&mut client, request("d", vec![with_hits(key(), 0)])).await;
    assert_eq!(look.overall_code, OVER_LIMIT);
}

/// ratelimit_test.go TestServiceWithDescriptorLimit: the limit Envoy sends in the descriptor
/// wins over the configuration, unnamed, in its own unit; an unknown domain has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_descriptors_own_limit_overrides_the_configuration() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_dir, _tollgate, addr) = serve_yaml(&redis, BASIC);
    let mut client = grpc::client(addr).await;
    let own = || {
        let mut d = descriptor(&[("key1", "value1")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 3,
            unit: MINUTE,
        });
        d
    };
    for left in [2, 1, 0] {
        let answer = ask(&mut client, request("d", vec![own()])).await;
        assert_eq!(shown(&answer), [(OK, 3, MINUTE, String::new(), left)]);
    }
    let over = ask(&mut client, request("d", vec![own()])).await;
    assert_eq!(over.overall_code, OVER_LIMIT);
    // The configured rule of the same descriptor was not charged.
    let configured = one(&mut client, "d", &[("key1", "value1")]).await;
    assert_eq!(configured.statuses[0].limit_remaining, 1);
}

/// The defect of the last round: in a denied request, the other descriptor reports what its
/// bucket holds (here 3 of 5), not its full burst, also once the deny cache knows the denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_reports_what_the_other_bucket_holds() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_dir, _tollgate, addr) = serve_yaml(&redis, BASIC);
    let mut client = grpc::client(addr).await;
    let tight = || descriptor(&[("key2", "value2"), ("subkey", "t")]);
    let loose = || descriptor(&[("key5", "loose")]);
    for _ in 0..3 {
        ask(&mut client, request("d", vec![tight()])).await;
    }
    ask(&mut client, request("d", vec![loose()])).await;
    ask(&mut client, request("d", vec![loose()])).await;
    for _ in 0..5 {
        let alone = ask(&mut client, request("d", vec![tight()])).await;
        assert_eq!(alone.overall_code, OVER_LIMIT);
        let both = ask(&mut client, request("d", vec![loose(), tight()])).await;
        assert_eq!(both.overall_code, OVER_LIMIT);
        assert_eq!(both.statuses[0].code, OK);
        // 5 a minute, 2 used: 3 left (4 if the test ran past a refill), never the burst.
        assert!(
            (3..5).contains(&both.statuses[0].limit_remaining),
            "{both:?}"
        );
    }
}

/// The one kept difference: envoyproxy/ratelimit's fixed window admits N at the end of one
/// window and N more at the start of the next; tollgate's bucket (N per second, burst N)
/// admits at most N plus what refills while the requests run, here across a second's edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_a_window_edge_the_bucket_admits_n_not_2n() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let yaml = "domain: d\ndescriptors:\n  - key: edge\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
    let (_dir, _tollgate, addr) = serve_yaml(&redis, yaml);
    let mut client = grpc::client(addr).await;
    // Start 100 ms before a second's edge, as a fixed window would reset there.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let to_edge = std::time::Duration::from_nanos(u64::from(1_000_000_000 - now.subsec_nanos()));
    tokio::time::sleep(to_edge + std::time::Duration::from_millis(900)).await;
    let started = std::time::Instant::now();
    let mut admitted = 0u32;
    for _ in 0..10 {
        if one(&mut client, "d", &[("edge", "e")]).await.overall_code == OK {
            admitted += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The bucket: 5, plus 5 per second of the run. A fixed window would have admitted 10.
    let bound = 5 + (5.0 * elapsed).ceil() as u32;
    assert!(admitted >= 5, "{admitted}");
    assert!(admitted <= bound, "{admitted} admitted in {elapsed} s");
}

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

/// As envoyproxy/ratelimit (config_impl.go GetLimit): a descriptor without entries, or with an
/// entry without a key, matches nothing and is OK. Negative hits (a refund) draw nothing,
/// where envoyproxy/ratelimit would charge them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_descriptors_match_nothing_and_negative_hits_draw_nothing() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_dir, _tollgate, addr) = serve_yaml(&redis, BASIC);
    let mut client = grpc::client(addr).await;
    let empty = ask(&mut client, request("d", vec![descriptor(&[])])).await;
    assert_eq!(shown(&empty), [(OK, 0, 0, String::new(), 0)]);
    let keyless = ask(&mut client, request("d", vec![descriptor(&[("", "v")])])).await;
    assert_eq!(keyless.overall_code, OK);
    let mut refund = descriptor(&[("key5", "r")]);
    refund.is_negative_hits = true;
    for _ in 0..10 {
        let answer = ask(&mut client, request("d", vec![refund.clone()])).await;
        assert_eq!(answer.overall_code, OK);
    }
    let charged = one(&mut client, "d", &[("key5", "r")]).await;
    assert_eq!(charged.statuses[0].limit_remaining, 4);
}

/// ratelimit_test.go TestServiceGlobalShadowMode (SHADOW_MODE): the request is OK, the
/// descriptor still OVER_LIMIT; TestServiceGlobalQuotaMode (QUOTA_MODE): every descriptor is a
/// quota, so one over among several under is OVER_LIMIT for itself only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_shadow_and_quota_modes() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_dir, _tollgate, addr) = serve_yaml_with(&redis, BASIC, "shadow_mode = true\n");
    let mut client = grpc::client(addr).await;
    let zero = one(&mut client, "d", &[("key4", "x")]).await;
    assert_eq!(zero.overall_code, OK);
    assert_eq!(zero.statuses[0].code, OVER_LIMIT);

    let redis = RedisServer::start();
    let (_dir, _tollgate, addr) = serve_yaml_with(&redis, BASIC, "quota_mode = true\n");
    let mut client = grpc::client(addr).await;
    let mixed = ask(
        &mut client,
        request(
            "d",
            vec![descriptor(&[("key4", "x")]), descriptor(&[("key5", "q")])],
        ),
    )
    .await;
    assert_eq!(mixed.overall_code, OK);
    assert_eq!(mixed.statuses[0].code, OVER_LIMIT);
    assert_eq!(mixed.statuses[1].limit_remaining, 4, "charged");
    let alone = one(&mut client, "d", &[("key4", "x")]).await;
    assert_eq!(alone.overall_code, OVER_LIMIT);
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
