//! tollgate behind Redis Sentinel (1 master, 1 replica, 3 sentinels): it follows the master
//! through a `SENTINEL FAILOVER` and through the death of the master, without a restart, and
//! afterwards every check is decided by the store again (not by `on_error`).

use std::time::{Duration, Instant};

use crate::support::cluster::{
    AuthSentinelSetup, SentinelSetup, TlsSentinelSetup, MASTER_NAME, MASTER_PASSWORD,
    SENTINEL_PASSWORD,
};
use crate::support::http::HttpClient;
use crate::support::{free_port, wait_until, TempDir, Tollgate};

const ALLOWED: &str = "tollgate_checks_total{result=\"allowed\"}";
const ERROR_ALLOWED: &str = "tollgate_checks_total{result=\"error_allowed\"}";

fn config(setup: &SentinelSetup) -> String {
    let urls: Vec<String> = setup.urls().iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "[store]\nbackend = \"redis\"\ntimeout_ms = 100\non_error = \"allow\"\n\
         sentinel = {{ master = \"{MASTER_NAME}\", urls = [{}] }}\n\n\
         [[limits]]\nname = \"per-user\"\nrate = 10\nburst = 100000\nkey = [\"header:x-user\"]\n",
        urls.join(", ")
    )
}

/// Decided by the store: quota headers present (an `on_error = "allow"` answer has none).
fn decided(tollgate: &Tollgate) -> bool {
    let r = tollgate.check(&[("x-user", "alice")]);
    r.status == 200 && r.header("ratelimit").is_some()
}

