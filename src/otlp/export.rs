//! The exporter: a background task that takes finished spans from a bounded queue, batches
//! them (up to [`MAX_BATCH`], or whatever came within the flush interval) and sends each
//! batch to the collector over OTLP: HTTP (`POST` of protobuf) or gRPC
//! (`TraceService/Export`). A batch that fails is dropped and counted, never retried: the
//! queue behind it keeps filling, and a full queue drops new spans, so a slow collector
//! costs spans, never a decision's time.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::Uri;
use hyper_util::rt::TokioIo;
use prost::Message;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use super::messages::{
    self, ExportTraceServiceRequest, ExportTraceServiceResponse, KeyValue, Value,
};
use tollgate_core::config::trace::{Protocol, TracingConfig};
use tollgate_core::config::ConfigError;
use tollgate_core::observe::metrics::SpanCounters;
use tollgate_core::observe::trace::{self, FinishedSpan, Tracer};

/// Spans sent in one export at most (the OpenTelemetry SDKs' default batch).
pub const MAX_BATCH: usize = 512;
/// The gRPC method of OTLP traces.
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Where and how spans go.
#[derive(Debug, Clone)]
enum ExportTarget {
    /// OTLP/HTTP: protobuf `POST`ed to this URL (`http://host:port/v1/traces`).
    Http(Uri),
    /// OTLP/gRPC to this endpoint (`http://host:port`).
    Grpc(Uri),
}

