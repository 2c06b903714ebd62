use super::*;

fn env(pairs: &[(&str, &str)]) -> ErlEnv {
    ErlEnv::of(pairs)
}

fn from_erl_env(env: ErlEnv) -> Result<XdsConfig, ConfigError> {
    from_env(&env)
}

/// Go's `time.ParseDuration`, in whole milliseconds rounded up, as the retry interval is read.
fn go_duration_ms(text: &str) -> Option<u64> {
    crate::base::go::parse_duration(text).map(ceil_ms)
}

#[test]
fn envoyproxy_ratelimit_variables_set_the_client_as_it_reads_them() {
    assert_eq!(from_erl_env(env(&[])).unwrap(), XdsConfig::default());
    let xds = from_erl_env(env(&[
        ("CONFIG_GRPC_XDS_SERVER_URL", "xds.example:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "ratelimit-1"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,skipped,team=b=c"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "1m1.5s"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "X-Tenant:blue,x-b:1:2",
        ),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/ignored/without/tls"),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "10000000"),
    ]))
    .unwrap();
    assert_eq!(xds.server, "xds.example:18001");
    assert_eq!(xds.node_id, "ratelimit-1");
    let metadata: Vec<(&str, &str)> = xds
        .node_metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(metadata, [("team", "b=c"), ("zone", "a")]);
    assert_eq!(xds.retry_ms, 61_500);
    assert_eq!(xds.headers["x-tenant"], "blue");
    assert_eq!(xds.headers["x-b"], "1:2");
    assert_eq!((xds.tls, xds.files.ca_file), (false, None));
    assert_eq!(xds.max_message_bytes, 10_000_000);
    let tls = from_erl_env(env(&[
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ""),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "eg.example"),
    ]))
    .unwrap();
    assert!(tls.tls);
    assert!(
        !tls.ready_before_config,
        "envoyproxy/ratelimit waits for its first configuration"
    );
    let forced = |healthy: &'static str| {
        from_erl_env(env(if healthy == "true" {
            &[
                ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
                ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ]
        } else {
            &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")]
        }))
        .unwrap()
        .ready_before_config
    };
    assert!(forced("false"));
    assert!(!forced("true"));
    assert_eq!(
        tls.files.ca_file, None,
        "empty is unset: the system's roots"
    );
    assert_eq!(tls.server_name.as_deref(), Some("eg.example"));
}

#[test]
fn bad_variables_are_refused_naming_them() {
    let key =
        |pairs: &'static [(&'static str, &'static str)]| from_erl_env(env(pairs)).unwrap_err().key;
    // A response is read whole before it is parsed: a size past 64 MiB is memory, refused.
    assert_eq!(
        key(&[("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "99999999999999")]),
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_SERVER_USE_TLS", "yes")]),
        "CONFIG_GRPC_XDS_SERVER_USE_TLS"
    );
    assert_eq!(
        key(&[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.pem"),
        ]),
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"
    );
    assert_eq!(
        key(&[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/nonexistent/key.pem"),
        ]),
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3")]),
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "0s")]),
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_SERVER_URL", "http://xds:18000")]),
        "CONFIG_GRPC_XDS_SERVER_URL"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_NODE_ID", "")]),
        "CONFIG_GRPC_XDS_NODE_ID"
    );
    assert_eq!(
        key(&[("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue")]),
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"
    );
}

#[test]
fn go_durations_are_read_as_go_reads_them() {
    for (text, ms) in [
        ("3s", Some(3_000)),
        ("500ms", Some(500)),
        ("1m30s", Some(90_000)),
        ("1.5h", Some(5_400_000)),
        (".5s", Some(500)),
        ("1us", Some(1)),
        ("0", Some(0)),
        ("", None),
        ("3", None),
        ("-1s", None),
        ("1d", None),
        ("s", None),
    ] {
        assert_eq!(go_duration_ms(text), ms, "{text:?}");
    }
}
