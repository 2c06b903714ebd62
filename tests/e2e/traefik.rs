//! tollgate behind a real Traefik v3 running the shipped `config/traefik/` files (static and
//! file-provider dynamic config): what the client sees, what reaches the application.

use crate::support::proxies::backend::Backend;
use crate::support::proxies::scenarios::{
    assert_api_key_limit, assert_client_ip_limit, assert_denied_with_quota_headers,
    assert_exact_across_two_proxies, assert_path_and_method_limit,
    assert_tier_header_is_set_by_the_proxy, shared_key_limit, tollgate_config, Stack,
    API_WRITES_BURST_1, PER_IP_BURST_2, PER_IP_BURST_3, PER_KEY_BURST_2, PLANS, TIERS,
};
use crate::support::proxies::Traefik;
use crate::support::{RedisServer, Tollgate};

fn traefik_stack(on_error: &str, limits: &str) -> Stack<Traefik> {
    Stack::start(on_error, limits, Traefik::start)
}

#[test]
fn allowed_requests_reach_the_app_with_quota_headers_and_denied_ones_get_tollgates_429() {
    let stack = traefik_stack("deny", PER_IP_BURST_3);
    for _ in 0..3 {
        let allowed = stack.get("/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert_eq!(allowed.body, "backend\n");
        // Traefik copies authResponseHeaders onto the upstream request only (documented limit).
        assert_eq!(allowed.header("ratelimit"), None);
    }
    let seen = stack.backend.seen();
    let remaining: Vec<Option<&str>> = seen
        .iter()
        .map(|s| s.header("x-ratelimit-remaining"))
        .collect();
    assert_eq!(
        remaining,
        [Some("2"), Some("1"), Some("0")],
        "the app sees the quota"
    );
    assert_eq!(
        seen[0].header("ratelimit-policy"),
        Some("\"per-ip\";q=3;w=300")
    );

    let denied = stack.get("/", &[]);
    assert_denied_with_quota_headers(&denied, "per-ip");
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"per-ip\";q=3;w=300")
    );
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        denied.body.contains("rate limit exceeded (per-ip)"),
        "{denied:?}"
    );
    assert_eq!(
        stack.backend.count(),
        3,
        "the denied request never reached the app"
    );
}

#[test]
fn the_api_key_limit_works_through_traefik() {
    assert_api_key_limit(&traefik_stack("deny", PER_KEY_BURST_2));
}

#[test]
fn the_client_ip_limit_works_through_traefik_and_ignores_client_sent_forwarded_for() {
    assert_client_ip_limit(&traefik_stack("deny", PER_IP_BURST_2));
}

#[test]
fn a_method_and_path_matched_limit_works_through_traefik() {
    assert_path_and_method_limit(&traefik_stack("deny", API_WRITES_BURST_1));
}

#[test]
fn traefik_answers_500_and_calls_nothing_when_tollgate_is_unreachable() {
    // Traefik's ForwardAuth has no fail-open; the docs say so, this keeps them honest.
    let mut stack = traefik_stack("deny", PER_IP_BURST_2);
    assert_eq!(stack.get("/", &[]).status, 200);
    stack.stop_tollgate();
    assert_eq!(stack.get("/", &[]).status, 500);
    assert_eq!(stack.backend.count(), 1);
}

#[test]
fn a_fail_closed_tollgate_decision_reaches_the_client_through_traefik() {
    let mut stack = traefik_stack("deny", PER_IP_BURST_2);
    assert_eq!(stack.get("/", &[]).status, 200);
    stack.redis.kill();
    let response = stack.get("/", &[]);
    assert_eq!(response.status, 503, "{response:?}");
    assert_eq!(response.header("retry-after"), Some("1"));
    assert_eq!(stack.backend.count(), 1);
}

#[test]
fn two_traefik_instances_sharing_one_redis_admit_exactly_the_burst() {
    let burst = 15;
    let redis = RedisServer::start();
    let config = tollgate_config(&redis, "deny", &shared_key_limit(burst));
    let (tollgate_a, tollgate_b) = (Tollgate::start(&config), Tollgate::start(&config));
    let backend = Backend::start();
    let traefik_a = Traefik::start(tollgate_a.addr, backend.addr);
    let traefik_b = Traefik::start(tollgate_b.addr, backend.addr);
    // Traefik's readiness probes used no API key, so the shared bucket is still full.
    backend.forget();
    assert_exact_across_two_proxies([traefik_a.addr, traefik_b.addr], &backend, burst);
}

#[test]
fn the_plan_comes_from_the_auth_service_and_a_client_sent_x_plan_is_removed() {
    let plan_service = Backend::plan_service(PLANS);
    let address = format!("http://{}/plan", plan_service.addr);
    let stack = Stack::start("deny", TIERS, |tollgate, backend| {
        Traefik::start_dynamic(
            "config/traefik/dynamic-tiers.yml",
            tollgate,
            backend,
            &[("http://127.0.0.1:4000/plan", &address)],
        )
    });
    assert_tier_header_is_set_by_the_proxy(&stack);
    let asked = plan_service.seen();
    assert!(
        asked.iter().all(|seen| seen.header("x-plan").is_none()),
        "the client's X-Plan was removed before the auth service saw the request"
    );
}
