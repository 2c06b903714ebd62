//! `grpc_tls`: TLS on the gRPC listener, and mutual TLS with a client CA (optionally one
//! subject name the client's certificate must carry); from TOML or from envoyproxy/ratelimit's
//! `GRPC_SERVER_*`/`GRPC_CLIENT_TLS_*` variables. The files are read and parsed here, at
//! start (a bad one is refused with the key that names it) and again when they change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use serde::{Deserialize, Serialize};

use super::{pem, ConfigError};

/// `grpc_tls`: the listener's certificate and, for mutual TLS, whom it accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcTlsConfig {
    /// The certificate chain the listener shows (PEM, leaf first).
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// With it, every client must show a certificate this CA (PEM, one or more) signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
    /// With it, the client's certificate must also carry this DNS name or IP address as a
    /// subject alternative name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_san: Option<String>,
}

/// What the files hold, parsed and checked: ready for a TLS server.
#[derive(Debug)]
pub struct GrpcTlsMaterial {
    pub certified_key: Arc<CertifiedKey>,
    /// The client CA's certificates: present means mutual TLS.
    pub client_roots: Option<Arc<RootCertStore>>,
    pub client_san: Option<ServerName<'static>>,
}

const CERT: &str = "grpc_tls.cert_file";
const KEY: &str = "grpc_tls.key_file";
const CA: &str = "grpc_tls.client_ca_file";
const SAN: &str = "grpc_tls.client_san";

impl GrpcTlsConfig {
    /// Reads and parses every file: a certificate chain whose key is `key_file`'s, a client CA
    /// file with at least one usable certificate, a subject name that is one.
    pub fn load(&self) -> Result<GrpcTlsMaterial, ConfigError> {
        let certified_key = pem::certified_key((CERT, &self.cert_file), (KEY, &self.key_file))?;
        let client_roots = match &self.client_ca_file {
            Some(path) => Some(Arc::new(roots(path)?)),
            None => None,
        };
        let client_san = match &self.client_san {
            None => None,
            Some(_) if client_roots.is_none() => {
                return Err(ConfigError::new(
                    SAN,
                    format!("applies only with {CA}: without it no client certificate is asked"),
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

    /// Makes relative file paths relative to `dir` (the config file's).
    pub fn resolve_paths(&mut self, dir: &Path) {
        let files = [&mut self.cert_file, &mut self.key_file];
        for path in files.into_iter().chain(self.client_ca_file.as_mut()) {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
    }
}

/// The client CA file as trust anchors: every certificate must be one.
fn roots(path: &Path) -> Result<RootCertStore, ConfigError> {
    let mut store = RootCertStore::empty();
    for cert in pem::certificates(CA, path)? {
        store
            .add(cert)
            .map_err(|e| ConfigError::new(CA, format!("{}: {e}", path.display())))?;
    }
    Ok(store)
}

/// envoyproxy/ratelimit's variables, as it reads them: with `GRPC_SERVER_USE_TLS` true,
/// `GRPC_SERVER_TLS_CERT` and `GRPC_SERVER_TLS_KEY`; `GRPC_CLIENT_TLS_CACERT` asks for and
/// verifies a client certificate; `GRPC_CLIENT_TLS_SAN` names what it must carry (an empty
/// variable is unset, as there). Refusals name the variable.
pub fn from_erl_env(
    var: impl Fn(&str) -> Option<String>,
    use_tls: bool,
) -> Result<Option<GrpcTlsConfig>, ConfigError> {
    if !use_tls {
        return Ok(None);
    }
    let set = |name: &str| var(name).filter(|value| !value.is_empty());
    let required = |name: &str| {
        set(name).map(PathBuf::from).ok_or_else(|| {
            ConfigError::new(
                name,
                "must name a PEM file when GRPC_SERVER_USE_TLS is true",
            )
        })
    };
    let tls = GrpcTlsConfig {
        cert_file: required(ENV[0].1)?,
        key_file: required(ENV[1].1)?,
        client_ca_file: set(ENV[2].1).map(PathBuf::from),
        client_san: set(ENV[3].1),
    };
    tls.load()
        .map_err(|e| e.as_variable(&ENV, "GRPC_SERVER_USE_TLS"))?;
    Ok(Some(tls))
}

/// The keys and the variables that set them.
const ENV: [(&str, &str); 4] = [
    (CERT, "GRPC_SERVER_TLS_CERT"),
    (KEY, "GRPC_SERVER_TLS_KEY"),
    (CA, "GRPC_CLIENT_TLS_CACERT"),
    (SAN, "GRPC_CLIENT_TLS_SAN"),
];
