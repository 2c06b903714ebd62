//! Configuration: built-in defaults < TOML file < `TOLLGATE_*` environment, checked into a
//! typed [`Config`]. Every refusal is a [`ConfigError`] naming the offending key, so the CLI
//! can print one line and exit 2.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use crate::rate::RateSpec;

/// Environment variables that carry the config file path, or that Kubernetes injects for a
/// Service named `tollgate` (`TOLLGATE_SERVICE_HOST`, `TOLLGATE_PORT_8080_TCP`, ...). They are
/// not config keys, and refusing them would crash-loop a pod for a name clash.
const NON_CONFIG_ENV: &[&str] = &["config", "service_host", "service_port", "port"];

/// Allowed `client_ip.ipv6_prefix`: shorter than /32 would put whole providers in one bucket.
pub const IPV6_PREFIXES: std::ops::RangeInclusive<u8> = 32..=128;

/// Longest full-refill time (`burst / rate`) accepted: ten years. The store keeps a bucket for
/// up to twice that, in milliseconds (6.3e11), which `PEXPIRE` takes and Lua prints as an
/// integer; a longer refill is a misconfiguration, not a rate limit.
pub const MAX_REFILL_SECS: f64 = 10.0 * 365.0 * 86_400.0;

/// Largest `burst` (and so `cost`): far inside the range where floats hold integers exactly.
pub const MAX_BURST: u64 = 1_000_000_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub store: StoreConfig,
    pub client_ip: ClientIpConfig,
    pub response: ResponseConfig,
    /// Requests admitted before any limit is looked at; the first matching rule wins.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exempt: Vec<ExemptConfig>,
    pub limits: Vec<LimitConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub backend: Backend,
    pub url: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cluster: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<SentinelConfig>,
    pub timeout_ms: u64,
    pub key_prefix: String,
    pub on_error: OnError,
    /// Upper bound on buckets held in process memory (memory store and `local` fallback).
    pub max_buckets: usize,
    /// Answer denials Redis would surely repeat without asking it (see `deny_cache`). Off
    /// when something else edits buckets in Redis (e.g. support staff resetting a quota) and
    /// that must take effect at once rather than when the cached window ends.
    pub deny_cache: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    pub master: String,
    pub urls: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    Allow,
    Deny,
    Local,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientIpConfig {
    pub from: IpSource,
    pub trusted_proxies: Vec<IpNet>,
    /// An IPv6 client is keyed by its network of this length (providers hand a /64 to each
    /// customer); 128 keys each address. IPv4 addresses are always keyed whole.
    pub ipv6_prefix: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IpSource {
    XForwardedFor,
    XRealIp,
    Peer,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponseConfig {
    pub deny_status: u16,
    pub headers: Vec<HeaderFamily>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeaderFamily {
    Ietf,
    XRatelimit,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    pub name: String,
    pub rate: RateSpec,
    pub burst: u64,
    pub key: Vec<String>,
    #[serde(default = "one")]
    pub cost: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_header: Option<String>,
    #[serde(default)]
    pub shadow: bool,
    #[serde(default)]
    pub on_missing: OnMissing,
    #[serde(default, rename = "match")]
    pub matching: MatchConfig,
    /// Per-key policies: the first whose `key` equals the request's key values wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<OverrideConfig>,
    /// More overrides (`[[overrides]]` entries), read at start and on every reload. A relative
    /// path is relative to the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides_file: Option<PathBuf>,
}

/// `[[limits.overrides]]`: another policy for one key of a limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideConfig {
    /// One value per key part of the limit, in order.
    pub key: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Never limited by this limit (no store call for it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unlimited: bool,
}

/// The shape of an `overrides_file`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverridesFile {
    #[serde(default)]
    pub overrides: Vec<OverrideConfig>,
}

/// `[[exempt]]`: requests admitted without a store call when every given condition holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExemptConfig {
    pub name: String,
    /// The client IP (after the trusted-proxy walk) is in one of these networks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<IpNet>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, Vec<String>>,
}

impl ExemptConfig {
    /// The request conditions of the rule, shaped like a limit's `[limits.match]`.
    pub fn matching(&self) -> MatchConfig {
        MatchConfig {
            hosts: self.hosts.clone(),
            methods: self.methods.clone(),
            path_prefix: self.path_prefix.clone(),
            headers: self.headers.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMissing {
    #[default]
    Skip,
    Deny,
    Anonymous,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MatchConfig {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Header name -> accepted values; `""` stands for an absent or empty header.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, Vec<String>>,
}

fn one() -> u64 {
    1
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            admin_listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            store: StoreConfig::default(),
            client_ip: ClientIpConfig::default(),
            response: ResponseConfig::default(),
            exempt: Vec::new(),
            limits: vec![LimitConfig {
                name: "per-ip".into(),
                rate: RateSpec::PerSecond(20.0),
                burst: 100,
                key: vec!["ip".into()],
                cost: 1,
                cost_header: None,
                shadow: false,
                on_missing: OnMissing::Skip,
                matching: MatchConfig::default(),
                overrides: Vec::new(),
                overrides_file: None,
            }],
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: Backend::Memory,
            url: "redis://127.0.0.1:6379/0".into(),
            cluster: Vec::new(),
            sentinel: None,
            timeout_ms: 50,
            key_prefix: "tollgate".into(),
            on_error: OnError::Allow,
            max_buckets: 100_000,
            deny_cache: true,
        }
    }
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        ClientIpConfig {
            from: IpSource::XForwardedFor,
            trusted_proxies: vec![
                "127.0.0.0/8".parse().expect("literal CIDR"),
                "::1/128".parse().expect("literal CIDR"),
            ],
            ipv6_prefix: 64,
        }
    }
}

impl Default for ResponseConfig {
    fn default() -> Self {
        ResponseConfig {
            deny_status: 429,
            headers: vec![HeaderFamily::Ietf, HeaderFamily::XRatelimit],
        }
    }
}

/// A refused configuration: the dotted key and why, printed as one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The same error for a key relative to `at` (`""` names `at` itself).
    pub fn within(mut self, at: &str) -> Self {
        self.key = if self.key.is_empty() {
            at.to_string()
        } else {
            format!("{at}.{}", self.key)
        };
        self
    }
}

impl From<figment::Error> for ConfigError {
    fn from(error: figment::Error) -> Self {
        let mut path = error.path.join(".");
        let reason = match &error.kind {
            figment::error::Kind::UnknownField(field, _) => {
                if error.path.last() != Some(field) {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(field);
                }
                "unknown key".to_string()
            }
            figment::error::Kind::Message(msg)
                if msg.contains("parse error") || path.is_empty() =>
            {
                // TOML syntax errors carry no path; keep the parser's own position info.
                if path.is_empty() {
                    path = "<file>".into();
                }
                msg.split_whitespace().collect::<Vec<_>>().join(" ")
            }
            kind => kind.to_string(),
        };
        let source = error
            .metadata
            .as_ref()
            .map(|md| format!(" (from {})", md.name))
            .unwrap_or_default();
        ConfigError::new(path, format!("{reason}{source}"))
    }
}

impl Config {
    /// Loads defaults, then `file` (if any), then the `TOLLGATE_*` environment, and validates.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::new(
                    "--config",
                    format!("{} is not a readable file", path.display()),
                ));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        let env = Env::prefixed("TOLLGATE_")
            .split("__")
            .filter(|key| !is_kubernetes_or_cli_env(&key.as_str().to_ascii_lowercase()));
        let mut config: Config = figment.merge(env).extract()?;
        config.resolve_paths(file);
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot in the settings around the limits: ranges, CIDRs, URLs. Limits
    /// and exemptions are checked where they are built (`Policy::compile`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.store.validate()?;
        // A proxy treats a 2xx/3xx auth answer as admission and a 5xx as its own failure;
        // only a 4xx is a denial every shipped config passes on to the client.
        if !(400..=499).contains(&self.response.deny_status) {
            return Err(ConfigError::new(
                "response.deny_status",
                "must be a client error status between 400 and 499",
            ));
        }
        if !IPV6_PREFIXES.contains(&self.client_ip.ipv6_prefix) {
            return Err(ConfigError::new(
                "client_ip.ipv6_prefix",
                format!(
                    "must be between {} and {}",
                    IPV6_PREFIXES.start(),
                    IPV6_PREFIXES.end()
                ),
            ));
        }
        Ok(())
    }

    /// Makes every relative `overrides_file` relative to the directory of the config file.
    fn resolve_paths(&mut self, file: Option<&Path>) {
        let Some(dir) = file.and_then(Path::parent) else {
            return;
        };
        for limit in &mut self.limits {
            if let Some(path) = limit.overrides_file.as_mut().filter(|p| p.is_relative()) {
                *path = dir.join(&*path);
            }
        }
    }
}

