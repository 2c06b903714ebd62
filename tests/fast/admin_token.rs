//! The admin token: required by the admin listener's mutating requests, read from the config,
//! a file or the environment, rotated by SIGHUP, never shown.

use std::time::Duration;

use crate::support::{redis_config, RedisServer, Tollgate};

use crate::reports::{post, REPORT_LIMITS, TOKEN};

#[test]
fn without_a_configured_token_report_is_forbidden_and_names_the_setting() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&redis_config(&redis, "", REPORT_LIMITS));
    let answer = post(
        tollgate.admin,
        Some(TOKEN),
        r#"{"limit": "llm-tokens", "key": ["a"], "cost": 1}"#,
    );
    assert_eq!(answer.status, 403);
    assert!(answer.body.contains("admin_token"), "{}", answer.body);
}

#[test]
fn the_token_may_come_from_a_file_or_the_environment_and_never_shows() {
    let redis = RedisServer::start();
    let dir = crate::support::TempDir::new("token");
    let file = dir.write("token", &format!("{TOKEN}\n"));
    let config = format!(
        "admin_token_file = \"{}\"\n{}",
        file.display(),
        redis_config(&redis, "", REPORT_LIMITS)
    );
    let valid = r#"{"limit": "llm-tokens", "key": ["f"], "cost": 1}"#;
    let (from_file, log) = Tollgate::start_logged(&config, &[("RUST_LOG", "debug")]);
    assert_eq!(post(from_file.admin, Some(TOKEN), valid).status, 200);
    assert_eq!(post(from_file.admin, Some("x"), valid).status, 401);

    let digits = "12345678901234567890";
    let from_env = Tollgate::start_with_env(
        &redis_config(&redis, "", REPORT_LIMITS),
        &[("TOLLGATE_ADMIN_TOKEN", digits)],
    );
    assert_eq!(post(from_env.admin, Some(digits), valid).status, 200);

    let validated = crate::support::tollgate_command()
        .args(["validate", "--config"])
        .arg(&from_env.config_path)
        .env("TOLLGATE_ADMIN_TOKEN", digits)
        .output()
        .expect("run validate");
    let shown = String::from_utf8_lossy(&validated.stdout);
    assert!(validated.status.success(), "{shown}");
    assert!(shown.contains("admin_token   set"), "{shown}");
    assert!(!shown.contains(digits), "validate shows the token: {shown}");
    drop(from_file);
    let logs = std::fs::read_to_string(log).unwrap_or_default();
    assert!(!logs.contains(TOKEN), "the token reached the logs");
}

#[test]
fn sighup_rotates_the_admin_token() {
    let dir = crate::support::TempDir::new("rotate");
    let file = dir.write("token", TOKEN);
    let config = format!("admin_token_file = \"{}\"\n{REPORT_LIMITS}", file.display());
    let tollgate = Tollgate::start(&config);
    let body = r#"{"limit": "llm-tokens", "key": ["r"], "cost": 1}"#;
    assert_eq!(post(tollgate.admin, Some(TOKEN), body).status, 200);
    let rotated = "rotated-token-9876543210";
    dir.write("token", rotated);
    tollgate.signal("HUP");
    assert!(
        crate::support::wait_until(Duration::from_secs(5), || post(
            tollgate.admin,
            Some(rotated),
            body
        )
        .status
            == 200),
        "the new token is accepted after SIGHUP"
    );
    assert_eq!(post(tollgate.admin, Some(TOKEN), body).status, 401);
}
