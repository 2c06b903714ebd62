//! A TLS triple: a CA to trust, and a certificate chain with its private key. `store.tls`,
//! `envoy.xds` and `grpc_tls` each name one (and envoyproxy/ratelimit's variables set them):
//! which files go together, where a relative path points, how each file is read and checked,
//! and which key a refusal names are written here once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use serde::{Deserialize, Serialize};

use super::{pem, ConfigError};

/// The three files; each may be absent, but the certificate and its key go together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// Trust only these CA certificates (PEM), in place of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The certificate chain shown to the other side (PEM, leaf first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// A certificate chain's PEM and its key's.
pub type IdentityPem = (Vec<u8>, Vec<u8>);

/// What names each file of a triple in a refusal: the config key that set it.
#[derive(Debug, Clone, Copy)]
pub struct TlsKeys {
    pub ca: &'static str,
    pub cert: &'static str,
    pub key: &'static str,
}

impl TlsFiles {
    pub fn is_empty(&self) -> bool {
        *self == TlsFiles::default()
    }

    /// The certificate and its key: both or neither. One without the other is refused
    /// naming the one missing.
    pub fn identity(&self, keys: TlsKeys) -> Result<Option<(&Path, &Path)>, ConfigError> {
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
            (Some(_), None) => Err(ConfigError::new(
                keys.key,
                format!("is needed with {}", keys.cert),
            )),
            (None, Some(_)) => Err(ConfigError::new(
                keys.cert,
                format!("is needed with {}", keys.key),
            )),
            (None, None) => Ok(None),
        }
    }

    /// The CA file's PEM, checked to hold certificates.
    pub fn ca_pem(&self, keys: TlsKeys) -> Result<Option<Vec<u8>>, ConfigError> {
        let Some(path) = &self.ca_file else {
            return Ok(None);
        };
        let pem = pem::read(keys.ca, path)?;
        pem::certificates_in(keys.ca, path, &pem)?;
        Ok(Some(pem))
    }

    /// The CA file as trust anchors: every certificate must be one.
    pub fn ca_roots(&self, keys: TlsKeys) -> Result<Option<RootCertStore>, ConfigError> {
        let Some(path) = &self.ca_file else {
            return Ok(None);
        };
        let mut store = RootCertStore::empty();
        for cert in pem::certificates(keys.ca, path)? {
            store
                .add(cert)
                .map_err(|e| ConfigError::new(keys.ca, format!("{}: {e}", path.display())))?;
        }
        Ok(Some(store))
    }

    /// The certificate chain and its key, parsed and checked to belong together.
    pub fn certified_key(&self, keys: TlsKeys) -> Result<Option<Arc<CertifiedKey>>, ConfigError> {
        self.identity(keys)?
            .map(|(cert, key)| pem::certified_key((keys.cert, cert), (keys.key, key)))
            .transpose()
    }

    /// The certificate chain's and its key's PEM, checked as [`TlsFiles::certified_key`] does.
    pub fn identity_pem(&self, keys: TlsKeys) -> Result<Option<IdentityPem>, ConfigError> {
        let Some((cert, key)) = self.identity(keys)? else {
            return Ok(None);
        };
        pem::certified_key((keys.cert, cert), (keys.key, key))?;
        Ok(Some((
            pem::read(keys.cert, cert)?,
            pem::read(keys.key, key)?,
        )))
    }

    /// That every file named can be read now, for files read again at each use.
    pub fn check_readable(&self, keys: TlsKeys) -> Result<(), ConfigError> {
        for (key, file) in self.named(keys) {
            std::fs::metadata(file)
                .map_err(|e| ConfigError::new(key, format!("{}: {e}", file.display())))?;
        }
        Ok(())
    }

    /// The files named, each with its key: CA, certificate, key.
    pub fn named(&self, keys: TlsKeys) -> impl Iterator<Item = (&'static str, &Path)> {
        [
            (keys.ca, &self.ca_file),
            (keys.cert, &self.cert_file),
            (keys.key, &self.key_file),
        ]
        .into_iter()
        .filter_map(|(key, file)| Some((key, file.as_deref()?)))
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

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: TlsKeys = TlsKeys {
        ca: "t.ca_file",
        cert: "t.cert_file",
        key: "t.key_file",
    };

    #[test]
    fn a_certificate_and_its_key_go_together_the_missing_one_named() {
        let half = |cert: bool| TlsFiles {
            cert_file: cert.then(|| "c.pem".into()),
            key_file: (!cert).then(|| "k.pem".into()),
            ..TlsFiles::default()
        };
        let refused = half(true).identity(KEYS).unwrap_err();
        assert_eq!(
            (refused.key.as_str(), refused.reason.as_str()),
            ("t.key_file", "is needed with t.cert_file")
        );
        assert_eq!(half(false).identity(KEYS).unwrap_err().key, "t.cert_file");
        assert_eq!(TlsFiles::default().identity(KEYS).unwrap(), None);
    }
}