/// Checks every 10 ms from `started` (the failover's trigger) until the sentinels name `new_master` and a check is
/// decided by the store again; returns (undecided checks, seconds until decided again).
fn ride_out(
    tollgate: &Tollgate,
    started: Instant,
    new_master: u16,
    master_port: impl Fn() -> Option<u16>,
) -> (u32, f64) {
    let mut undecided = 0;
    let mut switched = false;
    while started.elapsed() < Duration::from_secs(30) {
        switched = switched || master_port() == Some(new_master);
        if decided(tollgate) {
            if switched {
                return (undecided, started.elapsed().as_secs_f64());
            }
        } else {
            undecided += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("tollgate did not follow the new master {new_master} (switched: {switched})");
}

/// After a failover: 50 checks, every one decided by the store, and the metrics agree; the
/// bucket lives on the master the sentinels name.
fn assert_store_decides(tollgate: &Tollgate, master: u16, phase: &str) {
    let (allowed, errors) = (tollgate.metric(ALLOWED), tollgate.metric(ERROR_ALLOWED));
    for _ in 0..50 {
        assert!(decided(tollgate), "{phase}: a check fell back to on_error");
    }
    assert_eq!(tollgate.metric(ALLOWED) - allowed, 50.0, "{phase}: allowed");
    assert_eq!(
        tollgate.metric(ERROR_ALLOWED),
        errors,
        "{phase}: error_allowed"
    );
    let tokens = crate::support::redis_cli(master, &["GET", "tollgate:per-user:{alice}"])
        .unwrap_or_default();
    assert!(
        crate::support::stored_tokens(&tokens, 0.0).is_some(),
        "{phase}: the bucket is on master {master}: {tokens:?}"
    );
}

#[test]
fn sentinel_failovers_are_followed_without_a_restart() {
    let mut setup = SentinelSetup::start();
    let tollgate = Tollgate::start(&config(&setup));
    assert!(
        wait_until(Duration::from_secs(10), || decided(&tollgate)),
        "tollgate never reached the master through the sentinels"
    );
    assert_store_decides(&tollgate, setup.master.port, "before failover");

    // 1. An operator's failover: the master is demoted (it answers READONLY), the replica wins.
    let replica = setup.replica.port;
    let started = Instant::now();
    setup.sentinel_cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
    let (undecided, secs) = ride_out(&tollgate, started, replica, || setup.master_port());
    eprintln!("SENTINEL FAILOVER: store decides again after {secs:.2}s; {undecided} checks answered per on_error");
    assert_store_decides(&tollgate, replica, "after SENTINEL FAILOVER");

    // 2. The new master dies; the old one, now its replica, is promoted back.
    let old_master = setup.master.port;
    assert!(
        wait_until(Duration::from_secs(20), || {
            // A node changing role drops its clients: an error here means "not yet".
            let info = crate::support::redis_cli(setup.master.port, &["INFO", "replication"])
                .unwrap_or_default();
            info.contains("role:slave") && info.contains("master_link_status:up")
        }),
        "the demoted master did not become a synced replica"
    );
    let started = Instant::now();
    setup.replica.kill();
    let (undecided, secs) = ride_out(&tollgate, started, old_master, || setup.master_port());
    eprintln!("master killed: store decides again after {secs:.2}s; {undecided} checks answered per on_error");
    assert_store_decides(&tollgate, old_master, "after the master died");
}

#[test]
fn tollgate_starts_and_answers_while_no_sentinel_is_reachable() {
    let nobody = [free_port(), free_port()];
    let config = format!(
        "[store]\nbackend = \"redis\"\ntimeout_ms = 50\non_error = \"deny\"\n\
         sentinel = {{ master = \"{MASTER_NAME}\", urls = [\"redis://127.0.0.1:{}\", \
         \"redis://127.0.0.1:{}\"] }}\n",
        nobody[0], nobody[1]
    );
    let tollgate = Tollgate::start(&config);
    let started = Instant::now();
    let r = tollgate.check(&[]);
    assert_eq!(r.status, 503, "on_error = deny while no master is known");
    assert!(started.elapsed() < Duration::from_secs(1), "fails fast");
    let ready = HttpClient::connect(tollgate.admin)
        .and_then(|mut c| c.get("/readyz", &[]))
        .expect("readyz answered");
    assert_eq!(ready.status, 503);
}

const TOKEN: &str = "sentinel-admin-token";

/// Two instances behind Sentinel, each caching denials and following runtime overrides.
fn fleet_config(setup: &SentinelSetup) -> String {
    let urls: Vec<String> = setup.urls().iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ntimeout_ms = 100\n\
         on_error = \"allow\"\n\
         sentinel = {{ master = \"{MASTER_NAME}\", urls = [{}] }}\n\n\
         [[limits]]\nname = \"per-user\"\nrate = 0.01\nburst = 2\nkey = [\"header:x-user\"]\n",
        urls.join(", ")
    )
}

/// Spends `user`'s burst on `tollgate` until a check is denied (the denial is then cached).
fn drain(tollgate: &Tollgate, user: &str) {
    assert!(
        wait_until(Duration::from_secs(5), || tollgate
            .check(&[("x-user", user)])
            .status
            == 429),
        "{user} was never denied"
    );
}

/// A failover moves the reset channel and the override poll to a new master: a reset and an
/// override made on one instance afterwards still reach the other, whose deny cache would
/// otherwise keep refusing until its cached window (100 s here) ends.
#[test]
fn after_a_failover_resets_and_overrides_still_reach_every_instance() {
    let setup = SentinelSetup::start();
    let config = fleet_config(&setup);
    let (a, b) = (Tollgate::start(&config), Tollgate::start(&config));
    for tollgate in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(10), || tollgate
                .check(&[("x-user", "warm")])
                .header("ratelimit")
                .is_some()),
            "an instance never reached the master"
        );
    }
    let replica = setup.replica.port;
    setup.sentinel_cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
    for tollgate in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(30), || setup.master_port()
                == Some(replica)
                && tollgate
                    .check(&[("x-user", "after")])
                    .header("ratelimit")
                    .is_some()),
            "an instance did not follow the new master"
        );
    }

    // A reset on `a` reaches `b`'s deny cache through the channel on the new master.
    drain(&b, "alice");
    let reset = crate::support::http::admin_json(
        a.admin,
        "DELETE",
        "/v1/buckets/per-user?key=alice",
        Some(TOKEN),
        "",
    );
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert!(
        wait_until(Duration::from_secs(5), || b
            .check(&[("x-user", "alice")])
            .status
            == 200),
        "b kept refusing alice after the reset"
    );

    // An override written through `a` is polled by `b` from the new master.
    drain(&b, "bob");
    let put = crate::support::http::admin_json(
        a.admin,
        "PUT",
        "/v1/overrides/per-user?key=bob",
        Some(TOKEN),
        r#"{"unlimited": true}"#,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    assert!(
        wait_until(Duration::from_secs(5), || (0..5)
            .all(|_| b.check(&[("x-user", "bob")]).status == 200)),
        "b never applied the override written after the failover"
    );
}

