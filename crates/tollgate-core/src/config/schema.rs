//! The configuration's types as the file spells them, their defaults and their bounds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::base::calendar::Period;
use crate::base::rate::RateSpec;
use crate::base::timings::Timings;
use crate::erl::config::ErlConfig;

/// Allowed `client_ip.ipv6_prefix`: shorter than /32 would put whole providers in one bucket.
pub const IPV6_PREFIXES: std::ops::RangeInclusive<u8> = 32..=128;

/// Longest full-refill time (`burst / rate`) accepted: ten years. The store keeps a bucket for
/// up to twice that, in milliseconds (6.3e11), which `PEXPIRE` takes and Lua prints as an
/// integer; a longer refill is a misconfiguration, not a rate limit.
pub const MAX_REFILL_SECS: f64 = 10.0 * 365.0 * 86_400.0;

/// Largest `burst` (and so `cost`): far inside the range where floats hold integers exactly.
pub const MAX_BURST: u64 = 1_000_000_000;
/// How long a lease nobody released lives, unless `lease_ttl_s` says otherwise.
pub const DEFAULT_LEASE_TTL_S: u64 = 60;
/// The longest `lease_ttl_s`: a day.
pub const MAX_LEASE_TTL_S: u64 = 86_400;
/// How long a reservation is held unsettled, unless `reservation_ttl_s` says otherwise.
pub const DEFAULT_RESERVATION_TTL_S: u64 = 300;

/// Largest cost a request or a report may carry: what the largest bucket holds. A bigger one
/// (a `cost_header` value past it, even past 2^64 - 1) is read as [`OVER_COST`].
pub const MAX_COST: u64 = MAX_BURST;

/// The cost a request asking for more than [`MAX_COST`] is charged with: above every burst
/// and quota, so it is denied (and never charged), as any cost above the burst is.
pub const OVER_COST: u64 = MAX_COST + 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// Names the admin API may be reached by (its `Host` header), besides IP literals and
    /// `localhost`: a page that rebinds its own name to this address cannot read the API.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub admin_hosts: Vec<String>,
    /// Envoy's rate limit service (gRPC); absent = off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_listen: Option<SocketAddr>,
    /// TLS (and mutual TLS) on `grpc_listen`; absent = plain HTTP/2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_tls: Option<super::grpc_tls::GrpcTlsConfig>,
    /// Most connections `grpc_listen` holds at once; absent = half the process's descriptor
    /// limit (at most [`DEFAULT_GRPC_MAX_CONNECTIONS`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_max_connections: Option<u32>,
    pub store: StoreConfig,
    pub client_ip: ClientIpConfig,
    pub response: ResponseConfig,
    pub log: LogConfig,
    /// Requests admitted before any limit is looked at; the first matching rule wins.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exempt: Vec<ExemptConfig>,
    pub limits: Vec<LimitConfig>,
    /// envoyproxy/ratelimit's descriptor rules, served over gRPC as it serves them.
    #[serde(skip_serializing_if = "ErlConfig::is_empty")]
    pub envoy: ErlConfig,
    /// OpenTelemetry spans of the decisions, exported over OTLP.
    #[serde(skip_serializing_if = "super::trace::TracingConfig::is_default")]
    pub tracing: super::trace::TracingConfig,
    /// Envoy's quota service (RLQS): shares of limits for the `rate_limit_quota` filter.
    #[serde(skip_serializing_if = "super::rlqs::RlqsConfig::is_default")]
    pub rlqs: super::rlqs::RlqsConfig,
    /// This instance serves a region of the global limits (`scope = "global"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<super::regions::RegionConfig>,
    /// This instance keeps the regions' shares of the global limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home: Option<super::regions::HomeConfig>,
    /// Bearer token for the admin listener's mutating requests (`POST /report`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<Secret>,
    /// A file holding that token (a mounted Kubernetes secret); trailing whitespace is ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<PathBuf>,
    /// The secret key values' fingerprints are salted with; absent: derived from the admin
    /// token, else drawn at random per process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint_salt: Option<Secret>,
    /// A file holding that salt; trailing whitespace is ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint_salt_file: Option<PathBuf>,
    /// The intervals of the background duties (see [`crate::base::timings`]): not a key, no
    /// file or `TOLLGATE_*` key sets it; the production values unless the testing-only
    /// `TOLLGATE_TEST_TIMINGS_SCALE` divides them.
    #[serde(skip)]
    pub timings: Timings,
    /// The variables of envoyproxy/ratelimit's environment read at load, each with the key it
    /// set (never its value: some are passwords): what `validate` shows of that environment.
    /// Not a key.
    #[serde(skip)]
    pub erl_env_read: Vec<(&'static str, &'static str)>,
}

