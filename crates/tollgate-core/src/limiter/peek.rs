//! A key as the admin API reads and resets it (`GET` and `DELETE /v1/buckets/{limit}`),
//! through the limiter: the bucket the next check draws from, as its kind shows it, with what
//! the store holds aside beside it, this instance's borrowed tokens and the key's RLQS shares.
//! A peek charges nothing; a reset makes this instance forget the key at once (the others
//! when the store's reset channel tells them).

use super::decision::LimitState;
use super::Limiter;
use crate::kinds::borrow::Borrow;
use crate::kinds::global::{Global, Share};
use crate::kinds::{BucketRequest, Kind, Meter, PeekView, Peeked};
use crate::policy::limit::Numbers;
use crate::policy::overrides::Override;
use crate::policy::Policy;
use crate::store::rlqs::Holding;
use crate::store::{shares_key, Store, StoreError};

/// The bucket a peek names, built as a check builds it: the same store key, the key's own
/// numbers (a runtime override before the file's, else the limit's), read as a borrowing check
/// reads it when the limit borrows.
pub struct Target {
    pub bucket: BucketRequest,
    /// The key's override, if it has one.
    pub own: Option<Override>,
}

impl Target {
    /// The bucket of the limit at `index` whose key ends in `tail`.
    pub fn of(policy: &Policy, index: usize, tail: &[u8]) -> Target {
        let limit = &policy.limits[index];
        let numbers = limit.numbers_for(&policy.runtime.view(), tail);
        let own = match numbers {
            None => Some(Override::Unlimited),
            Some(numbers) if numbers.overridden => Some(Override::Bucket {
                rate: numbers.rate,
                burst: numbers.burst,
            }),
            Some(_) => None,
        };
        let numbers = numbers.unwrap_or_else(|| limit.own_numbers());
        let bucket = limit.bucket(
            limit.store_key(&policy.key_prefix, tail),
            index,
            numbers,
            limit.peek_cost(),
        );
        // Read as a borrowing check reads it: held tokens do not refill.
        let bucket = if limit.borrow {
            bucket.borrowing(Borrow::default())
        } else {
            bucket
        };
        Target { bucket, own }
    }

    /// An override makes the key unlimited: no check ever draws from its bucket.
    pub fn unlimited(&self) -> bool {
        self.own == Some(Override::Unlimited)
    }
}

/// What a peek found.
pub struct Peek {
    /// The key as its kind shows it.
    pub state: PeekView,
    /// Whether the next check with the limit's cost would be allowed.
    pub allowed: bool,
    pub cost: u64,
    /// The key's shares among Envoy's quota filters (RLQS), for a limit `[[rlqs.buckets]]`
    /// names, or a global limit's at home (by region).
    pub shares: Option<serde_json::Value>,
    /// A global limit's key in a region: its floor and the share the home last assigned.
    pub region: Option<serde_json::Value>,
}

