//! Fault injection and measurement: a TCP proxy that can freeze like a Redis host that vanished
//! without a reset, a listener whose backlog is full, Redis on a chosen port, tollgate with its
//! stderr captured, and a load loop that times every single request.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{tollgate_command, HttpClient, RedisServer, TempDir, Tollgate};

/// Redis on a port chosen by the caller (to take over a black-holed address).
pub fn redis_on_port(port: u16, extra_args: &[&str]) -> RedisServer {
    let mut server = RedisServer {
        port,
        child: None,
        extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
        dir: TempDir::new("redis"),
    };
    server.spawn();
    server
}

/// A loopback TCP proxy in front of Redis. `freeze` makes it a black hole: established
/// connections stop carrying bytes for good (no FIN, no RST, like a host that lost power) and new
/// connections are accepted and never answered. `thaw` forwards new connections again.
/// `redirect` sends new connections to another port while established ones keep theirs, as a
/// Kubernetes Service does when its endpoint moves to another pod.
pub struct Proxy {
    pub port: u16,
    shared: Arc<ProxyShared>,
    acceptor: Option<JoinHandle<()>>,
}

struct ProxyShared {
    upstream: AtomicU16,
    frozen: AtomicBool,
    /// Bumped by every freeze; a connection older than the last freeze stays dead.
    generation: AtomicU64,
    stop: AtomicBool,
    held: Mutex<Vec<TcpStream>>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let shared = Arc::new(ProxyShared {
            upstream: AtomicU16::new(upstream),
            frozen: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
        });
        let accept_shared = shared.clone();
        let acceptor = std::thread::spawn(move || accept_loop(listener, accept_shared));
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn freeze(&self) {
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        self.shared.frozen.store(true, Ordering::SeqCst);
    }

    pub fn thaw(&self) {
        self.shared.frozen.store(false, Ordering::SeqCst);
    }

