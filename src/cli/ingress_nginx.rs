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

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::base::read::read_capped;
use crate::config::envoy::yaml_bounds::{check_depth, MAX_IMPORT_MIB};

/// ingress-nginx's default annotation prefix (its `--annotations-prefix`).
pub const DEFAULT_PREFIX: &str = "nginx.ingress.kubernetes.io";

/// ingress-nginx's default `limit-burst-multiplier`.
const DEFAULT_BURST_MULTIPLIER: u64 = 5;

/// ingress-nginx's default answer to a request over `limit-rps`/`limit-rpm`.
const DEFAULT_LIMIT_REQ_STATUS: u16 = 503;

/// ingress-nginx's default answer to a request over `global-rate-limit`.
const DEFAULT_GLOBAL_STATUS: u16 = 429;

/// What can be put in front of tollgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Proxy {
    /// nginx `auth_request` (plain nginx, or F5 NGINX Ingress snippets)
    Nginx,
    /// Traefik's ForwardAuth middleware
    Traefik,
    /// Envoy Gateway's SecurityPolicy (ext_authz over HTTP)
    Envoy,
}

/// A file, object or annotation that cannot be converted: what it is and why.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{object}: {reason}")]
pub struct IngressImportError {
    /// The file, or `Ingress <namespace>/<name>` and its annotation.
    pub object: String,
    pub reason: String,
}

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

/// The controller-wide settings found in a ConfigMap among the files.
#[derive(Debug, Default)]
struct Controller {
    limit_req_status: Option<(u16, String)>,
    global_status: Option<(u16, String)>,
}

/// One Ingress, as much of it as the rate limits need.
#[derive(Debug)]
struct Ingress {
    /// `Ingress <namespace>/<name>`.
    object: String,
    namespace: String,
    name: String,
    annotations: BTreeMap<String, String>,
    /// `<annotations prefix>/`.
    prefix: String,
    /// The host/path pairs its rules route; `None` host: any host.
    routes: Vec<Route>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Route {
    host: Option<String>,
    path: String,
    exact: bool,
}

fn read_documents(
    text: &str,
    file: &str,
    ingresses: &mut Vec<Ingress>,
    controller: &mut Controller,
) -> Result<(), IngressImportError> {
    let malformed = |reason: String| IngressImportError {
        object: file.to_string(),
        reason,
    };
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(document)
            .map_err(|e| malformed(format!("not valid YAML: {e}")))?;
        object(&value, file, ingresses, controller)?;
    }
    Ok(())
}

/// One Kubernetes object: an Ingress, a List of objects, a ConfigMap of the controller, or
/// anything else (skipped).
fn object(
    value: &serde_yaml::Value,
    file: &str,
    ingresses: &mut Vec<Ingress>,
    controller: &mut Controller,
) -> Result<(), IngressImportError> {
    if value.is_null() {
        return Ok(());
    }
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    match kind {
        "Ingress" => ingresses.push(Ingress::parse(value, file)?),
        "ConfigMap" => controller.read(value, file)?,
        kind if kind.ends_with("List") => {
            let items = value.get("items").map(|i| i.as_sequence());
            let Some(Some(items)) = items else {
                if value.get("items").is_some_and(|i| !i.is_null()) {
                    return Err(IngressImportError {
                        object: format!("{file}: {kind}"),
                        reason: "items is not a list".into(),
                    });
                }
                return Ok(());
            };
            for item in items {
                object(item, file, ingresses, controller)?;
            }
        }
        "" if !value.is_mapping() => {
            return Err(IngressImportError {
                object: file.to_string(),
                reason: "a document is not a Kubernetes object".into(),
            })
        }
        _ => {}
    }
    Ok(())
}

fn text_at<'v>(value: &'v serde_yaml::Value, path: &[&str]) -> Option<&'v str> {
    path.iter()
        .try_fold(value, |v, key| v.get(*key))
        .and_then(|v| v.as_str())
}

impl Controller {
    /// The ConfigMap keys of ingress-nginx that change what a denied client sees.
    fn read(&mut self, value: &serde_yaml::Value, file: &str) -> Result<(), IngressImportError> {
        let name = format!(
            "ConfigMap {}/{}",
            text_at(value, &["metadata", "namespace"]).unwrap_or("default"),
            text_at(value, &["metadata", "name"]).unwrap_or("")
        );
        for (key, slot) in [
            ("limit-req-status-code", &mut self.limit_req_status),
            ("global-rate-limit-status-code", &mut self.global_status),
        ] {
            let Some(raw) = value.get("data").and_then(|d| d.get(key)) else {
                continue;
            };
            let object = format!("{file}: {name} data.{key}");
            let text = scalar(raw).ok_or_else(|| IngressImportError {
                object: object.clone(),
                reason: "must be a status code".into(),
            })?;
            let status = status_code(&text).map_err(|reason| IngressImportError {
                object: object.clone(),
                reason,
            })?;
            *slot = Some((status, name.clone()));
        }
        Ok(())
    }
}

