//! Who may do what: the token, fingerprints for anonymous readers, hostile queries and
//! hosts, and the bound on admin reads in flight.

use super::*;

#[test]
fn without_the_token_nothing_changes() {
    let redis = RedisServer::start();
    let bucket = "tollgate:per-key:{acme}";
    let open = Tollgate::start(&redis_config(&redis, "", LIMITS));
    let guarded = Tollgate::start_with_env(
        &redis_config(&redis, "", LIMITS),
        &[("TOLLGATE_ADMIN_TOKEN", TOKEN)],
    );
    for _ in 0..5 {
        check_key(&open, "acme");
    }
    let before = stored(&redis, bucket);
    assert!(!before.is_empty());
    let path = format!("/v1/buckets/per-key{}", query(&["acme"]));

    for auth in [None, Some(BEARER), Some("Bearer wrong")] {
        let refused = admin_call(&open, "DELETE", &path, auth);
        assert_eq!(refused.status, 403, "{}", refused.body);
        assert!(refused.body.contains("admin_token"), "{}", refused.body);
    }
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Basic czNjcjN0"),
        Some("Bearer "),
    ] {
        let refused = admin_call(&guarded, "DELETE", &path, auth);
        assert_eq!(refused.status, 401, "{auth:?}: {}", refused.body);
    }
    // Refused before the query is read: hostile ones are refused the same way.
    let hostile = admin_call(&guarded, "DELETE", "/v1/buckets/nope?key=%zz", None);
    assert_eq!(hostile.status, 401);
    assert_eq!(
        stored(&redis, bucket),
        before,
        "a refused reset changed the bucket"
    );
    assert_eq!(check_key(&open, "acme").status, 429);

    let done = admin_call(&guarded, "DELETE", &path, Some(BEARER));
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(stored(&redis, bucket), "");
    assert_eq!(check_key(&open, "acme").status, 200);
}

#[test]
fn anonymous_readers_see_fingerprints_of_keys_and_addresses_as_they_are() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start_with_env(
        &redis_config(&redis, "", LIMITS),
        &[("TOLLGATE_ADMIN_TOKEN", TOKEN)],
    );
    let secret = "sk_live_customer_secret";
    let hidden = peek(&tollgate, "per-key", &[secret], None);
    let fingerprint = hidden["key"][0].as_str().unwrap();
    assert_eq!(fingerprint.len(), 12);
    assert!(fingerprint.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(!hidden.to_string().contains(secret));
    let wrong = peek(&tollgate, "per-key", &[secret], Some("Bearer wrong"));
    assert_eq!(wrong["key"][0], fingerprint);
    assert_eq!(
        peek(&tollgate, "per-key", &[secret], Some(BEARER))["key"][0],
        secret
    );

    for ip in ["203.0.113.7", "2001:db8:1:2::/64"] {
        assert_eq!(peek(&tollgate, "per-ip", &[ip], None)["key"][0], ip);
    }
    // An IPv6 client is keyed by its /64: any address in it names the same bucket.
    tollgate.check(&[("x-forwarded-for", "2001:db8:1:2::99")]);
    let by_network = peek(&tollgate, "per-ip", &["2001:db8:1:2::1"], None);
    assert_eq!(by_network["remaining"], 999);
}

