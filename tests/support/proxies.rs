//! Real ingress proxies for end-to-end tests: nginx and Traefik from PATH, run from the shipped
//! configs in `config/` (only addresses are templated), in front of a [`Backend`] that counts
//! what reaches it. Clients can pick their loopback source address, so "two different client
//! IPs" is real, not a header.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

use super::{free_port, require_binary, wait_until, RedisServer, Response, TempDir, Tollgate};

/// The repository's root, where `config/` lives.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

pub fn read_shipped(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative))
        .unwrap_or_else(|e| panic!("read shipped file {relative}: {e}"))
}

/// Replaces each `from` with `to`, insisting that `from` occurs exactly once: if the shipped
/// file changes shape, the test must notice instead of silently testing something else.
pub fn template(text: &str, replacements: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    for (from, to) in replacements {
        let count = out.matches(from).count();
        assert_eq!(
            count, 1,
            "expected {from:?} exactly once in the shipped config"
        );
        out = out.replacen(from, to, 1);
    }
    out
}

/// One request the backend received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header names lowercase.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The application behind the proxy: answers every request `200 ok` and records it.
pub struct Backend {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Backend {
    pub fn start() -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind backend");
        let addr = listener.local_addr().expect("backend address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (seen, stop) = (seen2.clone(), stop2.clone());
                std::thread::spawn(move || serve_backend_connection(stream, &seen, &stop));
            }
        });
        Backend { addr, seen, stop }
    }

    /// How many requests reached the application so far.
    pub fn count(&self) -> usize {
        self.seen.lock().map_or(0, |s| s.len())
    }

    /// Forgets what was received so far (a proxy's readiness probe, say).
    pub fn forget(&self) {
        if let Ok(mut list) = self.seen.lock() {
            list.clear();
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Keep-alive HTTP/1.1: reads requests (draining any Content-Length body) and answers each.
fn serve_backend_connection(stream: TcpStream, seen: &Mutex<Vec<Seen>>, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while !stop.load(Ordering::SeqCst) {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let length: u64 = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let _ = std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink());
        let close = headers
            .iter()
            .any(|(n, v)| n == "connection" && v.eq_ignore_ascii_case("close"));
        if let Ok(mut list) = seen.lock() {
            list.push(Seen {
                method: method.to_string(),
                path: path.to_string(),
                headers,
            });
        }
        let answer =
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 8\r\n\r\nbackend\n";
        if writer.write_all(answer.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// One request on a fresh connection from `source` (any 127.x.y.z address: all of 127/8 is
/// loopback on Linux), with `Connection: close`; the whole answer is read.
pub fn send_from(
    source: Ipv4Addr,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(IpAddr::V4(source), 0).into())?;
    socket.connect_timeout(&addr.into(), Duration::from_secs(2))?;
    let mut stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n");
    for (name, value) in headers {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" || method == "PUT" {
        raw.push_str("Content-Length: 4\r\n\r\nbody");
    } else {
        raw.push_str("\r\n");
    }
    stream.write_all(raw.as_bytes())?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes)?;
    let _ = stream.shutdown(Shutdown::Both);
    parse_response(&bytes)
}

/// `send_from` the default client address, 127.0.0.1.
pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    send_from(Ipv4Addr::LOCALHOST, addr, method, path, headers)
        .unwrap_or_else(|e| panic!("{method} {path} via {addr}: {e}"))
}

fn parse_response(bytes: &[u8]) -> std::io::Result<Response> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| invalid("no header end"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: body.to_string(),
    })
}

/// Waits until something accepts TCP connections on `addr`.
fn wait_listening(addr: SocketAddr, within: Duration) -> bool {
    wait_until(within, || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    })
}

/// A child process killed (by its own handle) and reaped on drop.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx running `config/nginx/tollgate.conf` with its three addresses templated, inside a
/// minimal main config that keeps every file (pid, logs, temp paths) in a temp dir.
pub struct Nginx {
    pub addr: SocketAddr,
    _child: Owned,
    dir: TempDir,
}

impl Nginx {
    /// The shipped `config/nginx/tollgate.conf`, pointed at `tollgate` and `backend`.
    pub fn start(tollgate: SocketAddr, backend: SocketAddr) -> Nginx {
        Nginx::start_site(|listen| {
            template(
                &read_shipped("config/nginx/tollgate.conf"),
                &[
                    ("server 127.0.0.1:8080 ", &format!("server {tollgate} ")),
                    ("server 127.0.0.1:3000;", &format!("server {backend};")),
                    ("listen 80;", &format!("listen {listen};")),
                ],
            )
        })
    }