/// A YAML scalar as text (Kubernetes annotations and ConfigMap data are strings, but a number
/// written without quotes is common in hand-written files).
fn scalar(value: &serde_yaml::Value) -> Option<String> {
    match value {
        serde_yaml::Value::String(s) => Some(s.clone()),
        serde_yaml::Value::Number(n) => Some(n.to_string()),
        serde_yaml::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn status_code(text: &str) -> Result<u16, String> {
    match text.trim().parse::<u16>() {
        Ok(status) if (100..=599).contains(&status) => Ok(status),
        _ => Err(format!("{text:?} is not an HTTP status code")),
    }
}

impl Ingress {
    fn parse(value: &serde_yaml::Value, file: &str) -> Result<Ingress, IngressImportError> {
        let namespace = text_at(value, &["metadata", "namespace"])
            .unwrap_or("default")
            .to_string();
        let Some(name) = text_at(value, &["metadata", "name"]) else {
            return Err(IngressImportError {
                object: format!("{file}: Ingress"),
                reason: "has no metadata.name".into(),
            });
        };
        let object = format!("Ingress {namespace}/{name}");
        let error = |at: &str, reason: &str| IngressImportError {
            object: format!("{object} {at}"),
            reason: reason.to_string(),
        };
        let mut annotations = BTreeMap::new();
        if let Some(map) = value.get("metadata").and_then(|m| m.get("annotations")) {
            let Some(map) = map.as_mapping() else {
                if map.is_null() {
                    return Ingress::routes(value, object, namespace, name, annotations);
                }
                return Err(error("metadata.annotations", "is not a map"));
            };
            for (key, raw) in map {
                let Some(key) = key.as_str() else {
                    return Err(error("metadata.annotations", "has a key that is not text"));
                };
                let Some(text) = scalar(raw) else {
                    return Err(error(key, "must be a string"));
                };
                annotations.insert(key.to_string(), text);
            }
        }
        Ingress::routes(value, object, namespace, name, annotations)
    }

    fn routes(
        value: &serde_yaml::Value,
        object: String,
        namespace: String,
        name: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<Ingress, IngressImportError> {
        let error = |reason: &str| IngressImportError {
            object: format!("{object} spec.rules"),
            reason: reason.to_string(),
        };
        let mut routes = BTreeSet::new();
        let rules = value.get("spec").and_then(|s| s.get("rules"));
        if let Some(rules) = rules.filter(|r| !r.is_null()) {
            let rules = rules.as_sequence().ok_or_else(|| error("is not a list"))?;
            for rule in rules {
                let host = rule
                    .get("host")
                    .and_then(|h| h.as_str())
                    .filter(|h| !h.is_empty())
                    .map(str::to_ascii_lowercase);
                let paths = rule
                    .get("http")
                    .and_then(|h| h.get("paths"))
                    .and_then(|p| p.as_sequence());
                let Some(paths) = paths.filter(|p| !p.is_empty()) else {
                    routes.insert(Route {
                        host,
                        path: "/".into(),
                        exact: false,
                    });
                    continue;
                };
                for path in paths {
                    let text = path.get("path").and_then(|p| p.as_str()).unwrap_or("/");
                    if !text.starts_with('/') {
                        return Err(error(&format!("path {text:?} does not start with /")));
                    }
                    routes.insert(Route {
                        host: host.clone(),
                        path: text.to_string(),
                        exact: path.get("pathType").and_then(|t| t.as_str()) == Some("Exact"),
                    });
                }
            }
        }
        Ok(Ingress {
            object,
            namespace,
            name: name.to_string(),
            annotations,
            prefix: format!("{DEFAULT_PREFIX}/"),
            routes: routes.into_iter().collect(),
        })
    }

    fn annotation(&self, name: &str) -> Option<&str> {
        let prefix = &self.prefix;
        self.annotations
            .get(&format!("{prefix}{name}"))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    fn error(&self, annotation: &str, reason: impl Into<String>) -> IngressImportError {
        let prefix = &self.prefix;
        IngressImportError {
            object: format!("{} annotation {prefix}{annotation}", self.object),
            reason: reason.into(),
        }
    }

    /// An integer annotation; absent: `None`.
    fn integer(&self, annotation: &str) -> Result<Option<u64>, IngressImportError> {
        let Some(text) = self.annotation(annotation) else {
            return Ok(None);
        };
        text.parse::<u64>()
            .map(Some)
            .map_err(|_| self.error(annotation, format!("{text:?} is not a whole number >= 0")))
    }

    /// CIDRs or single addresses, comma-separated.
    fn cidrs(&self, annotation: &str) -> Result<Vec<IpNet>, IngressImportError> {
        let Some(text) = self.annotation(annotation) else {
            return Ok(Vec::new());
        };
        let mut nets = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let net = item
                .parse::<IpNet>()
                .or_else(|_| item.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| self.error(annotation, format!("{item:?} is not a CIDR or IP")))?;
            if !nets.contains(&net) {
                nets.push(net);
            }
        }
        Ok(nets)
    }

    /// Whether any local (per-replica) limit annotation is set to a limit.
    fn has_local_limits(&self) -> Result<bool, IngressImportError> {
        Ok(self.integer("limit-rps")?.unwrap_or(0) > 0
            || self.integer("limit-rpm")?.unwrap_or(0) > 0)
    }

    fn has_global_limit(&self) -> Result<bool, IngressImportError> {
        Ok(self.integer("global-rate-limit")?.unwrap_or(0) > 0
            && self.annotation("global-rate-limit-window").is_some())
    }

    /// The tollgate scopes of this Ingress: one per distinct path, with the hosts routing it
    /// (none: any host).
    fn scopes(&self) -> Vec<Scope> {
        // With use-regex (or rewrite-target, which turns it on) ingress-nginx reads paths as
        // regular expressions: the literal part before the first metacharacter is the prefix.
        let regex = self.annotation("use-regex") == Some("true")
            || self.annotation("rewrite-target").is_some();
        let mut by_path: BTreeMap<(&str, bool), Vec<Option<&str>>> = BTreeMap::new();
        for route in &self.routes {
            let path = if regex && !route.exact {
                literal_prefix(&route.path)
            } else {
                route.path.as_str()
            };
            by_path
                .entry((path, route.exact))
                .or_default()
                .push(route.host.as_deref());
        }
        if by_path.is_empty() {
            return vec![Scope::default()];
        }
        by_path
            .into_iter()
            .map(|((path, exact), hosts)| {
                let any_host = hosts.iter().any(Option::is_none);
                let mut wildcard = false;
                let mut named: Vec<String> = Vec::new();
                for host in hosts.into_iter().flatten() {
                    if host.starts_with("*.") {
                        wildcard = true;
                    } else if !named.iter().any(|h| h == host) {
                        named.push(host.to_string());
                    }
                }
                let path_prefix = (path != "/" || exact).then(|| path.to_string());
                Scope {
                    hosts: if any_host || wildcard {
                        Vec::new()
                    } else {
                        named
                    },
                    path_prefix,
                    exact,
                    wildcard,
                }
            })
            .collect()
    }
}

/// The part of a regular-expression path before its first metacharacter (at least `/`).
fn literal_prefix(path: &str) -> &str {
    let end = path
        .find(['(', '[', '*', '+', '?', '{', '^', '$', '|', '\\', '.'])
        .unwrap_or(path.len());
    if end == 0 {
        "/"
    } else {
        &path[..end]
    }
}

/// Where a limit applies: `hosts` (empty: any) and a path prefix (none: any path).
#[derive(Debug, Clone, Default)]
struct Scope {
    hosts: Vec<String>,
    path_prefix: Option<String>,
    /// The path was `pathType: Exact` (tollgate matches it as a prefix).
    exact: bool,
    /// A wildcard host was routed here (tollgate matches hosts exactly: the scope is widened
    /// to any host).
    wildcard: bool,
}

impl Scope {
    /// The lines of a `[limits.match]` or of an `[[exempt]]` rule (without a table header).
    fn lines(&self) -> String {
        let mut text = String::new();
        if !self.hosts.is_empty() {
            let hosts: Vec<String> = self.hosts.iter().map(|h| quoted(h)).collect();
            let _ = writeln!(text, "hosts = [{}]", hosts.join(", "));
        }
        if let Some(prefix) = &self.path_prefix {
            let _ = writeln!(text, "path_prefix = {}", quoted(prefix));
        }
        text
    }

    fn is_everything(&self) -> bool {
        self.hosts.is_empty() && self.path_prefix.is_none()
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.exact {
            notes.push(format!(
                "pathType Exact {:?} is matched as a path prefix",
                self.path_prefix.as_deref().unwrap_or("/")
            ));
        }
        if self.wildcard {
            notes.push(
                "a wildcard host is routed here: tollgate matches hosts exactly, so this \
                 applies to any host"
                    .into(),
            );
        }
        notes
    }
}

/// A TOML basic string (JSON's escapes are TOML's).
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// The tollgate key of an nginx variable expression (`global-rate-limit-key`).
#[derive(Debug, PartialEq)]
struct KeyPlan {
    parts: Vec<String>,
    /// Header parts only: nginx interpolates absent headers as "", and ingress-nginx keys an
    /// empty result by `$remote_addr`.
    headers_only: bool,
}

/// Parses `$var`, `${var}` and literal text. Literals next to variables only separate them
/// and do not change which requests share a bucket, so they are dropped; a key of literals
/// only is one shared bucket. `Err`: malformed text or a variable tollgate cannot key on.
fn nginx_key(text: &str) -> Result<KeyPlan, KeyError> {
    let mut parts: Vec<String> = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        literal.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, next) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| KeyError::Malformed(format!("unclosed ${{ in {text:?}")))?;
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(KeyError::Malformed(format!(
                "a $ without a variable name in {text:?}"
            )));
        }
        let part = variable_part(name).ok_or_else(|| KeyError::Unsupported(name.to_string()))?;
        if !parts.contains(&part) {
            parts.push(part);
        }
        rest = next;
    }
    literal.push_str(rest);
    if parts.is_empty() {
        if literal.is_empty() {
            return Err(KeyError::Malformed("is empty".into()));
        }
        parts.push(format!("const:{literal}"));
    }
    let headers_only = parts.iter().all(|p| p.starts_with("header:"));
    Ok(KeyPlan {
        parts,
        headers_only,
    })
}

