//! Reading Redis `INFO commandstats`: how many times a command ran, to count round trips.

use std::time::Duration;

use super::{wait_until, RedisServer};

/// `calls=` of one command (lowercase, e.g. `evalsha`); 0 if it never ran.
pub fn calls(redis: &RedisServer, command: &str) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Script runs of any kind (`EVALSHA`, and `EVAL` after a `NOSCRIPT`).
pub fn script_calls(redis: &RedisServer) -> u64 {
    calls(redis, "evalsha") + calls(redis, "eval")
}

/// Waits until each of `instances` tollgates started on `redis` with [`super::QUIET_POLL`]
/// has made its start-up runtime-override poll (one script call each), so that no
/// background script call lands among the calls a test counts afterwards.
///
/// The poll is a background task: an instance answers `/healthz`, and even its first checks,
/// before it has run on a starved machine. Call this before the first check (script calls
/// made then are the polls' alone; the instances must not use `on_error = "local"`, whose
/// heartbeat calls a script every 2 s).
pub fn wait_for_start_up_polls(redis: &RedisServer, instances: u64) {
    assert!(
        wait_until(Duration::from_secs(20), || script_calls(redis) >= instances),
        "{instances} instance(s) never polled their runtime overrides at start: {} script calls",
        script_calls(redis)
    );
}
