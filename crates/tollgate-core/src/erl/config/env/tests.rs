use std::cell::RefCell;

use super::*;
use crate::config::Config;

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

#[test]
fn a_variable_asking_for_what_tollgate_cannot_do_is_refused() {
    for (name, value) in [
        ("GRPC_UDS", "/tmp/ratelimit.sock"),
        ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "yes"),
    ] {
        let row = VARS.iter().find(|row| row.name == name).unwrap();
        let refused = ErlEnv::of(&[(name, value)])
            .refuse_if_asked(row)
            .unwrap_err();
        assert_eq!(refused.key, name);
    }
    assert!(ErlEnv::of(&[("GRPC_UDS", "")])
        .refuse_if_asked(&GRPC_UDS)
        .is_ok());
    assert!(ErlEnv::of(&[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "0")])
        .refuse_if_asked(&REDIS_HEALTH_CHECK_ACTIVE_CONNECTION)
        .is_ok());
}

/// Each variable is one row, read by its name and only through the table.
#[test]
fn every_variable_is_one_row_of_the_table() {
    let mut names: Vec<&str> = VARS.iter().map(|row| row.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), VARS.len(), "a variable written twice");
    let read: Vec<String> = {
        let asked = RefCell::new(Vec::new());
        ErlEnv::read(|name| {
            asked.borrow_mut().push(name.to_string());
            None
        });
        asked.into_inner()
    };
    assert_eq!(read.len(), VARS.len(), "read once each: {read:?}");
}

/// Where the table says what applies when a variable is unset, the settings it sets say the
/// same, so the defaults in docs/REFERENCE.md are the ones that apply.
#[test]
fn the_tables_defaults_are_what_applies_when_a_variable_is_unset() {
    use crate::erl::config::metrics::ErlMetricsConfig;
    use crate::erl::config::xds::XdsConfig;
    let xds = XdsConfig::default();
    assert_eq!(CONFIG_GRPC_XDS_SERVER_URL.default, xds.server);
    assert_eq!(CONFIG_GRPC_XDS_NODE_ID.default, xds.node_id);
    let retry = go::parse_duration(CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL.default);
    assert_eq!(retry.map(|d| d.as_millis()), Some(u128::from(xds.retry_ms)));
    let metrics = ErlMetricsConfig::default();
    assert_eq!(PROMETHEUS_PATH.default, metrics.prometheus_path);
    let flush = go::parse_duration(STATS_FLUSH_INTERVAL.default);
    assert_eq!(
        flush.map(|d| d.as_millis()),
        Some(u128::from(metrics.flush_interval_ms))
    );
    assert_eq!(
        NEAR_LIMIT_RATIO.default.parse::<f32>().ok(),
        Some(metrics.near_limit_ratio)
    );
    let names = Config::default().response.ratelimit_names;
    assert_eq!(LIMIT_LIMIT_HEADER.default, names.limit);
    assert_eq!(LIMIT_REMAINING_HEADER.default, names.remaining);
    assert_eq!(LIMIT_RESET_HEADER.default, names.reset);
    // A boolean's default is one Go reads.
    for row in VARS.iter().filter(|row| row.go == Bool) {
        assert!(go::parse_bool(row.default).is_some(), "{}", row.name);
    }
}

#[test]
fn a_refusal_about_a_key_names_the_variable_that_set_it() {
    let refused = in_words_of(
        ConfigError::new("store.tls.key_file", "is needed with store.tls.cert_file"),
        &[
            &REDIS_TLS_CACERT,
            &REDIS_TLS_CLIENT_CERT,
            &REDIS_TLS_CLIENT_KEY,
        ],
        &REDIS_TLS,
    );
    assert_eq!(refused.key, "REDIS_TLS_CLIENT_KEY");
    assert_eq!(refused.reason, "is needed with REDIS_TLS_CLIENT_CERT");
    let other = in_words_of(
        ConfigError::new("store.tls", "x"),
        &[&REDIS_TLS_CACERT],
        &REDIS_TLS,
    );
    assert_eq!(other.key, "REDIS_TLS");
}

/// What `validate` shows: the variables read and set, never one the configuration did not
/// ask for.
#[test]
fn the_variables_read_are_kept_with_the_key_each_set() {
    let mut config = Config::default();
    apply_erl_env(&mut config, |name: &str| {
        [
            ("RUNTIME_ROOT", "/d"),
            ("REDIS_URL", "/run/redis.sock"),
            ("CONFIG_GRPC_XDS_NODE_ID", "not read without CONFIG_TYPE"),
        ]
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
    })
    .unwrap();
    assert_eq!(
        config.erl_env_read,
        [
            ("RUNTIME_ROOT", "envoy.config_dir"),
            ("REDIS_URL", "store.url")
        ]
    );
}

/// The table's file is the one that spells a variable's name: every other reads it through
/// its row (tests aside, which set them).
#[test]
fn no_other_source_file_spells_a_variable() {
    fn sources(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }
    // Every package's sources: the server's at the repository's top, the libraries' under
    // crates/.
    let top = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for src in ["src", "crates/tollgate-core/src", "crates/tollgate-erl/src"] {
        sources(&top.join(src), &mut files);
    }
    let table = top.join("crates/tollgate-core/src/erl/config/env.rs");
    let mut spelled = Vec::new();
    for file in files
        .iter()
        .filter(|f| **f != table && !f.ends_with("tests.rs"))
    {
        let text = std::fs::read_to_string(file).unwrap();
        for row in VARS {
            if text.contains(&format!("\"{}\"", row.name)) {
                spelled.push(format!("{}: {}", file.display(), row.name));
            }
        }
    }
    assert!(files.len() > 100, "the scan finds the sources");
    assert!(spelled.is_empty(), "read outside the table: {spelled:#?}");
}
