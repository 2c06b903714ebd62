//! What serde cannot check in the settings around the limits (ranges, URLs), and the
//! warnings `tollgate validate` prints about valid but probably unmeant configurations.
use super::{
    Backend, Config, ConfigError, MatchConfig, StoreConfig, IPV6_PREFIXES, MAX_BURST,
    MAX_REFILL_SECS,
};

// Rules every limit, override and exempt rule must follow; applied where each is built.

/// `[a-z0-9_-]+`, at most 64 characters: names become keys, headers and metric labels.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A DNS name as a `Host` header carries it (without the port): labels of letters, digits and
/// `-`, joined by dots, at most 253 characters; one trailing dot allowed.
pub fn valid_host_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// A burst must hold at least one token and the configured cost.
pub fn check_burst(burst: u64, cost: u64, key: &str) -> Result<(), ConfigError> {
    if burst == 0 || burst > MAX_BURST {
        return Err(ConfigError::new(
            key,
            format!("must be between 1 and {MAX_BURST}"),
        ));
    }
    if cost > burst {
        return Err(ConfigError::new(
            key,
            format!("burst {burst} is below the cost {cost}: no request could ever pass"),
        ));
    }
    Ok(())
}

/// The store keeps a bucket for up to twice its refill time, in milliseconds, which must stay
/// an exact integer for `PEXPIRE` and Lua: at most [`MAX_REFILL_SECS`] (ten years). A bucket
/// in debt (`charge = "report"`, `debt` its `max_debt`, else 0) refills its debt too before
/// it may expire, so the bound is on `(burst + debt) / rate`. Also catches a rate so small
/// that the quotient overflows to infinity.
#[expect(
    clippy::cast_precision_loss,
    reason = "compared with ten years only: a burst rounded beyond 2^53 is refused all the same"
)]
pub fn check_refill(rate: f64, burst: u64, debt: u64, key: &str) -> Result<(), ConfigError> {
    let refill = burst.saturating_add(debt) as f64 / rate;
    if refill > MAX_REFILL_SECS || refill.is_nan() {
        let what = if debt > 0 {
            format!("the burst of {burst} and a max_debt of {debt}")
        } else {
            format!("the burst of {burst}")
        };
        return Err(ConfigError::new(
            key,
            format!(
                "refills {what} in {refill:e} s; at most ten years ({MAX_REFILL_SECS} s) is \
                 supported"
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// Checks what serde cannot in the settings around the limits: ranges, CIDRs, URLs. Limits
    /// and exemptions are checked where they are built (`Policy::compile`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.store.validate()?;
        self.envoy.check()?;
        self.tracing.validate()?;
        self.rlqs.check(self.grpc_listen.is_some())?;
        super::regions::check(
            self.region.as_ref(),
            self.home.as_ref(),
            &self.limits,
            self.grpc_listen.is_some(),
        )?;
        if let Some(tls) = &self.grpc_tls {
            if self.grpc_listen.is_none() {
                return Err(ConfigError::new(
                    "grpc_tls",
                    "applies only with grpc_listen set",
                ));
            }
            tls.load()?;
        }
        if self.grpc_max_connections == Some(0) {
            return Err(ConfigError::new(
                "grpc_max_connections",
                "must be at least 1 (leave it out for half the descriptor limit)",
            ));
        }
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
        self.admin_token()?;
        self.fingerprint_salt()?;
        for (i, host) in self.admin_hosts.iter().enumerate() {
            if !valid_host_name(host) {
                return Err(ConfigError::new(
                    format!("admin_hosts[{i}]"),
                    format!(
                        "{host:?} is not a host name (letters, digits, '-' and '.', at most 253 \
                         characters, no port; IP literals and localhost are always accepted)"
                    ),
                ));
            }
        }
        Ok(())
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

impl MatchConfig {
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
}

impl StoreConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.timeout_ms == 0 || self.timeout_ms > 60_000 {
            return Err(ConfigError::new(
                "store.timeout_ms",
                "must be between 1 and 60000",
            ));
        }
        if !(10..=60_000).contains(&self.override_poll_ms) {
            return Err(ConfigError::new(
                "store.override_poll_ms",
                "must be between 10 and 60000",
            ));
        }
        if !(10..=10_000).contains(&self.borrow_horizon_ms) {
            return Err(ConfigError::new(
                "store.borrow_horizon_ms",
                "must be between 10 and 10000",
            ));
        }
        if !(self.borrow_horizon_ms..=60_000).contains(&self.borrow_longest_horizon_ms) {
            return Err(ConfigError::new(
                "store.borrow_longest_horizon_ms",
                "must be between store.borrow_horizon_ms and 60000",
            ));
        }
        // A check waits out the window within its timeout: it would leave no time for Redis.
        if self.coalesce_window_ms > 100 || self.coalesce_window_ms >= self.timeout_ms {
            return Err(ConfigError::new(
                "store.coalesce_window_ms",
                "must be between 0 and 100, and below store.timeout_ms",
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
            one_scheme("store.sentinel.urls", &sentinel.urls)?;
            sentinel.check_master_keys(&self.url)?;
        }
        one_scheme("store.cluster", &self.cluster)?;
        let links = self.links();
        if let Some(tls) = &self.tls {
            if !links.iter().any(|link| link.tls) {
                return Err(ConfigError::new(
                    "store.tls",
                    "applies only with a rediss:// URL",
                ));
            }
            super::store_tls::load(tls)?;
        }
        // TLS asked for on the sentinels' side must not leave the data in clear on the
        // master's, unless that is said outright.
        if let Some(sentinel) = &self.sentinel {
            let master_tls = links.first().is_some_and(|link| link.tls);
            let sentinels_tls = links.get(1).is_some_and(|link| link.tls);
            if !master_tls && sentinel.master_tls.is_none() && (sentinels_tls || self.tls.is_some())
            {
                return Err(ConfigError::new(
                    "store.sentinel.master_tls",
                    "unset, so the master would be spoken to in clear while TLS is asked for \
                     (rediss:// sentinels or store.tls): set it true, or false to mean it",
                ));
            }
        }
        Ok(())
    }
}

/// Every URL of a list speaks TLS, or none does: the client takes one mode for them all.
fn one_scheme(key: &str, urls: &[String]) -> Result<(), ConfigError> {
    let tls = |url: &String| url.starts_with("rediss://");
    match urls
        .iter()
        .position(|url| tls(url) != urls.first().is_some_and(tls))
    {
        Some(i) => Err(ConfigError::new(
            format!("{key}[{i}]"),
            "mixes rediss:// and redis://: all TLS or none",
        )),
        None => Ok(()),
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
    use crate::config::SentinelConfig;

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
        store.sentinel = Some(sentinel("mymaster", &["redis://127.0.0.1:26379"]));
        assert!(store.validate().is_ok());
        store.cluster = vec!["redis://127.0.0.1:7000".into()];
        assert_eq!(store.validate().unwrap_err().key, "store.sentinel");
        store.cluster.clear();
        store.sentinel = Some(sentinel("", &["redis://127.0.0.1:26379"]));
        assert_eq!(store.validate().unwrap_err().key, "store.sentinel.master");
    }

    fn sentinel(master: &str, urls: &[&str]) -> SentinelConfig {
        SentinelConfig {
            master: master.into(),
            urls: urls.iter().map(|u| u.to_string()).collect(),
            master_tls: None,
            master_username: None,
            master_password: None,
        }
    }

    /// TLS on one side only is refused where it leaves the master in clear, unless
    /// `master_tls = false` says so; a master said twice in disagreement is refused.
    #[test]
    fn sentinel_tls_on_one_side_only_is_refused_unless_said() {
        let mut store = redis_store();
        store.sentinel = Some(sentinel("m", &["rediss://127.0.0.1:26379"]));
        assert_eq!(
            store.validate().unwrap_err().key,
            "store.sentinel.master_tls"
        );
        store.sentinel.as_mut().unwrap().master_tls = Some(false);
        assert!(store.validate().is_ok(), "plaintext master, said outright");
        store.sentinel.as_mut().unwrap().master_tls = Some(true);
        assert!(store.validate().is_ok());
        store.url = "rediss://127.0.0.1:6379/0".into();
        store.sentinel.as_mut().unwrap().master_tls = None;
        assert!(
            store.validate().is_ok(),
            "the master is rediss:// by store.url"
        );
        store.sentinel.as_mut().unwrap().master_tls = Some(false);
        assert_eq!(
            store.validate().unwrap_err().key,
            "store.sentinel.master_tls"
        );
        store.url = "redis://:pw@127.0.0.1:6379/0".into();
        let said = store.sentinel.as_mut().unwrap();
        said.master_tls = Some(true);
        said.master_password = Some(crate::config::Secret("pw".into()));
        assert_eq!(
            store.validate().unwrap_err().key,
            "store.sentinel.master_password"
        );
        store.url = StoreConfig::default().url;
        store.sentinel = Some(sentinel(
            "m",
            &["rediss://127.0.0.1:26379", "redis://127.0.0.1:26380"],
        ));
        assert_eq!(store.validate().unwrap_err().key, "store.sentinel.urls[1]");
        store.sentinel = None;
        store.cluster = vec!["redis://a:7000".into(), "rediss://b:7001".into()];
        assert_eq!(store.validate().unwrap_err().key, "store.cluster[1]");
    }

    #[test]
    fn a_prefix_with_braces_is_refused() {
        let mut store = redis_store();
        store.key_prefix = "tg{x}".into();
        assert_eq!(store.validate().unwrap_err().key, "store.key_prefix");
    }
}