/// A value that must never reach a log line or `validate` output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
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
    /// A CA of one's own and a client certificate for `rediss://` (see `store_tls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<super::tls_files::TlsFiles>,
    pub timeout_ms: u64,
    pub key_prefix: String,
    pub on_error: OnError,
    /// Upper bound on buckets held in process memory, for each of: the memory store, the
    /// `local` fallback, the deny cache.
    pub max_buckets: usize,
    /// Answer denials Redis would surely repeat without asking it (see `deny_cache`). Off
    /// when something else edits buckets in Redis (e.g. support staff resetting a quota) and
    /// that must take effect at once rather than when the cached window ends.
    pub deny_cache: bool,
    /// How often each instance asks Redis whether a runtime override changed: how soon a
    /// change is in force everywhere, against one small script call per instance and period.
    pub override_poll_ms: u64,
    /// Whether limits borrow tokens when they say nothing (`limits[].borrow`); on by
    /// default, for every limit that can borrow. Only the Redis store borrows.
    pub borrow: bool,
    /// How long an instance admits from a slice of borrowed tokens, at most.
    pub borrow_horizon_ms: u64,
    /// The longest horizon a key too slow for `borrow_horizon_ms` may borrow for (rungs ten
    /// times apart); equal to `borrow_horizon_ms`: one horizon for every key.
    pub borrow_longest_horizon_ms: u64,
    /// How long the first check queued on a worker waits for others before their script call
    /// goes out (0: none, the call goes once the worker has polled for more; see
    /// `store::redis::coalesce`). Fewer, larger calls cost Redis less CPU, each check up to
    /// this much more latency.
    pub coalesce_window_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// The name the sentinels monitor.
    pub master: String,
    /// The sentinels: each URL's scheme, username and password are that sentinel's own.
    pub urls: Vec<String>,
    /// TLS to the master: `true` or `false`, said apart from the sentinels'. Absent:
    /// `store.url`'s scheme says (`rediss://`), as before this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_tls: Option<bool>,
    /// The master's ACL user; absent: `store.url`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_username: Option<String>,
    /// The master's password; absent: `store.url`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_password: Option<Secret>,
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
    /// An error, for the caller to decide on: gRPC an error status (Envoy's
    /// `failure_mode_deny` decides, as with envoyproxy/ratelimit), HTTP a 503.
    Error,
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `sampled`: a JSON line per denied (limit, key) at most every 10 s, 100 lines/s in all.
    pub denials: DenialLogging,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenialLogging {
    #[default]
    Off,
    Sampled,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponseConfig {
    pub deny_status: u16,
    pub headers: Vec<HeaderFamily>,
    /// The families on gRPC answers (`response_headers_to_add`); `None`: those of `headers`.
    /// In envoyproxy/ratelimit's environment `None` becomes none at all, as it sends none.
    pub grpc_headers: Option<Vec<HeaderFamily>>,
    /// The names of the `ratelimit` family's three headers.
    pub ratelimit_names: RatelimitNames,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeaderFamily {
    Ietf,
    XRatelimit,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (earlier drafts of the IETF
    /// work; envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED`), renamable.
    Ratelimit,
}

/// `[response.ratelimit_names]`: envoyproxy/ratelimit's defaults, which its `LIMIT_*_HEADER`
/// variables rename.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RatelimitNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for RatelimitNames {
    fn default() -> Self {
        RatelimitNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    pub name: String,
    /// A bucket's refill; absent (0) on a quota limit.
    #[serde(default)]
    pub rate: RateSpec,
    /// A bucket's capacity; absent (0) on a quota limit.
    #[serde(default)]
    pub burst: u64,
    /// At most this many per `period`, instead of `rate` and `burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    /// At most this many requests in flight per key (leases), instead of `rate` and `burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
    /// Seconds after which a lease nobody released expires (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl_s: Option<u64>,
    /// Who charges this limit: `/check` (default) or `POST /report`.
    #[serde(default)]
    pub charge: Charge,
    /// How far a report may drive the bucket below 0 (default: its burst).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_debt: Option<u64>,
    pub key: Vec<String>,
    #[serde(default = "one")]
    pub cost: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_header: Option<String>,
    /// A `charge = "report"` bucket's estimate of a request's cost, reserved at `/check`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<u64>,
    /// A request header carrying the estimate (the larger of it and `reserve` is reserved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve_header: Option<String>,
    /// Seconds a reservation is held unsettled (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_ttl_s: Option<u64>,
    /// What an unsettled reservation's estimate does when it expires (default: kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_reservation_expiry: Option<ReservationExpiry>,
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
    /// Take slices of a hot key's tokens and admit from them locally (default: the store's
    /// `borrow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow: Option<bool>,
    /// `"global"`: one limit across regions (`[region]`, `[home]`); default `"local"`.
    #[serde(default, skip_serializing_if = "super::regions::Scope::is_local")]
    pub scope: super::regions::Scope,
}

/// What becomes of a reservation nobody settled in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationExpiry {
    /// The request is taken to have cost its estimate: the safe side.
    #[default]
    Keep,
    /// The estimate is given back (at the bucket's next check or settle).
    Refund,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Charge {
    /// `/check` charges the cost when it admits.
    #[default]
    Request,
    /// `/check` admits while the limit is not used up and charges nothing; `POST /report`
    /// charges what the request really cost, once it is known.
    Report,
}

impl LimitConfig {
    /// The bucket's burst or the quota: the most one period or one full bucket admits.
    pub fn capacity(&self) -> u64 {
        self.concurrency.or(self.quota).unwrap_or(self.burst)
    }

    /// How far below 0 a report may drive the bucket.
    pub fn max_debt(&self) -> u64 {
        self.max_debt.unwrap_or(self.burst)
    }
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
    /// A quota limit's quota for this key (its period stays the limit's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
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
            ..MatchConfig::default()
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
    /// gRPC only: the request's domain is one of these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
    /// gRPC only: the descriptor carries each of these keys with one of the listed values.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub descriptors: BTreeMap<String, Vec<String>>,
}

fn one() -> u64 {
    1
}

/// The most `grpc_max_connections` defaults to, however high the descriptor limit.
pub const DEFAULT_GRPC_MAX_CONNECTIONS: u32 = 65_536;

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            admin_listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            admin_hosts: Vec::new(),
            grpc_listen: None,
            grpc_tls: None,
            grpc_max_connections: None,
            store: StoreConfig::default(),
            client_ip: ClientIpConfig::default(),
            response: ResponseConfig::default(),
            log: LogConfig::default(),
            exempt: Vec::new(),
            limits: vec![LimitConfig {
                name: "per-ip".into(),
                rate: RateSpec::PerSecond(20.0),
                burst: 100,
                quota: None,
                period: None,
                concurrency: None,
                lease_ttl_s: None,
                charge: Charge::Request,
                max_debt: None,
                key: vec!["ip".into()],
                cost: 1,
                cost_header: None,
                reserve: None,
                reserve_header: None,
                reservation_ttl_s: None,
                on_reservation_expiry: None,
                shadow: false,
                on_missing: OnMissing::Skip,
                matching: MatchConfig::default(),
                overrides: Vec::new(),
                overrides_file: None,
                borrow: None,
                scope: super::regions::Scope::Local,
            }],
            envoy: ErlConfig::default(),
            tracing: super::trace::TracingConfig::default(),
            rlqs: super::rlqs::RlqsConfig::default(),
            region: None,
            home: None,
            admin_token: None,
            admin_token_file: None,
            fingerprint_salt: None,
            fingerprint_salt_file: None,
            timings: Timings::default(),
            erl_env_read: Vec::new(),
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
            override_poll_ms: 250,
            borrow: true,
            borrow_horizon_ms: 100,
            borrow_longest_horizon_ms: 10_000,
            coalesce_window_ms: 0,
            tls: None,
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
            grpc_headers: None,
            ratelimit_names: RatelimitNames::default(),
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
}
