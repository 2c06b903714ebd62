//! Changes without the token, and hostile requests: refused with a 4xx, never a 5xx, and
//! nothing changes.

use super::*;

#[test]
fn without_a_token_every_change_is_refused_and_nothing_changes() {
    let redis = RedisServer::start();
    let [a, b, _c] = three(&redis, None);
    for (method, body) in [("PUT", r#"{"unlimited": true}"#), ("DELETE", "")] {
        let answer = admin_json(
            a.admin,
            method,
            "/v1/overrides/tight?key=acme",
            Some(TOKEN),
            body,
        );
        assert_eq!(answer.status, 403, "{method}: {answer:?}");
        assert!(answer.body.contains("admin_token"), "{}", answer.body);
    }
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(listed(&b, "tight", None), serde_json::json!([]));
    assert_eq!(admitted(&[&a, &b], "acme", 4), 2, "still limited");
    assert_eq!(
        redis.cli(&["--scan", "--pattern", "*overrides*"]).trim(),
        "",
        "nothing written to the store"
    );

    // With a token configured, a wrong or missing one is 401 and changes nothing either.
    let guarded = Tollgate::start(&config(&redis, Some(TOKEN)));
    for token in [Some("wrong"), None] {
        let answer = admin_json(
            guarded.admin,
            "PUT",
            "/v1/overrides/tight?key=acme",
            token,
            r#"{"unlimited": true}"#,
        );
        assert_eq!(answer.status, 401, "{answer:?}");
        assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
    }
    assert_eq!(
        listed(&guarded, "tight", Some(TOKEN)),
        serde_json::json!([])
    );
}

#[test]
fn hostile_requests_are_answered_400_or_404_never_5xx() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&config(&redis, Some(TOKEN)));
    let huge = "k".repeat(20_000);
    let cases: Vec<(&str, String, &str, u16)> = vec![
        (
            "PUT",
            "/v1/overrides/nope?key=a".into(),
            r#"{"burst":5}"#,
            404,
        ),
        ("GET", "/v1/overrides/nope".into(), "", 404),
        ("DELETE", "/v1/overrides/nope?key=a".into(), "", 404),
        ("PUT", "/v1/overrides/tight".into(), r#"{"burst":5}"#, 400),
        (
            "PUT",
            "/v1/overrides/tight?key=a&key=b".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/per-ip?key=a".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/per-ip?key=not-an-ip&key=a".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?kye=a".into(),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            format!("/v1/overrides/tight?key={}", "k".repeat(2000)),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            format!("/v1/overrides/tight?{}", "key=a&".repeat(500)),
            r#"{"burst":5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=%ff%fe".into(),
            r#"{"brust":5}"#,
            400,
        ),
        ("PUT", "/v1/overrides/tight?key=a".into(), "not json", 400),
        ("PUT", "/v1/overrides/tight?key=a".into(), "[1]", 400),
        ("PUT", "/v1/overrides/tight?key=a".into(), "{}", 400),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":0}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":-1}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":1e30}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"rate":"5/fortnight"}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"rate":"0/s"}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"rate":[1]}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"unlimited":true,"burst":4}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"unlimited":"yes"}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":0}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":-3}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":315360001}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":1.5}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"ttl_s":"60"}"#,
            400,
        ),
        (
            "PUT",
            "/v1/overrides/tight?key=a".into(),
            r#"{"burst":5,"x":"#,
            400,
        ),
    ];
    for (method, path, body, expected) in &cases {
        let answer = admin_json(tollgate.admin, method, path, Some(TOKEN), body);
        assert_eq!(
            answer.status,
            *expected,
            "{method} {}: {}",
            &path[..path.len().min(80)],
            answer.body
        );
    }
    // A request line too long for the server is refused before any handler, still not a 5xx.
    let answer = admin_json(
        tollgate.admin,
        "PUT",
        &format!("/v1/overrides/tight?key={huge}"),
        Some(TOKEN),
        r#"{"burst":5}"#,
    );
    assert!((400..500).contains(&answer.status), "{}", answer.status);
    // Field names come back in the answer.
    let answer = put(&tollgate, "tight", "a", r#"{"burst":5,"ttl_s":0}"#);
    assert!(
        answer.body.contains("\"field\":\"ttl_s\""),
        "{}",
        answer.body
    );
    let answer = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/tight?key=a&key=b",
        Some(TOKEN),
        "{}",
    );
    assert!(answer.body.contains("\"field\":\"key\""), "{}", answer.body);
    // Nothing of it reached the store or the instance.
    assert_eq!(
        listed(&tollgate, "tight", Some(TOKEN)),
        serde_json::json!([])
    );
    assert_eq!(
        listed(&tollgate, "per-ip", Some(TOKEN)),
        serde_json::json!([])
    );
}
