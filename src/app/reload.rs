//! SIGHUP (or a change in a served envoyproxy/ratelimit config directory, or new rules from
//! its xDS server): the config read again into a new policy, swapped in whole.

use std::path::PathBuf;
use std::sync::Mutex;

use actix_web::web;

use crate::state::AppState;
use tollgate_core::config::{Config, ConfigError};
use tollgate_core::erl::config::RuleConfig;
use tollgate_core::policy::Policy;

/// Reloads the config file into a new policy. Only what a policy holds changes live (limits,
/// `[client_ip]`, `[response]`); listeners and the store need a restart, and say so.
pub struct Reloader {
    path: Option<PathBuf>,
    running: Mutex<Config>,
    state: web::Data<AppState>,
    /// The envoyproxy/ratelimit config directory served, and its fingerprint when last read.
    watched: Mutex<Option<(PathBuf, u64)>>,
    /// The rules the xDS server last sent that were installed; `None` before the first.
    /// A reload of the file keeps serving them.
    fed: Mutex<Option<Vec<RuleConfig>>>,
}

impl Reloader {
    pub fn new(path: Option<PathBuf>, running: Config, state: web::Data<AppState>) -> Reloader {
        let watched = watched_dir(&running);
        Reloader {
            path,
            running: Mutex::new(running),
            state,
            watched: Mutex::new(watched),
            fed: Mutex::new(None),
        }
    }

    /// Installs the rules an xDS server sent (or its refusal of them) with the running
    /// config, counted as a reload; on any error keeps the running rules and returns it.
    pub fn install_fed(
        &self,
        fed: Result<Vec<RuleConfig>, ConfigError>,
    ) -> Result<(), ConfigError> {
        let metrics = &self.state.metrics;
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let compiled = fed.and_then(|rules| {
            Policy::compile_fed(&running, metrics, Some(&rules)).map(|policy| (rules, policy))
        });
        let installed = match compiled {
            Ok((rules, policy)) => {
                self.state.limiter.replace_policy(policy);
                self.forget_removed_limits();
                metrics.reload_success.inc();
                self.count_erl_load(true);
                *self.fed.lock().unwrap_or_else(|p| p.into_inner()) = Some(rules);
                Ok(())
            }
            Err(error) => {
                self.forget_removed_limits();
                metrics.reload_failure.inc();
                self.count_erl_load(false);
                Err(error)
            }
        };
        installed
    }

    /// envoyproxy/ratelimit's `config_load_success` / `config_load_error`, when its metrics
    /// are kept.
    fn count_erl_load(&self, success: bool) {
        if let Some(stats) = &self.state.erl_stats {
            stats.config_loaded(success);
        }
    }

    /// Drops the metric series of the limits the running policy does not have: those a swap
    /// removed, and those a refused compile made on its way. Called before the reload is
    /// counted, so a scrape that sees the count never sees the removed limits' series.
    fn forget_removed_limits(&self) {
        let policy = self.state.limiter.policy();
        self.state
            .metrics
            .retain_limits(policy.limits.iter().map(|limit| limit.name.as_str()));
    }

    /// Whether the envoyproxy/ratelimit config directory changed since it was last read (a
    /// file written, added or removed at any depth, a ConfigMap's `..data` link swapped): then
    /// it is time to [`Reloader::reload`].
    pub fn dir_changed(&self) -> bool {
        let changed = {
            let watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
            watched.as_ref().is_some_and(|(dir, seen)| {
                tollgate_core::erl::config::dir_fingerprint(dir) != *seen
            })
        };
        if changed {
            log::info!("reload: the envoyproxy/ratelimit config directory changed");
        }
        changed
    }

    /// Loads, validates and installs the file; on any error keeps the old limits. Listen
    /// addresses and `[store]` (`key_prefix` included) keep their running values: a new
    /// prefix would give every client a fresh bucket.
    pub fn reload(&self) {
        let metrics = &self.state.metrics;
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        // Taken before the files are read: one changed while they are read (a reload of large
        // files takes a while) differs from it, and is read at the next look.
        let before = watched_dir(&running);
        let loaded = Config::load(self.path.as_deref())
            .map(|config| keep_restart_only_settings(config, &running))
            .and_then(|config| {
                let fed = self.fed.lock().unwrap_or_else(|p| p.into_inner());
                Policy::compile_fed(&config, metrics, fed.as_deref()).map(|policy| (config, policy))
            });
        match loaded {
            Ok((config, policy)) => {
                let watched = match before {
                    Some((dir, seen)) if Some(&dir) == config.envoy.config_dir.as_ref() => {
                        Some((dir, seen))
                    }
                    _ => watched_dir(&config),
                };
                *self.watched.lock().unwrap_or_else(|p| p.into_inner()) = watched;
                self.state.limiter.replace_policy(policy);
                self.forget_removed_limits();
                metrics.reload_success.inc();
                self.count_erl_load(true);
                log::info!("reload: {} limit(s) active", config.limits.len());
                *running = config;
            }
            Err(error) => {
                // Not tried again until the directory changes once more.
                if let (Some((dir, seen)), Some((read, fingerprint))) = (
                    self.watched
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .as_mut(),
                    before,
                ) {
                    if *dir == read {
                        *seen = fingerprint;
                    }
                }
                self.forget_removed_limits();
                metrics.reload_failure.inc();
                self.count_erl_load(false);
                log::error!("reload refused, keeping the running limits: {error}");
            }
        }
    }
}

/// The envoyproxy/ratelimit config directory of `config`, with its fingerprint now.
fn watched_dir(config: &Config) -> Option<(PathBuf, u64)> {
    let dir = config.envoy.config_dir.clone()?;
    let seen = tollgate_core::erl::config::dir_fingerprint(&dir);
    Some((dir, seen))
}

/// `loaded` with the running listen addresses and `[store]`, logging each one the file changed.
fn keep_restart_only_settings(mut loaded: Config, running: &Config) -> Config {
    let changed = [
        ("listen", loaded.listen != running.listen),
        ("admin_listen", loaded.admin_listen != running.admin_listen),
        ("grpc_listen", loaded.grpc_listen != running.grpc_listen),
        ("[store]", loaded.store != running.store),
        ("envoy.xds", loaded.envoy.xds != running.envoy.xds),
        (
            "envoy.metrics",
            loaded.envoy.metrics != running.envoy.metrics,
        ),
        ("[tracing]", loaded.tracing != running.tracing),
    ];
    for (name, _) in changed.iter().filter(|(_, changed)| *changed) {
        log::warn!("reload: {name} changed in the file; it applies only after a restart, the running value stays");
    }
    loaded.listen = running.listen;
    loaded.admin_listen = running.admin_listen;
    loaded.grpc_listen = running.grpc_listen;
    loaded.store = running.store.clone();
    // The client connected with the running settings; a new server or node needs a restart.
    loaded.envoy.xds = running.envoy.xds.clone();
    // Its listener and statsd duty started with the running settings.
    loaded.envoy.metrics = running.envoy.metrics.clone();
    // The exporter started with the running settings.
    loaded.tracing = running.tracing.clone();
    loaded
}
