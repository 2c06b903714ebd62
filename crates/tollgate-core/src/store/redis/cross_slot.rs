//! Deciding a request whose buckets live in several Redis Cluster slots.
//!
//! A Lua script may only touch keys of one slot, so the all-or-nothing rule of one script call
//! cannot span slots. Instead: the buckets are grouped by slot (keys share a slot when their
//! hash tags match, see [`crate::base::keys`]), every group is decided by its own `token_bucket.lua`
//! call, all groups at once (one round trip), each all-or-nothing within itself. If every group
//! allows, the request is allowed and every bucket was charged. If any group denies, the
//! groups that did charge are refunded (`lua/refund.lua`, one more round trip) and the request
//! is denied.
//!
//! Why this never admits too much: a bucket is only ever charged when it holds the cost, so
//! every admitted request was paid for in every bucket; a refund never gives back more than
//! its charge removed (see the script). What it costs: between a charge and its refund (about
//! one round trip) the tokens are held, so a concurrent request may be denied that would have
//! passed; and a refund under contention keeps back at most `rate x (charge-to-refund time)`
//! tokens. Both are bounded under-admission. When a group fails (timeout, node down), the
//! request is answered per `on_error` and the charges of the other groups stay: nothing is
//! refunded for a request that `on_error = "allow"` admits anyway.
use std::time::Instant;

use futures_util::future::join_all;
use redis::cluster_routing::Slot;

use super::RedisStore;
use crate::kinds::BucketRequest;
use crate::store::{StoreDecision, StoreError};

/// Indices of `buckets` grouped by Cluster slot, in order of first appearance.
pub(super) fn group_by_slot(buckets: &[BucketRequest]) -> Vec<Vec<usize>> {
    group_keys_by_slot(buckets.iter().map(|b| b.key.as_str()))
}

/// Indices of `keys` grouped by Cluster slot, in order of first appearance.
pub(super) fn group_keys_by_slot<'a>(keys: impl Iterator<Item = &'a str>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (index, key) in keys.enumerate() {
        let slot = Slot::for_key(key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(index),
            None => groups.push((slot, vec![index])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

pub(super) async fn decide(
    store: &RedisStore,
    buckets: &[BucketRequest],
    groups: &[Vec<usize>],
    deadline: Instant,
) -> Result<StoreDecision, StoreError> {
    let members: Vec<Vec<&BucketRequest>> = groups
        .iter()
        .map(|group| group.iter().map(|&i| &buckets[i]).collect())
        .collect();
    let decided = join_all(members.iter().map(|group| store.charge(group, deadline))).await;
    let decided = decided.into_iter().collect::<Result<Vec<_>, _>>()?;

    let allowed = decided.iter().all(|(decision, _)| decision.allowed);
    let mut outcomes = vec![None; buckets.len()];
    for (group, (decision, _)) in groups.iter().zip(&decided) {
        for (&index, outcome) in group.iter().zip(&decision.buckets) {
            outcomes[index] = Some(*outcome);
        }
    }

    if !allowed {
        // Undo the groups that charged: their buckets that held the cost paid it.
        let refunds: Vec<(Vec<usize>, &str)> = groups
            .iter()
            .zip(&decided)
            .filter(|(_, (decision, _))| decision.allowed)
            .map(|(group, (decision, charged_at))| {
                let paid = group
                    .iter()
                    .zip(&decision.buckets)
                    .filter(|(_, outcome)| outcome.enough)
                    .map(|(&index, _)| index)
                    .collect();
                (paid, charged_at.as_str())
            })
            .filter(|(paid, _): &(Vec<usize>, &str)| !paid.is_empty())
            .collect();
        let calls = refunds.iter().map(|(paid, charged_at)| {
            let outcomes = &outcomes;
            async move {
                let refs: Vec<&BucketRequest> = paid.iter().map(|&i| &buckets[i]).collect();
                let marks: Vec<String> = paid
                    .iter()
                    .map(|&i| charge_mark(outcomes[i].and_then(|o| o.window), charged_at))
                    .collect();
                (paid, store.refund(&refs, &marks, deadline).await)
            }
        });
        for (paid, result) in join_all(calls).await {
            match result {
                Ok(levels) => {
                    for (&index, tokens) in paid.iter().zip(levels) {
                        if let Some(outcome) = outcomes[index].as_mut() {
                            outcome.tokens = tokens;
                        }
                    }
                }
                // The charge stays: fewer tokens than due until the bucket refills, never more.
                Err(error) => log::debug!("refund across slots failed: {error}"),
            }
        }
    }

    let buckets = outcomes
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| StoreError::Script("a slot group answered for too few buckets".into()))?;
    Ok(StoreDecision {
        allowed,
        buckets,
        slices: Vec::new(),
    })
}

/// What `lua/refund.lua` needs to find a charge: the charging call's `now` for a bucket; for a
/// quota, the start of the period it counted in (now + time left - period length).
fn charge_mark(window: Option<crate::kinds::Window>, charged_at: &str) -> String {
    match (window, charged_at.parse::<u64>()) {
        (Some(window), Ok(now_us)) => {
            let start =
                (now_us / 1_000_000) as i64 + window.ends_in_s as i64 - window.length_s as i64;
            start.to_string()
        }
        _ => charged_at.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(key: &str) -> BucketRequest {
        BucketRequest::bucket(key, 1.0, 1.0)
    }

    #[test]
    fn buckets_with_the_same_hash_tag_form_one_group() {
        let buckets = [
            bucket("tg:per-ip-second:{10.0.0.1}"),
            bucket("tg:per-key:{k-1}"),
            bucket("tg:per-ip-minute:{10.0.0.1}"),
        ];
        assert_eq!(group_by_slot(&buckets), vec![vec![0, 2], vec![1]]);
    }
}
