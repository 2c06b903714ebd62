//! Start-up wiring: the shared state is built once and handed to every worker; the public,
//! admin and gRPC listeners serve until the shutdown future resolves, then drain.
//!
//! [`run`] takes the shutdown as a future so tests serve in process and stop on their own
//! signal; [`start`] is what the binary runs: the state, the background duties, and
//! SIGTERM/SIGINT as the shutdown (SIGHUP reloads).

use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Service as _;
use actix_web::http::ConnectionType;
use actix_web::{web, App, HttpServer};

use crate::app::drain::{self, Door};
use crate::app::grpc_tls::LiveTls;
use crate::app::heartbeat;
use crate::app::reload::Reloader;
use crate::app::signals;
use crate::state::{build_state, redis_tls, topology, AppState, StartError};
use tollgate_core::config::{Backend, Config, OnError, StoreConfig};
use tollgate_core::policy::runtime_overrides::sync;
use tollgate_core::store::redis::resets::{self, Heard, ResetSource};
use tollgate_core::store::AnyStore;
use tollgate_erl::app::metrics::{self as erl_metrics, PrometheusListener};

/// The listening sockets, bound before the runtime starts so tests can bind port 0.
pub struct Listeners {
    pub public: TcpListener,
    pub admin: TcpListener,
    /// Envoy's rate limit service, when `grpc_listen` is set.
    pub grpc: Option<TcpListener>,
    /// How `grpc` speaks TLS, when `grpc_tls` is set: its certificates, followed as they
    /// change.
    pub grpc_tls: Option<Arc<LiveTls>>,
    /// Most connections `grpc` holds at once (`grpc_max_connections`, or its default).
    pub grpc_max_connections: u32,
    /// envoyproxy/ratelimit's Prometheus series, when `envoy.metrics.prometheus_listen` is set.
    pub erl_prometheus: Option<PrometheusListener>,
}

impl Listeners {
    /// Reads the gRPC listener's certificates, then binds: a bad file is refused before any
    /// port is taken.
    pub fn bind(config: &Config) -> Result<Listeners, StartError> {
        let grpc_tls = match &config.grpc_tls {
            Some(tls) => Some(Arc::new(LiveTls::load(tls.clone())?)),
            None => None,
        };
        let descriptors = crate::app::descriptors::raise_soft_limit();
        Ok(Listeners {
            grpc_tls,
            grpc_max_connections: config.grpc_max_connections.unwrap_or_else(|| {
                crate::app::descriptors::default_grpc_max_connections(descriptors)
            }),
            public: Door::defer_until_request(TcpListener::bind(config.listen)?)?,
            admin: TcpListener::bind(config.admin_listen)?,
            grpc: config.grpc_listen.map(TcpListener::bind).transpose()?,
            erl_prometheus: match config.envoy.metrics.prometheus_listen {
                Some(address) => Some(PrometheusListener {
                    listener: TcpListener::bind(address)?,
                    path: config.envoy.metrics.prometheus_path.clone(),
                }),
                None => None,
            },
        })
    }
}

/// The binary's service: serves `config` until SIGTERM/SIGINT (SIGHUP reloads `config_path`),
/// then drains in-flight checks (at most the `shutdown_grace` of [`Config::timings`]).
pub async fn start(
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
    spawn_duties(&config, &state)?;
    erl_metrics::spawn_duty(&config.envoy.metrics, state.erl_stats.as_ref());
    let watch_every = config.timings.watch_every;
    let xds = config.envoy.xds.clone();
    let reloader = Arc::new(Reloader::new(config_path, config, state.clone()));
    if let Some(xds) = xds {
        let reloader = reloader.clone();
        let install = Arc::new(move |fed| reloader.install_fed(fed));
        actix_web::rt::spawn(tollgate_erl::app::xds::follow(xds, install));
    }
    let stop = signals::stop_signal(reloader, watch_every);
    run(state, listeners, stop).await?;
    log::info!("tollgate stopped");
    Ok(())
}

/// Starts what a serving instance does besides answering: with a Redis store, following the
/// runtime overrides, hearing bucket resets (with a deny cache) and, with
/// `on_error = "local"`, the heartbeat that counts instances; in a region (any store), its
/// reporter to the home.
pub fn spawn_duties(config: &Config, state: &web::Data<AppState>) -> Result<(), StartError> {
    if let Some(region) = &config.region {
        actix_web::rt::spawn(crate::app::region::report(
            state.clone(),
            region.clone(),
            heartbeat::instance_id(),
        ));
    }
    if config.store.backend != Backend::Redis {
        return Ok(());
    }
    let poll_every = Duration::from_millis(config.store.override_poll_ms);
    actix_web::rt::spawn(follow_runtime_overrides(state.clone(), poll_every));
    // Resets reach the deny cache and the slices of borrowed tokens at once (slices end
    // within one horizon anyway).
    let borrows = config.store.borrow || config.limits.iter().any(|l| l.borrow == Some(true));
    if config.store.deny_cache || borrows {
        listen_for_resets(&config.store, state.clone())?;
    }
    if let Some(lender) = state.limiter.lender() {
        let every = Duration::from_micros(lender.horizon_us() / 8);
        actix_web::rt::spawn(give_back_quiet_slices(state.clone(), every));
    }
    if config.store.on_error == OnError::Local {
        actix_web::rt::spawn(heartbeat::count_instances(
            state.clone(),
            tollgate_core::base::keys::instances_key(&config.store.key_prefix),
        ));
    }
    Ok(())
}

