//! `[envoy.metrics]`: envoyproxy/ratelimit's metrics (its stats keys and names) served for
//! dashboards written against it: as Prometheus series on a listener of their own, and as
//! statsd counters sent to a statsd server. From TOML, or from its `USE_PROMETHEUS`,
//! `USE_STATSD`, ... variables ([`from_erl_env`]).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use serde_yaml::{Mapping, Value};

use super::ConfigError;

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

/// envoyproxy/ratelimit's stats variables into `metrics`: `USE_PROMETHEUS` (with
/// `PROMETHEUS_ADDR`, `PROMETHEUS_PATH`, `PROMETHEUS_MAPPER_YAML`,
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`), `USE_STATSD` (true unless set otherwise, as
/// there; with `STATSD_HOST`, `STATSD_PORT`, `STATSD_PROTOCOL`, `STATS_FLUSH_INTERVAL`),
/// `NEAR_LIMIT_RATIO`, `DISABLE_STATS`. Refused as it refuses them: two sinks at once. Refused
/// because tollgate cannot honour them: `USE_DOG_STATSD`, `EXTRA_TAGS`, a mapping file other
/// than its built-in one.
pub fn from_erl_env(
    metrics: &mut ErlMetricsConfig,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let flag = |name: &str, default: bool| {
        var(name).map_or(Ok(default), |text| {
            crate::base::go::parse_bool(&text)
                .ok_or_else(|| ConfigError::new(name, format!("{text:?} is not a bool")))
        })
    };
    if flag("DISABLE_STATS", false)? {
        *metrics = ErlMetricsConfig::default();
        return Ok(());
    }
    if flag("USE_DOG_STATSD", false)? {
        return Err(ConfigError::new(
            "USE_DOG_STATSD",
            "true is not supported: tollgate sends plain statsd (USE_STATSD) or serves Prometheus",
        ));
    }
    if let Some(tags) = var("EXTRA_TAGS").filter(|t| !t.is_empty()) {
        return Err(ConfigError::new(
            "EXTRA_TAGS",
            format!("{tags:?}: extra tags on the stats are not supported"),
        ));
    }
    if let Some(ratio) = var("NEAR_LIMIT_RATIO") {
        metrics.near_limit_ratio = ratio
            .parse::<f32>()
            .ok()
            .filter(|r| r.is_finite() && *r >= 0.0)
            .ok_or_else(|| {
                ConfigError::new("NEAR_LIMIT_RATIO", format!("{ratio:?} is not a ratio"))
            })?;
    }
    let prometheus = flag("USE_PROMETHEUS", false)?;
    let statsd = flag("USE_STATSD", true)?;
    if prometheus && statsd {
        return Err(ConfigError::new(
            "USE_PROMETHEUS",
            "true with USE_STATSD true (its default): one stats sink at a time, as \
             envoyproxy/ratelimit allows; set USE_STATSD=false",
        ));
    }
    if prometheus {
        let addr = var("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
        metrics.prometheus_listen = Some(listen_address(&addr)?);
        if let Some(path) = var("PROMETHEUS_PATH") {
            if !path.starts_with('/') {
                return Err(ConfigError::new(
                    "PROMETHEUS_PATH",
                    format!("{path:?} must start with /"),
                ));
            }
            metrics.prometheus_path = path;
        }
        metrics.response_time_ms = flag("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", false)?;
        if let Some(file) = var("PROMETHEUS_MAPPER_YAML").filter(|f| !f.is_empty()) {
            metrics.response_time_ms = mapper_in_milliseconds(&file)?;
        }
    }
    if statsd {
        let host = var("STATSD_HOST").unwrap_or_else(|| "localhost".into());
        if host.is_empty() {
            return Err(ConfigError::new("STATSD_HOST", "must not be empty"));
        }
        let port = var("STATSD_PORT").unwrap_or_else(|| "8125".into());
        let port = port
            .parse::<u16>()
            .map_err(|_| ConfigError::new("STATSD_PORT", format!("{port:?} is not a port")))?;
        metrics.statsd = Some(if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        });
        metrics.statsd_protocol = match var("STATSD_PROTOCOL").as_deref() {
            None | Some("tcp" | "tcp4" | "tcp6") => StatsdProtocol::Tcp,
            Some("udp" | "udp4" | "udp6") => StatsdProtocol::Udp,
            Some(other) => {
                return Err(ConfigError::new(
                    "STATSD_PROTOCOL",
                    format!("{other:?} is neither tcp nor udp"),
                ))
            }
        };
        if let Some(every) = var("STATS_FLUSH_INTERVAL") {
            let interval = crate::base::go::parse_duration(&every)
                .and_then(|d| u64::try_from(d.as_millis()).ok())
                .filter(|&ms| ms > 0)
                .ok_or_else(|| {
                    ConfigError::new(
                        "STATS_FLUSH_INTERVAL",
                        format!("{every:?} is not a duration"),
                    )
                })?;
            metrics.flush_interval_ms = interval;
        }
    }
    Ok(())
}

/// A Go listen address (`:9090`, `host:port`, `[::1]:9090`); an empty host is every interface.
fn listen_address(text: &str) -> Result<SocketAddr, ConfigError> {
    let refuse = || {
        ConfigError::new(
            "PROMETHEUS_ADDR",
            format!("{text:?} is not a listen address"),
        )
    };
    let (host, port) = text.rsplit_once(':').ok_or_else(refuse)?;
    let host = match host {
        "" => "0.0.0.0",
        "localhost" => "127.0.0.1",
        host => host,
    };
    let spelled = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    spelled.parse().map_err(|_| refuse())
}

/// Reads a statsd mapping file: envoyproxy/ratelimit's built-in mapping, as it ships it (the
/// response time scaled to seconds: `false`) or without that scale (Envoy Gateway's copy:
/// `true`). Any other mapping would rename or relabel the series; tollgate serves only these.
fn mapper_in_milliseconds(file: &str) -> Result<bool, ConfigError> {
    let at = "PROMETHEUS_MAPPER_YAML";
    let text =
        std::fs::read_to_string(file).map_err(|e| ConfigError::new(at, format!("{file}: {e}")))?;
    let mut read: Value =
        serde_yaml::from_str(&text).map_err(|e| ConfigError::new(at, format!("{file}: {e}")))?;
    let scale = read
        .get_mut("mappings")
        .and_then(Value::as_sequence_mut)
        .and_then(|mappings| {
            mappings.iter_mut().find(|m| {
                m.get("match").and_then(Value::as_str) == Some("ratelimit_server.*.response_time")
            })
        })
        .and_then(Value::as_mapping_mut)
        .and_then(|mapping| mapping.remove("scale"));
    let in_ms = match scale {
        None => true,
        Some(scale) if scale.as_f64() == Some(0.001) => false,
        Some(_) => return Err(not_built_in(file)),
    };
    if read != built_in_mapping() {
        return Err(not_built_in(file));
    }
    Ok(in_ms)
}

fn not_built_in(file: &str) -> ConfigError {
    ConfigError::new(
        "PROMETHEUS_MAPPER_YAML",
        format!(
            "{file}: only envoyproxy/ratelimit's built-in statsd mapping (with or without its \
             response time scale) is supported"
        ),
    )
}

/// envoyproxy/ratelimit's built-in statsd-to-Prometheus mapping, the response time's scale
/// left out (see [`mapper_in_milliseconds`]); what [`crate::observe::erl_stats`] serves.
fn built_in_mapping() -> Value {
    let map = |pairs: &[(&str, Value)]| {
        Value::Mapping(
            pairs
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect::<Mapping>(),
        )
    };
    let text = |s: &str| Value::from(s);
    let labels = |names: &[&str]| {
        let pairs: Vec<(&str, Value)> = names
            .iter()
            .enumerate()
            .map(|(i, name)| (*name, text(&format!("${}", i + 1))))
            .collect();
        map(&pairs)
    };
    let stats = [
        "near_limit",
        "over_limit",
        "total_hits",
        "within_limit",
        "shadow_mode",
    ];
    let mut mappings = Vec::new();
    for stat in stats {
        mappings.push(map(&[
            (
                "match",
                text(&format!("ratelimit.service.rate_limit.*.*.{stat}")),
            ),
            (
                "name",
                text(&format!("ratelimit_service_rate_limit_{stat}")),
            ),
            ("timer_type", text("histogram")),
            ("labels", labels(&["domain", "key1"])),
        ]));
    }
    for stat in stats {
        let pattern =
            format!(r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.{stat}");
        mappings.push(map(&[
            ("match", text(&pattern)),
            ("match_type", text("regex")),
            (
                "name",
                text(&format!("ratelimit_service_rate_limit_{stat}")),
            ),
            ("timer_type", text("histogram")),
            ("labels", labels(&["domain", "key1", "key2"])),
        ]));
    }
    mappings.push(map(&[
        ("match", text("ratelimit.service.call.should_rate_limit.*")),
        ("name", text("ratelimit_service_should_rate_limit_error")),
        ("match_metric_type", text("counter")),
        ("labels", labels(&["err_type"])),
    ]));
    mappings.push(map(&[
        ("match", text("ratelimit_server.*.total_requests")),
        ("name", text("ratelimit_service_total_requests")),
        ("match_metric_type", text("counter")),
        ("labels", labels(&["grpc_method"])),
    ]));
    mappings.push(map(&[
        ("match", text("ratelimit_server.*.response_time")),
        ("name", text("ratelimit_service_response_time_seconds")),
        ("timer_type", text("histogram")),
        ("labels", labels(&["grpc_method"])),
    ]));
    for outcome in ["success", "error"] {
        mappings.push(map(&[
            (
                "match",
                text(&format!("ratelimit.service.config_load_{outcome}")),
            ),
            (
                "name",
                text(&format!("ratelimit_service_config_load_{outcome}")),
            ),
            ("match_metric_type", text("counter")),
        ]));
    }
    map(&[("mappings", Value::Sequence(mappings))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<ErlMetricsConfig, ConfigError> {
        let mut metrics = ErlMetricsConfig::default();
        let var = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_string())
        };
        from_erl_env(&mut metrics, &var).map(|()| metrics)
    }

    /// The mapping in YAML of its own spelling (flow style, keys in another order): what
    /// counts is what it says.
    fn mapping_file(scale: &str) -> String {
        let stats = [
            "near_limit",
            "over_limit",
            "total_hits",
            "within_limit",
            "shadow_mode",
        ];
        let mut text = String::from("mappings:\n");
        for stat in stats {
            text.push_str(&format!(
                "- {{name: ratelimit_service_rate_limit_{stat}, labels: {{key1: $2, domain: $1}}, \
                 timer_type: histogram, match: 'ratelimit.service.rate_limit.*.*.{stat}'}}\n"
            ));
        }
        for stat in stats {
            text.push_str(&format!(
                "- match: 'ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.{stat}'\n  \
                 match_type: regex\n  name: ratelimit_service_rate_limit_{stat}\n  \
                 timer_type: histogram\n  labels: {{domain: $1, key1: $2, key2: $3}}\n"
            ));
        }
        text.push_str(
            "- {match: ratelimit.service.call.should_rate_limit.*, name: ratelimit_service_should_rate_limit_error, match_metric_type: counter, labels: {err_type: $1}}\n\
             - {match: ratelimit_server.*.total_requests, name: ratelimit_service_total_requests, match_metric_type: counter, labels: {grpc_method: $1}}\n",
        );
        text.push_str(&format!(
            "- {{match: ratelimit_server.*.response_time, name: ratelimit_service_response_time_seconds, timer_type: histogram{scale}, labels: {{grpc_method: $1}}}}\n"
        ));
        text.push_str(
            "- {match: ratelimit.service.config_load_success, name: ratelimit_service_config_load_success, match_metric_type: counter}\n\
             - {match: ratelimit.service.config_load_error, name: ratelimit_service_config_load_error, match_metric_type: counter}\n",
        );
        text
    }

    #[test]
    fn envoy_gateways_variables_serve_prometheus_on_its_port() {
        let dir = std::env::temp_dir().join(format!("tollgate-mapper-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let unscaled = dir.join("eg.yaml");
        std::fs::write(&unscaled, mapping_file("")).unwrap();
        let scaled = dir.join("erl.yaml");
        std::fs::write(&scaled, mapping_file(", scale: 0.001")).unwrap();
        let other = dir.join("other.yaml");
        std::fs::write(&other, mapping_file("").replace("key2: $3", "key3: $3")).unwrap();

        let eg = from(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", unscaled.to_str().unwrap()),
        ])
        .unwrap();
        assert_eq!(eg.prometheus_listen, Some("0.0.0.0:19001".parse().unwrap()));
        assert_eq!(eg.prometheus_path, "/metrics");
        assert!(eg.response_time_ms);
        assert_eq!(eg.statsd, None);
        let erl = from(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_MAPPER_YAML", scaled.to_str().unwrap()),
        ])
        .unwrap();
        assert_eq!(erl.prometheus_listen, Some("0.0.0.0:9090".parse().unwrap()));
        assert!(!erl.response_time_ms);

        let refused = |vars: &[(&str, &str)]| from(vars).unwrap_err().to_string();
        let mapped = [
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_MAPPER_YAML", other.to_str().unwrap()),
        ];
        assert!(refused(&mapped).contains("PROMETHEUS_MAPPER_YAML"));
        assert!(refused(&[("USE_PROMETHEUS", "true")]).contains("USE_STATSD"));
        assert!(
            refused(&[("USE_STATSD", "false"), ("USE_PROMETHEUS", "yes")])
                .contains("USE_PROMETHEUS")
        );
        assert!(refused(&[("USE_DOG_STATSD", "true")]).contains("USE_DOG_STATSD"));
        assert!(refused(&[("EXTRA_TAGS", "a:b")]).contains("EXTRA_TAGS"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn statsd_is_on_unless_told_otherwise_as_in_envoyproxy_ratelimit() {
        let plain = from(&[]).unwrap();
        assert_eq!(plain.statsd.as_deref(), Some("localhost:8125"));
        assert_eq!(plain.statsd_protocol, StatsdProtocol::Tcp);
        assert_eq!(plain.flush_interval_ms, 10_000);
        let set = from(&[
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", "9125"),
            ("STATSD_PROTOCOL", "udp"),
            ("STATS_FLUSH_INTERVAL", "1.5s"),
            ("NEAR_LIMIT_RATIO", "0.9"),
        ])
        .unwrap();
        assert_eq!(set.statsd.as_deref(), Some("127.0.0.1:9125"));
        assert_eq!(set.statsd_protocol, StatsdProtocol::Udp);
        assert_eq!(set.flush_interval_ms, 1_500);
        assert!((set.near_limit_ratio - 0.9).abs() < f32::EPSILON);
        assert!(!from(&[("USE_STATSD", "false")]).unwrap().enabled());
        assert!(!from(&[("DISABLE_STATS", "true")]).unwrap().enabled());
        for bad in [
            ("STATSD_PORT", "x"),
            ("STATSD_PROTOCOL", "sctp"),
            ("STATS_FLUSH_INTERVAL", "10"),
            ("NEAR_LIMIT_RATIO", "lots"),
        ] {
            assert!(
                from(&[bad]).unwrap_err().to_string().contains(bad.0),
                "{bad:?}"
            );
        }
    }
}
