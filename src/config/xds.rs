//! `[envoy] xds`: the settings of the client of envoyproxy/ratelimit's xDS config source (its
//! `CONFIG_TYPE=GRPC_XDS_SOTW`), from TOML or from its `CONFIG_GRPC_XDS_*` variables. What
//! the server sends becomes rules in [`super::xds_rules`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;

const DEFAULT_SERVER: &str = "localhost:18000";
const DEFAULT_NODE_ID: &str = "default";
const DEFAULT_RETRY_MS: u64 = 3_000;
/// A longer pause would leave a broken stream unmended for an hour or more.
const MAX_RETRY_MS: u64 = 3_600_000;

/// `[envoy] xds`: where the management server is and who this client is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdsConfig {
    /// `host:port` of the management server (plain HTTP/2; TLS is not served).
    #[serde(default = "default_server")]
    pub server: String,
    /// The `Node.id` sent: the management server picks the snapshot by it.
    #[serde(default = "default_node_id")]
    pub node_id: String,
    /// String fields of the `Node.metadata` sent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_metadata: BTreeMap<String, String>,
    /// gRPC metadata sent with the stream (lower-case names).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The pause before connecting again after a failed connection or a broken stream.
    #[serde(default = "default_retry_ms")]
    pub retry_ms: u64,
}

impl Default for XdsConfig {
    fn default() -> Self {
        XdsConfig {
            server: default_server(),
            node_id: default_node_id(),
            node_metadata: BTreeMap::new(),
            headers: BTreeMap::new(),
            retry_ms: DEFAULT_RETRY_MS,
        }
    }
}

fn default_server() -> String {
    DEFAULT_SERVER.into()
}

fn default_node_id() -> String {
    DEFAULT_NODE_ID.into()
}

fn default_retry_ms() -> u64 {
    DEFAULT_RETRY_MS
}

impl XdsConfig {
    /// What cannot work: a server that is not `host:port`, an empty node id, a pause of zero
    /// (a reconnect loop) or above an hour, a header that gRPC metadata cannot carry.
    pub fn check(&self) -> Result<(), ConfigError> {
        if !is_host_port(&self.server) {
            return Err(ConfigError::new(
                "envoy.xds.server",
                format!("{:?} is not host:port", self.server),
            ));
        }
        if self.node_id.is_empty() {
            return Err(ConfigError::new(
                "envoy.xds.node_id",
                "must not be empty: the management server picks the snapshot by it",
            ));
        }
        if !(1..=MAX_RETRY_MS).contains(&self.retry_ms) {
            return Err(ConfigError::new(
                "envoy.xds.retry_ms",
                format!("must be between 1 and {MAX_RETRY_MS}"),
            ));
        }
        for (name, value) in &self.headers {
            let valid_name = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
                && !name.ends_with("-bin");
            if !valid_name {
                return Err(ConfigError::new(
                    format!("envoy.xds.headers.{name}"),
                    "a header name is lower-case letters, digits, '-', '_' and '.'",
                ));
            }
            if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(ConfigError::new(
                    format!("envoy.xds.headers.{name}"),
                    "a header value is printable ASCII",
                ));
            }
        }
        Ok(())
    }
}

fn is_host_port(text: &str) -> bool {
    let Some((host, port)) = text.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && !host.contains(['/', ' ', '@', ':', '[', ']']),
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p != 0)
}

/// envoyproxy/ratelimit's `CONFIG_GRPC_XDS_*` variables, as it reads them:
/// `CONFIG_GRPC_XDS_SERVER_URL`, `CONFIG_GRPC_XDS_NODE_ID`, `CONFIG_GRPC_XDS_NODE_METADATA`
/// (`k1=v1,k2=v2`: entries without `=` are skipped, as there),
/// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (a Go duration: `3s`, `500ms`, `1m30s`),
/// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` (`k1:v1,k2:v2`). TLS
/// (`CONFIG_GRPC_XDS_SERVER_USE_TLS` true) is refused.
pub fn from_erl_env(var: impl Fn(&str) -> Option<String>) -> Result<XdsConfig, ConfigError> {
    const TLS: &str = "CONFIG_GRPC_XDS_SERVER_USE_TLS";
    if let Some(tls) = var(TLS) {
        match go_bool(&tls) {
            Some(false) => {}
            Some(true) => {
                return Err(ConfigError::new(
                    TLS,
                    "TLS to the xDS server is not supported; reach it over plain HTTP/2 \
                     (a sidecar or a mesh can add TLS)",
                ))
            }
            None => return Err(ConfigError::new(TLS, format!("{tls:?} is not a bool"))),
        }
    }
    let mut xds = XdsConfig::default();
    if let Some(server) = var("CONFIG_GRPC_XDS_SERVER_URL") {
        xds.server = server;
    }
    if let Some(node_id) = var("CONFIG_GRPC_XDS_NODE_ID") {
        xds.node_id = node_id;
    }
    for entry in var("CONFIG_GRPC_XDS_NODE_METADATA")
        .unwrap_or_default()
        .split(',')
    {
        if let Some((key, value)) = entry.split_once('=') {
            xds.node_metadata.insert(key.into(), value.into());
        }
    }
    const RETRY: &str = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL";
    if let Some(text) = var(RETRY) {
        xds.retry_ms = go_duration_ms(&text)
            .ok_or_else(|| ConfigError::new(RETRY, format!("{text:?} is not a duration")))?;
    }
    const HEADERS: &str = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
    for entry in var(HEADERS).unwrap_or_default().split(',') {
        if entry.is_empty() {
            continue;
        }
        let Some((name, value)) = entry.split_once(':') else {
            return Err(ConfigError::new(
                HEADERS,
                format!("{entry:?} is not name:value"),
            ));
        };
        xds.headers
            .insert(name.trim().to_ascii_lowercase(), value.trim().into());
    }
    xds.check().map_err(|e| {
        let key = match e.key.as_str() {
            "envoy.xds.server" => "CONFIG_GRPC_XDS_SERVER_URL",
            "envoy.xds.node_id" => "CONFIG_GRPC_XDS_NODE_ID",
            "envoy.xds.retry_ms" => RETRY,
            _ => HEADERS,
        };
        ConfigError::new(key, e.reason)
    })?;
    Ok(xds)
}

/// Go's `strconv.ParseBool`.
fn go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration`, in whole milliseconds (rounded up, so `1us` is not zero):
/// numbers (fractions allowed) each followed by `h`, `m`, `s`, `ms`, `us`/`µs` or `ns`.
/// Negative durations are refused.
pub fn go_duration_ms(text: &str) -> Option<u64> {
    if text == "0" {
        return Some(0);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return None;
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_end);
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale: u128 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" | "μs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let mut part = whole.checked_mul(scale)?;
        let mut place = scale;
        for digit in fraction.bytes() {
            place /= 10;
            part += u128::from(digit - b'0') * place;
        }
        nanos = nanos.checked_add(part)?;
        rest = tail;
    }
    u64::try_from(nanos.div_ceil(1_000_000)).ok()
}
#[cfg(test)]
mod tests;
