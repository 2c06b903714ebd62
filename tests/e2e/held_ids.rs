//! Lease and reservation ids through the shipped nginx, Traefik and Envoy (`ext_authz`)
//! configs: an admitted check's `X-Tollgate-Lease` and `X-Tollgate-Reservation` reach the
//! application (never a client's own under those names, not even when tollgate sends none),
//! and the application gives them back with them.

use std::net::SocketAddr;

use crate::support::envoy::Envoy;
use crate::support::fixtures::ONE_SLOT_PER_KEY;
use crate::support::proxies::backend::{send, Backend};
use crate::support::proxies::scenarios::tollgate_config;
use crate::support::proxies::{Nginx, Traefik};
use crate::support::{RedisServer, Response, Tollgate};

const TOKEN: &str = "test-admin-token-0123456789";
const LIMITS: &str = r#"
[[limits]]
name = "slots"
concurrency = 1
key = ["header:x-api-key"]

[[limits]]
name = "tokens"
rate = "100/m"
burst = 100
charge = "report"
max_debt = 0
reserve = 60
key = ["header:x-api-key"]
"#;

fn admin(tollgate: &Tollgate, path: &str, body: &serde_json::Value) -> serde_json::Value {
    let answer: Response = crate::support::http::admin_json(
        tollgate.admin,
        "POST",
        path,
        Some(TOKEN),
        &body.to_string(),
    );
    assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    serde_json::from_str(&answer.body).expect("JSON")
}

/// Through `proxy`: the app sees the ids; a second request finds the slot and the budget
/// taken; once the app released and settled with what it saw, the next one passes again.
fn ids_reach_the_app_and_give_back(
    tollgate: &Tollgate,
    backend: &Backend,
    proxy: SocketAddr,
    redis: &RedisServer,
) {
    redis.cli(&["FLUSHALL"]);
    backend.forget();
    let forged = [
        ("x-api-key", "acme"),
        (
            "x-tollgate-lease",
            "slots.61636d65.00000000000000000000000000000001",
        ),
        (
            "x-tollgate-reservation",
            "tokens.61636d65.00000000000000000000000000000001:1",
        ),
    ];
    // No key: neither limit applies (`on_missing = "skip"`), tollgate sends no ids, and the
    // client's own must not reach the application either.
    let keyless = send(proxy, "GET", "/", &forged[1..]);
    assert_eq!(keyless.status, 200, "{keyless:?}");
    let seen = backend.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-tollgate-lease"), None, "{:?}", seen[0]);
    assert_eq!(
        seen[0].header("x-tollgate-reservation"),
        None,
        "{:?}",
        seen[0]
    );
    backend.forget();

    let first = send(proxy, "GET", "/", &forged);
    assert_eq!(first.status, 200, "{first:?}");
    let seen = backend.seen();
    let lease = seen[0]
        .header("x-tollgate-lease")
        .expect("the lease id")
        .to_owned();
    let reservation = seen[0]
        .header("x-tollgate-reservation")
        .expect("the reservation id")
        .to_owned();
    assert!(!lease.ends_with("0001"), "not the client's own: {lease}");
    assert!(
        reservation.starts_with("tokens.") && reservation.ends_with(":60"),
        "{reservation}"
    );

    let busy = send(proxy, "GET", "/", &[("x-api-key", "acme")]);
    assert_eq!(busy.status, 429, "the one slot is held: {busy:?}");

    let released = admin(tollgate, "/release", &serde_json::json!({ "lease": lease }));
    assert_eq!(released["released"], 1, "{released}");
    let settled = admin(
        tollgate,
        "/report",
        &serde_json::json!({ "reservation": reservation, "cost": 10 }),
    );
    assert_eq!(settled["settled"], true, "{settled}");
    // 100 - 60 reserved + 50 given back: 90 left, so another estimate of 60 fits.
    assert!(
        settled["remaining"].as_u64().is_some_and(|left| left >= 89),
        "{settled}"
    );
    let again = send(proxy, "GET", "/", &[("x-api-key", "acme")]);
    assert_eq!(again.status, 200, "{again:?}");
}

