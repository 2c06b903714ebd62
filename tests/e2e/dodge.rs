//! Dodging: through the real nginx and Traefik running each shipped config, a client spells the
//! same resource every way it can (escapes, dot segments, doubled slashes, case, bytes above
//! ASCII, ports, trailing dots, its own forwarding headers) after draining a limit. Each
//! spelling must be denied at the client and must not reach the application.
//!
//! One stack (Redis, tollgate, counting backend, proxy) per shipped config, reused for the
//! whole corpus. tollgate denies with `deny_status = 420`, so a proxy that only knows 429
//! shows up as an admission.

use std::net::{Ipv4Addr, SocketAddr};

use crate::support::proxies::backend::send_raw_from;
use crate::support::proxies::scenarios::{Proxy, Stack};
use crate::support::proxies::{Nginx, Traefik};

/// The client's address: not a trusted proxy, so only the proxy's own forwarding counts.
const CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Three limit kinds, each with a burst of 1 and a refill far beyond the test's length:
/// - `api-writes`: POST under `/api/`, keyed on the client address;
/// - `per-file`: GET under `/files/`, one bucket per path;
/// - `api-host`: DELETE to the host `api.example.com`, one bucket per host.
const LIMITS: &str = r#"
[client_ip]
from = "x-forwarded-for"
trusted_proxies = ["127.0.0.1/32"]

[response]
deny_status = 420

[[limits]]
name = "api-writes"
rate = 0.001
burst = 1
key = ["ip"]
[limits.match]
methods = ["POST"]
path_prefix = "/api/"

[[limits]]
name = "per-file"
rate = 0.001
burst = 1
key = ["path"]
[limits.match]
methods = ["GET"]
path_prefix = "/files/"

[[limits]]
name = "api-host"
rate = 0.001
burst = 1
key = ["host"]
[limits.match]
methods = ["DELETE"]
hosts = ["api.example.com"]
"#;

const DENY_STATUS: u16 = 420;

/// A request as raw bytes: `method target`, then `Host`, then `extra` header lines.
fn request(method: &str, target: &[u8], host: &str, extra: &[&str]) -> Vec<u8> {
    let mut raw = Vec::new();
    raw.extend_from_slice(method.as_bytes());
    raw.push(b' ');
    raw.extend_from_slice(target);
    raw.extend_from_slice(format!(" HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n").as_bytes());
    for line in extra {
        raw.extend_from_slice(line.as_bytes());
        raw.extend_from_slice(b"\r\n");
    }
    if method.eq_ignore_ascii_case("POST") {
        raw.extend_from_slice(b"Content-Length: 4\r\n\r\nbody");
    } else {
        raw.extend_from_slice(b"\r\n");
    }
    raw
}

/// Forwarding headers a client may send to pick its own method, path, host or address.
const FORGED: &[&str] = &[
    "X-Forwarded-Uri: /public",
    "X-Forwarded-Method: GET",
    "X-Forwarded-Host: other.example",
    "X-Original-URI: /public",
    "X-Original-Method: GET",
    "X-Original-URL: http://other.example/public",
    "X-Forwarded-For: 6.6.6.6",
    "X-Real-IP: 6.6.6.7",
];

/// Every spelling of a drained resource, per limit kind: (what it tries, raw request).
fn corpus() -> Vec<(String, Vec<u8>)> {
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, raw: Vec<u8>| cases.push((name.to_string(), raw));
    let host = "app.example";

    // `api-writes`: POST /api/items, drained.
    for target in [
        &b"/api/items"[..],
        b"/api/items?\xff=1",
        b"/api/items?%FF=1",
        b"/api/\xc3\xa9",
        b"/api/\xff",
        b"/%61pi/items",
        b"/%61%70%69/items",
        b"//api/items",
        b"/api//items",
        b"/./api/items",
        b"/x/../api/items",
        b"/x//../api/items",
        b"/%2e/api/items",
        b"/%2E/api/items",
        b"/x/%2e%2e/api/items",
        b"/api/items#frag",
        b"http://app.example/api/items",
    ] {
        add(
            &format!("POST {}", String::from_utf8_lossy(target)),
            request("POST", target, host, &[]),
        );
    }
    add(
        "POST /api/items with forged forwarding headers",
        request("POST", b"/api/items", host, FORGED),
    );
    for header in FORGED {
        add(
            &format!("POST /api/items with {header}"),
            request("POST", b"/api/items", host, &[header]),
        );
    }
    add(
        "POST /api/items with an empty X-Forwarded-Uri",
        request("POST", b"/api/items", host, &["X-Forwarded-Uri:"]),
    );
    add("post /api/items", request("post", b"/api/items", host, &[]));

    // `per-file`: GET /files/a, drained; every spelling must land in the same bucket.
    for target in [
        &b"/files/a"[..],
        b"/files/a?x=1",
        b"/files/a?\xff",
        b"/files/./a",
        b"//files/a",
        b"/files//a",
        b"/%66iles/a",
        b"/files/%61",
        b"/x/../files/a",
        b"/files/b/../a",
        b"/files/%2e/a",
        b"/files/b/%2E%2E/a",
        b"http://app.example/files/a",
    ] {
        add(
            &format!("GET {}", String::from_utf8_lossy(target)),
            request("GET", target, host, &[]),
        );
    }
    add(
        "GET /files/a with X-Forwarded-Uri: /files/z",
        request(
            "GET",
            b"/files/a",
            host,
            &["X-Forwarded-Uri: /files/z", "X-Original-URI: /files/z"],
        ),
    );

    // `api-host`: DELETE / to api.example.com, drained.
    for spelling in [
        "api.example.com",
        "API.EXAMPLE.COM",
        "Api.Example.Com",
        "api.example.com.",
        "api.example.com:80",
        "api.example.com.:80",
        "API.example.com.:8080",
    ] {
        add(
            &format!("DELETE / Host: {spelling}"),
            request("DELETE", b"/", spelling, &[]),
        );
    }
    add(
        "DELETE / to api.example.com with X-Forwarded-Host: other.example",
        request(
            "DELETE",
            b"/",
            "api.example.com",
            &[
                "X-Forwarded-Host: other.example",
                "X-Original-URL: http://other.example/",
            ],
        ),
    );
    add(
        "DELETE http://api.example.com./",
        request(
            "DELETE",
            b"http://api.example.com./",
            "api.example.com",
            &[],
        ),
    );
    cases
}

