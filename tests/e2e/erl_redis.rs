//! tollgate started with envoyproxy/ratelimit's Redis variables only, against real Redis
//! setups that ask for what those variables give: a password on a Sentinel-managed master
//! (and on its sentinel), TLS on a Sentinel-managed master, a password on every Cluster node.
//! Each time a 2/minute rule holds through `POST /json` (OK, OK, OVER_LIMIT) and the store is
//! up: with the variables misread, every check was admitted by `on_error` instead.

use std::time::Duration;

use crate::support::chaos::Proxy;
use crate::support::cluster::{
    AuthSentinelSetup, RedisCluster, TlsSentinelSetup, MASTER_NAME, MASTER_PASSWORD,
    SENTINEL_PASSWORD,
};
use crate::support::{
    free_port, redis_cli, wait_until, HttpClient, RedisServer, TempDir, Tollgate,
};

/// tollgate started as envoyproxy/ratelimit is, with its variables only: a 2/minute rule on
/// domain `shop`, key `user`, in the YAML directory, and the store `env` says.
fn erl_tollgate(env: &[(&str, &str)]) -> (TempDir, Tollgate) {
    let (root, tollgate, _) = erl_tollgate_logged(env, false);
    (root, tollgate)
}

/// [`erl_tollgate`], with its stderr in a file when `logged` (returned).
fn erl_tollgate_logged(
    env: &[(&str, &str)],
    logged: bool,
) -> (TempDir, Tollgate, Option<std::path::PathBuf>) {
    let root = TempDir::new("erl-redis");
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
    if logged {
        let (tollgate, log) = Tollgate::start_logged("", &all);
        return (root, tollgate, Some(log));
    }
    (root, Tollgate::start_with_env("", &all), None)
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

/// Once decisions reach Redis (`stored` sees a bucket of user `warm`), the 2/minute rule
/// holds there: OK, OK, then OVER_LIMIT; and the store is up.
fn assert_redis_decides(tollgate: &Tollgate, stored: impl Fn() -> String) {
    assert!(
        wait_until(Duration::from_secs(10), || {
            json_status(tollgate, "warm");
            stored().contains("warm")
        }),
        "no decision reached Redis"
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
        assert_redis_decides(&tollgate, || setup.master_cli(&["KEYS", "*"]));
    }
}

/// Sentinels that ask for a password nobody gave (`REDIS_SENTINEL_AUTH` unset): the log and
/// the store errors name the sentinels' refusal, once, rather than "sentinels not answering",
/// which sent an operator looking for a network fault.
#[test]
fn a_sentinel_password_missing_is_named_in_the_log() {
    let setup = AuthSentinelSetup::start(true);
    let url = format!("{MASTER_NAME},127.0.0.1:{}", setup.sentinel_port);
    let env = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_AUTH", MASTER_PASSWORD),
    ];
    let (_root, tollgate, log) = erl_tollgate_logged(&env, true);
    let log = log.expect("a logged instance");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let named = wait_until(Duration::from_secs(10), || {
        json_status(&tollgate, "alice");
        read().to_ascii_lowercase().contains("auth")
    });
    let text = read();
    assert!(named, "no line names the sentinels' refusal:\n{text}");
    let lines = text
        .lines()
        .filter(|line| line.contains("sentinel: sentinels gave no master"))
        .count();
    assert_eq!(lines, 1, "the same refusal is logged once:\n{text}");
    assert!(
        !text.contains("sentinels not answering"),
        "the old, misleading wording:\n{text}"
    );
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
    assert_redis_decides(&tollgate, || setup.master.cli(&["KEYS", "*"]));
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

/// `REDIS_AUTH` with `REDIS_TYPE=cluster` reaches every node, as there: checks of keys spread
/// over the slots are decided on each of the three masters, all asking for the password.
#[test]
fn erl_redis_auth_reaches_every_cluster_node() {
    const PASSWORD: &str = "cluster-pw";
    let cluster = RedisCluster::start();
    let masters = cluster.master_ports();
    for node in &cluster.nodes {
        for (setting, value) in [("masterauth", PASSWORD), ("requirepass", PASSWORD)] {
            redis_cli(node.port, &["CONFIG", "SET", setting, value]).expect("set a password");
        }
    }
    let url: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port))
        .collect();
    let url = url.join(",");
    let (_root, tollgate) = erl_tollgate(&[
        ("REDIS_TYPE", "cluster"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_AUTH", PASSWORD),
    ]);
    let keys_on = |port: u16| {
        redis_cli(port, &["-a", PASSWORD, "--no-auth-warning", "KEYS", "*"]).unwrap_or_default()
    };
    assert_redis_decides(&tollgate, || masters.iter().map(|&p| keys_on(p)).collect());
    for user in 0..30 {
        assert_eq!(json_status(&tollgate, &format!("user-{user}")), 200);
    }
    for &port in &masters {
        assert!(
            keys_on(port).contains("user-"),
            "master {port} holds some of the buckets"
        );
    }
}

/// A Kubernetes Service whose endpoint moved from a master demoted to a replica to the
/// replica promoted in its place (played by a proxy: established connections stay on the old
/// pod, new ones reach the new): the connection answered `READONLY` is dropped and the address
/// resolved again at once, as envoyproxy/ratelimit does, so checks are decided by the store
/// again within a check or two, without a restart. Before, three `READONLY` answers opened the
/// breaker, and checks were answered per `on_error` while it stayed open.
#[test]
fn a_readonly_answer_renews_the_connection_behind_a_plain_url() {
    let a = RedisServer::start();
    let a_port = a.port.to_string();
    let b = RedisServer::start_with(&["--replicaof", "127.0.0.1", &a_port]);
    assert!(
        wait_until(Duration::from_secs(10), || b
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")),
        "the replica did not sync"
    );
    let service = Proxy::start(a.port);
    let url = format!("127.0.0.1:{}", service.port);
    let (_root, tollgate) = erl_tollgate(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url.as_str()),
        // Undecided checks are told apart: 503.
        ("TOLLGATE_STORE__ON_ERROR", "deny"),
    ]);
    // Every worker on a connection to A (distinct users: each first hit is a 200).
    let mut user = 0;
    let mut next = || {
        user += 1;
        json_status(&tollgate, &format!("u{user}"))
    };
    assert!(
        wait_until(Duration::from_secs(10), || next() == 200),
        "no decision reached Redis"
    );
    for _ in 0..10 {
        assert_eq!(next(), 200);
    }

    b.cli(&["REPLICAOF", "NO", "ONE"]);
    a.cli(&["REPLICAOF", "127.0.0.1", &b.port.to_string()]);
    service.redirect(b.port);
    assert!(
        wait_until(Duration::from_secs(10), || a
            .cli(&["INFO", "replication"])
            .contains("role:slave")),
        "A was not demoted"
    );
    let mut undecided = 0;
    let decided = wait_until(Duration::from_secs(10), || {
        let status = next();
        undecided += u32::from(status != 200);
        status == 200
    });
    assert!(
        decided,
        "not decided by the store again: {undecided} checks undecided"
    );
    assert!(
        undecided <= 2,
        "{undecided} checks undecided after the move"
    );
    for _ in 0..20 {
        assert_eq!(next(), 200, "a check undecided after the store came back");
    }
    assert!(b.cli(&["KEYS", "*"]).contains("u"), "no bucket on B");
    assert_eq!(tollgate.metric("tollgate_store_up"), 1.0);
}