impl Config {
    /// What `tollgate validate` prints: the effective settings and limits, passwords redacted.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(out, "configuration ok");
        let _ = writeln!(out, "listen        {}", self.listen);
        let _ = writeln!(out, "admin_listen  {}", self.admin_listen);
        let _ = writeln!(out, "store         {}", self.store.describe());
        let _ = writeln!(
            out,
            "client_ip     from {}, trusted {:?}, ipv6 keyed per /{}",
            spelled(&self.client_ip.from),
            self.client_ip
                .trusted_proxies
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>(),
            self.client_ip.ipv6_prefix
        );
        if !self.exempt.is_empty() {
            let _ = writeln!(out, "exempt        {}", self.exempt.len());
            for rule in &self.exempt {
                let cidrs: Vec<String> = rule.cidrs.iter().map(|n| n.to_string()).collect();
                let matching = rule.matching();
                let conditions = match (cidrs.is_empty(), matching.is_empty()) {
                    (false, false) => format!("cidrs {cidrs:?}, {}", matching.describe()),
                    (false, true) => format!("cidrs {cidrs:?}"),
                    (true, _) => matching.describe(),
                };
                let _ = writeln!(out, "  {:<16} {conditions}", rule.name);
            }
        }
        let _ = writeln!(out, "limits        {}", self.limits.len());
        for limit in &self.limits {
            let _ = write!(
                out,
                "  {:<16} rate {}  burst {}  key [{}]  cost {}",
                limit.name,
                describe_rate(&limit.rate),
                limit.burst,
                limit.key.join(", "),
                limit
                    .cost_header
                    .as_deref()
                    .map_or(limit.cost.to_string(), |h| format!(
                        "from {h} (default {})",
                        limit.cost
                    )),
            );
            if limit.shadow {
                out.push_str("  shadow");
            }
            let _ = write!(
                out,
                "  on_missing {:?}  match {}",
                limit.on_missing,
                limit.matching.describe()
            );
            if !limit.overrides.is_empty() || limit.overrides_file.is_some() {
                let _ = write!(out, "  overrides {} inline", limit.overrides.len());
                if let Some(file) = &limit.overrides_file {
                    let _ = write!(out, " + file {}", file.display());
                }
            }
            out.push('\n');
        }
        for warning in self.warnings() {
            let _ = writeln!(out, "warning: {warning}");
        }
        out
    }

    /// Configurations that are valid but probably not meant: two limits on the same key that
    /// one request can draw from together although header rules make them look like tiers.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for (i, a) in self.limits.iter().enumerate() {
            for b in &self.limits[i + 1..] {
                let tiered = !a.matching.headers.is_empty() || !b.matching.headers.is_empty();
                if tiered && a.key == b.key && !a.matching.excludes(&b.matching) {
                    warnings.push(format!(
                        "limits.{} and limits.{} share the key [{}] and their [limits.match] rules \
                         overlap: one request is charged by both (make the header values disjoint)",
                        a.name,
                        b.name,
                        a.key.join(", ")
                    ));
                }
            }
        }
        warnings
    }
}

