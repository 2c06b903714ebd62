//! envoyproxy/ratelimit's environment: started as `ratelimit`, its gRPC TLS and Redis
//! variables give what envoyproxy/ratelimit gives.

use super::*;

/// envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS` and its files: refused naming the variable when
/// a file is missing or bad, and mapped onto `grpc_tls` when they are good.
#[test]
fn envoyproxy_ratelimit_grpc_tls_variables_set_grpc_tls() {
    let certs = TempDir::new("grpc-tls");
    make_certificates(certs.path());
    let rules = TempDir::new("rules");
    let path = |name: &str| certs.path().join(name).display().to_string();
    let (cert, key, ca) = (path("cert.pem"), path("key.pem"), path("ca.pem"));
    let root = rules.path().display().to_string();
    let erl = |extra: &[(&str, &str)]| {
        let mut env = vec![
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", ""),
            ("RUNTIME_APPDIRECTORY", ""),
            ("REDIS_URL", "/run/redis.sock"),
        ];
        env.extend_from_slice(extra);
        run(&["validate"], None, &env)
    };
    let tls = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
    ];
    for (extra, named) in [
        (vec![("GRPC_SERVER_USE_TLS", "yes")], "GRPC_SERVER_USE_TLS"),
        (
            vec![("GRPC_SERVER_USE_TLS", "true")],
            "GRPC_SERVER_TLS_CERT",
        ),
        (
            vec![
                tls[0],
                tls[1],
                ("GRPC_SERVER_TLS_KEY", "/nonexistent/key.pem"),
            ],
            "GRPC_SERVER_TLS_KEY",
        ),
        (
            vec![
                tls[0],
                tls[1],
                tls[2],
                ("GRPC_CLIENT_TLS_CACERT", "/nonexistent/ca.pem"),
            ],
            "GRPC_CLIENT_TLS_CACERT",
        ),
        (
            vec![
                tls[0],
                tls[1],
                tls[2],
                ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
            ],
            "GRPC_CLIENT_TLS_SAN",
        ),
    ] {
        assert_refused(&erl(&extra), named);
    }
    // Without GRPC_SERVER_USE_TLS the files are not read, as there.
    let output = erl(&[("GRPC_SERVER_TLS_CERT", "/nonexistent/cert.pem")]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!String::from_utf8_lossy(&output.stdout).contains("grpc_tls"));
    let output = erl(&[
        tls[0],
        tls[1],
        tls[2],
        ("GRPC_CLIENT_TLS_CACERT", ca.as_str()),
        ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains(&format!(
            "grpc_tls      {cert}, clients with a certificate for envoy.example"
        )),
        "{printed}"
    );
}

/// Environment variables as a test sets them.
type Variables<'a> = Vec<(&'a str, String)>;

