//! Keeps every instance's runtime overrides in step with the store, and writes changes to it.
//!
//! Redis: each instance asks for every limit's version every `store.override_poll_ms` (one small
//! script call) and catches up on the limits whose version moved, or that hold an entry past
//! its expiry (the catch-up drops it from the store): it reads only the entries changed since
//! the version it holds, so a change costs every instance O(changed), not a read of the whole
//! limit. A change made here is applied at once. While Redis is unreachable the last known
//! overrides stay in force. A new store epoch (or a version hash that vanished) means Redis
//! lost its data (restarted without persistence): every instance that notices offers what it
//! holds, and per limit the newest view wins, so a deletion is not undone by an instance that
//! missed it.
//!
//! Memory store: the table is the store; a change is written to it directly.

use std::collections::{HashMap, HashSet};

use super::{Entry, LimitEntries, RuntimeOverrides, MAX_PER_LIMIT};
use crate::base::keys;
use crate::store::redis::overrides::{Changes, LimitKeys, Put, Restore};
use crate::store::redis::RedisStore;
use crate::store::{AnyStore, StoreError};

/// Most changed entries one catch-up carries; an instance further behind reads the whole limit.
const MOST_CHANGES: usize = 1_000;

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("the limit holds {0} runtime overrides already (at most {MAX_PER_LIMIT})")]
    Full(u64),
}

/// Sets `limit`'s override for the key tail `tail` for `ttl_ms` (0: until deleted).
pub async fn put(
    store: &AnyStore,
    runtime: &RuntimeOverrides,
    prefix: &str,
    limit: &str,
    tail: Vec<u8>,
    mut entry: Entry,
    ttl_ms: u64,
) -> Result<(), WriteError> {
    match store {
        AnyStore::Redis(store) => {
            entry.expires_at_ms = None;
            let json = serde_json::to_string(&entry)
                .map_err(|e| StoreError::Other(format!("cannot encode an override: {e}")))?;
            let keys = LimitKeys::new(prefix, limit);
            match store
                .override_put(&keys, limit, &tail, &json, ttl_ms, MAX_PER_LIMIT)
                .await?
            {
                Put::Written => {}
                Put::Full(count) => return Err(WriteError::Full(count)),
            }
            reload_after_write(store, runtime, prefix, limit).await;
            Ok(())
        }
        AnyStore::Memory(_) => {
            entry.expires_at_ms = (ttl_ms > 0).then(|| {
                u64::try_from(runtime.now_ms())
                    .unwrap_or(0)
                    .saturating_add(ttl_ms)
            });
            runtime
                .insert(limit, tail.into_boxed_slice(), entry)
                .map_err(|count| WriteError::Full(count as u64))
        }
    }
}

/// Removes `limit`'s override for `tail`; whether one was in force.
pub async fn delete(
    store: &AnyStore,
    runtime: &RuntimeOverrides,
    prefix: &str,
    limit: &str,
    tail: &[u8],
) -> Result<bool, WriteError> {
    match store {
        AnyStore::Redis(store) => {
            let keys = LimitKeys::new(prefix, limit);
            let removed = store
                .override_delete(&keys, limit, tail, MAX_PER_LIMIT)
                .await?;
            reload_after_write(store, runtime, prefix, limit).await;
            Ok(removed)
        }
        AnyStore::Memory(_) => Ok(runtime.remove(limit, tail)),
    }
}

/// The instance that made a change applies it now, not at its next poll, and learns the
/// store's epoch the change may just have set: an instance that wrote, then paused before its
/// next poll, must still see a later loss of the store's data as one.
async fn reload_after_write(
    store: &RedisStore,
    runtime: &RuntimeOverrides,
    prefix: &str,
    limit: &str,
) {
    if let Err(error) = sync_once(store, runtime, prefix).await {
        log::debug!(
            "runtime overrides of {limit} not applied after a change (the next poll will): {error}"
        );
    }
}

