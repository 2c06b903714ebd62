//! A tollgate of a test's own: the real binary in a process, or served in the test's.

use super::*;

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
        let config =
            tollgate_core::config::Config::load(Some(&config_path)).expect("a valid config");
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