#[derive(Debug, PartialEq)]
enum KeyError {
    Malformed(String),
    /// A variable with no tollgate key part.
    Unsupported(String),
}

/// The key part an nginx variable becomes, if tollgate has one.
fn variable_part(name: &str) -> Option<String> {
    match name {
        "remote_addr" | "binary_remote_addr" | "realip_remote_addr" => Some("ip".into()),
        "host" | "http_host" | "server_name" => Some("host".into()),
        "uri" | "document_uri" | "request_uri" => Some("path".into()),
        "request_method" => Some("method".into()),
        _ => name
            .strip_prefix("http_")
            .filter(|h| !h.is_empty())
            .map(|h| format!("header:{}", h.replace('_', "-"))),
    }
}

/// Everything the Ingresses become.
#[derive(Default)]
struct Translation {
    /// `[response]`, with its comments.
    response: String,
    exempts: String,
    limits: String,
    notes: Vec<String>,
    names: HashSet<String>,
    /// The Ingresses that got a limit, in order, and their scopes.
    fronted: Vec<Fronted>,
}

impl Translation {
    fn toml(&self) -> String {
        let mut text = String::from(
            "# Converted from ingress-nginx annotations by `tollgate import ingress-nginx`.\n\
             # Put tollgate in front with `--proxy nginx|traefik|envoy`; check these limits on\n\
             # your own access log with `tollgate replay --config FILE LOG` before switching.\n\
             # ingress-nginx kept each limit per controller replica; tollgate keeps it once for\n\
             # all instances (backend = \"redis\"), so clients get the number written here.\n",
        );
        if self.fronted.is_empty() {
            text.push_str("\n# No rate-limit annotation found: no limits.\nlimits = []\n");
        }
        text.push_str(&self.response);
        text.push_str(&self.exempts);
        text.push_str(&self.limits);
        text
    }

