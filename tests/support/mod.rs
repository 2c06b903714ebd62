//! Test harness: a real `redis-server` on a free loopback port, real `tollgate` processes, and
//! a small keep-alive HTTP/1.1 client. Everything started here is stopped on drop.
#![allow(dead_code)] // each test file uses a different part of the harness

pub mod chaos;
// Redis Cluster and Sentinel: more than one Redis process, so only the second tier may
// start them (the compiler keeps the rule).
#[cfg(feature = "e2e")]
pub mod cluster;
pub mod commandstats;
pub mod deploy;
// A real Envoy: a process of its own per test, so only the second tier starts one.
#[cfg(feature = "e2e")]
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod latency;
// An OTLP trace receiver on Python's grpcio: a process of its own, second tier only.
#[cfg(feature = "e2e")]
pub mod otlp;
pub mod proxies;
pub mod rlqs;
// A real statsd daemon: a process of its own per test, so only the second tier starts one.
#[cfg(feature = "e2e")]
pub mod statsd;
pub mod xds;

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use self::http::{HttpClient, Response};

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    free_port_pair(0)
}

/// A free loopback port whose `port + offset` is free too (a Redis Cluster node's bus port).
///
/// Picked below the kernel's ephemeral range, so no outgoing connection of a parallel test can
/// take it between picking and the server's bind (a cluster node then died on its bus port),
/// and never handed out twice in one run.
pub fn free_port_pair(offset: u16) -> u16 {
    use std::collections::BTreeSet;
    use std::hash::{BuildHasher as _, RandomState};
    use std::sync::Mutex;
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

    const LOWEST: u16 = 10_000;
    let highest = ephemeral_range_start().saturating_sub(offset);
    assert!(
        highest > LOWEST + 1_000,
        "the ephemeral port range starts too low for test ports"
    );
    let is_free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for _ in 0..10_000 {
        let spread = RandomState::new().hash_one(given.len()) % u64::from(highest - LOWEST);
        let port = LOWEST + u16::try_from(spread).expect("below highest - LOWEST");
        if !given.contains(&port) && is_free(port) && (offset == 0 || is_free(port + offset)) {
            given.insert(port);
            return port;
        }
    }
    panic!("no free loopback port below the ephemeral range");
}

/// Where the kernel starts handing out ports to outgoing connections (Linux's default when
/// unknown).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// The environment that starts a tollgate with every background interval a tenth of
/// production's (the testing-only divisor, see CONTRIBUTING.md): pass it to
/// [`Tollgate::start_with_env`] and wait in multiples of [`short_timings`].
pub const SHORT_TIMINGS: (&str, &str) = (tollgate::base::timings::TEST_SCALE_ENV, "10");

/// The intervals of a tollgate started with [`SHORT_TIMINGS`].
pub fn short_timings() -> tollgate::base::timings::Timings {
    tollgate::base::timings::Timings::for_test_scale(SHORT_TIMINGS.1).expect("a valid divisor")
}

/// Polls `ready` every 20 ms until it holds or `within` passes.
pub fn wait_until(within: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ready()
}

/// The store the tests run against: Redis, or Valkey with `STORE_UNDER_TEST=valkey` (the
/// Valkey leg of scripts/test.sh). Any other value stops the test, so a typo never runs Redis
/// under Valkey's name.
pub fn store_is_valkey() -> bool {
    match std::env::var("STORE_UNDER_TEST").as_deref() {
        Err(_) | Ok("redis") => false,
        Ok("valkey") => true,
        Ok(other) => panic!("STORE_UNDER_TEST={other:?}: redis or valkey"),
    }
}

/// The store's own program: `server` or `cli` (`redis-server`, `valkey-cli`, ...).
pub fn store_binary(program: &str) -> PathBuf {
    let store = if store_is_valkey() { "valkey" } else { "redis" };
    require_binary(&format!("{store}-{program}"))
}

