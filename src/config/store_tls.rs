//! `store.tls`: a CA of the operator's own and a client certificate for `rediss://`, from TOML
//! or from envoyproxy/ratelimit's `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and
//! `REDIS_TLS_CLIENT_KEY`. The files are read and checked at start, so a bad one is refused
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

/// envoyproxy/ratelimit's variables, read as it does: only with `REDIS_TLS` true, an empty
/// one unset. None set: `None`. The files are checked here, refusals naming the variable.
pub fn from_erl_env(
    var: impl Fn(&str) -> Option<String>,
    use_tls: bool,
) -> Result<Option<TlsFiles>, ConfigError> {
    if !use_tls {
        return Ok(None);
    }
    let env = KEYS.with_variables([
        "REDIS_TLS_CACERT",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_CLIENT_KEY",
    ]);
    let file = |name: &str| var(name).filter(|v| !v.is_empty()).map(Into::into);
    let tls = TlsFiles {
        ca_file: file(env[0].1),
        cert_file: file(env[1].1),
        key_file: file(env[2].1),
    };
    if tls.is_empty() {
        return Ok(None);
    }
    load(&tls).map_err(|e| e.as_variable(&env, "REDIS_TLS"))?;
    Ok(Some(tls))
}