/// `20/s`, or the written form and what it means per second: `100/min = 1.666667 tokens/s`.
fn describe_rate(rate: &RateSpec) -> String {
    match (rate, rate.per_second()) {
        (RateSpec::Text(text), Ok(per_second)) => {
            let fixed = format!("{per_second:.6}");
            let short = fixed.trim_end_matches('0').trim_end_matches('.');
            format!("{} = {short} tokens/s", text.trim())
        }
        _ => rate.to_string(),
    }
}

impl StoreConfig {
    /// One line for logs and `validate`: never the password.
    pub fn describe(&self) -> String {
        match self.backend {
            Backend::Memory => format!("memory (at most {} buckets)", self.max_buckets),
            Backend::Redis => {
                let target = if !self.cluster.is_empty() {
                    let seeds: Vec<String> = self.cluster.iter().map(|u| redact_url(u)).collect();
                    format!("cluster [{}]", seeds.join(", "))
                } else if let Some(sentinel) = &self.sentinel {
                    let urls: Vec<String> = sentinel.urls.iter().map(|u| redact_url(u)).collect();
                    format!(
                        "sentinel master {:?} via [{}]",
                        sentinel.master,
                        urls.join(", ")
                    )
                } else {
                    redact_url(&self.url)
                };
                format!(
                    "redis {target} (timeout {} ms, on_error {}, prefix {:?}, deny cache {})",
                    self.timeout_ms,
                    spelled(&self.on_error),
                    self.key_prefix,
                    if self.deny_cache { "on" } else { "off" }
                )
            }
        }
    }
}

