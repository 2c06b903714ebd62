//! The environment applied over the configuration, group by group, in the order
//! envoyproxy/ratelimit's refusals come: the first variable at fault is the one named.

use std::path::PathBuf;

use super::{
    headers, metrics, redis, tls, tracing, xds, ErlEnv, Var, BACKEND_TYPE, CONFIG_TYPE, GRPC_HOST,
    GRPC_PORT, GRPC_SERVER_USE_TLS, GRPC_UDS, HOST, PORT, QUOTA_MODE,
    REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, RESPONSE_DYNAMIC_METADATA, RUNTIME_APPDIRECTORY,
    RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, SHADOW_MODE,
};
use crate::config::{Config, ConfigError};

/// envoyproxy/ratelimit's environment over `config`, when tollgate runs in it (else nothing).
/// What it sets wins over the file:
///
/// - `RUNTIME_*`: `envoy.config_dir`, unless the file sets it or `CONFIG_TYPE=GRPC_XDS_SOTW`
///   sets `envoy.xds` instead (`xds`);
/// - `GRPC_HOST`/`GRPC_PORT` (`grpc_listen`, always set), `HOST`/`PORT` (`listen`);
/// - `REDIS_*`: the store, as envoyproxy/ratelimit reads them (`redis`; an unset `REDIS_URL`
///   is refused). A store failure answers an error, as there (`store.on_error = "error"`),
///   unless the file or `TOLLGATE_STORE__ON_ERROR` says otherwise (`Config::load` knows what
///   they said);
/// - its stats (`metrics`), the gRPC listener's TLS (`tls`), its answers' headers
///   (`headers`), its tracing (`tracing`), its global modes.
///
/// A setting tollgate cannot honour without deciding differently is refused, naming the
/// variable; its other variables (tuning) are ignored. The variables read, with the key each
/// set, are kept for `validate` (`Config::erl_env_read`).
pub fn apply_erl_env(
    config: &mut Config,
    var: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let env = ErlEnv::read(var);
    if !env.is_erl() {
        return Ok(());
    }
    apply(config, &env)?;
    config.erl_env_read = env.read_and_set();
    Ok(())
}

fn apply(config: &mut Config, env: &ErlEnv) -> Result<(), ConfigError> {
    // ERL takes `redis` and the empty string, nothing else, for its Redis backend.
    if let Some(backend) = env.set(&BACKEND_TYPE).filter(|b| *b != "redis") {
        return Err(BACKEND_TYPE.refuse(format!(
            "{backend:?}: tollgate keeps its buckets in Redis only"
        )));
    }
    match env.get(&CONFIG_TYPE) {
        None | Some("FILE") => {}
        Some("GRPC_XDS_SOTW") => config.envoy.xds = Some(xds::from_env(env)?),
        Some(kind) => {
            return Err(CONFIG_TYPE.refuse(format!("{kind:?} is neither FILE nor GRPC_XDS_SOTW")))
        }
    }
    metrics::apply(&mut config.envoy.metrics, env)?;
    let use_tls = env.flag(&GRPC_SERVER_USE_TLS)?;
    config.grpc_tls = tls::grpc(env, use_tls)?.or(config.grpc_tls.take());
    headers::apply(config, env)?;
    config.envoy.shadow_mode |= env.flag(&SHADOW_MODE)?;
    config.envoy.quota_mode |= env.flag(&QUOTA_MODE)?;
    config.envoy.dynamic_metadata |= env.flag(&RESPONSE_DYNAMIC_METADATA)?;
    tracing::apply(config, env)?;
    if config.envoy.config_dir.is_none() && config.envoy.xds.is_none() {
        let mut dir = PathBuf::from(env.or_default(&RUNTIME_ROOT));
        dir.push(env.or_default(&RUNTIME_SUBDIRECTORY));
        dir.push(env.or_default(&RUNTIME_APPDIRECTORY));
        config.envoy.config_dir = Some(dir);
    }
    if env.get(&GRPC_HOST).is_some()
        || env.get(&GRPC_PORT).is_some()
        || config.grpc_listen.is_none()
    {
        config.grpc_listen = Some(address(env, &GRPC_HOST, &GRPC_PORT)?);
    }
    if env.get(&HOST).is_some() || env.get(&PORT).is_some() {
        config.listen = address(env, &HOST, &PORT)?;
    }
    redis::apply(config, env)?;
    env.refuse_if_asked(&GRPC_UDS)?;
    // Health failing while Redis is unreachable: tollgate's readiness stays 200 then unless
    // store.on_error is "deny", which also changes the answers.
    env.refuse_if_asked(&REDIS_HEALTH_CHECK_ACTIVE_CONNECTION)
}

/// A listen address of a host and a port variable. The variable at fault is named: the port
/// unless it is plain decimal (a leading 0 is octal to Go, so it is refused rather than read
/// as decimal), else the host.
fn address(env: &ErlEnv, host: &Var, port: &Var) -> Result<std::net::SocketAddr, ConfigError> {
    let host_text = env.or_default(host);
    let port_text = env.or_default(port);
    let decimal = port_text.bytes().all(|b| b.is_ascii_digit())
        && (port_text == "0" || !port_text.starts_with('0'))
        && port_text.parse::<u16>().is_ok();
    let text = if host_text.contains(':') {
        format!("[{host_text}]:{port_text}")
    } else {
        format!("{host_text}:{port_text}")
    };
    match text.parse::<std::net::SocketAddr>() {
        Ok(address) if decimal => Ok(address),
        _ => {
            Err(if decimal { host } else { port }
                .refuse(format!("{text:?} is not a listen address")))
        }
    }
}