#[test]
fn hostile_queries_get_a_4xx_never_a_5xx() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start_with_env(
        &redis_config(&redis, "", LIMITS),
        &[("TOLLGATE_ADMIN_TOKEN", TOKEN)],
    );
    let huge = format!("?key={}", "A".repeat(100 * 1024));
    #[rustfmt::skip]
    let cases: &[(&str, u16, &str)] = &[
        ("/v1/buckets/nope?key=a", 404, "no limit named"),
        ("/v1/buckets/%FF%00?key=a", 404, ""),
        ("/v1/buckets/per-key", 400, "header:x-api-key"),
        ("/v1/buckets/per-key?key=a&key=b", 400, "1 part(s) [header:x-api-key]"),
        ("/v1/buckets/per-key?key=%zz", 400, "%-escape"),
        ("/v1/buckets/per-key?key=%4", 400, "%-escape"),
        ("/v1/buckets/per-key?key=%FF", 400, "UTF-8"),
        ("/v1/buckets/per-key?limit=x", 400, "unknown parameter"),
        ("/v1/buckets/per-key?key=", 400, "empty"),
        ("/v1/buckets/per-ip?key=not-an-ip", 400, "not an IP address"),
        ("/v1/buckets/per-ip?key=10.0.0.1%2Fx", 400, "not an IP address"),
    ];
    for method in ["GET", "DELETE"] {
        for &(path, status, says) in cases {
            let answer = admin_call(&tollgate, method, path, Some(BEARER));
            assert_eq!(answer.status, status, "{method} {path}: {}", answer.body);
            assert!(
                answer.body.contains(says),
                "{method} {path}: {}",
                answer.body
            );
        }
        // 100 KB of query: refused by the parser or by us, never a 5xx, and the process lives.
        let answer = HttpClient::connect(tollgate.admin).and_then(|mut c| {
            c.request(
                method,
                &format!("/v1/buckets/per-key{huge}"),
                &[("authorization", BEARER)],
            )
        });
        if let Ok(answer) = answer {
            assert!(
                (400..500).contains(&answer.status),
                "{method} huge: {}",
                answer.status
            );
        }
    }
    // A long but acceptable key is hashed like a check's, not refused.
    let long = "k".repeat(4000);
    let peeked = peek(&tollgate, "per-key", &[&long], Some(BEARER));
    assert_eq!(peeked["remaining"], 5);
    check_key(&tollgate, &long);
    assert_eq!(peek(&tollgate, "per-key", &[&long], None)["remaining"], 4);
    // Form-encoded as curl --data-urlencode writes it: `+` a space, `%2B` a plus.
    check_key(&tollgate, "a+b c");
    let curl_style = admin_call(&tollgate, "GET", "/v1/buckets/per-key?key=a%2bb+c", None);
    assert_eq!(
        json(&curl_style.body)["remaining"],
        4,
        "{}",
        curl_style.body
    );
    assert_eq!(
        admin_call(&tollgate, "GET", "/healthz", None).status,
        200,
        "still serving"
    );
}

#[test]
fn the_limits_are_listed_with_override_counts_and_never_the_token() {
    let redis = RedisServer::start();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(&redis, "", LIMITS)
    );
    let (tollgate, log) = Tollgate::start_logged(&config, &[("RUST_LOG", "debug,redis=debug")]);
    let listed = admin_call(&tollgate, "GET", "/v1/limits", Some(BEARER));
    assert_eq!(listed.status, 200);
    let limits = json(&listed.body);
    let per_key = &limits["limits"][0];
    assert_eq!(per_key["name"], "per-key");
    assert_eq!(per_key["rate_per_s"], 1.0 / 60.0);
    assert_eq!(per_key["burst"], 5);
    assert_eq!(per_key["key"][0], "header:x-api-key");
    assert_eq!(per_key["on_missing"], "skip");
    assert_eq!(per_key["overrides"]["file"], 1);
    assert_eq!(limits["limits"][1]["key"][0], "ip");
    assert_eq!(limits["exempt"][0]["name"], "office");
    assert_eq!(limits["exempt"][0]["cidrs"][0], "10.9.0.0/16");
    assert!(!listed.body.contains("vip"), "override keys are not listed");
    let public = tollgate.client().get("/v1/limits", &[]).unwrap();
    assert_eq!(
        public.status, 404,
        "the admin API is not on the public listener"
    );

    // Exercise every admin path once, so each had its chance to log.
    check_key(&tollgate, "acme");
    peek(&tollgate, "per-key", &["acme"], Some(BEARER));
    let path = format!("/v1/buckets/per-key{}", query(&["acme"]));
    admin_call(&tollgate, "DELETE", &path, Some(BEARER));
    admin_call(&tollgate, "DELETE", &path, Some("Bearer wrong"));
    let validate = tollgate_command()
        .args(["validate", "--config"])
        .arg(&tollgate.config_path)
        .output()
        .expect("run validate");
    assert!(validate.status.success());
    let printed = String::from_utf8_lossy(&validate.stdout).into_owned()
        + &String::from_utf8_lossy(&validate.stderr);
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains("reset by the operator"), "{logged}");
    for (place, text) in [
        ("/v1/limits", &listed.body),
        ("validate", &printed),
        ("the log", &logged),
    ] {
        assert!(!text.contains(TOKEN), "the token appears in {place}");
    }
}