impl MatchConfig {
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
            && self.methods.is_empty()
            && self.path_prefix.is_none()
            && self.headers.is_empty()
    }

    /// Whether no request can satisfy both rule sets: some condition both give has no value
    /// in common (hosts and methods compared case-insensitively, path prefixes by prefix).
    pub fn excludes(&self, other: &MatchConfig) -> bool {
        let disjoint = |a: &[String], b: &[String]| {
            !a.is_empty()
                && !b.is_empty()
                && !a
                    .iter()
                    .any(|x| b.iter().any(|y| x.eq_ignore_ascii_case(y)))
        };
        let paths_apart = match (&self.path_prefix, &other.path_prefix) {
            (Some(a), Some(b)) => !a.starts_with(b.as_str()) && !b.starts_with(a.as_str()),
            _ => false,
        };
        let headers_apart = self.headers.iter().any(|(name, values)| {
            other
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .is_some_and(|(_, others)| !values.iter().any(|v| others.contains(v)))
        });
        disjoint(&self.hosts, &other.hosts)
            || disjoint(&self.methods, &other.methods)
            || paths_apart
            || headers_apart
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.hosts.is_empty() {
            parts.push(format!("hosts {:?}", self.hosts));
        }
        if !self.methods.is_empty() {
            parts.push(format!("methods {:?}", self.methods));
        }
        if let Some(prefix) = &self.path_prefix {
            parts.push(format!("path_prefix {prefix:?}"));
        }
        for (name, values) in &self.headers {
            parts.push(format!("{name} in {values:?}"));
        }
        if parts.is_empty() {
            "all requests".into()
        } else {
            parts.join(", ")
        }
    }
}

/// A config enum as the file spells it (`x-forwarded-for`, not `XForwardedFor`).
fn spelled(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        _ => String::from("?"),
    }
}

fn is_kubernetes_or_cli_env(key: &str) -> bool {
    NON_CONFIG_ENV.contains(&key) || key.starts_with("service_port_") || key.starts_with("port_")
}

impl StoreConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.timeout_ms == 0 || self.timeout_ms > 60_000 {
            return Err(ConfigError::new(
                "store.timeout_ms",
                "must be between 1 and 60000",
            ));
        }
        // Braces would become the Redis Cluster hash tag of every key: one slot for all.
        if self.key_prefix.is_empty()
            || self.key_prefix.len() > 64
            || !self
                .key_prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return Err(ConfigError::new(
                "store.key_prefix",
                "must be 1 to 64 printable ASCII characters without spaces or braces",
            ));
        }
        if self.max_buckets == 0 {
            return Err(ConfigError::new("store.max_buckets", "must be at least 1"));
        }
        if self.backend == Backend::Memory {
            return Ok(());
        }
        validate_redis_url("store.url", &self.url)?;
        for (i, url) in self.cluster.iter().enumerate() {
            let key = format!("store.cluster[{i}]");
            validate_redis_url(&key, url)?;
            if url.starts_with("redis+unix://") || url.starts_with("unix://") {
                return Err(ConfigError::new(key, "cluster nodes are reached over TCP"));
            }
            if redis_db(url) != 0 {
                return Err(ConfigError::new(key, "Redis Cluster has only database 0"));
            }
        }
        if let Some(sentinel) = &self.sentinel {
            if !self.cluster.is_empty() {
                return Err(ConfigError::new(
                    "store.sentinel",
                    "cannot be combined with store.cluster",
                ));
            }
            if sentinel.master.is_empty() {
                return Err(ConfigError::new(
                    "store.sentinel.master",
                    "must name the monitored master",
                ));
            }
            if sentinel.urls.is_empty() {
                return Err(ConfigError::new(
                    "store.sentinel.urls",
                    "needs at least one sentinel address",
                ));
            }
            for (i, url) in sentinel.urls.iter().enumerate() {
                validate_redis_url(&format!("store.sentinel.urls[{i}]"), url)?;
            }
        }
        Ok(())
    }
}

