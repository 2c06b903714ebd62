//! `/check` over real HTTP against the real binary: every header on allow and deny, each key
//! source, match rules, `on_missing`, `shadow`, costs, and the other endpoints.
//! Most tests use the memory store (no Redis needed); the last ones repeat the core decisions
//! against a real `redis-server`.

use crate::support::limit;
use crate::support::{
    assert_denied, assert_header, assert_ietf, assert_x_ratelimit, redis_config, HttpClient,
    RedisServer, Response, Tollgate,
};

const API_KEY_LIMIT: &str = r#"
[[limits]]
name = "per-key"
rate = 1
burst = 3
key = ["header:x-api-key"]
"#;

fn drain(tollgate: &Tollgate, headers: &[(&str, &str)], times: usize) -> Vec<Response> {
    let mut client = tollgate.client();
    (0..times)
        .map(|_| client.get("/check", headers).expect("answer"))
        .collect()
}

fn statuses(responses: &[Response]) -> Vec<u16> {
    responses.iter().map(|r| r.status).collect()
}

#[test]
fn an_allowed_check_is_an_empty_200_with_both_header_families() {
    let tollgate = Tollgate::in_process(API_KEY_LIMIT);
    let response = tollgate.check(&[("x-api-key", "k1")]);
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-length"), Some("0"));
    assert_eq!(response.body, "");
    assert_ietf(&response, "\"per-key\";q=3;w=3", "\"per-key\";r=2;t=1");
    assert_x_ratelimit(&response, 3, 2, 1);
    assert_header(&response, "retry-after", None);
}

#[test]
fn a_denied_check_is_a_429_with_retry_after_and_a_problem_body() {
    let tollgate = Tollgate::in_process(API_KEY_LIMIT);
    let responses = drain(&tollgate, &[("x-api-key", "k1")], 4);
    assert_eq!(statuses(&responses), [200, 200, 200, 429]);
    let denied = &responses[3];
    assert_denied(denied, Some(1));
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert_ietf(denied, "\"per-key\";q=3;w=3", "\"per-key\";r=0;t=3");
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(denied.header("x-ratelimit-limit"), Some("3"));
    let body: serde_json::Value = serde_json::from_str(&denied.body).expect("json body");
    assert_eq!(body["status"], 429);
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["violated-policies"], serde_json::json!(["per-key"]));
    assert_eq!(body["limits"], body["violated-policies"], "deprecated name");
    assert_eq!(body["retry_after"], 1);
}

#[test]
fn header_families_follow_the_config() {
    let ietf_only = Tollgate::in_process(&format!(
        "[response]\nheaders = [\"ietf\"]\n{API_KEY_LIMIT}"
    ));
    let r = ietf_only.check(&[("x-api-key", "k")]);
    assert!(r.header("ratelimit").is_some());
    assert!(r.header("x-ratelimit-limit").is_none());

    let x_only = Tollgate::in_process(&format!(
        "[response]\nheaders = [\"x-ratelimit\"]\n{API_KEY_LIMIT}"
    ));
    let r = x_only.check(&[("x-api-key", "k")]);
    assert!(r.header("ratelimit").is_none());
    assert!(r.header("ratelimit-policy").is_none());
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
}

#[test]
fn deny_status_is_configurable() {
    let tollgate = Tollgate::in_process(&format!("[response]\ndeny_status = 403\n{API_KEY_LIMIT}"));
    let responses = drain(&tollgate, &[("x-api-key", "k")], 4);
    assert_eq!(statuses(&responses), [200, 200, 200, 403]);
}

