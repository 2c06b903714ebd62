//! `grpc_tls`: TLS on the gRPC listener, and mutual TLS with a client CA (optionally one
//! subject name the client's certificate must carry); from TOML or from envoyproxy/ratelimit's
//! `GRPC_SERVER_*`/`GRPC_CLIENT_TLS_*` variables (`crate::erl::config::env`). The files are
//! read and parsed here, at start (a bad one is refused with the key that names it) and again
//! when they change.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use serde::{Deserialize, Serialize};

use super::tls_files::{TlsFiles, TlsKeys};
use super::ConfigError;

/// `grpc_tls`: the listener's certificate and, for mutual TLS, whom it accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "GrpcTlsToml", into = "GrpcTlsToml")]
pub struct GrpcTlsConfig {
    /// The certificate chain the listener shows and its key (both required); with a CA
    /// (`client_ca_file`), every client must show a certificate it signed.
    pub files: TlsFiles,
    /// With it, the client's certificate must also carry this DNS name or IP address as a
    /// subject alternative name.
    pub client_san: Option<String>,
}

/// `grpc_tls` as the TOML spells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrpcTlsToml {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_san: Option<String>,
}

impl From<GrpcTlsToml> for GrpcTlsConfig {
    fn from(toml: GrpcTlsToml) -> GrpcTlsConfig {
        GrpcTlsConfig {
            files: TlsFiles {
                ca_file: toml.client_ca_file,
                cert_file: Some(toml.cert_file),
                key_file: Some(toml.key_file),
            },
            client_san: toml.client_san,
        }
    }
}

impl From<GrpcTlsConfig> for GrpcTlsToml {
    fn from(config: GrpcTlsConfig) -> GrpcTlsToml {
        GrpcTlsToml {
            cert_file: config.files.cert_file.unwrap_or_default(),
            key_file: config.files.key_file.unwrap_or_default(),
            client_ca_file: config.files.ca_file,
            client_san: config.client_san,
        }
    }
}

/// What the files hold, parsed and checked: ready for a TLS server.
#[derive(Debug)]
pub struct GrpcTlsMaterial {
    pub certified_key: Arc<CertifiedKey>,
    /// The client CA's certificates: present means mutual TLS.
    pub client_roots: Option<Arc<RootCertStore>>,
    pub client_san: Option<ServerName<'static>>,
}

/// The keys of `grpc_tls`'s files.
pub const KEYS: TlsKeys = TlsKeys {
    ca: "grpc_tls.client_ca_file",
    cert: "grpc_tls.cert_file",
    key: "grpc_tls.key_file",
};
const SAN: &str = "grpc_tls.client_san";

impl GrpcTlsConfig {
    /// Reads and parses every file: a certificate chain whose key is `key_file`'s, a client CA
    /// file with at least one usable certificate, a subject name that is one.
    pub fn load(&self) -> Result<GrpcTlsMaterial, ConfigError> {
        let certified_key = self
            .files
            .certified_key(KEYS)?
            .ok_or_else(|| ConfigError::new(KEYS.cert, "is needed"))?;
        let client_roots = self.files.ca_roots(KEYS)?.map(Arc::new);
        let client_san = match &self.client_san {
            None => None,
            Some(_) if client_roots.is_none() => {
                return Err(ConfigError::new(
                    SAN,
                    format!(
                        "applies only with {}: without it no client certificate is asked",
                        KEYS.ca
                    ),
                ))
            }
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|_| {
                ConfigError::new(
                    SAN,
                    format!("{name:?} is neither a DNS name nor an IP address"),
                )
            })?),
        };
        Ok(GrpcTlsMaterial {
            certified_key,
            client_roots,
            client_san,
        })
    }
}
