//! The connection to Redis, whichever way it is deployed: one node (`store.url`), a Cluster
//! (`store.cluster`), or the master that Sentinel names (`store.sentinel`). All three connect
//! lazily, so tollgate starts and answers per `on_error` while Redis is unreachable.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{
    SentinelClient, SentinelClientBuilder, SentinelNodeConnectionInfo, SentinelServerType,
};
use redis::{
    ClientTlsConfig, Cmd, ErrorKind, IntoConnectionInfo, RedisResult, ServerErrorKind,
    TlsCertificates, Value,
};

use super::sentinel::SentinelMaster;
use crate::base::timings::Timings;
use crate::config::store_tls::StoreTlsMaterial;
use crate::config::SentinelConfig;
use crate::store::StoreError;

/// Longest pause between reconnect attempts: short, so recovery follows Redis within ~0.5 s.
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// Where Redis is, as configured.
pub enum Topology<'a> {
    Single {
        url: &'a str,
    },
    Cluster {
        seeds: &'a [String],
    },
    /// `url` supplies the master's database, and its TLS, user and password where the
    /// `master_*` keys of `sentinel` do not say them (its host is ignored).
    Sentinel {
        sentinel: &'a SentinelConfig,
        url: &'a str,
    },
}

/// A client of the master that `sentinel` names, spoken to as
/// [`SentinelConfig::master_access`] says (TLS, user, password; the crate speaks plain TCP to
/// the master unless told), on `url`'s database. `store.tls`'s certificates go to the master
/// when it speaks TLS and to `rediss://` sentinels. `tcp`: the sockets' settings, if not the
/// crate's.
pub fn sentinel_client(
    sentinel: &SentinelConfig,
    url: &str,
    tls: Option<&TlsCertificates>,
    tcp: Option<TcpSettings>,
) -> Result<SentinelClient, StoreError> {
    let (master, sentinels) = (sentinel.master.as_str(), &sentinel.urls);
    let access = sentinel.master_access(url);
    let node = url
        .into_connection_info()
        .map_err(|e| invalid("store.url", &e))?;
    let mut settings = node.redis_settings().clone();
    if let Some(user) = &access.username {
        settings = settings.set_username(user);
    }
    if let Some(password) = &access.password {
        settings = settings.set_password(password);
    }
    let master_tls = access.tls;
    let refused = |e: redis::RedisError| invalid("store.sentinel", &e);
    let Some(certificates) = tls else {
        let info = SentinelNodeConnectionInfo::default().set_redis_connection_info(settings);
        let info = if master_tls {
            info.set_tls_mode(redis::TlsMode::Secure)
        } else {
            info
        };
        let info = match tcp {
            Some(tcp) => info.set_tcp_settings(tcp),
            None => info,
        };
        return SentinelClient::build(
            sentinels.iter().map(String::as_str).collect(),
            master,
            Some(info),
            SentinelServerType::Master,
        )
        .map_err(refused);
    };
    // Certificates go only through the builder, which takes one identity for all sentinels:
    // the first URL's username and password.
    let infos = sentinels
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect::<RedisResult<Vec<_>>>()
        .map_err(refused)?;
    let addrs = infos.iter().map(|info| info.addr().clone());
    let mut builder =
        SentinelClientBuilder::new(addrs, master, SentinelServerType::Master).map_err(refused)?;
    if let Some(first) = infos.first().map(redis::ConnectionInfo::redis_settings) {
        if let Some(user) = first.username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = first.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    if infos
        .iter()
        .all(|info| matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }))
    {
        builder = builder.set_client_to_sentinel_certificates(certificates.clone());
    }
    builder = builder
        .set_client_to_redis_db(settings.db())
        .set_client_to_redis_protocol(settings.protocol());
    if let Some(user) = settings.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = settings.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if master_tls {
        builder = builder
            .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
            .set_client_to_redis_certificates(certificates.clone());
    }
    if let Some(tcp) = tcp {
        builder = builder
            .set_client_to_redis_tcp_settings(tcp.clone())
            .set_client_to_sentinel_tcp_settings(tcp);
    }
    builder.build().map_err(refused)
}

/// `store.tls`'s files as the Redis client takes them.
pub fn certificates(material: StoreTlsMaterial) -> TlsCertificates {
    TlsCertificates {
        client_tls: material
            .identity
            .map(|(client_cert, client_key)| ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: material.ca,
    }
}

/// A client of one node, with `store.tls`'s certificates when set (the URL says whether TLS
/// is spoken at all).
pub fn client(
    info: impl IntoConnectionInfo,
    tls: Option<&TlsCertificates>,
) -> RedisResult<redis::Client> {
    match tls {
        Some(tls) => redis::Client::build_with_tls(info, tls.clone()),
        None => redis::Client::open(info),
    }
}

/// One handle shared by every worker; each kind multiplexes all calls over few sockets (one
/// node: one per thread that calls it).
pub enum Connection {
    Single(Box<SingleNode>),
    /// Routes each command by its first key's slot, follows MOVED/ASK and refreshes the slot map
    /// (failovers included) by itself.
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelMaster>),
}

