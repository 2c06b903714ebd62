//! A real Redis Cluster (3 masters, 3 replicas) and a real Sentinel setup (1 master,
//! 1 replica, 3 sentinels), on free loopback ports, owned by one test and stopped on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{make_certificates, redis_cli, wait_until, RedisServer, TempDir};

/// A port that is free and whose cluster bus port (port + 10000) is free too.
pub fn free_cluster_port() -> u16 {
    super::free_port_pair(10_000)
}

fn spawn_redis(args: &[String]) -> Child {
    Command::new(super::store_binary("server"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server")
}

fn answers_ping(port: u16) -> bool {
    redis_cli(port, &["PING"])
        .map(|out| out.trim() == "PONG")
        .unwrap_or(false)
}

/// One `redis-server --cluster-enabled yes` process.
pub struct ClusterNode {
    pub port: u16,
    child: Option<Child>,
    _dir: TempDir,
}

impl ClusterNode {
    fn start(port: u16) -> ClusterNode {
        let dir = TempDir::new("cluster-node");
        let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &path("nodes.conf"),
            // Short, so a dead master is noticed and its replica promoted within ~2 s.
            "--cluster-node-timeout",
            "1000",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &path(""),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let child = spawn_redis(&args);
        assert!(
            wait_until(Duration::from_secs(10), || answers_ping(port)),
            "cluster node did not come up on port {port}"
        );
        ClusterNode {
            port,
            child: Some(child),
            _dir: dir,
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// 3 masters and 3 replicas, slots spread evenly by `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<ClusterNode>,
}

impl RedisCluster {
    /// Six free port pairs, for a test that needs the addresses before the cluster exists.
    pub fn pick_ports() -> Vec<u16> {
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 6 {
            let port = free_cluster_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        ports
    }

    pub fn start() -> RedisCluster {
        RedisCluster::start_on(&RedisCluster::pick_ports())
    }

    pub fn start_on(ports: &[u16]) -> RedisCluster {
        let nodes: Vec<ClusterNode> = ports.iter().map(|&p| ClusterNode::start(p)).collect();
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let output = Command::new(super::store_binary("cli"))
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = RedisCluster { nodes };
        assert!(
            cluster.wait_healthy(3, Duration::from_secs(20)),
            "cluster did not become healthy"
        );
        cluster
    }

    /// `redis://` URLs of every node, as `store.cluster` seeds.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    fn live_port(&self) -> Option<u16> {
        self.nodes.iter().find(|n| n.is_running()).map(|n| n.port)
    }

    /// `CLUSTER NODES`, as seen by a live node: (port, id, is_master, master_id, connected).
    pub fn topology(&self) -> Vec<(u16, String, bool, String, bool)> {
        let Some(port) = self.live_port() else {
            return Vec::new();
        };
        let Ok(text) = redis_cli(port, &["CLUSTER", "NODES"]) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if fields.len() < 8 {
                    return None;
                }
                let port = fields[1].split(['@', ':']).nth(1)?.parse().ok()?;
                let flags = fields[2];
                Some((
                    port,
                    fields[0].to_string(),
                    flags.contains("master") && !flags.contains("fail"),
                    fields[3].to_string(),
                    fields[7] == "connected" && !flags.contains("fail"),
                ))
            })
            .collect()
    }

    /// Ports of the masters currently serving slots.
    pub fn master_ports(&self) -> Vec<u16> {
        let mut masters: Vec<u16> = self
            .topology()
            .into_iter()
            .filter(|(port, _, master, _, up)| {
                *master && *up && self.nodes.iter().any(|n| n.port == *port && n.is_running())
            })
            .map(|(port, ..)| port)
            .collect();
        masters.sort_unstable();
        masters
    }

    /// The replica port of the master on `port`.
    pub fn replica_of(&self, port: u16) -> Option<u16> {
        let topology = self.topology();
        let id = topology.iter().find(|t| t.0 == port)?.1.clone();
        topology.iter().find(|t| t.3 == id).map(|t| t.0)
    }

    /// Every live node reports `cluster_state:ok` and `masters` masters serve slots.
    pub fn wait_healthy(&self, masters: usize, within: Duration) -> bool {
        wait_until(within, || {
            self.master_ports().len() == masters
                && self.nodes.iter().filter(|n| n.is_running()).all(|n| {
                    redis_cli(n.port, &["CLUSTER", "INFO"])
                        .map(|info| info.contains("cluster_state:ok"))
                        .unwrap_or(false)
                })
        })
    }

    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.kill();
        }
    }

    /// Runs a command on every live master.
    pub fn on_masters(&self, args: &[&str]) -> Vec<String> {
        self.master_ports()
            .into_iter()
            .map(|port| redis_cli(port, args).unwrap_or_default())
            .collect()
    }
}

/// 1 master, 1 replica and 3 sentinels watching them as `mymaster` (quorum 2).
pub struct SentinelSetup {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel_ports: Vec<u16>,
    sentinels: Vec<Child>,
    _dir: TempDir,
}