    /// New connections go to `upstream` from now on; established ones stay where they are.
    pub fn redirect(&self, upstream: u16) {
        self.shared.upstream.store(upstream, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<ProxyShared>) {
    let mut pumps = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                let _ = client.set_nonblocking(false);
                if shared.frozen.load(Ordering::SeqCst) {
                    shared.held.lock().unwrap().push(client);
                    continue;
                }
                let upstream = shared.upstream.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue; // dropping the client: a refused upstream looks like a reset
                };
                let generation = shared.generation.load(Ordering::SeqCst);
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let shared = shared.clone();
                    pumps.push(std::thread::spawn(move || {
                        pump(from, to, generation, &shared)
                    }));
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    for pump in pumps {
        let _ = pump.join();
    }
}

/// Copies bytes one way until either side closes, the proxy stops, or a freeze makes this
/// connection a black hole (then it holds the sockets open, silent, until the proxy stops).
fn pump(mut from: TcpStream, mut to: TcpStream, generation: u64, shared: &ProxyShared) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(10)));
    let mut buf = [0u8; 16 * 1024];
    while !shared.stop.load(Ordering::SeqCst) {
        if shared.generation.load(Ordering::SeqCst) != generation {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if shared.generation.load(Ordering::SeqCst) != generation {
                    continue; // frozen mid-flight: these bytes vanish
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// A listening port whose accept queue is full and which never accepts: connection attempts
/// hang in SYN_SENT, as behind a firewall that drops packets.
pub struct FullBacklog {
    pub port: u16,
    _listener: socket2::Socket,
    _fillers: Vec<TcpStream>,
}

impl FullBacklog {
    /// On `port` (0: any free port), e.g. the port of a Redis just killed.
    pub fn on_port(port: u16) -> FullBacklog {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        socket.set_reuse_address(true).expect("SO_REUSEADDR");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        socket.bind(&addr.into()).expect("bind");
        socket.listen(0).expect("listen");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .expect("local addr")
            .port();
        let target: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut fillers = Vec::new();
        // Fill the queue until a connection attempt no longer completes.
        while fillers.len() < 16 {
            match TcpStream::connect_timeout(&target, Duration::from_millis(200)) {
                Ok(stream) => fillers.push(stream),
                Err(_) => break,
            }
        }
        assert!(
            TcpStream::connect_timeout(&target, Duration::from_millis(200)).is_err(),
            "the backlog of port {port} should be full"
        );
        FullBacklog {
            port,
            _listener: socket,
            _fillers: fillers,
        }
    }
}

/// Starts tollgate with its stderr in a file (at `info`, so the breaker's transitions show),
/// so a test can read the logs.
pub fn tollgate_logged(config: &str, env: &[(&str, &str)]) -> (Tollgate, PathBuf) {
    let mut with_info = vec![("RUST_LOG", "info")];
    with_info.extend_from_slice(env);
    Tollgate::start_logged(config, &with_info)
}

/// Runs `tollgate <args>` to completion; returns (exit code, stdout, stderr).
pub fn run_tollgate(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let output = tollgate_command()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run tollgate");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// One timed `/check`.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When the request was sent.
    pub at: Instant,
    pub latency: Duration,
    /// 0 when the request got no HTTP answer at all.
    pub status: u16,
    /// The answer carried quota headers (decided by a store, not by `on_error = "allow"`).
    pub quota_headers: bool,
}

/// A closed loop of `/check` requests on one keep-alive connection, each from a different
/// client address, until stopped; every request is timed.
pub struct Load {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
}

impl Load {
    pub fn start(addr: SocketAddr, pause: Duration, seed: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut client = HttpClient::connect(addr).ok();
            let mut n: u32 = seed.wrapping_mul(7919);
            while !flag.load(Ordering::SeqCst) {
                n = n.wrapping_add(1);
                // Addresses in 198.18.0.0/15 (benchmarking range): a fresh bucket almost always.
                let ip = format!("198.{}.{}.{}", 18 + (n >> 16 & 1), n >> 8 & 0xff, n & 0xff);
                let at = Instant::now();
                let result = match client.as_mut() {
                    Some(c) => c.get("/check", &[("X-Forwarded-For", &ip)]),
                    None => Err(std::io::Error::other("not connected")),
                };
                let latency = at.elapsed();
                match result {
                    Ok(r) => samples.push(Sample {
                        at,
                        latency,
                        status: r.status,
                        quota_headers: r.header("ratelimit").is_some(),
                    }),
                    Err(_) => {
                        samples.push(Sample {
                            at,
                            latency,
                            status: 0,
                            quota_headers: false,
                        });
                        client = HttpClient::connect(addr).ok();
                    }
                }
                std::thread::sleep(pause);
            }
            samples
        });
        Load { stop, handle }
    }

    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().expect("load thread")
    }
}

/// Polls `tollgate_store_up` every 10 ms in a thread; records (when, value) on every change.
pub struct UpWatch {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<(Instant, f64)>>,
}

impl UpWatch {
    pub fn start(admin: SocketAddr) -> UpWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut changes: Vec<(Instant, f64)> = Vec::new();
            let mut client = HttpClient::connect(admin).ok();
            while !flag.load(Ordering::SeqCst) {
                let value = client
                    .as_mut()
                    .and_then(|c| c.get("/metrics", &[]).ok())
                    .map(|r| super::metric_value(&r.body, "tollgate_store_up"));
                match value {
                    Some(v) if changes.last().is_none_or(|(_, last)| *last != v) => {
                        changes.push((Instant::now(), v))
                    }
                    Some(_) => {}
                    None => client = HttpClient::connect(admin).ok(),
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            changes
        });
        UpWatch { stop, handle }
    }

    pub fn finish(self) -> Vec<(Instant, f64)> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().expect("watch thread")
    }
}

/// Peak resident memory (`VmHWM`) of a process, in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_field_kib(pid, "VmHWM:")
}

/// Current resident memory (`VmRSS`) of a process, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_field_kib(pid, "VmRSS:")
}

fn status_field_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix(field)?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

/// `redis-cli` with a password, for a server started with `--requirepass`.
pub fn redis_cli_auth(port: u16, password: &str, args: &[&str]) -> String {
    let output = Command::new(super::store_binary("cli"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--no-auth-warning",
        ])
        .args(["-a", password])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&output.stdout).into_owned()
}
