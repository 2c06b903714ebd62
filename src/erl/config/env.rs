//! envoyproxy/ratelimit's environment, read over the configuration when tollgate stands in for
//! it.

use std::path::PathBuf;

use crate::config::{Config, ConfigError};

mod headers;
mod redis;
mod refused;
mod tracing;

/// Whether tollgate runs in envoyproxy/ratelimit's environment (see [`apply_erl_env`]).
pub fn in_erl_env(var: impl Fn(&str) -> Option<String>) -> bool {
    // CONFIG_TYPE counts only with one of its own values: another program's variable of that
    // name must not turn this on.
    // Spelled exactly, as ERL compares them: `file` stops it.
    let erl_config_type =
        var("CONFIG_TYPE").is_some_and(|kind| kind == "FILE" || kind == "GRPC_XDS_SOTW");
    var("RUNTIME_ROOT").is_some() || var("RUNTIME_SUBDIRECTORY").is_some() || erl_config_type
}

/// envoyproxy/ratelimit's environment, read when `RUNTIME_ROOT` or `RUNTIME_SUBDIRECTORY` is
/// set, or `CONFIG_TYPE` is `FILE` or `GRPC_XDS_SOTW` (deployments fed over xDS often set no
/// `RUNTIME_*`); never otherwise, so that a generic `PORT` never moves a tollgate that is not
/// standing in for it. What it sets wins over the file:
///
/// - `RUNTIME_ROOT` (default `/srv/runtime_data/current`), `RUNTIME_SUBDIRECTORY`,
///   `RUNTIME_APPDIRECTORY` (default `config`): `envoy.config_dir`, unless the file sets it;
/// - `GRPC_HOST`/`GRPC_PORT` (default `0.0.0.0:8081`): `grpc_listen`; `HOST`/`PORT`: `listen`;
/// - `REDIS_*`: the store, as envoyproxy/ratelimit reads them (see `redis`);
///   an unset `REDIS_URL` is refused. A store failure answers an error, as there
///   (`store.on_error = "error"`), unless the file or `TOLLGATE_STORE__ON_ERROR` says
///   otherwise (`Config::load` knows what they said).
///
/// - `SHADOW_MODE`, `QUOTA_MODE`: `envoy.shadow_mode`, `envoy.quota_mode`.
/// - `CONFIG_TYPE=GRPC_XDS_SOTW` and its `CONFIG_GRPC_XDS_*`: `envoy.xds` instead of
///   `envoy.config_dir` (see [`super::xds::from_erl_env`]).
/// - `GRPC_SERVER_USE_TLS` true and its `GRPC_SERVER_TLS_*`, `GRPC_CLIENT_TLS_*`: `grpc_tls`
///   (see [`crate::config::grpc_tls::from_erl_env`]).
/// - `TRACING_*` and `OTEL_EXPORTER_OTLP_*`: `tracing` (see `tracing`).
///
/// - `MERGE_DOMAIN_CONFIG`, `LIMIT_RESPONSE_HEADERS_ENABLED` and its `LIMIT_*_HEADER` names
///   (see `headers`).
///
/// A setting tollgate cannot honour without deciding differently is refused: `BACKEND_TYPE`
/// other than `redis` or empty, `CONFIG_TYPE` other than `FILE` or `GRPC_XDS_SOTW`, and those
/// `refused` lists. Its other variables (tuning) are ignored.
pub fn apply_erl_env(
    config: &mut Config,
    var: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    if !in_erl_env(&var) {
        return Ok(());
    }
    // ERL reads its booleans with Go's strconv.ParseBool: anything else stops it, so it
    // stops tollgate too, rather than meaning false.
    let flag = |name: &str| {
        var(name).map_or(Ok(false), |text| {
            crate::base::go::parse_bool(&text)
                .ok_or_else(|| ConfigError::new(name, format!("{text:?} is not a bool")))
        })
    };
    // ERL takes `redis` and the empty string, nothing else, for its Redis backend.
    if let Some(backend) = var("BACKEND_TYPE").filter(|b| !b.is_empty() && b != "redis") {
        return Err(ConfigError::new(
            "BACKEND_TYPE",
            format!("{backend:?}: tollgate keeps its buckets in Redis only"),
        ));
    }
    match var("CONFIG_TYPE") {
        None => {}
        Some(kind) if kind == "FILE" => {}
        Some(kind) if kind == "GRPC_XDS_SOTW" => {
            config.envoy.xds = Some(super::xds::from_erl_env(&var)?);
        }
        Some(kind) => {
            return Err(ConfigError::new(
                "CONFIG_TYPE",
                format!("{kind:?} is neither FILE nor GRPC_XDS_SOTW"),
            ))
        }
    }
    super::metrics::from_erl_env(&mut config.envoy.metrics, &var)?;
    let use_tls = flag("GRPC_SERVER_USE_TLS")?;
    config.grpc_tls =
        crate::config::grpc_tls::from_erl_env(&var, use_tls)?.or(config.grpc_tls.take());
    headers::apply(config, &var)?;
    config.envoy.shadow_mode |= flag("SHADOW_MODE")?;
    config.envoy.quota_mode |= flag("QUOTA_MODE")?;
    config.envoy.dynamic_metadata |= flag("RESPONSE_DYNAMIC_METADATA")?;
    tracing::apply(config, &var)?;
    if config.envoy.config_dir.is_none() && config.envoy.xds.is_none() {
        let mut dir = PathBuf::from(
            var("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into()),
        );
        dir.push(var("RUNTIME_SUBDIRECTORY").unwrap_or_default());
        dir.push(var("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
        config.envoy.config_dir = Some(dir);
    }
    // The variable at fault is named: the port unless it is plain decimal (a leading 0 is
    // octal to Go, so it is refused rather than read as decimal), else the host.
    let address = |host_var: &str, port_var: &str, default_port: &str| {
        let host = var(host_var).unwrap_or_else(|| "0.0.0.0".into());
        let port = var(port_var).unwrap_or_else(|| default_port.into());
        let decimal = port.bytes().all(|b| b.is_ascii_digit())
            && (port == "0" || !port.starts_with('0'))
            && port.parse::<u16>().is_ok();
        let text = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        match text.parse::<std::net::SocketAddr>() {
            Ok(address) if decimal => Ok(address),
            _ => Err(ConfigError::new(
                if decimal { host_var } else { port_var },
                format!("{text:?} is not a listen address"),
            )),
        }
    };
    if var("GRPC_HOST").is_some() || var("GRPC_PORT").is_some() || config.grpc_listen.is_none() {
        config.grpc_listen = Some(address("GRPC_HOST", "GRPC_PORT", "8081")?);
    }
    if var("HOST").is_some() || var("PORT").is_some() {
        config.listen = address("HOST", "PORT", "8080")?;
    }
    redis::apply(config, &var)?;
    refused::refuse_unsupported(&var)?;
    Ok(())
}

#[cfg(test)]
mod tests;