impl Connection {
    /// Builds the handle without connecting. Must be called inside a Tokio runtime. `timings`
    /// paces the questions to the sentinels.
    pub fn open(
        topology: &Topology<'_>,
        tls: Option<&TlsCertificates>,
        timeout: Duration,
        timings: &Timings,
    ) -> Result<Connection, StoreError> {
        match topology {
            Topology::Single { url } => {
                let info = url
                    .into_connection_info()
                    .map_err(|e| invalid("store.url", &e))?
                    .set_tcp_settings(tcp_settings());
                let client = client(info, tls).map_err(|e| invalid("store.url", &e))?;
                let node = SingleNode::open(client, manager_config(timeout))?;
                Ok(Connection::Single(Box::new(node)))
            }
            Topology::Cluster { seeds } => {
                let mut builder = ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .tcp_settings(tcp_settings());
                if let Some(tls) = tls {
                    builder = builder.certs(tls.clone());
                }
                let client = builder.build().map_err(|e| invalid("store.cluster", &e))?;
                let config = ClusterConfig::new()
                    .set_connection_timeout(connect_timeout(timeout))
                    .set_response_timeout(timeout);
                Ok(Connection::Cluster(
                    client.get_pending_async_connection_with_config(config),
                ))
            }
            Topology::Sentinel { sentinel, url } => {
                let client = sentinel_client(sentinel, url, tls, Some(tcp_settings()))?;
                Ok(Connection::Sentinel(SentinelMaster::follow(
                    client,
                    sentinel.master.clone(),
                    manager_config(timeout),
                    timings,
                )))
            }
        }
    }

    /// Whether calls would be answered now: on one node, by every thread's connection.
    pub async fn ping(&self) -> RedisResult<()> {
        match self {
            Connection::Single(node) => node.ping_all().await,
            _ => self.query(&redis::cmd("PING")).await.map(drop),
        }
    }

    /// Connects this thread's connection to a single node ahead of its first check, which
    /// would otherwise wait for the handshake and setup round trips within its own deadline.
    /// Failures count nowhere: the first check meets them again and reports them.
    pub async fn warm_up(&self, patience: Duration) {
        if let Connection::Single(_) = self {
            let _ = tokio::time::timeout(patience, self.query(&redis::cmd("PING"))).await;
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }

    /// Whether calls wait for the sentinels to name a first master: their failures are the
    /// discovery's at start, not the store's.
    pub fn discovering(&self) -> bool {
        matches!(self, Connection::Sentinel(master) if master.awaiting_first())
    }

    /// Sends one command (to the node owning its first key, on a Cluster).
    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Single(node) => node.query(cmd).await,
            Connection::Cluster(connection) => cmd.query_async(&mut connection.clone()).await,
            Connection::Sentinel(master) => master.query(cmd).await,
        }
    }

    /// Changes whenever calls move to a new connection that this handle knows of (a renewed
    /// single node, a new Sentinel master): scripts must then be sent whole again.
    pub fn generation(&self) -> u64 {
        match self {
            Connection::Single(node) => node.generation.load(Ordering::Acquire),
            Connection::Cluster(_) => 0,
            Connection::Sentinel(master) => master.generation(),
        }
    }

    /// Replaces a single-node connection by a fresh lazy one, connected by the next call (see
    /// the module docs of `store::redis`). A Cluster and Sentinel re-resolve by themselves.
    pub fn renew(&self) {
        if let Connection::Single(node) = self {
            node.renew();
        }
    }

    /// As [`Connection::renew`], only when every current connection started connecting at
    /// least `age` ago: a younger one may still be connecting (each thread connects its own at
    /// its first call), and would be lost with its progress.
    pub fn renew_if_older_than(&self, age: Duration) {
        if let Connection::Single(node) = self {
            if node.youngest().is_some_and(|made| made.elapsed() >= age) {
                node.renew();
            }
        }
    }
}

/// One Redis node. Each thread that calls it gets a connection of its own, whose driver task
/// runs on that thread's runtime: an actix worker then writes its checks to Redis and reads
/// the answers itself. With one connection shared by every worker, its driver ran on another
/// thread, and each check woke that thread and was woken by it: ~3.7 context switches per
/// check at 9.5k checks/s, which cost more CPU than the check itself.
pub struct SingleNode {
    /// This node's identity in the threads' slots; a slot whose node is gone no longer
    /// upgrades its `Weak` of it.
    alive: Arc<()>,
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// Bumped by [`SingleNode::renew`]: each thread replaces its connection on its next call.
    generation: AtomicU64,
    /// Every thread's connection, so that readiness can ask each of them; an entry dies with
    /// its thread's slot.
    /// Each with its generation and when it was made (it connects from its first use, which
    /// is then).
    registry: Mutex<Vec<Registered>>,
}

struct Registered {
    generation: u64,
    made: Instant,
    manager: Weak<ConnectionManager>,
}

/// A thread's connection to one node, made on one runtime at one generation.
struct Slot {
    node: Weak<()>,
    runtime: tokio::runtime::Id,
    generation: u64,
    manager: Arc<ConnectionManager>,
}

thread_local! {
    static SLOTS: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
}

