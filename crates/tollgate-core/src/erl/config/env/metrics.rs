//! envoyproxy/ratelimit's stats variables, as it reads them, into `[envoy.metrics]`.

use std::net::SocketAddr;

use serde_yaml::{Mapping, Value};

use super::{
    ErlEnv, DISABLE_STATS, EXTRA_TAGS, NEAR_LIMIT_RATIO, PROMETHEUS_ADDR, PROMETHEUS_MAPPER_YAML,
    PROMETHEUS_PATH, PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS, STATSD_HOST, STATSD_PORT,
    STATSD_PROTOCOL, STATS_FLUSH_INTERVAL, USE_DOG_STATSD, USE_PROMETHEUS, USE_STATSD,
};
use crate::config::ConfigError;
use crate::erl::config::metrics::{ErlMetricsConfig, StatsdProtocol};

/// envoyproxy/ratelimit's stats variables into `metrics`: `USE_PROMETHEUS` (with
/// `PROMETHEUS_ADDR`, `PROMETHEUS_PATH`, `PROMETHEUS_MAPPER_YAML`,
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`), `USE_STATSD` (true unless set otherwise, as
/// there; with `STATSD_HOST`, `STATSD_PORT`, `STATSD_PROTOCOL`, `STATS_FLUSH_INTERVAL`),
/// `NEAR_LIMIT_RATIO`, `DISABLE_STATS`. Refused as it refuses them: two sinks at once. Refused
/// because tollgate cannot honour them: `USE_DOG_STATSD`, `EXTRA_TAGS`, a mapping file other
/// than its built-in one.
pub(super) fn apply(metrics: &mut ErlMetricsConfig, env: &ErlEnv) -> Result<(), ConfigError> {
    if env.flag(&DISABLE_STATS)? {
        *metrics = ErlMetricsConfig::default();
        return Ok(());
    }
    env.refuse_if_asked(&USE_DOG_STATSD)?;
    env.refuse_if_asked(&EXTRA_TAGS)?;
    if let Some(ratio) = env.get(&NEAR_LIMIT_RATIO) {
        metrics.near_limit_ratio = ratio
            .parse::<f32>()
            .ok()
            .filter(|r| r.is_finite() && *r >= 0.0)
            .ok_or_else(|| NEAR_LIMIT_RATIO.refuse(format!("{ratio:?} is not a ratio")))?;
    }
    let prometheus = env.flag(&USE_PROMETHEUS)?;
    let statsd = env.flag(&USE_STATSD)?;
    if prometheus && statsd {
        return Err(USE_PROMETHEUS.refuse(
            "true with USE_STATSD true (its default): one stats sink at a time, as \
             envoyproxy/ratelimit allows; set USE_STATSD=false",
        ));
    }
    if prometheus {
        metrics.prometheus_listen = Some(listen_address(env.or_default(&PROMETHEUS_ADDR))?);
        if let Some(path) = env.get(&PROMETHEUS_PATH) {
            if !path.starts_with('/') {
                return Err(PROMETHEUS_PATH.refuse(format!("{path:?} must start with /")));
            }
            metrics.prometheus_path = path.to_string();
        }
        metrics.response_time_ms = env.flag(&PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS)?;
        if let Some(file) = env.set(&PROMETHEUS_MAPPER_YAML) {
            metrics.response_time_ms = mapper_in_milliseconds(file)?;
        }
    }
    if statsd {
        let host = env.or_default(&STATSD_HOST);
        if host.is_empty() {
            return Err(STATSD_HOST.refuse("must not be empty"));
        }
        let port = env.or_default(&STATSD_PORT);
        let port = port
            .parse::<u16>()
            .map_err(|_| STATSD_PORT.refuse(format!("{port:?} is not a port")))?;
        metrics.statsd = Some(if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        });
        metrics.statsd_protocol = match env.get(&STATSD_PROTOCOL) {
            None | Some("tcp" | "tcp4" | "tcp6") => StatsdProtocol::Tcp,
            Some("udp" | "udp4" | "udp6") => StatsdProtocol::Udp,
            Some(other) => {
                return Err(STATSD_PROTOCOL.refuse(format!("{other:?} is neither tcp nor udp")))
            }
        };
        if let Some(every) = env.duration(&STATS_FLUSH_INTERVAL)? {
            // Go's durations end within 292 years: whole milliseconds fit.
            let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
            if ms == 0 {
                let text = env.or_default(&STATS_FLUSH_INTERVAL);
                return Err(STATS_FLUSH_INTERVAL.refuse(format!("{text:?} is not a duration")));
            }
            metrics.flush_interval_ms = ms;
        }
    }
    Ok(())
}

/// A Go listen address (`:9090`, `host:port`, `[::1]:9090`); an empty host is every interface.
fn listen_address(text: &str) -> Result<SocketAddr, ConfigError> {
    let refuse = || PROMETHEUS_ADDR.refuse(format!("{text:?} is not a listen address"));
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
    let refuse = |e: &dyn std::fmt::Display| PROMETHEUS_MAPPER_YAML.refuse(format!("{file}: {e}"));
    let text = std::fs::read_to_string(file).map_err(|e| refuse(&e))?;
    let mut read: Value = serde_yaml::from_str(&text).map_err(|e| refuse(&e))?;
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
    PROMETHEUS_MAPPER_YAML.refuse(format!(
        "{file}: only envoyproxy/ratelimit's built-in statsd mapping (with or without its \
             response time scale) is supported"
    ))
}

/// envoyproxy/ratelimit's built-in statsd-to-Prometheus mapping, the response time's scale
/// left out (see [`mapper_in_milliseconds`]); what `crate::erl::observe` serves.
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
mod tests;
