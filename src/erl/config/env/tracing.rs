//! envoyproxy/ratelimit's tracing variables, and the OpenTelemetry SDK's `OTEL_EXPORTER_OTLP_*`
//! ones its exporter reads, as `[tracing]`.

use std::collections::BTreeMap;

use crate::config::trace::Protocol;
use crate::config::{Config, ConfigError, Secret};

/// The service name envoyproxy/ratelimit reports when `TRACING_SERVICE_NAME` is unset.
const ERL_SERVICE_NAME: &str = "RateLimit";

/// Variables of the OpenTelemetry SDK that ask for what tollgate cannot do: TLS to the
/// collector, compressed exports.
const REFUSED: &[(&str, &str)] = &[
    ("CERTIFICATE", "TLS to the collector is not supported"),
    (
        "CLIENT_CERTIFICATE",
        "TLS to the collector is not supported",
    ),
    ("CLIENT_KEY", "TLS to the collector is not supported"),
];

/// Applies `TRACING_ENABLED` and, when it is true, the rest: `TRACING_SERVICE_NAME` (default
/// `RateLimit`), `TRACING_SERVICE_NAMESPACE`, `TRACING_SERVICE_INSTANCE_ID`,
/// `TRACING_SAMPLING_RATE` (default 1; outside 0..1 the nearest, as the Go SDK does),
/// `TRACING_EXPORTER_PROTOCOL` (`http` or `grpc`), and `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`,
/// `_HEADERS`, `_TIMEOUT`, `_COMPRESSION`, `_INSECURE`. A value tollgate cannot honour is
/// refused, naming the variable.
pub fn apply(
    config: &mut Config,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let Some(enabled) = var("TRACING_ENABLED") else {
        return Ok(());
    };
    config.tracing.enabled = crate::base::go::parse_bool(&enabled)
        .ok_or_else(|| ConfigError::new("TRACING_ENABLED", format!("{enabled:?} is not a bool")))?;
    if !config.tracing.enabled {
        return Ok(());
    }
    let tracing = &mut config.tracing;
    tracing.service_name = var("TRACING_SERVICE_NAME").unwrap_or_else(|| ERL_SERVICE_NAME.into());
    tracing.service_namespace = var("TRACING_SERVICE_NAMESPACE").filter(|n| !n.is_empty());
    tracing.service_instance_id = var("TRACING_SERVICE_INSTANCE_ID").filter(|i| !i.is_empty());
    if let Some(rate) = var("TRACING_SAMPLING_RATE") {
        tracing.sampling_rate = sampling_rate(&rate)?;
    }
    tracing.protocol = match var("TRACING_EXPORTER_PROTOCOL").as_deref() {
        None | Some("http" | "") => Protocol::Http,
        Some("grpc") => Protocol::Grpc,
        Some(other) => {
            return Err(ConfigError::new(
                "TRACING_EXPORTER_PROTOCOL",
                format!("{other:?} is neither http nor grpc"),
            ))
        }
    };
    // The signal's own variable wins over the general one, as in every OpenTelemetry SDK.
    let otlp = |name: &str| {
        let traces = format!("OTEL_EXPORTER_OTLP_TRACES_{name}");
        var(&traces).map(|value| (traces, value)).or_else(|| {
            var(&format!("OTEL_EXPORTER_OTLP_{name}"))
                .map(|value| (format!("OTEL_EXPORTER_OTLP_{name}"), value))
        })
    };
    for (name, reason) in REFUSED {
        if let Some((variable, _)) = otlp(name).filter(|(_, value)| !value.is_empty()) {
            return Err(ConfigError::new(variable, *reason));
        }
    }
    if let Some((variable, value)) = otlp("COMPRESSION") {
        if !value.is_empty() && value != "none" {
            return Err(ConfigError::new(
                variable,
                format!("{value:?}: exports are not compressed (none is supported)"),
            ));
        }
    }
    let insecure = match otlp("INSECURE") {
        None => false,
        Some((variable, value)) => crate::base::go::parse_bool(&value)
            .ok_or_else(|| ConfigError::new(variable, format!("{value:?} is not a bool")))?,
    };
    let signal = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let endpoint_variable = if signal.is_some() {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    } else {
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    };
    if let Some(endpoint) = signal.or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT")) {
        let endpoint = with_scheme(&endpoint, insecure)
            .ok_or_else(|| ConfigError::new(endpoint_variable, format!("{endpoint:?}: without http://, the SDK would use TLS, which is not supported (set OTEL_EXPORTER_OTLP_INSECURE=true or an http:// URL)")))?;
        // The general variable is the collector's base URL: OTLP/HTTP posts to its
        // `/v1/traces`. The signal's own is the whole URL.
        tracing.endpoint = Some(
            if tracing.protocol == Protocol::Http
                && endpoint_variable == "OTEL_EXPORTER_OTLP_ENDPOINT"
            {
                format!("{}/v1/traces", endpoint.trim_end_matches('/'))
            } else {
                endpoint
            },
        );
    }
    if let Some((variable, value)) = otlp("HEADERS") {
        tracing.headers = headers(&value).ok_or_else(|| {
            ConfigError::new(
                variable,
                "is not a list of key=value pairs separated by commas",
            )
        })?;
    }
    if let Some((variable, value)) = otlp("TIMEOUT") {
        tracing.timeout_ms = value.trim().parse().map_err(|_| {
            ConfigError::new(
                variable,
                format!("{value:?} is not a number of milliseconds"),
            )
        })?;
    }
    tracing.validate().map_err(|error| {
        error.as_variable(
            &[
                ("tracing.endpoint", endpoint_variable),
                ("tracing.timeout_ms", "OTEL_EXPORTER_OTLP_TIMEOUT"),
                ("tracing.service_name", "TRACING_SERVICE_NAME"),
            ],
            "OTEL_EXPORTER_OTLP_HEADERS",
        )
    })
}

/// Go's `strconv.ParseFloat`, then what the SDK's ratio sampler makes of it: at least 1
/// samples all, at most 0 none. NaN, which it cannot order, is refused.
fn sampling_rate(text: &str) -> Result<f64, ConfigError> {
    let refuse = || ConfigError::new("TRACING_SAMPLING_RATE", format!("{text:?} is not a number"));
    let rate: f64 = text.parse().map_err(|_| refuse())?;
    if rate.is_nan() {
        return Err(refuse());
    }
    Ok(rate.clamp(0.0, 1.0))
}

/// The endpoint as a URL: as given when it has a scheme; a bare `host:port` is plain HTTP only
/// when the SDK would connect without TLS (`OTEL_EXPORTER_OTLP_INSECURE`).
fn with_scheme(endpoint: &str, insecure: bool) -> Option<String> {
    if endpoint.contains("://") {
        Some(endpoint.to_string())
    } else if insecure {
        Some(format!("http://{endpoint}"))
    } else {
        None
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value,key2=value2`, values percent-encoded.
fn headers(text: &str) -> Option<BTreeMap<String, Secret>> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').filter(|pair| !pair.trim().is_empty()) {
        let (key, value) = pair.split_once('=')?;
        let key = key.trim();
        if key.is_empty() {
            return None;
        }
        out.insert(
            key.to_ascii_lowercase(),
            Secret(percent_decoded(value.trim())?),
        );
    }
    Some(out)
}

fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