/// Everything the exporter needs, from `[tracing]`.
struct ExportSettings {
    target: ExportTarget,
    /// Sent with every export (a collector's API key, ...).
    headers: Vec<(HeaderName, HeaderValue)>,
    /// One export's deadline.
    timeout: Duration,
    /// A batch smaller than [`MAX_BATCH`] goes after this long.
    flush_every: Duration,
    /// `service.name`, `service.namespace`, `service.instance.id`, ... of every span.
    resource: Vec<(&'static str, String)>,
}

#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("cannot connect: {0}")]
    Connect(#[from] std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("{0}")]
    Request(#[from] hyper::http::Error),
    #[error("the collector answered {0}")]
    Status(hyper::StatusCode),
    #[error("{0}")]
    Grpc(#[from] tonic::Status),
    #[error("no answer within the export timeout")]
    Timeout,
    #[error("the collector rejected {0} spans: {1}")]
    Rejected(i64, String),
}

/// The export headers in hyper's types, from the ones the config checked.
fn header_pairs(config: &TracingConfig) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    config
        .header_pairs()?
        .into_iter()
        .map(|(name, value)| {
            let key = || format!("tracing.headers.{name}");
            let name = HeaderName::from_bytes(name.as_str().as_bytes())
                .map_err(|_| ConfigError::new(key(), "is not a header name"))?;
            let mut value = HeaderValue::from_bytes(value.as_bytes())
                .map_err(|_| ConfigError::new(key(), "is not a header value"))?;
            value.set_sensitive(true);
            Ok((name, value))
        })
        .collect()
}

/// Starts the exporter of `config` on the current Tokio runtime; the [`Tracer`] it returns
/// feeds it. Batches wait at most `flush_every`.
pub fn spawn_exporter(
    config: &TracingConfig,
    flush_every: Duration,
    counters: SpanCounters,
) -> Result<Tracer, ConfigError> {
    // Checked by the config (as the core spells HTTP), then taken in hyper's own types: the
    // checked text parses alike, so neither conversion refuses what the check let through.
    let uri = Uri::try_from(config.endpoint_uri()?.to_string())
        .map_err(|_| ConfigError::new("tracing.endpoint", "is not a URL"))?;
    let target = match config.protocol {
        Protocol::Http => ExportTarget::Http(uri),
        Protocol::Grpc => ExportTarget::Grpc(uri),
    };
    let mut resource = vec![
        ("service.name", config.service_name.clone()),
        ("service.version", env!("CARGO_PKG_VERSION").to_string()),
        (
            "service.instance.id",
            config
                .service_instance_id
                .clone()
                .unwrap_or_else(random_instance_id),
        ),
    ];
    if let Some(namespace) = &config.service_namespace {
        resource.push(("service.namespace", namespace.clone()));
    }
    let settings = ExportSettings {
        target,
        headers: header_pairs(config)?,
        timeout: Duration::from_millis(config.timeout_ms),
        flush_every,
        resource,
    };
    let (queue, spans) = mpsc::channel(config.queue.max(1));
    let tracer = Tracer::new(config.sampling_rate, queue, counters.queue_full.clone());
    tokio::spawn(run(settings, spans, counters));
    Ok(tracer)
}

/// A random UUID (version 4), as the OpenTelemetry SDKs make a `service.instance.id`.
fn random_instance_id() -> String {
    let mut bytes = trace::new_trace_id();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = trace::hex(&bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

async fn run(
    settings: ExportSettings,
    mut spans: mpsc::Receiver<FinishedSpan>,
    counters: SpanCounters,
) {
    let mut client = Client::new(&settings.target);
    let resource = messages::Resource {
        attributes: settings
            .resource
            .iter()
            .map(|(key, value)| KeyValue::new(key, Value::String(value.clone())))
            .collect(),
    };
    let mut batch = Vec::with_capacity(MAX_BATCH);
    // Logged once when exports start failing and once when they work again: a collector that
    // is away must not flood the log with a line per batch.
    let mut failing = false;
    let mut tick = tokio::time::interval(settings.flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The batch is never full here: it was sent as soon as it filled.
        let room = MAX_BATCH - batch.len();
        let (flush, closed) = tokio::select! {
            received = spans.recv_many(&mut batch, room) => {
                (received == 0 || batch.len() >= MAX_BATCH, received == 0)
            }
            _ = tick.tick() => (true, false),
        };
        if flush && !batch.is_empty() {
            let count = batch.len() as u64;
            // Spelled as OTLP here, in the exporter's task: the request path only queued them.
            let spans = batch.drain(..).map(messages::Span::from).collect();
            let request = envelope(&resource, spans);
            match client.export(&request, &settings).await {
                Ok(()) => {
                    counters.exported.inc_by(count);
                    if std::mem::take(&mut failing) {
                        log::info!("tracing: spans are exported again");
                    }
                }
                Err(error) => {
                    counters.export_failed.inc_by(count);
                    if std::mem::replace(&mut failing, true) {
                        log::debug!("tracing: {count} spans not exported: {error}");
                    } else {
                        log::warn!(
                            "tracing: {count} spans not exported: {error} (counted in \
                             tollgate_trace_spans_total; logged again when exports work)"
                        );
                    }
                }
            }
        }
        if closed {
            return;
        }
    }
}

/// One export's message: the batch under this process's resource and tollgate's scope.
fn envelope(
    resource: &messages::Resource,
    spans: Vec<messages::Span>,
) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![messages::ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![messages::ScopeSpans {
                scope: Some(messages::InstrumentationScope {
                    name: "tollgate".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans,
            }],
        }],
    }
}

/// The connection to the collector, kept between exports and made again after a failure.
enum Client {
    Http {
        uri: Uri,
        connection: Option<SendRequest<Full<Bytes>>>,
    },
    Grpc(tonic::client::Grpc<Channel>),
}

impl Client {
    fn new(target: &ExportTarget) -> Client {
        match target {
            ExportTarget::Http(uri) => Client::Http {
                uri: uri.clone(),
                connection: None,
            },
            // Connects at the first export, and again whenever the connection is lost.
            ExportTarget::Grpc(uri) => Client::Grpc(tonic::client::Grpc::new(
                Endpoint::from(uri.clone()).connect_lazy(),
            )),
        }
    }

    async fn export(
        &mut self,
        request: &ExportTraceServiceRequest,
        settings: &ExportSettings,
    ) -> Result<(), ExportError> {
        let sent = tokio::time::timeout(settings.timeout, self.send(request, &settings.headers));
        let answer = match sent.await {
            Ok(answer) => answer,
            Err(_) => Err(ExportError::Timeout),
        };
        if answer.is_err() {
            if let Client::Http { connection, .. } = self {
                *connection = None;
            }
        }
        let answer = answer?;
        match answer.partial_success {
            Some(partial) if partial.rejected_spans > 0 => Err(ExportError::Rejected(
                partial.rejected_spans,
                partial.error_message,
            )),
            _ => Ok(()),
        }
    }

    async fn send(
        &mut self,
        request: &ExportTraceServiceRequest,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<ExportTraceServiceResponse, ExportError> {
        match self {
            Client::Http { uri, connection } => {
                let sender = match connection {
                    Some(sender) if sender.is_ready() => sender,
                    _ => connection.insert(connect(uri).await?),
                };
                post(sender, uri, headers, request.encode_to_vec()).await
            }
            Client::Grpc(grpc) => {
                let mut call = tonic::Request::new(request.clone());
                for (name, value) in headers {
                    if let (Ok(name), Ok(value)) = (
                        tonic::metadata::AsciiMetadataKey::from_bytes(name.as_str().as_bytes()),
                        tonic::metadata::AsciiMetadataValue::try_from(value.as_bytes()),
                    ) {
                        call.metadata_mut().insert(name, value);
                    }
                }
                grpc.ready()
                    .await
                    .map_err(|error| tonic::Status::unavailable(error.to_string()))?;
                let codec = tonic_prost::ProstCodec::default();
                let path = hyper::http::uri::PathAndQuery::from_static(EXPORT_PATH);
                Ok(grpc.unary(call, path, codec).await?.into_inner())
            }
        }
    }
}

/// An HTTP/1.1 connection to the collector.
async fn connect(uri: &Uri) -> Result<SendRequest<Full<Bytes>>, ExportError> {
    let host = uri.host().unwrap_or("localhost");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            log::debug!("tracing: the collector's connection ended: {error}");
        }
    });
    Ok(sender)
}

async fn post(
    sender: &mut SendRequest<Full<Bytes>>,
    uri: &Uri,
    headers: &[(HeaderName, HeaderValue)],
    body: Vec<u8>,
) -> Result<ExportTraceServiceResponse, ExportError> {
    let mut request = hyper::Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(HOST, uri.authority().map_or("localhost", |a| a.as_str()))
        .header(CONTENT_TYPE, "application/x-protobuf");
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::from(body)))?)
        .await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        return Err(ExportError::Status(status));
    }
    // An empty or unreadable answer of a 2xx is a full success.
    Ok(ExportTraceServiceResponse::decode(body).unwrap_or_default())
}
