//! Envoy's ext_authz filter in front of tollgate: quota headers, problem+json 429s, failing
//! closed, the client's address and exact admission.

use super::*;

// ---------------------------------------------------------------------------------------
// ext_authz (HTTP) → /check

/// The check's timeout in envoy.yaml (0.5 s), raised: on a loaded test machine a check may
/// take longer, and a test must see tollgate's answer, not Envoy's failure mode.
const EXT_AUTHZ_TIMEOUT: (&str, &str) = (" timeout: 0.5s", " timeout: 2s");

fn ext_authz_stack(limits: &str) -> Stack<Envoy> {
    let limits = format!("{TRUST_ONLY_ENVOY}{limits}");
    Stack::start("deny", &limits, |tollgate, app| {
        Envoy::ext_authz(tollgate, app, &[EXT_AUTHZ_TIMEOUT])
    })
}

const PER_IP_BURST_3: &str =
    "[[limits]]\nname = \"per-ip\"\nrate = 0.01\nburst = 3\nkey = [\"ip\"]\n";

/// Proves, through envoy.yaml as shipped: an allowed request reaches the application and the
/// client gets tollgate's quota headers, once each; the denial is tollgate's own 429 (its
/// Retry-After, RateLimit headers, problem+json type and body) and the application is not
/// called; with Redis killed (tollgate's `on_error = "deny"` answers 503) and with tollgate
/// stopped, Envoy fails open (`failure_mode_allow: true`): its failure mode decides, not
/// tollgate's `on_error`.
#[test]
fn ext_authz_allowed_requests_get_the_quota_and_a_denial_is_tollgates_problem_json_429() {
    let mut stack = ext_authz_stack(PER_IP_BURST_3);
    for remaining in [2, 1, 0] {
        let allowed = from(&stack.proxy, CLIENT_A, "GET", "/items", &[]);
        assert_allowed(&allowed, 3, remaining);
        assert_eq!(allowed.body, "backend\n");
        assert!(
            allowed
                .header("ratelimit")
                .unwrap_or_default()
                .starts_with(&format!("\"per-ip\";r={remaining};t=")),
            "{allowed:?}"
        );
        assert_eq!(
            allowed.header("ratelimit-policy"),
            Some("\"per-ip\";q=3;w=300")
        );
        assert_no_duplicate_quota_headers(&allowed);
    }

    let denied = from(&stack.proxy, CLIENT_A, "GET", "/items", &[]);
    assert_denied_with_quota_headers(&denied, "per-ip");
    assert_no_duplicate_quota_headers(&denied);
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json"),
        "Envoy keeps tollgate's content type: {denied:?}"
    );
    assert!(
        denied.body.contains("rate limit exceeded (per-ip)"),
        "{denied:?}"
    );
    assert_eq!(stack.backend.count(), 3, "the denial never reached the app");
    // One bucket, keyed on the address Envoy appended to X-Forwarded-For.
    let keys = stack.redis_keys();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].contains("127.0.0.2"), "{keys:?}");

    // tollgate's `on_error = "deny"` answers 503 with Redis gone, and Envoy takes any 5xx
    // of the authorization service for a failure: `failure_mode_allow: true` admits.
    stack.redis.kill();
    let no_redis = from(&stack.proxy, CLIENT_B, "GET", "/items", &[]);
    assert_eq!(
        no_redis.status, 200,
        "Envoy's failure mode wins: {no_redis:?}"
    );
    assert_eq!(no_redis.header("ratelimit"), None, "{no_redis:?}");

    stack.stop_tollgate();
    let open = from(&stack.proxy, CLIENT_A, "GET", "/items", &[]);
    assert_eq!(open.status, 200, "fails open: {open:?}");
    assert_eq!(open.header("ratelimit"), None, "{open:?}");
    assert_eq!(stack.backend.count(), 5);
}

/// Proves, with envoy.yaml switched to fail closed (`failure_mode_allow: false`) and tollgate
/// denying on store errors (`on_error = "deny"`): Redis killed while tollgate runs, Envoy
/// takes tollgate's 503 for an error of the authorization service and answers its own
/// `status_on_error` (503, no Retry-After); tollgate stopped, the same. Neither reaches the
/// application.
#[test]
fn ext_authz_failing_closed_answers_503_on_a_dead_redis_and_without_tollgate() {
    let mut stack = Stack::start(
        "deny",
        &format!("{TRUST_ONLY_ENVOY}{PER_IP_BURST_3}"),
        |tollgate, app| {
            Envoy::ext_authz(
                tollgate,
                app,
                &[
                    EXT_AUTHZ_TIMEOUT,
                    ("failure_mode_allow: true", "failure_mode_allow: false"),
                ],
            )
        },
    );
    assert_eq!(from(&stack.proxy, CLIENT_A, "GET", "/", &[]).status, 200);
    stack.redis.kill();
    let no_redis = from(&stack.proxy, CLIENT_A, "GET", "/", &[]);
    // Envoy's own answer: tollgate's Retry-After and problem+json body are not passed on.
    assert_eq!(no_redis.status, 503, "{no_redis:?}");
    assert_eq!(no_redis.header("retry-after"), None, "{no_redis:?}");
    stack.stop_tollgate();
    let down = from(&stack.proxy, CLIENT_A, "GET", "/", &[]);
    assert_eq!(down.status, 503, "{down:?}");
    assert_eq!(stack.backend.count(), 1);
}

/// Proves: with `use_remote_address: true` Envoy appends the TCP peer to X-Forwarded-For and
/// tollgate (trusting only Envoy) keys on it, so a client's own X-Forwarded-For changes
/// nothing and another client address has its own bucket.
#[test]
fn ext_authz_keys_the_client_on_the_address_envoy_appends_to_x_forwarded_for() {
    assert_client_ip_limit(&ext_authz_stack(
        "[[limits]]\nname = \"per-ip\"\nrate = 0.01\nburst = 2\nkey = [\"ip\"]\n",
    ));
}

/// Proves: a POST + `/api/` limit applies through Envoy (the check keeps the method and the
/// path), and forged X-Forwarded-Uri / X-Original-* / X-Forwarded-Method headers never reach
/// tollgate (envoy.yaml's allow-list), so they cannot move a request out of the limit.
#[test]
fn ext_authz_keeps_clients_from_dodging_a_method_and_path_limit() {
    assert_path_and_method_limit(&ext_authz_stack(API_WRITES_BURST_1));
}

/// Proves: 3 × burst concurrent requests for one key through Envoy admit exactly the burst,
/// every other one is a 429, and only the admitted ones reach the application.
#[test]
fn ext_authz_admits_exactly_the_burst_of_concurrent_requests_for_one_key() {
    let burst = 6;
    let stack = ext_authz_stack(&format!(
        "[[limits]]\nname = \"shared\"\nrate = 0.001\nburst = {burst}\nkey = [\"header:x-api-key\"]\n"
    ));
    let statuses = burst_through(&[stack.addr()], 3 * burst, &[("X-Api-Key", "shared")]);
    assert_eq!(tally(&statuses), (burst, 2 * burst, 0), "{statuses:?}");
    assert_eq!(stack.backend.count(), burst);
}
