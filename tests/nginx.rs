//! tollgate behind a real nginx running the shipped `config/nginx/tollgate.conf`: what the
//! client sees, what reaches the application, and what happens when tollgate is gone.

mod support;

use support::proxies::backend::Backend;
use support::proxies::scenarios::{
    assert_api_key_limit, assert_client_ip_limit, assert_denied_with_quota_headers,
    assert_exact_across_two_proxies, assert_path_and_method_limit,
    assert_tier_header_is_set_by_the_proxy, shared_key_limit, tollgate_config, Stack,
    API_WRITES_BURST_1, PER_IP_BURST_2, PER_IP_BURST_3, PER_KEY_BURST_2, PLANS, TIERS,
};
use support::proxies::Nginx;
use support::{RedisServer, TempDir, Tollgate};

fn nginx_stack(on_error: &str, limits: &str) -> Stack<Nginx> {
    Stack::start(on_error, limits, Nginx::start)
}

#[test]
fn allowed_requests_reach_the_app_with_quota_headers_and_denied_ones_get_a_real_429() {
    let stack = nginx_stack("deny", PER_IP_BURST_3);
    for remaining in [2, 1, 0] {
        let allowed = stack.get("/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert_eq!(allowed.body, "backend\n");
        let ratelimit = allowed.header("ratelimit").unwrap_or_default();
        assert!(
            ratelimit.starts_with(&format!("\"per-ip\";r={remaining};t=")),
            "{allowed:?}"
        );
        assert_eq!(
            allowed.header("ratelimit-policy"),
            Some("\"per-ip\";q=3;w=300")
        );
        assert_eq!(allowed.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(allowed.header("retry-after"), None);
    }
    let denied = stack.get("/", &[]);
    assert_denied_with_quota_headers(&denied, "per-ip");
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"per-ip\";q=3;w=300")
    );
    assert_eq!(
        stack.backend.count(),
        3,
        "the denied request never reached the app"
    );
}

#[test]
fn the_api_key_limit_works_through_nginx() {
    assert_api_key_limit(&nginx_stack("deny", PER_KEY_BURST_2));
}

#[test]
fn the_client_ip_limit_works_through_nginx_and_ignores_client_sent_forwarded_for() {
    assert_client_ip_limit(&nginx_stack("deny", PER_IP_BURST_2));
}

#[test]
fn a_method_and_path_matched_limit_works_through_nginx() {
    assert_path_and_method_limit(&nginx_stack("deny", API_WRITES_BURST_1));
}

#[test]
fn nginx_fails_open_when_tollgate_is_unreachable() {
    let mut stack = nginx_stack("deny", PER_IP_BURST_2);
    let statuses: Vec<u16> = (0..3).map(|_| stack.get("/", &[]).status).collect();
    assert_eq!(statuses, [200, 200, 429], "limited while tollgate runs");
    stack.stop_tollgate();
    for _ in 0..5 {
        let response = stack.get("/", &[]);
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(response.body, "backend\n");
        assert_eq!(response.header("ratelimit"), None, "no quota is known");
    }
    assert_eq!(stack.backend.count(), 2 + 5);
}

#[test]
fn nginx_checks_again_with_the_first_request_after_tollgate_returns() {
    let mut stack = nginx_stack("deny", PER_IP_BURST_2);
    let statuses: Vec<u16> = (0..3).map(|_| stack.get("/", &[]).status).collect();
    assert_eq!(statuses, [200, 200, 429]);
    stack.stop_tollgate();
    assert_eq!(stack.get("/", &[]).status, 200, "failed open");
    stack.restart_tollgate();
    // The bucket in Redis is still empty, and nginx did not mark tollgate down for a while.
    assert_denied_with_quota_headers(&stack.get("/", &[]), "per-ip");
    assert_eq!(stack.backend.count(), 3);
}

#[test]
fn a_fail_closed_tollgate_decision_reaches_the_client_as_503() {
    let mut stack = nginx_stack("deny", PER_IP_BURST_2);
    assert_eq!(stack.get("/", &[]).status, 200);
    stack.redis.kill();
    let response = stack.get("/", &[]);
    assert_eq!(response.status, 503, "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"));
    assert_eq!(stack.backend.count(), 1);
}

#[test]
fn two_nginx_instances_sharing_one_redis_admit_exactly_the_burst() {
    let burst = 15;
    let redis = RedisServer::start();
    let config = tollgate_config(&redis, "deny", &shared_key_limit(burst));
    let (tollgate_a, tollgate_b) = (Tollgate::start(&config), Tollgate::start(&config));
    let backend = Backend::start();
    let nginx_a = Nginx::start(tollgate_a.addr, backend.addr);
    let nginx_b = Nginx::start(tollgate_b.addr, backend.addr);
    assert_exact_across_two_proxies([nginx_a.addr, nginx_b.addr], &backend, burst);
}

#[test]
fn the_plan_comes_from_nginxs_map_and_a_client_sent_x_plan_is_overwritten() {
    let plans = TempDir::new("nginx-plans");
    let lines: String = PLANS
        .iter()
        .map(|(key, plan)| format!("\"{key}\" \"{plan}\";\n"))
        .collect();
    plans.write("customers.map", &lines);
    let include = format!("include {}/*.map;", plans.path().display());
    let stack = Stack::start("deny", TIERS, |tollgate, backend| {
        Nginx::start_with(
            tollgate,
            backend,
            &[("include /etc/nginx/tollgate-plans/*.map;", &include)],
        )
    });
    assert_tier_header_is_set_by_the_proxy(&stack);
}
