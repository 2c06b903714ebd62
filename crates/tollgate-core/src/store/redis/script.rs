//! The scripts tollgate runs, and how a call names one: `EVALSHA` by its SHA1, or `EVAL` whole
//! on a connection that may not have it yet.

use std::sync::atomic::AtomicU64;

use redis::{Cmd, Value};

use super::connection::Connection;

/// `lua/token_bucket.lua` as shipped: its bounds (`lua/bounds.lua`) in front, its plain checks,
/// then what only its general form (`lua/decide.lua`, last) uses. The bench scripts load the
/// same files in the same order (`bench/lib.sh`, `bucket_script`).
pub const BUCKET_SCRIPT: &str = concat!(
    include_str!("../../../../../lua/bounds.lua"),
    include_str!("../../../../../lua/token_bucket.lua"),
    include_str!("../../../../../lua/calendar.lua"),
    include_str!("../../../../../lua/stored.lua"),
    include_str!("../../../../../lua/groups.lua"),
    include_str!("../../../../../lua/global.lua"),
    include_str!("../../../../../lua/decide.lua")
);
/// `lua/region.lua` as shipped.
pub const REGION_SCRIPT: &str = include_str!("../../../../../lua/region.lua");
/// `lua/global_share.lua` as shipped, bounds, stored forms and the global arithmetic included.
pub const GLOBAL_SHARE_SCRIPT: &str = concat!(
    include_str!("../../../../../lua/bounds.lua"),
    include_str!("../../../../../lua/stored.lua"),
    include_str!("../../../../../lua/groups.lua"),
    include_str!("../../../../../lua/global.lua"),
    include_str!("../../../../../lua/global_share.lua")
);
/// `lua/report.lua` as shipped, calendar, bounds and stored forms included.
pub const REPORT_SCRIPT: &str = concat!(
    include_str!("../../../../../lua/calendar.lua"),
    include_str!("../../../../../lua/bounds.lua"),
    include_str!("../../../../../lua/stored.lua"),
    include_str!("../../../../../lua/report.lua")
);
/// `lua/refund.lua` as shipped, bounds and stored forms included.
pub const REFUND_SCRIPT: &str = concat!(
    include_str!("../../../../../lua/bounds.lua"),
    include_str!("../../../../../lua/stored.lua"),
    include_str!("../../../../../lua/refund.lua")
);
pub(super) const INSTANCES_SCRIPT: &str = include_str!("../../../../../lua/instances.lua");

/// A Lua script and its SHA1, as `EVALSHA` wants it.
pub(super) struct LuaScript {
    pub(super) source: &'static str,
    pub(super) sha: String,
    /// The connection epoch (see [`RedisStore::epoch`]) in which the script last ran; in any
    /// other it is sent whole, since a new connection may reach a node that lacks it.
    pub(super) loaded_in: AtomicU64,
}

impl LuaScript {
    pub(super) fn new(source: &'static str) -> LuaScript {
        LuaScript {
            source,
            sha: redis::Script::new(source).get_hash().to_string(),
            loaded_in: AtomicU64::new(NEVER),
        }
    }

    /// `EVALSHA sha numkeys keys... args...`, or `EVAL source ...` when `by_source`.
    pub(super) fn command(
        &self,
        by_source: bool,
        keys: &[&str],
        args: impl FnOnce(&mut Cmd),
    ) -> Cmd {
        let mut cmd = script_command(self.source, &self.sha, by_source);
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        args(&mut cmd);
        cmd
    }
}

/// `EVAL source` when `by_source`, else `EVALSHA sha`: a script call without its keys and
/// arguments.
pub(super) fn script_command(source: &str, sha: &str, by_source: bool) -> Cmd {
    if by_source {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(source);
        cmd
    } else {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha);
        cmd
    }
}

/// Sends `command(whole)` (the script whole when `whole`, else by its SHA1); a `NOSCRIPT`
/// (a node restarted, flushed or promoted behind the same connection) is answered by sending
/// it whole, once, to the same node (on a Cluster the command is routed by its first key).
pub(super) async fn call_script(
    connection: &Connection,
    whole: bool,
    command: impl Fn(bool) -> Cmd,
) -> redis::RedisResult<Value> {
    match connection.query(&command(whole)).await {
        Err(e)
            if !whole && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
        {
            connection.query(&command(true)).await
        }
        other => other,
    }
}

/// No epoch: the script has not run yet.
pub(super) const NEVER: u64 = u64::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_sha_is_stable() {
        let script = LuaScript::new(BUCKET_SCRIPT);
        assert_eq!(script.sha.len(), 40);
    }
}
