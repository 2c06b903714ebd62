//! envoyproxy/ratelimit's xDS config source (`[envoy] xds`, its `CONFIG_TYPE=GRPC_XDS_SOTW`):
//! a state-of-the-world ADS client. It asks the management server for every
//! `RateLimitConfig` resource; each response is the whole set, decoded into rules ([`rules`])
//! and installed as a reload installs a config directory, then acknowledged (its version and nonce) or, when refused, answered
//! with the version still running and the reason, the running rules kept.
//!
//! Plain HTTP/2, or TLS (mutual with a client certificate, as Envoy Gateway's server asks).
//! A broken stream or a server that cannot be reached is tried again after `retry_ms`; the
//! last installed rules keep serving meanwhile, and they are asked for again by version, so
//! a server that has nothing newer need not resend them.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::mpsc;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use rules::{rules_from_resources, RESOURCE_TYPE};
use tollgate_core::config::ConfigError;
use tollgate_core::erl::config::xds::XdsConfig;
use tollgate_core::erl::config::RuleConfig;

pub mod rules;

/// What installs the rules a response carries (or its refusal of them) with the running
/// configuration, and says whether they were installed: the running process's reload.
pub type Install =
    Arc<dyn Fn(Result<Vec<RuleConfig>, ConfigError>) -> Result<(), ConfigError> + Send + Sync>;

/// A server gone silent (no FIN: a partition, a node lost) is found out within this plus
/// [`KEEPALIVE_TIMEOUT`], not only when the kernel gives up on the connection.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a refused response's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

#[derive(Debug, thiserror::Error)]
enum XdsError {
    #[error("cannot connect: {}", with_causes(.0))]
    Connect(#[from] tonic::transport::Error),
    #[error("cannot connect: cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the stream failed: {}", .0.message())]
    Stream(#[from] tonic::Status),
    #[error("the server closed the stream")]
    Closed,
}

/// The error and its causes: a transport error alone says only "transport error".
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// Follows the management server for as long as the instance runs. Dropped with the
/// runtime at shutdown: nothing waits for it.
pub async fn follow(settings: XdsConfig, install: Install) {
    let retry = Duration::from_millis(settings.retry_ms);
    let mut client = Client {
        node: node(&settings),
        accepted: String::new(),
        install,
        connected: false,
    };
    let mut last_error = String::new();
    loop {
        client.connected = false;
        let error = client.session(&settings).await.to_string();
        // A server away for long fails every retry the same way: warned once, until a
        // stream opens again or the failure changes.
        let again = !client.connected && error == last_error;
        if again {
            log::debug!("xDS {}: {error}", settings.server);
        } else {
            log::warn!(
                "xDS {}: {error}; trying again every {retry:?}, the running rules stay",
                settings.server
            );
        }
        last_error = error;
        tokio::time::sleep(retry).await;
    }
}

struct Client {
    node: Node,
    /// The version of the last installed response: sent with every answer until a newer one
    /// is installed, and on reconnection.
    accepted: String,
    install: Install,
    /// Whether the current session opened its stream.
    connected: bool,
}

impl Client {
    /// One stream, from connecting until it breaks.
    async fn session(&mut self, settings: &XdsConfig) -> XdsError {
        match self.stream(settings).await {
            Ok(never) => match never {},
            Err(error) => error,
        }
    }

    async fn stream(&mut self, settings: &XdsConfig) -> Result<std::convert::Infallible, XdsError> {
        let channel = endpoint(settings)?.connect().await?;
        let mut ads = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(settings.max_message_bytes);
        let (send, queue) = mpsc::channel(4);
        // The queue is empty and open: the first request always fits.
        let _ = send.try_send(self.request(String::new(), None));
        let outbound = futures_util::stream::unfold(queue, |mut queue| async move {
            queue.recv().await.map(|request| (request, queue))
        });
        let mut call = tonic::Request::new(outbound);
        for (name, value) in &settings.headers {
            // Checked at load ([`XdsConfig::check`]).
            if let (Ok(name), Ok(value)) = (
                name.parse::<AsciiMetadataKey>(),
                value.parse::<AsciiMetadataValue>(),
            ) {
                call.metadata_mut().insert(name, value);
            }
        }
        let mut inbound = ads.stream_aggregated_resources(call).await?.into_inner();
        self.connected = true;
        log::info!(
            "xDS {}: connected as node {:?}",
            settings.server,
            self.node.id
        );
        while let Some(response) = inbound.message().await? {
            let answer = self.answer(response).await;
            send.send(answer).await.map_err(|_| XdsError::Closed)?;
        }
        Err(XdsError::Closed)
    }

    /// Installs the response's resources and acknowledges them, or refuses them: the version
    /// still running, the nonce answered, and why. Decoding and compiling run on a blocking
    /// thread: a large set takes a while, and this thread also runs signals, reloads and the
    /// other background duties.
    async fn answer(&mut self, response: DiscoveryResponse) -> DiscoveryRequest {
        let DiscoveryResponse {
            version_info,
            resources,
            type_url,
            nonce,
            ..
        } = response;
        let domains = resources.len();
        let install = Arc::clone(&self.install);
        let installed = tokio::task::spawn_blocking(move || {
            let fed = if type_url == RESOURCE_TYPE {
                rules_from_resources(&resources)
            } else {
                Err(ConfigError::new(
                    "xds",
                    format!("type {type_url:?} was not asked for"),
                ))
            };
            install(fed)
        })
        .await
        .unwrap_or_else(|error| {
            Err(ConfigError::new(
                "xds",
                format!("the compile failed: {error}"),
            ))
        });
        match installed {
            Ok(()) => {
                log::info!("xDS: version {version_info:?} installed: {domains} domain(s)");
                self.accepted = version_info;
                self.request(nonce, None)
            }
            Err(error) => {
                log::error!(
                    "xDS: version {version_info:?} refused, keeping the running rules: {error}"
                );
                let detail = RpcStatus {
                    code: INVALID_ARGUMENT,
                    message: error.to_string(),
                    details: Vec::new(),
                };
                self.request(nonce, Some(detail))
            }
        }
    }

    fn request(&self, nonce: String, error_detail: Option<RpcStatus>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.accepted.clone(),
            node: Some(self.node.clone()),
            type_url: RESOURCE_TYPE.into(),
            response_nonce: nonce,
            error_detail,
            ..DiscoveryRequest::default()
        }
    }
}

/// Where to connect and how. The certificates are read at each connection, so renewed ones
/// are used from the next.
fn endpoint(settings: &XdsConfig) -> Result<Endpoint, XdsError> {
    let scheme = if settings.tls { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{}", settings.server))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_EVERY)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if !settings.tls {
        return Ok(endpoint);
    }
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|source| XdsError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    let mut tls = match &settings.files.ca_file {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&settings.files.cert_file, &settings.files.key_file) {
        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    let host = settings
        .server
        .rsplit_once(':')
        .map_or(settings.server.as_str(), |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = settings.server_name.as_deref().unwrap_or(host);
    Ok(endpoint.tls_config(tls.domain_name(name))?)
}

/// The node this instance is: its id and metadata (string values), named as tollgate.
fn node(settings: &XdsConfig) -> Node {
    let fields = settings
        .node_metadata
        .iter()
        .map(|(key, value)| {
            let value = Value {
                kind: Some(Kind::StringValue(value.clone())),
            };
            (key.clone(), value)
        })
        .collect();
    Node {
        id: settings.node_id.clone(),
        metadata: Some(Struct { fields }),
        user_agent_name: "tollgate".into(),
        ..Node::default()
    }
}