impl SingleNode {
    fn open(
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> Result<SingleNode, StoreError> {
        // Refused here, at start, for what the client would refuse on every thread later.
        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| StoreError::Other(e.to_string()))?;
        Ok(SingleNode {
            alive: Arc::new(()),
            client,
            config,
            generation: AtomicU64::new(0),
            registry: Mutex::new(Vec::new()),
        })
    }

    /// Sends `cmd` on this thread's connection. A `READONLY` answer means the address now
    /// leads to a replica (a master demoted; a Kubernetes Service keeps established
    /// connections on the old pod while new ones reach the promoted one): every connection
    /// is then replaced, so the next call connects again, resolving the address again.
    async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (mut manager, generation) = self.current()?;
        let result = cmd.query_async(&mut manager).await;
        if let Err(error) = &result {
            if error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
                && self.renew_from(generation)
            {
                log::warn!("redis answered READONLY (a replica now): connecting again");
            }
        }
        result
    }

    /// This thread's connection and its generation, made (lazily: it connects on first use)
    /// when the thread has none for this node on this runtime at this generation.
    fn current(&self) -> RedisResult<(ConnectionManager, u64)> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| redis::RedisError::from((ErrorKind::Client, "no Tokio runtime")))?
            .id();
        let generation = self.generation.load(Ordering::Acquire);
        let node = Arc::as_ptr(&self.alive);
        SLOTS.with_borrow_mut(|slots| {
            let found = slots
                .iter()
                .find(|s| s.node.as_ptr() == node && s.runtime == runtime);
            if let Some(slot) = found.filter(|s| s.generation == generation) {
                return Ok((ConnectionManager::clone(&slot.manager), generation));
            }
            let manager = Arc::new(ConnectionManager::new_lazy_with_config(
                self.client.clone(),
                self.config.clone(),
            )?);
            slots.retain(|s| {
                !(s.node.as_ptr() == node && s.runtime == runtime) && s.node.strong_count() > 0
            });
            self.register(generation, &manager);
            slots.push(Slot {
                node: Arc::downgrade(&self.alive),
                runtime,
                generation,
                manager: Arc::clone(&manager),
            });
            Ok((ConnectionManager::clone(&manager), generation))
        })
    }

    fn register(&self, generation: u64, manager: &Arc<ConnectionManager>) {
        let mut registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        registry.retain(|entry| entry.manager.strong_count() > 0);
        registry.push(Registered {
            generation,
            made: Instant::now(),
            manager: Arc::downgrade(manager),
        });
    }

    /// When the youngest connection of the current generation was made.
    fn youngest(&self) -> Option<Instant> {
        let generation = self.generation.load(Ordering::Acquire);
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        registry
            .iter()
            .filter(|entry| entry.generation == generation && entry.manager.strong_count() > 0)
            .map(|entry| entry.made)
            .max()
    }

    /// Readiness: every thread's current connection answers `PING` (checks on any worker
    /// would be decided), this thread's included, all asked at once. The caller bounds it.
    async fn ping_all(&self) -> RedisResult<()> {
        // Registers this thread's connection if it has none yet.
        self.current()?;
        let generation = self.generation.load(Ordering::Acquire);
        let managers: Vec<ConnectionManager> = {
            let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
            registry
                .iter()
                .filter(|entry| entry.generation == generation)
                .filter_map(|entry| entry.manager.upgrade())
                .map(|manager| ConnectionManager::clone(&manager))
                .collect()
        };
        let pings = managers.into_iter().map(|mut manager| async move {
            redis::cmd("PING").query_async::<()>(&mut manager).await
        });
        futures_util::future::join_all(pings)
            .await
            .into_iter()
            .collect()
    }

    fn renew(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// [`SingleNode::renew`], unless the connections were renewed since `generation` (the
    /// calls in flight on them all fail alike, and one renewal serves them all); whether it
    /// renewed.
    fn renew_from(&self, generation: u64) -> bool {
        self.generation
            .compare_exchange(
                generation,
                generation.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }
}

/// How long one connection attempt may take: a connect costs a TCP handshake and the setup
/// commands (two round trips, more with TLS), so a Redis whose round trip fits in the call
/// timeout must still be able to connect. A call never waits longer than its own deadline;
/// the attempt is shared, and the next call goes on with it.
pub fn connect_timeout(timeout: Duration) -> Duration {
    timeout * 4
}

/// `TCP_NODELAY` on every socket to Redis: with Nagle's algorithm a command written while
/// another is in flight waits for the peer's ACK, so concurrent checks would go out in waves
/// one round trip apart (a slow but healthy Redis would then time checks out).
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

pub fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout(timeout)))
        .set_response_timeout(Some(timeout))
        .set_max_delay(MAX_RECONNECT_DELAY)
        // One attempt per call: the breaker paces reconnection (see `Connection::renew`), and
        // the log shows the real error (refused, wrong password) rather than a deadline spent
        // on retries.
        .set_number_of_retries(0)
}

/// The parser's message may quote the URL, password included: name only the kind.
fn invalid(key: &str, error: &redis::RedisError) -> StoreError {
    StoreError::Other(format!("invalid {key} ({:?})", error.kind()))
}