pub const MASTER_NAME: &str = "mymaster";

impl SentinelSetup {
    pub fn start() -> SentinelSetup {
        let master = RedisServer::start();
        let replica_of = master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &replica_of]);
        assert!(
            wait_until(Duration::from_secs(10), || replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")),
            "replica did not sync"
        );
        let dir = TempDir::new("sentinel");
        let mut sentinel_ports = Vec::new();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = super::free_port();
            // Sentinel rewrites its config file, so each gets its own writable one.
            let config = dir.write(
                &format!("sentinel-{i}.conf"),
                &format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 3000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.path().display(),
                    master = master.port,
                ),
            );
            sentinels.push(spawn_redis(&[
                config.to_string_lossy().into_owned(),
                "--sentinel".into(),
            ]));
            sentinel_ports.push(port);
        }
        let setup = SentinelSetup {
            master,
            replica,
            sentinel_ports,
            sentinels,
            _dir: dir,
        };
        // Sentinels find each other and the replica through the master's hello channel.
        assert!(
            wait_until(Duration::from_secs(20), || setup.sentinel_ports.iter().all(
                |&port| {
                    let info =
                        redis_cli(port, &["SENTINEL", "MASTER", MASTER_NAME]).unwrap_or_default();
                    field_after(&info, "num-other-sentinels") == Some("2")
                        && field_after(&info, "num-slaves") == Some("1")
                }
            )),
            "sentinels did not discover each other and the replica"
        );
        setup
    }

    pub fn urls(&self) -> Vec<String> {
        self.sentinel_ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The master port the sentinels agree on (by the first live one's answer).
    pub fn master_port(&self) -> Option<u16> {
        self.sentinel_ports.iter().find_map(|&port| {
            let out =
                redis_cli(port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]).ok()?;
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    pub fn sentinel_cli(&self, args: &[&str]) -> String {
        redis_cli(self.sentinel_ports[0], args).unwrap_or_else(|e| panic!("sentinel {args:?}: {e}"))
    }
}

impl Drop for SentinelSetup {
    fn drop(&mut self) {
        for child in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A master that also listens for TLS (its plain port kept for the test's own look at it) and
/// one sentinel watching it over TLS as `mymaster` (quorum 1): the sentinel names the TLS
/// port, so a client must speak TLS to the master it is given.
pub struct TlsSentinelSetup {
    pub master: RedisServer,
    pub sentinel_port: u16,
    /// The same sentinel over TLS (no client certificate asked), as envoyproxy/ratelimit's
    /// `REDIS_TLS` speaks to sentinels.
    pub sentinel_tls_port: u16,
    sentinel: Child,
    dir: TempDir,
}

impl TlsSentinelSetup {
    /// `clients_show_certificates`: the master's `tls-auth-clients` (the sentinel shows the
    /// master's own certificate).
    pub fn start(clients_show_certificates: bool) -> TlsSentinelSetup {
        let dir = TempDir::new("tls-sentinel");
        make_certificates(dir.path());
        let path = |name: &str| dir.path().join(name).display().to_string();
        let (ca, cert, key) = (path("ca.pem"), path("cert.pem"), path("key.pem"));
        let tls_port = super::free_port();
        let master = RedisServer::start_tls(dir.path(), tls_port, clients_show_certificates);
        let sentinel_port = super::free_port();
        let sentinel_tls_port = super::free_port();
        let config = dir.write(
            "sentinel.conf",
            &format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {dir}\n\
                 tls-port {sentinel_tls_port}\ntls-auth-clients no\n\
                 tls-replication yes\ntls-cert-file {cert}\ntls-key-file {key}\n\
                 tls-ca-cert-file {ca}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {tls_port} 1\n",
                dir = dir.path().display(),
            ),
        );
        let sentinel = spawn_redis(&[config.to_string_lossy().into_owned(), "--sentinel".into()]);
        let setup = TlsSentinelSetup {
            master,
            sentinel_port,
            sentinel_tls_port,
            sentinel,
            dir,
        };
        assert!(
            wait_until(Duration::from_secs(10), || {
                let info = redis_cli(sentinel_port, &["SENTINEL", "MASTER", MASTER_NAME])
                    .unwrap_or_default();
                field_after(&info, "port") == Some(&tls_port.to_string())
                    && field_after(&info, "flags") == Some("master")
            }),
            "the sentinel does not see its TLS master"
        );
        setup
    }

    /// The CA that signed the master's certificate, and that certificate's files.
    pub fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

impl Drop for TlsSentinelSetup {
    fn drop(&mut self) {
        let _ = self.sentinel.kill();
        let _ = self.sentinel.wait();
    }
}

/// The password of [`AuthSentinelSetup`]'s master: characters a URL would cut or decode
/// (no `:`, which `REDIS_AUTH` reads as the end of a user name).
pub const MASTER_PASSWORD: &str = "m@ster/pw%41#x";
/// The password of its sentinel, when it asks for one.
pub const SENTINEL_PASSWORD: &str = "sentinel-pw";

/// A master that asks every client for [`MASTER_PASSWORD`] and one sentinel watching it as
/// `mymaster` (quorum 1) with that password (`sentinel auth-pass`); `sentinel_asks`: the
/// sentinel asks its own clients for [`SENTINEL_PASSWORD`] too (`requirepass`).
pub struct AuthSentinelSetup {
    pub master: RedisServer,
    pub sentinel_port: u16,
    sentinel: Child,
    _dir: TempDir,
}

impl AuthSentinelSetup {
    pub fn start(sentinel_asks: bool) -> AuthSentinelSetup {
        let master = RedisServer::start();
        // Set after start: the start waits for an unauthenticated PING.
        master.cli(&["CONFIG", "SET", "requirepass", MASTER_PASSWORD]);
        let dir = TempDir::new("auth-sentinel");
        let sentinel_port = super::free_port();
        let config = dir.write(
            "sentinel.conf",
            &format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {dir}\n{requirepass}\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 1\n\
                 sentinel auth-pass {MASTER_NAME} \"{MASTER_PASSWORD}\"\n",
                dir = dir.path().display(),
                master = master.port,
                requirepass = if sentinel_asks {
                    format!("requirepass {SENTINEL_PASSWORD}\n")
                } else {
                    String::new()
                },
            ),
        );
        let sentinel = spawn_redis(&[config.to_string_lossy().into_owned(), "--sentinel".into()]);
        let setup = AuthSentinelSetup {
            master,
            sentinel_port,
            sentinel,
            _dir: dir,
        };
        let auth: &[&str] = if sentinel_asks {
            &["-a", SENTINEL_PASSWORD, "--no-auth-warning"]
        } else {
            &[]
        };
        assert!(
            wait_until(Duration::from_secs(10), || {
                let ask = [auth, &["SENTINEL", "MASTER", MASTER_NAME]].concat();
                let info = redis_cli(sentinel_port, &ask).unwrap_or_default();
                field_after(&info, "flags") == Some("master")
            }),
            "the sentinel does not see its master"
        );
        setup
    }

    /// One command to the master, with its password.
    pub fn master_cli(&self, args: &[&str]) -> String {
        let ask = [&["-a", MASTER_PASSWORD, "--no-auth-warning"], args].concat();
        redis_cli(self.master.port, &ask).unwrap_or_else(|e| panic!("master {args:?}: {e}"))
    }
}

impl Drop for AuthSentinelSetup {
    fn drop(&mut self) {
        let _ = self.sentinel.kill();
        let _ = self.sentinel.wait();
    }
}

/// In a `redis-cli` reply of alternating lines name/value, the value after `name`.
fn field_after<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == name {
            return lines.next().map(str::trim);
        }
    }
    None
}

/// One `/check` as a load client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// When the answer came, since the load started.
    pub at: Duration,
    pub latency: Duration,
    /// 0 when tollgate did not answer at all.
    pub status: u16,
    /// Decided by the store: the quota headers are present (on_error answers carry none).
    pub decided: bool,
    pub user: usize,
    pub tenant: usize,
}

/// `threads` keep-alive clients hammer `/check` on `targets` (round robin) for `run_for`,
/// each request naming a user and a tenant (`x-user`, `x-tenant`) from the lists. Returns
/// every outcome and how long the load ran, first send to last answer.
pub fn drive(
    targets: &[std::net::SocketAddr],
    threads: usize,
    run_for: Duration,
    users: &[String],
    tenants: &[String],
) -> (Vec<Outcome>, Duration) {
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let target = targets[t % targets.len()];
            let users = users.to_vec();
            let tenants = tenants.to_vec();
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                let mut client = super::HttpClient::connect(target).ok();
                let mut i = t * 7;
                while start.elapsed() < run_for {
                    i += 1;
                    let (user, tenant) = (i % users.len(), (i / 3 + t) % tenants.len());
                    let sent = std::time::Instant::now();
                    let answer = client.as_mut().and_then(|c| {
                        c.get(
                            "/check",
                            &[("x-user", &users[user]), ("x-tenant", &tenants[tenant])],
                        )
                        .ok()
                    });
                    let (status, decided) = match &answer {
                        Some(r) => (r.status, r.header("ratelimit").is_some()),
                        None => {
                            client = super::HttpClient::connect(target).ok();
                            (0, false)
                        }
                    };
                    outcomes.push(Outcome {
                        at: start.elapsed(),
                        latency: sent.elapsed(),
                        status,
                        decided,
                        user,
                        tenant,
                    });
                }
                outcomes
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("load thread"))
        .collect();
    let elapsed = outcomes.iter().map(|o| o.at).max().unwrap_or_default();
    (outcomes, elapsed)
}
