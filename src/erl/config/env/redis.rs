//! envoyproxy/ratelimit's `REDIS_*` variables, meaning what they mean there (its
//! `src/settings/settings.go` and `src/redis/driver_impl.go`):
//!
//! - `REDIS_AUTH` (`password` or `user:password`, split at the first `:`) and `REDIS_TLS` are
//!   the data connection's: the one node, every Cluster node, or the master Sentinel names;
//! - `REDIS_SENTINEL_AUTH` is the sentinels'; with `REDIS_TLS` the sentinels speak TLS too;
//! - `REDIS_TIMEOUT` bounds each call, as `store.timeout_ms` (unset: tollgate's 50 ms);
//! - `REDIS_SOCKET_TYPE` (default `unix`, Go's network name: `tcp` or `unix`) counts for a
//!   single node only: a Cluster and Sentinel are reached over TCP whatever it says;
//! - `REDIS_URL` has no usable default here: there it is the nutcracker (twemproxy) socket
//!   `/var/run/nutcracker/ratelimit.sock`, through which tollgate's scripts are not known to
//!   work, so an unset `REDIS_URL` is refused rather than guessed at, whatever the file's
//!   `[store]` says. The per-instance memory store would let every replica admit the whole
//!   limit.
//!
//! Anything tollgate cannot honour exits 2 naming the variable: never a quieter store or a
//! weaker connection than the operator asked for.

use crate::base::go::parse_bool;
use crate::config::{Backend, Config, ConfigError, SentinelConfig, StoreConfig};

/// Sets `[store]` from the `REDIS_*` variables (see the module docs).
pub(super) fn apply(
    config: &mut Config,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    if flag(var, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")? {
        return Err(ConfigError::new(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            "true is not supported: the Redis server's name is always verified",
        ));
    }
    if flag(var, "REDIS_PERSECOND")? {
        return Err(ConfigError::new(
            "REDIS_PERSECOND",
            "true is not supported: tollgate keeps every limit in REDIS_URL's Redis",
        ));
    }
    let tls = flag(var, "REDIS_TLS")?;
    let timeout_ms = timeout_ms(var)?;
    // Even over a file's `[store]`: the image's default file names a local Redis, which would
    // stand in silently for the one the operator forgot to name.
    let Some(url) = var("REDIS_URL") else {
        return Err(ConfigError::new(
            "REDIS_URL",
            "is not set: envoyproxy/ratelimit would use the nutcracker socket \
             /var/run/nutcracker/ratelimit.sock; name the Redis (host:port with \
             REDIS_SOCKET_TYPE=tcp, or a socket path)",
        ));
    };
    let tls_files = crate::config::store_tls::from_erl_env(var, tls)?;
    let auth = credentials(var, "REDIS_AUTH")?;
    let kind = var("REDIS_TYPE").unwrap_or_else(|| "SINGLE".into());
    let store = &mut config.store;
    store.backend = Backend::Redis;
    store.tls = tls_files.or(store.tls.take());
    store.cluster.clear();
    if let Some(ms) = timeout_ms {
        store.timeout_ms = ms;
    }
    store.sentinel = None;
    let scheme = if tls { "rediss" } else { "redis" };
    match kind.to_ascii_lowercase().as_str() {
        "single" => store.url = single_node(var, &url, tls, auth.as_ref())?,
        "cluster" => {
            store.cluster = url
                .split(',')
                .map(|node| Ok(tcp_url(scheme, auth.as_ref(), host_port(node)?)))
                .collect::<Result<_, ConfigError>>()?;
        }
        "sentinel" => {
            let sentinel_auth = credentials(var, "REDIS_SENTINEL_AUTH")?;
            let mut parts = url.split(',');
            let master = parts.next().unwrap_or_default();
            let urls = parts
                .map(|node| Ok(tcp_url(scheme, sentinel_auth.as_ref(), host_port(node)?)))
                .collect::<Result<Vec<_>, ConfigError>>()?;
            if master.is_empty() || master.contains(char::is_whitespace) || urls.is_empty() {
                return Err(ConfigError::new(
                    "REDIS_URL",
                    "with REDIS_TYPE=sentinel is <master name>,<sentinel host:port>,...",
                ));
            }
            let (username, password) = auth.unzip();
            // The master is said by the keys below; `store.url` adds only database 0.
            store.url = StoreConfig::default().url;
            store.sentinel = Some(SentinelConfig {
                master: master.to_string(),
                urls,
                master_tls: Some(tls),
                master_username: username.flatten(),
                master_password: password.map(crate::config::Secret),
            });
        }
        _ => {
            return Err(ConfigError::new(
                "REDIS_TYPE",
                format!("{kind:?} is none of single, sentinel, cluster"),
            ))
        }
    }
    Ok(())
}

