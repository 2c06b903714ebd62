//! TLS settings of xDS, gRPC and the store, and a Sentinel's: each bad one refused naming its
//! key.

use super::*;

/// envoyproxy/ratelimit's xDS source: a bad variable, a missing TLS file, a bad `[envoy] xds`
/// key, and `config_dir` with `xds`, each refused
/// before serving with one line naming it.
#[test]
fn bad_xds_settings_are_refused_naming_the_key() {
    let erl = |extra: &[(&'static str, &'static str)]| {
        let mut env = vec![
            ("RUNTIME_ROOT", "/nonexistent"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ];
        env.extend_from_slice(extra);
        run(&["validate"], None, &env)
    };
    for (key, value) in [
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3 seconds"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "yes"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "grpc://xds"),
    ] {
        assert_refused(&erl(&[(key, value)]), key);
    }
    let missing_ca = erl(&[
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.pem"),
    ]);
    assert_refused(&missing_ca, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT");
    let output = run(
        &["serve"],
        None,
        &[("RUNTIME_ROOT", "/d"), ("CONFIG_TYPE", "REST")],
    );
    assert_refused(&output, "CONFIG_TYPE");
    let output = run(
        &["validate"],
        Some("[envoy]\nxds = { server = \"xds\" }\n"),
        &[],
    );
    assert_refused(&output, "envoy.xds.server");
    let output = run(&["validate"], Some("[envoy.xds]\nnode = \"n\"\n"), &[]);
    assert_refused(&output, "envoy.xds.node");
    let both = "[envoy]\nconfig_dir = \"rules\"\nxds = { server = \"xds:18000\" }\n";
    assert_refused(&run(&["validate"], Some(both), &[]), "envoy.xds");
    let fine = "[envoy]\nxds = { server = \"xds:18000\", node_id = \"n\", retry_ms = 500 }\n";
    let output = run(&["validate"], Some(fine), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("xDS server xds:18000"), "{printed}");
}

/// `grpc_tls`: a missing, malformed or mismatched file, a subject name without a client CA, TLS
/// without a gRPC listener; each refused with one line naming the key.
#[test]
fn bad_grpc_tls_settings_are_refused_naming_the_key() {
    let certs = TempDir::new("grpc-tls");
    make_certificates(certs.path());
    make_client_certificate(certs.path(), "other", "DNS:other.example");
    let garbage = certs.write("garbage.pem", "not PEM at all\n");
    let dir = certs.path().display();
    let tls = |fields: &str| {
        format!(
            "grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\"{fields} }}\n"
        )
    };
    let garbage = garbage.display();
    for (config, key) in [
        (
            format!("grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{dir}/none.pem\", key_file = \"{dir}/key.pem\" }}\n"),
            "grpc_tls.cert_file",
        ),
        (
            format!("grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{garbage}\", key_file = \"{dir}/key.pem\" }}\n"),
            "grpc_tls.cert_file",
        ),
        (
            format!("grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{garbage}\" }}\n"),
            "grpc_tls.key_file",
        ),
        // The key of another certificate.
        (
            format!("grpc_listen = \"127.0.0.1:0\"\ngrpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/other.key\" }}\n"),
            "grpc_tls.key_file",
        ),
        (tls(&format!(", client_ca_file = \"{garbage}\"")), "grpc_tls.client_ca_file"),
        (tls(", client_san = \"envoy.example\""), "grpc_tls.client_san"),
        (
            tls(&format!(", client_ca_file = \"{dir}/ca.pem\", client_san = \"a b\"")),
            "grpc_tls.client_san",
        ),
        (tls(", cert = \"x\""), "grpc_tls.cert"),
        (
            format!("grpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\" }}\n"),
            "grpc_tls",
        ),
    ] {
        assert_refused(&run(&["validate"], Some(&config), &[]), key);
    }
    let output = run(
        &["validate"],
        Some(&tls(&format!(
            ", client_ca_file = \"{dir}/ca.pem\", client_san = \"envoy.example\""
        ))),
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("clients with a certificate for envoy.example"),
        "{printed}"
    );
}

/// `store.tls`: without a `rediss://` URL (Sentinel's included), with a missing or malformed
/// file, half an identity, the key of another certificate, no file at all; each refused with
/// one line naming the key. A good one validates.
#[test]
fn bad_store_tls_settings_are_refused_naming_the_key() {
    let certs = TempDir::new("store-tls");
    make_certificates(certs.path());
    make_client_certificate(certs.path(), "other", "DNS:other.example");
    let garbage = certs.write("garbage.pem", "not PEM at all\n");
    let dir = certs.path().display();
    let garbage = garbage.display();
    let store = |url: &str, tls: &str| {
        format!("[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntls = {{ {tls} }}\n")
    };
    let tls = |fields: &str| store("rediss://127.0.0.1:6380/0", fields);
    let identity = format!("cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\"");
    for (config, key) in [
        (store("redis://127.0.0.1:6379/0", &identity), "store.tls"),
        (
            tls(&format!("ca_file = \"{dir}/none.pem\"")),
            "store.tls.ca_file",
        ),
        (
            tls(&format!("ca_file = \"{garbage}\"")),
            "store.tls.ca_file",
        ),
        (
            tls(&format!("cert_file = \"{dir}/cert.pem\"")),
            "store.tls.key_file",
        ),
        (
            tls(&format!("key_file = \"{dir}/key.pem\"")),
            "store.tls.cert_file",
        ),
        (
            tls(&format!(
                "cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/other.key\""
            )),
            "store.tls.key_file",
        ),
        (tls(""), "store.tls"),
        (tls("ca = \"x\""), "store.tls.ca"),
        (
            format!(
                "{}sentinel = {{ master = \"m\", urls = [\"redis://127.0.0.1:26379\"] }}\n",
                store("redis://127.0.0.1:6379/0", &identity)
            ),
            "store.tls",
        ),
    ] {
        assert_refused(&run(&["validate"], Some(&config), &[]), key);
    }
    let good = tls(&format!("ca_file = \"{dir}/ca.pem\", {identity}"));
    let output = run(&["validate"], Some(&good), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains(&format!(
            "node: TLS, CA {dir}/ca.pem, client certificate {dir}/cert.pem, no password"
        )),
        "{printed}"
    );
}

/// The same in TOML: TLS asked for on the sentinels' side (`rediss://` sentinels, `store.tls`)
/// with a master left in clear is refused unless `master_tls = false` says it; the summary
/// then says what each side uses.
#[test]
fn a_sentinel_config_cannot_claim_tls_while_the_master_is_in_clear() {
    let certs = TempDir::new("sentinel-tls");
    make_certificates(certs.path());
    let ca = certs.path().join("ca.pem").display().to_string();
    let config = |sentinel_extra: &str| {
        format!(
            "[store]\nbackend = \"redis\"\ntls = {{ ca_file = \"{ca}\" }}\n\
             sentinel = {{ master = \"m\", urls = [\"rediss://127.0.0.1:26394\"]{sentinel_extra} }}\n"
        )
    };
    assert_refused(
        &run(&["validate"], Some(&config("")), &[]),
        "store.sentinel.master_tls",
    );
    let output = run(
        &["validate"],
        Some(&config(
            ", master_tls = true, master_password = \"masterpw\"",
        )),
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains(&format!(
            "master: TLS, CA {ca}, client certificate none, password set; sentinels: TLS, \
             CA {ca}, client certificate none, no password"
        )),
        "{printed}"
    );
    assert!(!printed.contains("masterpw"), "{printed}");
    let output = run(&["validate"], Some(&config(", master_tls = false")), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("master: plaintext, no password"),
        "said outright"
    );
}
