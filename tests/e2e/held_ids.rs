//! Lease and reservation ids through the shipped nginx and Traefik configs: an admitted check's
//! `X-Tollgate-Lease` and `X-Tollgate-Reservation` reach the application (never a client's own
//! under those names), and the application gives them back with them.

use std::net::SocketAddr;

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
