//! A store that will not run scripts (an ACL without `@scripting`, `EVAL` renamed away) is
//! said plainly: one log line naming the cause and the remedy, `tollgate_store_up 0`,
//! readiness 503 whatever `on_error`, checks answered per `on_error`; and tollgate recovers
//! without a restart once the store runs scripts again.

use std::time::Duration;

use crate::support::{limit, wait_until, RedisServer, Tollgate};

fn config(url: &str, on_error: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout_ms = 2000\non_error = \"{on_error}\"\n\n{}",
        &*limit("per-ip", 1, 5, &["ip"])
    )
}

fn readyz(tollgate: &Tollgate) -> (u16, String) {
    let response = tollgate
        .client()
        .get("/readyz", &[])
        .expect("readyz answered");
    (response.status, response.body)
}

/// Log lines naming the cause: (at error level, at any level). Other duties that cannot
/// read the store (the runtime-override poll) say so once in their own words.
fn refused_lines(log: &std::path::Path) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let naming: Vec<_> = text
        .lines()
        .filter(|line| line.contains("refuses scripts"))
        .collect();
    let errors = naming
        .iter()
        .filter(|line| line.contains(" ERROR "))
        .count();
    (errors, naming.len())
}

#[test]
fn an_acl_without_scripting_is_said_plainly_never_ready_and_recovers_when_granted() {
    let redis = RedisServer::start();
    redis.cli(&[
        "ACL",
        "SETUSER",
        "tollgate",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-@scripting",
    ]);
    let url = format!("redis://tollgate:pw@127.0.0.1:{}/0", redis.port);
    let (tollgate, log) = Tollgate::start_logged(&config(&url, "allow"), &[]);

    // At start, before any check: warm-up probes the store.
    assert!(
        wait_until(Duration::from_secs(10), || {
            tollgate.metric("tollgate_store_up") == 0.0 && refused_lines(&log).0 > 0
        }),
        "store_up {} and the log says nothing of scripts",
        tollgate.metric("tollgate_store_up")
    );
    let (status, body) = readyz(&tollgate);
    assert_eq!(status, 503, "never ready, even with on_error allow: {body}");
    assert!(body.contains("+@scripting"), "the remedy is named: {body}");

    // Another worker's warm-up or the override poll may still add its own line (a WARN) on
    // a loaded machine; a line per check would add ten.
    let (_, lines_before) = refused_lines(&log);
    let checks = 10;
    for _ in 0..checks {
        assert_eq!(tollgate.check(&[]).status, 200, "on_error allow");
    }
    assert!(tollgate.metric("tollgate_checks_total{result=\"error_allowed\"}") >= 10.0);
    let (errors, lines) = refused_lines(&log);
    assert_eq!(errors, 1, "one line names the cause and the remedy");
    assert!(
        lines - lines_before < checks / 2,
        "a line per check: {lines_before} before {checks} checks, {lines} after:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // Granted: the next probes run a script, and the store decides again.
    redis.cli(&["ACL", "SETUSER", "tollgate", "+@scripting"]);
    assert!(
        wait_until(Duration::from_secs(10), || readyz(&tollgate).0 == 200),
        "ready again without a restart: {:?}",
        readyz(&tollgate)
    );
    assert_eq!(tollgate.metric("tollgate_store_up"), 1.0);
    let decided = || tollgate.metric("tollgate_checks_total{result=\"allowed\"}");
    let before = decided();
    assert_eq!(tollgate.check(&[]).status, 200);
    assert_eq!(decided(), before + 1.0, "decided by the store");
}

#[test]
fn a_renamed_eval_is_said_plainly_and_checks_follow_on_error() {
    let redis = RedisServer::start_with(&[
        "--rename-command",
        "EVAL",
        "",
        "--rename-command",
        "EVALSHA",
        "",
    ]);
    let (tollgate, log) = Tollgate::start_logged(&config(&redis.url(), "deny"), &[]);
    assert!(
        wait_until(Duration::from_secs(10), || refused_lines(&log).0 > 0),
        "the log says nothing of scripts"
    );
    assert_eq!(tollgate.metric("tollgate_store_up"), 0.0);
    let (status, body) = readyz(&tollgate);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("unknown command"),
        "the cause is named: {body}"
    );
    let check = tollgate.check(&[]);
    assert_eq!(check.status, 503, "on_error deny");
    assert_eq!(
        refused_lines(&log).0,
        1,
        "one line names the cause and the remedy"
    );
}
