//! A small xDS management server (ADS, state of the world) serving `RateLimitConfig`
//! snapshots, as Envoy Gateway's serves its rate limit deployment. It runs in a runtime of its
//! own, so [`XdsServer::kill`] drops every connection at once, as a process dying would, and
//! [`XdsServer::restart`] serves the same snapshots on the same port again. With
//! [`XdsServer::start_tls`] it speaks only mutual TLS, as Envoy Gateway's does.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use futures_util::Stream;
use prost::Message as _;
use tonic::metadata::MetadataMap;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use super::free_port;

pub const RESOURCE_TYPE: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

/// One request the server received, with the gRPC metadata of its stream.
#[derive(Debug, Clone)]
pub struct Received {
    pub request: DiscoveryRequest,
    pub metadata: MetadataMap,
}

#[derive(Default)]
struct Inner {
    /// The snapshot served: its version, resources, and a generation that changes with it.
    snapshot: Option<(String, Vec<Any>)>,
    generation: u64,
    received: Vec<Received>,
    /// The nonce of every response sent, by version.
    sent: Vec<(String, String)>,
    nonces: u64,
}

/// What outlives a restart: the snapshot, what was received and sent.
struct Shared {
    inner: Mutex<Inner>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The response for the current snapshot if `seen` is older, and its generation.
    fn response_after(&self, seen: u64) -> Option<(u64, DiscoveryResponse)> {
        let mut inner = self.lock();
        if inner.generation == seen {
            return None;
        }
        let (version, resources) = inner.snapshot.clone()?;
        inner.nonces += 1;
        let nonce = format!("nonce-{}", inner.nonces);
        inner.sent.push((version.clone(), nonce.clone()));
        let response = DiscoveryResponse {
            version_info: version,
            resources,
            type_url: RESOURCE_TYPE.into(),
            nonce,
            ..DiscoveryResponse::default()
        };
        Some((inner.generation, response))
    }
}

pub struct XdsServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    /// Mutual TLS: the directory of [`super::make_certificates`], whose certificate the
    /// server shows and whose CA a client's certificate must be signed by.
    tls: Option<PathBuf>,
}

impl XdsServer {
    /// A server on a free loopback port, serving nothing until [`XdsServer::set`].
    pub fn start() -> XdsServer {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        XdsServer::start_at(addr)
    }

    /// A server on `addr`, for a client told to connect there before it listens.
    pub fn start_at(addr: SocketAddr) -> XdsServer {
        XdsServer::serve(addr, None)
    }

    /// A server on a free loopback port that speaks only mutual TLS, with the certificates
    /// [`super::make_certificates`] made in `dir`.
    pub fn start_tls(dir: &Path) -> XdsServer {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        XdsServer::serve(addr, Some(dir.to_path_buf()))
    }

    fn serve(addr: SocketAddr, tls: Option<PathBuf>) -> XdsServer {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner::default()),
            changed: tokio::sync::watch::channel(0).0,
        });
        let mut server = XdsServer {
            addr,
            shared,
            runtime: None,
            tls,
        };
        server.restart();
        server
    }

    /// Serves `configs` as version `version` to every stream, open or to come.
    pub fn set(&self, version: &str, configs: &[RateLimitConfig]) {
        let resources = configs
            .iter()
            .map(|config| Any {
                type_url: RESOURCE_TYPE.into(),
                value: config.encode_to_vec(),
            })
            .collect();
        let generation = {
            let mut inner = self.shared.lock();
            inner.snapshot = Some((version.to_string(), resources));
            inner.generation += 1;
            inner.generation
        };
        self.shared.changed.send_replace(generation);
    }

    /// Every request received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.shared.lock().received.clone()
    }

    /// The nonce of the last response sent with `version`.
    pub fn nonce_of(&self, version: &str) -> Option<String> {
        let inner = self.shared.lock();
        inner
            .sent
            .iter()
            .rev()
            .find(|(v, _)| v == version)
            .map(|(_, nonce)| nonce.clone())
    }

    /// Waits (up to `within`) for a request answering the response of `version` and returns
    /// it: an ACK or a NACK.
    pub fn answer_to(&self, version: &str, within: Duration) -> Option<DiscoveryRequest> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(nonce) = self.nonce_of(version) {
                let found = self
                    .received()
                    .into_iter()
                    .find(|r| r.request.response_nonce == nonce);
                if let Some(found) = found {
                    return Some(found.request);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Stops serving at once: the listener and every stream closed, as at a crash.
    pub fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Serves again on the same port (after [`XdsServer::kill`]), the same snapshot.
    pub fn restart(&mut self) {
        self.kill();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the xDS server");
        // The old listener may take a moment to close after a kill.
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(listener) => break listener,
                Err(error) if Instant::now() > deadline => panic!("bind {}: {error}", self.addr),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        listener.set_nonblocking(true).unwrap();
        let service = AggregatedDiscoveryServiceServer::new(Ads(self.shared.clone()));
        let mut builder = tonic::transport::Server::builder();
        if let Some(dir) = &self.tls {
            let read = |name: &str| std::fs::read(dir.join(name)).expect("a certificate file");
            let tls = ServerTlsConfig::new()
                .identity(Identity::from_pem(read("cert.pem"), read("key.pem")))
                .client_ca_root(Certificate::from_pem(read("ca.pem")));
            builder = builder.tls_config(tls).expect("a TLS config");
        }
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = builder
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        self.runtime = Some(runtime);
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Ads(Arc<Shared>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let metadata = request.metadata().clone();
        let mut inbound = request.into_inner();
        let shared = self.0.clone();
        let (send, queue) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut changed = shared.changed.subscribe();
            let mut seen = 0;
            // Nothing is sent before the client's first request, as a server waits for it.
            let mut asked = false;
            loop {
                if asked {
                    if let Some((generation, response)) = shared.response_after(seen) {
                        seen = generation;
                        if send.send(Ok(response)).await.is_err() {
                            return;
                        }
                    }
                }
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(request)) => {
                            asked = true;
                            shared.lock().received.push(Received {
                                request,
                                metadata: metadata.clone(),
                            });
                        }
                        _ => return,
                    },
                    result = changed.changed() => if result.is_err() {
                        return;
                    },
                }
            }
        });
        let responses = futures_util::stream::unfold(queue, |mut queue| async move {
            queue.recv().await.map(|response| (response, queue))
        });
        Ok(Response::new(Box::pin(responses)))
    }

    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}