/// Drains each limit, runs the corpus, then checks that requests outside the limits still
/// pass (so the denials come from the limits, not from a broken stack).
fn assert_no_spelling_dodges<P: Proxy>(stack: &Stack<P>) {
    let addr: SocketAddr = stack.addr();
    let send = |raw: &[u8]| {
        send_raw_from(CLIENT, addr, raw).unwrap_or_else(|e| panic!("no answer via {addr}: {e}"))
    };
    for drain in [
        request("POST", b"/api/items", "app.example", &[]),
        request("GET", b"/files/a", "app.example", &[]),
        request("DELETE", b"/", "api.example.com", &[]),
    ] {
        let response = send(&drain);
        assert_eq!(response.status, 200, "draining: {response:?}");
    }
    assert_eq!(stack.backend.count(), 3);

    let mut dodged = Vec::new();
    let mut refused_by_proxy = Vec::new();
    for (name, raw) in corpus() {
        let before = stack.backend.count();
        let response = send(&raw);
        let reached = stack.backend.count() - before;
        // The proxy may refuse a spelling itself (400): that is no admission either.
        if reached != 0 || ![DENY_STATUS, 400].contains(&response.status) {
            dodged.push(format!(
                "{name}: status {}, reached the application {reached} time(s)",
                response.status
            ));
        } else if response.status == 400 {
            refused_by_proxy.push(name);
        }
    }
    eprintln!("refused by the proxy itself (400): {refused_by_proxy:?}");
    assert!(
        dodged.is_empty(),
        "spellings that got around a drained limit:\n{}",
        dodged.join("\n")
    );

    // Outside the limits, requests pass: another path, method or host.
    for (raw, what) in [
        (
            request("POST", b"/public", "app.example", &[]),
            "POST /public",
        ),
        (
            request("GET", b"/files/b", "app.example", &[]),
            "GET /files/b",
        ),
        (
            request("DELETE", b"/", "other.example", &[]),
            "DELETE other host",
        ),
        (
            request("GET", b"/api/items", "app.example", &[]),
            "GET /api/items",
        ),
    ] {
        let response = send(&raw);
        assert_eq!(response.status, 200, "{what}: {response:?}");
    }
    assert_eq!(stack.backend.count(), 3 + 4);
}

#[test]
fn no_spelling_dodges_a_limit_through_the_shipped_nginx_config() {
    assert_no_spelling_dodges(&Stack::start("deny", LIMITS, Nginx::start));
}

#[test]
fn no_spelling_dodges_a_limit_through_the_sidecar_nginx_config() {
    assert_no_spelling_dodges(&Stack::start("deny", LIMITS, Nginx::start_sidecar));
}

#[test]
fn no_spelling_dodges_a_limit_through_the_ingress_nginx_example() {
    assert_no_spelling_dodges(&Stack::start("deny", LIMITS, Nginx::start_ingress_nginx));
}

#[test]
fn no_spelling_dodges_a_limit_through_the_shipped_traefik_config() {
    assert_no_spelling_dodges(&Stack::start("deny", LIMITS, Traefik::start));
}

/// With `deny_status`, the one request the bucket holds passes and the next reaches the client
/// as `expected`, never the application.
fn assert_denied_as<P: Proxy>(
    start_proxy: impl Fn(SocketAddr, SocketAddr) -> P,
    deny_status: u16,
    expected: u16,
) {
    let limits = format!(
        "[response]\ndeny_status = {deny_status}\n\n[[limits]]\nname = \"all\"\nrate = 0.001\n\
         burst = 1\nkey = [\"path\"]\n"
    );
    let stack = Stack::start("deny", &limits, start_proxy);
    let get = || {
        send_raw_from(
            CLIENT,
            stack.addr(),
            &request("GET", b"/", "app.example", &[]),
        )
        .expect("answered")
    };
    let first = get();
    assert_eq!(first.status, 200, "deny_status {deny_status}: {first:?}");
    let denied = get();
    assert_eq!(
        denied.status, expected,
        "deny_status {deny_status}: {denied:?}"
    );
    assert_eq!(
        stack.backend.count(),
        1,
        "deny_status {deny_status} admitted"
    );
}

#[test]
fn any_4xx_deny_status_is_a_denial_at_the_client_through_every_shipped_config() {
    // nginx can `return` only literal statuses: 418 and 420 pass as they are, others as 429.
    for (deny_status, through_nginx) in [(418, 418), (451, 429), (400, 429)] {
        assert_denied_as(Nginx::start, deny_status, through_nginx);
        assert_denied_as(Nginx::start_sidecar, deny_status, through_nginx);
        assert_denied_as(Nginx::start_ingress_nginx, deny_status, through_nginx);
        assert_denied_as(Traefik::start, deny_status, deny_status);
    }
}
