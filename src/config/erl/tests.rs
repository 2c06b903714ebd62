use super::*;

fn refusal(yaml: &str) -> String {
    from_yaml("f.yaml", yaml).unwrap_err().reason
}

/// envoyproxy/ratelimit test/config: bad_limit_unit, duplicate_key, empty_key,
/// misspelled_key(2), non_map_list, non_string_key, replaces_empty, replaces_self,
/// unlimited_with_unit, empty_domain, and a share_threshold without a wildcard.
#[test]
fn what_envoyproxy_ratelimit_refuses_is_refused() {
    let node = |body: &str| format!("domain: d\ndescriptors:\n  - key: k\n{body}");
    assert!(refusal(&node(
        "    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"
    ))
    .contains("invalid rate limit unit"));
    assert!(refusal(&node("    value: v\n  - key: k\n    value: v\n"))
        .contains("duplicate descriptor composite key"));
    assert!(refusal("domain: d\ndescriptors:\n  - value: v\n").contains("empty key"));
    assert!(
        refusal(&node("    ratelimit: {unit: day, requests_per_unit: 5}\n"))
            .contains("unknown key \"ratelimit\"")
    );
    assert!(
        refusal(&node("    rate_limit: {unit: day, requestsperunit: 5}\n"))
            .contains("unknown key \"requestsperunit\"")
    );
    assert!(refusal("domain: d\ndescriptors:\n  - a\n  - b\n").contains("other than map"));
    assert!(refusal("0.25: d\n").contains("not of type string"));
    assert!(refusal(&node(
        "    rate_limit: {name: me, unit: second, requests_per_unit: 1, replaces: [{name: }]}\n"
    ))
    .contains("empty replaces"));
    assert!(refusal(&node(
        "    rate_limit: {name: me, unit: second, requests_per_unit: 1, replaces: [{name: me}]}\n"
    ))
    .contains("name of same descriptor"));
    assert!(refusal(&node(
        "    rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}\n"
    ))
    .contains("when unlimited"));
    assert!(refusal("domain: \"\"\n").contains("empty domain"));
    assert!(refusal(&node("    value: v\n    share_threshold: true\n")).contains("share_threshold"));
    assert!(refusal(&node(
        "    rate_limit: {unit: day, requests_per_unit: 1.5}\n"
    ))
    .contains("error checking config"));
}

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
    let mut config = super::super::Config::default();
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
    let mut config = super::super::Config::default();
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
        &mut super::super::Config::default(),
        env(&[("RUNTIME_ROOT", "/d"), ("CONFIG_TYPE", "GRPC_XDS_DELTA")]),
    );
    assert_eq!(refused.unwrap_err().key, "CONFIG_TYPE");
    // TLS towards the gRPC listener needs its certificate (the files are read in
    // `grpc_tls`'s own tests).
    let refused = apply_erl_env(
        &mut super::super::Config::default(),
        env(&[("RUNTIME_ROOT", "/d"), ("GRPC_SERVER_USE_TLS", "true")]),
    );
    assert_eq!(refused.unwrap_err().key, "GRPC_SERVER_TLS_CERT");
    let refused = apply_erl_env(
        &mut super::super::Config::default(),
        env(&[("RUNTIME_ROOT", "/d"), ("GRPC_SERVER_USE_TLS", "on")]),
    );
    assert_eq!(refused.unwrap_err().key, "GRPC_SERVER_USE_TLS");
    let mut config = super::super::Config::default();
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
    let mut config = super::super::Config::default();
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
    let mut config = super::super::Config::default();
    apply_erl_env(&mut config, env(&CERTS)).unwrap();
    assert_eq!(config.store.tls, None);
    const WITH_TLS: [(&str, &str); 7] = {
        let mut certs = CERTS;
        certs[6].1 = "true";
        certs
    };
    let refused = apply_erl_env(&mut super::super::Config::default(), env(&WITH_TLS));
    assert_eq!(refused.unwrap_err().key, "REDIS_TLS_CACERT");
    let mut config = super::super::Config::default();
    apply_erl_env(&mut config, env(&[("CONFIG_TYPE", "yaml"), ("PORT", "1")])).unwrap();
    assert_eq!(config.listen.port(), 8080, "another program's CONFIG_TYPE");
}

#[test]
fn a_tree_becomes_its_nodes_in_file_order() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit: {unit: MINUTE, requests_per_unit: 60, name: n}\n  - key: c\n    value: \"p*\"\n    share_threshold: true\n    rate_limit: {unlimited: true}\n    metadata: {anything: [1, 2.5]}\n";
    let (domain, rules) = from_yaml("f.yaml", yaml).unwrap();
    assert_eq!(domain, "d");
    let described: Vec<String> = rules.iter().map(RuleConfig::describe).collect();
    assert_eq!(described, ["d (a, x)", "d (a, x) (b, *)", "d (c, p*)"]);
    assert_eq!(rules[1].rate_limit.as_ref().unwrap().name, "n");
    assert!(rules[2].share_threshold);
    assert_eq!(unit("MINUTE"), Some((2, 60)));
    assert_eq!(unit("unknown"), None);
}