/// One request with a chosen `Host` header.
fn with_host(tollgate: &Tollgate, path: &str, host: &str) -> crate::support::Response {
    HttpClient::connect(tollgate.admin)
        .and_then(|mut client| {
            client.send_raw(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        })
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// A page that rebinds its own DNS name to the admin address reaches it with its own name in
/// `Host`: the admin API answers only IP literals, `localhost` and the names configured.
#[test]
fn the_admin_api_refuses_a_host_that_is_not_an_address_or_a_configured_name() {
    let plain = Tollgate::in_process(LIMITS);
    // The router matches the decoded path: a percent-encoded spelling is the same endpoint.
    for path in [
        "/v1/limits",
        "/v1/top",
        "/v1/overrides/per-key",
        "/%761/limits",
        "/v%31/limits",
        "/%76%31/top?window=1m",
        "/%761/buckets/per-key?key=k",
        "/%761/overrides/per-key",
        "/v1%2Flimits",
        "//v1/limits",
    ] {
        let refused = with_host(&plain, path, "rebind.evil.example");
        assert_eq!(refused.status, 421, "{path}: {}", refused.body);
        assert!(refused.body.contains("admin_hosts"), "{}", refused.body);
    }
    for host in ["127.0.0.1", "localhost:9090", "[::1]:9090"] {
        assert_eq!(with_host(&plain, "/v1/limits", host).status, 200, "{host}");
    }
    // Probes and metrics are not the admin API: any Host reaches them.
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(with_host(&plain, path, "rebind.evil.example").status, 200);
    }
    let named = Tollgate::in_process(&format!(
        "admin_hosts = [\"tollgate-admin.ops.svc\"]\n{LIMITS}"
    ));
    assert_eq!(
        with_host(&named, "/v1/limits", "Tollgate-Admin.ops.svc:9090").status,
        200
    );
    assert_eq!(with_host(&named, "/v1/limits", "ops.svc").status, 421);
}

/// The two POST endpoints an application calls, `/report` and `/release`, are the admin API
/// too: a rebinding page's `Host` is refused before the body is read.
#[test]
fn report_and_release_refuse_a_host_that_is_not_an_address_or_a_configured_name() {
    let plain = Tollgate::in_process(LIMITS);
    let post = |path: &str, host: &str| {
        let body = r#"{"lease": "per-key.6b.00000000000000000000000000000001"}"#;
        HttpClient::connect(plain.admin)
            .and_then(|mut client| {
                client.send_raw(
                    format!(
                        "POST {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: \
                         application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
            })
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    };
    for path in [
        "/release",
        "/report",
        "/rel%65ase",
        "/r%65port",
        "/%72eport",
    ] {
        let refused = post(path, "rebind.evil.example");
        assert_eq!(refused.status, 421, "{path}: {}", refused.body);
        assert!(refused.body.contains("admin_hosts"), "{}", refused.body);
        assert_ne!(post(path, "127.0.0.1:9090").status, 421, "{path}");
    }
}

/// Peeks call the store on the connection the readiness probe pings it on: at most a few are
/// in flight, and the rest are answered at once, so a flood of them never queues ahead of
/// the probe.
#[test]
fn admin_reads_in_flight_are_bounded_and_the_rest_answered_at_once() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&redis_config(&redis, "", LIMITS));
    assert_eq!(
        admin_call(&tollgate, "GET", "/v1/buckets/per-key?key=a", None).status,
        200
    );
    redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let answers: Vec<crate::support::Response> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..16)
            .map(|i| {
                let tollgate = &tollgate;
                scope.spawn(move || {
                    admin_call(
                        tollgate,
                        "GET",
                        &format!("/v1/buckets/per-key?key=k{i}"),
                        None,
                    )
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().expect("peek")).collect()
    });
    let busy = answers
        .iter()
        .filter(|a| a.status == 503 && a.body.contains("in flight"))
        .count();
    assert!(busy >= 16 - 8, "answered at once: {busy} of 16");
    assert!(answers
        .iter()
        .filter(|a| a.body.contains("in flight"))
        .all(|a| a.header("retry-after") == Some("1")));
}
