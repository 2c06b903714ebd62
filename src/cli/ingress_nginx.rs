//! `tollgate import ingress-nginx FILE...`: the rate-limit annotations of ingress-nginx
//! Ingress objects as tollgate TOML, or the snippet that puts tollgate in front of another
//! proxy (`--proxy nginx|traefik|envoy`).
//!
//! Each annotation keeps the meaning ingress-nginx gave it:
//! - `limit-rps` / `limit-rpm`: a bucket per client IP refilling that many per second / minute,
//!   burst = the limit × `limit-burst-multiplier` (default 5); both given: both apply.
//! - `limit-allowlist` (or its older alias `limit-whitelist`): those clients skip the limits:
//!   an `[[exempt]]` rule.
//! - `global-rate-limit` + `-window` (+ `-key`, default `$remote_addr`, and `-ignored-cidrs`):
//!   N per window as a bucket of rate N/window and burst N, keyed on the nginx variables.
//! - `limit-req-status-code` (annotation, or the controller's ConfigMap key): `deny_status`.
//!
//! Every limit is scoped to the Ingress's hosts and paths. What has no tollgate equivalent is
//! a comment in the output and a note for stderr; a malformed object or value is an error
//! naming the object and the annotation.

use std::path::Path;

mod keys;
mod objects;
mod snippet;
mod translate;

use self::objects::{read_documents, Controller};
pub use self::objects::{IngressImportError, DEFAULT_PREFIX};
use self::snippet::snippet;
pub use self::snippet::Proxy;
use self::translate::Translation;
use tollgate_core::base::read::read_capped;
use tollgate_core::erl::config::yaml_bounds::{check_depth, MAX_IMPORT_MIB};

/// The conversion: what goes on stdout, and one line per thing not carried (for stderr).
#[derive(Debug)]
pub struct Imported {
    pub output: String,
    pub notes: Vec<String>,
}

/// Reads every file (single objects, multi-document files, `List`s) and converts the Ingress
/// objects in order, reading the annotations under `prefix` (ingress-nginx's
/// `--annotations-prefix`, [`DEFAULT_PREFIX`] unless changed). `proxy`: print that proxy's
/// snippet instead of the TOML.
pub fn import(
    files: &[impl AsRef<Path>],
    proxy: Option<Proxy>,
    prefix: &str,
) -> Result<Imported, IngressImportError> {
    let mut ingresses = Vec::new();
    let mut controller = Controller::default();
    for file in files {
        let path = file.as_ref();
        let shown = path.display().to_string();
        let refuse = |reason: String| IngressImportError {
            object: shown.clone(),
            reason,
        };
        let text = read_capped(path, MAX_IMPORT_MIB).map_err(|e| refuse(e.to_string()))?;
        check_depth(&text).map_err(refuse)?;
        read_documents(&text, &shown, &mut ingresses, &mut controller)?;
    }
    let prefix = format!("{}/", prefix.trim_end_matches('/'));
    for ingress in &mut ingresses {
        ingress.prefix.clone_from(&prefix);
    }
    let mut out = Translation::default();
    out.status(&ingresses, &controller)?;
    for ingress in &ingresses {
        out.ingress(ingress)?;
    }
    let output = match proxy {
        None => out.toml(),
        Some(proxy) => snippet(proxy, &out),
    };
    Ok(Imported {
        output,
        notes: out.notes,
    })
}

/// The command: the output on stdout, each note on stderr, exit 0; an error: one line on
/// stderr, exit 2.
pub fn run(
    files: &[impl AsRef<Path>],
    proxy: Option<Proxy>,
    prefix: &str,
) -> std::process::ExitCode {
    match import(files, proxy, prefix) {
        Ok(imported) => {
            print!("{}", imported.output);
            for note in &imported.notes {
                eprintln!("tollgate: not carried over exactly: {note}");
            }
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("tollgate: cannot import {error}");
            std::process::ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests;
