//! Following the master that Redis Sentinel names. A background task asks the sentinels for
//! the master (and checks its `ROLE`) at start, every `sentinel_poll_every` (see [`Timings`]),
//! and at once when a call fails in a way a failover explains (connection lost, timeout,
//! `READONLY` from a demoted master). When the address changes, calls move to a new
//! connection. Until the first master is known, a call waits for the sentinels' answer under
//! way (within its own deadline) rather than failing at once: the first checks are decided by
//! the store, not by `on_error`, only because the sentinels had not answered yet. A call that
//! saw that answer name no master fails with its reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelClient;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::sync::Notify;

use crate::base::timings::Timings;

/// Bound on one discovery (sentinel query + `ROLE` check of the master).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(1);

struct Master {
    addr: String,
    connection: ConnectionManager,
}

pub struct SentinelMaster {
    current: ArcSwapOption<Master>,
    /// Why the last discovery found no master (a sentinel's refusal names a missing password),
    /// for the calls that fail meanwhile.
    last_failure: ArcSwapOption<String>,
    wake: Notify,
    /// Woken at the end of every discovery, for the calls waiting for a first master.
    settled: Notify,
    /// Bumped on every change of master (a new connection).
    generation: AtomicU64,
}

impl SentinelMaster {
    /// Starts following `name` in the background. Must be called inside a Tokio runtime.
    pub fn follow(
        client: SentinelClient,
        name: String,
        config: ConnectionManagerConfig,
        timings: &Timings,
    ) -> Arc<SentinelMaster> {
        let master = Arc::new(SentinelMaster {
            current: ArcSwapOption::empty(),
            last_failure: ArcSwapOption::empty(),
            wake: Notify::new(),
            settled: Notify::new(),
            generation: AtomicU64::new(0),
        });
        tokio::spawn(discover_forever(
            master.clone(),
            client,
            name,
            config,
            *timings,
        ));
        master
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether no master was ever known: the sentinels are still being asked for the first.
    pub fn awaiting_first(&self) -> bool {
        self.current.load().is_none()
    }

    /// Sends `cmd` to the master. Before the first one is known, waits for the discovery under
    /// way (the caller's deadline bounds the wait), asking the sentinels at once; if it named
    /// no master, fails with its reason.
    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let mut waited = false;
        let master = loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            // Registered before looking, so a discovery ending in between still wakes it.
            settled.as_mut().enable();
            if let Some(master) = self.current.load_full() {
                break master;
            }
            if waited {
                let why = self.last_failure.load();
                let why = why
                    .as_deref()
                    .map_or("the sentinels named none", String::as_str);
                return Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    format!("no master known yet: {why}"),
                )));
            }
            self.wake.notify_one();
            settled.await;
            waited = true;
        };
        let result = cmd.query_async(&mut master.connection.clone()).await;
        if let Err(error) = &result {
            if failover_suspected(error) {
                self.wake.notify_one();
            }
        }
        result
    }
}

impl SentinelMaster {
    /// Records why a discovery failed; logged once per distinct reason (a missing password
    /// fails every second the same way), the calls' errors say it meanwhile.
    fn failed(&self, why: String) {
        let same = self.last_failure.load().as_deref() == Some(&why);
        if !same {
            log::warn!("sentinel: {why}");
            self.last_failure.store(Some(Arc::new(why)));
        }
    }
}

fn failover_suspected(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
}

async fn discover_forever(
    master: Arc<SentinelMaster>,
    mut client: SentinelClient,
    name: String,
    config: ConnectionManagerConfig,
    timings: Timings,
) {
    loop {
        match tokio::time::timeout(DISCOVERY_TIMEOUT, client.async_get_client()).await {
            Ok(Ok(found)) => {
                if master.last_failure.load().is_some() {
                    master.last_failure.store(None);
                }
                let addr = found.get_connection_info().addr().to_string();
                let known = master.current.load();
                if known.as_ref().map(|m| m.addr.as_str()) != Some(addr.as_str()) {
                    match ConnectionManager::new_lazy_with_config(found, config.clone()) {
                        Ok(connection) => {
                            log::info!("sentinel: master {name:?} is at {addr}");
                            master
                                .current
                                .store(Some(Arc::new(Master { addr, connection })));
                            master.generation.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(error) => log::warn!("sentinel: cannot use master {addr}: {error}"),
                    }
                }
            }
            Ok(Err(error)) => master.failed(format!("sentinels gave no master {name:?}: {error}")),
            Err(_) => master.failed(format!(
                "sentinels did not name master {name:?} within {DISCOVERY_TIMEOUT:?}"
            )),
        }
        master.settled.notify_waiters();
        // At most one question every `sentinel_min_gap`, however many calls fail; one every
        // `sentinel_poll_every` even when all is well (a failover may also come without any
        // failed call, e.g. `SENTINEL FAILOVER` while idle).
        tokio::time::sleep(timings.sentinel_min_gap).await;
        tokio::select! {
            _ = master.wake.notified() => {}
            _ = tokio::time::sleep(timings.sentinel_poll_every) => {}
        }
    }
}