fn require_binary(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("`{name}` is not installed: run scripts/test.sh, which installs what the tests need")
    })
}

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "tollgate-test-{label}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(contents.as_bytes()))
            .expect("write temp file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `redis-server` owned by one test: loopback, a free port, no persistence.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    extra_args: Vec<String>,
    dir: TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A Redis that also listens for TLS on `tls_port`, with the certificate, key and CA of
    /// [`make_certificates`] in `certs`; `clients_show_certificates`: `tls-auth-clients`.
    pub fn start_tls(certs: &Path, tls_port: u16, clients_show_certificates: bool) -> RedisServer {
        let path = |name: &str| certs.join(name).to_string_lossy().into_owned();
        RedisServer::start_with(&[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &path("cert.pem"),
            "--tls-key-file",
            &path("key.pem"),
            "--tls-ca-cert-file",
            &path("ca.pem"),
            "--tls-auth-clients",
            if clients_show_certificates {
                "yes"
            } else {
                "no"
            },
        ])
    }

    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            child: None,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            dir: TempDir::new("redis"),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new(store_binary("server"))
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let port = self.port;
        assert!(
            wait_until(Duration::from_secs(10), || redis_cli(port, &["PING"])
                .map(|out| out.trim() == "PONG")
                .unwrap_or(false)),
            "redis-server did not come up on port {port}"
        );
        if store_is_valkey() {
            let info = redis_cli(port, &["INFO", "server"]).unwrap_or_default();
            assert!(info.contains("valkey_version:"), "not a Valkey: {info}");
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Runs one command with `redis-cli`; panics if it cannot run.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args).unwrap_or_else(|e| panic!("redis-cli {args:?}: {e}"))
    }

    /// The tokens a bucket of `burst` held when it was last written: `burst` less its stored
    /// debt (`"<debt in micro-tokens> <ts>"`); `None` when the key is absent (full).
    pub fn stored_tokens(&self, key: &str, burst: f64) -> Option<f64> {
        stored_tokens(&self.cli(&["GET", key]), burst)
    }

    /// Kills the server (SIGKILL: an abrupt failure, not a clean shutdown).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again, empty, on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn redis_cli(port: u16, args: &[&str]) -> Result<String, String> {
    let output = Command::new(store_binary("cli"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A running tollgate with its own config file and free ports: a process of the real binary,
/// or served inside the test process ([`Tollgate::in_process`]) when a test needs no
/// signals, logs or process of its own.
pub struct Tollgate {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub config_path: PathBuf,
    running: Running,
    _dir: TempDir,
}

enum Running {
    Process(Child),
    /// Dropping the sender is the shutdown signal of `server::run`.
    InProcess(Option<tokio::sync::oneshot::Sender<()>>),
}

impl Tollgate {
    /// Starts tollgate on `config` (TOML; `listen`/`admin_listen` are set here) and waits until
    /// `/healthz` answers.
    pub fn start(config: &str) -> Tollgate {
        Tollgate::start_with_env(config, &[])
    }

    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> Tollgate {
        Tollgate::spawn(config, env, false).0
    }

    /// Like [`Tollgate::start_with_env`], with stderr written to a file (returned) instead of
    /// inherited, so a test can read the logs. The file lives as long as the instance.
    pub fn start_logged(config: &str, env: &[(&str, &str)]) -> (Tollgate, PathBuf) {
        let (tollgate, log) = Tollgate::spawn(config, env, true);
        (tollgate, log.expect("a log file was asked for"))
    }

    fn spawn(config: &str, env: &[(&str, &str)], log_to_file: bool) -> (Tollgate, Option<PathBuf>) {
        // A port `free_port` found free may be taken by another test's process before tollgate
        // binds it; tollgate then exits at once, and new ports are tried.
        for attempt in 1.. {
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let dir = TempDir::new("tollgate");
            let config_path = dir.write("tollgate.toml", config);
            let log_path = log_to_file.then(|| dir.path().join("stderr.log"));
            let stderr = match &log_path {
                Some(path) => Stdio::from(std::fs::File::create(path).expect("create log file")),
                None => Stdio::inherit(),
            };
            let child = tollgate_command()
                .arg("--config")
                .arg(&config_path)
                .env("TOLLGATE_LISTEN", addr.to_string())
                .env("TOLLGATE_ADMIN_LISTEN", admin.to_string())
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,redis=error".into()),
                )
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("start tollgate");
            let mut tollgate = Tollgate {
                addr,
                admin,
                config_path,
                running: Running::Process(child),
                _dir: dir,
            };
            if tollgate.exited_before_serving() && attempt < 3 {
                continue;
            }
            tollgate.wait_healthy();
            return (tollgate, log_path);
        }
        unreachable!("the loop returns")
    }

    /// Whether the process exited before `/healthz` answered (it could not bind its ports).
    fn exited_before_serving(&mut self) -> bool {
        let addr = self.addr;
        let Running::Process(child) = &mut self.running else {
            return false;
        };
        let mut exited = false;
        wait_until(Duration::from_secs(10), || {
            exited = child.try_wait().ok().flatten().is_some();
            exited
                || HttpClient::connect(addr)
                    .and_then(|mut c| c.get("/healthz", &[]))
                    .is_ok_and(|r| r.status == 200)
        });
        exited
    }

    /// Serves `config` in this test process, on port 0, through the same `server::run` the
    /// binary uses; it stops when dropped.
    pub fn in_process(config: &str) -> Tollgate {
        let dir = TempDir::new("tollgate");
        let config_path = dir.write("tollgate.toml", config);
        let config = tollgate::config::Config::load(Some(&config_path)).expect("a valid config");
        let bind = || TcpListener::bind("127.0.0.1:0").expect("bind port 0");
        let listeners = tollgate::app::server::Listeners {
            public: bind(),
            admin: bind(),
            grpc: None,
            grpc_tls: None,
            grpc_max_connections: 1,
            erl_prometheus: None,
        };
        let addr = listeners.public.local_addr().unwrap();
        let admin = listeners.admin.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let state = tollgate::state::build_state(&config).expect("state built");
                tollgate::app::server::spawn_duties(&config, &state).expect("duties started");
                let shutdown = async move {
                    let _ = stopped.await;
                };
                tollgate::app::server::run(state, listeners, shutdown)
                    .await
                    .expect("served");
            })
        });
        let tollgate = Tollgate {
            addr,
            admin,
            config_path,
            running: Running::InProcess(Some(stop)),
            _dir: dir,
        };
        tollgate.wait_healthy();
        tollgate
    }

    fn wait_healthy(&self) {
        let addr = self.addr;
        assert!(
            wait_until(Duration::from_secs(10), || {
                HttpClient::connect(addr)
                    .and_then(|mut c| c.get("/healthz", &[]))
                    .map(|r| r.status == 200)
                    .unwrap_or(false)
            }),
            "tollgate did not come up on {addr}"
        );
    }

    fn child(&mut self) -> &mut Child {
        match &mut self.running {
            Running::Process(child) => child,
            Running::InProcess(_) => panic!("an in-process tollgate has no process"),
        }
    }

    pub fn client(&self) -> HttpClient {
        HttpClient::connect(self.addr).expect("connect to tollgate")
    }

    /// One `/check` on a fresh connection.
    pub fn check(&self, headers: &[(&str, &str)]) -> Response {
        self.client()
            .get("/check", headers)
            .expect("check answered")
    }

    pub fn metrics(&self) -> String {
        HttpClient::connect(self.admin)
            .and_then(|mut c| c.get("/metrics", &[]))
            .expect("metrics answered")
            .body
    }

    /// The value of one sample line of `/metrics`, e.g.
    /// `tollgate_checks_total{result="allowed"}`; 0 when absent.
    pub fn metric(&self, sample: &str) -> f64 {
        metric_value(&self.metrics(), sample)
    }

    pub fn signal(&self, signal: &str) {
        let pid = self.pid();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child().try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn pid(&self) -> u32 {
        match &self.running {
            Running::Process(child) => child.id(),
            Running::InProcess(_) => panic!("an in-process tollgate has no process"),
        }
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        match &mut self.running {
            Running::Process(child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            // The server drains on its own thread; nothing here waits for it.
            Running::InProcess(stop) => drop(stop.take()),
        }
    }
}

pub fn tollgate_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    // The tests' own environment must not leak config into the process under test.
    for (key, _) in std::env::vars() {
        if key.starts_with("TOLLGATE_") {
            command.env_remove(key);
        }
    }
    command
}