    fn note(&mut self, object: &str, what: String) -> String {
        self.notes.push(format!("{object}: {what}"));
        what
    }

    /// `deny_status` from `limit-req-status-code` (annotation or ConfigMap, default 503) and
    /// `global-rate-limit-status-code` (ConfigMap, default 429): one status for all limits,
    /// and a 4xx. Every other status is named, with what clients see instead.
    fn status(
        &mut self,
        ingresses: &[Ingress],
        controller: &Controller,
    ) -> Result<(), IngressImportError> {
        // (status, where it came from), in order of appearance.
        let mut wanted: Vec<(u16, String)> = Vec::new();
        for ingress in ingresses {
            if ingress.has_local_limits()? {
                let status = match ingress.annotation("limit-req-status-code") {
                    Some(text) => {
                        let status = status_code(text)
                            .map_err(|why| ingress.error("limit-req-status-code", why))?;
                        (status, format!("{} limit-req-status-code", ingress.object))
                    }
                    None => controller.limit_req_status.clone().map_or_else(
                        || {
                            (
                                DEFAULT_LIMIT_REQ_STATUS,
                                "ingress-nginx's default limit-req-status-code".to_string(),
                            )
                        },
                        |(status, from)| (status, format!("{from} limit-req-status-code")),
                    ),
                };
                wanted.push(status);
            }
            if ingress.has_global_limit()? {
                wanted.push(controller.global_status.clone().map_or_else(
                    || {
                        (
                            DEFAULT_GLOBAL_STATUS,
                            "ingress-nginx's default global-rate-limit-status-code".to_string(),
                        )
                    },
                    |(status, from)| (status, format!("{from} global-rate-limit-status-code")),
                ));
            }
        }
        let chosen = wanted
            .iter()
            .map(|(status, _)| *status)
            .find(|s| (400..=499).contains(s))
            .unwrap_or(429);
        let mut text = format!("\n[response]\ndeny_status = {chosen}\n");
        let mut seen = HashSet::new();
        for (status, from) in wanted {
            if status == chosen || !seen.insert((status, from.clone())) {
                continue;
            }
            let change = if (500..=599).contains(&status) {
                format!(
                    "clients that got {status} now get {chosen}, with Retry-After, RateLimit \
                     and X-RateLimit-* headers and a problem+json body; a client or monitor \
                     that retried or alerted on 5xx now sees a 4xx"
                )
            } else {
                format!(
                    "clients that got {status} now get {chosen} (one deny_status for all limits)"
                )
            };
            let what = self.note(
                "response.deny_status",
                format!("{from} was {status}: {change}"),
            );
            let _ = writeln!(text, "# {what}");
        }
        self.response = text;
        Ok(())
    }

