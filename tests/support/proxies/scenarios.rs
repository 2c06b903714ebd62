//! The stack around a proxy (Redis, tollgate, the counting backend) and the assertions every
//! proxy must pass at the client.

use std::net::{Ipv4Addr, SocketAddr};

use std::process::Stdio;
use std::time::Duration;

use super::backend::{burst_through, send, send_from, tally, Backend};
use super::{Nginx, Owned, Traefik};
use crate::support::{
    free_port, tollgate_command, wait_until, HttpClient, RedisServer, Response, TempDir, Tollgate,
};

/// What a test needs around a proxy: Redis, tollgate on it, the counting backend.
pub struct Stack<P> {
    pub proxy: P,
    pub backend: Backend,
    /// `None` once [`Stack::stop_tollgate`] ran.
    pub tollgate: Option<Tollgate>,
    /// Set by [`Stack::restart_tollgate`].
    restarted: Option<(Owned, TempDir)>,
    tollgate_addr: SocketAddr,
    tollgate_config: String,
    pub redis: RedisServer,
}

/// The address clients talk to.
pub trait Proxy {
    fn addr(&self) -> SocketAddr;
}

impl Proxy for Nginx {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Proxy for Traefik {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A Redis-backed tollgate config. The store budget is generous (1 s) and failures deny, so
/// on a loaded test machine a slow check shows up as a 503, never as an extra admission.
pub fn tollgate_config(redis: &RedisServer, on_error: &str, limits: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\non_error = \"{on_error}\"\n\n{limits}",
        redis.url()
    )
}

impl<P: Proxy> Stack<P> {
    pub fn start(
        on_error: &str,
        limits: &str,
        start_proxy: impl FnOnce(SocketAddr, SocketAddr) -> P,
    ) -> Stack<P> {
        let redis = RedisServer::start();
        let config = tollgate_config(&redis, on_error, limits);
        let tollgate = Tollgate::start(&config);
        let backend = Backend::start();
        let proxy = start_proxy(tollgate.addr, backend.addr);
        // Whatever a proxy's readiness probe charged or reached is forgotten.
        redis.cli(&["FLUSHALL"]);
        backend.forget();
        Stack {
            proxy,
            backend,
            tollgate_addr: tollgate.addr,
            tollgate: Some(tollgate),
            restarted: None,
            tollgate_config: config,
            redis,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        send(self.addr(), "GET", path, headers)
    }

    pub fn stop_tollgate(&mut self) {
        self.tollgate = None;
    }

    /// Starts tollgate again, with the same config, on the address the proxy knows (the
    /// harness's `Tollgate` always picks a new one).
    pub fn restart_tollgate(&mut self) {
        self.stop_tollgate();
        let dir = TempDir::new("tollgate-again");
        let config = dir.write("tollgate.toml", &self.tollgate_config);
        let child = tollgate_command()
            .arg("--config")
            .arg(&config)
            .env("TOLLGATE_LISTEN", self.tollgate_addr.to_string())
            .env(
                "TOLLGATE_ADMIN_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tollgate again");
        self.restarted = Some((Owned(child), dir));
        let addr = self.tollgate_addr;
        assert!(
            wait_until(Duration::from_secs(10), || {
                HttpClient::connect(addr)
                    .and_then(|mut c| c.get("/healthz", &[]))
                    .is_ok_and(|r| r.status == 200)
            }),
            "tollgate did not come back on {addr}"
        );
    }

    /// The keys in Redis, sorted.
    pub fn redis_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .redis
            .cli(&["--scan"])
            .lines()
            .map(str::to_string)
            .collect();
        keys.sort();
        keys
    }
}

pub const PER_IP_BURST_3: &str =
    "[[limits]]\nname = \"per-ip\"\nrate = 0.01\nburst = 3\nkey = [\"ip\"]\n";

pub const PER_KEY_BURST_2: &str =
    "[[limits]]\nname = \"per-key\"\nrate = 0.01\nburst = 2\nkey = [\"header:x-api-key\"]\n";

pub const PER_IP_BURST_2: &str =
    "[[limits]]\nname = \"per-ip\"\nrate = 0.01\nburst = 2\nkey = [\"ip\"]\n";

pub const API_WRITES_BURST_1: &str =
    "[[limits]]\nname = \"api-writes\"\nrate = 0.01\nburst = 1\nkey = [\"ip\"]\n\
     [limits.match]\nmethods = [\"POST\"]\npath_prefix = \"/api/\"\n";

pub fn assert_denied_with_quota_headers(response: &Response, limit: &str) {
    assert_eq!(response.status, 429, "{response:?}");
    let retry_after: u64 = response
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a numeric Retry-After: {response:?}"));
    assert!(retry_after >= 1, "{response:?}");
    let ratelimit = response.header("ratelimit").unwrap_or_default();
    assert!(
        ratelimit.starts_with(&format!("\"{limit}\";r=0;t=")),
        "RateLimit names the exhausted limit: {response:?}"
    );
    let policy = response.header("ratelimit-policy").unwrap_or_default();
    assert!(
        policy.starts_with(&format!("\"{limit}\";q=")),
        "{response:?}"
    );
    assert_eq!(
        response.header("x-ratelimit-remaining"),
        Some("0"),
        "{response:?}"
    );
}

/// The API-key limit: each key has its own bucket; requests without a key skip the limit.
pub fn assert_api_key_limit<P: Proxy>(stack: &Stack<P>) {
    let key_a = [("X-Api-Key", "key-a")];
    let statuses: Vec<u16> = (0..3).map(|_| stack.get("/items", &key_a).status).collect();
    assert_eq!(statuses, [200, 200, 429]);
    assert_denied_with_quota_headers(&stack.get("/items", &key_a), "per-key");
    assert_eq!(stack.get("/items", &[("X-Api-Key", "key-b")]).status, 200);
    let keyless = stack.get("/items", &[]);
    assert_eq!(keyless.status, 200);
    assert_eq!(
        keyless.header("ratelimit"),
        None,
        "no limit applied, no quota"
    );
    assert_eq!(
        stack.backend.count(),
        4,
        "2 for key-a, 1 for key-b, 1 without a key"
    );
}

/// The client-IP limit keys on the TCP client: X-Forwarded-For sent by that (untrusted) client
/// changes nothing, and another client address has its own bucket.
pub fn assert_client_ip_limit<P: Proxy>(stack: &Stack<P>) {
    let (client_a, client_b) = (Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3));
    let from = |source, spoof: &str| {
        send_from(
            source,
            stack.addr(),
            "GET",
            "/",
            &[("X-Forwarded-For", spoof)],
        )
        .expect("answered")
    };
    let statuses: Vec<u16> = ["6.6.6.1", "6.6.6.2", "6.6.6.3", "203.0.113.9, 6.6.6.4"]
        .iter()
        .map(|spoof| from(client_a, spoof).status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 429, 429],
        "a new X-Forwarded-For is not a new client"
    );
    assert_eq!(
        from(client_b, "6.6.6.1").status,
        200,
        "another address, its own bucket"
    );
    assert_eq!(stack.backend.count(), 3);
    // Two buckets, one per real client address; the spoofed ones never became keys. (Only
    // the address is looked for: the key layout around it belongs to the keys module.)
    let keys = stack.redis_keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys[0].contains("127.0.0.2") && keys[1].contains("127.0.0.3"),
        "{keys:?}"
    );
    assert!(
        !keys
            .iter()
            .any(|k| k.contains("6.6.6.") || k.contains("203.0.113.")),
        "{keys:?}"
    );
}