/// envoyproxy/ratelimit's `REDIS_*` variables, each set as it is deployed, through `validate`:
/// what each connection really uses (TLS and its CA, password or none; never the password
/// itself), or the refusal naming the variable. `REDIS_AUTH` and `REDIS_TLS` are the data
/// connection's (with Sentinel, the master's), `REDIS_SENTINEL_AUTH` the sentinels'.
#[test]
fn erl_redis_variables_give_each_connection_what_envoyproxy_ratelimit_gives_it() {
    let certs = TempDir::new("erl-redis-tls");
    make_certificates(certs.path());
    let ca = certs.path().join("ca.pem").display().to_string();
    let rules = TempDir::new("erl-redis-rules");
    let root = rules.path().display().to_string();
    let sentinel = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster,127.0.0.1:26379"),
    ];
    let tcp = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "127.0.0.1:6380"),
    ];
    let with = |base: &[(&'static str, &'static str)], extra: &[(&'static str, &str)]| {
        let mut env: Vec<(&str, String)> = base.iter().map(|(k, v)| (*k, v.to_string())).collect();
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        env
    };
    let ca_env = [("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", ca.as_str())];
    let both_tls = format!(
        "master: TLS, CA {ca}, client certificate none, no password; sentinels: TLS, CA {ca}, \
         client certificate none, no password"
    );
    #[rustfmt::skip]
    let table: Vec<(Variables<'_>, Result<&str, &str>)> = vec![
        // The password is the master's, not the sentinels'.
        (with(&sentinel, &[("REDIS_AUTH", "masterpw")]),
         Ok("via [redis://127.0.0.1:26379] (timeout 50 ms, on_error error, prefix \"tollgate\", \
             deny cache on, borrow on (100 to 10000 ms); master: plaintext, password set; sentinels: plaintext, no password)")),
        (with(&sentinel, &[("REDIS_AUTH", "masterpw"), ("REDIS_SENTINEL_AUTH", "sentpw")]),
         Ok("via [redis://:***@127.0.0.1:26379] (timeout 50 ms, on_error error, prefix \
             \"tollgate\", deny cache on, borrow on (100 to 10000 ms); master: plaintext, password set; sentinels: \
             plaintext, password set)")),
        // A store failure is the error envoyproxy/ratelimit answers, unless told otherwise.
        (with(&tcp, &[("TOLLGATE_STORE__ON_ERROR", "allow")]),
         Ok("on_error allow")),
        // TLS and its CA go to the master and to the sentinels.
        (with(&sentinel, &ca_env),
         Ok("via [rediss://127.0.0.1:26379]")),
        (with(&sentinel, &ca_env),
         Ok(both_tls.as_str())),
        (with(&tcp, &[("REDIS_AUTH", "pw"), ("REDIS_TLS", "True")]),
         Ok("redis rediss://:***@127.0.0.1:6380 (timeout 50 ms, on_error error, prefix \
             \"tollgate\", deny cache on, borrow on (100 to 10000 ms); node: TLS, CA the system's, client certificate none, \
             password set)")),
        (with(&[("REDIS_TYPE", "CLUSTER"), ("REDIS_URL", "10.0.0.1:7000,10.0.0.2:7001")],
              &[("REDIS_AUTH", "app:pw")]),
         Ok("cluster [redis://app:***@10.0.0.1:7000, redis://app:***@10.0.0.2:7001]")),
        (with(&[("REDIS_URL", "/var/run/redis.sock")], &[("REDIS_AUTH", "pw")]),
         Ok("redis redis+unix:///var/run/redis.sock?pass=*** (timeout 50 ms, on_error error, \
             prefix \"tollgate\", deny cache on, borrow on (100 to 10000 ms); node: plaintext, password set)")),
        // Refused, naming the variable: never the memory store, nor another meaning.
        (with(&[], &[]), Err("REDIS_URL")),
        (with(&[("REDIS_URL", "127.0.0.1:6380")], &[]), Err("REDIS_SOCKET_TYPE")),
        (with(&tcp, &[("REDIS_TLS", "yes")]), Err("REDIS_TLS")),
        (with(&tcp, &[("REDIS_TLS", "")]), Err("REDIS_TLS")),
        (with(&tcp, &[("REDIS_PERSECOND", "true")]), Err("REDIS_PERSECOND")),
        (with(&tcp, &[("REDIS_TYPE", "replicated")]), Err("REDIS_TYPE")),
        (with(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "mymaster")], &[]), Err("REDIS_URL")),
        (with(&[("REDIS_URL", "/s.sock")], &[("REDIS_TLS", "true")]), Err("REDIS_TLS")),
        // The rest of its environment, each as it reads it.
        (with(&tcp, &[("REDIS_TIMEOUT", "1.5s")]), Ok("(timeout 1500 ms,")),
        (with(&tcp, &[("REDIS_TIMEOUT", "0")]), Err("REDIS_TIMEOUT")),
        (with(&tcp, &[("BACKEND_TYPE", "")]), Ok("redis redis://127.0.0.1:6380 ")),
        (with(&tcp, &[("BACKEND_TYPE", "REDIS")]), Err("BACKEND_TYPE")),
        (with(&tcp, &[("CONFIG_TYPE", "file")]), Err("CONFIG_TYPE")),
        (with(&tcp, &[("GRPC_UDS", "/tmp/rl.sock")]), Err("GRPC_UDS")),
        (with(&tcp, &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")]),
         Err("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")),
        (with(&tcp, &[("SHADOW_MODE", "on")]), Err("SHADOW_MODE")),
        (with(&tcp, &[("PORT", "010")]), Err("PORT")),
        (with(&tcp, &[("HOST", "")]), Err("HOST")),
        (with(&tcp, &[("GRPC_HOST", "rl.example")]), Err("GRPC_HOST")),
        (with(&tcp, &[("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                      ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "yes")]),
         Err("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")),
    ];
    for (variables, expected) in table {
        let mut env = vec![
            ("RUNTIME_ROOT", root.clone()),
            ("RUNTIME_SUBDIRECTORY", String::new()),
            ("RUNTIME_APPDIRECTORY", String::new()),
        ];
        env.extend(variables.iter().cloned());
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let output = run(&["validate"], None, &env);
        match expected {
            Ok(shown) => {
                assert!(output.status.success(), "{env:?}: {}", stderr(&output));
                let printed = String::from_utf8_lossy(&output.stdout);
                let store = printed
                    .lines()
                    .find(|l| l.starts_with("store "))
                    .unwrap_or("");
                assert!(store.contains(shown), "{env:?}:\n{store}\nlacks\n{shown}");
                for (_, value) in &variables {
                    if value.contains("pw") {
                        assert!(!printed.contains(value.as_str()), "{value} printed");
                    }
                }
            }
            Err(key) => assert_refused(&output, key),
        }
    }
}

/// Envoy Gateway runs envoyproxy/ratelimit's image as `/bin/ratelimit` with no arguments: the
/// binary under that name (a link, as in the image) serves, as `tollgate serve` does.
#[test]
fn started_as_ratelimit_without_a_subcommand_it_serves() {
    let dir = TempDir::new("ratelimit-argv0");
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), &link).expect("link");
    let (listen, admin) = (free_port(), free_port());
    let config = dir.write(
        "tollgate.toml",
        &format!("listen = \"127.0.0.1:{listen}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n"),
    );
    let mut command = std::process::Command::new(&link);
    for (key, _) in std::env::vars().filter(|(key, _)| key.starts_with("TOLLGATE_")) {
        command.env_remove(key);
    }
    let mut child = command
        .env("TOLLGATE_CONFIG", &config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ratelimit");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let checked = wait_until(Duration::from_secs(10), || {
        HttpClient::connect(addr)
            .and_then(|mut http| http.get("/check", &[]))
            .is_ok_and(|answer| answer.status == 200 && answer.header("ratelimit").is_some())
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(checked, "/check decided by the default limit");
}