    /// A unique limit or rule name `<namespace>-<name>-<what>`, `[a-z0-9_-]`, at most 64.
    fn name(&mut self, ingress: &Ingress, what: &str) -> String {
        let base: String = format!("{}-{}", ingress.namespace, ingress.name)
            .chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9' | '_' | '-') => c,
                _ => '-',
            })
            .collect();
        // Room for "-<what>" and a numeric suffix should the name be taken.
        let room = 64 - what.len() - 1 - 3;
        let base = if base.len() > room {
            let digest = Sha256::digest(base.as_bytes());
            let tag: String = digest[..3].iter().map(|b| format!("{b:02x}")).collect();
            format!("{}-{tag}", &base[..room - 7])
        } else {
            base
        };
        let mut name = format!("{base}-{what}");
        let mut n = 2;
        while !self.names.insert(name.clone()) {
            name = format!("{base}-{what}{n}");
            n += 1;
        }
        name
    }

    fn ingress(&mut self, ingress: &Ingress) -> Result<(), IngressImportError> {
        let object = ingress.object.clone();
        let prefix = ingress.prefix.as_str();
        let scopes = ingress.scopes();
        let mut comments: Vec<String> = Vec::new();
        for (annotation, why) in [
            (
                "limit-connections",
                "concurrent connections per client: tollgate has no concurrency limit for \
                 /check yet",
            ),
            ("limit-rate", "bandwidth (bytes per second), not requests"),
            (
                "limit-rate-after",
                "bandwidth (bytes per second), not requests",
            ),
        ] {
            if let Some(value) = ingress.annotation(annotation) {
                let what = self.note(
                    &object,
                    format!("{prefix}{annotation}: {value:?} not carried: {why}"),
                );
                comments.push(what);
            }
        }
        let rps = ingress.integer("limit-rps")?.unwrap_or(0);
        let rpm = ingress.integer("limit-rpm")?.unwrap_or(0);
        let multiplier = match ingress.integer("limit-burst-multiplier")? {
            Some(0) if rps > 0 || rpm > 0 => {
                // nginx's burst 0 admits one request at a time: tollgate's burst 1 does too.
                let what = self.note(
                    &object,
                    format!(
                        "{prefix}limit-burst-multiplier 0: nginx's burst 0 admits one request at \
                         a time, which is tollgate's burst 1"
                    ),
                );
                comments.push(what);
                0
            }
            Some(m) => m,
            None => DEFAULT_BURST_MULTIPLIER,
        };
        // `limit-allowlist` is the current name, `limit-whitelist` its older alias.
        let whitelist = if ingress.annotation("limit-allowlist").is_some() {
            ingress.cidrs("limit-allowlist")?
        } else {
            ingress.cidrs("limit-whitelist")?
        };
        let global = self.global(ingress, &mut comments)?;
        let ignored = ingress.cidrs("global-rate-limit-ignored-cidrs")?;
        let local = rps > 0 || rpm > 0;

        if scopes.len() > 1 && (local || global.is_some()) {
            comments.push(self.note(
                &object,
                format!(
                    "routes {} paths: one limit per path, each with its own buckets \
                     (ingress-nginx shared one zone across the Ingress's paths)",
                    scopes.len()
                ),
            ));
        }
        if local && global.is_some() && whitelist != ignored {
            comments.push(
                self.note(
                    &object,
                    "limit-whitelist and global-rate-limit-ignored-cidrs differ: tollgate's \
                 [[exempt]] skips every limit, so each list also skips the other kind of limit"
                        .into(),
                ),
            );
        }
        let mut block = format!("\n# ---- {object}\n");
        for comment in &comments {
            let _ = writeln!(block, "# {comment}");
        }
        for scope in &scopes {
            for note in scope.notes() {
                if local || global.is_some() {
                    let what = self.note(&object, note);
                    let _ = writeln!(block, "# {what}");
                }
            }
        }
        let mut emitted = false;
        let mut exempt_cidrs: Vec<IpNet> = Vec::new();
        if local {
            exempt_cidrs.extend(whitelist.iter().copied());
        } else if !whitelist.is_empty() {
            let _ = writeln!(
                block,
                "# {}",
                self.note(
                    &object,
                    format!(
                        "{prefix}limit-whitelist without limit-rps/limit-rpm: nothing to exempt"
                    )
                )
            );
        }
        if global.is_some() {
            for net in &ignored {
                if !exempt_cidrs.contains(net) {
                    exempt_cidrs.push(*net);
                }
            }
        }
        if !exempt_cidrs.is_empty() {
            for scope in &scopes {
                let name = self.name(ingress, "exempt");
                let nets: Vec<String> = exempt_cidrs
                    .iter()
                    .map(|n| quoted(&n.to_string()))
                    .collect();
                let _ = write!(
                    self.exempts,
                    "\n# {object}: limit-whitelist / global-rate-limit-ignored-cidrs\n[[exempt]]\nname = {}\ncidrs = [{}]\n{}",
                    quoted(&name),
                    nets.join(", "),
                    scope.lines()
                );
            }
        }
        for scope in &scopes {
            for (count, unit, what) in [(rps, "s", "rps"), (rpm, "min", "rpm")] {
                if count == 0 {
                    continue;
                }
                let name = self.name(ingress, what);
                let burst = count.saturating_mul(multiplier).max(1);
                let one_more = if multiplier > 0 {
                    " (nginx's limit_req admitted one more at once)"
                } else {
                    ""
                };
                let _ = write!(
                    block,
                    "\n[[limits]]   # limit-{what} {count} per client IP, burst {count} x {multiplier}{one_more}\n\
                     name = {}\nrate = \"{count}/{unit}\"\nburst = {burst}\nkey = [\"ip\"]\n",
                    quoted(&name)
                );
                match_table(&mut block, scope, &BTreeMap::new());
                emitted = true;
            }
            if let Some(global) = &global {
                self.global_limits(&mut block, ingress, scope, global);
                emitted = true;
            }
        }
        if emitted || !comments.is_empty() {
            self.limits.push_str(&block);
        }
        if emitted {
            let headers = global
                .iter()
                .flat_map(|g| g.key.parts.iter())
                .filter_map(|p| p.strip_prefix("header:"))
                .map(str::to_string)
                .collect();
            self.fronted.push(Fronted {
                headers,
                object,
                namespace: ingress.namespace.clone(),
                name: ingress.name.clone(),
                scopes,
            });
        }
        Ok(())
    }

    /// `global-rate-limit` and its companions; `None` when it is off (as in ingress-nginx: no
    /// limit, no window, or a window under a second).
    fn global(
        &mut self,
        ingress: &Ingress,
        comments: &mut Vec<String>,
    ) -> Result<Option<Global>, IngressImportError> {
        let object = ingress.object.clone();
        let prefix = ingress.prefix.as_str();
        let limit = ingress.integer("global-rate-limit")?.unwrap_or(0);
        let window = ingress.annotation("global-rate-limit-window");
        let Some(window) = window.filter(|_| limit > 0) else {
            if limit > 0 {
                comments.push(self.note(
                    &object,
                    format!(
                        "{prefix}global-rate-limit without global-rate-limit-window is off in \
                         ingress-nginx: not carried"
                    ),
                ));
            }
            return Ok(None);
        };
        let seconds = go_duration_secs(window)
            .map_err(|why| ingress.error("global-rate-limit-window", why))?;
        if seconds == 0 {
            comments.push(self.note(
                &object,
                format!(
                    "{prefix}global-rate-limit-window {window:?} is under a second, which \
                     ingress-nginx treats as off: not carried"
                ),
            ));
            return Ok(None);
        }
        let text = ingress
            .annotation("global-rate-limit-key")
            .unwrap_or("$remote_addr");
        let key = match nginx_key(text) {
            Ok(key) => key,
            Err(KeyError::Malformed(why)) => {
                return Err(ingress.error("global-rate-limit-key", why));
            }
            Err(KeyError::Unsupported(variable)) => {
                comments.push(self.note(
                    &object,
                    format!(
                        "{prefix}global-rate-limit-key {text:?}: ${variable} has no tollgate \
                         key part (ip, host, path, method, header:<name>, const:<text>): the \
                         global limit is not carried"
                    ),
                ));
                return Ok(None);
            }
        };
        if text.contains("request_uri") {
            comments.push(self.note(
                &object,
                "$request_uri includes the query string; tollgate's path part does not".into(),
            ));
        }
        Ok(Some(Global {
            limit,
            seconds,
            window: window.to_string(),
            key,
            key_text: text.to_string(),
        }))
    }

    fn global_limits(&mut self, block: &mut String, ingress: &Ingress, scope: &Scope, g: &Global) {
        let rate = rate_per(g.limit, g.seconds);
        let name = self.name(ingress, "global");
        let parts: Vec<String> = g.key.parts.iter().map(|p| quoted(p)).collect();
        let on_missing = if g.key.headers_only && g.key.parts.len() == 1 {
            ""
        } else if g.key.parts.iter().any(|p| p.starts_with("header:")) {
            // nginx interpolates an absent header as "": one shared value.
            "on_missing = \"anonymous\"\n"
        } else {
            ""
        };
        let _ = write!(
            block,
            "\n[[limits]]   # global-rate-limit {} per {} keyed {:?}\n\
             name = {}\nrate = {rate}\nburst = {}\nkey = [{}]\n{on_missing}",
            g.limit,
            g.window,
            g.key_text,
            quoted(&name),
            g.limit,
            parts.join(", ")
        );
        match_table(block, scope, &BTreeMap::new());
        if g.key.headers_only {
            // ingress-nginx keys a request whose key is empty by its client address.
            let fallback = self.name(ingress, "global-noheader");
            let headers: BTreeMap<String, Vec<String>> = g
                .key
                .parts
                .iter()
                .filter_map(|p| p.strip_prefix("header:"))
                .map(|h| (h.to_string(), vec![String::new()]))
                .collect();
            let _ = write!(
                block,
                "\n[[limits]]   # the same, for requests without {}: ingress-nginx keys them by $remote_addr\n\
                 name = {}\nrate = {rate}\nburst = {}\nkey = [\"ip\"]\n",
                headers.keys().cloned().collect::<Vec<_>>().join(" or "),
                quoted(&fallback),
                g.limit
            );
            match_table(block, scope, &headers);
        }
    }
}