#[test]
fn a_caller_asking_for_403_gets_a_bodiless_403_with_the_same_headers_and_the_real_status() {
    let tollgate = Tollgate::start(&format!("[response]\ndeny_status = 420\n{API_KEY_LIMIT}"));
    let ask = [("x-api-key", "k"), ("x-tollgate-deny-status", "403")];
    let responses = drain(&tollgate, &ask, 4);
    assert_eq!(statuses(&responses), [200, 200, 200, 403]);
    assert_eq!(
        responses[2].header("x-tollgate-status"),
        None,
        "{:?}",
        responses[2]
    );
    let denied = &responses[3];
    assert_eq!(denied.header("x-tollgate-status"), Some("420"));
    assert_eq!(denied.header("content-length"), Some("0"));
    assert_eq!(denied.body, "");
    let as_is = tollgate.check(&[("x-api-key", "k")]);
    assert_eq!(as_is.status, 420, "{as_is:?}");
    // The seconds may tick between the two answers; the rest must be the same.
    for name in ["retry-after", "ratelimit", "x-ratelimit-reset"] {
        assert!(denied.header(name).is_some(), "{name}: {denied:?}");
        assert!(as_is.header(name).is_some(), "{name}: {as_is:?}");
    }
    for name in [
        "ratelimit-policy",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
    ] {
        assert!(denied.header(name).is_some(), "{name}: {denied:?}");
        assert_eq!(denied.header(name), as_is.header(name), "{name}");
    }
}

#[test]
fn the_most_restrictive_limit_is_shown_and_every_limit_is_listed() {
    let tollgate = Tollgate::in_process(
        r#"
[[limits]]
name = "per-ip"
rate = 100
burst = 1000
key = ["ip"]
[[limits]]
name = "per-key"
rate = 1
burst = 2
key = ["header:x-api-key"]
"#,
    );
    let r = tollgate.check(&[("x-api-key", "k")]);
    assert_ietf(
        &r,
        "\"per-ip\";q=1000;w=10, \"per-key\";q=2;w=2",
        "\"per-key\";r=1;t=1",
    );
}

#[test]
fn client_ip_comes_from_a_trusted_forwarded_for_chain() {
    let tollgate = Tollgate::in_process(&limit("ip", 1, 1, &["ip"]));
    // The test client connects from 127.0.0.1, which the default trusted_proxies include.
    let a = drain(&tollgate, &[("x-forwarded-for", "198.51.100.1")], 2);
    let b = drain(
        &tollgate,
        &[("x-forwarded-for", "6.6.6.6, 198.51.100.2")],
        2,
    );
    assert_eq!(statuses(&a), [200, 429]);
    assert_eq!(statuses(&b), [200, 429], "each client has its own bucket");
    let v6 = drain(&tollgate, &[("x-forwarded-for", "2001:DB8::1")], 1);
    let v6_canonical = drain(&tollgate, &[("x-forwarded-for", "[2001:db8:0::1]:443")], 1);
    assert_eq!(statuses(&v6), [200]);
    assert_eq!(
        statuses(&v6_canonical),
        [429],
        "one IPv6 address, one bucket"
    );
}

#[test]
fn client_ip_from_x_real_ip_and_from_the_peer() {
    let real_ip = Tollgate::in_process(
        "[client_ip]\nfrom = \"x-real-ip\"\n[[limits]]\nname = \"ip\"\nrate = 1\nburst = 1\nkey = [\"ip\"]\n",
    );
    assert_eq!(
        statuses(&drain(&real_ip, &[("x-real-ip", "198.51.100.1")], 2)),
        [200, 429]
    );
    assert_eq!(
        statuses(&drain(&real_ip, &[("x-real-ip", "198.51.100.2")], 1)),
        [200]
    );

    let peer = Tollgate::in_process(
        "[client_ip]\nfrom = \"peer\"\n[[limits]]\nname = \"ip\"\nrate = 1\nburst = 1\nkey = [\"ip\"]\n",
    );
    assert_eq!(
        statuses(&drain(&peer, &[("x-real-ip", "198.51.100.1")], 1)),
        [200]
    );
    assert_eq!(
        statuses(&drain(&peer, &[("x-forwarded-for", "198.51.100.2")], 1)),
        [429]
    );
}

#[test]
fn method_host_and_path_key_parts_come_from_the_forwarded_headers() {
    let tollgate = Tollgate::in_process(&limit("route", 1, 1, &["method", "host", "path"]));
    let get_a = [
        ("x-forwarded-method", "GET"),
        ("x-forwarded-host", "api.example.com"),
        ("x-forwarded-uri", "/a?x=1"),
    ];
    assert_eq!(statuses(&drain(&tollgate, &get_a, 2)), [200, 429]);
    let query_and_case = [
        ("x-original-method", "GET"),
        ("x-original-url", "https://API.example.com:8443/a?other=2"),
    ];
    assert_eq!(
        statuses(&drain(&tollgate, &query_and_case, 1)),
        [429],
        "query strings, ports and host case do not make a new bucket"
    );
    let post_a = [
        ("x-forwarded-method", "POST"),
        ("x-forwarded-host", "api.example.com"),
        ("x-forwarded-uri", "/a"),
    ];
    assert_eq!(statuses(&drain(&tollgate, &post_a, 1)), [200]);
}

