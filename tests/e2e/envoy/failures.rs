//! Envoy's ratelimit filter when things fail: timeouts, a dead Redis, a stopped or unhealthy
//! tollgate, failing closed.

use super::*;

/// Proves, with the shipped fail-open settings (`failure_mode_deny: false`, tollgate's
/// `on_error = "allow"`) and tollgate's store budget (2 s) raised above Envoy's `timeout`
/// (1 s in these tests):
/// - Redis stalled (CLIENT PAUSE): Envoy's timeout fires first and the request passes;
/// - Redis killed while tollgate runs: tollgate itself answers OK, without quota headers;
/// - tollgate stopped: Envoy cannot reach it and the request passes.
///
/// The application is reached each time and Envoy's stats say which path admitted.
#[test]
fn ratelimit_filter_fails_open_on_a_timeout_a_dead_redis_and_a_stopped_tollgate() {
    let mut rls = Rls::start(&[("timeout_ms = 50", "timeout_ms = 2000")], "");
    let envoy = rls.envoy(&[]);
    assert_eq!(from(&envoy, CLIENT_A, "GET", "/", &[]).status, 200);

    rls.redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let slow = from(&envoy, CLIENT_A, "GET", "/", &[]);
    rls.redis.cli(&["CLIENT", "UNPAUSE"]);
    assert_eq!(slow.status, 200, "{slow:?}");
    assert_eq!(slow.header("ratelimit"), None, "{slow:?}");
    assert_eq!(envoy.stat("cluster.app.ratelimit.failure_mode_allowed"), 1);

    rls.redis.kill();
    let no_redis = from(&envoy, CLIENT_A, "GET", "/", &[]);
    assert_eq!(no_redis.status, 200, "{no_redis:?}");
    assert_eq!(
        no_redis.header("ratelimit"),
        None,
        "on_error allow: no quota"
    );
    assert_eq!(
        envoy.stat("cluster.app.ratelimit.failure_mode_allowed"),
        1,
        "tollgate answered, not Envoy's failure mode"
    );

    rls.stop_tollgate();
    let down = from(&envoy, CLIENT_A, "GET", "/", &[]);
    assert_eq!(down.status, 200, "{down:?}");
    assert_eq!(envoy.stat("cluster.app.ratelimit.failure_mode_allowed"), 2);
    assert_eq!(rls.app.count(), 4, "every request reached the application");
}

/// Proves, with ratelimit.yaml switched to fail closed (`failure_mode_deny: true`) and to
/// Envoy's own draft quota headers (`enable_x_ratelimit_headers: DRAFT_VERSION_03`), and
/// tollgate sending only the IETF family (`[response] headers = ["ietf"]`) and denying on
/// store errors (`on_error = "deny"`):
/// - the client gets each X-RateLimit-* header once (Envoy's), and tollgate's RateLimit and
///   RateLimit-Policy, on allowed and denied responses;
/// - Redis stalled past Envoy's timeout: 500, the application not called;
/// - Redis killed while tollgate runs: tollgate's own denial (429, Retry-After: 1);
/// - tollgate stopped: 500.
#[test]
fn ratelimit_filter_fails_closed_and_envoys_draft_headers_are_not_duplicated() {
    let extra = "[response]\nheaders = [\"ietf\"]\n";
    let mut rls = Rls::start(
        &[
            ("timeout_ms = 50", "timeout_ms = 2000"),
            ("on_error   = \"allow\"", "on_error   = \"deny\""),
        ],
        extra,
    );
    let envoy = rls.envoy(&[
        ("failure_mode_deny: false", "failure_mode_deny: true"),
        (
            "enable_x_ratelimit_headers: \"OFF\"",
            "enable_x_ratelimit_headers: DRAFT_VERSION_03",
        ),
    ]);

    for remaining in (0..PER_IP).rev() {
        let allowed = from(&envoy, CLIENT_A, "GET", "/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert_no_duplicate_quota_headers(&allowed);
        assert_eq!(
            allowed.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str()),
            "{allowed:?}"
        );
        // Envoy's own header, from the descriptor status tollgate answered.
        assert!(
            allowed
                .header("x-ratelimit-limit")
                .unwrap_or_default()
                .contains("name=\"per-ip\""),
            "{allowed:?}"
        );
        assert!(allowed.header("ratelimit").is_some(), "{allowed:?}");
    }
    let denied = from(&envoy, CLIENT_A, "GET", "/", &[]);
    assert_denied_with_quota_headers(&denied, "per-ip");
    assert_no_duplicate_quota_headers(&denied);
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(rls.app.count(), PER_IP as usize);

    rls.redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let slow = from(&envoy, CLIENT_B, "GET", "/", &[]);
    rls.redis.cli(&["CLIENT", "UNPAUSE"]);
    assert_eq!(slow.status, 500, "{slow:?}");
    assert_eq!(envoy.stat("cluster.app.ratelimit.error"), 1);

    rls.redis.kill();
    let no_redis = from(&envoy, CLIENT_B, "GET", "/", &[]);
    // on_error = "deny"
    assert_denied(&no_redis, Some(1));

    rls.stop_tollgate();
    let down = from(&envoy, CLIENT_B, "GET", "/", &[]);
    assert_eq!(down.status, 500, "{down:?}");
    assert_eq!(rls.app.count(), PER_IP as usize, "nothing else reached it");
}

