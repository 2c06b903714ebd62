//! `store.tls`: a CA of the operator's own and a client certificate for `rediss://`, from TOML
//! or from envoyproxy/ratelimit's `REDIS_TLS_*` (`crate::erl::config::env`). The files are read and checked at start, so a bad one is refused
//! with the key that names it, not met at every store call.

use super::tls_files::{TlsFiles, TlsKeys};
use super::ConfigError;

/// The keys of `store.tls`'s files.
pub const KEYS: TlsKeys = TlsKeys {
    ca: "store.tls.ca_file",
    cert: "store.tls.cert_file",
    key: "store.tls.key_file",
};

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

/// Reads and checks every file of `store.tls`: CA certificates, and a certificate chain whose
/// key is `key_file`'s (the two come together); at least one of them.
pub fn load(files: &TlsFiles) -> Result<StoreTlsMaterial, ConfigError> {
    let ca = files.ca_pem(KEYS)?;
    let identity = files.identity_pem(KEYS)?;
    if ca.is_none() && identity.is_none() {
        return Err(ConfigError::new(
            "store.tls",
            "names no file: set ca_file, or cert_file and key_file",
        ));
    }
    Ok(StoreTlsMaterial { ca, identity })
}
