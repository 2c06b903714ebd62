use super::*;

#[test]
fn envoyproxy_ratelimit_variables_set_the_store_listeners_and_directory() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let mut config = Config::default();
    apply_erl_env(&mut config, env(&[("REDIS_URL", "redis:6379")])).unwrap();
    assert_eq!(config.grpc_listen, None, "not without RUNTIME_*");
    apply_erl_env(
        &mut config,
        env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("REDIS_AUTH", "secret"),
            ("REDIS_TLS", "true"),
            ("PORT", "8090"),
        ]),
    )
    .unwrap();
    assert_eq!(
        config.envoy.config_dir.as_deref(),
        Some(std::path::Path::new("/data/ratelimit/config"))
    );
    assert_eq!(config.store.url, "rediss://:secret@redis:6379");
    assert_eq!(config.grpc_listen.unwrap().port(), 8081);
    assert_eq!(config.listen.port(), 8090);
    let mut config = Config::default();
    apply_erl_env(
        &mut config,
        env(&[
            ("RUNTIME_ROOT", "/d"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
        ]),
    )
    .unwrap();
    let sentinel = config.store.sentinel.unwrap();
    assert_eq!(sentinel.master, "mymaster");
    assert_eq!(sentinel.urls, ["redis://s1:26379", "redis://s2:26379"]);
    let refused = apply_erl_env(
        &mut Config::default(),
        env(&[("RUNTIME_ROOT", "/d"), ("CONFIG_TYPE", "GRPC_XDS_DELTA")]),
    );
    assert_eq!(refused.unwrap_err().key, "CONFIG_TYPE");
    // TLS towards the gRPC listener needs its certificate (the files are read in
    // `grpc_tls`'s own tests).
    let refused = apply_erl_env(
        &mut Config::default(),
        env(&[("RUNTIME_ROOT", "/d"), ("GRPC_SERVER_USE_TLS", "true")]),
    );
    assert_eq!(refused.unwrap_err().key, "GRPC_SERVER_TLS_CERT");
    let refused = apply_erl_env(
        &mut Config::default(),
        env(&[("RUNTIME_ROOT", "/d"), ("GRPC_SERVER_USE_TLS", "on")]),
    );
    assert_eq!(refused.unwrap_err().key, "GRPC_SERVER_USE_TLS");
    let mut config = Config::default();
    apply_erl_env(
        &mut config,
        env(&[
            ("RUNTIME_ROOT", "/d"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_ID", "n"),
            ("REDIS_URL", "/run/redis.sock"),
        ]),
    )
    .unwrap();
    assert_eq!(
        config.envoy.config_dir, None,
        "xDS instead of the directory"
    );
    assert_eq!(config.envoy.xds.map(|x| x.node_id), Some("n".into()));
    // Fed over xDS, a deployment may set no RUNTIME_* at all.
    let mut config = Config::default();
    apply_erl_env(
        &mut config,
        env(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_ID", "n"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
        ]),
    )
    .unwrap();
    assert_eq!(config.envoy.xds.map(|x| x.node_id), Some("n".into()));
    assert_eq!(config.store.url, "redis://redis:6379");
    assert_eq!(config.grpc_listen.unwrap().port(), 8081);
    // The files count only with REDIS_TLS true, as there; then they are checked.
    const CERTS: [(&str, &str); 7] = [
        ("RUNTIME_ROOT", "/d"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis:6380"),
        ("REDIS_TLS_CACERT", "/nonexistent/ca.pem"),
        ("REDIS_TLS_CLIENT_CERT", "/nonexistent/tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "/nonexistent/tls.key"),
        ("REDIS_TLS", "false"),
    ];
    let mut config = Config::default();
    apply_erl_env(&mut config, env(&CERTS)).unwrap();
    assert_eq!(config.store.tls, None);
    const WITH_TLS: [(&str, &str); 7] = {
        let mut certs = CERTS;
        certs[6].1 = "true";
        certs
    };
    let refused = apply_erl_env(&mut Config::default(), env(&WITH_TLS));
    assert_eq!(refused.unwrap_err().key, "REDIS_TLS_CACERT");
    let mut config = Config::default();
    apply_erl_env(&mut config, env(&[("CONFIG_TYPE", "yaml"), ("PORT", "1")])).unwrap();
    assert_eq!(config.listen.port(), 8080, "another program's CONFIG_TYPE");
}
