//! Signals and the background duties of a running instance: SIGTERM/SIGINT drain and stop,
//! SIGHUP reloads the limits, and (with `on_error = "local"`) a heartbeat counts the
//! instances sharing Redis.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::web;
use tokio::signal::unix::{signal, SignalKind};

use crate::config::Config;
use crate::policy::limits::Policy;
use crate::state::AppState;
use crate::store::AnyStore;

mod door;
pub use door::Door;

/// In-flight checks get this long to finish after SIGTERM, [`CLOSE_NOTICE`] included.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// After SIGTERM, how long requests on open keep-alive connections are still answered (with
/// `Connection: close`) before idle connections are closed. Closing a busy keep-alive
/// connection without notice loses the request the client is sending at that moment. New
/// connections are refused from the start of the notice.
pub const CLOSE_NOTICE: Duration = Duration::from_secs(1);

/// How often an instance announces itself; an instance silent for [`INSTANCE_TTL`] is gone.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
const INSTANCE_TTL: Duration = Duration::from_secs(6);

/// After new SYNs are held back, how long handshakes already under way get to complete and be
/// accepted before we look whether the accept queue is empty.
const HANDSHAKE_SETTLE: Duration = Duration::from_millis(50);
/// How long the accept thread gets to act on a pause before the queue is inspected.
const PAUSE_SETTLE: Duration = Duration::from_millis(10);

/// Reloads the config file into a new policy. Only what a policy holds changes live (limits,
/// `[client_ip]`, `[response]`); listeners and the store need a restart, and say so.
pub struct Reloader {
    path: Option<PathBuf>,
    running: Mutex<Config>,
    state: web::Data<AppState>,
    /// The envoyproxy/ratelimit config directory served, and its fingerprint when last read.
    watched: Mutex<Option<(PathBuf, u64)>>,
}

/// How often the envoyproxy/ratelimit config directory is looked at for changes.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

impl Reloader {
    pub fn new(path: Option<PathBuf>, running: Config, state: web::Data<AppState>) -> Reloader {
        let watched = watched_dir(&running);
        Reloader {
            path,
            running: Mutex::new(running),
            state,
            watched: Mutex::new(watched),
        }
    }

    /// Reloads when the envoyproxy/ratelimit config directory changed since it was last read
    /// (a file written, added or removed, a ConfigMap's `..data` link swapped).
    pub fn reload_if_changed(&self) {
        let changed = {
            let watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
            watched
                .as_ref()
                .is_some_and(|(dir, seen)| crate::config::envoy::dir_fingerprint(dir) != *seen)
        };
        if changed {
            log::info!("reload: the envoyproxy/ratelimit config directory changed");
            self.reload();
        }
    }

    /// Loads, validates and installs the file; on any error keeps the old limits. Listen
    /// addresses and `[store]` (`key_prefix` included) keep their running values: a new
    /// prefix would give every client a fresh bucket.
    pub fn reload(&self) {
        let metrics = &self.state.metrics;
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let loaded = Config::load(self.path.as_deref())
            .map(|config| keep_restart_only_settings(config, &running))
            .and_then(|config| Policy::compile(&config, metrics).map(|policy| (config, policy)));
        match loaded {
            Ok((config, policy)) => {
                *self.watched.lock().unwrap_or_else(|p| p.into_inner()) = watched_dir(&config);
                self.state.limiter.replace_policy(policy);
                metrics.reload_success.inc();
                log::info!("reload: {} limit(s) active", config.limits.len());
                *running = config;
            }
            Err(error) => {
                // Not tried again until the directory changes once more.
                if let Some((dir, seen)) = self
                    .watched
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                {
                    *seen = crate::config::envoy::dir_fingerprint(dir);
                }
                metrics.reload_failure.inc();
                log::error!("reload refused, keeping the running limits: {error}");
            }
        }
    }
}

/// The envoyproxy/ratelimit config directory of `config`, with its fingerprint now.
fn watched_dir(config: &Config) -> Option<(PathBuf, u64)> {
    let dir = config.envoy.config_dir.clone()?;
    let seen = crate::config::envoy::dir_fingerprint(&dir);
    Some((dir, seen))
}

