//! envoyproxy/ratelimit's environment: one table of its variables, a row each (its name, its
//! default, the tollgate key it sets, how its Go code parses it, when it is read, when tollgate
//! refuses it), and the one place they are read. The table drives the reading (each value
//! parsed as its Go type, the default when unset), the refusals that name a variable (exit 2,
//! one line), what `validate` prints of the environment (the variables read and the key each
//! set: `Config::erl_env_read`), and the table of docs/REFERENCE.md ([`reference_table`]; a
//! test keeps the two equal).
//!
//! It is read when `RUNTIME_ROOT` or `RUNTIME_SUBDIRECTORY` is set, or `CONFIG_TYPE` is `FILE`
//! or `GRPC_XDS_SOTW` (deployments fed over xDS often set no `RUNTIME_*`); never otherwise, so
//! that a generic `PORT` never moves a tollgate that is not standing in for it. What it sets
//! wins over the file. What each group of variables sets is applied in `apply` and its
//! siblings (`redis`, `tls`, `xds`, `metrics`, `headers`, `tracing`), which ask this file for
//! the values.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::base::go;
use crate::config::ConfigError;

mod apply;
mod headers;
mod metrics;
mod redis;
mod tls;
mod tracing;
mod xds;

pub use apply::apply_erl_env;

/// One variable of envoyproxy/ratelimit's environment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Var {
    pub name: &'static str,
    /// What applies when it is unset, as its Go code reads it (empty: nothing).
    pub default: &'static str,
    /// The tollgate key it sets (empty: none; it is only ever refused).
    pub sets: &'static str,
    /// How envoyproxy/ratelimit's Go code parses it: a value that does not parse so stops it,
    /// and stops tollgate too, rather than meaning its default.
    pub go: Go,
    /// When it is read (empty: always, in its environment).
    pub read: &'static str,
    /// When tollgate refuses it, beyond a value its Go type does not parse.
    pub refused: Refused,
}

/// How Go reads a variable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Go {
    /// `strconv.ParseBool`: `1 t T TRUE true True 0 f F FALSE false False`.
    Bool,
    /// `time.ParseDuration`: `300ms`, `1.5s`, `1m30s`.
    Duration,
    Int,
    Float,
    Text,
    Path,
    /// `host:port`.
    HostPort,
    /// A listen address, `[host]:port`.
    Address,
    Url,
    /// Comma-separated entries.
    List,
    /// One of these words, spelled exactly unless the row says otherwise.
    OneOf(&'static [&'static str]),
}