#[test]
fn nginx_and_traefik_pass_the_ids_the_app_gives_back() {
    let redis = RedisServer::start();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n{}",
        tollgate_config(&redis, "deny", LIMITS)
    );
    let tollgate = Tollgate::start(&config);
    let backend = Backend::start();
    let nginx = Nginx::start(tollgate.addr, backend.addr);
    ids_reach_the_app_and_give_back(&tollgate, &backend, nginx.addr, &redis);
    let sidecar = Nginx::start_sidecar(tollgate.addr, backend.addr);
    ids_reach_the_app_and_give_back(&tollgate, &backend, sidecar.addr, &redis);
    let traefik = Traefik::start(tollgate.addr, backend.addr);
    ids_reach_the_app_and_give_back(&tollgate, &backend, traefik.addr, &redis);
}

#[test]
fn envoy_ext_authz_passes_the_ids_the_app_gives_back() {
    let redis = RedisServer::start();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n{}",
        tollgate_config(&redis, "deny", LIMITS)
    );
    let tollgate = Tollgate::start(&config);
    let backend = Backend::start();
    // The check's timeout raised, as in the other Envoy tests: a loaded machine.
    let envoy = Envoy::ext_authz(
        tollgate.addr,
        backend.addr,
        &[(" timeout: 0.5s", " timeout: 2s")],
    );
    ids_reach_the_app_and_give_back(&tollgate, &backend, envoy.addr, &redis);
}

/// nginx's `post_action` (the one core directive that runs after the response, undocumented
/// in nginx's reference) gives the lease back as docs/ingress/leases-and-reservations.md
/// shows: with one slot, requests one after another are all admitted; without it the second
/// is refused.
#[test]
fn nginx_post_action_releases_the_lease_after_the_response() {
    let redis = RedisServer::start();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n{}",
        tollgate_config(&redis, "deny", ONE_SLOT_PER_KEY)
    );
    let tollgate = Tollgate::start(&config);
    let backend = Backend::start();
    let site = |release: bool| {
        let (check, admin, app) = (tollgate.addr, tollgate.admin, backend.addr);
        let post_action = if release {
            "post_action @tollgate_release;"
        } else {
            ""
        };
        move |listen: SocketAddr| {
            format!(
                "server {{\n listen {listen};\n\
                 location / {{\n  auth_request /_tollgate;\n\
                  auth_request_set $tollgate_lease $upstream_http_x_tollgate_lease;\n\
                  proxy_pass http://{app};\n  {post_action}\n }}\n\
                 location = /_tollgate {{\n  internal;\n  proxy_pass http://{check}/check;\n\
                  proxy_pass_request_body off;\n  proxy_set_header Content-Length \"\";\n\
                  proxy_set_header X-Tollgate-Deny-Status 403;\n }}\n\
                 location @tollgate_release {{\n  rewrite ^ /release break;\n\
                  proxy_pass http://{admin};\n  proxy_method POST;\n\
                  proxy_set_header Authorization \"Bearer {TOKEN}\";\n\
                  proxy_set_header Content-Type application/json;\n\
                  proxy_set_body '{{\"lease\":\"$tollgate_lease\"}}';\n }}\n}}\n"
            )
        }
    };
    let held = || {
        let keys = redis.cli(&["KEYS", "*:slots:*"]);
        keys.lines()
            .map(|key| {
                redis
                    .cli(&["ZCARD", key.trim()])
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0)
            })
            .sum::<u64>()
    };
    let releasing = Nginx::start_site(site(true));
    redis.cli(&["FLUSHALL"]);
    for round in 0..5 {
        let answer = send(releasing.addr, "GET", "/", &[("x-api-key", "acme")]);
        assert_eq!(answer.status, 200, "round {round}: {answer:?}");
        // post_action runs once the response is sent: the release may trail the answer.
        assert!(
            crate::support::wait_until(std::time::Duration::from_secs(5), || held() == 0),
            "round {round}: the lease was never given back"
        );
    }
    let keeping = Nginx::start_site(site(false));
    assert_eq!(
        send(keeping.addr, "GET", "/", &[("x-api-key", "b")]).status,
        200
    );
    let second = send(keeping.addr, "GET", "/", &[("x-api-key", "b")]);
    assert_eq!(
        second.status, 403,
        "without post_action the slot stays held: {second:?}"
    );
}