#[test]
fn a_const_key_is_one_bucket_for_everyone() {
    let tollgate = Tollgate::in_process(&limit("all", 1, 2, &["const:all"]));
    assert_eq!(
        statuses(&drain(&tollgate, &[("x-forwarded-for", "198.51.100.1")], 1)),
        [200]
    );
    assert_eq!(
        statuses(&drain(&tollgate, &[("x-forwarded-for", "198.51.100.2")], 1)),
        [200]
    );
    assert_eq!(
        statuses(&drain(&tollgate, &[("x-forwarded-for", "198.51.100.3")], 1)),
        [429]
    );
}

#[test]
fn match_rules_select_which_limits_apply() {
    let tollgate = Tollgate::in_process(
        r#"
[[limits]]
name = "writes"
rate = 1
burst = 1
key = ["ip"]
[limits.match]
hosts = ["api.example.com"]
methods = ["POST", "put"]
path_prefix = "/api/"
"#,
    );
    let write = [
        ("x-forwarded-method", "POST"),
        ("x-forwarded-host", "API.example.com:443"),
        ("x-forwarded-uri", "/api/items"),
    ];
    assert_eq!(statuses(&drain(&tollgate, &write, 2)), [200, 429]);
    for other in [
        [
            ("x-forwarded-method", "GET"),
            ("x-forwarded-host", "api.example.com"),
            ("x-forwarded-uri", "/api/items"),
        ],
        [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-host", "www.example.com"),
            ("x-forwarded-uri", "/api/items"),
        ],
        [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-host", "api.example.com"),
            ("x-forwarded-uri", "/static/x"),
        ],
    ] {
        let r = tollgate.check(&other);
        assert_eq!(r.status, 200);
        assert!(
            r.header("ratelimit").is_none(),
            "no limit applies to {other:?}"
        );
    }
}

#[test]
fn any_method_and_any_path_below_check_are_accepted() {
    let tollgate = Tollgate::in_process(
        "[[limits]]\nname = \"api\"\nrate = 1\nburst = 1\nkey = [\"ip\"]\n[limits.match]\npath_prefix = \"/api/\"\n",
    );
    let mut client = tollgate.client();
    let first = client.request("POST", "/check/api/items", &[]).unwrap();
    assert_eq!(first.status, 200);
    assert!(
        first.header("ratelimit").is_some(),
        "the path below /check is the request path"
    );
    assert_eq!(
        client
            .request("DELETE", "/check/api/items", &[])
            .unwrap()
            .status,
        429
    );
    assert_eq!(
        client.request("GET", "/check/other", &[]).unwrap().status,
        200
    );
}

#[test]
fn on_missing_skip_deny_and_anonymous() {
    let tollgate = Tollgate::in_process(
        r#"
[[limits]]
name = "skipped"
rate = 1
burst = 1
key = ["header:x-skip"]
on_missing = "skip"
[[limits]]
name = "anon"
rate = 1
burst = 2
key = ["header:x-anon"]
on_missing = "anonymous"
"#,
    );
    // No x-skip: that limit does not apply; no x-anon: all such requests share one bucket.
    let anonymous = drain(&tollgate, &[], 3);
    assert_eq!(statuses(&anonymous), [200, 200, 429]);
    assert_eq!(
        anonymous[0].header("ratelimit-policy"),
        Some("\"anon\";q=2;w=2")
    );
    assert_eq!(
        statuses(&drain(&tollgate, &[("x-anon", "someone")], 1)),
        [200]
    );

    let denying = Tollgate::in_process(
        &limit("keyed", 1, 5, &["header:x-api-key"]).set_str("on_missing", "deny"),
    );
    let r = denying.check(&[]);
    assert_eq!(r.status, 429);
    assert_eq!(
        r.header("retry-after"),
        None,
        "waiting does not help a missing key"
    );
    assert!(r.body.contains("keyed"), "{}", r.body);
    assert_eq!(
        denying.check(&[("x-api-key", "")]).status,
        429,
        "empty counts as missing"
    );
    assert_eq!(denying.check(&[("x-api-key", "k")]).status, 200);
}

