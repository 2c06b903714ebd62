//! One stream's reports: each reported bucket id is mapped to its pool (a limit and key) or
//! answered at once (no rule maps it, its key is unlimited, or the stream cannot keep it);
//! the stream's bookkeeping ([`Book`]) makes the buckets of one pool members of one share; the
//! limiter decides each pool once per message; every bucket is answered in one response.

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::web;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};

use super::action;
use crate::state::AppState;
use tollgate_core::config::rlqs::Unmatched;
use tollgate_core::kinds::Meter;
use tollgate_core::limiter::rlqs::{
    pool_key, Assignment, Book, BucketKey, PoolAnswer, PoolReport, TrackedBytes, Tracking,
};
use tollgate_core::policy::limit::Numbers;
use tollgate_core::policy::regions::is_regions_domain;

/// The most buckets one message is answered for; Envoy sends one entry per bucket it holds.
pub const MAX_BUCKETS_PER_MESSAGE: usize = 4096;

/// One stream: its domain and its bookkeeping.
pub struct Stream {
    state: web::Data<AppState>,
    domain: String,
    book: Book,
}

/// One pool reported to in a message: the limit, the key's numbers, the reporting members.
struct Ask {
    pool: Arc<str>,
    limit: usize,
    numbers: Numbers,
    reported: Vec<(BucketKey, BucketId, u64)>,
}

impl Stream {
    /// A stream whose holders are told apart from every other stream's by `id`.
    pub fn new(state: web::Data<AppState>, id: String, tracked: Arc<TrackedBytes>) -> Stream {
        state.metrics.rlqs.streams.inc();
        Stream {
            state,
            domain: String::new(),
            book: Book::new(id, tracked),
        }
    }

    /// Whether the stream may go on after `reports`: a region's stream (the reserved domain)
    /// must name a region of `[home]` at its own floor; anything else is refused and counted,
    /// and that region keeps its floor.
    pub fn admit(&mut self, reports: &RateLimitQuotaUsageReports) -> Result<(), tonic::Status> {
        let domain = if reports.domain.is_empty() {
            self.domain.as_str()
        } else {
            reports.domain.as_str()
        };
        if !is_regions_domain(domain) {
            return Ok(());
        }
        let policy = self.state.limiter.policy();
        let refused = match &policy.home {
            Some(home) => match home.admit(domain) {
                Ok(region) => {
                    self.book.name_after(region);
                    None
                }
                Err(why) => Some(why.to_string()),
            },
            None => Some("this instance is no home ([home] is not set)".to_string()),
        };
        match refused {
            None => Ok(()),
            Some(why) => {
                self.state.metrics.rlqs.regions_refused.inc();
                Err(tonic::Status::failed_precondition(why))
            }
        }
    }

    /// The answer to one message of usage reports (empty when there is nothing to say).
    pub async fn answer(
        &mut self,
        mut reports: RateLimitQuotaUsageReports,
    ) -> RateLimitQuotaResponse {
        if !reports.domain.is_empty() {
            self.domain = std::mem::take(&mut reports.domain);
        }
        let state = self.state.clone();
        let policy = state.limiter.policy();
        let metrics = &state.metrics.rlqs;
        let ttl = policy.rlqs.assignment_ttl_s;
        let deadline = std::time::Instant::now() + policy.rlqs.timeout;
        let tracked_before = self.book.len();
        let mut actions = Vec::new();
        let asks = self.map(reports, &policy, &mut actions);
        let pools: Vec<PoolReport> = asks
            .iter()
            .map(|ask| {
                let reported: Vec<(BucketKey, u64)> = ask
                    .reported
                    .iter()
                    .map(|(key, _, requests)| (Arc::clone(key), *requests))
                    .collect();
                PoolReport {
                    key: ask.pool.to_string(),
                    holder: self.book.holder(&ask.pool),
                    limit: ask.limit,
                    numbers: ask.numbers,
                    members: self.book.members(&ask.pool, &reported),
                }
            })
            .collect();
        let answers = state.limiter.share(&policy, &pools, deadline).await;
        for (ask, answer) in asks.into_iter().zip(answers) {
            match answer {
                PoolAnswer::Shared(parts) => {
                    for ((key, bucket, _), (assignment, sent)) in
                        ask.reported.into_iter().zip(parts)
                    {
                        self.book.sent(&key, sent);
                        actions.push(action::assign(bucket, assignment, ttl, metrics));
                    }
                }
                PoolAnswer::Undecided {
                    unserved: Some(unserved),
                } => {
                    for (key, bucket, _) in ask.reported {
                        if !self.book.served(&key) {
                            actions.push(action::assign(bucket, unserved, ttl, metrics));
                        }
                    }
                }
                PoolAnswer::Undecided { unserved: None } => {}
            }
        }
        let tracked = i64::try_from(self.book.len()).unwrap_or(i64::MAX);
        metrics
            .buckets
            .add(tracked - i64::try_from(tracked_before).unwrap_or(i64::MAX));
        RateLimitQuotaResponse {
            bucket_action: actions,
        }
    }

