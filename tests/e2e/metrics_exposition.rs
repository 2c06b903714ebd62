//! `/metrics` after real traffic (allowed, denied, and checks during a Redis outage) passes
//! `promtool check metrics`, the linter Prometheus itself ships.

use std::process::Command;
use std::time::Duration;

use crate::support::deploy::{run, text};
use crate::support::{RedisServer, Tollgate};

#[test]
fn metrics_after_allowed_denied_and_failed_checks_pass_promtool() {
    let mut redis = RedisServer::start();
    let tollgate = Tollgate::start(&crate::support::redis_config(
        &redis,
        "",
        "[[limits]]\nname = \"per-ip\"\nrate = 0.1\nburst = 3\nkey = [\"ip\"]\n\n\
         [[limits]]\nname = \"per-key\"\nrate = 100\nburst = 1000\nkey = [\"header:x-api-key\"]\nshadow = true\n",
    ));
    let mut client = tollgate.client();
    let statuses: Vec<u16> = (0..5)
        .map(|_| {
            let headers = [("x-forwarded-for", "203.0.113.7"), ("x-api-key", "k1")];
            client.get("/check", &headers).unwrap().status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);

    redis.kill();
    assert!(crate::support::wait_until(Duration::from_secs(5), || {
        tollgate.check(&[("x-forwarded-for", "203.0.113.8")]).status == 200
            && tollgate.metric("tollgate_store_up") == 0.0
    }));

    let exposition = tollgate.metrics();
    let sample = |s: &str| crate::support::metric_value(&exposition, s);
    assert_eq!(sample("tollgate_checks_total{result=\"allowed\"}"), 3.0);
    assert_eq!(sample("tollgate_checks_total{result=\"denied\"}"), 2.0);
    assert!(sample("tollgate_checks_total{result=\"error_allowed\"}") >= 1.0);
    assert_eq!(
        sample("tollgate_limit_decisions_total{decision=\"denied\",limit=\"per-ip\"}"),
        2.0
    );
    assert!(sample("tollgate_check_duration_seconds_count") >= 6.0);

    let output = run(
        Command::new("promtool").args(["check", "metrics"]),
        &exposition,
    );
    assert!(
        output.status.success(),
        "promtool check metrics: {}\n{exposition}",
        text(&output)
    );
    assert!(text(&output).trim().is_empty(), "{}", text(&output));
}
