//! envoyproxy/ratelimit's tracing variables, and the OpenTelemetry SDK's `OTEL_EXPORTER_OTLP_*`
//! ones its exporter reads, as `[tracing]`.

use std::collections::BTreeMap;

use super::{
    in_words_of, ErlEnv, Var, OTEL_EXPORTER_OTLP_CERTIFICATE,
    OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, OTEL_EXPORTER_OTLP_CLIENT_KEY,
    OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_INSECURE, OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE,
    OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE, OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY,
    OTEL_EXPORTER_OTLP_TRACES_COMPRESSION, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_HEADERS, OTEL_EXPORTER_OTLP_TRACES_INSECURE,
    OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, TRACING_ENABLED, TRACING_EXPORTER_PROTOCOL,
    TRACING_SAMPLING_RATE, TRACING_SERVICE_INSTANCE_ID, TRACING_SERVICE_NAME,
    TRACING_SERVICE_NAMESPACE,
};
use crate::config::trace::Protocol;
use crate::config::{Config, ConfigError, Secret};

/// Applies `TRACING_ENABLED` and, when it is true, the rest: `TRACING_SERVICE_NAME` (default
/// `RateLimit`), `TRACING_SERVICE_NAMESPACE`, `TRACING_SERVICE_INSTANCE_ID`,
/// `TRACING_SAMPLING_RATE` (default 1; outside 0..1 the nearest, as the Go SDK does),
/// `TRACING_EXPORTER_PROTOCOL` (`http` or `grpc`), and `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`,
/// `_HEADERS`, `_TIMEOUT`, `_COMPRESSION`, `_INSECURE`. A value tollgate cannot honour is
/// refused, naming the variable.
pub(super) fn apply(config: &mut Config, env: &ErlEnv) -> Result<(), ConfigError> {
    // Unset, the file's `[tracing]` stands.
    if env.get(&TRACING_ENABLED).is_none() {
        return Ok(());
    }
    config.tracing.enabled = env.flag(&TRACING_ENABLED)?;
    if !config.tracing.enabled {
        return Ok(());
    }
    let tracing = &mut config.tracing;
    tracing.service_name = env.or_default(&TRACING_SERVICE_NAME).to_string();
    tracing.service_namespace = env.set(&TRACING_SERVICE_NAMESPACE).map(String::from);
    tracing.service_instance_id = env.set(&TRACING_SERVICE_INSTANCE_ID).map(String::from);
    if let Some(rate) = env.get(&TRACING_SAMPLING_RATE) {
        tracing.sampling_rate = sampling_rate(rate)?;
    }
    tracing.protocol = match env.get(&TRACING_EXPORTER_PROTOCOL) {
        None | Some("http" | "") => Protocol::Http,
        Some("grpc") => Protocol::Grpc,
        Some(other) => {
            return Err(
                TRACING_EXPORTER_PROTOCOL.refuse(format!("{other:?} is neither http nor grpc"))
            )
        }
    };
    // The signal's own variable wins over the general one, as in every OpenTelemetry SDK.
    let otlp = |traces: &'static Var, general: &'static Var| {
        env.get(traces)
            .map(|value| (traces, value))
            .or_else(|| env.get(general).map(|value| (general, value)))
    };
    for (traces, general) in [
        (
            &OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE,
            &OTEL_EXPORTER_OTLP_CERTIFICATE,
        ),
        (
            &OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE,
            &OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
        ),
        (
            &OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY,
            &OTEL_EXPORTER_OTLP_CLIENT_KEY,
        ),
    ] {
        if let Some((row, _)) = otlp(traces, general) {
            env.refuse_if_asked(row)?;
        }
    }
    let compression = otlp(
        &OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
        &OTEL_EXPORTER_OTLP_COMPRESSION,
    );
    if let Some((row, value)) = compression {
        if !value.is_empty() && value != "none" {
            return Err(row.refuse(format!(
                "{value:?}: exports are not compressed (none is supported)"
            )));
        }
    }
    let insecure = match otlp(
        &OTEL_EXPORTER_OTLP_TRACES_INSECURE,
        &OTEL_EXPORTER_OTLP_INSECURE,
    ) {
        None => false,
        Some((row, _)) => env.flag(row)?,
    };
    let endpoint = otlp(
        &OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
        &OTEL_EXPORTER_OTLP_ENDPOINT,
    );
    let endpoint_row = endpoint.map_or(&OTEL_EXPORTER_OTLP_ENDPOINT, |(row, _)| row);
    if let Some((row, endpoint)) = endpoint {
        let endpoint = with_scheme(endpoint, insecure).ok_or_else(|| row.refuse(format!("{endpoint:?}: without http://, the SDK would use TLS, which is not supported (set OTEL_EXPORTER_OTLP_INSECURE=true or an http:// URL)")))?;
        // The general variable is the collector's base URL: OTLP/HTTP posts to its
        // `/v1/traces`. The signal's own is the whole URL.
        tracing.endpoint = Some(
            if tracing.protocol == Protocol::Http && *row == OTEL_EXPORTER_OTLP_ENDPOINT {
                format!("{}/v1/traces", endpoint.trim_end_matches('/'))
            } else {
                endpoint
            },
        );
    }
    if let Some((row, value)) = otlp(
        &OTEL_EXPORTER_OTLP_TRACES_HEADERS,
        &OTEL_EXPORTER_OTLP_HEADERS,
    ) {
        tracing.headers = headers(value)
            .ok_or_else(|| row.refuse("is not a list of key=value pairs separated by commas"))?;
    }
    if let Some((row, value)) = otlp(
        &OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
        &OTEL_EXPORTER_OTLP_TIMEOUT,
    ) {
        tracing.timeout_ms = value
            .trim()
            .parse()
            .map_err(|_| row.refuse(format!("{value:?} is not a number of milliseconds")))?;
    }
    let rows = [
        endpoint_row,
        &OTEL_EXPORTER_OTLP_TIMEOUT,
        &TRACING_SERVICE_NAME,
    ];
    tracing
        .validate()
        .map_err(|error| in_words_of(error, &rows, &OTEL_EXPORTER_OTLP_HEADERS))
}

/// Go's `strconv.ParseFloat`, then what the SDK's ratio sampler makes of it: at least 1
/// samples all, at most 0 none. NaN, which it cannot order, is refused.
fn sampling_rate(text: &str) -> Result<f64, ConfigError> {
    let refuse = || TRACING_SAMPLING_RATE.refuse(format!("{text:?} is not a number"));
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
