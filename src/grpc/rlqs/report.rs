//! One stream's reports: each bucket id it reports is mapped to its pool (or to the
//! unmatched action), its share decided in the store (one script per bucket, all the
//! buckets of a message at once), and answered in one response. A bucket idle for
//! `rlqs.abandon_after_s` is abandoned.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix_web::web;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};

use super::action;
use crate::config::rlqs::Unmatched;
use crate::limiter::shares::{self, Assignment};
use crate::state::AppState;
use crate::store::{shares_key, Store};

/// The most buckets one message is answered for; Envoy sends one entry per bucket it holds.
pub const MAX_BUCKETS_PER_MESSAGE: usize = 4096;
/// The most buckets one stream may hold; past it new ones get the unmatched action untracked.
pub const MAX_BUCKETS_PER_STREAM: usize = 65_536;

/// What one stream tracks of a bucket id.
struct Tracked {
    /// This bucket's holder id in its pool.
    holder: String,
    /// When it last reported requests.
    used_at: Instant,
}

/// One stream's state: its domain and its buckets.
pub struct Stream {
    state: web::Data<AppState>,
    /// Unique among the streams of every replica: the instance's random id and a counter.
    id: String,
    domain: String,
    buckets: HashMap<Vec<(String, String)>, Tracked>,
    next_holder: u64,
}

/// What to do with one reported bucket once the store has answered.
enum Pending {
    Now(BucketAction),
    Share {
        bucket: BucketId,
        request: crate::store::shares::ShareRequest,
        units: shares::Units,
        limit: usize,
    },
}

impl Stream {
    pub fn new(state: web::Data<AppState>, id: String) -> Stream {
        state.metrics.rlqs.streams.inc();
        Stream {
            state,
            id,
            domain: String::new(),
            buckets: HashMap::new(),
            next_holder: 0,
        }
    }

    /// The answer to one message of usage reports (empty when there is nothing to say).
    pub async fn answer(&mut self, reports: RateLimitQuotaUsageReports) -> RateLimitQuotaResponse {
        if !reports.domain.is_empty() {
            self.domain = reports.domain;
        }
        let policy = self.state.limiter.policy();
        let rules = &policy.rlqs;
        let metrics = &self.state.metrics.rlqs;
        let runtime = policy.runtime.view();
        let now = Instant::now();
        let abandon_after = Duration::from_secs(rules.abandon_after_s);
        let ttl = rules.assignment_ttl_s;
        let mut pending = Vec::new();
        for usage in reports
            .bucket_quota_usages
            .into_iter()
            .take(MAX_BUCKETS_PER_MESSAGE)
        {
            let Some(bucket) = usage.bucket_id.filter(|b| !b.bucket.is_empty()) else {
                continue;
            };
            metrics.reports.inc();
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            let mut entries: Vec<(String, String)> = bucket
                .bucket
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            entries.sort();
            let room = self.buckets.len() < MAX_BUCKETS_PER_STREAM;
            let holder = match self.buckets.get_mut(&entries) {
                Some(tracked) => {
                    if requests > 0 {
                        tracked.used_at = now;
                    } else if now.duration_since(tracked.used_at) >= abandon_after {
                        self.buckets.remove(&entries);
                        metrics.buckets.dec();
                        pending.push(Pending::Now(action::abandon(bucket, metrics)));
                        continue;
                    }
                    Some(tracked.holder.clone())
                }
                None if room => {
                    let holder = format!("{}.{:x}", self.id, self.next_holder);
                    self.next_holder += 1;
                    self.buckets.insert(
                        entries,
                        Tracked {
                            holder: holder.clone(),
                            used_at: now,
                        },
                    );
                    metrics.buckets.inc();
                    Some(holder)
                }
                None => None,
            };
            let unmatched = |bucket| {
                let assignment = match rules.unmatched {
                    Unmatched::Allow => Assignment::AllowAll,
                    Unmatched::Deny => Assignment::DenyAll,
                };
                Pending::Now(action::assign(bucket, assignment, ttl, metrics))
            };
            let mapped = rules.find(&self.domain, &bucket.bucket, &policy.limits);
            let (Some(mapped), Some(holder)) = (mapped, holder) else {
                pending.push(unmatched(bucket));
                continue;
            };
            let limit = &policy.limits[mapped.limit];
            let Some(numbers) = limit.numbers_for(&runtime, &mapped.tail) else {
                // An unlimited key.
                let allow = action::assign(bucket, Assignment::AllowAll, ttl, metrics);
                pending.push(Pending::Now(allow));
                continue;
            };
            let units = shares::units(&numbers);
            let key = shares_key(&limit.store_key(&policy.key_prefix, &mapped.tail));
            let request = shares::share_request(key, holder, requests, &units, rules);
            pending.push(Pending::Share {
                bucket,
                request,
                units,
                limit: mapped.limit,
            });
        }
        let store = self.state.limiter.store();
        let policy = &policy;
        let decided = futures_util::future::join_all(pending.into_iter().map(|p| async move {
            match p {
                Pending::Now(action) => Some(action),
                Pending::Share {
                    bucket,
                    request,
                    units,
                    limit,
                } => match store.share(&request).await {
                    Ok(grant) => {
                        log::debug!(
                            "rlqs: {} in {}: {} requests, granted rate {} size {} \
                             ({} holders, {}/{} rate and {}/{} size counted)",
                            request.holder,
                            request.key,
                            request.requests,
                            grant.rate,
                            grant.size,
                            grant.holders,
                            grant.counted_rate,
                            units.rate,
                            grant.counted_size,
                            units.size,
                        );
                        if let Some(limit) = policy.limits.get(limit) {
                            metrics
                                .utilisation
                                .with_label_values(&[limit.name.as_str()])
                                .set(shares::utilisation(&grant, &units));
                        }
                        let assignment = shares::assignment(&grant, &units);
                        Some(action::assign(bucket, assignment, ttl, metrics))
                    }
                    // Nothing is said: Envoy keeps its assignment until its TTL, then applies
                    // its `expired_assignment_behavior`.
                    Err(error) => {
                        log::debug!("rlqs: no share decided: {error}");
                        None
                    }
                },
            }
        }))
        .await;
        RateLimitQuotaResponse {
            bucket_action: decided.into_iter().flatten().collect(),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let metrics = &self.state.metrics.rlqs;
        metrics.streams.dec();
        metrics
            .buckets
            .sub(i64::try_from(self.buckets.len()).unwrap_or(i64::MAX));
    }
}
