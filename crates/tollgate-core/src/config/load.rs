//! Loading: built-in defaults, then the TOML file, then the `TOLLGATE_*` environment; and the
//! error every refusal becomes.

use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;

use super::{Config, Secret};
use crate::base::timings::{Timings, TEST_SCALE_ENV};

/// Environment variables that carry the config file path, or that Kubernetes injects for a
/// Service named `tollgate` (`TOLLGATE_SERVICE_HOST`, `TOLLGATE_PORT_8080_TCP`, ...). They are
/// not config keys, and refusing them would crash-loop a pod for a name clash.
/// `admin_token` and `fingerprint_salt` are read from their variables verbatim instead (a
/// secret of digits would otherwise parse as a number), and `TOLLGATE_TEST_TIMINGS_SCALE`
/// (testing only) into [`Config::timings`].
const NON_CONFIG_ENV: &[&str] = &[
    "config",
    "service_host",
    "service_port",
    "port",
    "admin_token",
    "fingerprint_salt",
    "test_timings_scale",
];

/// A refused configuration: the dotted key and why, printed as one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The same error for a key relative to `at` (`""` names `at` itself).
    pub fn within(mut self, at: &str) -> Self {
        self.key = if self.key.is_empty() {
            at.to_string()
        } else {
            format!("{at}.{}", self.key)
        };
        self
    }
}

impl From<figment::Error> for ConfigError {
    fn from(error: figment::Error) -> Self {
        let mut path = error.path.join(".");
        let reason = match &error.kind {
            figment::error::Kind::UnknownField(field, _) => {
                if error.path.last() != Some(field) {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(field);
                }
                "unknown key".to_string()
            }
            figment::error::Kind::Message(msg)
                if msg.contains("parse error") || path.is_empty() =>
            {
                // TOML syntax errors carry no path; keep the parser's own position info.
                if path.is_empty() {
                    path = "<file>".into();
                }
                msg.split_whitespace().collect::<Vec<_>>().join(" ")
            }
            kind => kind.to_string(),
        };
        let source = error
            .metadata
            .as_ref()
            .map(|md| format!(" (from {})", md.name))
            .unwrap_or_default();
        ConfigError::new(path, format!("{reason}{source}"))
    }
}

impl Config {
    /// Loads defaults, then `file` (if any), then the `TOLLGATE_*` environment, and validates.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        // What the file and the environment say, without the defaults.
        let mut given = Figment::new();
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::new(
                    "--config",
                    format!("{} is not a readable file", path.display()),
                ));
            }
            figment = figment.merge(Toml::file_exact(path));
            given = given.merge(Toml::file_exact(path));
        }
        let env = Env::prefixed("TOLLGATE_")
            .split("__")
            .filter(|key| !is_kubernetes_or_cli_env(&key.as_str().to_ascii_lowercase()));
        let on_error_given = given
            .merge(env.clone())
            .find_value("store.on_error")
            .is_ok();
        let mut config: Config = figment.merge(env).extract()?;
        if let Some(token) = std::env::var_os("TOLLGATE_ADMIN_TOKEN") {
            let token = token.into_string().map_err(|_| {
                ConfigError::new("admin_token", "TOLLGATE_ADMIN_TOKEN is not valid UTF-8")
            })?;
            config.admin_token = Some(Secret(token));
        }
        if let Some(salt) = std::env::var_os("TOLLGATE_FINGERPRINT_SALT") {
            let salt = salt.into_string().map_err(|_| {
                ConfigError::new(
                    "fingerprint_salt",
                    "TOLLGATE_FINGERPRINT_SALT is not valid UTF-8",
                )
            })?;
            config.fingerprint_salt = Some(Secret(salt));
        }
        let var = |name: &str| std::env::var(name).ok();
        crate::erl::config::env::apply_erl_env(&mut config, var)?;
        if !on_error_given && crate::erl::config::env::in_erl_env(var) {
            // envoyproxy/ratelimit answers a Redis error with an error status, which Envoy's
            // `failure_mode_deny` decides on: so does tollgate in its environment, unless told.
            config.store.on_error = super::OnError::Error;
        }
        config.timings = test_timings()?;
        config.resolve_paths(file);
        config.validate()?;
        Ok(config)
    }

    /// Makes every relative `overrides_file` relative to the directory of the config file.
    fn resolve_paths(&mut self, file: Option<&Path>) {
        let Some(dir) = file.and_then(Path::parent) else {
            return;
        };
        for limit in &mut self.limits {
            if let Some(path) = limit.overrides_file.as_mut().filter(|p| p.is_relative()) {
                *path = dir.join(&*path);
            }
        }
        if let Some(path) = self.envoy.config_dir.as_mut().filter(|p| p.is_relative()) {
            *path = dir.join(&*path);
        }
        if let Some(xds) = self.envoy.xds.as_mut() {
            xds.files.resolve_paths(dir);
        }
        if let Some(tls) = self.grpc_tls.as_mut() {
            tls.files.resolve_paths(dir);
        }
        if let Some(tls) = self.store.tls.as_mut() {
            tls.resolve_paths(dir);
        }
        if let Some(tls) = self.region.as_mut().and_then(|region| region.tls.as_mut()) {
            tls.resolve_paths(dir);
        }
    }
}