/// When tollgate refuses a variable (exit 2, naming it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refused {
    /// Only when its Go type does not parse it.
    Unparsed,
    /// Set true: envoyproxy/ratelimit would do what tollgate cannot (the reason).
    IfTrue(&'static str),
    /// Set and not empty: as [`Refused::IfTrue`].
    IfSet(&'static str),
    /// When its value says this (the code that applies it checks).
    When(&'static str),
}

use Go::{Address, Bool, Float, HostPort, Int, List, OneOf, Path, Text, Url};
use Refused::{IfSet, IfTrue, Unparsed, When};

/// The table: `NAME: default, sets, Go type, read when, refused when;`, one row each, in the
/// order of docs/REFERENCE.md.
macro_rules! variables {
    ($($name:ident: $default:literal, $sets:literal, $go:expr, $read:literal, $refused:expr;)*) => {
        $(
            pub const $name: Var = Var {
                name: stringify!($name),
                default: $default,
                sets: $sets,
                go: $go,
                read: $read,
                refused: $refused,
            };
        )*
        /// Every variable, in the order of docs/REFERENCE.md.
        pub const VARS: &[Var] = &[$($name),*];
    };
}

#[rustfmt::skip]
variables! {
    // Whether this is its environment, and where its YAML is.
    RUNTIME_ROOT: "/srv/runtime_data/current", "envoy.config_dir", Path, "", Unparsed;
    RUNTIME_SUBDIRECTORY: "", "envoy.config_dir", Path, "", Unparsed;
    RUNTIME_APPDIRECTORY: "config", "envoy.config_dir", Path, "", Unparsed;
    CONFIG_TYPE: "FILE", "envoy.xds", OneOf(&["FILE", "GRPC_XDS_SOTW"]), "", When("anything else, `file` included");
    // Its listeners.
    GRPC_HOST: "0.0.0.0", "grpc_listen", Text, "", When("not an IP address");
    GRPC_PORT: "8081", "grpc_listen", Int, "", When("not a decimal port (a leading `0` is octal to Go)");
    HOST: "0.0.0.0", "listen", Text, "", When("not an IP address");
    PORT: "8080", "listen", Int, "", When("not a decimal port (a leading `0` is octal to Go)");
    GRPC_UDS: "", "", Path, "", IfSet("a unix socket for gRPC is not supported: unset it and use GRPC_HOST/GRPC_PORT");
    GRPC_SERVER_USE_TLS: "false", "grpc_tls", Bool, "", Unparsed;
    GRPC_SERVER_TLS_CERT: "", "grpc_tls.cert_file", Path, "with `GRPC_SERVER_USE_TLS` true", When("unset, missing or not a PEM certificate");
    GRPC_SERVER_TLS_KEY: "", "grpc_tls.key_file", Path, "with `GRPC_SERVER_USE_TLS` true", When("unset, missing, or not the certificate's key");
    GRPC_CLIENT_TLS_CACERT: "", "grpc_tls.client_ca_file", Path, "with `GRPC_SERVER_USE_TLS` true", When("missing or not PEM certificates");
    GRPC_CLIENT_TLS_SAN: "", "grpc_tls.client_san", Text, "with `GRPC_SERVER_USE_TLS` true", When("without `GRPC_CLIENT_TLS_CACERT`, or neither a DNS name nor an IP address");
    // Its store.
    BACKEND_TYPE: "redis", "store.backend", OneOf(&["redis", ""]), "", When("anything else (`REDIS` and `memcache` included)");
    REDIS_URL: "", "store.url", Text, "", When("unset; not `host:port`, an absolute socket path, or the list `REDIS_TYPE` asks for");
    REDIS_TYPE: "SINGLE", "store.url", OneOf(&["single", "sentinel", "cluster"]), "", When("anything else (any case is one)");
    REDIS_SOCKET_TYPE: "unix", "store.url", OneOf(&["tcp", "unix"]), "with `REDIS_TYPE` single", When("anything else, or unset or `unix` with a `host:port` `REDIS_URL`");
    REDIS_AUTH: "", "store.url", Text, "", When("`user:` (an empty password)");
    REDIS_SENTINEL_AUTH: "", "store.sentinel.urls", Text, "with `REDIS_TYPE` sentinel", When("`user:` (an empty password)");
    REDIS_TLS: "false", "store.url", Bool, "", When("true over a unix socket");
    REDIS_TLS_CACERT: "", "store.tls.ca_file", Path, "with `REDIS_TLS` true", When("missing or not PEM certificates");
    REDIS_TLS_CLIENT_CERT: "", "store.tls.cert_file", Path, "with `REDIS_TLS` true", When("without its key, missing or not a PEM certificate");
    REDIS_TLS_CLIENT_KEY: "", "store.tls.key_file", Path, "with `REDIS_TLS` true", When("without its certificate, missing, or not the certificate's key");
    REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: "false", "", Bool, "", IfTrue("the Redis server's name is always verified");
    REDIS_TIMEOUT: "", "store.timeout_ms", Go::Duration, "", When("`0`, or more than a minute");
    REDIS_PERSECOND: "false", "", Bool, "", IfTrue("tollgate keeps every limit in REDIS_URL's Redis");
    REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: "false", "", Bool, "", IfTrue("readiness follows store.on_error (\"deny\": not ready while Redis fails)");
    // Its rules and answers.
    SHADOW_MODE: "false", "envoy.shadow_mode", Bool, "", Unparsed;
    QUOTA_MODE: "false", "envoy.quota_mode", Bool, "", Unparsed;
    RESPONSE_DYNAMIC_METADATA: "false", "envoy.dynamic_metadata", Bool, "", Unparsed;
    MERGE_DOMAIN_CONFIG: "false", "envoy.merge_domains", Bool, "", Unparsed;
    LIMIT_RESPONSE_HEADERS_ENABLED: "false", "envoy.response_headers", Bool, "", Unparsed;
    LIMIT_LIMIT_HEADER: "RateLimit-Limit", "response.ratelimit_names.limit", Text, "with `LIMIT_RESPONSE_HEADERS_ENABLED` true", When("not a header name");
    LIMIT_REMAINING_HEADER: "RateLimit-Remaining", "response.ratelimit_names.remaining", Text, "with `LIMIT_RESPONSE_HEADERS_ENABLED` true", When("not a header name");
    LIMIT_RESET_HEADER: "RateLimit-Reset", "response.ratelimit_names.reset", Text, "with `LIMIT_RESPONSE_HEADERS_ENABLED` true", When("not a header name");
    // Its xDS config source.
    CONFIG_GRPC_XDS_SERVER_URL: "localhost:18000", "envoy.xds.server", HostPort, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", When("not `host:port`");
    CONFIG_GRPC_XDS_NODE_ID: "default", "envoy.xds.node_id", Text, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", When("empty");
    CONFIG_GRPC_XDS_NODE_METADATA: "", "envoy.xds.node_metadata", List, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", Unparsed;
    CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL: "3s", "envoy.xds.retry_ms", Go::Duration, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", When("`0`, or more than an hour");
    CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: "", "envoy.xds.headers", List, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", When("an entry not `name:value`, or what gRPC metadata cannot carry");
    XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES: "", "envoy.xds.max_message_bytes", Int, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", When("more than 64 MiB");
    FORCE_START_WITHOUT_INITIAL_CONFIG: "false", "envoy.xds.ready_before_config", Bool, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", Unparsed;
    HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: "false", "envoy.xds.ready_before_config", Bool, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", Unparsed;
    CONFIG_GRPC_XDS_SERVER_USE_TLS: "false", "envoy.xds.tls", Bool, "with `CONFIG_TYPE=GRPC_XDS_SOTW`", Unparsed;
    CONFIG_GRPC_XDS_SERVER_TLS_CACERT: "", "envoy.xds.ca_file", Path, "with `CONFIG_GRPC_XDS_SERVER_USE_TLS` true", When("missing");
    CONFIG_GRPC_XDS_CLIENT_TLS_CERT: "", "envoy.xds.cert_file", Path, "with `CONFIG_GRPC_XDS_SERVER_USE_TLS` true", When("without its key, or missing");
    CONFIG_GRPC_XDS_CLIENT_TLS_KEY: "", "envoy.xds.key_file", Path, "with `CONFIG_GRPC_XDS_SERVER_USE_TLS` true", When("without its certificate, or missing");
    CONFIG_GRPC_XDS_SERVER_TLS_SAN: "", "envoy.xds.server_name", Text, "with `CONFIG_GRPC_XDS_SERVER_USE_TLS` true", Unparsed;
    // Its metrics.
    DISABLE_STATS: "false", "envoy.metrics", Bool, "", Unparsed;
    USE_PROMETHEUS: "false", "envoy.metrics.prometheus_listen", Bool, "", When("true with `USE_STATSD` true: one stats sink at a time");
    PROMETHEUS_ADDR: ":9090", "envoy.metrics.prometheus_listen", Address, "with `USE_PROMETHEUS` true", When("not a listen address");
    PROMETHEUS_PATH: "/metrics", "envoy.metrics.prometheus_path", Text, "with `USE_PROMETHEUS` true", When("not starting with `/`");
    PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS: "false", "envoy.metrics.response_time_ms", Bool, "with `USE_PROMETHEUS` true", Unparsed;
    PROMETHEUS_MAPPER_YAML: "", "envoy.metrics.response_time_ms", Path, "with `USE_PROMETHEUS` true", When("unreadable, or not its built-in mapping");
    USE_STATSD: "true", "envoy.metrics.statsd", Bool, "", Unparsed;
    STATSD_HOST: "localhost", "envoy.metrics.statsd", Text, "with `USE_STATSD` true", When("empty");
    STATSD_PORT: "8125", "envoy.metrics.statsd", Int, "with `USE_STATSD` true", When("above 65535");
    STATSD_PROTOCOL: "tcp", "envoy.metrics.statsd_protocol", OneOf(&["tcp", "udp"]), "with `USE_STATSD` true", When("neither (`tcp4`, `udp6`... are the same)");
    STATS_FLUSH_INTERVAL: "10s", "envoy.metrics.flush_interval_ms", Go::Duration, "with `USE_STATSD` true", When("under a millisecond");
    NEAR_LIMIT_RATIO: "0.8", "envoy.metrics.near_limit_ratio", Float, "", When("negative");
    USE_DOG_STATSD: "false", "", Bool, "", IfTrue("tollgate sends plain statsd (USE_STATSD) or serves Prometheus");
    EXTRA_TAGS: "", "", List, "", IfSet("extra tags on the stats are not supported");
    // Its tracing, and the OpenTelemetry SDK's exporter variables (`_TRACES_` ones win).
    TRACING_ENABLED: "false", "tracing.enabled", Bool, "", Unparsed;
    TRACING_SERVICE_NAME: "RateLimit", "tracing.service_name", Text, "with `TRACING_ENABLED` true", Unparsed;
    TRACING_SERVICE_NAMESPACE: "", "tracing.service_namespace", Text, "with `TRACING_ENABLED` true", Unparsed;
    TRACING_SERVICE_INSTANCE_ID: "", "tracing.service_instance_id", Text, "with `TRACING_ENABLED` true", Unparsed;
    TRACING_SAMPLING_RATE: "1", "tracing.sampling_rate", Float, "with `TRACING_ENABLED` true", Unparsed;
    TRACING_EXPORTER_PROTOCOL: "http", "tracing.protocol", OneOf(&["http", "grpc"]), "with `TRACING_ENABLED` true", When("anything else");
    OTEL_EXPORTER_OTLP_ENDPOINT: "", "tracing.endpoint", Url, "with `TRACING_ENABLED` true", When("`https://`, or `host:port` without `INSECURE` true");
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "", "tracing.endpoint", Url, "with `TRACING_ENABLED` true", When("`https://`, or `host:port` without `INSECURE` true");
    OTEL_EXPORTER_OTLP_HEADERS: "", "tracing.headers", List, "with `TRACING_ENABLED` true", When("not `key=value,...`");
    OTEL_EXPORTER_OTLP_TRACES_HEADERS: "", "tracing.headers", List, "with `TRACING_ENABLED` true", When("not `key=value,...`");
    OTEL_EXPORTER_OTLP_TIMEOUT: "", "tracing.timeout_ms", Int, "with `TRACING_ENABLED` true", Unparsed;
    OTEL_EXPORTER_OTLP_TRACES_TIMEOUT: "", "tracing.timeout_ms", Int, "with `TRACING_ENABLED` true", Unparsed;
    OTEL_EXPORTER_OTLP_INSECURE: "false", "tracing.endpoint", Bool, "with `TRACING_ENABLED` true", Unparsed;
    OTEL_EXPORTER_OTLP_TRACES_INSECURE: "false", "tracing.endpoint", Bool, "with `TRACING_ENABLED` true", Unparsed;
    OTEL_EXPORTER_OTLP_COMPRESSION: "", "", Text, "with `TRACING_ENABLED` true", When("other than `none`: exports are not compressed");
    OTEL_EXPORTER_OTLP_TRACES_COMPRESSION: "", "", Text, "with `TRACING_ENABLED` true", When("other than `none`: exports are not compressed");
    OTEL_EXPORTER_OTLP_CERTIFICATE: "", "", Path, "with `TRACING_ENABLED` true", IfSet("TLS to the collector is not supported");
    OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE: "", "", Path, "with `TRACING_ENABLED` true", IfSet("TLS to the collector is not supported");
    OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: "", "", Path, "with `TRACING_ENABLED` true", IfSet("TLS to the collector is not supported");
    OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE: "", "", Path, "with `TRACING_ENABLED` true", IfSet("TLS to the collector is not supported");
    OTEL_EXPORTER_OTLP_CLIENT_KEY: "", "", Path, "with `TRACING_ENABLED` true", IfSet("TLS to the collector is not supported");
    OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY: "", "", Path, "with `TRACING_ENABLED` true", IfSet("TLS to the collector is not supported");
}

impl Var {
    /// A refusal naming this variable.
    pub fn refuse(&self, reason: impl Into<String>) -> ConfigError {
        ConfigError::new(self.name, reason)
    }

    /// What docs/REFERENCE.md says it is refused for: a value its Go type does not parse,
    /// then the row's own case.
    fn refused_when(&self) -> String {
        let unparsed = match self.go {
            Bool => Some("not a bool"),
            Go::Duration => Some("not a duration"),
            Int | Float => Some("not a number"),
            _ => None,
        };
        let own = match self.refused {
            Unparsed => None,
            IfTrue(why) => Some(format!("true: {why}")),
            IfSet(why) => Some(format!("set: {why}")),
            When(when) => Some(when.to_string()),
        };
        match (unparsed, own) {
            (Some(unparsed), Some(own)) => format!("{unparsed}; {own}"),
            (Some(unparsed), None) => unparsed.to_string(),
            (None, Some(own)) => own,
            (None, None) => "—".to_string(),
        }
    }
}

impl Go {
    fn describe(self) -> String {
        match self {
            Bool => "bool".into(),
            Go::Duration => "duration".into(),
            Int => "int".into(),
            Float => "float".into(),
            Text => "string".into(),
            Path => "path".into(),
            HostPort => "`host:port`".into(),
            Address => "listen address".into(),
            Url => "URL".into(),
            List => "list".into(),
            OneOf(words) => words
                .iter()
                .map(|word| match *word {
                    "" => "empty".to_string(),
                    word => format!("`{word}`"),
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// The environment as it stood, read once: the value of each variable of the table, and which
/// of them the configuration asked for.
pub struct ErlEnv {
    values: BTreeMap<&'static str, String>,
    asked: RefCell<Vec<&'static str>>,
}

impl ErlEnv {
    /// Reads every variable of the table (and none other) through `var`.
    pub fn read(var: impl Fn(&str) -> Option<String>) -> ErlEnv {
        let values = VARS
            .iter()
            .filter_map(|row| Some((row.name, var(row.name)?)))
            .collect();
        ErlEnv {
            values,
            asked: RefCell::new(Vec::new()),
        }
    }

    /// Whether tollgate runs in envoyproxy/ratelimit's environment.
    pub fn is_erl(&self) -> bool {
        // CONFIG_TYPE counts only with one of its own values: another program's variable of
        // that name must not turn this on. Spelled exactly, as ERL compares them: `file` stops
        // it.
        let erl_config_type = self
            .get(&CONFIG_TYPE)
            .is_some_and(|kind| kind == "FILE" || kind == "GRPC_XDS_SOTW");
        self.get(&RUNTIME_ROOT).is_some()
            || self.get(&RUNTIME_SUBDIRECTORY).is_some()
            || erl_config_type
    }

    /// Its value, as set (the empty string included).
    pub fn get(&self, row: &Var) -> Option<&str> {
        let mut asked = self.asked.borrow_mut();
        if !asked.contains(&row.name) {
            asked.push(row.name);
        }
        self.values.get(row.name).map(String::as_str)
    }

    /// Its value unless unset or empty (as envoyproxy/ratelimit takes an empty file name).
    pub fn set(&self, row: &Var) -> Option<&str> {
        self.get(row).filter(|value| !value.is_empty())
    }

    /// Its value, or its default when unset.
    pub fn or_default(&self, row: &Var) -> &str {
        self.get(row).unwrap_or(row.default)
    }

    /// A Go boolean, its default when unset.
    pub fn flag(&self, row: &Var) -> Result<bool, ConfigError> {
        let text = self.or_default(row);
        go::parse_bool(text).ok_or_else(|| row.refuse(format!("{text:?} is not a bool")))
    }

    /// A Go duration; `None` when unset.
    pub fn duration(&self, row: &Var) -> Result<Option<Duration>, ConfigError> {
        self.get(row)
            .map(|text| {
                go::parse_duration(text)
                    .ok_or_else(|| row.refuse(format!("{text:?} is not a duration")))
            })
            .transpose()
    }

    /// Refuses what the row asks tollgate cannot do ([`Refused::IfTrue`], [`Refused::IfSet`]).
    pub fn refuse_if_asked(&self, row: &Var) -> Result<(), ConfigError> {
        match row.refused {
            IfTrue(why) if self.flag(row)? => {
                Err(row.refuse(format!("true is not supported: {why}")))
            }
            IfSet(why) => match self.set(row) {
                Some(value) => Err(row.refuse(format!("{value:?}: {why}"))),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// The variables set and asked for, each with the key it set, in the table's order.
    pub fn read_and_set(&self) -> Vec<(&'static str, &'static str)> {
        let asked = self.asked.borrow();
        VARS.iter()
            .filter(|row| asked.contains(&row.name) && self.values.contains_key(row.name))
            .map(|row| (row.name, row.sets))
            .collect()
    }
}

/// `error`, about keys the `rows` set, in the words of the environment: named by the variable
/// that set its key (`fallback` when none did), and each key in its reason by its variable.
pub fn in_words_of(error: ConfigError, rows: &[&Var], fallback: &Var) -> ConfigError {
    let sets = |row: &&&Var, key: &str| {
        !row.sets.is_empty()
            && (key == row.sets
                || key
                    .strip_prefix(row.sets)
                    .is_some_and(|rest| rest.starts_with('.')))
    };
    let name = rows
        .iter()
        .find(|row| sets(row, &error.key))
        .map_or(fallback.name, |row| row.name);
    let reason = rows
        .iter()
        .filter(|row| !row.sets.is_empty())
        .fold(error.reason, |reason, row| {
            reason.replace(row.sets, row.name)
        });
    ConfigError::new(name, reason)
}

/// Whether tollgate runs in envoyproxy/ratelimit's environment.
pub fn in_erl_env(var: impl Fn(&str) -> Option<String>) -> bool {
    ErlEnv::read(var).is_erl()
}

/// The table of docs/REFERENCE.md's "envoyproxy/ratelimit's environment", in markdown.
pub fn reference_table() -> String {
    let mut out = String::from(
        "| variable | default | sets | Go type | read | refused (exit 2) when |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    let code = |text: &str| {
        if text.is_empty() {
            "—".to_string()
        } else {
            format!("`{text}`")
        }
    };
    for row in VARS {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} |",
            row.name,
            code(row.default),
            code(row.sets),
            row.go.describe(),
            if row.read.is_empty() {
                "always"
            } else {
                row.read
            },
            row.refused_when()
        );
    }
    out
}

#[cfg(test)]
impl ErlEnv {
    /// The environment of these pairs alone.
    pub(crate) fn of(pairs: &[(&str, &str)]) -> ErlEnv {
        ErlEnv::read(|name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_string())
        })
    }
}

#[cfg(test)]
mod tests;
