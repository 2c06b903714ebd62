use super::*;

fn applied(pairs: &[(&str, &str)]) -> Result<StoreConfig, ConfigError> {
    let mut config = Config::default();
    apply(&mut config, &ErlEnv::of(pairs)).map(|()| config.store)
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
    let refused = apply(&mut config, &ErlEnv::of(&[])).unwrap_err();
    assert_eq!(refused.key, "REDIS_URL");
}
