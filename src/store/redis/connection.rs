//! The connection to Redis, whichever way it is deployed: one node (`store.url`), a Cluster
//! (`store.cluster`), or the master that Sentinel names (`store.sentinel`). All three connect
//! lazily, so tollgate starts and answers per `on_error` while Redis is unreachable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo, RedisResult, Value};

use super::sentinel::SentinelMaster;
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
    /// `url` supplies the master's database, username and password (its host is ignored).
    Sentinel {
        master: &'a str,
        sentinels: &'a [String],
        url: &'a str,
    },
}

/// One handle shared by every worker; each kind multiplexes all calls over few sockets.
pub enum Connection {
    Single(Box<SingleNode>),
    /// Routes each command by its first key's slot, follows MOVED/ASK and refreshes the slot map
    /// (failovers included) by itself.
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelMaster>),
}

impl Connection {
    /// Builds the handle without connecting. Must be called inside a Tokio runtime.
    pub fn open(topology: &Topology<'_>, timeout: Duration) -> Result<Connection, StoreError> {
        match topology {
            Topology::Single { url } => {
                let info = url
                    .into_connection_info()
                    .map_err(|e| invalid("store.url", &e))?
                    .set_tcp_settings(tcp_settings());
                let client = redis::Client::open(info).map_err(|e| invalid("store.url", &e))?;
                let node = SingleNode::open(client, manager_config(timeout))?;
                Ok(Connection::Single(Box::new(node)))
            }
            Topology::Cluster { seeds } => {
                let client = ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .tcp_settings(tcp_settings())
                    .build()
                    .map_err(|e| invalid("store.cluster", &e))?;
                let config = ClusterConfig::new()
                    .set_connection_timeout(connect_timeout(timeout))
                    .set_response_timeout(timeout);
                Ok(Connection::Cluster(
                    client.get_pending_async_connection_with_config(config),
                ))
            }
            Topology::Sentinel {
                master,
                sentinels,
                url,
            } => {
                let node = url
                    .into_connection_info()
                    .map_err(|e| invalid("store.url", &e))?;
                let node_info = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(node.redis_settings().clone())
                    .set_tcp_settings(tcp_settings());
                let client = SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    *master,
                    Some(node_info),
                    SentinelServerType::Master,
                )
                .map_err(|e| invalid("store.sentinel", &e))?;
                Ok(Connection::Sentinel(SentinelMaster::follow(
                    client,
                    master.to_string(),
                    manager_config(timeout),
                )))
            }
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }

    /// Sends one command (to the node owning its first key, on a Cluster).
    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Single(node) => cmd.query_async(&mut node.current()).await,
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
}

/// One Redis node, behind a connection that can be swapped whole.
pub struct SingleNode {
    current: ArcSwap<ConnectionManager>,
    client: redis::Client,
    config: ConnectionManagerConfig,
    generation: AtomicU64,
}

impl SingleNode {
    fn open(
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> Result<SingleNode, StoreError> {
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| StoreError::Other(e.to_string()))?;
        Ok(SingleNode {
            current: ArcSwap::from_pointee(manager),
            client,
            config,
            generation: AtomicU64::new(0),
        })
    }

    fn current(&self) -> ConnectionManager {
        ConnectionManager::clone(&self.current.load())
    }

    fn renew(&self) {
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(fresh) => {
                self.current.store(Arc::new(fresh));
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
            Err(e) => log::debug!("cannot renew the Redis connection: {:?}", e.kind()),
        }
    }
}

/// How long one connection attempt may take: a connect costs a TCP handshake and the setup
/// commands (two round trips, more with TLS), so a Redis whose round trip fits in the call
/// timeout must still be able to connect. A call never waits longer than its own deadline;
/// the attempt is shared, and the next call goes on with it.
fn connect_timeout(timeout: Duration) -> Duration {
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
