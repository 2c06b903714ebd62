//! Security properties: a client cannot choose another client's bucket through
//! X-Forwarded-For, `/metrics` stays off the public port, the Redis password never shows in
//! logs, `validate` output, readiness answers or error messages, and `rediss://` works against
//! a TLS Redis with a certificate the operator trusts (and only then).

use std::time::Duration;

use crate::support::chaos::{self, redis_cli_auth};
use crate::support::fixtures::A_ZERO_RATE;
use crate::support::{
    make_certificates, make_client_certificate, wait_until, RedisServer, TempDir, Tollgate,
};

const LIMITS: &str = "[[limits]]\nname = \"per-ip\"\nrate = 0.1\nburst = 3\nkey = [\"ip\"]\n";

fn redis_keys(redis: &RedisServer) -> Vec<String> {
    redis
        .cli(&["--scan", "--pattern", "tollgate:per-ip:*"])
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn forwarded_for_from_an_untrusted_peer_cannot_choose_a_bucket() {
    let redis = RedisServer::start();
    // Loopback is not a trusted proxy here: the test client is an ordinary client.
    let config = crate::support::redis_config(
        &redis,
        "",
        &format!("[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\n\n{LIMITS}"),
    );
    let tollgate = Tollgate::in_process(&config);
    let mut client = tollgate.client();
    let statuses: Vec<u16> = (0..5)
        .map(|_| {
            client
                .get("/check", &[("X-Forwarded-For", "198.51.100.7")])
                .expect("answer")
                .status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429], "the peer's own bucket");
    assert_eq!(redis_keys(&redis), ["tollgate:per-ip:{127.0.0.1}"]);
}

#[test]
fn a_forged_first_hop_behind_a_trusted_proxy_charges_the_real_client() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::in_process(&crate::support::redis_config(&redis, "", LIMITS));
    let mut client = tollgate.client();
    // The attacker (203.0.113.50) sends "X-Forwarded-For: <victim>"; its proxy appends the
    // address it saw. Right to left, the first untrusted hop is the attacker.
    for _ in 0..5 {
        client
            .get(
                "/check",
                &[("X-Forwarded-For", "198.51.100.7, 203.0.113.50")],
            )
            .expect("answer");
    }
    let victim = client
        .get("/check", &[("X-Forwarded-For", "198.51.100.7")])
        .expect("answer");
    assert_eq!(victim.status, 200);
    assert_eq!(
        victim.header("x-ratelimit-remaining"),
        Some("2"),
        "victim untouched"
    );
    let mut keys = redis_keys(&redis);
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:per-ip:{198.51.100.7}",
            "tollgate:per-ip:{203.0.113.50}"
        ]
    );
}

const PASSWORD: &str = "s3cret-Pa55word";
const WRONG: &str = "wr0ng-Pa55word";

fn assert_no_secret(what: &str, text: &str) {
    for secret in [PASSWORD, WRONG] {
        assert!(!text.contains(secret), "{what} shows a password:\n{text}");
    }
}

/// Runs tollgate at `RUST_LOG=debug` on `url`, sends checks and asks `/readyz`; returns the
/// log and whether Redis decided the checks.
fn run_with_url(url: &str, redis: Option<&mut RedisServer>) -> (String, bool, String) {
    let config =
        format!("[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout_ms = 100\n\n{LIMITS}");
    let (tollgate, log) = chaos::tollgate_logged(&config, &[("RUST_LOG", "debug")]);
    let decided = wait_until(Duration::from_secs(2), || {
        tollgate
            .check(&[("X-Forwarded-For", "192.0.2.1")])
            .header("ratelimit")
            .is_some()
    });
    if let Some(redis) = redis {
        redis.kill();
    }
    for _ in 0..10 {
        tollgate.check(&[("X-Forwarded-For", "192.0.2.2")]);
    }
    let ready = tollgate.client().get("/readyz", &[]).expect("readyz").body;
    // The log lives in the tollgate's scratch directory: read it before that goes.
    let log = std::fs::read_to_string(log).unwrap_or_default();
    drop(tollgate);
    (log, decided, ready)
}