/// `loaded` with the running listen addresses and `[store]`, logging each one the file changed.
fn keep_restart_only_settings(mut loaded: Config, running: &Config) -> Config {
    let changed = [
        ("listen", loaded.listen != running.listen),
        ("admin_listen", loaded.admin_listen != running.admin_listen),
        ("grpc_listen", loaded.grpc_listen != running.grpc_listen),
        ("[store]", loaded.store != running.store),
    ];
    for (name, _) in changed.iter().filter(|(_, changed)| *changed) {
        log::warn!("reload: {name} changed in the file; it applies only after a restart, the running value stays");
    }
    loaded.listen = running.listen;
    loaded.admin_listen = running.admin_listen;
    loaded.grpc_listen = running.grpc_listen;
    loaded.store = running.store.clone();
    loaded
}

/// Resolves at SIGTERM or SIGINT; SIGHUP reloads the limits meanwhile. The binary's
/// shutdown future for [`crate::app::server::run`].
pub async fn stop_signal(reloader: Reloader) {
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        log::error!("cannot install signal handlers; stop tollgate with SIGKILL");
        return std::future::pending().await;
    };
    let mut watch = tokio::time::interval(WATCH_EVERY);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => reloader.reload(),
            _ = watch.tick() => reloader.reload_if_changed(),
        }
    }
}

/// Stops the HTTP servers gracefully and tells the gRPC service (`stopping`): new
/// connections are refused (none the kernel already accepted is reset); for
/// [`CLOSE_NOTICE`] every answer says `Connection: close` (`draining`), then idle
/// connections close and in-flight checks finish.
pub async fn drain(
    servers: Vec<ServerHandle>,
    doors: Vec<Door>,
    draining: Arc<AtomicBool>,
    stopping: tokio::sync::watch::Sender<bool>,
) {
    log::info!("shutting down: no new connections, finishing in-flight checks");
    let notice_ends = Instant::now() + CLOSE_NOTICE;
    draining.store(true, Ordering::Relaxed);
    // The gRPC service drains on its own (see `grpc::spawn`).
    stopping.send_replace(true);
    stop_accepting(&servers, &doors, notice_ends).await;
    tokio::time::sleep_until(notice_ends.into()).await;
    let stops = servers.iter().map(|server| server.stop(true));
    for stop in stops.collect::<Vec<_>>() {
        stop.await;
    }
}

/// Hold new SYNs back, let actix accept what the kernel queued until the queues stay empty,
/// then take the sockets out of LISTEN so later clients are refused at once.
async fn stop_accepting(servers: &[ServerHandle], doors: &[Door], give_up: Instant) {
    for door in doors {
        if let Err(error) = door.hold_new_connections() {
            log::warn!("cannot hold new connections back; some may be reset: {error}");
        }
    }
    loop {
        tokio::time::sleep(HANDSHAKE_SETTLE).await;
        for server in servers {
            server.pause().await;
        }
        tokio::time::sleep(PAUSE_SETTLE).await;
        if !doors.iter().any(Door::has_waiting) {
            break;
        }
        if Instant::now() >= give_up {
            log::warn!("closing listeners with connections still queued; they are reset");
            break;
        }
        for server in servers {
            server.resume().await;
        }
    }
    for door in doors {
        if let Err(error) = door.shut() {
            log::warn!("cannot shut a listener: {error}");
        }
    }
}

/// Keeps this instance's heartbeat in Redis and learns how many instances share it.
pub async fn count_instances(state: web::Data<AppState>, registry_key: String) {
    let AnyStore::Redis(store) = state.limiter.store() else {
        return;
    };
    let instance = instance_id();
    let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        tick.tick().await;
        match store
            .heartbeat(&registry_key, &instance, INSTANCE_TTL)
            .await
        {
            Ok(count) if count != state.limiter.instances() => {
                log::info!("{count} tollgate instance(s) share this store");
                state.limiter.set_instances(count);
            }
            Ok(_) => {}
            // Keep the last count: it is what the local fallback needs during an outage.
            Err(error) => log::debug!("instance heartbeat failed: {error}"),
        }
    }
}

fn instance_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{host}-{}-{nanos}", std::process::id())
}