#[test]
fn a_shadow_limit_reports_but_never_denies() {
    let tollgate = Tollgate::in_process(&limit("trial", 1, 1, &["ip"]).set("shadow", true));
    let responses = drain(&tollgate, &[], 3);
    assert_eq!(statuses(&responses), [200, 200, 200]);
    assert_eq!(responses[2].header("ratelimit"), Some("\"trial\";r=0;t=1"));
    let metrics = tollgate.metrics();
    assert_eq!(
        crate::support::metric_value(
            &metrics,
            "tollgate_limit_decisions_total{decision=\"shadow_denied\",limit=\"trial\"}"
        ),
        2.0
    );
    assert_eq!(
        crate::support::metric_value(&metrics, "tollgate_checks_total{result=\"allowed\"}"),
        3.0
    );
}

#[test]
fn cost_comes_from_the_cost_header_when_it_is_a_positive_integer() {
    let tollgate =
        Tollgate::in_process(&limit("c", 1, 10, &["ip"]).set_str("cost_header", "X-Cost"));
    let mut client = tollgate.client();
    let r = client.get("/check", &[("x-cost", "4")]).unwrap();
    assert_eq!(r.header("x-ratelimit-remaining"), Some("6"));
    for bad in ["0", "-3", "abc", "1.5", "1e3"] {
        let r = client.get("/check", &[("x-cost", bad)]).unwrap();
        assert_eq!(r.status, 200, "cost {bad:?}");
    }
    // Five malformed costs fell back to the configured cost of 1: 6 - 5 = 1 left.
    let r = client.get("/check", &[]).unwrap();
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
}

/// A cost too large for any integer type is a cost above every burst: denied, never read as
/// malformed and charged the minimum.
#[test]
fn a_cost_header_past_every_integer_is_denied_not_charged_one() {
    let tollgate =
        Tollgate::in_process(&limit("c", 1, 10, &["ip"]).set_str("cost_header", "x-cost"));
    for huge in [
        "18446744073709551616",
        "99999999999999999999999",
        "1000000001",
        "18446744073709551615",
    ] {
        let r = tollgate.check(&[("x-cost", huge)]);
        assert_eq!(r.status, 429, "cost {huge}");
        assert_eq!(r.header("retry-after"), None, "cost {huge}");
        assert!(r.body.contains("can never pass"), "{}", r.body);
    }
    assert_eq!(
        tollgate.check(&[]).header("x-ratelimit-remaining"),
        Some("9"),
        "nothing was charged"
    );
}

#[test]
fn a_cost_above_the_burst_is_denied_without_retry_after() {
    let tollgate =
        Tollgate::in_process(&limit("c", 1, 10, &["ip"]).set_str("cost_header", "x-cost"));
    let r = tollgate.check(&[("x-cost", "11")]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), None);
    assert!(r.body.contains("can never pass"), "{}", r.body);
    assert_eq!(
        tollgate.check(&[]).header("x-ratelimit-remaining"),
        Some("9"),
        "nothing was charged"
    );
}

#[test]
fn unprintable_and_huge_key_values_are_decided_not_crashed() {
    let tollgate = Tollgate::in_process(API_KEY_LIMIT);
    let mut client = tollgate.client();
    let huge = "k".repeat(8000);
    // Invalid UTF-8 (obs-text) in a key header and in X-Forwarded-For.
    let raw = b"GET /check HTTP/1.1\r\nHost: x\r\nX-Api-Key: \xe9\xffkey\r\nX-Forwarded-For: \xff\xfe\r\n\r\n";
    assert_eq!(client.send_raw(raw).unwrap().status, 200);
    assert_eq!(
        client
            .get("/check", &[("x-api-key", &huge)])
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        client
            .get(
                "/check",
                &[("x-original-url", "::::/\\\\?#"), ("x-forwarded-uri", "")]
            )
            .unwrap()
            .status,
        200
    );
}

