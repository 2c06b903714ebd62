//! envoyproxy/ratelimit's xDS config source's variables (with `CONFIG_TYPE=GRPC_XDS_SOTW`),
//! as it reads them, into `[envoy] xds`.

use std::path::PathBuf;

use super::{
    in_words_of, ErlEnv, CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS,
    CONFIG_GRPC_XDS_CLIENT_TLS_CERT, CONFIG_GRPC_XDS_CLIENT_TLS_KEY, CONFIG_GRPC_XDS_NODE_ID,
    CONFIG_GRPC_XDS_NODE_METADATA, CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL as RETRY,
    CONFIG_GRPC_XDS_SERVER_TLS_CACERT, CONFIG_GRPC_XDS_SERVER_TLS_SAN, CONFIG_GRPC_XDS_SERVER_URL,
    CONFIG_GRPC_XDS_SERVER_USE_TLS, FORCE_START_WITHOUT_INITIAL_CONFIG,
    HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES,
};
use crate::config::ConfigError;
use crate::erl::config::xds::XdsConfig;

/// envoyproxy/ratelimit's `CONFIG_GRPC_XDS_*` variables, as it reads them:
/// `CONFIG_GRPC_XDS_SERVER_URL`, `CONFIG_GRPC_XDS_NODE_ID`, `CONFIG_GRPC_XDS_NODE_METADATA`
/// (`k1=v1,k2=v2`: entries without `=` are skipped, as there),
/// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (a Go duration: `3s`, `500ms`, `1m30s`),
/// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` (`k1:v1,k2:v2`),
/// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`, `FORCE_START_WITHOUT_INITIAL_CONFIG` and
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` (readiness before the first configuration); with
/// `CONFIG_GRPC_XDS_SERVER_USE_TLS` true, `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`,
/// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`, `CONFIG_GRPC_XDS_CLIENT_TLS_KEY` and
/// `CONFIG_GRPC_XDS_SERVER_TLS_SAN` (an empty one is unset, as there).
pub(super) fn from_env(env: &ErlEnv) -> Result<XdsConfig, ConfigError> {
    let mut xds = XdsConfig::default();
    // Without FORCE_START_WITHOUT_INITIAL_CONFIG it serves nothing until the first
    // configuration; with it, it is healthy unless HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED.
    // Both read before either counts: a bad value stops ERL whatever the other says.
    let force_start = env.flag(&FORCE_START_WITHOUT_INITIAL_CONFIG)?;
    let healthy_with_config = env.flag(&HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED)?;
    xds.ready_before_config = force_start && !healthy_with_config;
    xds.tls = env.flag(&CONFIG_GRPC_XDS_SERVER_USE_TLS)?;
    if xds.tls {
        let file = |row| env.set(row).map(PathBuf::from);
        xds.files.ca_file = file(&CONFIG_GRPC_XDS_SERVER_TLS_CACERT);
        xds.files.cert_file = file(&CONFIG_GRPC_XDS_CLIENT_TLS_CERT);
        xds.files.key_file = file(&CONFIG_GRPC_XDS_CLIENT_TLS_KEY);
        xds.server_name = env.set(&CONFIG_GRPC_XDS_SERVER_TLS_SAN).map(String::from);
    }
    xds.server = env.or_default(&CONFIG_GRPC_XDS_SERVER_URL).to_string();
    xds.node_id = env.or_default(&CONFIG_GRPC_XDS_NODE_ID).to_string();
    for entry in env.or_default(&CONFIG_GRPC_XDS_NODE_METADATA).split(',') {
        if let Some((key, value)) = entry.split_once('=') {
            xds.node_metadata.insert(key.into(), value.into());
        }
    }
    if let Some(retry) = env.duration(&RETRY)? {
        xds.retry_ms = ceil_ms(retry);
    }
    // Unset or 0 there leaves gRPC's default.
    const MAX_SIZE: &super::Var = &XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES;
    if let Some(text) = env.set(MAX_SIZE).filter(|t| *t != "0") {
        xds.max_message_bytes = text
            .parse()
            .ok()
            .filter(|size| *size <= crate::erl::config::xds::MAX_MESSAGE_BYTES)
            .ok_or_else(|| {
                MAX_SIZE.refuse(format!(
                    "{text:?} is not a size in bytes of at most 64 MiB (a response is read whole)"
                ))
            })?;
    }
    const HEADERS: &super::Var = &CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS;
    for entry in env.or_default(HEADERS).split(',') {
        if entry.is_empty() {
            continue;
        }
        let Some((name, value)) = entry.split_once(':') else {
            return Err(HEADERS.refuse(format!("{entry:?} is not name:value")));
        };
        xds.headers
            .insert(name.trim().to_ascii_lowercase(), value.trim().into());
    }
    let rows = [
        &CONFIG_GRPC_XDS_SERVER_URL,
        &CONFIG_GRPC_XDS_NODE_ID,
        &RETRY,
        HEADERS,
        MAX_SIZE,
        &CONFIG_GRPC_XDS_SERVER_TLS_CACERT,
        &CONFIG_GRPC_XDS_CLIENT_TLS_CERT,
        &CONFIG_GRPC_XDS_CLIENT_TLS_KEY,
        &CONFIG_GRPC_XDS_SERVER_TLS_SAN,
    ];
    xds.check()
        .map_err(|e| in_words_of(e, &rows, &CONFIG_GRPC_XDS_SERVER_USE_TLS))?;
    Ok(xds)
}

/// A duration in whole milliseconds rounded up (so `1us` is not zero); Go's durations end
/// within 292 years, so it fits.
fn ceil_ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
