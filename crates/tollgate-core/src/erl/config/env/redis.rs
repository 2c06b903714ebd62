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

use super::{
    tls, ErlEnv, Var, REDIS_AUTH, REDIS_PERSECOND, REDIS_SENTINEL_AUTH, REDIS_SOCKET_TYPE,
    REDIS_TIMEOUT, REDIS_TLS, REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, REDIS_TYPE, REDIS_URL,
};
use crate::config::{Backend, Config, ConfigError, SentinelConfig, StoreConfig};

/// Sets `[store]` from the `REDIS_*` variables (see the module docs).
pub(super) fn apply(config: &mut Config, env: &ErlEnv) -> Result<(), ConfigError> {
    env.refuse_if_asked(&REDIS_TLS_SKIP_HOSTNAME_VERIFICATION)?;
    env.refuse_if_asked(&REDIS_PERSECOND)?;
    let tls = env.flag(&REDIS_TLS)?;
    let timeout_ms = timeout_ms(env)?;
    // Even over a file's `[store]`: the image's default file names a local Redis, which would
    // stand in silently for the one the operator forgot to name.
    let Some(url) = env.get(&REDIS_URL) else {
        return Err(REDIS_URL.refuse(
            "is not set: envoyproxy/ratelimit would use the nutcracker socket \
             /var/run/nutcracker/ratelimit.sock; name the Redis (host:port with \
             REDIS_SOCKET_TYPE=tcp, or a socket path)",
        ));
    };
    let tls_files = tls::store(env, tls)?;
    let auth = credentials(env, &REDIS_AUTH)?;
    let kind = env.or_default(&REDIS_TYPE);
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
        "single" => store.url = single_node(env, url, tls, auth.as_ref())?,
        "cluster" => {
            store.cluster = url
                .split(',')
                .map(|node| Ok(tcp_url(scheme, auth.as_ref(), host_port(node)?)))
                .collect::<Result<_, ConfigError>>()?;
        }
        "sentinel" => {
            let sentinel_auth = credentials(env, &REDIS_SENTINEL_AUTH)?;
            let mut parts = url.split(',');
            let master = parts.next().unwrap_or_default();
            let urls = parts
                .map(|node| Ok(tcp_url(scheme, sentinel_auth.as_ref(), host_port(node)?)))
                .collect::<Result<Vec<_>, ConfigError>>()?;
            if master.is_empty() || master.contains(char::is_whitespace) || urls.is_empty() {
                return Err(REDIS_URL
                    .refuse("with REDIS_TYPE=sentinel is <master name>,<sentinel host:port>,..."));
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
            return Err(REDIS_TYPE.refuse(format!("{kind:?} is none of single, sentinel, cluster")))
        }
    }
    Ok(())
}

/// `REDIS_TIMEOUT`, a Go duration bounding each Redis call there as `store.timeout_ms` does
/// here; 0 (no bound there) and more than a minute are refused.
fn timeout_ms(env: &ErlEnv) -> Result<Option<u64>, ConfigError> {
    let Some(duration) = env.duration(&REDIS_TIMEOUT)? else {
        return Ok(None);
    };
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if duration < std::time::Duration::from_millis(1) || ms > 60_000 {
        return Err(REDIS_TIMEOUT.refuse(format!(
            "{:?}: tollgate bounds each Redis call by 1 ms to 1 minute",
            env.or_default(&REDIS_TIMEOUT)
        )));
    }
    Ok(Some(ms))
}

/// `password` or `user:password`, split at the first `:` as there; empty means none.
fn credentials(env: &ErlEnv, row: &Var) -> Result<Option<(Option<String>, String)>, ConfigError> {
    let Some(auth) = env.set(row) else {
        return Ok(None);
    };
    match auth.split_once(':') {
        None => Ok(Some((None, auth.to_string()))),
        Some((_, "")) => Err(row.refuse("names a user with an empty password (user:password)")),
        Some(("", password)) => Ok(Some((None, password.to_string()))),
        Some((user, password)) => Ok(Some((Some(user.to_string()), password.to_string()))),
    }
}

/// One node: over TCP, or (`REDIS_SOCKET_TYPE` unset or `unix`, as there) a socket path.
fn single_node(
    env: &ErlEnv,
    url: &str,
    tls: bool,
    auth: Option<&(Option<String>, String)>,
) -> Result<String, ConfigError> {
    let socket = env.get(&REDIS_SOCKET_TYPE);
    match socket {
        Some("tcp") => {
            let scheme = if tls { "rediss" } else { "redis" };
            Ok(tcp_url(scheme, auth, host_port(url)?))
        }
        None | Some("unix") => {
            if host_port(url).is_ok() {
                return Err(REDIS_SOCKET_TYPE.refuse(format!(
                    "{}, which makes REDIS_URL a socket path, but it is host:port: set \
                     REDIS_SOCKET_TYPE=tcp",
                    if socket.is_some() {
                        "is unix"
                    } else {
                        "unset means unix"
                    }
                )));
            }
            if tls {
                return Err(REDIS_TLS.refuse(
                    "true over a unix socket is not supported: tollgate speaks TLS over TCP",
                ));
            }
            if !url.starts_with('/') || url.chars().any(char::is_control) {
                return Err(REDIS_URL.refuse("a socket path must be absolute"));
            }
            Ok(unix_url(url, auth))
        }
        Some(other) => Err(REDIS_SOCKET_TYPE.refuse(format!("{other:?} is neither tcp nor unix"))),
    }
}

/// `host:port` as Go's dialer takes it: nothing trimmed, a port, an IPv6 host in brackets.
fn host_port(text: &str) -> Result<&str, ConfigError> {
    let refuse = |why: &str| REDIS_URL.refuse(format!("{text:?} {why}"));
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
mod tests;
