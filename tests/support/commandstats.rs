//! Reading Redis `INFO commandstats`: how many times a command ran, to count round trips.

use super::RedisServer;

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
