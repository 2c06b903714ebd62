//! `ShouldRateLimit` decisions: numbers and headers per descriptor, costs, shadow limits,
//! empty values and overrides.

use super::*;

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
