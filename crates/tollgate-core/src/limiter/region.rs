//! A region's side of one limit across regions (`docs/regions.md`), as the limiter holds it:
//! the demand this instance saw per (global limit, key), bounded, added to the region store's
//! demand hash each interval; the reporter's lease; the demand drained for a report; and a
//! share from the home written beside its key's bucket. The reporter itself (the stream to the
//! home) is the server's (`app::region`); it reaches the store only through these doors.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::Mutex;

use super::Limiter;
use crate::base::keys;
use crate::kinds::global::{Global, Share};
use crate::kinds::{BucketOutcome, BucketRequest, Meter};
use crate::policy::regions::to_hex;
use crate::policy::Policy;
use crate::store::region::{RegionOp, RegionReply};
use crate::store::{Store, StoreError};

/// The most (limit, key) pairs one instance counts between two flushes; past it, new keys
/// wait for the next interval.
pub const DEMAND_KEYS: usize = 10_000;

/// Requests per (global limit, key) this instance saw wanting more than its floor: denied, or
/// leaving less than half the floor's size. Sharded by key, so that checks of different keys
/// never wait on one lock; each shard holds at most its part of [`DEMAND_KEYS`].
pub struct Demand {
    shards: Box<[Mutex<HashMap<String, u64>>]>,
    hasher: std::hash::RandomState,
}

const DEMAND_SHARDS: usize = 16;

impl Default for Demand {
    fn default() -> Demand {
        Demand {
            shards: (0..DEMAND_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            hasher: std::hash::RandomState::new(),
        }
    }
}

impl Demand {
    /// Counts the buckets of one decided request that want more than their floor.
    pub fn note(&self, policy: &Policy, buckets: &[BucketRequest], outcomes: &[BucketOutcome]) {
        for (bucket, outcome) in buckets.iter().zip(outcomes) {
            let Meter::Global(global) = bucket.meter else {
                continue;
            };
            if global.floor_ppm == 0 {
                continue;
            }
            let half_floor = bucket.burst * f64::from(global.floor_ppm) / 2_000_000.0;
            if outcome.enough && outcome.tokens >= half_floor {
                continue;
            }
            let Some(limit) = policy.limits.get(bucket.limit) else {
                continue;
            };
            let tail = keys::tail_in_key(&bucket.key, &policy.key_prefix, &limit.name);
            let field = format!("{} {}", limit.name, to_hex(tail.as_bytes()));
            let shard =
                usize::try_from(self.hasher.hash_one(&field) % DEMAND_SHARDS as u64).unwrap_or(0);
            let mut counts = self.shards[shard].lock().unwrap_or_else(|p| p.into_inner());
            let full = counts.len() >= DEMAND_KEYS / DEMAND_SHARDS;
            match counts.get_mut(&field) {
                Some(count) => *count = count.saturating_add(1),
                None if !full => {
                    counts.insert(field, 1);
                }
                None => {}
            }
        }
    }

    fn take(&self) -> Vec<(String, u64)> {
        let mut taken = Vec::new();
        for shard in &self.shards {
            let mut counts = shard.lock().unwrap_or_else(|p| p.into_inner());
            taken.extend(std::mem::take(&mut *counts));
        }
        taken
    }
}

/// One (global limit, key) the reporter drained: the limit's name, the hex of the key's tail
/// (as the bucket key spells it) and the requests counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub limit: String,
    pub key: String,
    pub requests: u64,
}

impl<S: Store> Limiter<S> {
    /// Adds this instance's demand to the region store's hash (which lives `ttl_ms` past the
    /// last add). Demand is advice: a failed add is dropped.
    pub async fn flush_demand(&self, ttl_ms: u64) -> Result<(), StoreError> {
        let counts = self.demand.take();
        if counts.is_empty() {
            return Ok(());
        }
        let hash = keys::region_demand_key(&self.policy().key_prefix);
        self.store
            .region(RegionOp::Add {
                hash,
                counts,
                ttl_ms,
            })
            .await
            .map(|_| ())
    }

    /// Takes or renews the reporter's lease for `holder`; whether it holds it.
    pub async fn region_lease(&self, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let key = keys::region_lease_key(&self.policy().key_prefix);
        match self
            .store
            .region(RegionOp::Lease {
                key,
                holder: holder.to_string(),
                ttl_ms,
            })
            .await?
        {
            RegionReply::Lease(held) => Ok(held),
            _ => Err(StoreError::Script("unexpected lease reply".into())),
        }
    }