/// Checks a Redis URL without ever echoing it: it may hold a password.
fn validate_redis_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let scheme_ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|scheme| url.starts_with(scheme));
    if !scheme_ok {
        return Err(ConfigError::new(
            key,
            "must start with redis://, rediss:// or redis+unix://",
        ));
    }
    redis::Client::open(url).map(|_| ()).map_err(|e| {
        ConfigError::new(
            key,
            format!(
                "not a valid Redis URL ({})",
                redact_error(&e.to_string(), url)
            ),
        )
    })
}

/// The database number a valid Redis URL selects.
fn redis_db(url: &str) -> i64 {
    use redis::IntoConnectionInfo as _;
    url.into_connection_info()
        .map_or(0, |info| info.redis_settings().db())
}

/// Replaces the password of a `scheme://user:password@host` URL with `***`.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    let Some(at) = url[scheme_end..authority_end]
        .rfind('@')
        .map(|i| scheme_end + i)
    else {
        return url.to_string();
    };
    let userinfo = &url[scheme_end..at];
    let user = userinfo.split(':').next().unwrap_or("");
    format!("{}{}:***{}", &url[..scheme_end], user, &url[at..])
}

/// Error texts from URL parsers may quote the URL; never let a password through.
fn redact_error(message: &str, url: &str) -> String {
    match password_of(url) {
        Some(password) if !password.is_empty() => message.replace(password, "***"),
        _ => message.to_string(),
    }
}

fn password_of(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    userinfo.split_once(':').map(|(_, password)| password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_the_password_only() {
        assert_eq!(
            redact_url("redis://user:s3cret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact_url("redis://:s3cret@host"), "redis://:***@host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
    }

    #[test]
    fn kubernetes_service_variables_are_not_config_keys() {
        assert!(is_kubernetes_or_cli_env("service_host"));
        assert!(is_kubernetes_or_cli_env("port_8080_tcp_addr"));
        assert!(is_kubernetes_or_cli_env("config"));
        assert!(!is_kubernetes_or_cli_env("listen"));
    }

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().expect("defaults validate");
    }

    fn redis_store() -> StoreConfig {
        StoreConfig {
            backend: Backend::Redis,
            ..StoreConfig::default()
        }
    }

    #[test]
    fn cluster_seeds_must_be_tcp_urls_on_database_0() {
        let mut store = redis_store();
        store.cluster = vec!["redis://127.0.0.1:7000".into(), "redis://h:7001/0".into()];
        assert!(store.validate().is_ok());
        store.cluster.push("redis://127.0.0.1:7002/3".into());
        assert_eq!(store.validate().unwrap_err().key, "store.cluster[2]");
        store.cluster = vec!["http://x".into()];
        assert_eq!(store.validate().unwrap_err().key, "store.cluster[0]");
    }

    #[test]
    fn sentinel_needs_a_master_name_and_sentinels_and_excludes_cluster() {
        let mut store = redis_store();
        store.sentinel = Some(SentinelConfig {
            master: "mymaster".into(),
            urls: vec!["redis://127.0.0.1:26379".into()],
        });
        assert!(store.validate().is_ok());
        store.cluster = vec!["redis://127.0.0.1:7000".into()];
        assert_eq!(store.validate().unwrap_err().key, "store.sentinel");
        store.cluster.clear();
        store.sentinel = Some(SentinelConfig {
            master: String::new(),
            urls: vec!["redis://127.0.0.1:26379".into()],
        });
        assert_eq!(store.validate().unwrap_err().key, "store.sentinel.master");
    }

    #[test]
    fn a_prefix_with_braces_is_refused() {
        let mut store = redis_store();
        store.key_prefix = "tg{x}".into();
        assert_eq!(store.validate().unwrap_err().key, "store.key_prefix");
    }
}
