//! Runtime overrides in Redis: one hash per limit (field: the escaped key tail, value: the
//! entry's compact JSON with its absolute expiry), a hash of versions (field: the limit, value:
//! a version changed by every change, never the same twice), and per limit a change log, an
//! expiry index, a history of versions and a floor (`lua/override_log.lua`), all in one
//! Cluster slot ([`crate::base::keys::override_part_key`]). Every change, its version and its
//! log entry go in one script, with the expiry computed there from Redis `TIME`, so every
//! instance reads one clock; an instance catches up by reading only what changed.

use std::sync::LazyLock;
use std::time::Instant;

use redis::Value;

use super::script::LuaScript;
use super::RedisStore;
use crate::base::keys;
use crate::store::StoreError;

macro_rules! with_log {
    ($script:literal) => {
        LazyLock::new(|| {
            LuaScript::new(concat!(
                include_str!("../../../../../lua/override_log.lua"),
                include_str!(concat!("../../../../../lua/", $script))
            ))
        })
    };
}

static PUT: LazyLock<LuaScript> = with_log!("override_put.lua");
static DELETE: LazyLock<LuaScript> = with_log!("override_delete.lua");
static CHANGES: LazyLock<LuaScript> = with_log!("override_changes.lua");
static RESTORE: LazyLock<LuaScript> = with_log!("override_restore.lua");
static POLL: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("../../../../../lua/override_poll.lua")));

/// The keys of one limit's runtime overrides, in the order the scripts take them, and the
/// store's epoch, which a change marks (`lua/override_put.lua`).
pub struct LimitKeys([String; 6], String);

impl LimitKeys {
    pub fn new(prefix: &str, limit: &str) -> LimitKeys {
        let part = |name| keys::override_part_key(prefix, name, limit);
        LimitKeys(
            [
                keys::override_versions_key(prefix),
                keys::overrides_key(prefix, limit),
                part("log"),
                part("expiries"),
                part("floor"),
                part("history"),
            ],
            keys::override_epoch_key(prefix),
        )
    }

    fn all(&self) -> [&str; 6] {
        self.0.each_ref().map(String::as_str)
    }

    /// [`LimitKeys::all`] and then the epoch: what a change takes.
    fn changing(&self) -> Vec<&str> {
        let mut keys = self.all().to_vec();
        keys.push(&self.1);
        keys
    }

    /// Every key but the version hash, as the restore script takes them per limit.
    fn own(&self) -> [&str; 5] {
        let [_, own @ ..] = self.all();
        own
    }
}

/// The answer to a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Written,
    /// The limit holds this many entries already.
    Full(u64),
}

/// What a poll learns: the store's time, whether any version exists, each limit's version,
/// and the store's epoch (a new one: the store lost its data).
#[derive(Debug, Clone, PartialEq)]
pub struct Versions {
    pub now_ms: i64,
    pub exists: bool,
    pub versions: Vec<(String, i64)>,
    pub epoch: i64,
}

/// What changed in one limit since a version: raw tail and JSON per entry (`None`: removed),
/// or, when `whole`, every entry the limit holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Changes {
    pub now_ms: i64,
    pub version: i64,
    pub whole: bool,
    pub entries: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// One limit's entries to write back: its keys, its name, the version they were read at,
/// (tail, JSON) per entry.
pub struct Restore<'a> {
    pub keys: LimitKeys,
    pub limit: &'a str,
    pub held: i64,
    pub entries: Vec<(Vec<u8>, String)>,
}

fn malformed(what: &str) -> StoreError {
    StoreError::Script(format!("malformed {what} reply"))
}

impl RedisStore {
    /// Sets one entry (`json` without its expiry) for `ttl_ms` (0: until deleted), dropping
    /// the limit's expired entries; refused when the limit already holds `max` others.
    pub async fn override_put(
        &self,
        keys: &LimitKeys,
        limit: &str,
        tail: &[u8],
        json: &str,
        ttl_ms: u64,
        max: usize,
    ) -> Result<Put, StoreError> {
        let reply = self
            .run_script(
                &PUT,
                &keys.changing(),
                |cmd| {
                    cmd.arg(limit).arg(tail).arg(json).arg(ttl_ms).arg(max);
                },
                Instant::now() + self.timeout,
            )
            .await?;
        match reply {
            Value::Array(items) if items.len() == 3 => match (as_int(&items[0]), as_int(&items[2]))
            {
                (Some(1), _) => Ok(Put::Written),
                (Some(0), Some(count)) => Ok(Put::Full(u64::try_from(count).unwrap_or(0))),
                _ => Err(malformed("override put")),
            },
            _ => Err(malformed("override put")),
        }
    }