/// A limit matched on method and path prefix applies only there, and a client cannot move its
/// request out of it by sending forwarded headers of its own.
pub fn assert_path_and_method_limit<P: Proxy>(stack: &Stack<P>) {
    let post =
        |path: &str, headers: &[(&str, &str)]| send(stack.addr(), "POST", path, headers).status;
    assert_eq!(post("/api/items", &[]), 200);
    assert_eq!(post("/api/items", &[]), 429);
    let dodges = [
        ("X-Forwarded-Uri", "/public"),
        ("X-Original-URI", "/public"),
        ("X-Original-URL", "http://app.example/public"),
        ("X-Forwarded-Method", "GET"),
        ("X-Original-Method", "GET"),
    ];
    assert_eq!(
        post("/api/items?x=1", &dodges),
        429,
        "forwarded headers from the client are not believed"
    );
    assert_eq!(
        stack.get("/api/items", &[]).status,
        200,
        "GET is not matched"
    );
    assert_eq!(post("/public", &[]), 200, "another path is not matched");
    let seen = stack.backend.seen();
    let reached: Vec<(&str, &str)> = seen
        .iter()
        .map(|s| (s.method.as_str(), s.path.as_str()))
        .collect();
    assert_eq!(
        reached,
        [
            ("POST", "/api/items"),
            ("GET", "/api/items"),
            ("POST", "/public")
        ]
    );
}

