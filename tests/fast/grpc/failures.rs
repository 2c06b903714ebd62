//! Several instances, malformed requests and a failing store: exact admissions, an error
//! status or `on_error`'s answer, never more.

use super::*;
use crate::support::pressed::pressed;

/// Three instances, 32 concurrent clients, one descriptor, 50/s with a burst of 20, for 5 s:
/// admitted within `burst + rate·t + 1`, and at least 98% of it over the time the clients
/// surely pressed on the bucket.
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
            // Each request's (sent, answered) instants.
            let mut spans = Vec::new();
            while Instant::now() < until {
                let sent = Instant::now();
                let answer = client
                    .should_rate_limit(request("load", vec![descriptor(&[("tenant", "t1")])]))
                    .await;
                spans.push((sent, Instant::now()));
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
            spans
        }));
    }
    let mut spans = Vec::new();
    for task in tasks {
        spans.extend(task.await.expect("client task"));
    }
    // The bucket refills from its first charge to its last, which Redis made somewhere
    // between the first request sent and the last answer received: at most that long. The
    // floor counts only the time the clients surely kept the bucket from filling up (a
    // machine that stalls a call for longer than the bucket takes to fill makes any bucket
    // drop refill): see `pressed`.
    let origin = spans.iter().map(|s| s.0).min().unwrap_or(started);
    let last = spans.iter().map(|s| s.1).max().unwrap_or(started);
    let elapsed = last.duration_since(origin).as_secs_f64();
    let to_secs = |at: Instant| at.duration_since(origin).as_secs_f64();
    let spans: Vec<(f64, f64)> = spans
        .into_iter()
        .map(|(sent, answered)| (to_secs(sent), to_secs(answered)))
        .collect();
    let surely = pressed(&spans, (BURST - 1.0) / RATE);
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
    assert!(
        admitted >= floor,
        "admitted {admitted} < {floor} ({surely:.2} s pressed)"
    );
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
