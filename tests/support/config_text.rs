//! Config text for tests: a Redis-backed config, and one `[[limits]]` table at a time.

use super::*;

/// A config for a Redis-backed tollgate: `extra_store` lines go into `[store]` (a
/// `timeout_ms` there replaces the default of 2000), `limits` is appended verbatim.
/// `[store]` lines for a test that counts script calls: the runtime-override poll (one script
/// call per instance every 250 ms by default) runs once at start, then not for a minute. The
/// one at start is a background task that a starved machine may run after the first checks:
/// wait for it with [`commandstats::wait_for_start_up_polls`] before counting.
pub const QUIET_POLL: &str = "override_poll_ms = 60000";

pub fn redis_config(redis: &RedisServer, extra_store: &str, limits: &str) -> String {
    let timeout = if extra_store.contains("timeout_ms") {
        ""
    } else {
        // Generous: tests that count decisions must not see a slow call on a loaded machine
        // answered per `on_error`. Tests about timeouts set their own budget.
        "timeout_ms = 2000\n"
    };
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n{timeout}{extra_store}\n\n{limits}",
        redis.url()
    )
}

/// One `[[limits]]` table of a test config, so a test spells only what it is about:
/// `limit("per-ip", 1, 5, &["ip"]).set("shadow", true)`. Values given to [`Limit::set`] are
/// TOML as written (numbers, booleans); [`Limit::set_str`] quotes a string. Derefs to the
/// TOML text, and tables concatenate with `+`.
pub fn limit(
    name: &str,
    rate: impl std::fmt::Display,
    burst: impl std::fmt::Display,
    key: &[&str],
) -> Limit {
    let key: Vec<String> = key.iter().map(|part| format!("{part:?}")).collect();
    Limit(format!(
        "[[limits]]\nname = {name:?}\nrate = {rate}\nburst = {burst}\nkey = [{}]\n",
        key.join(", ")
    ))
}

/// A `[[limits]]` table as TOML text; see [`limit`].
#[derive(Debug, Clone)]
pub struct Limit(String);

impl Limit {
    pub fn set(mut self, field: &str, value: impl std::fmt::Display) -> Limit {
        self.0.push_str(&format!("{field} = {value}\n"));
        self
    }

    pub fn set_str(self, field: &str, value: &str) -> Limit {
        self.set(field, format!("{value:?}"))
    }
}

impl std::ops::Deref for Limit {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Add<Limit> for Limit {
    type Output = Limit;
    fn add(mut self, other: Limit) -> Limit {
        self.0.push_str(&other.0);
        self
    }
}