/// N requests at once through two proxies (each with its own tollgate) sharing one Redis: no
/// more than the burst get through, and every other one is a clean 429.
pub fn assert_exact_across_two_proxies(addrs: [SocketAddr; 2], backend: &Backend, burst: usize) {
    let n = 3 * burst;
    let statuses = burst_through(&addrs, n, &[("X-Api-Key", "shared")]);
    let (ok, limited, other) = tally(&statuses);
    assert!(
        ok <= burst,
        "{ok} admitted with a burst of {burst}: {statuses:?}"
    );
    assert_eq!((ok, limited, other), (burst, n - burst, 0), "{statuses:?}");
    assert_eq!(backend.count(), burst);
}

pub fn shared_key_limit(burst: usize) -> String {
    format!("[[limits]]\nname = \"shared\"\nrate = 0.01\nburst = {burst}\nkey = [\"header:x-api-key\"]\n")
}

/// Two tiers keyed by API key, chosen by the `X-Plan` header the proxy (or the auth layer in
/// front of tollgate) sets.
pub const TIERS: &str = r#"
[[limits]]
name = "free"
rate = "1/min"
burst = 2
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["free", ""] }

[[limits]]
name = "enterprise"
rate = "1/min"
burst = 5
key = ["header:x-api-key"]
[limits.match]
headers = { "x-plan" = ["enterprise"] }
"#;

/// The API keys the proxy's plan data knows: `k-ent` is an enterprise customer.
pub const PLANS: &[(&str, &str)] = &[("k-ent", "enterprise"), ("k-free", "free")];

/// A client-sent `X-Plan` never buys a bigger limit: the plan is the one the proxy set.
pub fn assert_tier_header_is_set_by_the_proxy<P: Proxy>(stack: &Stack<P>) {
    let statuses = |headers: &[(&str, &str)], n: usize| -> Vec<u16> {
        (0..n).map(|_| stack.get("/", headers).status).collect()
    };
    let forged = [("x-api-key", "k-free"), ("x-plan", "enterprise")];
    assert_eq!(
        statuses(&forged, 4),
        [200, 200, 429, 429],
        "free, whatever it claims"
    );
    let denied = stack.get("/", &forged);
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"free\";q=2;w=120")
    );
    let unknown = [("x-api-key", "k-nobody"), ("x-plan", "enterprise")];
    assert_eq!(
        statuses(&unknown, 3),
        [200, 200, 429],
        "an unknown key is free"
    );
    let enterprise = [("x-api-key", "k-ent"), ("x-plan", "free")];
    assert_eq!(
        statuses(&enterprise, 6),
        [200, 200, 200, 200, 200, 429],
        "the customer's own plan, whatever it claims"
    );
    assert_eq!(stack.backend.count(), 2 + 2 + 5);
}