#[test]
fn the_redis_password_never_shows() {
    let mut redis = RedisServer::start();
    let port = redis.port;
    // Set after start: the harness checks readiness with an unauthenticated PING.
    redis.cli(&["CONFIG", "SET", "requirepass", PASSWORD]);
    let good = format!("redis://:{PASSWORD}@127.0.0.1:{port}/0");
    let wrong = format!("redis://:{WRONG}@127.0.0.1:{port}/0");

    let (log, decided, ready) = run_with_url(&good, None);
    assert!(decided, "the right password reaches Redis");
    assert_eq!(
        redis_cli_auth(port, PASSWORD, &["EXISTS", "tollgate:per-ip:{192.0.2.1}"]).trim(),
        "1"
    );
    assert!(
        log.contains("redis://:***@127.0.0.1"),
        "the URL is logged redacted:\n{log}"
    );
    assert_no_secret("log (right password)", &log);
    assert_no_secret("/readyz (right password)", &ready);

    let (log, decided, ready) = run_with_url(&wrong, None);
    assert!(!decided, "a wrong password must not reach Redis");
    assert!(
        log.contains("circuit open") && log.contains("authentication failed"),
        "the failure is logged as what it is:\n{log}"
    );
    assert_no_secret("log (wrong password)", &log);
    assert_no_secret("/readyz (wrong password)", &ready);

    let (log, _, ready) = run_with_url(&good, Some(&mut redis));
    assert_no_secret("log (Redis down)", &log);
    assert_no_secret("/readyz (Redis down)", &ready);

    // `validate`, on a good config and on configs refused for another reason.
    let dir = TempDir::new("validate");
    for (name, body) in [
        ("ok.toml", format!("[store]\nbackend = \"redis\"\nurl = \"{good}\"\n")),
        (
            "bad-url.toml",
            format!("[store]\nbackend = \"redis\"\nurl = \"redis://:{PASSWORD}@127.0.0.1:notaport/0\"\n"),
        ),
        (
            "bad-limit.toml",
            format!("[store]\nbackend = \"redis\"\nurl = \"{good}\"\n{A_ZERO_RATE}"),
        ),
    ] {
        let path = dir.write(name, &body);
        let path = path.to_string_lossy();
        let (code, stdout, stderr) =
            chaos::run_tollgate(&["validate", "--config", &path], &[("RUST_LOG", "debug")]);
        assert_eq!(code, Some(if name == "ok.toml" { 0 } else { 2 }), "{name}: {stderr}");
        assert_no_secret(&format!("validate {name}"), &(stdout + &stderr));
    }
    // The environment override is a common way to pass the URL.
    let (code, stdout, stderr) = chaos::run_tollgate(
        &["validate"],
        &[
            ("TOLLGATE_STORE__BACKEND", "redis"),
            ("TOLLGATE_STORE__URL", &good),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_no_secret("validate (environment)", &(stdout + &stderr));
}

#[test]
fn rediss_reaches_a_tls_redis_only_with_a_trusted_certificate() {
    let dir = TempDir::new("tls");
    make_certificates(dir.path());
    let tls_port = crate::support::free_port();
    let ca = dir.path().join("ca.pem").to_string_lossy().into_owned();
    let redis = RedisServer::start_tls(dir.path(), tls_port, false);
    let config = format!(
        "[store]\nbackend = \"redis\"\nurl = \"rediss://127.0.0.1:{tls_port}/0\"\ntimeout_ms = 200\n\n{LIMITS}"
    );
    let decided = |tollgate: &Tollgate| {
        wait_until(Duration::from_secs(2), || {
            tollgate
                .check(&[("X-Forwarded-For", "192.0.2.9")])
                .header("ratelimit")
                .is_some()
        })
    };

    // The CA is trusted through SSL_CERT_FILE, which the platform certificate loader honours.
    let trusted = Tollgate::start_with_env(&config, &[("SSL_CERT_FILE", &ca)]);
    assert!(decided(&trusted), "rediss:// with a trusted certificate");
    assert_eq!(
        redis.cli(&["EXISTS", "tollgate:per-ip:{192.0.2.9}"]).trim(),
        "1"
    );
    drop(trusted);

    // Not trusted: the certificate is refused and tollgate answers per on_error.
    let empty = dir.write("empty.pem", "");
    let untrusted =
        Tollgate::start_with_env(&config, &[("SSL_CERT_FILE", &empty.to_string_lossy())]);
    assert!(
        !decided(&untrusted),
        "an untrusted certificate must be refused"
    );
    assert_eq!(untrusted.check(&[]).status, 200, "on_error = allow");
}

/// `store.tls`: a Redis whose CA is nobody's but ours and which asks every client for a
/// certificate (`tls-auth-clients yes`). The CA alone does not get in; with the client
/// certificate the checks are decided there. The system's roots play no part.
#[test]
fn store_tls_brings_its_own_ca_and_client_certificate() {
    let dir = TempDir::new("store-tls");
    make_certificates(dir.path());
    make_client_certificate(dir.path(), "client", "DNS:tollgate.example");
    let tls_port = crate::support::free_port();
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let ca = path("ca.pem");
    let redis = RedisServer::start_tls(dir.path(), tls_port, true);
    let empty = dir.write("empty.pem", "");
    let no_system_roots = [("SSL_CERT_FILE", empty.to_str().expect("a UTF-8 path"))];
    let config = |tls: &str| {
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"rediss://127.0.0.1:{tls_port}/0\"\ntimeout_ms = 200\ntls = {{ {tls} }}\n\n{LIMITS}"
        )
    };
    let decided = |tollgate: &Tollgate| {
        wait_until(Duration::from_secs(2), || {
            tollgate
                .check(&[("X-Forwarded-For", "192.0.2.7")])
                .header("ratelimit")
                .is_some()
        })
    };

    let identity = format!(
        "ca_file = \"{ca}\", cert_file = \"{}\", key_file = \"{}\"",
        path("client.pem"),
        path("client.key")
    );
    let with_identity = Tollgate::start_with_env(&config(&identity), &no_system_roots);
    assert!(decided(&with_identity), "the CA and a client certificate");
    assert_eq!(
        redis.cli(&["EXISTS", "tollgate:per-ip:{192.0.2.7}"]).trim(),
        "1"
    );
    drop(with_identity);

    let ca_only =
        Tollgate::start_with_env(&config(&format!("ca_file = \"{ca}\"")), &no_system_roots);
    assert!(
        !decided(&ca_only),
        "Redis asks for a client certificate: without one nothing is decided"
    );
    assert_eq!(ca_only.check(&[]).status, 200, "on_error = allow");
}
