//! One stream's reports. Each reported bucket id is mapped to its pool (a limit and key) or
//! answered at once (no rule maps it, its key is unlimited, or the stream cannot track it).
//! The stream holds one share of each pool it reports to; the buckets mapped to that pool are
//! the share's members (ids that differ only in entries the rule does not key on), each
//! enforcing its part. Each pool is decided once per message, and every bucket answered in
//! one response. A bucket idle for `rlqs.abandon_after_s` is abandoned.
//!
//! What a stream keeps is bounded whatever Envoy sends: ids of at most
//! [`MAX_BUCKET_ID_BYTES`], at most [`MAX_BUCKETS_PER_STREAM`] of them and
//! [`MAX_TRACKED_BYTES`] in all, [`MAX_MEMBERS_PER_POOL`] in one pool; unmapped ids are not
//! kept at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::web;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};

use super::action;
use crate::config::rlqs::Unmatched;
use crate::limiter::shares::{self, Assignment, Units};
use crate::policy::limit::Numbers;
use crate::state::AppState;
use crate::store::shares::{Grant, Member, Sent};
use crate::store::shares_key;

/// The most buckets one message is answered for; Envoy sends one entry per bucket it holds.
pub const MAX_BUCKETS_PER_MESSAGE: usize = 4096;
/// The most buckets one stream tracks.
pub const MAX_BUCKETS_PER_STREAM: usize = 65_536;
/// The largest bucket id a stream tracks: its entries' keys and values, together.
pub const MAX_BUCKET_ID_BYTES: usize = 4096;
/// The most bytes one stream's tracked buckets and shares take (ids, pool keys, bookkeeping).
pub const MAX_TRACKED_BYTES: usize = 16 << 20;
/// The most buckets of one stream in one pool: the members of one share.
pub const MAX_MEMBERS_PER_POOL: usize = 1024;
/// What tracking one bucket or one share costs besides its bytes (counted against
/// [`MAX_TRACKED_BYTES`]).
const ENTRY_BYTES: usize = 96;

/// A bucket id, spelled canonically: its entries sorted, each key and value length-prefixed.
type BucketKey = Arc<[u8]>;

/// One tracked bucket: a member of the stream's share of its pool.
struct Tracked {
    pool: Arc<str>,
    /// When it last reported requests.
    used_at: Instant,
    /// What it was last sent, on the store's clock.
    last: Sent,
    /// Whether this stream ever sent it a share.
    served: bool,
    bytes: usize,
}

/// The stream's share of one pool.
struct Holder {
    /// Its holder id in the pool: the stream's id and a counter.
    id: String,
    members: Vec<BucketKey>,
}

/// One stream's state: its domain, its buckets and its shares.
pub struct Stream {
    state: web::Data<AppState>,
    /// Unique among the streams of every replica: the instance's random id and a counter.
    id: String,
    domain: String,
    buckets: HashMap<BucketKey, Tracked>,
    holders: HashMap<Arc<str>, Holder>,
    next_holder: u64,
    bytes: usize,
}

/// One pool reported to in a message: its share's members that reported, and the numbers.
struct Ask {
    pool: Arc<str>,
    limit: usize,
    numbers: Numbers,
    units: Units,
    reported: Vec<(BucketKey, BucketId, u64)>,
}

/// What tracking a reported bucket came to.
enum Tracking {
    /// A member of its pool's share: decided with the pool.
    Member(BucketKey),
    Abandoned,
    /// Past a cap: answered without a share.
    Untracked,
}

impl Stream {
    pub fn new(state: web::Data<AppState>, id: String) -> Stream {
        state.metrics.rlqs.streams.inc();
        Stream {
            state,
            id,
            domain: String::new(),
            buckets: HashMap::new(),
            holders: HashMap::new(),
            next_holder: 0,
            bytes: 0,
        }
    }

