//! `[envoy.metrics]`: envoyproxy/ratelimit's metrics (its stats keys and names) served for
//! dashboards written against it: as Prometheus series on a listener of their own, and as
//! statsd counters sent to a statsd server. From TOML, or from its `USE_PROMETHEUS`,
//! `USE_STATSD`, ... variables (`super::env`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// envoyproxy/ratelimit's default `NEAR_LIMIT_RATIO`.
pub const NEAR_LIMIT_RATIO: f32 = 0.8;

/// The default of `max_keys`: stats keys carrying request values held at once.
pub const MAX_KEYS: usize = 10_000;

/// `[envoy.metrics]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErlMetricsConfig {
    /// Where the Prometheus series are served; absent = not served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prometheus_listen: Option<SocketAddr>,
    /// The path they are served on (anything else answers 404).
    pub prometheus_path: String,
    /// The response time histogram observes milliseconds (under its `_seconds` name), as
    /// envoyproxy/ratelimit's `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` has it.
    pub response_time_ms: bool,
    /// `host:port` of a statsd server the counters are sent to; absent = not sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statsd: Option<String>,
    pub statsd_protocol: StatsdProtocol,
    /// How often the counters' increases are sent.
    pub flush_interval_ms: u64,
    /// What part of a limit counts as near it (`near_limit`).
    pub near_limit_ratio: f32,
    /// The most stats keys carrying request values (`detailed_metric`, `value_to_metric`, a
    /// descriptor's own `limit`) held at once; past it a rule counts in its overflow key.
    pub max_keys: usize,
}

/// How the statsd lines travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatsdProtocol {
    /// One connection, lines written as they are flushed (envoyproxy/ratelimit's default).
    Tcp,
    /// Datagrams of at most 1,432 bytes, lines never split.
    Udp,
}

impl Default for ErlMetricsConfig {
    fn default() -> ErlMetricsConfig {
        ErlMetricsConfig {
            prometheus_listen: None,
            prometheus_path: "/metrics".into(),
            response_time_ms: false,
            statsd: None,
            statsd_protocol: StatsdProtocol::Tcp,
            flush_interval_ms: 10_000,
            near_limit_ratio: NEAR_LIMIT_RATIO,
            max_keys: MAX_KEYS,
        }
    }
}

impl ErlMetricsConfig {
    /// Whether the metrics are kept at all (else counting costs nothing).
    pub fn enabled(&self) -> bool {
        self.prometheus_listen.is_some() || self.statsd.is_some()
    }

    pub fn is_default(&self) -> bool {
        *self == ErlMetricsConfig::default()
    }

    /// What `validate` prints of it: a line per way out, nothing when off.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        if let Some(listen) = self.prometheus_listen {
            out.push_str(&format!(
                "envoyproxy/ratelimit metrics  Prometheus on {listen}{}\n",
                self.prometheus_path
            ));
        }
        if let Some(statsd) = &self.statsd {
            out.push_str(&format!(
                "envoyproxy/ratelimit metrics  statsd to {statsd} over {} every {} ms\n",
                match self.statsd_protocol {
                    StatsdProtocol::Tcp => "tcp",
                    StatsdProtocol::Udp => "udp",
                },
                self.flush_interval_ms
            ));
        }
        out
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        if !self.prometheus_path.starts_with('/') {
            return Err(ConfigError::new(
                "envoy.metrics.prometheus_path",
                format!("{:?} must start with /", self.prometheus_path),
            ));
        }
        if self.flush_interval_ms == 0 {
            return Err(ConfigError::new(
                "envoy.metrics.flush_interval_ms",
                "must be at least 1",
            ));
        }
        if self.max_keys == 0 {
            return Err(ConfigError::new(
                "envoy.metrics.max_keys",
                "must be at least 1",
            ));
        }
        if !(self.near_limit_ratio.is_finite() && self.near_limit_ratio >= 0.0) {
            return Err(ConfigError::new(
                "envoy.metrics.near_limit_ratio",
                format!("{} must be a number from 0 up", self.near_limit_ratio),
            ));
        }
        if let Some(address) = &self.statsd {
            let port = address
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(ConfigError::new(
                    "envoy.metrics.statsd",
                    format!("{address:?} is not host:port"),
                ));
            }
        }
        Ok(())
    }
}
