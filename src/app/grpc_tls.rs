//! TLS on the gRPC listener: the rustls server configuration built from `grpc_tls`, a client
//! verifier that also asks for one subject name, and the handshakes that hand tonic
//! connections ready for HTTP/2.
//!
//! tonic's own TLS takes no custom verifier, so the handshake happens here; each runs in a
//! task of its own, so a slow or silent client holds back no other.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::sign::SingleCertAndKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use arc_swap::ArcSwap;

use super::grpc_connections::{Admitted, Placed};
use tollgate_core::config::grpc_tls::{GrpcTlsConfig, GrpcTlsMaterial, KEYS};
use tollgate_core::config::ConfigError;

/// Finished handshakes waiting for the server to take them.
const QUEUE: usize = 64;

/// The server configuration: the certificate, HTTP/2 by ALPN, and with a client CA a client
/// certificate required and verified (and its subject name, with `client_san`). The
/// material was checked when the config was loaded: what could still fail is named by key.
pub fn server_config(material: GrpcTlsMaterial) -> Result<Arc<ServerConfig>, ConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new("grpc_tls", e.to_string()))?;
    let builder = match material.client_roots {
        None => builder.with_no_client_auth(),
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| ConfigError::new(KEYS.ca, e.to_string()))?;
            let verifier: Arc<dyn ClientCertVerifier> = match material.client_san {
                Some(name) => Arc::new(RequireName {
                    inner: verifier,
                    name,
                }),
                None => verifier,
            };
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config =
        builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(material.certified_key)));
    // Envoy may offer no ALPN at all (it then speaks HTTP/2 anyway); a client that offers
    // only HTTP/1.1 is refused in the handshake rather than by a confusing frame error.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The listener's TLS configuration as its files stand: [`follow`] replaces it when they
/// change, and each handshake takes the one current then.
pub struct LiveTls {
    current: ArcSwap<ServerConfig>,
    files: GrpcTlsConfig,
}

impl LiveTls {
    /// Reads the files once; a bad one is refused with the key that names it.
    pub fn load(files: GrpcTlsConfig) -> Result<LiveTls, ConfigError> {
        let current = server_config(files.load()?)?;
        Ok(LiveTls {
            current: ArcSwap::new(current),
            files,
        })
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }

    /// What the files hold now (a file that cannot be read: `None`).
    fn contents(&self) -> Vec<Option<Vec<u8>>> {
        self.files
            .files
            .named(KEYS)
            .map(|(_, path)| std::fs::read(path).ok())
            .collect()
    }
}

/// Looks at the files every `every` and, when what they hold changed, installs what they
/// make: a renewed certificate (cert-manager, a Kubernetes secret swapped under its mount) is
/// served without a restart, as envoyproxy/ratelimit does. A set that does not load (say, a
/// certificate written before its key) is logged and the running one stays until the files
/// change again. Open connections keep the certificate they were accepted with.
pub async fn follow(live: Arc<LiveTls>, every: Duration) {
    let mut seen = live.contents();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = live.contents();
        if now == seen {
            continue;
        }
        seen = now;
        match live.files.load().and_then(server_config) {
            Ok(config) => {
                live.current.store(config);
                log::info!("gRPC TLS: the changed certificate files are now served");
            }
            Err(error) => log::warn!("gRPC TLS: keeping the running certificates: {error}"),
        }
    }
}

/// Completes the TLS handshakes of the connections `accepted` hands over, each in a task of
/// its own on the calling thread's runtime, with the configuration current at its start; the
/// returned receiver yields the connections ready for HTTP/2, each keeping its place under the
/// listener's cap. A client that has not finished its handshake `within` is dropped. Ends when
/// `accepted` does, or when the receiver is dropped.
pub fn handshakes(
    mut accepted: mpsc::Receiver<Admitted>,
    live: Arc<LiveTls>,
    within: Duration,
) -> mpsc::Receiver<std::io::Result<Placed<TlsStream<TcpStream>>>> {
    let (ready, incoming) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        loop {
            let Admitted { stream, place } = tokio::select! {
                next = accepted.recv() => match next {
                    Some(admitted) => admitted,
                    None => return,
                },
                () = ready.closed() => return,
            };
            let peer = stream
                .peer_addr()
                .map(|peer| peer.to_string())
                .unwrap_or_default();
            let stream = match TcpStream::from_std(stream) {
                Ok(stream) => stream,
                Err(error) => {
                    log::warn!("gRPC listener: cannot take a connection: {error}");
                    continue;
                }
            };
            let acceptor = live.acceptor();
            let ready = ready.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(within, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = ready.send(Ok(Placed::new(tls, place))).await;
                    }
                    // A refused client is the client's problem, and any client can cause one:
                    // debug, not warn.
                    Ok(Err(error)) => log::debug!("gRPC TLS handshake with {peer}: {error}"),
                    Err(_) => log::debug!("gRPC TLS handshake with {peer}: timed out"),
                }
            });
        }
    });
    incoming
}

/// The CA's verification, then the subject name: the certificate must carry `name` as a DNS
/// or IP subject alternative name (envoyproxy/ratelimit's `GRPC_CLIENT_TLS_SAN`).
#[derive(Debug)]
struct RequireName {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for RequireName {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, &self.name)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }
}