/// One poll: learn the store's time and versions, write back what a store that lost its data
/// forgot, catch up on what changed.
pub async fn sync_once(
    store: &RedisStore,
    runtime: &RuntimeOverrides,
    prefix: &str,
) -> Result<(), StoreError> {
    let versions_key = keys::override_versions_key(prefix);
    let polled = store
        .override_versions(&versions_key, &keys::override_epoch_key(prefix))
        .await?;
    runtime.learn_store_time(polled.now_ms);
    // Another epoch (or none) than the one known, or versions gone: the store lost its data.
    // Written back before catching up, so what this instance offers is what it held before
    // the loss.
    let known = runtime.epoch();
    if (known != 0 && known != polled.epoch) || !polled.exists {
        restore(store, runtime, prefix).await?;
    }
    runtime.learn_epoch(polled.epoch);
    let remote: HashMap<String, i64> = polled.versions.into_iter().collect();
    let mut names: HashSet<String> = remote.keys().cloned().collect();
    names.extend(runtime.known().into_iter().map(|(name, _)| name));
    for name in names {
        let theirs = remote.get(&name).copied().unwrap_or(0);
        if theirs != runtime.version(&name) || runtime.has_expired(&name) {
            catch_up(store, runtime, prefix, &name).await?;
        }
    }
    Ok(())
}

/// Writes back every unexpired entry this instance holds, limit by limit, where the store
/// holds nothing newer: nothing written since the loss, or a write-back from an older version
/// than this instance holds (which missed a change, a deletion say, that this one saw).
async fn restore(
    store: &RedisStore,
    runtime: &RuntimeOverrides,
    prefix: &str,
) -> Result<(), StoreError> {
    let held = runtime.snapshot();
    if held.is_empty() {
        return Ok(());
    }
    let limits: Vec<Restore<'_>> = held
        .iter()
        .map(|(limit, version, entries)| Restore {
            keys: LimitKeys::new(prefix, limit),
            limit,
            held: *version,
            entries: entries
                .iter()
                .filter_map(|(tail, entry)| {
                    serde_json::to_string(entry)
                        .ok()
                        .map(|json| (tail.to_vec(), json))
                })
                .collect(),
        })
        .collect();
    let written = store
        .override_restore(
            &keys::override_versions_key(prefix),
            &keys::override_restored_key(prefix),
            &keys::override_epoch_key(prefix),
            &limits,
            MAX_PER_LIMIT,
        )
        .await?;
    if written > 0 {
        log::warn!(
            "the store had lost its runtime overrides; wrote back {written} limit(s) as this instance held them"
        );
    }
    Ok(())
}

/// Brings `limit`'s entries to the store's version: the changes since the version held, or
/// the whole limit when the store cannot tell them.
async fn catch_up(
    store: &RedisStore,
    runtime: &RuntimeOverrides,
    prefix: &str,
    limit: &str,
) -> Result<(), StoreError> {
    let Changes {
        now_ms,
        version,
        whole,
        entries,
    } = store
        .override_changes(
            &LimitKeys::new(prefix, limit),
            limit,
            runtime.version(limit),
            MOST_CHANGES,
            MAX_PER_LIMIT,
        )
        .await?;
    runtime.learn_store_time(now_ms);
    let decoded = entries.into_iter().filter_map(|(tail, json)| {
        let entry = match json.map(|json| serde_json::from_slice::<Entry>(&json)) {
            None => None,
            Some(Ok(entry)) => Some(entry),
            Some(Err(error)) => {
                log::warn!("runtime overrides of {limit}: skipping an unreadable entry: {error}");
                return None;
            }
        };
        Some((tail.into_boxed_slice(), entry))
    });
    if whole {
        let entries = decoded
            .filter_map(|(tail, entry)| Some((tail, entry?)))
            .collect();
        runtime.replace(limit, LimitEntries { version, entries });
    } else {
        runtime.apply(limit, version, decoded);
    }
    Ok(())
}
