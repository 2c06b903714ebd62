//! `[tracing]`: OpenTelemetry spans of the decisions, exported over OTLP; from TOML, the
//! `TOLLGATE_TRACING__*` environment, or envoyproxy/ratelimit's `TRACING_*` and the standard
//! `OTEL_EXPORTER_OTLP_*` variables it relies on.

use std::collections::BTreeMap;

use http::header::{HeaderName, HeaderValue};
use http::Uri;
use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret};

/// `[tracing]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    pub enabled: bool,
    /// How spans reach the collector.
    pub protocol: Protocol,
    /// The collector: for `http`, the URL spans are posted to (default
    /// `http://localhost:4318/v1/traces`); for `grpc`, its address (default
    /// `http://localhost:4317`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    pub service_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_namespace: Option<String>,
    /// Absent: drawn at random per process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_instance_id: Option<String>,
    /// The fraction of new traces recorded, 0 to 1; a caller's own sampling decision is
    /// always followed.
    pub sampling_rate: f64,
    /// Sent with every export (a collector's API key): values never printed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, Secret>,
    /// One export's deadline.
    pub timeout_ms: u64,
    /// Finished spans waiting for export at most; beyond, new spans are dropped and counted.
    pub queue: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies.
    Http,
    /// OTLP/gRPC.
    Grpc,
}

/// The longest export deadline accepted: a minute.
const MAX_TIMEOUT_MS: u64 = 60_000;
/// The largest queue accepted: a span takes about half a kilobyte.
const MAX_QUEUE: usize = 1_000_000;

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            enabled: false,
            protocol: Protocol::Http,
            endpoint: None,
            service_name: "tollgate".into(),
            service_namespace: None,
            service_instance_id: None,
            sampling_rate: 1.0,
            headers: BTreeMap::new(),
            timeout_ms: 10_000,
            queue: 2048,
        }
    }
}

impl TracingConfig {
    pub fn is_default(&self) -> bool {
        *self == TracingConfig::default()
    }

    /// The collector's URL: `endpoint`, or the protocol's default port on localhost.
    pub fn endpoint_url(&self) -> &str {
        match (&self.endpoint, self.protocol) {
            (Some(endpoint), _) => endpoint,
            (None, Protocol::Http) => "http://localhost:4318/v1/traces",
            (None, Protocol::Grpc) => "http://localhost:4317",
        }
    }

    /// The collector's URL, parsed and checked: `http://`, a host, and for gRPC no path.
    pub fn endpoint_uri(&self) -> Result<Uri, ConfigError> {
        let refuse = |reason: String| ConfigError::new("tracing.endpoint", reason);
        let text = self.endpoint_url();
        let uri: Uri = text
            .parse()
            .map_err(|_| refuse(format!("{text:?} is not a URL")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(refuse(format!(
                    "{text:?}: https is not supported (spans go to the collector over plain \
                     HTTP or gRPC: run one beside tollgate)"
                )))
            }
            _ => return Err(refuse(format!("{text:?} is not an http:// URL"))),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(refuse(format!("{text:?} names no host")));
        }
        if self.protocol == Protocol::Grpc && uri.path() != "/" {
            return Err(refuse(format!(
                "{text:?}: a gRPC endpoint is an address, without a path"
            )));
        }
        Ok(uri)
    }

    /// The export headers, checked as HTTP spells them.
    pub fn header_pairs(&self) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
        self.headers
            .iter()
            .map(|(name, value)| {
                let key = || format!("tracing.headers.{name}");
                let header = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| ConfigError::new(key(), "is not a header name"))?;
                let mut value = HeaderValue::from_str(&value.0)
                    .map_err(|_| ConfigError::new(key(), "is not a header value"))?;
                value.set_sensitive(true);
                Ok((header, value))
            })
            .collect()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sampling_rate) {
            return Err(ConfigError::new(
                "tracing.sampling_rate",
                format!("{} is not between 0 and 1", self.sampling_rate),
            ));
        }
        if self.service_name.is_empty() {
            return Err(ConfigError::new("tracing.service_name", "is empty"));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(ConfigError::new(
                "tracing.timeout_ms",
                format!("must be between 1 and {MAX_TIMEOUT_MS}"),
            ));
        }
        if !(1..=MAX_QUEUE).contains(&self.queue) {
            return Err(ConfigError::new(
                "tracing.queue",
                format!("must be between 1 and {MAX_QUEUE}"),
            ));
        }
        self.endpoint_uri()?;
        self.header_pairs()?;
        Ok(())
    }

    /// One line for `tollgate validate`: header values are never shown.
    pub fn describe(&self) -> String {
        if !self.enabled {
            return "off".into();
        }
        let protocol = match self.protocol {
            Protocol::Http => "OTLP/HTTP",
            Protocol::Grpc => "OTLP/gRPC",
        };
        let mut line = format!(
            "{protocol} to {}, {}% of new traces, service {}",
            self.endpoint_url(),
            // Rounded to a millionth of the rate: 0.1 shows as 10, not 10.000000000000002.
            (self.sampling_rate * 1e6).round() / 1e4,
            self.service_name
        );
        if let Some(namespace) = &self.service_namespace {
            line.push_str(&format!(" in {namespace}"));
        }
        if !self.headers.is_empty() {
            let names: Vec<&str> = self.headers.keys().map(String::as_str).collect();
            line.push_str(&format!(", headers {}", names.join(", ")));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_off() {
        let config = TracingConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!(config.describe(), "off");
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let key = |config: TracingConfig| config.validate().unwrap_err().key;
        let base = TracingConfig::default;
        assert_eq!(
            key(TracingConfig {
                sampling_rate: 1.5,
                ..base()
            }),
            "tracing.sampling_rate"
        );
        assert_eq!(
            key(TracingConfig {
                sampling_rate: f64::NAN,
                ..base()
            }),
            "tracing.sampling_rate"
        );
        assert_eq!(
            key(TracingConfig {
                endpoint: Some("localhost:4318".into()),
                ..base()
            }),
            "tracing.endpoint"
        );
        assert_eq!(
            key(TracingConfig {
                protocol: Protocol::Grpc,
                endpoint: Some("http://collector:4317/v1/traces".into()),
                ..base()
            }),
            "tracing.endpoint"
        );
        assert_eq!(key(TracingConfig { queue: 0, ..base() }), "tracing.queue");
        assert_eq!(
            key(TracingConfig {
                headers: BTreeMap::from([("bad name".into(), Secret("v".into()))]),
                ..base()
            }),
            "tracing.headers.bad name"
        );
    }

    #[test]
    fn the_summary_names_headers_but_never_their_values() {
        let config = TracingConfig {
            enabled: true,
            sampling_rate: 0.01,
            headers: BTreeMap::from([("api-key".into(), Secret("s3cret".into()))]),
            ..TracingConfig::default()
        };
        let line = config.describe();
        assert_eq!(
            line,
            "OTLP/HTTP to http://localhost:4318/v1/traces, 1% of new traces, service tollgate, \
             headers api-key"
        );
    }
}
