//! A `redis-server` (or `valkey-server`) of a test's own, and a store on it.

use super::*;

/// A `redis-server` owned by one test: loopback, a free port, no persistence.
pub struct RedisServer {
    pub port: u16,
    // The chaos harness builds one around a port it chose.
    pub(super) child: Option<Child>,
    pub(super) extra_args: Vec<String>,
    pub(super) dir: TempDir,
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

    pub(super) fn spawn(&mut self) {
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

/// A Redis store on a current-thread runtime, the way an HTTP worker runs it (the store must
/// be opened inside the runtime that drives it).
pub fn redis_store(
    topology: &tollgate_core::store::redis::Topology<'_>,
    timeout: Duration,
) -> (
    tollgate_core::store::redis::RedisStore,
    tokio::runtime::Runtime,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = {
        let _inside = runtime.enter();
        tollgate_core::store::redis::RedisStore::open(
            topology,
            None,
            timeout,
            tollgate_core::observe::metrics::Metrics::new(),
            &tollgate_core::base::timings::Timings::default(),
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
        .strip_prefix(tollgate_core::kinds::twin::BUCKET_FORMAT)
        .unwrap_or(value)
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(burst - debt / 1e6)
}