/// The production intervals, or those `TOLLGATE_TEST_TIMINGS_SCALE` divides (testing only).
fn test_timings() -> Result<Timings, ConfigError> {
    let refuse = |reason: String| ConfigError::new(TEST_SCALE_ENV, reason);
    let Some(value) = std::env::var_os(TEST_SCALE_ENV) else {
        return Ok(Timings::default());
    };
    let value = value
        .into_string()
        .map_err(|_| refuse("is not valid UTF-8".into()))?;
    Timings::for_test_scale(&value).map_err(refuse)
}

impl Config {
    /// The admin bearer token, from `admin_token` or the file `admin_token_file` names (the
    /// environment variable `TOLLGATE_ADMIN_TOKEN` sets the former). `None`: mutating admin
    /// requests are refused.
    pub fn admin_token(&self) -> Result<Option<String>, ConfigError> {
        secret(
            self.admin_token.as_ref(),
            self.admin_token_file.as_deref(),
            "admin_token",
        )
    }

    /// The salt of key fingerprints, from `fingerprint_salt` or the file
    /// `fingerprint_salt_file` names (the environment variable `TOLLGATE_FINGERPRINT_SALT`
    /// sets the former). `None`: derived from the admin token, else random per process.
    pub fn fingerprint_salt(&self) -> Result<Option<String>, ConfigError> {
        secret(
            self.fingerprint_salt.as_ref(),
            self.fingerprint_salt_file.as_deref(),
            "fingerprint_salt",
        )
    }
}

/// A secret given as the setting `key` or read from the file `<key>_file` names (trimmed):
/// at least 16 printable characters without spaces.
fn secret(
    given: Option<&Secret>,
    file: Option<&Path>,
    key: &str,
) -> Result<Option<String>, ConfigError> {
    let file_key = format!("{key}_file");
    let (from, value) = match (given, file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                file_key,
                format!("set either {key} or {key}_file, not both"),
            ))
        }
        (Some(Secret(value)), None) => (key.to_string(), value.trim().to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::new(
                    file_key.clone(),
                    format!("cannot read {}: {}", path.display(), e.kind()),
                )
            })?;
            (file_key, text.trim().to_string())
        }
        (None, None) => return Ok(None),
    };
    if value.len() < 16 || !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            from,
            "must be at least 16 printable characters without spaces",
        ));
    }
    Ok(Some(value))
}

fn is_kubernetes_or_cli_env(key: &str) -> bool {
    NON_CONFIG_ENV.contains(&key) || key.starts_with("service_port_") || key.starts_with("port_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_service_variables_are_not_config_keys() {
        assert!(is_kubernetes_or_cli_env("service_host"));
        assert!(is_kubernetes_or_cli_env("port_8080_tcp_addr"));
        assert!(is_kubernetes_or_cli_env("config"));
        assert!(!is_kubernetes_or_cli_env("listen"));
    }
}
