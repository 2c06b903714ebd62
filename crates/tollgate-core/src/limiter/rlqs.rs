//! Envoy's quota service (RLQS) without gRPC: the door through which a stream's reports reach
//! the store ([`Limiter::share`]): a key's numbers as the units of its pool, each pool's
//! report as the store's request, the store's grant as the token buckets Envoy enforces, and
//! what a bucket is told when its pool cannot be decided. The allocation itself is the
//! store's (`store::rlqs`), atomic per pool.

mod book;

use std::time::Instant;

use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;

pub use book::{
    Book, BucketKey, TrackedBytes, Tracking, MAX_BUCKETS_PER_STREAM, MAX_BUCKET_ID_BYTES,
    MAX_INSTANCE_TRACKED_BYTES, MAX_MEMBERS_PER_POOL, MAX_TRACKED_BYTES,
};

use super::Limiter;
use crate::base::rate::count_f64;
use crate::config::OnError;
use crate::policy::limit::Numbers;
use crate::policy::rlqs::RlqsRules;
use crate::policy::Policy;
use crate::store::rlqs::{Grant, Member, Sent, ShareRequest};
use crate::store::{Store, StoreError};

/// Store calls deciding RLQS reports in flight on one instance, whatever the streams: a
/// flood of reports queues here, never in the store ahead of the checks.
pub const CALLS_IN_FLIGHT: usize = 4;
/// Store calls in flight for one message (one stream: its messages are answered in order).
pub const CALLS_PER_MESSAGE: usize = 2;
/// The most pools one store call decides.
pub const POOLS_PER_CALL: usize = 32;
/// The most members one store call carries beyond a single pool's: a call's Lua runs for
/// at most about a millisecond, so the checks queued behind it wait no longer.
pub const MEMBERS_PER_CALL: usize = 512;

/// One pool a stream reports to in one message: the stream's holder of it, the limit (its
/// index in the policy) and the key's numbers now, and the holder's members (those that
/// reported first).
#[derive(Debug, Clone)]
pub struct PoolReport {
    /// The pool's store key.
    pub key: String,
    pub holder: String,
    pub limit: usize,
    pub numbers: Numbers,
    pub members: Vec<Member>,
}

/// The store key of the pool of the limit at `limit` in `policy` for the key `tail`.
pub fn pool_key(policy: &Policy, limit: usize, tail: &[u8]) -> Option<String> {
    let limit = policy.limits.get(limit)?;
    Some(crate::store::shares_key(
        &limit.store_key(&policy.key_prefix, tail),
    ))
}

/// What a pool's reporting members are told.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolAnswer {
    /// Each reporting member's assignment and what it was sent, in the order of the report.
    Shared(Vec<(Assignment, Sent)>),
    /// The store did not decide: a member the stream served keeps its assignment (until its
    /// TTL, then Envoy's `expired_assignment_behavior`); one never served is told `unserved`,
    /// what `store.on_error` answers a check (nothing for `error`).
    Undecided { unserved: Option<Assignment> },
}

impl<S: Store> Limiter<S> {
    /// One message's reports, one per pool, decided by `deadline` (see [`Limiter::decide_shares`]).
    pub async fn share(
        &self,
        policy: &Policy,
        pools: &[PoolReport],
        deadline: Instant,
    ) -> Vec<PoolAnswer> {
        let rules = &policy.rlqs;
        let asks: Vec<(Units, ShareRequest)> = pools
            .iter()
            .map(|pool| {
                let units = units(&pool.numbers);
                let request = share_request(
                    pool.key.clone(),
                    pool.holder.clone(),
                    pool.members.clone(),
                    &units,
                    rules,
                );
                (units, request)
            })
            .collect();
        let requests: Vec<ShareRequest> = asks.iter().map(|(_, r)| r.clone()).collect();
        let decided = self.decide_shares(&requests, deadline).await;
        let metrics = &self.metrics.rlqs;
        pools
            .iter()
            .zip(asks)
            .zip(decided)
            .map(|((pool, (units, request)), result)| match result {
                Ok(grant) => {
                    log::debug!(
                        "rlqs: {} in {}: {} bucket(s), share rate {} size {} ({} holders, \
                         {}/{} rate and {}/{} size counted)",
                        request.holder,
                        request.key,
                        grant.members.len(),
                        grant.rate,
                        grant.size,
                        grant.holders,
                        grant.counted_rate,
                        units.rate,
                        grant.counted_size,
                        units.size,
                    );
                    if grant.holders == 0 {
                        metrics.pool_full.inc();
                    }
                    if let Some(limit) = policy.limits.get(pool.limit) {
                        metrics
                            .utilisation
                            .with_label_values(&[limit.name.as_str()])
                            .set(utilisation(&grant, &units));
                    }
                    let until_us = grant.now_us.saturating_add(request.hold_us);
                    let parts = grant.members.iter().map(|&(rate, size)| {
                        let sent = Sent {
                            rate,
                            size,
                            until_us,
                        };
                        (assignment((rate, size), &units), sent)
                    });
                    PoolAnswer::Shared(parts.collect())
                }
                Err(error) => {
                    log::debug!("rlqs: no share decided for {}: {error}", pool.key);
                    PoolAnswer::Undecided {
                        unserved: on_error(self.on_error, &pool.numbers, self.instances()),
                    }
                }
            })
            .collect()
    }

