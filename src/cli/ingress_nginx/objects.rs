//! Reading the Kubernetes objects: Ingresses (their annotations, and the host/path routes
//! a limit is scoped to) and the controller's ConfigMap.

use ipnet::IpNet;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

/// ingress-nginx's default annotation prefix (its `--annotations-prefix`).
pub const DEFAULT_PREFIX: &str = "nginx.ingress.kubernetes.io";

/// ingress-nginx's default `limit-burst-multiplier`.
pub(super) const DEFAULT_BURST_MULTIPLIER: u64 = 5;

/// ingress-nginx's default answer to a request over `limit-rps`/`limit-rpm`.
pub(super) const DEFAULT_LIMIT_REQ_STATUS: u16 = 503;

/// ingress-nginx's default answer to a request over `global-rate-limit`.
pub(super) const DEFAULT_GLOBAL_STATUS: u16 = 429;

/// A file, object or annotation that cannot be converted: what it is and why.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{object}: {reason}")]
pub struct IngressImportError {
    /// The file, or `Ingress <namespace>/<name>` and its annotation.
    pub object: String,
    pub reason: String,
}

/// A TOML basic string (JSON's escapes are TOML's).
pub(super) fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// The controller-wide settings found in a ConfigMap among the files.
#[derive(Debug, Default)]
pub(super) struct Controller {
    pub(super) limit_req_status: Option<(u16, String)>,
    pub(super) global_status: Option<(u16, String)>,
}

/// One Ingress, as much of it as the rate limits need.
#[derive(Debug)]
pub(super) struct Ingress {
    /// `Ingress <namespace>/<name>`.
    pub(super) object: String,
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) annotations: BTreeMap<String, String>,
    /// `<annotations prefix>/`.
    pub(super) prefix: String,
    /// The host/path pairs its rules route; `None` host: any host.
    routes: Vec<Route>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Route {
    pub(super) host: Option<String>,
    pub(super) path: String,
    pub(super) exact: bool,
}

pub(super) fn read_documents(
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
pub(super) fn object(
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

pub(super) fn status_code(text: &str) -> Result<u16, String> {
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

    pub(super) fn annotation(&self, name: &str) -> Option<&str> {
        let prefix = &self.prefix;
        self.annotations
            .get(&format!("{prefix}{name}"))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    pub(super) fn error(&self, annotation: &str, reason: impl Into<String>) -> IngressImportError {
        let prefix = &self.prefix;
        IngressImportError {
            object: format!("{} annotation {prefix}{annotation}", self.object),
            reason: reason.into(),
        }
    }

    /// An integer annotation; absent: `None`.
    pub(super) fn integer(&self, annotation: &str) -> Result<Option<u64>, IngressImportError> {
        let Some(text) = self.annotation(annotation) else {
            return Ok(None);
        };
        text.parse::<u64>()
            .map(Some)
            .map_err(|_| self.error(annotation, format!("{text:?} is not a whole number >= 0")))
    }

    /// CIDRs or single addresses, comma-separated.
    pub(super) fn cidrs(&self, annotation: &str) -> Result<Vec<IpNet>, IngressImportError> {
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
    pub(super) fn has_local_limits(&self) -> Result<bool, IngressImportError> {
        Ok(self.integer("limit-rps")?.unwrap_or(0) > 0
            || self.integer("limit-rpm")?.unwrap_or(0) > 0)
    }

    pub(super) fn has_global_limit(&self) -> Result<bool, IngressImportError> {
        Ok(self.integer("global-rate-limit")?.unwrap_or(0) > 0
            && self.annotation("global-rate-limit-window").is_some())
    }

    /// The tollgate scopes of this Ingress: one per distinct path, with the hosts routing it
    /// (none: any host).
    pub(super) fn scopes(&self) -> Vec<Scope> {
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
pub(super) struct Scope {
    pub(super) hosts: Vec<String>,
    pub(super) path_prefix: Option<String>,
    /// The path was `pathType: Exact` (tollgate matches it as a prefix).
    pub(super) exact: bool,
    /// A wildcard host was routed here (tollgate matches hosts exactly: the scope is widened
    /// to any host).
    wildcard: bool,
}

impl Scope {
    /// The lines of a `[limits.match]` or of an `[[exempt]]` rule (without a table header).
    pub(super) fn lines(&self) -> String {
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

    pub(super) fn is_everything(&self) -> bool {
        self.hosts.is_empty() && self.path_prefix.is_none()
    }

    pub(super) fn notes(&self) -> Vec<String> {
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