    /// The message's buckets mapped: those answered at once go to `actions`; the others are
    /// tracked and returned grouped by pool.
    fn map(
        &mut self,
        reports: RateLimitQuotaUsageReports,
        policy: &tollgate_core::policy::Policy,
        actions: &mut Vec<BucketAction>,
    ) -> Vec<Ask> {
        let rules = &policy.rlqs;
        let metrics = &self.state.metrics.rlqs;
        let ttl = rules.assignment_ttl_s;
        let now_us = self.state.limiter.now_us();
        let abandon_after_us = rules.abandon_after_s.saturating_mul(1_000_000);
        let runtime = policy.runtime.view();
        let mut asks: Vec<Ask> = Vec::new();
        let mut by_pool: HashMap<Arc<str>, usize> = HashMap::new();
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
            let mapped = match &policy.home {
                Some(home) if is_regions_domain(&self.domain) => {
                    home.find(&bucket.bucket, &policy.limits)
                }
                _ => rules.find(&self.domain, &bucket.bucket, &policy.limits),
            };
            let Some(mapped) = mapped else {
                let assignment = match rules.unmatched {
                    Unmatched::Allow => Assignment::AllowAll,
                    Unmatched::Deny => Assignment::DenyAll,
                };
                actions.push(action::assign(bucket, assignment, ttl, metrics));
                continue;
            };
            let limit = &policy.limits[mapped.limit];
            let Some(mut numbers) = limit.numbers_for(&runtime, &mapped.tail) else {
                // An unlimited key.
                actions.push(action::assign(bucket, Assignment::AllowAll, ttl, metrics));
                continue;
            };
            if let (Some(home), Meter::Global(_)) = (&policy.home, limit.meter) {
                // A region's pool: what the floors leave of the key's numbers.
                numbers = home.pool_numbers(numbers);
            }
            let Some(pool) = pool_key(policy, mapped.limit, &mapped.tail) else {
                continue;
            };
            let pool: Arc<str> = match by_pool.get_key_value(pool.as_str()) {
                Some((known, _)) => Arc::clone(known),
                None => Arc::from(pool),
            };
            let key =
                match self
                    .book
                    .track(&bucket.bucket, &pool, requests, now_us, abandon_after_us)
                {
                    Tracking::Member(key) => key,
                    Tracking::Abandoned => {
                        actions.push(action::abandon(bucket, metrics));
                        continue;
                    }
                    Tracking::Untracked => {
                        metrics.untracked.inc();
                        actions.push(action::assign(bucket, Assignment::DenyAll, ttl, metrics));
                        continue;
                    }
                };
            let at = *by_pool.entry(Arc::clone(&pool)).or_insert_with(|| {
                asks.push(Ask {
                    pool: Arc::clone(&pool),
                    limit: mapped.limit,
                    numbers,
                    reported: Vec::new(),
                });
                asks.len() - 1
            });
            asks[at].reported.push((key, bucket, requests));
        }
        asks
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let metrics = &self.state.metrics.rlqs;
        metrics.streams.dec();
        metrics
            .buckets
            .sub(i64::try_from(self.book.len()).unwrap_or(i64::MAX));
    }
}