    /// The answer to one message of usage reports (empty when there is nothing to say).
    pub async fn answer(&mut self, reports: RateLimitQuotaUsageReports) -> RateLimitQuotaResponse {
        if !reports.domain.is_empty() {
            self.domain = reports.domain;
        }
        let state = self.state.clone();
        let policy = state.limiter.policy();
        let rules = &policy.rlqs;
        let metrics = &state.metrics.rlqs;
        let now = Instant::now();
        let deadline = now + rules.timeout;
        let ttl = rules.assignment_ttl_s;
        let mut actions = Vec::new();
        let mut asks: Vec<Ask> = Vec::new();
        let mut by_pool: HashMap<Arc<str>, usize> = HashMap::new();
        let runtime = policy.runtime.view();
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
            let Some(mapped) = rules.find(&self.domain, &bucket.bucket, &policy.limits) else {
                let assignment = match rules.unmatched {
                    Unmatched::Allow => Assignment::AllowAll,
                    Unmatched::Deny => Assignment::DenyAll,
                };
                actions.push(action::assign(bucket, assignment, ttl, metrics));
                continue;
            };
            let limit = &policy.limits[mapped.limit];
            let Some(numbers) = limit.numbers_for(&runtime, &mapped.tail) else {
                // An unlimited key.
                actions.push(action::assign(bucket, Assignment::AllowAll, ttl, metrics));
                continue;
            };
            let pool = shares_key(&limit.store_key(&policy.key_prefix, &mapped.tail));
            let pool: Arc<str> = match by_pool.get_key_value(pool.as_str()) {
                Some((known, _)) => Arc::clone(known),
                None => Arc::from(pool),
            };
            let key = match self.track(&bucket, &pool, requests, now, rules.abandon_after_s) {
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
                    units: shares::units(&numbers),
                    reported: Vec::new(),
                });
                asks.len() - 1
            });
            asks[at].reported.push((key, bucket, requests));
        }
        drop(runtime);
        let requests: Vec<_> = asks
            .iter()
            .map(|ask| {
                let key = ask.pool.to_string();
                shares::share_request(
                    key,
                    self.holder_id(ask),
                    self.members(ask),
                    &ask.units,
                    rules,
                )
            })
            .collect();
        let decided = self.state.limiter.share(&requests, deadline).await;
        let hold_us = requests.first().map_or(0, |r| r.hold_us);
        for (ask, result) in asks.into_iter().zip(decided) {
            match result {
                Ok(grant) => self.serve(ask, &grant, hold_us, &policy, &mut actions),
                Err(error) => {
                    log::debug!("rlqs: no share decided for {}: {error}", ask.pool);
                    self.fall_back(ask, &mut actions);
                }
            }
        }
        RateLimitQuotaResponse {
            bucket_action: actions,
        }
    }

    /// Tracks a reported bucket of `pool` as a member of the stream's share of it, or says
    /// why not: idle too long (abandoned), or past a cap.
    fn track(
        &mut self,
        bucket: &BucketId,
        pool: &Arc<str>,
        requests: u64,
        now: Instant,
        abandon_after_s: u64,
    ) -> Tracking {
        let Some(key) = canonical(bucket) else {
            return Tracking::Untracked;
        };
        if let Some(tracked) = self.buckets.get_mut(&key[..]) {
            if requests > 0 {
                tracked.used_at = now;
            } else if now.duration_since(tracked.used_at) >= Duration::from_secs(abandon_after_s) {
                self.forget(&key);
                return Tracking::Abandoned;
            }
            if tracked.pool == *pool {
                let key = self
                    .buckets
                    .get_key_value(&key[..])
                    .map(|(k, _)| Arc::clone(k));
                return key.map_or(Tracking::Untracked, Tracking::Member);
            }
            // A reload mapped it to another pool: it joins that share as a newcomer.
            self.forget(&key);
        }
        let bytes = key.len() + ENTRY_BYTES;
        let holder_bytes = if self.holders.contains_key(pool) {
            0
        } else {
            pool.len() + ENTRY_BYTES
        };
        let members = self.holders.get(pool).map_or(0, |h| h.members.len());
        if self.buckets.len() >= MAX_BUCKETS_PER_STREAM
            || self.bytes + bytes + holder_bytes > MAX_TRACKED_BYTES
            || members >= MAX_MEMBERS_PER_POOL
        {
            return Tracking::Untracked;
        }
        let key: BucketKey = Arc::from(key);
        let id = &self.id;
        let next = &mut self.next_holder;
        let holder = self.holders.entry(Arc::clone(pool)).or_insert_with(|| {
            *next += 1;
            Holder {
                id: format!("{id}.{:x}", *next - 1),
                members: Vec::new(),
            }
        });
        holder.members.push(Arc::clone(&key));
        self.bytes += bytes + holder_bytes;
        self.buckets.insert(
            Arc::clone(&key),
            Tracked {
                pool: Arc::clone(pool),
                used_at: now,
                last: Sent::default(),
                served: false,
                bytes,
            },
        );
        self.state.metrics.rlqs.buckets.inc();
        Tracking::Member(key)
    }

    /// Stops tracking a bucket; a share left without members is dropped (what it was sent
    /// counts in the store until it expires).
    fn forget(&mut self, key: &[u8]) {
        let Some(tracked) = self.buckets.remove(key) else {
            return;
        };
        self.bytes -= tracked.bytes;
        self.state.metrics.rlqs.buckets.dec();
        if let Some(holder) = self.holders.get_mut(&tracked.pool) {
            holder.members.retain(|member| &member[..] != key);
            if holder.members.is_empty() {
                self.holders.remove(&tracked.pool);
                self.bytes -= tracked.pool.len() + ENTRY_BYTES;
            }
        }
    }

    fn holder_id(&self, ask: &Ask) -> String {
        self.holders
            .get(&ask.pool)
            .map(|h| h.id.clone())
            .unwrap_or_default()
    }

    /// Every member of the share of `ask`'s pool: those that reported in this message with
    /// their requests (in the order of `ask.reported`), then the others.
    fn members(&self, ask: &Ask) -> Vec<Member> {
        let last = |key: &[u8]| self.buckets.get(key).map(|t| t.last).unwrap_or_default();
        let mut members: Vec<Member> = ask
            .reported
            .iter()
            .map(|(key, _, requests)| Member {
                reported: true,
                requests: *requests,
                last: last(key),
            })
            .collect();
        if let Some(holder) = self.holders.get(&ask.pool) {
            // The same allocation as the holder's member: compared by address.
            let reported: std::collections::HashSet<*const u8> = ask
                .reported
                .iter()
                .map(|(key, _, _)| key.as_ptr())
                .collect();
            members.extend(
                holder
                    .members
                    .iter()
                    .filter(|key| !reported.contains(&key.as_ptr()))
                    .map(|key| Member {
                        reported: false,
                        requests: 0,
                        last: last(key),
                    }),
            );
        }
        members
    }

    /// Each reporting member's part of the grant, as its bucket action.
    fn serve(
        &mut self,
        ask: Ask,
        grant: &Grant,
        hold_us: u64,
        policy: &crate::policy::Policy,
        actions: &mut Vec<BucketAction>,
    ) {
        let metrics = &self.state.metrics.rlqs;
        let ttl = policy.rlqs.assignment_ttl_s;
        log::debug!(
            "rlqs: {} in {}: {} bucket(s), share rate {} size {} ({} holders, {}/{} rate and \
             {}/{} size counted)",
            self.holder_id(&ask),
            ask.pool,
            ask.reported.len(),
            grant.rate,
            grant.size,
            grant.holders,
            grant.counted_rate,
            ask.units.rate,
            grant.counted_size,
            ask.units.size,
        );
        if let Some(limit) = policy.limits.get(ask.limit) {
            metrics
                .utilisation
                .with_label_values(&[limit.name.as_str()])
                .set(shares::utilisation(grant, &ask.units));
        }
        for ((key, bucket, _), &(rate, size)) in ask.reported.into_iter().zip(&grant.members) {
            if let Some(tracked) = self.buckets.get_mut(&key) {
                tracked.last = Sent {
                    rate,
                    size,
                    until_us: grant.now_us.saturating_add(hold_us),
                };
                tracked.served = true;
            }
            let assignment = shares::assignment((rate, size), &ask.units);
            actions.push(action::assign(bucket, assignment, ttl, metrics));
        }
    }

    /// The pool could not be decided: a bucket this stream served keeps its assignment until
    /// its TTL (then Envoy's `expired_assignment_behavior`); one never served is answered as
    /// `store.on_error` answers a check.
    fn fall_back(&self, ask: Ask, actions: &mut Vec<BucketAction>) {
        let metrics = &self.state.metrics.rlqs;
        let limiter = &self.state.limiter;
        let ttl = limiter.policy().rlqs.assignment_ttl_s;
        for (key, bucket, _) in ask.reported {
            if self.buckets.get(&key).is_some_and(|t| t.served) {
                continue;
            }
            let assignment =
                shares::on_error(limiter.on_error(), &ask.numbers, limiter.instances());
            actions.push(action::assign(bucket, assignment, ttl, metrics));
        }
    }
}

/// A bucket id's canonical bytes, or `None` when it is larger than [`MAX_BUCKET_ID_BYTES`].
fn canonical(bucket: &BucketId) -> Option<Vec<u8>> {
    let size: usize = bucket.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_BUCKET_ID_BYTES {
        return None;
    }
    let mut entries: Vec<(&String, &String)> = bucket.bucket.iter().collect();
    entries.sort();
    let mut bytes = Vec::with_capacity(size + 8 * entries.len());
    for (k, v) in entries {
        for text in [k, v] {
            // Both lengths fit: the whole id is at most MAX_BUCKET_ID_BYTES.
            bytes.extend_from_slice(&u32::try_from(text.len()).unwrap_or(u32::MAX).to_le_bytes());
            bytes.extend_from_slice(text.as_bytes());
        }
    }
    Some(bytes)
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