/// Reservations and leases through Sentinel: taken by a check on one instance, settled and
/// given back on another, each once.
#[test]
fn reservations_and_leases_work_through_sentinel() {
    let setup = SentinelSetup::start();
    let config = fleet_config(&setup).replace(
        "[[limits]]",
        "[[limits]]\nname = \"slots\"\nconcurrency = 1\nkey = [\"header:x-user\"]\n\n\
         [[limits]]\nname = \"tokens\"\nrate = 1\nburst = 10\ncharge = \"report\"\n\
         reserve = 8\nkey = [\"header:x-user\"]\n\n[[limits]]",
    );
    let (a, b) = (Tollgate::start(&config), Tollgate::start(&config));
    for tollgate in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(10), || tollgate
                .check(&[("x-user", "warm")])
                .header("ratelimit")
                .is_some()),
            "an instance never reached the master"
        );
    }
    let first = a.check(&[("x-user", "alice")]);
    assert_eq!(first.status, 200, "{first:?}");
    let lease = first
        .header("x-tollgate-lease")
        .expect("a lease")
        .to_owned();
    let reservation = first
        .header("x-tollgate-reservation")
        .expect("a reservation")
        .to_owned();
    assert_eq!(
        b.check(&[("x-user", "alice")]).status,
        429,
        "the slot is held across instances"
    );
    let report = |body: serde_json::Value| {
        let answer = crate::support::http::admin_json(
            b.admin,
            "POST",
            "/report",
            Some(TOKEN),
            &body.to_string(),
        );
        assert_eq!(answer.status, 200, "{}", answer.body);
        serde_json::from_str::<serde_json::Value>(&answer.body).expect("JSON")
    };
    let both = report(serde_json::json!([
        { "lease": lease },
        { "reservation": reservation, "cost": 1 },
    ]));
    assert_eq!(both[0]["released"], true, "{both}");
    assert_eq!(both[1]["settled"], true, "{both}");
    let again = report(serde_json::json!({ "reservation": reservation, "cost": 1 }));
    assert_eq!(again["settled"], false, "{again}");
}

/// A `rediss://` store behind the TLS setup's sentinel, `store_extra` lines added to `[store]`.
fn tls_config(setup: &TlsSentinelSetup, store_extra: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"rediss://127.0.0.1:6379/0\"\ntimeout_ms = 200\n\
         sentinel = {{ master = \"{MASTER_NAME}\", urls = [\"redis://127.0.0.1:{}\"] }}\n\
         {store_extra}\n\
         [[limits]]\nname = \"per-user\"\nrate = 10\nburst = 100000\nkey = [\"header:x-user\"]\n",
        setup.sentinel_port
    )
}

/// `rediss://` in `store.url` with Sentinel: the master Sentinel names is reached over TLS.
/// The Redis crate speaks plain TCP to that master unless told otherwise, whatever the URL's
/// scheme: against a TLS port every call failed, and against a server taking both, checks
/// would have gone in clear.
#[test]
fn rediss_reaches_a_sentinel_managed_master_over_tls() {
    let setup = TlsSentinelSetup::start(false);
    let config = tls_config(&setup, "");
    let ca = setup.file("ca.pem");
    let tollgate = Tollgate::start_with_env(&config, &[("SSL_CERT_FILE", &ca)]);
    assert!(
        wait_until(Duration::from_secs(5), || decided(&tollgate)),
        "checks are decided by the master, over TLS"
    );
    assert_eq!(
        setup
            .master
            .cli(&["EXISTS", "tollgate:per-user:{alice}"])
            .trim(),
        "1"
    );
}

/// `store.tls` with Sentinel: a master that asks every client for a certificate, its CA known
/// to `store.tls` alone (the system's roots are emptied): with the client certificate, checks
/// are decided by that master; without it, nothing is.
#[test]
fn store_tls_reaches_a_sentinel_managed_master_that_asks_for_certificates() {
    let setup = TlsSentinelSetup::start(true);
    let config = |tls: &str| tls_config(&setup, &format!("tls = {{ {tls} }}\n"));
    let empty = setup.file("no-roots.pem");
    std::fs::write(&empty, "").expect("write an empty bundle");
    let no_system_roots = [("SSL_CERT_FILE", empty.as_str())];
    let ca = format!("ca_file = \"{}\"", setup.file("ca.pem"));
    let identity = format!(
        "{ca}, cert_file = \"{}\", key_file = \"{}\"",
        setup.file("cert.pem"),
        setup.file("key.pem")
    );

    let tollgate = Tollgate::start_with_env(&config(&identity), &no_system_roots);
    assert!(
        wait_until(Duration::from_secs(5), || decided(&tollgate)),
        "decided by the master, with the CA and the certificate of store.tls"
    );
    assert_eq!(
        setup
            .master
            .cli(&["EXISTS", "tollgate:per-user:{alice}"])
            .trim(),
        "1"
    );
    drop(tollgate);

    let ca_only = Tollgate::start_with_env(&config(&ca), &no_system_roots);
    assert!(
        !wait_until(Duration::from_secs(2), || decided(&ca_only)),
        "the master asks for a client certificate: without one nothing is decided"
    );
}

