//! `store.tls`: a CA of the operator's own and a client certificate for `rediss://`, from TOML
//! or from envoyproxy/ratelimit's `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and
//! `REDIS_TLS_CLIENT_KEY`. The files are read and checked at start, so a bad one is refused
//! with the key that names it, not met at every store call.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{pem, ConfigError};

/// `store.tls`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreTlsConfig {
    /// Trust only these CA certificates (PEM) for the server's, in place of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The certificate chain shown to Redis (PEM, leaf first), for `tls-auth-clients`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// The files' PEM, checked, as the Redis client takes it.
#[derive(Clone, Default)]
pub struct StoreTlsMaterial {
    pub ca: Option<Vec<u8>>,
    /// The certificate chain and its key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for StoreTlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreTlsMaterial")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

const CA: &str = "store.tls.ca_file";
const CERT: &str = "store.tls.cert_file";
const KEY: &str = "store.tls.key_file";

impl StoreTlsConfig {
    /// Reads and checks every file: CA certificates, and a certificate chain whose key is
    /// `key_file`'s (the two come together).
    pub fn load(&self) -> Result<StoreTlsMaterial, ConfigError> {
        let ca = match &self.ca_file {
            Some(path) => {
                let pem = pem::read(CA, path)?;
                pem::certificates_in(CA, path, &pem)?;
                Some(pem)
            }
            None => None,
        };
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                pem::certified_key((CERT, cert), (KEY, key))?;
                Some((pem::read(CERT, cert)?, pem::read(KEY, key)?))
            }
            (Some(_), None) => return Err(ConfigError::new(KEY, "is needed with cert_file")),
            (None, Some(_)) => return Err(ConfigError::new(CERT, "is needed with key_file")),
            (None, None) => None,
        };
        if ca.is_none() && identity.is_none() {
            return Err(ConfigError::new(
                "store.tls",
                "names no file: set ca_file, or cert_file and key_file",
            ));
        }
        Ok(StoreTlsMaterial { ca, identity })
    }

    /// Makes relative file paths relative to `dir` (the config file's).
    pub fn resolve_paths(&mut self, dir: &Path) {
        let files = [&mut self.ca_file, &mut self.cert_file, &mut self.key_file];
        for path in files.into_iter().flatten() {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
    }
}

/// envoyproxy/ratelimit's variables and the keys they set.
const ENV: [(&str, &str); 3] = [
    (CA, "REDIS_TLS_CACERT"),
    (CERT, "REDIS_TLS_CLIENT_CERT"),
    (KEY, "REDIS_TLS_CLIENT_KEY"),
];

/// envoyproxy/ratelimit's variables, read as it does: only with `REDIS_TLS` true, an empty
/// one unset. None set: `None`. The files are checked here, refusals naming the variable.
pub fn from_erl_env(
    var: impl Fn(&str) -> Option<String>,
    use_tls: bool,
) -> Result<Option<StoreTlsConfig>, ConfigError> {
    if !use_tls {
        return Ok(None);
    }
    let file = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let tls = StoreTlsConfig {
        ca_file: file(ENV[0].1),
        cert_file: file(ENV[1].1),
        key_file: file(ENV[2].1),
    };
    if tls == StoreTlsConfig::default() {
        return Ok(None);
    }
    tls.load().map_err(|e| e.as_variable(&ENV, "REDIS_TLS"))?;
    Ok(Some(tls))
}
