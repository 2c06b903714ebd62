//! Shipped configs in a real Envoy: Istio's EnvoyFilter patches, mutual TLS, the `RateLimit`
//! header family.

use super::*;

/// Proves: the two patches of `config/envoy/istio-envoyfilter.yaml`, applied by hand as Istio
/// applies them to the gateway's Envoy (the filter inserted before the router, its cluster
/// renamed to the one here; the `rate_limits` merged into the virtual host) to ratelimit.yaml,
/// load in a real Envoy without a deprecation warning and send descriptors that the shipped
/// tollgate-grpc.toml limits: per client address and per API key. Istio itself (its cluster
/// name, its listener match) is not run.
#[test]
fn istio_envoyfilter_patches_run_in_a_real_envoy_and_reach_the_shipped_limits() {
    let istio: Value = serde_yaml::from_str(&read_shipped("config/envoy/istio-envoyfilter.yaml"))
        .expect("the EnvoyFilter is YAML");
    let patches = istio["spec"]["configPatches"]
        .as_sequence()
        .expect("configPatches");
    assert_eq!(patches[0]["applyTo"], "HTTP_FILTER");
    assert_eq!(patches[0]["patch"]["operation"], "INSERT_BEFORE");
    assert_eq!(
        patches[0]["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"],
        "envoy.filters.http.router"
    );
    assert_eq!(patches[1]["applyTo"], "VIRTUAL_HOST");
    assert_eq!(patches[1]["patch"]["operation"], "MERGE");
    let mut filter = patches[0]["patch"]["value"].clone();
    filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"] =
        Value::from("tollgate");
    // As in `Rls::envoy`: tollgate's answer, not Envoy's timeout, on a loaded machine.
    filter["typed_config"]["timeout"] = Value::from("1s");
    let rate_limits = patches[1]["patch"]["value"]["rate_limits"].clone();

    let rls = Rls::start(&[], "");
    let (addr, shipped) = Envoy::ratelimit_config(rls.grpc, rls.app.addr, &[]);
    let mut config: Value = serde_yaml::from_str(&shipped).expect("ratelimit.yaml is YAML");
    let manager = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    let router = manager["http_filters"][1].clone();
    assert_eq!(router["name"], "envoy.filters.http.router");
    manager["http_filters"] = Value::Sequence(vec![filter, router]);
    manager["route_config"]["virtual_hosts"][0]["rate_limits"] = rate_limits;
    // As JSON (which is YAML): serde_yaml writes the string "OFF" bare, which Envoy's YAML
    // 1.1 parser reads as a boolean.
    let envoy = Envoy::start(addr, &serde_json::to_string(&config).expect("JSON"));

    let statuses: Vec<u16> = (0..=PER_IP)
        .map(|_| from(&envoy, CLIENT_A, "GET", "/", &[]).status)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        PER_IP as usize
    );
    assert_denied_by(&from(&envoy, CLIENT_A, "GET", "/", &[]), "per-ip");
    let key = [("X-Api-Key", "k1")];
    assert_eq!(from(&envoy, CLIENT_B, "GET", "/", &key).status, 200);
    assert_eq!(from(&envoy, CLIENT_B, "GET", "/", &key).status, 200);
    assert_denied_by(&from(&envoy, CLIENT_B, "GET", "/", &key), "per-api-key");
    assert_eq!(rls.app.count(), PER_IP as usize + 2);
}

