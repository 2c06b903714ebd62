//! The sidecar nginx config in a real nginx: tollgate's 429 and headers reach the client, and
//! a 503 when Redis is down and `on_error` denies.

use super::*;
use crate::support::wait_until;

/// An nginx owned by one test, stopped on drop; its scratch directory goes after it.
struct Nginx {
    child: Child,
    _dir: TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: the master must take its workers down with it.
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        if !wait_until(Duration::from_secs(5), || {
            self.child.try_wait().is_ok_and(|s| s.is_some())
        }) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The shipped sidecar nginx.conf, pointed at test ports and a scratch directory.
fn sidecar_nginx_conf(port: u16, tollgate: &Tollgate, app: u16, dir: &TempDir) -> String {
    let mut conf = read("k8s/sidecar/nginx.conf");
    for (from, to) in [
        (
            "listen 8000;".to_string(),
            format!("listen 127.0.0.1:{port};"),
        ),
        (
            "server 127.0.0.1:8080;".into(),
            format!("server {};", tollgate.addr),
        ),
        (
            "server app.default.svc.cluster.local:80;".into(),
            format!("server 127.0.0.1:{app};"),
        ),
        ("/tmp/".into(), format!("{}/", dir.path().display())),
        ("access_log /dev/stdout;".into(), "access_log off;".into()),
    ] {
        assert!(conf.contains(&from), "nginx.conf no longer has {from:?}");
        conf = conf.replace(&from, &to);
    }
    conf
}

/// The shipped nginx.conf in front of `tollgate`, with a `200 ok` application behind it.
fn start_sidecar_nginx(tollgate: &Tollgate) -> (Nginx, std::net::SocketAddr) {
    let dir = TempDir::new("nginx");
    let port = crate::support::free_port();
    let conf = dir.write(
        "nginx.conf",
        &sidecar_nginx_conf(port, tollgate, deploy::ok_upstream(), &dir),
    );
    let child = Command::new("nginx")
        .args(["-e", "stderr", "-g", "daemon off;", "-p"])
        .arg(dir.path())
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .spawn()
        .expect("nginx is installed (scripts/test.sh)");
    let nginx = Nginx { child, _dir: dir };
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        HttpClient::connect(addr).is_ok()
    }));
    (nginx, addr)
}

#[test]
fn the_sidecar_nginx_conf_hands_tollgate_429_and_headers_to_the_client() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start_with_env(
        &read("k8s/base/tollgate.toml"),
        &[("TOLLGATE_STORE__URL", &redis.url())],
    );
    let (_nginx, addr) = start_sidecar_nginx(&tollgate);

    let mut client = HttpClient::connect(addr).unwrap();
    let first = client.get("/orders?page=2", &[]).unwrap();
    assert_eq!((first.status, first.body.as_str()), (200, "ok"));
    assert!(first
        .header("ratelimit")
        .unwrap()
        .starts_with("\"per-ip\";r=99;"));
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"per-ip\";q=100;w=5")
    );
    assert_eq!(first.header("x-ratelimit-limit"), Some("100"));

    let denied = (0..300)
        .map(|_| client.get("/orders", &[]).unwrap())
        .find(|r| r.status != 200)
        .expect("the burst of 100 runs out");
    // A real 429, not nginx's 500.
    assert_denied(&denied, Some(1));
    assert!(denied
        .header("ratelimit")
        .unwrap()
        .starts_with("\"per-ip\";r=0;"));
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"per-ip\";q=100;w=5")
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));

    // tollgate refuses with the 403 the config asks for, which nginx passes on without
    // turning keep-alive off: the same connection goes on. nginx forwards the client's
    // address: another client has its own bucket.
    assert_ne!(denied.header("connection"), Some("close"));
    // Answered on the same connection: 429, or 200 if the bucket refilled a token (one per
    // 50 ms) before this request reached it.
    let next = client.get("/orders", &[]).unwrap().status;
    assert!(
        matches!(next, 429 | 200),
        "the same connection goes on: {next}"
    );
    let other = HttpClient::connect(addr)
        .unwrap()
        .get("/orders", &[("x-forwarded-for", "198.51.100.9")])
        .unwrap();
    assert_eq!(other.status, 200);
    assert!(other
        .header("ratelimit")
        .unwrap()
        .starts_with("\"per-ip\";r=99;"));
    assert!(tollgate.metric("tollgate_checks_total{result=\"denied\"}") >= 1.0);
}

#[test]
fn the_sidecar_nginx_conf_hands_a_503_to_the_client_when_redis_is_down_and_on_error_denies() {
    let mut redis = RedisServer::start();
    let tollgate = Tollgate::start_with_env(
        &read("k8s/base/tollgate.toml"),
        &[
            ("TOLLGATE_STORE__URL", &redis.url()),
            ("TOLLGATE_STORE__ON_ERROR", "deny"),
        ],
    );
    let (_nginx, addr) = start_sidecar_nginx(&tollgate);
    // The store decides once it answers within the image's 50 ms deadline: on a loaded
    // machine the first call (a fresh connection) can take longer, and on_error denies it.
    assert!(
        wait_until(Duration::from_secs(10), || {
            HttpClient::connect(addr)
                .and_then(|mut client| client.get("/", &[]))
                .is_ok_and(|answer| answer.status == 200)
        }),
        "the store never admitted a request"
    );

    redis.kill();
    let refused = HttpClient::connect(addr).unwrap().get("/", &[]).unwrap();
    assert_eq!(refused.status, 503, "fail closed, visibly, not nginx's 500");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(refused.header("ratelimit").is_none());
}