#[test]
fn metrics_are_only_on_the_admin_listener() {
    let tollgate = Tollgate::in_process(API_KEY_LIMIT);
    tollgate.check(&[("x-api-key", "k")]);
    let public = tollgate.client().get("/metrics", &[]).unwrap();
    assert_eq!(public.status, 404);
    let metrics = tollgate.metrics();
    for name in [
        "tollgate_checks_total",
        "tollgate_limit_decisions_total",
        "tollgate_check_duration_seconds",
        "tollgate_store_duration_seconds",
        "tollgate_store_errors_total",
        "tollgate_store_up",
        "tollgate_config_reloads_total",
        "tollgate_build_info",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "{name} missing"
        );
    }
    assert_eq!(
        crate::support::metric_value(&metrics, "tollgate_checks_total{result=\"allowed\"}"),
        1.0
    );
    assert!(
        !metrics.contains("x-api-key") && !metrics.contains("tollgate:per-key"),
        "no client keys in labels"
    );
}

#[test]
fn health_endpoints_answer_on_both_listeners() {
    let tollgate = Tollgate::in_process("");
    for addr in [tollgate.addr, tollgate.admin] {
        let mut client = HttpClient::connect(addr).unwrap();
        assert_eq!(client.get("/healthz", &[]).unwrap().status, 200);
        assert_eq!(client.get("/readyz", &[]).unwrap().status, 200);
    }
}

#[test]
fn redis_store_decides_and_renders_like_the_memory_store() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::in_process(&redis_config(&redis, "", API_KEY_LIMIT));
    let responses = drain(&tollgate, &[("x-api-key", "k1")], 4);
    assert_eq!(statuses(&responses), [200, 200, 200, 429]);
    assert_eq!(
        responses[0].header("ratelimit"),
        Some("\"per-key\";r=2;t=1")
    );
    assert_eq!(responses[3].header("retry-after"), Some("1"));
    assert_eq!(
        statuses(&drain(&tollgate, &[("x-api-key", "k2")], 1)),
        [200]
    );
    let keys = redis.cli(&["--scan", "--pattern", "tollgate:per-key:*"]);
    let mut keys: Vec<&str> = keys.split_whitespace().collect();
    keys.sort();
    assert_eq!(keys, ["tollgate:per-key:{k1}", "tollgate:per-key:{k2}"]);
}

/// Not ready until the store has answered once, whatever `on_error`: an instance that never
/// reached Redis takes no traffic. Once it has, `on_error = "allow"` keeps it ready (degraded)
/// through an outage.
#[test]
fn not_ready_until_the_store_first_answers() {
    let port = crate::support::free_port();
    let config = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{port}/0\"\n\
         timeout_ms = 200\non_error = \"allow\"\n{API_KEY_LIMIT}"
    );
    let tollgate = Tollgate::in_process(&config);
    let readyz = || tollgate.client().get("/readyz", &[]).unwrap();
    let first = readyz();
    assert_eq!(first.status, 503, "{}", first.body);
    assert!(
        first.body.contains("has not answered yet"),
        "{}",
        first.body
    );
    let mut redis = crate::support::chaos::redis_on_port(port, &[]);
    assert!(
        crate::support::wait_until(std::time::Duration::from_secs(10), || readyz().status
            == 200),
        "never ready: {}",
        readyz().body
    );
    redis.kill();
    let degraded = crate::support::wait_until(std::time::Duration::from_secs(5), || {
        let r = readyz();
        r.status == 200 && r.body.contains("degraded")
    });
    assert!(degraded, "{}", readyz().body);
}

#[test]
fn redis_readiness_follows_the_store_when_failing_closed() {
    let mut redis = RedisServer::start();
    let tollgate =
        Tollgate::in_process(&redis_config(&redis, "on_error = \"deny\"", API_KEY_LIMIT));
    let mut client = tollgate.client();
    assert_eq!(client.get("/readyz", &[]).unwrap().status, 200);
    redis.kill();
    let not_ready = crate::support::wait_until(std::time::Duration::from_secs(5), || {
        tollgate
            .client()
            .get("/readyz", &[])
            .map(|r| r.status == 503)
            .unwrap_or(false)
    });
    assert!(not_ready, "readyz must report the dead store");
    let r = tollgate.check(&[("x-api-key", "k")]);
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        tollgate.client().get("/healthz", &[]).unwrap().status,
        200,
        "liveness ignores Redis"
    );
}