    /// The store's now (µs), read first, and the region's demand, taken.
    pub async fn drain_demand(&self) -> Result<(u64, Vec<Wanted>), StoreError> {
        let hash = keys::region_demand_key(&self.policy().key_prefix);
        match self.store.region(RegionOp::Drain { hash }).await? {
            RegionReply::Drained { now_us, counts } => {
                let wanted = counts
                    .into_iter()
                    .filter_map(|(field, requests)| {
                        let (limit, key) = field.split_once(' ')?;
                        Some(Wanted {
                            limit: limit.to_string(),
                            key: key.to_string(),
                            requests,
                        })
                    })
                    .collect();
                Ok((now_us, wanted))
            }
            _ => Err(StoreError::Script("unexpected drain reply".into())),
        }
    }

    /// The share kept beside a global limit's `bucket` (ended or not) and the store's now.
    pub async fn share_of(
        &self,
        bucket: &BucketRequest,
    ) -> Result<(u64, Option<Share>), StoreError> {
        match self
            .store
            .region(RegionOp::Share {
                key: bucket.key.clone(),
            })
            .await?
        {
            RegionReply::Share { now_us, share } => Ok((now_us, share)),
            _ => Err(StoreError::Script("unexpected share reply".into())),
        }
    }

    /// Writes the home's `share` for the key whose tail is `key` (hex) of the global limit
    /// `limit`; `None` when the limit is no global one here, the key is not hex or unlimited.
    pub async fn put_share(
        &self,
        policy: &Policy,
        limit: &str,
        key: &str,
        share: Share,
    ) -> Result<Option<(f64, u64)>, StoreError> {
        let Some((index, found)) = policy
            .limits
            .iter()
            .enumerate()
            .find(|(_, l)| l.name == limit && matches!(l.meter, Meter::Global(_)))
        else {
            return Ok(None);
        };
        let Some(tail) = from_hex(key).and_then(|bytes| String::from_utf8(bytes).ok()) else {
            return Ok(None);
        };
        let runtime = policy.runtime.view();
        let Some(numbers) = found.numbers_for(&runtime, tail.as_bytes()) else {
            return Ok(None);
        };
        let store_key = keys::with_tail_text(&policy.key_prefix, &found.name, &tail);
        let bucket = found.bucket(store_key, index, numbers, 1);
        let Meter::Global(global) = bucket.meter else {
            return Ok(None);
        };
        let share = within_what_the_floor_leaves(share, global, bucket.rate, bucket.burst);
        self.store.put_share(&bucket, share).await.map(Some)
    }
}

/// A home's assignment, never trusted past what a home could rightly give: the regions'
/// shares together are what their floors leave, so one region's is at most what its own
/// floor leaves of the limit (a home that answers garbage, a rate of 10^9 say, admits no more
/// than that). A rate that is not a number counts as none.
fn within_what_the_floor_leaves(share: Share, global: Global, rate: f64, burst: f64) -> Share {
    let left = 1.0 - f64::from(global.floor_ppm) / 1e6;
    let most_rate = (rate * left).max(0.0);
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a burst is at most 10^9; the cast clamps at 0"
    )]
    let most_size = (burst * left).floor() as u64;
    Share {
        rate: if share.rate.is_nan() {
            0.0
        } else {
            share.rate.clamp(0.0, most_rate)
        },
        size: share.size.min(most_size),
        until_us: share.until_us,
    }
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_at_most_what_the_regions_floor_leaves() {
        let floor = Global {
            floor_ppm: 250_000,
            borrow: None,
        };
        let garbage = Share {
            rate: 1e9,
            size: u64::MAX,
            until_us: 7,
        };
        let bounded = within_what_the_floor_leaves(garbage, floor, 100.0, 40.0);
        assert_eq!(
            (bounded.rate, bounded.size, bounded.until_us),
            (75.0, 30, 7)
        );
        let fair = Share {
            rate: 20.0,
            size: 10,
            until_us: 7,
        };
        assert_eq!(within_what_the_floor_leaves(fair, floor, 100.0, 40.0), fair);
        let nan = Share {
            rate: f64::NAN,
            ..fair
        };
        assert_eq!(
            within_what_the_floor_leaves(nan, floor, 100.0, 40.0).rate,
            0.0
        );
    }
}