/// Polls a future that never waits (the memory store's) to completion.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

pub fn metric_value(metrics: &str, sample: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(sample)?;
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
        .unwrap_or(0.0)
}

/// A config for a Redis-backed tollgate: `extra_store` lines go into `[store]` (a
/// `timeout_ms` there replaces the default of 2000), `limits` is appended verbatim.
/// `[store]` lines for a test that counts script calls: the runtime-override poll (one script
/// call per instance every 250 ms by default) runs once at start, then not for a minute. The
/// one at start is a background task that a starved machine may run after the first checks:
/// wait for it with [`commandstats::wait_for_start_up_polls`] before counting.
pub const QUIET_POLL: &str = "override_poll_ms = 60000";

pub fn redis_config(redis: &RedisServer, extra_store: &str, limits: &str) -> String {
    let timeout = if extra_store.contains("timeout_ms") {
        ""
    } else {
        // Generous: tests that count decisions must not see a slow call on a loaded machine
        // answered per `on_error`. Tests about timeouts set their own budget.
        "timeout_ms = 2000\n"
    };
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n{timeout}{extra_store}\n\n{limits}",
        redis.url()
    )
}

/// One `[[limits]]` table of a test config, so a test spells only what it is about:
/// `limit("per-ip", 1, 5, &["ip"]).set("shadow", true)`. Values given to [`Limit::set`] are
/// TOML as written (numbers, booleans); [`Limit::set_str`] quotes a string. Derefs to the
/// TOML text, and tables concatenate with `+`.
pub fn limit(
    name: &str,
    rate: impl std::fmt::Display,
    burst: impl std::fmt::Display,
    key: &[&str],
) -> Limit {
    let key: Vec<String> = key.iter().map(|part| format!("{part:?}")).collect();
    Limit(format!(
        "[[limits]]\nname = {name:?}\nrate = {rate}\nburst = {burst}\nkey = [{}]\n",
        key.join(", ")
    ))
}