/// The store did not answer a peek or a reset: the caller may retry.
#[derive(Debug, thiserror::Error)]
#[error("the store did not answer ({0}): retry")]
pub struct Unanswered(#[from] StoreError);

impl<S: Store> Limiter<S> {
    /// `target`'s bucket as the next check would find it, charging nothing.
    pub async fn peek(&self, policy: &Policy, target: &Target) -> Result<Peek, Unanswered> {
        let bucket = &target.bucket;
        let outcome = self.store.peek(bucket).await?;
        let held = if bucket.meter.holds_aside() {
            Some(self.store.reserved(bucket).await?)
        } else {
            None
        };
        let limit = &policy.limits[bucket.limit];
        let shared = policy
            .rlqs
            .rules
            .iter()
            .any(|rule| policy.limits.get(rule.limit).map(|l| &l.name) == Some(&limit.name));
        let global = match bucket.meter {
            Meter::Global(global) => Some(global),
            _ => None,
        };
        let at_home = global.is_some() && policy.home.is_some();
        let shares = if shared || at_home {
            let (now, holders) = self.store.shares_of(&shares_key(&bucket.key)).await?;
            Some(shares_view(bucket, now, &holders, at_home))
        } else {
            None
        };
        let region = match global {
            Some(global) if global.floor_ppm > 0 => {
                let (now, share) = self.share_of(bucket).await?;
                Some(region_view(bucket, global, share, now))
            }
            _ => None,
        };
        let state = LimitState::of(bucket, &outcome);
        let peeked = Peeked {
            outcome,
            remaining: state.remaining(),
            reset_secs: state.reset_secs(),
            held,
            borrowed_here: self.lender.as_ref().map_or(0, |l| l.held(&bucket.key)),
        };
        Ok(Peek {
            state: bucket.meter.peek_view(bucket, &peeked),
            allowed: outcome.enough,
            cost: bucket.cost,
            shares,
            region,
        })
    }

    /// Deletes the bucket at store key `key`, so it reads full (a quota: unused) at the next
    /// check; returns whether it existed. This instance forgets its cached denials and slices
    /// of the key at once; the others when the store's reset channel tells them.
    pub async fn reset(&self, key: &str) -> Result<bool, Unanswered> {
        let existed = self.store.reset(key).await?;
        self.forget_denials(key);
        Ok(existed)
    }
}

/// What the Envoys of a pool may hold now (each assignment counted until it expires), in
/// all and per holder (an Envoy's bucket: `<instance>.<stream>.<bucket>`).
#[expect(
    clippy::cast_precision_loss,
    reason = "units and microseconds shown as decimals"
)]
fn shares_view(
    bucket: &BucketRequest,
    now_us: u64,
    holders: &[(String, Holding)],
    by_region: bool,
) -> serde_json::Value {
    let fill = super::rlqs::units(&Numbers {
        rate: bucket.rate,
        burst: 0,
        overridden: false,
    })
    .fill_interval_s as f64;
    let (mut rate, mut size) = (0u64, 0u64);
    let listed: Vec<serde_json::Value> = holders
        .iter()
        .filter_map(|(id, holding)| {
            let (r, s) = holding.counted(now_us);
            if (r, s) == (0, 0) {
                return None;
            }
            rate += r;
            size += s;
            let until = holding
                .rate_steps
                .iter()
                .chain(&holding.size_steps)
                .map(|(_, until)| *until)
                .max()
                .unwrap_or(now_us);
            let mut shown = serde_json::json!({
                "holder": id,
                "rate_per_s": r as f64 / fill,
                "burst": s,
                "demand_per_s": holding.demand_milli as f64 / 1000.0,
                "expires_in_s": until.saturating_sub(now_us) as f64 / 1e6,
            });
            if by_region {
                // A region's holder id starts with its name (`grpc::rlqs` names it).
                shown["region"] = serde_json::json!(id.split('.').next().unwrap_or_default());
            }
            Some(shown)
        })
        .collect();
    let count = if by_region { "regions" } else { "envoys" };
    serde_json::json!({
        count: listed.len(),
        "rate_per_s": rate as f64 / fill,
        "burst": size,
        "holders": listed,
    })
}

/// A global limit's key in a region: its floor's numbers and the share it holds (none once
/// ended).
#[expect(
    clippy::cast_precision_loss,
    reason = "sizes and microseconds shown as decimals"
)]
fn region_view(
    bucket: &BucketRequest,
    global: Global,
    share: Option<Share>,
    now_us: u64,
) -> serde_json::Value {
    let floor = f64::from(global.floor_ppm) / 1e6;
    let share = share.filter(|share| share.until_us > now_us).map(|share| {
        serde_json::json!({
            "rate_per_s": share.rate,
            "burst": share.size,
            "expires_in_s": (share.until_us - now_us) as f64 / 1e6,
        })
    });
    serde_json::json!({
        "floor": {
            "fraction": floor,
            "rate_per_s": bucket.rate * floor,
            "burst": bucket.burst * floor,
        },
        "share": share,
    })
}