    /// nginx serving the http-context config `site(listen address)`.
    pub fn start_site(site: impl FnOnce(SocketAddr) -> String) -> Nginx {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let dir = TempDir::new("nginx");
        dir.write("site.conf", &site(addr));
        let d = dir.path().display();
        // No `user`: as root, workers drop to nobody, and nginx chowns the temp paths it creates.
        let main = format!(
            "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n\
               client_body_temp_path {d}/client_body;\n  proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
               include {d}/site.conf;\n}}\n"
        );
        let conf = dir.write("nginx.conf", &main);
        let child = Command::new(require_binary("nginx"))
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nginx");
        let nginx = Nginx {
            addr,
            _child: Owned(child),
            dir,
        };
        assert!(
            wait_listening(addr, Duration::from_secs(10)),
            "nginx did not come up on {addr}: {}",
            nginx.error_log()
        );
        nginx
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

/// Traefik running `config/traefik/traefik.yml` (static) and `config/traefik/dynamic.yml`
/// (file provider) with their addresses templated.
pub struct Traefik {
    pub addr: SocketAddr,
    _child: Owned,
    _dir: TempDir,
}

impl Traefik {
    pub fn start(tollgate: SocketAddr, backend: SocketAddr) -> Traefik {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let dir = TempDir::new("traefik");
        let dynamic = template(
            &read_shipped("config/traefik/dynamic.yml"),
            &[
                (
                    "http://127.0.0.1:8080/check",
                    &format!("http://{tollgate}/check"),
                ),
                ("http://127.0.0.1:3000", &format!("http://{backend}")),
            ],
        );
        let dynamic_path = dir.write("dynamic.yml", &dynamic);
        let static_config = template(
            &read_shipped("config/traefik/traefik.yml"),
            &[
                ("address: \":80\"", &format!("address: \"{addr}\"")),
                (
                    "filename: /etc/traefik/dynamic.yml",
                    &format!("filename: {}", dynamic_path.display()),
                ),
            ],
        );
        let static_path = dir.write("traefik.yml", &static_config);
        let child = Command::new(require_binary("traefik"))
            .arg(format!("--configFile={}", static_path.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start traefik");
        let traefik = Traefik {
            addr,
            _child: Owned(child),
            _dir: dir,
        };
        assert!(
            wait_listening(addr, Duration::from_secs(20)),
            "traefik did not come up on {addr}"
        );
        // The entry point listens before the file provider's routes load (404 until then).
        assert!(
            wait_until(Duration::from_secs(20), || {
                send_from(Ipv4Addr::new(127, 0, 0, 254), addr, "GET", "/ready", &[])
                    .is_ok_and(|r| r.status != 404)
            }),
            "traefik did not load its routes"
        );
        traefik
    }
}

/// Counts the statuses of `responses`: (2xx, 429, other).
pub fn tally(statuses: &[u16]) -> (usize, usize, usize) {
    let ok = statuses.iter().filter(|s| (200..300).contains(*s)).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    (ok, limited, statuses.len() - ok - limited)
}

/// Fires `n` requests at once, spread over `addrs`, each from its own thread and connection;
/// returns the statuses.
pub fn burst_through(addrs: &[SocketAddr], n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let owned: Vec<(String, String)> = headers
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (addr, barrier, owned) = (addrs[i % addrs.len()], barrier.clone(), owned.clone());
            std::thread::spawn(move || {
                let headers: Vec<(&str, &str)> = owned
                    .iter()
                    .map(|(a, b)| (a.as_str(), b.as_str()))
                    .collect();
                barrier.wait();
                send_from(Ipv4Addr::LOCALHOST, addr, "GET", "/burst", &headers)
                    .map_or(0, |r| r.status)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap_or(0)).collect()
}

/// What a test needs around a proxy: Redis, tollgate on it, the counting backend.
pub struct Stack<P> {
    pub proxy: P,
    pub backend: Backend,
    /// `None` once [`Stack::stop_tollgate`] ran.
    pub tollgate: Option<Tollgate>,
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
        let tollgate = Tollgate::start(&tollgate_config(&redis, on_error, limits));
        let backend = Backend::start();
        let proxy = start_proxy(tollgate.addr, backend.addr);
        // Whatever a proxy's readiness probe charged or reached is forgotten.
        redis.cli(&["FLUSHALL"]);
        backend.forget();
        Stack {
            proxy,
            backend,
            tollgate: Some(tollgate),
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
    assert_eq!(
        stack.redis_keys(),
        ["tollgate:per-ip:127.0.0.2", "tollgate:per-ip:127.0.0.3"],
        "buckets are keyed on the real client addresses only"
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
