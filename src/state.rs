//! What every worker of every listener shares: the limiter (policy, store, deny cache) and
//! the metrics. Built once at start; tests build it themselves to serve in process.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web;

use crate::otlp::spawn_exporter;
use redis::TlsCertificates;
use tollgate_core::base::timings::Timings;
use tollgate_core::config::{Backend, Config, ConfigError, DenialLogging, OnError, StoreConfig};
use tollgate_core::erl::observe::ErlStats;
use tollgate_core::limiter::borrow::Lender;
use tollgate_core::limiter::Limiter;
use tollgate_core::observe::denial_log::DenialLog;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::observe::trace::Tracer;
use tollgate_core::policy::Policy;
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::redis::{certificates, RedisStore, Topology};
use tollgate_core::store::{AnyStore, Store, StoreError};

/// Shared by every worker of both listeners.
pub struct AppState {
    pub limiter: Limiter<AnyStore>,
    pub metrics: Metrics,
    /// Admin reads that call the store (peeks) in flight: bounded, so the readiness probe's
    /// own store call never queues behind a flood of them.
    pub admin_reads: AtomicUsize,
    /// The intervals of the background duties and of the drain ([`Config::timings`]).
    pub timings: Timings,
    /// envoyproxy/ratelimit's metrics, when `[envoy.metrics]` serves or sends them.
    pub erl_stats: Option<Arc<ErlStats>>,
    /// Opens the decisions' spans; `None` with tracing off.
    pub tracer: Option<Tracer>,
}

/// What readiness says, and why.
#[derive(Debug)]
pub enum Readiness {
    /// The store answers.
    Ready,
    /// The store fails, but it answered before and `on_error` decides without it.
    Degraded(StoreError),
    NotReady(String),
}

impl AppState {
    /// Whether tollgate can decide now: the store answers, or it answered before and
    /// `on_error` decides without it; and rules fed by xDS have arrived (unless
    /// `envoy.xds.ready_before_config`). What every readiness answer reports (`/readyz`, gRPC
    /// health, `/healthcheck`). Never ready before the store first answered (under Sentinel:
    /// before the master is known), as envoyproxy/ratelimit serves only once Redis answers;
    /// nor while the store refuses scripts, whatever `on_error`: that cannot heal by itself,
    /// and a rollout should stop rather than go on failing open.
    pub async fn readiness(&self) -> Readiness {
        if self.unready_for_config() {
            return Readiness::NotReady("no configuration from the xDS server yet".into());
        }
        let store = self.limiter.store();
        match store.ping().await {
            Ok(()) => Readiness::Ready,
            Err(error @ StoreError::ScriptsRefused(_)) => Readiness::NotReady(error.to_string()),
            Err(error) if !store.has_answered() => {
                Readiness::NotReady(format!("the store has not answered yet ({error})"))
            }
            Err(error) if self.limiter.on_error() != OnError::Deny => Readiness::Degraded(error),
            Err(error) => Readiness::NotReady(error.to_string()),
        }
    }

    /// [`AppState::readiness`] as yes or no.
    pub async fn can_decide(&self) -> bool {
        !matches!(self.readiness().await, Readiness::NotReady(_))
    }

    /// Rules fed by xDS have not arrived, and the instance is not ready until they do.
    pub fn unready_for_config(&self) -> bool {
        let erl = &self.limiter.policy().erl;
        erl.awaiting_config && !erl.ready_while_awaiting
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Config(#[from] ConfigError),
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
        Backend::Redis => AnyStore::Redis(Box::new(
            RedisStore::open(
                &topology(&config.store),
                redis_tls(&config.store)?.as_ref(),
                Duration::from_millis(config.store.timeout_ms),
                metrics.clone(),
                &config.timings,
            )?
            .with_coalesce_window(Duration::from_millis(config.store.coalesce_window_ms)),
        )),
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
    if remote {
        limiter = limiter.with_lender(
            Lender::new(
                config.store.max_buckets,
                config.store.borrow_horizon_ms * 1000,
            )
            .with_longest_horizon(config.store.borrow_longest_horizon_ms * 1000),
        );
    }
    if config.log.denials == DenialLogging::Sampled {
        limiter = limiter.with_denial_log(DenialLog::default());
    }
    let erl = &config.envoy.metrics;
    let erl_stats = erl.enabled().then(|| {
        let stats = ErlStats::new(erl.near_limit_ratio, erl.response_time_ms, erl.max_keys);
        if !limiter.policy().erl.awaiting_config {
            stats.config_loaded(true);
        }
        Arc::new(stats)
    });
    let tracer = if config.tracing.enabled {
        Some(spawn_exporter(
            &config.tracing,
            config.timings.trace_export_every,
            metrics.trace_spans.clone(),
        )?)
    } else {
        None
    };
    Ok(web::Data::new(AppState {
        tracer,
        limiter,
        metrics,
        admin_reads: AtomicUsize::new(0),
        timings: config.timings,
        erl_stats,
    }))
}

/// `store.tls`'s certificates, read again at start (the config's check read them too).
pub(crate) fn redis_tls(store: &StoreConfig) -> Result<Option<TlsCertificates>, ConfigError> {
    store
        .tls
        .as_ref()
        .map(|tls| tollgate_core::config::store_tls::load(tls).map(certificates))
        .transpose()
}

/// Where the Redis store lives: a Cluster, a Sentinel-managed master, or one node.
pub(crate) fn topology(store: &StoreConfig) -> Topology<'_> {
    match &store.sentinel {
        _ if !store.cluster.is_empty() => Topology::Cluster {
            seeds: &store.cluster,
        },
        Some(sentinel) => Topology::Sentinel {
            sentinel,
            url: &store.url,
        },
        None => Topology::Single { url: &store.url },
    }
}