/// tollgate started as envoyproxy/ratelimit is, with its variables only: a 2/minute rule on
/// domain `shop`, key `user`, in the YAML directory, and the store `env` says.
fn erl_tollgate(env: &[(&str, &str)]) -> (TempDir, Tollgate) {
    let root = TempDir::new("erl-sentinel");
    let dir = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&dir).expect("make the YAML directory");
    std::fs::write(
        dir.join("shop.yaml"),
        "domain: shop\ndescriptors:\n  - key: user\n    \
         rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )
    .expect("write the YAML");
    let root_text = root.path().display().to_string();
    let grpc_port = free_port().to_string();
    let mut all = vec![
        ("RUNTIME_ROOT", root_text.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", grpc_port.as_str()),
    ];
    all.extend_from_slice(env);
    let tollgate = Tollgate::start_with_env("", &all);
    (root, tollgate)
}

/// envoyproxy/ratelimit's HTTP `POST /json` for `user`: its status (429 when over).
fn json_status(tollgate: &Tollgate, user: &str) -> u16 {
    let body = format!(
        r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    );
    let raw = format!(
        "POST /json HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut http = HttpClient::connect(tollgate.addr).expect("connect to tollgate");
    http.send_raw(raw.as_bytes()).expect("POST /json").status
}

/// Once decisions reach the master (`stored` sees a bucket of user `warm`), the 2/minute rule
/// holds through the master: OK, OK, then OVER_LIMIT; and the store is up.
fn assert_the_master_decides(tollgate: &Tollgate, stored: impl Fn() -> String) {
    assert!(
        wait_until(Duration::from_secs(10), || {
            json_status(tollgate, "warm");
            stored().contains("warm")
        }),
        "no decision reached the master"
    );
    let codes: Vec<u16> = (0..3).map(|_| json_status(tollgate, "alice")).collect();
    assert_eq!(
        codes,
        [200, 200, 429],
        "the third request is over the limit"
    );
    assert_eq!(tollgate.metric("tollgate_store_up"), 1.0);
}

/// envoyproxy/ratelimit's variables for a master that asks for a password: `REDIS_AUTH` is
/// the master's, not the sentinels' (it went to the sentinels, the master answered NOAUTH and
/// every check was admitted by `on_error`); `REDIS_SENTINEL_AUTH` is the sentinels' own.
#[test]
fn erl_redis_auth_reaches_a_sentinel_managed_master() {
    for sentinel_asks in [false, true] {
        let setup = AuthSentinelSetup::start(sentinel_asks);
        let url = format!("{MASTER_NAME},127.0.0.1:{}", setup.sentinel_port);
        let mut env = vec![
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", url.as_str()),
            ("REDIS_AUTH", MASTER_PASSWORD),
        ];
        if sentinel_asks {
            env.push(("REDIS_SENTINEL_AUTH", SENTINEL_PASSWORD));
        }
        let (_root, tollgate) = erl_tollgate(&env);
        assert_the_master_decides(&tollgate, || setup.master_cli(&["KEYS", "*"]));
    }
}

/// envoyproxy/ratelimit's `REDIS_TLS` and `REDIS_TLS_CACERT` with Sentinel: the master (and
/// the sentinel) are spoken to over TLS with that CA, and nothing reaches the master's
/// plaintext port but this test's own look (TLS went to the sentinels alone, and the master
/// got plaintext).
#[test]
fn erl_redis_tls_reaches_a_sentinel_managed_master() {
    let setup = TlsSentinelSetup::start(false);
    let url = format!("{MASTER_NAME},127.0.0.1:{}", setup.sentinel_tls_port);
    let ca = setup.file("ca.pem");
    let empty = setup.file("no-roots.pem");
    std::fs::write(&empty, "").expect("write an empty bundle");
    let (_root, tollgate) = erl_tollgate(&[
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", ca.as_str()),
        // The CA is trusted through REDIS_TLS_CACERT alone.
        ("SSL_CERT_FILE", empty.as_str()),
    ]);
    assert_the_master_decides(&tollgate, || setup.master.cli(&["KEYS", "*"]));
    let plain = format!("laddr=127.0.0.1:{} ", setup.master.port);
    let clients = setup.master.cli(&["CLIENT", "LIST"]);
    let in_clear: Vec<&str> = clients
        .lines()
        .filter(|line| line.contains(&plain) && !line.contains("cmd=client|list"))
        .collect();
    assert!(in_clear.is_empty(), "plaintext clients: {in_clear:?}");
    assert!(
        clients.lines().any(|line| !line.contains(&plain)),
        "tollgate's connections are on the TLS port: {clients}"
    );
}