    /// Decides `requests` (reports of one message, one per pool) by `deadline`: in calls of
    /// at most [`POOLS_PER_CALL`] pools, [`CALLS_PER_MESSAGE`] at a time and at most
    /// [`CALLS_IN_FLIGHT`] on the instance. A call still waiting for its turn at the deadline
    /// is not sent. One result per request, in order.
    pub async fn decide_shares(
        &self,
        requests: &[ShareRequest],
        deadline: Instant,
    ) -> Vec<Result<Grant, StoreError>> {
        let mut batches = batches(requests).into_iter();
        let mut calls = FuturesOrdered::new();
        for batch in batches.by_ref().take(CALLS_PER_MESSAGE) {
            calls.push_back(self.share_batch(batch, deadline));
        }
        let mut results = Vec::with_capacity(requests.len());
        while let Some(grants) = calls.next().await {
            results.extend(grants);
            if let Some(batch) = batches.next() {
                calls.push_back(self.share_batch(batch, deadline));
            }
        }
        results
    }

    /// One store call for `batch`, once the instance has room for it.
    async fn share_batch(
        &self,
        batch: &[ShareRequest],
        deadline: Instant,
    ) -> Vec<Result<Grant, StoreError>> {
        let turn = tokio::time::timeout_at(
            tokio::time::Instant::from_std(deadline),
            self.share_calls.acquire(),
        )
        .await;
        match turn {
            Ok(Ok(_permit)) => self.store.share(batch, deadline).await,
            // Not sent: no store failure, only no time left (or a closed semaphore, never).
            _ => batch.iter().map(|_| Err(StoreError::Timeout)).collect(),
        }
    }
}

/// `requests` in consecutive batches of at most [`POOLS_PER_CALL`] pools and, past the first
/// pool of a batch, [`MEMBERS_PER_CALL`] members.
fn batches(requests: &[ShareRequest]) -> Vec<&[ShareRequest]> {
    let mut batches = Vec::new();
    let (mut start, mut members) = (0, 0);
    for (i, request) in requests.iter().enumerate() {
        let full =
            i - start == POOLS_PER_CALL || members + request.members.len() > MEMBERS_PER_CALL;
        if i > start && full {
            batches.push(&requests[start..i]);
            (start, members) = (i, 0);
        }
        members += request.members.len();
    }
    if start < requests.len() {
        batches.push(&requests[start..]);
    }
    batches
}

/// The fill interval shares are counted in: Envoy refills `tokens_per_fill / fill_interval`
/// per second continuously, so a long interval only gives shares a finer grain (one unit is
/// 1/3600 token per second).
pub const FILL_INTERVAL_S: u64 = 3600;
/// How long after the store's `now` an assignment is still counted beyond its TTL: Envoy
/// starts the TTL when the answer arrives.
pub const HOLD_MARGIN_US: u64 = crate::store::rlqs::TRIP_MARGIN_US;

/// A pool's capacity in units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Units {
    /// Tokens per fill interval: `floor(rate * fill_interval_s)`.
    pub rate: u64,
    /// Bucket size: the burst.
    pub size: u64,
    pub fill_interval_s: u64,
}

