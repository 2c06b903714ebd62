//! Start-up wiring: the store, the limiter and the shared state are built once and handed to
//! every actix worker; then the public and admin listeners serve until a signal stops them.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Service as _;
use actix_web::http::ConnectionType;
use actix_web::{web, App, HttpServer};

use crate::config::{Backend, Config, DenialLogging, OnError, StoreConfig};
use crate::denial_log::DenialLog;
use crate::lifecycle::{self, Reloader};
use crate::limiter::Limiter;
use crate::limits::Policy;
use crate::metrics::Metrics;
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisStore, Topology};
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

/// Shared by every worker of both listeners.
pub struct AppState {
    pub limiter: Limiter<AnyStore>,
    pub metrics: Metrics,
}

/// The listening sockets, bound before the runtime starts so tests can bind port 0.
pub struct Listeners {
    pub public: TcpListener,
    pub admin: TcpListener,
    /// Envoy's rate limit service, when `grpc_listen` is set.
    pub grpc: Option<TcpListener>,
}

impl Listeners {
    pub fn bind(config: &Config) -> std::io::Result<Listeners> {
        Ok(Listeners {
            public: TcpListener::bind(config.listen)?,
            admin: TcpListener::bind(config.admin_listen)?,
            grpc: config.grpc_listen.map(TcpListener::bind).transpose()?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot serve: {0}")]
    Io(#[from] std::io::Error),
}

/// Builds the shared state. Must run inside the actix (Tokio) runtime: the Redis connection
/// manager spawns its driver there.
pub fn build_state(config: &Config) -> Result<web::Data<AppState>, StartError> {
    let metrics = Metrics::new();
    let policy = Policy::compile(config, &metrics)?;
    let store = match config.store.backend {
        Backend::Memory => AnyStore::Memory(MemoryStore::new(config.store.max_buckets)),
        Backend::Redis => AnyStore::Redis(Box::new(RedisStore::open(
            &topology(&config.store),
            Duration::from_millis(config.store.timeout_ms),
            metrics.clone(),
        )?)),
    };
    let remote = matches!(store, AnyStore::Redis(_));
    let deny_cache = remote && config.store.deny_cache;
    let mut limiter = Limiter::new(
        store,
        policy,
        config.store.on_error,
        config.store.max_buckets,
        metrics.clone(),
    );
    if deny_cache {
        limiter = limiter.with_deny_cache(
            config.store.max_buckets,
            Duration::from_millis(config.store.timeout_ms),
        );
    }
    if config.log.denials == DenialLogging::Sampled {
        limiter = limiter.with_denial_log(DenialLog::default());
    }
    Ok(web::Data::new(AppState { limiter, metrics }))
}

/// Where the Redis store lives: a Cluster, a Sentinel-managed master, or one node.
fn topology(store: &StoreConfig) -> Topology<'_> {
    match &store.sentinel {
        _ if !store.cluster.is_empty() => Topology::Cluster {
            seeds: &store.cluster,
        },
        Some(sentinel) => Topology::Sentinel {
            master: &sentinel.master,
            sentinels: &sentinel.urls,
            url: &store.url,
        },
        None => Topology::Single { url: &store.url },
    }
}

/// Serves until SIGTERM/SIGINT, then drains in-flight checks (at most [`SHUTDOWN_GRACE`]).
pub async fn run(
    config: Config,
    config_path: Option<PathBuf>,
    listeners: Listeners,
) -> Result<(), StartError> {
    let state = build_state(&config)?;
    log::info!(
        "tollgate {} serving /check on {}, metrics on {}; store {}; {} limit(s)",
        env!("CARGO_PKG_VERSION"),
        listeners.public.local_addr()?,
        listeners.admin.local_addr()?,
        config.store.describe(),
        config.limits.len()
    );
    for warning in config.warnings() {
        log::warn!("{warning}");
    }

    // Kept to shut the listening sockets ourselves: actix would reset what the kernel queued.
    let doors = vec![Door::of(&listeners.public)?, Door::of(&listeners.admin)?];
    let public_state = state.clone();
    let draining = Arc::new(AtomicBool::new(false));
    let public_draining = draining.clone();
    let public = HttpServer::new(move || {
        let draining = public_draining.clone();
        App::new()
            .app_data(public_state.clone())
            .wrap_fn(move |request, service| {
                let answer = service.call(request);
                let draining = draining.clone();
                async move {
                    let mut response = answer.await?;
                    if draining.load(Ordering::Relaxed) {
                        // Tells the ingress to stop reusing this connection while we drain.
                        let head = response.response_mut().head_mut();
                        head.set_connection_type(ConnectionType::Close);
                    }
                    Ok(response)
                }
            })
            .configure(crate::http::public_routes)
    })
    .disable_signals()
    .shutdown_timeout((SHUTDOWN_GRACE - CLOSE_NOTICE).as_secs())
    .listen(listeners.public)?
    .run();

    let admin_state = state.clone();
    let admin = HttpServer::new(move || {
        App::new()
            .app_data(admin_state.clone())
            .configure(crate::http::admin_routes)
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout((SHUTDOWN_GRACE - CLOSE_NOTICE).as_secs())
    .listen(listeners.admin)?
    .run();

    if config.store.backend == Backend::Redis && config.store.on_error == OnError::Local {
        actix_web::rt::spawn(lifecycle::count_instances(
            state.clone(),
            crate::keys::instances_key(&config.store.key_prefix),
        ));
    }
    let (stopping, stop_seen) = tokio::sync::watch::channel(false);
    let grpc = match listeners.grpc {
        Some(listener) => {
            log::info!(
                "serving Envoy's rate limit service (gRPC) on {}",
                listener.local_addr()?
            );
            Some(crate::grpc::spawn(listener, state.clone(), stop_seen)?)
        }
        None => None,
    };
    let reloader = Arc::new(Reloader::new(config_path, config, state.clone()));
    actix_web::rt::spawn(lifecycle::watch_signals(
        vec![public.handle(), admin.handle()],
        doors,
        draining,
        stopping,
        reloader,
    ));

    let (public_result, admin_result) = tokio::join!(public, admin);
    if let Some(grpc) = grpc {
        let _ = grpc.await;
    }
    public_result?;
    admin_result?;
    log::info!("tollgate stopped");
    Ok(())
}
