//! What each connection to Redis really uses, worked out once from `[store]`: TLS or not, and
//! whether it sends a password. The store connects by it, `validate` checks it and its summary
//! shows it, so the three cannot disagree (they did: the summary once said "TLS" of a master
//! spoken to in clear).

use redis::IntoConnectionInfo as _;

use super::{ConfigError, SentinelConfig, StoreConfig};

/// The master that Sentinel names, as tollgate speaks to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterAccess {
    pub tls: bool,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl SentinelConfig {
    /// The `master_*` keys, each falling back on `store.url`'s part (its scheme for TLS).
    pub fn master_access(&self, store_url: &str) -> MasterAccess {
        let settings = store_url
            .into_connection_info()
            .ok()
            .map(|info| info.redis_settings().clone());
        let from_url = |part: fn(&redis::RedisConnectionInfo) -> Option<&str>| {
            settings.as_ref().and_then(part).map(str::to_string)
        };
        MasterAccess {
            tls: self
                .master_tls
                .unwrap_or_else(|| store_url.starts_with("rediss://")),
            username: self
                .master_username
                .clone()
                .or_else(|| from_url(redis::RedisConnectionInfo::username)),
            password: self
                .master_password
                .as_ref()
                .map(|secret| secret.0.clone())
                .or_else(|| from_url(redis::RedisConnectionInfo::password)),
        }
    }

    /// Refuses a master said two ways that disagree: `master_tls = false` with a `rediss://`
    /// `store.url`, or a user or password both here and in `store.url`.
    pub(super) fn check_master_keys(&self, store_url: &str) -> Result<(), ConfigError> {
        if self.master_tls == Some(false) && store_url.starts_with("rediss://") {
            return Err(ConfigError::new(
                "store.sentinel.master_tls",
                "is false, but store.url is rediss://: say it once",
            ));
        }
        let settings = store_url
            .into_connection_info()
            .ok()
            .map(|info| info.redis_settings().clone());
        let in_url = |part: fn(&redis::RedisConnectionInfo) -> Option<&str>| {
            settings.as_ref().and_then(part).is_some()
        };
        if self.master_username.is_some() && in_url(redis::RedisConnectionInfo::username) {
            return Err(ConfigError::new(
                "store.sentinel.master_username",
                "store.url names a user too: say it once",
            ));
        }
        if self.master_password.is_some() && in_url(redis::RedisConnectionInfo::password) {
            return Err(ConfigError::new(
                "store.sentinel.master_password",
                "store.url holds a password too: say it once",
            ));
        }
        Ok(())
    }
}

/// Whether every connection of one kind sends a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passwords {
    All,
    Some,
    None,
}

/// One kind of connection tollgate opens to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// `node` (one Redis), `nodes` (a Cluster's), `master` or `sentinels`.
    pub role: &'static str,
    /// TLS on every connection of this kind (`validate` refuses a mix).
    pub tls: bool,
    /// A `#insecure` URL: TLS without checking the server's certificate.
    pub unverified: bool,
    pub passwords: Passwords,
}

impl StoreConfig {
    /// Each kind of connection the Redis store opens, the data-bearing one first.
    pub fn links(&self) -> Vec<Link> {
        if !self.cluster.is_empty() {
            return vec![urls_link("nodes", &self.cluster)];
        }
        match &self.sentinel {
            Some(sentinel) => {
                let master = sentinel.master_access(&self.url);
                vec![
                    Link {
                        role: "master",
                        tls: master.tls,
                        // The master is always verified (`TlsMode::Secure`).
                        unverified: false,
                        passwords: if master.password.is_some() {
                            Passwords::All
                        } else {
                            Passwords::None
                        },
                    },
                    urls_link("sentinels", &sentinel.urls),
                ]
            }
            None => vec![urls_link("node", std::slice::from_ref(&self.url))],
        }
    }

    /// `role: TLS, CA ..., client certificate ..., password set` for each link; never a
    /// password.
    pub fn describe_links(&self) -> String {
        let described: Vec<String> = self
            .links()
            .iter()
            .map(|link| {
                let tls = match (&self.tls, link.tls) {
                    (_, false) => "plaintext".to_string(),
                    (_, true) if link.unverified => {
                        "TLS, the server's certificate NOT verified (#insecure)".to_string()
                    }
                    (None, true) => "TLS, CA the system's, client certificate none".to_string(),
                    (Some(tls), true) => format!(
                        "TLS, CA {}, client certificate {}",
                        tls.ca_file
                            .as_ref()
                            .map_or("the system's".into(), |f| f.display().to_string()),
                        tls.cert_file
                            .as_ref()
                            .map_or("none".into(), |f| f.display().to_string())
                    ),
                };
                let passwords = match link.passwords {
                    Passwords::All => "password set",
                    Passwords::Some => "password on some",
                    Passwords::None => "no password",
                };
                format!("{}: {tls}, {passwords}", link.role)
            })
            .collect();
        described.join("; ")
    }
}

fn urls_link(role: &'static str, urls: &[String]) -> Link {
    let with_password = urls.iter().filter(|url| has_password(url)).count();
    Link {
        role,
        tls: !urls.is_empty() && urls.iter().all(|url| url.starts_with("rediss://")),
        unverified: urls.iter().any(|url| url.ends_with("#insecure")),
        passwords: match with_password {
            0 => Passwords::None,
            n if n == urls.len() => Passwords::All,
            _ => Passwords::Some,
        },
    }
}

/// A password in the URL's user part, or a socket URL's `pass=`.
fn has_password(url: &str) -> bool {
    url.into_connection_info()
        .is_ok_and(|info| info.redis_settings().password().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Backend, Secret};

    fn sentinel(urls: &[&str]) -> SentinelConfig {
        SentinelConfig {
            master: "m".into(),
            urls: urls.iter().map(|u| u.to_string()).collect(),
            master_tls: None,
            master_username: None,
            master_password: None,
        }
    }

    #[test]
    fn the_master_keys_win_over_store_url_and_fall_back_on_it() {
        let plain = sentinel(&["rediss://:s@h:26379"]);
        let access = plain.master_access("rediss://u:p@ignored/0");
        assert_eq!(
            access,
            MasterAccess {
                tls: true,
                username: Some("u".into()),
                password: Some("p".into())
            }
        );
        let explicit = SentinelConfig {
            master_tls: Some(true),
            master_password: Some(Secret("mp".into())),
            ..plain
        };
        let access = explicit.master_access("redis://127.0.0.1:6379/0");
        assert!(access.tls);
        assert_eq!(access.password.as_deref(), Some("mp"));
        assert_eq!(access.username, None);
    }

    #[test]
    fn links_say_per_connection_what_is_used() {
        let mut store = StoreConfig {
            backend: Backend::Redis,
            sentinel: Some(sentinel(&["rediss://:s@h:26379", "rediss://h2:26379"])),
            ..StoreConfig::default()
        };
        assert_eq!(
            store.describe_links(),
            "master: plaintext, no password; sentinels: TLS, CA the system's, client \
             certificate none, password on some"
        );
        store.sentinel = None;
        store.url = "redis+unix:///run/r.sock?pass=x".into();
        assert_eq!(store.describe_links(), "node: plaintext, password set");
        store.url = "rediss://h:6380#insecure".into();
        assert_eq!(
            store.describe_links(),
            "node: TLS, the server's certificate NOT verified (#insecure), no password"
        );
    }
}