/// The units of a key's `numbers`: the fill interval is [`FILL_INTERVAL_S`], or 1 s for a
/// rate whose hour would not fit Envoy's 32-bit `tokens_per_fill`. Floors only: rounding
/// never adds capacity.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "clamped to u32::MAX, which a f64 holds exactly"
)]
pub fn units(numbers: &Numbers) -> Units {
    let most = f64::from(u32::MAX);
    let fill_interval_s = if numbers.rate * FILL_INTERVAL_S as f64 <= most {
        FILL_INTERVAL_S
    } else {
        1
    };
    let rate = (numbers.rate * fill_interval_s as f64)
        .floor()
        .clamp(0.0, most) as u64;
    Units {
        rate,
        size: numbers.burst.min(u64::from(u32::MAX)),
        fill_interval_s,
    }
}

/// The store's request for one report of `holder` (its `members`) to the pool at `key`.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "the reserve is a fraction of at most 0.5 of a u32 count"
)]
pub fn share_request(
    key: String,
    holder: String,
    members: Vec<Member>,
    units: &Units,
    rules: &RlqsRules,
) -> ShareRequest {
    let reserve = |of: u64| (of as f64 * rules.reserve).floor() as u64;
    ShareRequest {
        key,
        holder,
        members,
        rate_units: units.rate,
        size_units: units.size,
        reserve_rate: reserve(units.rate),
        reserve_size: reserve(units.size),
        fill_interval_s: units.fill_interval_s,
        hold_us: rules.assignment_ttl_s * 1_000_000 + HOLD_MARGIN_US,
        max_holders: rules.max_holders,
    }
}

/// What Envoy is told to enforce for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// Envoy's token bucket: `max_tokens`, refilled with `tokens_per_fill` every
    /// `fill_interval_s` (continuously, as Envoy 1.40 does).
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_s: u64,
    },
    DenyAll,
    AllowAll,
}

/// The assignment for a member's part `(rate, size)`: a token bucket, or deny all when it is
/// empty.
pub fn assignment((rate, size): (u64, u64), units: &Units) -> Assignment {
    match (u32::try_from(size), u32::try_from(rate)) {
        (Ok(max_tokens), Ok(tokens_per_fill)) if max_tokens > 0 && tokens_per_fill > 0 => {
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_s: units.fill_interval_s,
            }
        }
        _ => Assignment::DenyAll,
    }
}

/// What a bucket never served is told when its pool could not be decided: what `on_error`
/// answers a check (`allow`: allow all; `deny`: deny all; `local`: the key's numbers divided
/// among the instances sharing the store, at least one token, as a check's fallback does;
/// `error`: nothing, so Envoy's `no_assignment_behavior` decides, as its
/// `failure_mode_deny` decides a check's error).
pub fn on_error(on_error: OnError, numbers: &Numbers, instances: u64) -> Option<Assignment> {
    Some(match on_error {
        OnError::Error => return None,
        OnError::Allow => Assignment::AllowAll,
        OnError::Deny => Assignment::DenyAll,
        OnError::Local => {
            let n = instances.max(1);
            let local = units(&Numbers {
                rate: numbers.rate / count_f64(n),
                burst: (numbers.burst / n).max(1),
                overridden: numbers.overridden,
            });
            assignment((local.rate, local.size), &local)
        }
    })
}

/// The part of the pool's rate its holders may hold after a grant, 0 to 1.
#[expect(clippy::cast_precision_loss, reason = "a ratio of counts below 2^32")]
pub fn utilisation(grant: &Grant, units: &Units) -> f64 {
    if units.rate == 0 {
        return 0.0;
    }
    (grant.counted_rate as f64 / units.rate as f64).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(rate: f64, burst: u64) -> Numbers {
        Numbers {
            rate,
            burst,
            overridden: false,
        }
    }

    #[test]
    fn units_are_floors_in_hours_or_seconds() {
        assert_eq!(
            units(&numbers(20.0, 40)),
            Units {
                rate: 72_000,
                size: 40,
                fill_interval_s: 3600
            }
        );
        assert_eq!(units(&numbers(1.0 / 7.0, 1)).rate, 514);
        let fast = units(&numbers(2_000_000.0, 10));
        assert_eq!((fast.rate, fast.fill_interval_s), (2_000_000, 1));
        assert_eq!(units(&numbers(1e12, u64::MAX)).size, u64::from(u32::MAX));
    }

    #[test]
    fn an_empty_grant_denies_all() {
        let units = units(&numbers(1.0, 1));
        assert_eq!(assignment((0, 0), &units), Assignment::DenyAll);
        assert_eq!(
            assignment((3, 2), &units),
            Assignment::TokenBucket {
                max_tokens: 2,
                tokens_per_fill: 3,
                fill_interval_s: 3600
            }
        );
    }
}
