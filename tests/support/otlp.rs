//! An OTLP trace receiver (`otlp_receiver.py` beside this file): OTLP/gRPC and OTLP/HTTP,
//! decoded with the OpenTelemetry project's own generated messages (pip `opentelemetry-proto`,
//! on Python's `grpcio`), not with tollgate's. Every span it receives is one JSON line in a
//! file, which [`OtlpReceiver::spans`] reads back. Killed by its own pid on drop.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{wait_until, TempDir};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/support/otlp_receiver.py"
);

pub struct OtlpReceiver {
    /// OTLP/gRPC (`http://` + this).
    pub grpc: SocketAddr,
    /// OTLP/HTTP (`http://` + this + `/v1/traces`).
    pub http: SocketAddr,
    child: Child,
    dir: TempDir,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        let dir = TempDir::new("otlp");
        let ports = dir.path().join("ports");
        let log = std::fs::File::create(dir.path().join("receiver.log")).expect("receiver.log");
        let child = Command::new("python3")
            .arg(SCRIPT)
            .arg(dir.path().join("spans.jsonl"))
            .arg(&ports)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start python3");
        let mut receiver = OtlpReceiver {
            grpc: "127.0.0.1:0".parse().unwrap(),
            http: "127.0.0.1:0".parse().unwrap(),
            child,
            dir,
        };
        let up = wait_until(Duration::from_secs(20), || {
            matches!(receiver.child.try_wait(), Ok(Some(_))) || ports.is_file()
        });
        let text = std::fs::read_to_string(&ports).unwrap_or_default();
        let mut numbers = text.split_whitespace();
        let (Some(grpc), Some(http)) = (numbers.next(), numbers.next()) else {
            panic!(
                "the OTLP receiver did not start (up: {up}; pip install grpcio \
                 opentelemetry-proto): {}",
                receiver.log()
            );
        };
        receiver.grpc = format!("127.0.0.1:{grpc}").parse().unwrap();
        receiver.http = format!("127.0.0.1:{http}").parse().unwrap();
        receiver
    }

    /// `[tracing]` pointing at this receiver with `protocol` (`http` or `grpc`).
    pub fn tracing_table(&self, protocol: &str) -> String {
        let endpoint = match protocol {
            "grpc" => format!("http://{}", self.grpc),
            _ => format!("http://{}/v1/traces", self.http),
        };
        format!("[tracing]\nenabled = true\nprotocol = {protocol:?}\nendpoint = {endpoint:?}\n")
    }

    /// Every span received so far, as the receiver wrote it: the OTLP JSON mapping with ids
    /// in hex, `attributes` and `resource` as objects of their values, `protocol` (`grpc`,
    /// `http`) and `headers` (of the export that carried it).
    pub fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("spans.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    /// Waits for spans until `wanted` finds its pick among them, returning it.
    pub fn wait_for<T>(
        &self,
        within: Duration,
        mut wanted: impl FnMut(&[Value]) -> Option<T>,
    ) -> T {
        let mut found = None;
        wait_until(within, || {
            found = wanted(&self.spans());
            found.is_some()
        });
        found.unwrap_or_else(|| {
            panic!(
                "not among the received spans: {:#?}\nreceiver log: {}",
                self.spans(),
                self.log()
            )
        })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("receiver.log")).unwrap_or_default()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A span attribute's value as a string (`stringValue`, `intValue`, `boolValue` as written).
pub fn attribute(span: &Value, key: &str) -> Option<String> {
    let value = span.get("attributes")?.get(key)?;
    if let Some(text) = value.get("stringValue").and_then(Value::as_str) {
        return Some(text.to_string());
    }
    if let Some(number) = value.get("intValue").and_then(Value::as_str) {
        return Some(number.to_string());
    }
    if let Some(flag) = value.get("boolValue").and_then(Value::as_bool) {
        return Some(flag.to_string());
    }
    value
        .get("arrayValue")
        .and_then(|array| array.get("values"))
        .and_then(Value::as_array)
        .map(|values| {
            values
                .iter()
                .filter_map(|v| v.get("stringValue").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(",")
        })
}

/// Asserts `span`'s attributes: each `(key, Some(value))` as [`attribute`] reads it, each
/// `(key, None)` absent.
#[track_caller]
pub fn assert_span(span: &Value, expected: &[(&str, Option<&str>)]) {
    for &(key, value) in expected {
        assert_eq!(attribute(span, key).as_deref(), value, "{key} in {span:#}");
    }
}

/// The span's `service.name`.
pub fn service(span: &Value) -> Option<&str> {
    span.get("resource")?
        .get("service.name")?
        .get("stringValue")?
        .as_str()
}