/// Proves, with tollgate denying on store errors (`on_error = "deny"`) behind the shipped
/// fail-open filter, its health check made faster (0.2 s instead of 5 s, to keep the test
/// short): once Redis is gone, tollgate's gRPC health turns NOT_SERVING and Envoy's health
/// check (which runs at all thanks to `no_traffic_interval`: Envoy counts the filter's calls
/// as no traffic) marks it unhealthy; with no healthy replica left Envoy still calls it (its
/// panic threshold), so tollgate's `on_error` keeps deciding (429, `Retry-After: 1`) and
/// `failure_mode_deny` is not involved. With Redis back, tollgate is healthy and decides again.
#[test]
fn ratelimit_filter_still_asks_an_unhealthy_tollgate_so_on_error_decides() {
    let mut rls = Rls::start(&[("on_error   = \"allow\"", "on_error   = \"deny\"")], "");
    let envoy = rls.envoy(&[(
        "interval: 5s\n          no_traffic_interval: 5s",
        "interval: 0.2s\n          no_traffic_interval: 0.2s",
    )]);
    assert_eq!(from(&envoy, CLIENT_A, "GET", "/", &[]).status, 200);
    let tollgate_health = |envoy: &Envoy| {
        envoy
            .admin_get("/clusters")
            .map(|(_, body)| body)
            .unwrap_or_default()
            .lines()
            .find(|line| line.starts_with("tollgate::") && line.contains("::health_flags::"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    assert!(tollgate_health(&envoy).ends_with("::healthy"));

    rls.redis.kill();
    let unhealthy = wait_until(Duration::from_secs(15), || {
        tollgate_health(&envoy).contains("failed_active_hc")
    });
    assert!(
        unhealthy,
        "never marked unhealthy: {}",
        tollgate_health(&envoy)
    );
    let denied = from(&envoy, CLIENT_A, "GET", "/", &[]);
    // on_error decides.
    assert_denied(&denied, Some(1));
    assert_eq!(envoy.stat("cluster.app.ratelimit.failure_mode_allowed"), 0);

    rls.redis.restart();
    let healthy = wait_until(Duration::from_secs(15), || {
        tollgate_health(&envoy).ends_with("::healthy")
    });
    assert!(healthy, "never healthy again: {}", tollgate_health(&envoy));
    let decided = wait_until(Duration::from_secs(10), || {
        from(&envoy, CLIENT_B, "GET", "/", &[])
            .header("ratelimit")
            .is_some()
    });
    assert!(decided, "tollgate never decided again: {}", envoy.log());
    assert_eq!(
        rls.app.count(),
        2,
        "only the decided requests reached the app"
    );
}