/// Gives back, every `every`, the slices of borrowed tokens no request of their key gave
/// back once their usable time ended (a quiet key's last slice).
async fn give_back_quiet_slices(state: web::Data<AppState>, every: Duration) {
    /// Give-backs per tick: a bounded burst of store calls, the rest at the next tick.
    const MOST: usize = 256;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        state.limiter.give_back_quiet(MOST).await;
    }
}

/// Follows the store's runtime overrides for as long as the instance runs (Redis only).
async fn follow_runtime_overrides(state: web::Data<AppState>, every: Duration) {
    let AnyStore::Redis(store) = state.limiter.store() else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let policy = state.limiter.policy();
        match sync::sync_once(store, &policy.runtime, &policy.key_prefix).await {
            Ok(()) if failing => {
                log::info!("runtime overrides: the store answers again");
                failing = false;
            }
            Ok(()) => {}
            Err(error) if !failing => {
                log::warn!(
                    "runtime overrides: cannot read the store, keeping the last known: {error}"
                );
                failing = true;
            }
            Err(_) => {}
        }
    }
}

/// Makes this instance's deny cache forget every bucket reset on any instance
/// (`DELETE /v1/buckets`), as the reset channel announces them.
fn listen_for_resets(store: &StoreConfig, state: web::Data<AppState>) -> Result<(), StartError> {
    let source = ResetSource::of(&topology(store), redis_tls(store)?.as_ref())?;
    let channel = tollgate_core::base::keys::resets_channel(&store.key_prefix);
    let timings = state.timings;
    actix_web::rt::spawn(resets::listen(
        source,
        channel,
        timings,
        move |heard| match heard {
            Heard::Reset(key) => state.limiter.forget_denials(&key),
            Heard::Everything => state.limiter.forget_all_denials(),
        },
    ));
    Ok(())
}

/// Serves every listener until `shutdown` resolves, then refuses new connections, answers
/// what is queued and in flight (for the `shutdown_grace` of the state's timings), and
/// returns when every listener has stopped.
pub async fn run(
    state: web::Data<AppState>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + 'static,
) -> std::io::Result<()> {
    // Kept to shut the listening sockets ourselves: actix would reset what the kernel queued.
    let doors = vec![Door::of(&listeners.public)?, Door::of(&listeners.admin)?];
    let timings = state.timings;
    let draining = Arc::new(AtomicBool::new(false));
    let public = public_server(state.clone(), listeners.public, draining.clone())?;
    let admin_state = state.clone();
    let admin = HttpServer::new(move || {
        App::new()
            .app_data(admin_state.clone())
            .wrap(actix_web::middleware::from_fn(
                crate::http::admin::host_guard,
            ))
            .configure(crate::http::admin_routes)
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(whole_seconds(timings.after_notice()))
    .listen(listeners.admin)?
    .run();

    let erl = match (listeners.erl_prometheus, &state.erl_stats) {
        (Some(listener), Some(stats)) => Some(erl_metrics::prometheus_server(
            listener,
            Arc::clone(stats),
            whole_seconds(timings.after_notice()),
        )?),
        _ => None,
    };

    let (stopping, stop_seen) = tokio::sync::watch::channel(false);
    let grpc = match listeners.grpc {
        Some(listener) => {
            log::info!(
                "serving Envoy's rate limit service (gRPC{}) on {}",
                if listeners.grpc_tls.is_some() {
                    " over TLS"
                } else {
                    ""
                },
                listener.local_addr()?
            );
            Some(crate::app::grpc_server::spawn(
                listener,
                listeners.grpc_tls,
                listeners.grpc_max_connections,
                state,
                stop_seen,
            )?)
        }
        None => None,
    };
    let mut handles = vec![public.handle(), admin.handle()];
    handles.extend(erl.as_ref().map(actix_web::dev::Server::handle));
    // A server runs while it is polled: this one beside the two joined below.
    let erl = erl.map(actix_web::rt::spawn);
    actix_web::rt::spawn(async move {
        shutdown.await;
        drain::drain(handles, doors, draining, stopping, timings.close_notice).await;
    });

    let (public_result, admin_result) = tokio::join!(public, admin);
    if let Some(grpc) = grpc {
        let _ = grpc.await;
    }
    if let Some(erl) = erl {
        erl.await.map_err(std::io::Error::other)??;
    }
    public_result?;
    admin_result
}

/// What a public worker's start registers: its Redis connection is being made.
struct WorkerStarted;

/// The listener the ingress calls. While draining, every answer says `Connection: close`.
fn public_server(
    state: web::Data<AppState>,
    listener: TcpListener,
    draining: Arc<AtomicBool>,
) -> std::io::Result<actix_web::dev::Server> {
    let after_notice = whole_seconds(state.timings.after_notice());
    Ok(HttpServer::new(move || {
        let draining = draining.clone();
        let warm = state.clone();
        App::new()
            .app_data(state.clone())
            // Each worker has its own Redis connection: connect it before the first check.
            .data_factory(move || {
                let state = warm.clone();
                async move {
                    actix_web::rt::spawn(async move { state.limiter.store().warm_up().await });
                    Ok::<_, std::convert::Infallible>(WorkerStarted)
                }
            })
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
            .configure(crate::grpc::json::routes)
            .configure(crate::http::public_routes)
    })
    .disable_signals()
    .shutdown_timeout(after_notice)
    .listen(listener)?
    .run())
}

/// Seconds for actix's shutdown timeout, which takes whole ones: rounded up, so a shortened
/// grace period (tests) never becomes none.
fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}
