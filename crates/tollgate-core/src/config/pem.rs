//! PEM files named by a config key: read and parsed at start, so a bad one is refused with
//! the key that names it (`grpc_tls`, `store.tls`).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::ConfigError;

pub fn read(key: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| ConfigError::new(key, format!("{}: {e}", path.display())))
}

/// Every certificate of a PEM file; none is an error.
pub fn certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    certificates_in(key, path, &read(key, path)?)
}

/// [`certificates`] of a file already read.
pub fn certificates_in(
    key: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let refuse = |why: String| ConfigError::new(key, format!("{}: {why}", path.display()));
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refuse(e.to_string()))?;
    if certs.is_empty() {
        return Err(refuse("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// A certificate chain and its private key (PEM: PKCS#8, PKCS#1 or SEC1), each named by its
/// key, checked to belong together: a key of another certificate would fail every handshake,
/// not the start. (A key whose match cannot be told is let through, as rustls itself does.)
pub fn certified_key(
    (cert_key, cert_file): (&str, &Path),
    (key_key, key_file): (&str, &Path),
) -> Result<Arc<CertifiedKey>, ConfigError> {
    let chain = certificates(cert_key, cert_file)?;
    let refuse_key =
        |why: String| ConfigError::new(key_key, format!("{}: {why}", key_file.display()));
    let key = PrivateKeyDer::from_pem_slice(&read(key_key, key_file)?).map_err(|e| {
        refuse_key(match e {
            rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM private key".into(),
            e => e.to_string(),
        })
    })?;
    let provider = rustls::crypto::ring::default_provider();
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| refuse_key(e.to_string()))?;
    let certified_key = CertifiedKey::new(chain, signing_key);
    if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
        certified_key.keys_match()
    {
        return Err(refuse_key(format!("is not the key of {cert_key}")));
    }
    Ok(Arc::new(certified_key))
}