/// Proves, with tollgate's gRPC listener on mutual TLS (`grpc_tls` with a client CA and the
/// subject name Envoy's certificate must carry) and ratelimit.yaml's `tollgate` cluster given
/// an `UpstreamTlsContext` (its client certificate, the CA, the listener's name), as Envoy
/// Gateway runs its rate limit service: the client gets 200 up to the limit, then 429; Envoy
/// did handshake with tollgate. An Envoy showing a certificate for another name is refused at
/// the handshake and fails open: the limit never binds.
#[test]
fn ratelimit_filter_calls_tollgate_over_mutual_tls() {
    let certs = crate::support::TempDir::new("grpc-tls");
    crate::support::make_certificates(certs.path());
    crate::support::make_client_certificate(certs.path(), "envoy", "DNS:envoy.example");
    crate::support::make_client_certificate(certs.path(), "other", "DNS:other.example");
    let dir = certs.path().display();
    let listen = "grpc_listen  = \"0.0.0.0:8081\"";
    let tls = format!(
        "{listen}\ngrpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\", \
         client_ca_file = \"{dir}/ca.pem\", client_san = \"envoy.example\" }}"
    );
    let rls = Rls::start(&[(listen, &tls)], "");
    let cluster = "    - name: tollgate\n      type: STRICT_DNS\n";
    let with_tls = |client: &str| {
        format!(
            "{cluster}      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          common_tls_context:
            tls_certificates:
              - certificate_chain: {{ filename: \"{dir}/{client}.pem\" }}
                private_key: {{ filename: \"{dir}/{client}.key\" }}
            validation_context:
              trusted_ca: {{ filename: \"{dir}/ca.pem\" }}
              match_typed_subject_alt_names:
                - san_type: IP_ADDRESS
                  matcher: {{ exact: \"127.0.0.1\" }}
"
        )
    };

    let envoy = rls.envoy(&[(cluster, &with_tls("envoy"))]);
    for _ in 0..PER_IP {
        let allowed = from(&envoy, CLIENT_A, "GET", "/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert!(allowed.header("ratelimit").is_some(), "{allowed:?}");
    }
    let denied = from(&envoy, CLIENT_A, "GET", "/", &[]);
    assert_denied_with_quota_headers(&denied, "per-ip");
    assert!(envoy.stat("cluster.tollgate.ssl.handshake") >= 1);
    assert_eq!(envoy.stat("cluster.app.ratelimit.over_limit"), 1);

    // Not `rls.envoy`: the application has been called already.
    let other = with_tls("other");
    let refused = Envoy::ratelimit(
        rls.grpc,
        rls.app.addr,
        &[(" timeout: 0.1s", " timeout: 1s"), (cluster, &other)],
    );
    for _ in 0..=PER_IP {
        let passed = from(&refused, CLIENT_B, "GET", "/", &[]);
        assert_eq!(passed.status, 200, "{passed:?}");
        assert_eq!(
            passed.header("ratelimit"),
            None,
            "tollgate answered: {passed:?}"
        );
    }
    assert_eq!(
        refused.stat("cluster.app.ratelimit.failure_mode_allowed"),
        u64::from(PER_IP) + 1,
        "every call failed and was let through"
    );
    assert_eq!(refused.stat("cluster.app.ratelimit.over_limit"), 0);
    assert_eq!(rls.app.count(), 2 * PER_IP as usize + 1);
}

/// Proves, with `envoy.response_headers` (envoyproxy/ratelimit's
/// `LIMIT_RESPONSE_HEADERS_ENABLED`) and one name changed (its `LIMIT_REMAINING_HEADER`): the
/// client behind the shipped ratelimit.yaml gets `RateLimit-Limit`, the renamed remaining
/// header and `RateLimit-Reset` on allowed responses and on Envoy's 429, once each.
#[test]
fn ratelimit_filter_hands_over_the_ratelimit_header_family() {
    let rls = Rls::start(
        &[],
        "[envoy]\nresponse_headers = true\n\n[response.ratelimit_names]\nremaining = \"X-Left\"\n",
    );
    let envoy = rls.envoy(&[]);
    for remaining in (0..PER_IP).rev() {
        let allowed = from(&envoy, CLIENT_A, "GET", "/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        assert_eq!(
            allowed.header("ratelimit-limit"),
            Some(PER_IP.to_string().as_str())
        );
        assert_eq!(
            allowed.header("x-left"),
            Some(remaining.to_string().as_str())
        );
        assert!(allowed.header("ratelimit-reset").is_some(), "{allowed:?}");
        assert_eq!(count(&allowed, "ratelimit-limit"), 1, "{allowed:?}");
    }
    let denied = from(&envoy, CLIENT_A, "GET", "/", &[]);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("x-left"), Some("0"));
    assert_eq!(
        denied.header("ratelimit-limit"),
        Some(PER_IP.to_string().as_str())
    );
}