struct Fronted {
    /// Headers the limits key on, which Envoy must be told to send.
    headers: Vec<String>,
    object: String,
    namespace: String,
    name: String,
    scopes: Vec<Scope>,
}

struct Global {
    limit: u64,
    seconds: u64,
    window: String,
    key: KeyPlan,
    key_text: String,
}

/// `rate = ...` for `count` per `seconds`: an exact `"N/unit"` string when one exists, else
/// tokens per second.
fn rate_per(count: u64, seconds: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1, "s"), (60, "min"), (3600, "hour"), (86_400, "day")];
    if let Some((_, unit)) = UNITS.iter().find(|(unit_secs, _)| *unit_secs == seconds) {
        return format!("\"{count}/{unit}\"");
    }
    for (unit_secs, unit) in UNITS {
        let scaled = count.saturating_mul(unit_secs);
        if scaled % seconds == 0 {
            let per = scaled / seconds;
            return format!("\"{per}/{unit}\"   # {count} per {seconds} s");
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let per_second = count as f64 / seconds as f64;
    format!("{per_second:?}   # {count} per {seconds} s")
}

/// `[limits.match]` for a scope, plus header conditions.
fn match_table(block: &mut String, scope: &Scope, headers: &BTreeMap<String, Vec<String>>) {
    if scope.is_everything() && headers.is_empty() {
        return;
    }
    block.push_str("[limits.match]\n");
    block.push_str(&scope.lines());
    if !headers.is_empty() {
        let items: Vec<String> = headers
            .iter()
            .map(|(name, values)| {
                let values: Vec<String> = values.iter().map(|v| quoted(v)).collect();
                format!("{} = [{}]", quoted(name), values.join(", "))
            })
            .collect();
        let _ = writeln!(block, "headers = {{ {} }}", items.join(", "));
    }
}

/// Go's `time.ParseDuration` of an annotation (which ingress-nginx trims), in whole seconds
/// (it truncates the window so).
fn go_duration_secs(text: &str) -> Result<u64, String> {
    crate::base::go::parse_duration(text.trim())
        .map(|window| window.as_secs())
        .ok_or_else(|| format!("{text:?} is not a duration like 1m, 30s or 1h30m"))
}

/// What to put in front of tollgate for these Ingresses.
fn snippet(proxy: Proxy, out: &Translation) -> String {
    let limited = &out.fronted;
    let mut text = String::new();
    match proxy {
        Proxy::Nginx => {
            text.push_str(
                "# nginx in front of tollgate: the shared parts (upstream tollgate, the internal\n\
                 # `location = /_tollgate` and `@tollgate_denied`) are in config/nginx/tollgate.conf\n\
                 # of the tollgate repository. Add to each location of these hosts and paths:\n",
            );
            for ingress in limited {
                for scope in &ingress.scopes {
                    let hosts = if scope.hosts.is_empty() {
                        "_".to_string()
                    } else {
                        scope.hosts.join(" ")
                    };
                    let path = scope.path_prefix.as_deref().unwrap_or("/");
                    let exact = if scope.exact { "= " } else { "" };
                    let _ = write!(
                        text,
                        "\n# {}\nserver {{\n    server_name {hosts};\n    location {exact}{path} {{\n        auth_request /_tollgate;\n        auth_request_set $tollgate_status $upstream_http_x_tollgate_status;\n        auth_request_set $tollgate_retry_after $upstream_http_retry_after;\n        error_page 403 = @tollgate_denied;\n        # proxy_pass to the Ingress's backend, as before\n    }}\n}}\n",
                        ingress.object
                    );
                }
            }
        }
        Proxy::Traefik => {
            text.push_str(
                "# Traefik in front of tollgate: one ForwardAuth middleware per namespace, and the\n\
                 # router annotation on each Ingress that had a limit.\n",
            );
            let namespaces: BTreeSet<&str> = limited.iter().map(|i| i.namespace.as_str()).collect();
            for namespace in &namespaces {
                let _ = write!(
                    text,
                    "---\napiVersion: traefik.io/v1alpha1\nkind: Middleware\nmetadata:\n  name: tollgate\n  namespace: {namespace}\nspec:\n  forwardAuth:\n    address: http://tollgate.tollgate.svc:8080/check   # CHANGE: tollgate's Service\n    trustForwardHeader: false\n    authResponseHeaders: [RateLimit, RateLimit-Policy, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset]\n"
                );
            }
            for ingress in limited {
                let _ = write!(
                    text,
                    "# {}: add the annotation\n#   traefik.ingress.kubernetes.io/router.middlewares: {}-tollgate@kubernetescrd\n",
                    ingress.object, ingress.namespace
                );
            }
        }
        Proxy::Envoy => {
            text.push_str(
                "# Envoy Gateway in front of tollgate: an HTTP ext_authz SecurityPolicy on the\n\
                 # HTTPRoute that replaced each Ingress (rename targetRefs to the route's name).\n",
            );
            for ingress in limited {
                let _ = write!(
                    text,
                    "---\napiVersion: gateway.envoyproxy.io/v1alpha1\nkind: SecurityPolicy\nmetadata:\n  name: {}-tollgate\n  namespace: {}\nspec:\n  targetRefs:\n  - group: gateway.networking.k8s.io\n    kind: HTTPRoute\n    name: {}\n  extAuth:\n    failOpen: true\n    headersToExtAuth: [{}]\n    http:\n      backendRefs:\n      - name: tollgate          # CHANGE: tollgate's Service\n        namespace: tollgate\n        port: 8080\n      path: /check\n",
                    ingress.name,
                    ingress.namespace,
                    ingress.name,
                    std::iter::once("x-forwarded-for")
                        .chain(ingress.headers.iter().map(String::as_str))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
    }
    if limited.is_empty() {
        text.push_str("# No Ingress with a rate-limit annotation: nothing to put in front.\n");
    }
    text
}

#[cfg(test)]
mod tests;
