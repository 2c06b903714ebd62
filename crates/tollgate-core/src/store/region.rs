//! A region's bookkeeping in its store, for one limit across regions (`docs/regions.md`):
//! each instance adds its demand per (global limit, key) to one hash, and one instance, the
//! holder of a lease, drains it and reports to the home. `lua/region.lua` in Redis; the
//! memory store keeps the same in its process.

use std::collections::HashMap;
use std::sync::Mutex;

/// One operation on the region's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionOp {
    /// Adds `counts` (field: `"<limit> <hex of the key's tail>"`) to the demand hash `hash`,
    /// which expires `ttl_ms` after the last add.
    Add {
        hash: String,
        counts: Vec<(String, u64)>,
        ttl_ms: u64,
    },
    /// Takes the reporter's lease `key` for `holder`, or renews it if `holder` has it.
    Lease {
        key: String,
        holder: String,
        ttl_ms: u64,
    },
    /// Reads the store's now, then takes every count of the demand hash `hash`, emptying it.
    Drain { hash: String },
    /// Reads the share kept beside the global limit's bucket `key` (a peek), and the now.
    Share { key: String },
}

/// What a [`RegionOp`] came to.
#[derive(Debug, Clone, PartialEq)]
pub enum RegionReply {
    Added,
    /// Whether the lease is this holder's now.
    Lease(bool),
    /// The store's now (µs), read before the counts were taken, and the counts.
    Drained {
        now_us: u64,
        counts: Vec<(String, u64)>,
    },
    /// The store's now (µs) and the share beside the key, ended or not.
    Share {
        now_us: u64,
        share: Option<crate::kinds::global::Share>,
    },
}

/// A demand hash's counts by field, and when it expires (µs).
type Counts = (HashMap<String, u64>, u64);

/// The memory store's bookkeeping: its demand hashes and leases, with their expiries (µs).
#[derive(Default)]
pub struct Books {
    hashes: Mutex<HashMap<String, Counts>>,
    leases: Mutex<HashMap<String, (String, u64)>>,
}

impl Books {
    /// `op` at `now_us`, as `lua/region.lua` does it.
    pub fn apply(&self, op: RegionOp, now_us: u64) -> RegionReply {
        match op {
            RegionOp::Add {
                hash,
                counts,
                ttl_ms,
            } => {
                let mut hashes = self.hashes.lock().unwrap_or_else(|p| p.into_inner());
                let entry = hashes.entry(hash).or_default();
                if entry.1 <= now_us {
                    entry.0.clear();
                }
                for (field, count) in counts {
                    let sum = entry.0.entry(field).or_default();
                    *sum = sum.saturating_add(count);
                }
                entry.1 = now_us.saturating_add(ttl_ms.saturating_mul(1000));
                RegionReply::Added
            }
            RegionOp::Lease {
                key,
                holder,
                ttl_ms,
            } => {
                let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
                let until = now_us.saturating_add(ttl_ms.saturating_mul(1000));
                let held = !matches!(
                    leases.get(&key),
                    Some((who, expiry)) if *expiry > now_us && *who != holder
                );
                if held {
                    leases.insert(key, (holder, until));
                }
                RegionReply::Lease(held)
            }
            // The memory store reads it beside the bucket, under its shard's lock.
            RegionOp::Share { .. } => RegionReply::Share {
                now_us,
                share: None,
            },
            RegionOp::Drain { hash } => {
                let mut hashes = self.hashes.lock().unwrap_or_else(|p| p.into_inner());
                let counts = match hashes.remove(&hash) {
                    Some((counts, expiry)) if expiry > now_us => counts.into_iter().collect(),
                    _ => Vec::new(),
                };
                RegionReply::Drained { now_us, counts }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_drains_take_everything_once() {
        let books = Books::default();
        let lease = |holder: &str, now| {
            books.apply(
                RegionOp::Lease {
                    key: "l".into(),
                    holder: holder.into(),
                    ttl_ms: 10,
                },
                now,
            )
        };
        assert_eq!(lease("a", 0), RegionReply::Lease(true));
        assert_eq!(lease("b", 5_000), RegionReply::Lease(false));
        assert_eq!(lease("a", 9_000), RegionReply::Lease(true));
        assert_eq!(lease("b", 20_000), RegionReply::Lease(true));
        for _ in 0..2 {
            books.apply(
                RegionOp::Add {
                    hash: "d".into(),
                    counts: vec![("t 61".into(), 3)],
                    ttl_ms: 10,
                },
                1,
            );
        }
        let drained = books.apply(RegionOp::Drain { hash: "d".into() }, 2);
        assert_eq!(
            drained,
            RegionReply::Drained {
                now_us: 2,
                counts: vec![("t 61".into(), 6)]
            }
        );
        let again = books.apply(RegionOp::Drain { hash: "d".into() }, 3);
        assert_eq!(
            again,
            RegionReply::Drained {
                now_us: 3,
                counts: vec![]
            }
        );
    }
}