    /// Removes one entry; whether it was there.
    pub async fn override_delete(
        &self,
        keys: &LimitKeys,
        limit: &str,
        tail: &[u8],
        max: usize,
    ) -> Result<bool, StoreError> {
        let reply = self
            .run_script(
                &DELETE,
                &keys.changing(),
                |cmd| {
                    cmd.arg(limit).arg(tail).arg(max);
                },
                Instant::now() + self.timeout,
            )
            .await?;
        match reply {
            Value::Array(items) if items.len() == 2 => as_int(&items[0])
                .map(|removed| removed > 0)
                .ok_or_else(|| malformed("override delete")),
            _ => Err(malformed("override delete")),
        }
    }

    /// Every limit's version, the store's time and its epoch (0: none yet).
    pub async fn override_versions(
        &self,
        versions: &str,
        epoch: &str,
    ) -> Result<Versions, StoreError> {
        let reply = self
            .run_script(
                &POLL,
                &[versions, epoch],
                |_| {},
                Instant::now() + self.timeout,
            )
            .await?;
        let bad = || malformed("override poll");
        let Value::Array(items) = reply else {
            return Err(bad());
        };
        let [now, exists, Value::Array(pairs), epoch] = items.as_slice() else {
            return Err(bad());
        };
        let versions = pairs
            .chunks(2)
            .map(|pair| match pair {
                [name, version] => Some((text(name)?, as_int(version)?)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        Ok(Versions {
            now_ms: as_int(now).ok_or_else(bad)?,
            exists: as_int(exists).ok_or_else(bad)? == 1,
            versions,
            epoch: as_int(epoch).ok_or_else(bad)?,
        })
    }

    /// What changed in one limit since `since` (0: everything), at most `most` entries
    /// before the whole limit comes instead; expired entries are dropped from the store.
    pub async fn override_changes(
        &self,
        keys: &LimitKeys,
        limit: &str,
        since: i64,
        most: usize,
        max: usize,
    ) -> Result<Changes, StoreError> {
        let reply = self
            .run_script(
                &CHANGES,
                &keys.all(),
                |cmd| {
                    cmd.arg(limit).arg(since).arg(most).arg(max);
                },
                Instant::now() + self.timeout,
            )
            .await?;
        let bad = || malformed("override changes");
        let Value::Array(items) = reply else {
            return Err(bad());
        };
        let [now, version, whole, Value::Array(pairs)] = items.as_slice() else {
            return Err(bad());
        };
        let entries = pairs
            .chunks(2)
            .map(|pair| match pair {
                [Value::BulkString(tail), Value::BulkString(json)] => {
                    Some((tail.clone(), (!json.is_empty()).then(|| json.clone())))
                }
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        Ok(Changes {
            now_ms: as_int(now).ok_or_else(bad)?,
            version: as_int(version).ok_or_else(bad)?,
            whole: as_int(whole).ok_or_else(bad)? == 1,
            entries,
        })
    }

    /// Writes `limits` back where the store holds nothing newer (`lua/override_restore.lua`);
    /// how many limits this call wrote.
    pub async fn override_restore(
        &self,
        versions: &str,
        restored: &str,
        epoch: &str,
        limits: &[Restore<'_>],
        max: usize,
    ) -> Result<usize, StoreError> {
        let mut keys = vec![versions, restored, epoch];
        keys.extend(limits.iter().flat_map(|l| l.keys.own()));
        let reply = self
            .run_script(
                &RESTORE,
                &keys,
                |cmd| {
                    cmd.arg(max);
                    for limit in limits {
                        cmd.arg(limit.limit)
                            .arg(limit.held)
                            .arg(limit.entries.len());
                        for (tail, json) in &limit.entries {
                            cmd.arg(tail.as_slice()).arg(json.as_str());
                        }
                    }
                },
                Instant::now() + self.timeout,
            )
            .await?;
        as_int(&reply)
            .and_then(|written| usize::try_from(written).ok())
            .ok_or_else(|| malformed("override restore"))
    }
}

/// An integer reply, or one sent as text (a hash's values).
fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}
