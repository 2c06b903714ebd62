//! tollgate behind Redis Sentinel (1 master, 1 replica, 3 sentinels): it follows the master
//! through a `SENTINEL FAILOVER` and through the death of the master, without a restart, and
//! afterwards every check is decided by the store again (not by `on_error`).

use std::time::{Duration, Instant};

use crate::support::chaos::Proxy;
use crate::support::cluster::{SentinelSetup, TlsSentinelSetup, MASTER_NAME};
use crate::support::latency::LatencyProxy;
use crate::support::{free_port, redis_cli, wait_until, HttpClient, Tollgate, SHORT_TIMINGS};

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
    let tokens = redis_cli(master, &["GET", "tollgate:per-user:{alice}"]).unwrap_or_default();
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
            let info = redis_cli(setup.master.port, &["INFO", "replication"]).unwrap_or_default();
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
    // Until Sentinel turns the old master into a replica (when it next looks at it: up to
    // seconds on a busy machine), the old master still takes writes, and an instance that has
    // not yet asked the sentinels again (every second) still writes there: a write made then
    // is lost when the old master resynchronises. That is Sentinel's own window
    // (docs/FAILURE-MODES.md); this test is about what comes after it.
    let switched = Instant::now();
    // Sentinel turns the old master into a replica and drops its clients in one go (`CLIENT
    // KILL TYPE normal`): a connection closed under this look means "not yet", not a failure.
    let demoted =
        || redis_cli(setup.master.port, &["ROLE"]).is_ok_and(|role| role.starts_with("slave"));
    assert!(
        wait_until(Duration::from_secs(30), || setup.master_port()
            == Some(replica)
            && demoted()),
        "Sentinel never turned the old master into a replica"
    );
    eprintln!(
        "the old master was a replica {:?} after SENTINEL FAILOVER",
        switched.elapsed()
    );
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

/// The status and body of `/readyz`.
fn readyz(tollgate: &Tollgate) -> (u16, String) {
    let answer = HttpClient::connect(tollgate.admin)
        .and_then(|mut c| c.get("/readyz", &[]))
        .expect("readyz answered");
    (answer.status, answer.body)
}

/// As envoyproxy/ratelimit, which serves only once Redis answers: while the sentinels have
/// named no master, tollgate is not ready (whatever `on_error`), the checks that come anyway
/// are answered per `on_error` without opening the breaker, and once the master is known the
/// first check is the store's, not `on_error`'s.
#[test]
fn not_ready_until_the_master_is_known_and_the_first_check_is_the_stores() {
    let setup = SentinelSetup::start();
    // The sentinels' address leads nowhere until the proxy is pointed at one.
    let sentinel = Proxy::start(free_port());
    let config = format!(
        "[store]\nbackend = \"redis\"\ntimeout_ms = 200\non_error = \"allow\"\n\
         sentinel = {{ master = \"{MASTER_NAME}\", urls = [\"redis://127.0.0.1:{}\"] }}\n\n\
         [[limits]]\nname = \"per-user\"\nrate = 10\nburst = 100000\nkey = [\"header:x-user\"]\n",
        sentinel.port
    );
    let (tollgate, log) = Tollgate::start_logged(&config, &[SHORT_TIMINGS]);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(10), || read()
            .contains("sentinels gave no master")),
        "no discovery failed: {}",
        read()
    );
    let (status, body) = readyz(&tollgate);
    assert_eq!(status, 503, "ready before the master is known: {body}");
    // Checks meanwhile: on_error answers them, and the breaker stays closed (no store failed).
    for _ in 0..5 {
        let r = tollgate.check(&[("x-user", "early")]);
        assert_eq!((r.status, r.header("ratelimit")), (200, None));
    }
    assert_eq!(tollgate.metric("tollgate_store_up"), 1.0);
    assert!(!read().contains("circuit open"), "{}", read());

    sentinel.redirect(setup.sentinel_ports[0]);
    assert!(
        wait_until(Duration::from_secs(10), || readyz(&tollgate).0 == 200),
        "never ready: {:?}",
        readyz(&tollgate)
    );
    let errors = tollgate.metric(ERROR_ALLOWED);
    assert!(
        decided(&tollgate),
        "the first check once ready was on_error's"
    );
    assert_eq!(tollgate.metric(ERROR_ALLOWED), errors);
    assert_eq!(tollgate.metric(ALLOWED), 1.0);
}

/// A check that comes while the sentinels are still being asked for the first time waits for
/// their answer (within `timeout_ms`) and is decided by the store: the sentinel is behind a
/// link of 50 ms each way, so the first discovery takes some hundreds of milliseconds, and
/// the check is sent as soon as tollgate serves.
#[test]
fn a_check_before_the_first_discovery_waits_for_the_master() {
    let setup = SentinelSetup::start();
    let slow = LatencyProxy::start(setup.sentinel_ports[0], Duration::from_millis(50));
    let config = format!(
        "[store]\nbackend = \"redis\"\ntimeout_ms = 3000\non_error = \"allow\"\n\
         sentinel = {{ master = \"{MASTER_NAME}\", urls = [\"redis://127.0.0.1:{}\"] }}\n\n\
         [[limits]]\nname = \"per-user\"\nrate = 10\nburst = 100000\nkey = [\"header:x-user\"]\n",
        slow.port
    );
    let tollgate = Tollgate::start(&config);
    assert!(decided(&tollgate), "the first check was on_error's");
    assert_eq!(tollgate.metric(ERROR_ALLOWED), 0.0);
}
