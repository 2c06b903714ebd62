//! `[envoy] xds`: the settings of the client of envoyproxy/ratelimit's xDS config source (its
//! `CONFIG_TYPE=GRPC_XDS_SOTW`), from TOML or from its `CONFIG_GRPC_XDS_*` variables
//! (`super::env`). What the server sends is decoded into rules beside the client, in
//! `tollgate_erl::app::xds::rules`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::tls_files::{TlsFiles, TlsKeys};
use crate::config::ConfigError;

const DEFAULT_SERVER: &str = "localhost:18000";
const DEFAULT_NODE_ID: &str = "default";
const DEFAULT_RETRY_MS: u64 = 3_000;
/// A longer pause would leave a broken stream unmended for an hour or more.
const MAX_RETRY_MS: u64 = 3_600_000;
const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// The largest response `max_message_bytes` may allow: a response is read whole before it is
/// parsed, so its bound is the memory one response may take.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// `[envoy] xds`: where the management server is and who this client is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "XdsToml", into = "XdsToml")]
pub struct XdsConfig {
    /// `host:port` of the management server.
    pub server: String,
    /// The `Node.id` sent: the management server picks the snapshot by it.
    pub node_id: String,
    /// String fields of the `Node.metadata` sent.
    pub node_metadata: BTreeMap<String, String>,
    /// gRPC metadata sent with the stream (lower-case names).
    pub headers: BTreeMap<String, String>,
    /// The pause before connecting again after a failed connection or a broken stream.
    pub retry_ms: u64,
    /// Ready (`/readyz`, `/healthcheck`, gRPC health) before the first configuration
    /// arrives; by default not, as envoyproxy/ratelimit does not serve before it.
    pub ready_before_config: bool,
    /// The largest response accepted, in bytes (gRPC's default: 4 MiB).
    pub max_message_bytes: usize,
    /// TLS to the server: its certificate checked against `files.ca_file` (else the system's
    /// roots), and with a certificate and key, this client's certificate shown (mutual TLS,
    /// as Envoy Gateway's server asks).
    pub tls: bool,
    pub files: TlsFiles,
    /// The name the server's certificate must carry, when not the host of `server`.
    pub server_name: Option<String>,
}

/// `[envoy] xds` as the TOML spells it: the TLS files beside the other keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct XdsToml {
    #[serde(default = "default_server")]
    server: String,
    #[serde(default = "default_node_id")]
    node_id: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    node_metadata: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
    #[serde(default = "default_retry_ms")]
    retry_ms: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    ready_before_config: bool,
    #[serde(default = "default_max_message_bytes")]
    max_message_bytes: usize,
    #[serde(default, skip_serializing_if = "is_false")]
    tls: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cert_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    server_name: Option<String>,
}

impl From<XdsToml> for XdsConfig {
    fn from(toml: XdsToml) -> XdsConfig {
        XdsConfig {
            server: toml.server,
            node_id: toml.node_id,
            node_metadata: toml.node_metadata,
            headers: toml.headers,
            retry_ms: toml.retry_ms,
            ready_before_config: toml.ready_before_config,
            max_message_bytes: toml.max_message_bytes,
            tls: toml.tls,
            files: TlsFiles {
                ca_file: toml.ca_file,
                cert_file: toml.cert_file,
                key_file: toml.key_file,
            },
            server_name: toml.server_name,
        }
    }
}

impl From<XdsConfig> for XdsToml {
    fn from(config: XdsConfig) -> XdsToml {
        XdsToml {
            server: config.server,
            node_id: config.node_id,
            node_metadata: config.node_metadata,
            headers: config.headers,
            retry_ms: config.retry_ms,
            ready_before_config: config.ready_before_config,
            max_message_bytes: config.max_message_bytes,
            tls: config.tls,
            ca_file: config.files.ca_file,
            cert_file: config.files.cert_file,
            key_file: config.files.key_file,
            server_name: config.server_name,
        }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Default for XdsConfig {
    fn default() -> Self {
        XdsConfig {
            server: default_server(),
            node_id: default_node_id(),
            node_metadata: BTreeMap::new(),
            headers: BTreeMap::new(),
            retry_ms: DEFAULT_RETRY_MS,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            ready_before_config: false,
            tls: false,
            files: TlsFiles::default(),
            server_name: None,
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

fn default_max_message_bytes() -> usize {
    DEFAULT_MAX_MESSAGE_BYTES
}

/// The keys of the TLS files of `[envoy] xds`.
pub const KEYS: TlsKeys = TlsKeys {
    ca: "envoy.xds.ca_file",
    cert: "envoy.xds.cert_file",
    key: "envoy.xds.key_file",
};

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
        if !(1..=MAX_MESSAGE_BYTES).contains(&self.max_message_bytes) {
            return Err(ConfigError::new(
                "envoy.xds.max_message_bytes",
                format!(
                    "must be between 1 and {MAX_MESSAGE_BYTES} (64 MiB: a response is read whole)"
                ),
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
        self.check_tls()
    }

    /// The TLS settings: only with `tls`, a certificate with its key, every file readable
    /// now (they are read again at each connection, so a renewed certificate is used).
    fn check_tls(&self) -> Result<(), ConfigError> {
        if !self.tls {
            let set = self.files.named(KEYS).map(|(key, _)| key).next();
            let set = set.or(self.server_name.as_ref().map(|_| "envoy.xds.server_name"));
            return match set {
                Some(key) => Err(ConfigError::new(key, "applies only with tls = true")),
                None => Ok(()),
            };
        }
        self.files.identity(KEYS)?;
        self.files.check_readable(KEYS)?;
        if self.server_name.as_ref().is_some_and(String::is_empty) {
            return Err(ConfigError::new(
                "envoy.xds.server_name",
                "must not be empty",
            ));
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

#[cfg(test)]
mod tests;