/// A `[[limits]]` table as TOML text; see [`limit`].
#[derive(Debug, Clone)]
pub struct Limit(String);

impl Limit {
    pub fn set(mut self, field: &str, value: impl std::fmt::Display) -> Limit {
        self.0.push_str(&format!("{field} = {value}\n"));
        self
    }

    pub fn set_str(self, field: &str, value: &str) -> Limit {
        self.set(field, format!("{value:?}"))
    }
}

impl std::ops::Deref for Limit {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Add<Limit> for Limit {
    type Output = Limit;
    fn add(mut self, other: Limit) -> Limit {
        self.0.push_str(&other.0);
        self
    }
}

/// A Redis store on a current-thread runtime, the way an HTTP worker runs it (the store must
/// be opened inside the runtime that drives it).
pub fn redis_store(
    topology: &tollgate::store::redis::Topology<'_>,
    timeout: Duration,
) -> (tollgate::store::redis::RedisStore, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = {
        let _inside = runtime.enter();
        tollgate::store::redis::RedisStore::open(
            topology,
            None,
            timeout,
            tollgate::observe::metrics::Metrics::new(),
            &tollgate::base::timings::Timings::default(),
        )
        .expect("store")
    };
    (store, runtime)
}

/// Tokens from a bucket's stored value (`"v1:<debt in micro-tokens> <ts>"`, or unmarked, as
/// `GET` printed it) for a burst of `burst`; `None` when it is not such a value.
#[allow(dead_code)]
pub fn stored_tokens(value: &str, burst: f64) -> Option<f64> {
    let value = value.trim();
    let debt: f64 = value
        .strip_prefix(tollgate::kinds::twin::BUCKET_FORMAT)
        .unwrap_or(value)
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(burst - debt / 1e6)
}

/// A throwaway CA (`ca.pem`) and a certificate for 127.0.0.1 it signed (`cert.pem`,
/// `key.pem`), made with `openssl`. The certificate names no usage, so it serves as a client's
/// too.
pub fn make_certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let san = dir.join("san.ext");
    std::fs::write(&san, "subjectAltName=IP:127.0.0.1\n").expect("write extension file");
    let steps: [Vec<&str>; 3] = [
        [
            &[
                "req",
                "-x509",
                "-days",
                "1",
                "-subj",
                "/CN=tollgate test CA",
            ][..],
            &ec[..],
        ]
        .concat(),
        [&["req", "-subj", "/CN=127.0.0.1"][..], &ec[..]].concat(),
        vec!["x509", "-req", "-days", "1", "-CAcreateserial"],
    ];
    let files: [Vec<(&str, &str)>; 3] = [
        vec![("-keyout", "ca.key"), ("-out", "ca.pem")],
        vec![("-keyout", "key.pem"), ("-out", "req.csr")],
        vec![
            ("-in", "req.csr"),
            ("-CA", "ca.pem"),
            ("-CAkey", "ca.key"),
            ("-extfile", "san.ext"),
            ("-out", "cert.pem"),
        ],
    ];
    for (args, files) in steps.iter().zip(&files) {
        let mut command = Command::new("openssl");
        command.args(args).current_dir(dir);
        for (flag, file) in files {
            command.arg(flag).arg(file);
        }
        let output = command.output().expect("run openssl");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A client certificate (`<stem>.pem`, `<stem>.key`) for the subject alternative name `san`
/// (`DNS:name` or `IP:address`), signed by the CA [`make_certificates`] made in `dir`.
pub fn make_client_certificate(dir: &Path, stem: &str, san: &str) {
    let ext = format!("{stem}.ext");
    std::fs::write(
        dir.join(&ext),
        format!("subjectAltName={san}\nextendedKeyUsage=clientAuth\n"),
    )
    .expect("write extension file");
    let (key, csr, pem) = (
        format!("{stem}.key"),
        format!("{stem}.csr"),
        format!("{stem}.pem"),
    );
    let subject = format!("/CN={stem}");
    let steps: [Vec<&str>; 2] = [
        vec![
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &subject,
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
        vec![
            "x509",
            "-req",
            "-days",
            "1",
            "-CAcreateserial",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    ];
    for args in steps {
        let output = Command::new("openssl")
            .args(&args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
