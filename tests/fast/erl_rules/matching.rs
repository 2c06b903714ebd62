//! Which rule decides: the most specific, unlimited and zero, wildcards and shared
//! thresholds, `replaces`, quota and shadow modes, hits, the descriptor's own limit.

use super::*;

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