/// A Go boolean (`strconv.ParseBool`): unset is false, anything else stops tollgate as it
/// stops envoyproxy/ratelimit.
fn flag(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<bool, ConfigError> {
    var(name).map_or(Ok(false), |text| {
        parse_bool(&text).ok_or_else(|| ConfigError::new(name, format!("{text:?} is not a bool")))
    })
}

/// `REDIS_TIMEOUT`, a Go duration bounding each Redis call there as `store.timeout_ms` does
/// here; 0 (no bound there) and more than a minute are refused.
fn timeout_ms(var: &impl Fn(&str) -> Option<String>) -> Result<Option<u64>, ConfigError> {
    const NAME: &str = "REDIS_TIMEOUT";
    let Some(text) = var(NAME) else {
        return Ok(None);
    };
    let duration = crate::base::go::parse_duration(&text)
        .ok_or_else(|| ConfigError::new(NAME, format!("{text:?} is not a duration")))?;
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if duration < std::time::Duration::from_millis(1) || ms > 60_000 {
        return Err(ConfigError::new(
            NAME,
            format!("{text:?}: tollgate bounds each Redis call by 1 ms to 1 minute"),
        ));
    }
    Ok(Some(ms))
}

/// `password` or `user:password`, split at the first `:` as there; empty means none.
fn credentials(
    var: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<(Option<String>, String)>, ConfigError> {
    let Some(auth) = var(name).filter(|auth| !auth.is_empty()) else {
        return Ok(None);
    };
    match auth.split_once(':') {
        None => Ok(Some((None, auth))),
        Some((_, "")) => Err(ConfigError::new(
            name,
            "names a user with an empty password (user:password)",
        )),
        Some(("", password)) => Ok(Some((None, password.to_string()))),
        Some((user, password)) => Ok(Some((Some(user.to_string()), password.to_string()))),
    }
}

/// One node: over TCP, or (`REDIS_SOCKET_TYPE` unset or `unix`, as there) a socket path.
fn single_node(
    var: &impl Fn(&str) -> Option<String>,
    url: &str,
    tls: bool,
    auth: Option<&(Option<String>, String)>,
) -> Result<String, ConfigError> {
    let socket = var("REDIS_SOCKET_TYPE");
    match socket.as_deref() {
        Some("tcp") => {
            let scheme = if tls { "rediss" } else { "redis" };
            Ok(tcp_url(scheme, auth, host_port(url)?))
        }
        None | Some("unix") => {
            if host_port(url).is_ok() {
                return Err(ConfigError::new(
                    "REDIS_SOCKET_TYPE",
                    format!(
                        "{}, which makes REDIS_URL a socket path, but it is host:port: set \
                         REDIS_SOCKET_TYPE=tcp",
                        if socket.is_some() {
                            "is unix"
                        } else {
                            "unset means unix"
                        }
                    ),
                ));
            }
            if tls {
                return Err(ConfigError::new(
                    "REDIS_TLS",
                    "true over a unix socket is not supported: tollgate speaks TLS over TCP",
                ));
            }
            if !url.starts_with('/') || url.chars().any(char::is_control) {
                return Err(ConfigError::new(
                    "REDIS_URL",
                    "a socket path must be absolute",
                ));
            }
            Ok(unix_url(url, auth))
        }
        Some(other) => Err(ConfigError::new(
            "REDIS_SOCKET_TYPE",
            format!("{other:?} is neither tcp nor unix"),
        )),
    }
}

/// `host:port` as Go's dialer takes it: nothing trimmed, a port, an IPv6 host in brackets.
fn host_port(text: &str) -> Result<&str, ConfigError> {
    let refuse = |why: &str| ConfigError::new("REDIS_URL", format!("{text:?} {why}"));
    if text.is_empty() || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(refuse("is not host:port (empty, or a space in it)"));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(refuse("has no port"));
    };
    let bracketed = host.starts_with('[') && host.ends_with(']');
    if host.is_empty()
        || host.contains(['/', '@', '?', '#', '%'])
        || (host.contains(':') && !bracketed)
    {
        return Err(refuse("is not host:port"));
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err() {
        return Err(refuse("has no valid port"));
    }
    Ok(text)
}

fn tcp_url(scheme: &str, auth: Option<&(Option<String>, String)>, address: &str) -> String {
    match auth {
        None => format!("{scheme}://{address}"),
        Some((user, password)) => format!(
            "{scheme}://{}:{}@{address}",
            encoded(user.as_deref().unwrap_or_default()),
            encoded(password)
        ),
    }
}

fn unix_url(path: &str, auth: Option<&(Option<String>, String)>) -> String {
    let path: String = path.split('/').map(encoded).collect::<Vec<_>>().join("/");
    match auth {
        None => format!("redis+unix://{path}"),
        Some((None, password)) => format!("redis+unix://{path}?pass={}", encoded(password)),
        Some((Some(user), password)) => format!(
            "redis+unix://{path}?user={}&pass={}",
            encoded(user),
            encoded(password)
        ),
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters: the Redis client decodes the
/// URL, so a password holding `@`, `/`, `#` or `%41` must reach it unchanged.
fn encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(pairs: &[(&str, &str)]) -> Result<StoreConfig, ConfigError> {
        let var = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let mut config = Config::default();
        apply(&mut config, &var).map(|()| config.store)
    }

    fn refused(pairs: &[(&str, &str)]) -> String {
        applied(pairs).unwrap_err().key
    }

    /// What each connection gets, as envoyproxy/ratelimit's driver gives it.
    #[test]
    fn each_connection_gets_what_envoyproxy_ratelimit_gives_it() {
        let store = applied(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,s1:26379,[::1]:26380"),
            ("REDIS_AUTH", "masterpw"),
            ("REDIS_SENTINEL_AUTH", "app:s/pw@1"),
            ("REDIS_TLS", "true"),
        ])
        .unwrap();
        let sentinel = store.sentinel.clone().unwrap();
        assert_eq!(sentinel.master, "mymaster");
        assert_eq!(
            sentinel.urls,
            [
                "rediss://app:s%2Fpw%401@s1:26379",
                "rediss://app:s%2Fpw%401@[::1]:26380"
            ]
        );
        let master = sentinel.master_access(&store.url);
        assert!(master.tls);
        assert_eq!(master.password.as_deref(), Some("masterpw"));
        assert_eq!(master.username, None);
        // The client decodes what was encoded back to the variable's text.
        use redis::IntoConnectionInfo as _;
        let info = sentinel.urls[0].as_str().into_connection_info().unwrap();
        assert_eq!(info.redis_settings().password(), Some("s/pw@1"));

        let store = applied(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "m,s1:26379"),
            ("REDIS_AUTH", "u:p:q"),
        ])
        .unwrap();
        let sentinel = store.sentinel.unwrap();
        assert_eq!(sentinel.urls, ["redis://s1:26379"], "no sentinel password");
        assert_eq!(sentinel.master_tls, Some(false), "plaintext, and said so");
        assert_eq!(sentinel.master_username.as_deref(), Some("u"));
        assert_eq!(sentinel.master_password.unwrap().0, "p:q");

        let store = applied(&[
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:7000,b:7001"),
            ("REDIS_AUTH", "pw%41"),
            ("REDIS_TLS", "1"),
            ("REDIS_SOCKET_TYPE", "unix"),
        ])
        .unwrap();
        assert_eq!(
            store.cluster,
            ["rediss://:pw%2541@a:7000", "rediss://:pw%2541@b:7001"]
        );

        let store = applied(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("REDIS_AUTH", "secret"),
            ("REDIS_TLS", "true"),
        ])
        .unwrap();
        assert_eq!(store.url, "rediss://:secret@redis:6379");
        assert_eq!(store.timeout_ms, StoreConfig::default().timeout_ms);
        let store = applied(&[("REDIS_URL", "/s.sock"), ("REDIS_TIMEOUT", "1m")]).unwrap();
        assert_eq!(store.timeout_ms, 60_000);
        let store = applied(&[
            ("REDIS_URL", "/var/run/redis.sock"),
            ("REDIS_AUTH", "u:p w"),
        ])
        .unwrap();
        assert_eq!(
            store.url,
            "redis+unix:///var/run/redis.sock?user=u&pass=p%20w"
        );
        let info = store.url.as_str().into_connection_info().unwrap();
        assert_eq!(info.redis_settings().password(), Some("p w"));
    }

    #[test]
    fn what_would_mean_something_else_is_refused_naming_the_variable() {
        for (pairs, key) in [
            (&[][..], "REDIS_URL"),
            (&[("REDIS_URL", "redis:6379")][..], "REDIS_SOCKET_TYPE"),
            (
                &[("REDIS_URL", "redis:6379"), ("REDIS_SOCKET_TYPE", "TCP")],
                "REDIS_SOCKET_TYPE",
            ),
            (
                &[("REDIS_URL", "/s.sock"), ("REDIS_TLS", "true")],
                "REDIS_TLS",
            ),
            (&[("REDIS_URL", "relative.sock")], "REDIS_URL"),
            (
                &[("REDIS_URL", "redis:6379"), ("REDIS_TLS", "yes")],
                "REDIS_TLS",
            ),
            (
                &[("REDIS_URL", "redis:6379"), ("REDIS_TLS", " true")],
                "REDIS_TLS",
            ),
            (
                &[
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "redis://h:6379"),
                ],
                "REDIS_URL",
            ),
            (
                &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", " h:6379")],
                "REDIS_URL",
            ),
            (
                &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "h")],
                "REDIS_URL",
            ),
            (
                &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "::1:6379")],
                "REDIS_URL",
            ),
            (
                &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "mymaster")],
                "REDIS_URL",
            ),
            (
                &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m, s:26379")],
                "REDIS_URL",
            ),
            (
                &[("REDIS_TYPE", "cluster"), ("REDIS_URL", "a:1,,b:2")],
                "REDIS_URL",
            ),
            (
                &[("REDIS_TYPE", " single"), ("REDIS_URL", "/s.sock")],
                "REDIS_TYPE",
            ),
            (
                &[("REDIS_URL", "/s.sock"), ("REDIS_AUTH", "user:")],
                "REDIS_AUTH",
            ),
            (
                &[("REDIS_URL", "/s.sock"), ("REDIS_PERSECOND", "true")],
                "REDIS_PERSECOND",
            ),
            (
                &[("REDIS_URL", "/s.sock"), ("REDIS_TIMEOUT", "0")],
                "REDIS_TIMEOUT",
            ),
            (
                &[("REDIS_URL", "/s.sock"), ("REDIS_TIMEOUT", "10")],
                "REDIS_TIMEOUT",
            ),
            (
                &[("REDIS_URL", "/s.sock"), ("REDIS_TIMEOUT", "2m")],
                "REDIS_TIMEOUT",
            ),
            (
                &[
                    ("REDIS_URL", "/s.sock"),
                    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "True"),
                ],
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            ),
        ] {
            assert_eq!(refused(pairs), key, "{pairs:?}");
        }
    }

    #[test]
    fn without_redis_url_even_a_files_redis_store_is_refused() {
        let mut config = Config::default();
        config.store.backend = Backend::Redis;
        let refused = apply(&mut config, &|_: &str| None).unwrap_err();
        assert_eq!(refused.key, "REDIS_URL");
    }
}
