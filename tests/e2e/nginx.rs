//! tollgate behind a real nginx running the shipped `config/nginx/tollgate.conf`: what the
//! client sees, what reaches the application, and what happens when tollgate is gone.

use std::net::Ipv4Addr;

use crate::support::proxies::backend::{send_from, Backend};
use crate::support::proxies::scenarios::{
    assert_api_key_limit, assert_client_ip_limit, assert_denied_with_quota_headers,
    assert_exact_across_two_proxies, assert_path_and_method_limit,
    assert_tier_header_is_set_by_the_proxy, shared_key_limit, tollgate_config, Stack,
    API_WRITES_BURST_1, PER_IP_BURST_2, PER_IP_BURST_3, PER_KEY_BURST_2, PLANS, TIERS,
};
use crate::support::proxies::Nginx;
use crate::support::{HttpClient, RedisServer, TempDir, Tollgate};

/// Every shipped nginx setup: the plain config, the Kubernetes sidecar, the ingress-nginx
/// snippets, with the body each gives a 429 (the sidecar's `return 429;` uses nginx's page).
type Start = fn(std::net::SocketAddr, std::net::SocketAddr) -> Nginx;
const SHIPPED: [(&str, Start, &str); 3] = [
    ("config/nginx", Nginx::start, "Too Many Requests\n"),
    ("k8s sidecar", Nginx::start_sidecar, "429 Too Many Requests"),
    (
        "ingress-nginx",
        Nginx::start_ingress_nginx,
        "Too Many Requests\n",
    ),
];

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

#[test]
fn denials_keep_the_clients_keep_alive_connection_and_log_no_error() {
    for (name, start, body) in SHIPPED {
        let stack = Stack::start("deny", PER_IP_BURST_3, start);
        // One TCP connection for all 20 requests: a proxy that closed it after a denial
        // would end the loop with an error at the next request.
        let mut client = HttpClient::connect(stack.addr()).expect("connect to nginx");
        let mut statuses = Vec::new();
        for i in 0..20 {
            let method = if i % 2 == 0 { "GET" } else { "POST" };
            let response = client
                .request(method, "/items", &[])
                .unwrap_or_else(|e| panic!("{name}: request {i} on the same connection: {e}"));
            assert_ne!(
                response.header("connection"),
                Some("close"),
                "{name}: {response:?}"
            );
            assert_eq!(
                response.header("x-tollgate-status"),
                None,
                "{name}: {response:?}"
            );
            if response.status != 200 {
                assert_denied_with_quota_headers(&response, "per-ip");
                assert!(response.body.contains(body), "{name}: {response:?}");
            }
            statuses.push(response.status);
        }
        let mut expected = vec![200; 3];
        expected.resize(20, 429);
        assert_eq!(statuses, expected, "{name}");
        assert_eq!(stack.backend.count(), 3, "{name}");
        let log = stack.proxy.error_log();
        assert!(
            !log.contains("auth request unexpected status"),
            "{name}: nginx logged the denials:\n{log}"
        );
    }
}

#[test]
fn a_403_from_an_nginx_access_rule_stays_a_403_and_is_not_taken_for_tollgates() {
    let stack = Stack::start("deny", PER_IP_BURST_2, |tollgate, backend| {
        Nginx::start_with(
            tollgate,
            backend,
            &[(
                "auth_request /_tollgate;",
                "deny 127.0.0.9;\n        auth_request /_tollgate;",
            )],
        )
    });
    let from = |last: u8| {
        send_from(
            Ipv4Addr::new(127, 0, 0, last),
            stack.addr(),
            "GET",
            "/",
            &[],
        )
        .expect("answered")
    };
    for _ in 0..3 {
        let refused = from(9);
        assert_eq!(refused.status, 403, "{refused:?}");
        assert_eq!(refused.header("ratelimit"), None, "{refused:?}");
    }
    assert_eq!(stack.backend.count(), 0, "neither admitted nor failed open");
    assert_eq!(from(2).status, 200, "others pass");
}

#[test]
fn an_older_tollgate_that_refuses_with_its_own_status_still_denies_through_nginx() {
    // Without the request for a 403, tollgate answers 429 and nginx makes it a 500: a denial
    // all the same (without the quota headers, which this fallback does not copy).
    let stack = Stack::start("deny", PER_IP_BURST_2, |tollgate, backend| {
        Nginx::start_with(
            tollgate,
            backend,
            &[("proxy_set_header X-Tollgate-Deny-Status 403;", "")],
        )
    });
    let statuses: Vec<u16> = (0..2).map(|_| stack.get("/", &[]).status).collect();
    assert_eq!(statuses, [200, 200]);
    let denied = stack.get("/", &[]);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(stack.backend.count(), 2);
}

#[test]
fn a_denied_head_request_gets_the_status_and_headers_without_a_body() {
    for (name, start, _) in SHIPPED {
        let stack = Stack::start("deny", PER_IP_BURST_2, start);
        let head = || send_from(Ipv4Addr::LOCALHOST, stack.addr(), "HEAD", "/", &[]);
        for _ in 0..2 {
            assert_eq!(head().expect("answered").status, 200, "{name}");
        }
        let denied = head().expect("answered");
        assert_denied_with_quota_headers(&denied, "per-ip");
        assert_eq!(denied.body, "", "{name}: {denied:?}");
        assert_eq!(stack.backend.count(), 2, "{name}");
    }
}
