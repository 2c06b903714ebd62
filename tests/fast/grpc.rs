//! Envoy's rate limit service through a tonic client, against the real binary and a real
//! Redis: decisions and answers, all-or-nothing across descriptors, exactness across
//! instances, malformed requests, a dead Redis, health and drain.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::grpc::{self, ask, descriptor, header, request, OK, OVER_LIMIT};
use crate::support::limit;
use crate::support::{redis_config, RedisServer};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::Code;

/// One test at a time: several start three processes each, and the timing promises are about
/// tollgate, not about these tests competing for two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A per-user limit and a per-path limit that barely refills.
const TWO_LIMITS: &str = r#"
[response]
headers = ["ietf", "x-ratelimit"]

[[limits]]
name = "per-user"
rate = 0.001
burst = 5
key = ["descriptor:user"]
[limits.match]
domains = ["edge"]

[[limits]]
name = "per-path"
rate = 0.001
burst = 1
key = ["descriptor:path"]
[limits.match]
domains = ["edge"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_is_decided_with_its_numbers_and_headers() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", TWO_LIMITS));
    let mut client = grpc::client(addr).await;
    let user = || request("edge", vec![descriptor(&[("user", "alice")])]);
    // Descriptor limits never apply to /check.
    let http = tollgate.check(&[]);
    assert_eq!(http.status, 200);
    assert_eq!(http.header("ratelimit"), None);

    for remaining in (0..5).rev() {
        let answer = ask(&mut client, user()).await;
        assert_eq!(answer.overall_code, OK);
        let status = &answer.statuses[0];
        assert_eq!(status.code, OK);
        assert_eq!(status.limit_remaining, remaining);
        let limit = status.current_limit.as_ref().expect("current_limit");
        assert_eq!(limit.name, "per-user");
        assert!(status.duration_until_reset.is_some());
        assert_eq!(header(&answer, "x-ratelimit-limit"), Some("5"));
        assert_eq!(
            header(&answer, "x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        assert!(header(&answer, "ratelimit-policy").is_some());
        assert_eq!(header(&answer, "retry-after"), None);
    }
    let denied = ask(&mut client, user()).await;
    assert_eq!(denied.overall_code, OVER_LIMIT);
    assert_eq!(denied.statuses[0].code, OVER_LIMIT);
    let retry: u64 = header(&denied, "retry-after")
        .expect("Retry-After on OVER_LIMIT")
        .parse()
        .unwrap();
    assert!(
        retry >= 900,
        "1 token at 0.001/s is ~1000 s away, got {retry}"
    );

    // Another domain, or a descriptor with other keys: no limit applies.
    let other = ask(
        &mut client,
        request("other", vec![descriptor(&[("user", "alice")])]),
    )
    .await;
    assert_eq!(other.overall_code, OK);
    assert!(other.statuses[0].current_limit.is_none());
    let extra = descriptor(&[("user", "alice"), ("plan", "gold")]);
    assert_eq!(
        ask(&mut client, request("edge", vec![extra]))
            .await
            .overall_code,
        OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_exhausted_descriptor_charges_nothing_on_the_other() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", TWO_LIMITS));
    let mut client = grpc::client(addr).await;
    let path = || descriptor(&[("path", "/login")]);
    let user = || descriptor(&[("user", "bob")]);

    assert_eq!(
        ask(&mut client, request("edge", vec![path()]))
            .await
            .overall_code,
        OK
    );
    for _ in 0..10 {
        let both = ask(&mut client, request("edge", vec![user(), path()])).await;
        assert_eq!(both.overall_code, OVER_LIMIT);
        assert_eq!(both.statuses[0].code, OK, "the user had tokens");
        assert_eq!(both.statuses[1].code, OVER_LIMIT);
    }
    // Had any of the ten denied requests charged the user, fewer than 4 would be left now.
    let alone = ask(&mut client, request("edge", vec![user()])).await;
    assert_eq!(alone.overall_code, OK);
    assert_eq!(alone.statuses[0].limit_remaining, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_is_the_cost_and_repeated_descriptors_add_up() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (_tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", TWO_LIMITS));
    let mut client = grpc::client(addr).await;

    let mut heavy = request("edge", vec![descriptor(&[("user", "carol")])]);
    heavy.hits_addend = 3;
    assert_eq!(ask(&mut client, heavy).await.statuses[0].limit_remaining, 2);
    // The descriptor's own addend wins over the request's, 0 included: a look, as Envoy asks
    // before a response whose charge it sends once the stream is done.
    let look = || {
        let mut own = descriptor(&[("user", "carol")]);
        own.hits_addend = Some(UInt64Value { value: 0 });
        let mut request = request("edge", vec![own]);
        request.hits_addend = 4;
        request
    };
    let looked = ask(&mut client, look()).await;
    assert_eq!(looked.overall_code, OK);
    assert_eq!(looked.statuses[0].limit_remaining, 2, "nothing charged");
    // The same descriptor twice draws twice from one bucket.
    let twice = request(
        "edge",
        vec![
            descriptor(&[("user", "carol")]),
            descriptor(&[("user", "carol")]),
        ],
    );
    assert_eq!(ask(&mut client, twice).await.statuses[0].limit_remaining, 0);
    // Used up: a look is over, though the bucket refills a sliver every moment.
    assert_eq!(ask(&mut client, look()).await.overall_code, OVER_LIMIT);
    let once = request("edge", vec![descriptor(&[("user", "carol")])]);
    assert_eq!(ask(&mut client, once).await.overall_code, OVER_LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_limits_report_but_never_deny() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let limits = r#"
[[limits]]
name = "soft"
rate = 0.001
burst = 1
key = ["descriptor:user"]
shadow = true
"#;
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", limits));
    let mut client = grpc::client(addr).await;
    for _ in 0..3 {
        let answer = ask(
            &mut client,
            request("any", vec![descriptor(&[("user", "dan")])]),
        )
        .await;
        assert_eq!(answer.overall_code, OK);
        assert_eq!(answer.statuses[0].code, OK);
    }
    assert_eq!(
        tollgate.metric(r#"tollgate_limit_decisions_total{decision="shadow_denied",limit="soft"}"#),
        2.0
    );
    assert_eq!(
        tollgate.metric(r#"tollgate_grpc_requests_total{code="ok"}"#),
        3.0
    );
}

/// Three instances, 32 concurrent clients, one descriptor, 50/s with a burst of 20, for 5 s:
/// admitted within `burst + rate·t + 1` and at least 98% of it (`t` measured as below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_admit_exactly_the_bucket() {
    let _serial = ONE_AT_A_TIME.lock().await;
    const RATE: f64 = 50.0;
    const BURST: f64 = 20.0;
    let redis = RedisServer::start();
    let limits = format!(
        "[[limits]]\nname = \"shared\"\nrate = {RATE}\nburst = {BURST}\nkey = [\"descriptor:tenant\"]\n"
    );
    let config = redis_config(&redis, "", &limits);
    let instances: Vec<_> = (0..3).map(|_| grpc::tollgate(&config)).collect();
    let admitted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs(5);
    let mut tasks = Vec::new();
    for i in 0..32 {
        let addr = instances[i % 3].1;
        let (admitted, errors) = (admitted.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = grpc::client(addr).await;
            // When the first request went and came back, when the last one did.
            let (mut first, mut last) = (None, (Instant::now(), Instant::now()));
            while Instant::now() < until {
                let sent = Instant::now();
                let answer = client
                    .should_rate_limit(request("load", vec![descriptor(&[("tenant", "t1")])]))
                    .await;
                last = (sent, Instant::now());
                first.get_or_insert(last);
                match answer.map(|a| a.into_inner()) {
                    Ok(a) if a.overall_code == OK && !a.response_headers_to_add.is_empty() => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(a) if a.overall_code == OVER_LIMIT => {}
                    // An OK without headers is on_error's answer, not the bucket's.
                    other => {
                        eprintln!("not decided by the bucket: {other:?}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            (first.unwrap_or(last), last)
        }));
    }
    // The bucket refills from its first charge to its last, which Redis made somewhere
    // between the first request sent and the last answer received: at most that long. And
    // at least from the first answer received to the last request sent, with requests queued
    // all along: what a loaded machine adds to each round trip is not time the bucket could
    // have admitted in, and only the upper bound may count it.
    let (mut outer, mut inner) = ((until, started), (until, started));
    for task in tasks {
        let (first, last) = task.await.expect("client task");
        outer = (outer.0.min(first.0), outer.1.max(last.1));
        inner = (inner.0.min(first.1), inner.1.max(last.0));
    }
    let elapsed = outer.1.duration_since(outer.0).as_secs_f64();
    let surely = inner.1.saturating_duration_since(inner.0).as_secs_f64();
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let bound = BURST + RATE * elapsed + 1.0;
    let floor = 0.98 * (BURST + RATE * surely + 1.0);
    println!("admitted {admitted} in {surely:.2} to {elapsed:.2} s; {floor:.1} to {bound:.1}");
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "every answer came from the bucket"
    );
    assert!(admitted <= bound, "admitted {admitted} > {bound}");
    assert!(admitted >= floor, "admitted {admitted} < {floor}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_an_error_status_or_a_decision_and_keys_stay_bounded() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", TWO_LIMITS));
    let mut client = grpc::client(addr).await;
    let refused = |result: Result<tonic::Response<_>, tonic::Status>| match result {
        Err(status) => status.code(),
        Ok(_) => Code::Ok,
    };

    let none = client.should_rate_limit(request("edge", vec![])).await;
    assert_eq!(refused(none), Code::InvalidArgument);
    let empty = client
        .should_rate_limit(request("edge", vec![descriptor(&[])]))
        .await;
    assert_eq!(refused(empty), Code::InvalidArgument);
    let no_domain = client
        .should_rate_limit(request("", vec![descriptor(&[("user", "x")])]))
        .await;
    assert_eq!(refused(no_domain), Code::InvalidArgument);
    let keyless = client
        .should_rate_limit(request("edge", vec![descriptor(&[("", "x")])]))
        .await;
    assert_eq!(refused(keyless), Code::InvalidArgument);
    let many: Vec<_> = (0..10_000)
        .map(|i| descriptor(&[("user", &format!("u{i}"))]))
        .collect();
    let flood = client.should_rate_limit(request("edge", many)).await;
    assert_eq!(refused(flood), Code::InvalidArgument);
    // Past the 4 MiB message limit: refused by the transport, the server lives on.
    let giant = "g".repeat(5 << 20);
    let too_big = client
        .should_rate_limit(request("edge", vec![descriptor(&[("user", &giant)])]))
        .await;
    assert_ne!(refused(too_big), Code::Ok);

    // Huge, binary and separator-laden values are decided, and keyed by a bounded hash.
    let mut client = grpc::client(addr).await;
    let huge = "h".repeat(1 << 20);
    for value in [huge.as_str(), "\u{0}\u{7f}ÿ", "a|b}{c%", "x"] {
        let answer = ask(
            &mut client,
            request("edge", vec![descriptor(&[("user", value)])]),
        )
        .await;
        assert_eq!(answer.overall_code, OK);
        assert_eq!(answer.statuses[0].limit_remaining, 4);
    }
    let keys = redis.cli(&["--scan"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 4, "one bucket per distinct value: {keys:?}");
    assert!(keys.iter().all(|k| k.len() <= 64), "{keys:?}");
    assert!(tollgate.metric(r#"tollgate_grpc_requests_total{code="invalid"}"#) >= 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_answers_per_on_error_within_the_timeout() {
    let _serial = ONE_AT_A_TIME.lock().await;
    const TIMEOUT_MS: u64 = 50;
    let mut redis = RedisServer::start();
    let limits = &limit("u", 10, 10, &["descriptor:user"]);
    let store = |mode: &str| {
        format!("timeout_ms = {TIMEOUT_MS}\non_error = \"{mode}\"\ndeny_cache = false\n")
    };
    let (allow_tollgate, allow_addr) =
        grpc::tollgate(&redis_config(&redis, &store("allow"), limits));
    let (deny_tollgate, deny_addr) = grpc::tollgate(&redis_config(&redis, &store("deny"), limits));
    let mut allow = grpc::client(allow_addr).await;
    let mut deny = grpc::client(deny_addr).await;
    let ask_one = || request("edge", vec![descriptor(&[("user", "eve")])]);
    // Both decide by the bucket while Redis lives. A starved machine may take longer than
    // the 50 ms budget over a call (then `deny` answers OVER_LIMIT): ask until one is in time.
    for client in [&mut allow, &mut deny] {
        let mut decided = false;
        for _ in 0..50 {
            let answer = ask(client, ask_one()).await;
            if answer.overall_code == OK && !answer.response_headers_to_add.is_empty() {
                decided = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(decided, "never decided by the bucket while Redis lived");
    }

    // The promise is tollgate's: measured by itself (`tollgate_grpc_duration_seconds`), from
    // the request received to the answer, not by this client, whose side of the round trip a
    // loaded machine may stretch at will. A call cut at the deadline is answered a moment
    // after it: in the histogram's next bucket, 100 ms.
    let in_time = |tollgate: &crate::support::Tollgate| {
        (
            tollgate.metric(r#"tollgate_grpc_duration_seconds_bucket{le="0.1"}"#),
            tollgate.metric("tollgate_grpc_duration_seconds_count"),
        )
    };
    let before = [in_time(&allow_tollgate), in_time(&deny_tollgate)];
    redis.kill();
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = Instant::now();
        let open = ask(&mut allow, ask_one()).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(open.overall_code, OK);
        assert!(open.response_headers_to_add.is_empty(), "no quota headers");
        let started = Instant::now();
        let closed = ask(&mut deny, ask_one()).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(closed.overall_code, OVER_LIMIT);
        assert_eq!(header(&closed, "retry-after"), Some("1"));
    }
    println!("slowest answer with Redis dead, as this client saw it: {slowest:?}");
    let after = [in_time(&allow_tollgate), in_time(&deny_tollgate)];
    for ((in_time_before, all_before), (in_time_after, all_after)) in before.into_iter().zip(after)
    {
        assert_eq!(all_after - all_before, 20.0, "answers counted");
        assert_eq!(
            in_time_after - in_time_before,
            20.0,
            "answers within 100 ms with a {TIMEOUT_MS} ms timeout"
        );
    }
}

type Health = tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>;

async fn health_client(addr: std::net::SocketAddr) -> Health {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect to the gRPC listener");
    Health::new(channel)
}

async fn health(client: &mut Health, service: &str) -> i32 {
    let request = tonic_health::pb::HealthCheckRequest {
        service: service.into(),
    };
    client
        .check(request)
        .await
        .expect("a health answer")
        .into_inner()
        .status
}

const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;
const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_follows_readiness() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start();
    let limits = &limit("u", 10, 10, &["descriptor:user"]);
    let store = |mode: &str| format!("timeout_ms = 50\non_error = \"{mode}\"\n");
    // Health is asked every `grpc_health_every` (1 s; here 100 ms).
    let short = [crate::support::SHORT_TIMINGS];
    let tollgate =
        |mode| grpc::tollgate_with_env(&redis_config(&redis, &store(mode), limits), &short);
    let (_deny, deny) = tollgate("deny");
    let (_allow, allow) = tollgate("allow");
    let (mut deny, mut allow) = (health_client(deny).await, health_client(allow).await);
    assert_eq!(health(&mut deny, "").await, SERVING);
    assert_eq!(health(&mut deny, RLS).await, SERVING);
    let poll = crate::support::short_timings().grpc_health_every / 5;

    redis.kill();
    let mut status = SERVING;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        status = health(&mut deny, RLS).await;
        if status == NOT_SERVING {
            break;
        }
        tokio::time::sleep(poll).await;
    }
    assert_eq!(
        status, NOT_SERVING,
        "on_error = deny cannot decide without Redis"
    );
    assert_eq!(health(&mut deny, "").await, NOT_SERVING);
    assert_eq!(
        health(&mut allow, RLS).await,
        SERVING,
        "allow still decides"
    );

    redis.restart();
    let mut status = NOT_SERVING;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        status = health(&mut deny, RLS).await;
        if status == SERVING {
            break;
        }
        tokio::time::sleep(poll).await;
    }
    assert_eq!(status, SERVING);
}

/// An RPC in flight when SIGTERM arrives is answered by Redis, health turns NOT_SERVING at
/// once, and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_rpcs_and_reports_not_serving() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let limits = &limit("u", 0.01, 10, &["descriptor:user"]);
    let (mut tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", limits));
    let mut client = grpc::client(addr).await;
    let mut checks = health_client(addr).await;
    let one = || request("edge", vec![descriptor(&[("user", "zed")])]);
    assert_eq!(ask(&mut client, one()).await.overall_code, OK);

    // Redis busy for 1 s: the next RPC waits for it, well within the 2 s store timeout.
    let port = redis.port;
    let sleeper =
        std::thread::spawn(move || crate::support::redis_cli(port, &["DEBUG", "SLEEP", "1"]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let in_flight = tokio::spawn(async move { ask(&mut client, one()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tollgate.signal("TERM");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(health(&mut checks, RLS).await, NOT_SERVING);

    let answer = in_flight.await.expect("in-flight RPC");
    assert_eq!(answer.overall_code, OK);
    assert_eq!(
        answer.statuses[0].limit_remaining, 8,
        "decided by Redis, not on_error"
    );
    let _ = sleeper.join();
    assert_eq!(tollgate.wait_exit(Duration::from_secs(12)), Some(0));
}

/// Where the envoy-types crate keeps Envoy's own .proto files.
#[cfg(feature = "e2e")]
fn envoy_proto_root() -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("metadata");
    let manifest = metadata["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|p| p["name"] == "envoy-types"))
        .and_then(|p| p["manifest_path"].as_str())
        .expect("envoy-types among the dependencies");
    std::path::Path::new(manifest)
        .with_file_name("proto")
        .to_path_buf()
}

/// The same service through Python's grpcio, with stubs generated by grpcio-tools from
/// Envoy's .proto files: decisions, numbers, headers, all-or-nothing and a refused request.
#[cfg(feature = "e2e")]
fn a_python_grpcio_client_gets_the_same_answers() {
    let _serial = ONE_AT_A_TIME.blocking_lock();
    let redis = RedisServer::start();
    let limits = &limit("per-user", 0.001, 3, &["descriptor:user"]);
    let (_tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", limits));
    let output = std::process::Command::new("python3")
        .arg(crate::support::deploy::repo_path(
            "tests/python/rls_client.py",
        ))
        .arg(envoy_proto_root())
        .arg(addr.to_string())
        .arg("burst")
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python client failed (grpcio and grpcio-tools are installed by scripts/test.sh): {stderr}"
    );
    let results: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let overall: Vec<&str> = (0..6)
        .map(|i| results[i]["overall"].as_str().unwrap())
        .collect();
    assert_eq!(
        overall,
        ["OK", "OK", "OK", "OVER_LIMIT", "OVER_LIMIT", "OK"]
    );
    assert_eq!(results[0]["statuses"][0]["remaining"], 2);
    assert_eq!(results[0]["statuses"][0]["limit"], "per-user");
    assert_eq!(results[0]["headers"]["x-ratelimit-limit"], "3");
    assert!(results[3]["headers"]["retry-after"].is_string());
    assert_eq!(results[4]["statuses"][0]["code"], "OK");
    assert_eq!(results[4]["statuses"][1]["code"], "OVER_LIMIT");
    // The denied pair charged nothing on "other".
    assert_eq!(results[5]["statuses"][0]["remaining"], 2);
    assert_eq!(results[6]["error"], "INVALID_ARGUMENT");
}

/// The descriptor entries one Envoy `rate_limits` entry produces for a request with an API key
/// that is a POST: each action gives one (key, value).
fn envoy_descriptor(actions: &serde_yaml::Value) -> Vec<(String, String)> {
    let text = |v: &serde_yaml::Value| v.as_str().unwrap_or_default().to_string();
    actions
        .as_sequence()
        .expect("actions")
        .iter()
        .map(|action| {
            if action.get("remote_address").is_some() {
                ("remote_address".into(), "192.0.2.7".into())
            } else if let Some(header) = action.get("request_headers") {
                (text(&header["descriptor_key"]), "key-123".into())
            } else if let Some(matched) = action.get("header_value_match") {
                (
                    text(&matched["descriptor_key"]),
                    text(&matched["descriptor_value"]),
                )
            } else {
                panic!("an action this test does not know: {action:?}")
            }
        })
        .collect()
}

/// The same for one of Contour's `descriptors` (its `entries`).
fn contour_descriptor(entries: &serde_yaml::Value) -> Vec<(String, String)> {
    let text = |v: &serde_yaml::Value| v.as_str().unwrap_or_default().to_string();
    entries
        .as_sequence()
        .expect("entries")
        .iter()
        .map(|entry| {
            if entry.get("remoteAddress").is_some() {
                ("remote_address".into(), "192.0.2.7".into())
            } else if let Some(header) = entry.get("requestHeader") {
                (text(&header["descriptorKey"]), "key-123".into())
            } else if let Some(generic) = entry.get("genericKey") {
                (text(&generic["key"]), text(&generic["value"]))
            } else {
                panic!("an entry this test does not know: {entry:?}")
            }
        })
        .collect()
}

fn shipped_yaml(relative: &str) -> Vec<serde_yaml::Value> {
    let text =
        std::fs::read_to_string(crate::support::deploy::repo_path(relative)).expect("shipped file");
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_yaml::Value::deserialize(document).expect("valid YAML"))
        .collect()
}

use serde::Deserialize as _;

/// The ratelimit filter of an Envoy filter list, checked for the fields tollgate relies on.
fn ratelimit_filter(filter: &serde_yaml::Value) -> (String, String) {
    assert_eq!(filter["name"], "envoy.filters.http.ratelimit");
    let config = &filter["typed_config"];
    assert_eq!(
        config["@type"],
        "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
    );
    assert_eq!(config["rate_limit_service"]["transport_api_version"], "V3");
    let cluster = config["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .expect("a gRPC cluster")
        .to_string();
    (
        config["domain"].as_str().expect("domain").to_string(),
        cluster,
    )
}

/// Every shipped Envoy, Istio and Contour example sends descriptors that tollgate-grpc.toml
/// limits, in the domain it names: asked of a real tollgate serving that file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_envoy_istio_and_contour_examples_reach_the_shipped_limits() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // (domain, descriptor, limit expected) gathered from the three files.
    let mut cases: Vec<(String, Vec<(String, String)>)> = Vec::new();

    let envoy = &shipped_yaml("config/envoy/ratelimit.yaml")[0];
    let manager = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    let filters = manager["http_filters"].as_sequence().unwrap();
    assert_eq!(filters.last().unwrap()["name"], "envoy.filters.http.router");
    let (domain, cluster) = ratelimit_filter(&filters[0]);
    let clusters = envoy["static_resources"]["clusters"].as_sequence().unwrap();
    let tollgate = clusters
        .iter()
        .find(|c| c["name"] == cluster.as_str())
        .unwrap();
    let http2 = &tollgate["typed_extension_protocol_options"]
        ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"];
    assert!(
        http2.get("http2_protocol_options").is_some(),
        "gRPC needs HTTP/2"
    );
    assert_eq!(
        tollgate["health_checks"][0]["grpc_health_check"]["service_name"],
        "envoy.service.ratelimit.v3.RateLimitService"
    );
    let endpoint = &tollgate["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        ["address"]["socket_address"];
    assert_eq!(endpoint["port_value"], 8081);
    for limits in manager["route_config"]["virtual_hosts"][0]["rate_limits"]
        .as_sequence()
        .unwrap()
    {
        cases.push((domain.clone(), envoy_descriptor(&limits["actions"])));
    }

    let istio = &shipped_yaml("config/envoy/istio-envoyfilter.yaml")[0];
    assert_eq!(istio["kind"], "EnvoyFilter");
    let patches = istio["spec"]["configPatches"].as_sequence().unwrap();
    assert_eq!(patches[0]["applyTo"], "HTTP_FILTER");
    assert_eq!(patches[0]["patch"]["operation"], "INSERT_BEFORE");
    let (domain, cluster) = ratelimit_filter(&patches[0]["patch"]["value"]);
    assert_eq!(
        cluster,
        "outbound|8081||tollgate.tollgate.svc.cluster.local"
    );
    assert_eq!(patches[1]["applyTo"], "VIRTUAL_HOST");
    for limits in patches[1]["patch"]["value"]["rate_limits"]
        .as_sequence()
        .unwrap()
    {
        cases.push((domain.clone(), envoy_descriptor(&limits["actions"])));
    }

    let contour = shipped_yaml("config/envoy/contour.yaml");
    assert_eq!(contour[0]["kind"], "ExtensionService");
    assert_eq!(contour[0]["spec"]["protocol"], "h2c");
    assert_eq!(contour[0]["spec"]["services"][0]["port"], 8081);
    assert_eq!(contour[1]["kind"], "HTTPProxy");
    let proxy = &contour[1]["spec"];
    let mut policies = vec![&proxy["virtualhost"]["rateLimitPolicy"]];
    policies.extend(
        proxy["routes"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|route| &route["rateLimitPolicy"])
            .filter(|policy| !policy.is_null()),
    );
    for policy in policies {
        for descriptor in policy["global"]["descriptors"].as_sequence().unwrap() {
            cases.push(("contour".into(), contour_descriptor(&descriptor["entries"])));
        }
    }
    assert_eq!(cases.len(), 8, "{cases:?}");

    let redis = RedisServer::start();
    let config = std::fs::read_to_string(crate::support::deploy::repo_path(
        "config/envoy/tollgate-grpc.toml",
    ))
    .unwrap();
    let (_tollgate, addr) =
        grpc::tollgate_with_env(&config, &[("TOLLGATE_STORE__URL", &redis.url())]);
    let mut client = grpc::client(addr).await;
    for (domain, entries) in &cases {
        let entries: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let answer = ask(&mut client, request(domain, vec![descriptor(&entries)])).await;
        assert_eq!(answer.overall_code, OK);
        let limit = answer.statuses[0].current_limit.as_ref();
        assert!(
            limit.is_some(),
            "no limit of tollgate-grpc.toml applies to {domain} {entries:?}"
        );
    }
}

/// An empty entry value is a missing key part: `on_missing` decides, as for `/check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_descriptor_value_is_a_missing_key_part() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let limits = r#"
[[limits]]
name = "strict"
rate = 1
burst = 5
key = ["descriptor:user"]
on_missing = "deny"
[limits.match]
domains = ["strict"]

[[limits]]
name = "lenient"
rate = 1
burst = 5
key = ["descriptor:user"]
[limits.match]
domains = ["lenient"]
"#;
    let (_tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", limits));
    let mut client = grpc::client(addr).await;
    let blank = || vec![descriptor(&[("user", "")]), descriptor(&[("user", "amy")])];
    let strict = ask(&mut client, request("strict", blank())).await;
    assert_eq!(strict.overall_code, OVER_LIMIT);
    assert_eq!(strict.statuses[0].code, OVER_LIMIT);
    assert_eq!(strict.statuses[1].code, OK);
    let lenient = ask(&mut client, request("lenient", blank())).await;
    assert_eq!(lenient.overall_code, OK);
    assert!(lenient.statuses[0].current_limit.is_none());
    assert_eq!(lenient.statuses[1].limit_remaining, 4);
    // The denial charged nothing: amy's strict bucket is still full.
    let amy = ask(
        &mut client,
        request("strict", vec![descriptor(&[("user", "amy")])]),
    )
    .await;
    assert_eq!(amy.statuses[0].limit_remaining, 4);
}

/// Second tier (`cargo test --features e2e`): Python with grpcio and grpcio-tools.
/// One module, so scripts/test.sh runs exactly these by the `e2e::` prefix.
#[cfg(feature = "e2e")]
mod e2e {
    #[test]
    fn a_python_grpcio_client_gets_the_same_answers() {
        super::a_python_grpcio_client_gets_the_same_answers();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_from_the_file_and_the_admin_api_apply_to_descriptors() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let limits = r#"
[[limits]]
name = "per-user"
rate = 0.001
burst = 2
key = ["descriptor:user"]
[limits.match]
domains = ["edge"]

[[limits.overrides]]
key = ["gold"]
burst = 4

[[limits.overrides]]
key = ["vip"]
unlimited = true
"#;
    // Top-level keys come before redis_config's [store] table.
    let config = format!(
        "admin_token = \"grpc-admin-token-0123456789\"\n{}",
        redis_config(&redis, "", limits)
    );
    let (tollgate, addr) = grpc::tollgate(&config);
    let mut client = grpc::client(addr).await;
    let user = |name: &str| request("edge", vec![descriptor(&[("user", name)])]);
    // Admitted in a row until denied, at most `cap` asks.
    async fn run_length(
        client: &mut grpc::Client,
        request: impl Fn() -> RateLimitRequest,
        cap: u32,
    ) -> u32 {
        let mut admitted = 0;
        while admitted < cap && ask(client, request()).await.overall_code == OK {
            admitted += 1;
        }
        admitted
    }
    assert_eq!(run_length(&mut client, || user("plain"), 10).await, 2);
    assert_eq!(run_length(&mut client, || user("gold"), 10).await, 4);
    assert_eq!(run_length(&mut client, || user("vip"), 10).await, 10);

    // A runtime override set through the admin API, as on /check.
    let answer = crate::support::http::admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/per-user?key=carol",
        Some("grpc-admin-token-0123456789"),
        r#"{"burst": 6}"#,
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(run_length(&mut client, || user("carol"), 10).await, 6);
}

/// Whether an answer is the bucket's: its descriptor shows the limit (`on_error`'s does not).
fn by_the_bucket(
    answer: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> bool {
    answer
        .statuses
        .first()
        .and_then(|s| s.current_limit.as_ref())
        .is_some()
}

/// Asks until an answer is the bucket's: a starved machine may take a first call past its
/// budget.
async fn until_decided(client: &mut grpc::Client, ask_one: impl Fn() -> RateLimitRequest) {
    for _ in 0..50 {
        if let Ok(answer) = client.should_rate_limit(ask_one()).await {
            if by_the_bucket(&answer.into_inner()) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never decided by the bucket while Redis lived");
}

/// `on_error = "error"` answers a store failure as envoyproxy/ratelimit answers a Redis
/// error: a gRPC error status (UNKNOWN, the error as its message), which Envoy's
/// `failure_mode_deny` decides on; `/check` answers it 503 with `Retry-After: 1`. Counted as
/// `result="error"` and `code="error"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_is_an_error_status_under_on_error_error() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start();
    let limits = limit("u", 10, 10, &["descriptor:user"]) + limit("h", 10, 10, &["header:x-user"]);
    let config = redis_config(&redis, "on_error = \"error\"\ndeny_cache = false", &limits);
    let (tollgate, addr) = grpc::tollgate(&config);
    let mut client = grpc::client(addr).await;
    let ask_one = || request("edge", vec![descriptor(&[("user", "eve")])]);
    until_decided(&mut client, ask_one).await;

    redis.kill();
    for _ in 0..5 {
        let status = client
            .should_rate_limit(ask_one())
            .await
            .expect_err("an error status");
        assert_eq!(status.code(), Code::Unknown, "{status:?}");
        assert!(status.message().contains("store"), "{status:?}");
        let check = tollgate.check(&[("x-user", "eve")]);
        assert_eq!(check.status, 503);
        assert_eq!(check.header("retry-after"), Some("1"));
    }
    assert_eq!(
        tollgate.metric(r#"tollgate_grpc_requests_total{code="error"}"#),
        5.0
    );
    assert_eq!(
        tollgate.metric(r#"tollgate_checks_total{result="error"}"#),
        10.0
    );
    assert_eq!(
        tollgate.metric(r#"tollgate_checks_total{result="error_allowed"}"#),
        0.0
    );
}

/// In envoyproxy/ratelimit's environment a store failure is the error it answers, by default:
/// gRPC UNKNOWN, and `/json` a 503 (it answers 400 to every error); its counter
/// `should_rate_limit.redis_error` counts it. `TOLLGATE_STORE__ON_ERROR` still chooses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_envoyproxy_ratelimits_environment_a_store_failure_is_an_error_status() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start();
    let dir = crate::support::TempDir::new("erl-on-error");
    let rules = dir.path().join("rl").join("config");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(
        rules.join("shop.yaml"),
        "domain: shop\ndescriptors:\n  - key: user\n    \
         rate_limit: {unit: minute, requests_per_unit: 100}\n",
    )
    .unwrap();
    let root = dir.path().display().to_string();
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let metrics = format!("127.0.0.1:{}", crate::support::free_port());
    let start = |more: &[(&str, &str)]| {
        let grpc_port = crate::support::free_port().to_string();
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
        let tollgate = crate::support::Tollgate::start_with_env("", &env);
        let addr: std::net::SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
        (tollgate, addr)
    };
    let (erl, erl_addr) = start(&[
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", metrics.as_str()),
    ]);
    let (allowing, allowing_addr) = start(&[("TOLLGATE_STORE__ON_ERROR", "allow")]);
    let ask_one = || request("shop", vec![descriptor(&[("user", "eve")])]);
    let mut client = grpc::client(erl_addr).await;
    let mut allowing_client = grpc::client(allowing_addr).await;
    until_decided(&mut client, ask_one).await;
    until_decided(&mut allowing_client, ask_one).await;

    redis.kill();
    let status = client
        .should_rate_limit(ask_one())
        .await
        .expect_err("an error status, as envoyproxy/ratelimit answers");
    assert_eq!(status.code(), Code::Unknown, "{status:?}");
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"eve"}]}]}"#;
    let raw = format!(
        "POST /json HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let json = erl.client().send_raw(raw.as_bytes()).unwrap();
    assert_eq!(json.status, 503, "{}", json.body);
    let exposition = crate::support::HttpClient::connect(metrics.parse().unwrap())
        .and_then(|mut c| c.get("/metrics", &[]))
        .unwrap()
        .body;
    assert_eq!(
        crate::support::metric_value(
            &exposition,
            r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#
        ),
        2.0,
        "{exposition}"
    );
    // Told otherwise, it admits.
    let admitted = ask(&mut allowing_client, ask_one()).await;
    assert_eq!(admitted.overall_code, OK);
    assert!(!by_the_bucket(&admitted), "on_error's answer");
    drop(allowing);
}
