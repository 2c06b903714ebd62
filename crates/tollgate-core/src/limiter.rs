//! The decision, end to end and without HTTP: which limits apply, one atomic store call, and
//! what happens when the store fails (`on_error`). Generic over the store, so tests drive it
//! with a memory store on a manual clock or with a real Redis.
pub mod borrow;
pub mod decision;
pub mod deny_cache;
mod overrides;
pub mod peek;
pub mod region;
pub mod report;
pub mod rlqs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::base::clock::{Clock, MonotonicClock};
use crate::base::keys;
use crate::base::rate::count_f64;
use crate::config::OnError;
use crate::kinds::{BucketOutcome, BucketRequest};
use crate::limiter::borrow::{Asking, Lender};
use crate::limiter::decision::{Decision, LimitState, Verdict};
use crate::limiter::deny_cache::{CachedDenial, Consult, DenyCache, Probe};
use crate::observe::denial_log::DenialLog;
use crate::observe::metrics::Metrics;
use crate::policy::Policy;
use crate::request::OriginalRequest;
use crate::store::memory::MemoryStore;
use crate::store::{Store, StoreDecision, StoreError};

pub struct Limiter<S: Store> {
    store: S,
    policy: ArcSwap<Policy>,
    on_error: OnError,
    /// In-memory buckets used while the store fails, with `on_error = "local"`.
    fallback: Option<MemoryStore>,
    /// Live instances sharing the store, as last learned from it (at least 1).
    instances: AtomicU64,
    /// Denials the store would surely repeat, answered without asking it (remote stores).
    deny_cache: Option<DenyCache>,
    /// Slices of hot keys' tokens borrowed from the store (remote stores, borrowing limits).
    lender: Option<Lender>,
    /// `[log] denials = "sampled"`.
    denial_log: Option<DenialLog>,
    /// Store calls deciding RLQS reports in flight on this instance, at most
    /// [`rlqs::CALLS_IN_FLIGHT`].
    share_calls: tokio::sync::Semaphore,
    /// The time the limiter's own bookkeeping reads (µs; tests advance a manual one).
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    /// What this instance saw of global limits' keys wanting more than their floor.
    demand: region::Demand,
}

/// What a check or a decision came to, and who decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub verdict: Verdict,
    /// Who decided; tests use it to prove the deny cache exact.
    pub by: DecidedBy,
}

impl Outcome {
    fn new(verdict: Verdict, by: DecidedBy) -> Outcome {
        Outcome { verdict, by }
    }
}

/// When the deny cache may answer a decision in place of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMay {
    /// Whatever the request (`/check`): a cached denial carries the denying bucket's level
    /// and reports the others able to pay, which the headers of a denial never show.
    Answer,
    /// Only a request of one bucket. For a caller that shows every bucket's level (the gRPC
    /// answer reports each descriptor's `limit_remaining`): the cache knows only the denying
    /// bucket, so a request of several goes to the store and a denial reports what the others
    /// really hold.
    AnswerAlone,
}

/// Who decided a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// No store call was needed (exempt, no limit applies, or a key is missing).
    Policy,
    Store,
    DenyCache,
    /// Admitted from slices of borrowed tokens, without a store call.
    Borrowed,
    /// The store failed; `on_error` decided.
    OnError,
}

impl<S: Store> Limiter<S> {
    pub fn new(
        store: S,
        policy: Policy,
        on_error: OnError,
        max_buckets: usize,
        metrics: Metrics,
    ) -> Self {
        Limiter {
            store,
            policy: ArcSwap::from_pointee(policy),
            on_error,
            fallback: (on_error == OnError::Local).then(|| MemoryStore::new(max_buckets)),
            instances: AtomicU64::new(1),
            deny_cache: None,
            lender: None,
            denial_log: None,
            share_calls: tokio::sync::Semaphore::new(rlqs::CALLS_IN_FLIGHT),
            clock: Arc::new(MonotonicClock::default()),
            metrics,
            demand: region::Demand::default(),
        }
    }

    /// Reads `clock` instead of the monotonic one.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Now on the limiter's clock (µs since an arbitrary origin).
    pub fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    /// Answers denials the store would surely repeat locally, remembering up to `capacity`
    /// buckets, for a store answering within `timeout`. Worth it only when the store is remote.
    pub fn with_deny_cache(self, capacity: usize, timeout: Duration) -> Self {
        self.with_cache(DenyCache::new(capacity, timeout))
    }

    /// [`Limiter::with_deny_cache`] with a cache built by the caller (e.g. on a manual clock).
    pub fn with_cache(mut self, cache: DenyCache) -> Self {
        self.deny_cache = Some(cache);
        self
    }

    /// Borrows tokens for the limits that borrow (`borrow`), through `lender`.
    pub fn with_lender(mut self, lender: Lender) -> Self {
        self.lender = Some(lender);
        self
    }

    pub fn lender(&self) -> Option<&Lender> {
        self.lender.as_ref()
    }

    /// Logs denials, sampled (`[log] denials = "sampled"`).
    pub fn with_denial_log(mut self, log: DenialLog) -> Self {
        self.denial_log = Some(log);
        self
    }

    /// The current policy. Held for the whole check, so a reload never splits one.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Installs a new policy for the next checks (SIGHUP). The runtime overrides carry over:
    /// they live in the store, not in the file.
    pub fn replace_policy(&self, mut policy: Policy) {
        policy.runtime = self.policy.load().runtime.clone();
        self.policy.store(Arc::new(policy));
        // Slices taken under the old numbers are dropped (their tokens count as used).
        if let Some(lender) = &self.lender {
            lender.forget_all();
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// Forgets the deny cache's knowledge of one store key, whose bucket was just reset.
    pub fn forget_denials(&self, key: &str) {
        if let Some(cache) = &self.deny_cache {
            cache.forget(key);
        }
        if let Some(lender) = &self.lender {
            lender.forget(key);
        }
    }

    /// Forgets every cached denial: resets may have gone unheard (the reset channel was lost).
    pub fn forget_all_denials(&self) {
        if let Some(cache) = &self.deny_cache {
            cache.forget_all();
        }
        if let Some(lender) = &self.lender {
            lender.forget_all();
        }
    }

    /// How many instances share the store; the local fallback splits each limit this many ways.
    pub fn set_instances(&self, count: u64) {
        self.instances.store(count.max(1), Ordering::Relaxed);
    }

    pub fn instances(&self) -> u64 {
        self.instances.load(Ordering::Relaxed)
    }

    /// Decides one `/check` request: exemptions, the applicable limits, then [`Limiter::decide`]
    /// with the deny cache free to answer.
    pub async fn check(&self, policy: &Policy, request: &OriginalRequest<'_>) -> Outcome {
        if let Some(rule) = policy.exempt(request) {
            rule.counter.inc();
            self.metrics.checks.exempt.inc();
            return Outcome::new(Verdict::Exempt, DecidedBy::Policy);
        }
        let buckets = match policy.applicable(request) {
            Ok(buckets) => buckets,
            Err(limit) => {
                self.metrics.checks.denied.inc();
                return Outcome::new(Verdict::MissingKey { limit }, DecidedBy::Policy);
            }
        };
        self.decide(policy, &buckets, CacheMay::Answer).await
    }

    /// Decides buckets that the caller found applicable (`/check` through [`Limiter::check`];
    /// the gRPC path builds them from descriptors): borrowed slices, the deny cache as `cache`
    /// allows, one atomic store call, `on_error`.
    pub async fn decide(
        &self,
        policy: &Policy,
        buckets: &[BucketRequest],
        cache: CacheMay,
    ) -> Outcome {
        let cache_answers = match cache {
            CacheMay::Answer => true,
            CacheMay::AnswerAlone => buckets.len() <= 1,
        };
        if buckets.is_empty() {
            self.metrics.checks.allowed.inc();
            return Outcome::new(Verdict::Unlimited, DecidedBy::Policy);
        }
        let lends = self.lends(policy, buckets);
        if let (Some(lender), Some(lends)) = (&self.lender, &lends) {
            if let Some(left) = lender.serve_all(buckets, lends) {
                let decision = self.record_borrowed(policy, buckets, &left);
                return Outcome::new(Verdict::Decided(decision), DecidedBy::Borrowed);
            }
        }
        let asked = if cache_answers {
            self.consult_cache(policy, buckets).await
        } else {
            Ok((None, None))
        };
        let (probe, waited) = match asked {
            Ok(asked) => asked,
            Err(denial) => {
                let decision = self.record_cached_denial(policy, buckets, denial);
                return Outcome::new(Verdict::Decided(decision), DecidedBy::DenyCache);
            }
        };
        // Borrowing buckets give back their slices and ask for new ones; the ask learns the
        // answer, or is abandoned when dropped unanswered (a store error, a cancelled check).
        let asking = match (&self.lender, &lends) {
            (Some(lender), Some(lends)) => {
                let (asking, moved) = lender.ask_store(buckets, lends);
                self.metrics.borrow.returned.inc_by(moved.returned);
                Some(asking)
            }
            _ => None,
        };
        let sent = asking.as_ref().map_or(buckets, Asking::buckets);
        // The store's full timeout, even after waiting for a probe (see `deny_cache`); bounded
        // here too then, so the answer comes within the wait plus the timeout whatever the
        // store does.
        let decided = match waited {
            Some(budget) => tokio::time::timeout(budget, self.store.decide(sent))
                .await
                .unwrap_or(Err(StoreError::Timeout)),
            None => self.store.decide(sent).await,
        };
        if let (Ok(decided), Some(asking)) = (&decided, asking) {
            let borrowed = asking.learn(&decided.slices);
            self.metrics.borrow.borrowed.inc_by(borrowed);
        }
        match decided {
            Ok(decided) => {
                if let Some(probe) = probe {
                    probe.learn(&decided.buckets);
                }
                self.demand.note(policy, buckets, &decided.buckets);
                let decision = self.record(policy, buckets, decided, false);
                Outcome::new(Verdict::Decided(decision), DecidedBy::Store)
            }
            // The probe, if any, is dropped unanswered: abandoned, its waiters woken.
            Err(error) => Outcome::new(
                self.on_store_error(policy, buckets, &error),
                DecidedBy::OnError,
            ),
        }
    }

    /// Gives back the slices that fell quiet (no request of their key gave them back after
    /// their usable time), at most `most` of them, in one store call (a give-back happens
    /// whatever the call decides). A call that fails leaves the tokens to count as used when
    /// their groups end, as before. Returns the tokens given back.
    pub async fn give_back_quiet(&self, most: usize) -> u64 {
        let Some(lender) = &self.lender else {
            return 0;
        };
        let quiet = lender.quiet(most);
        if quiet.requests.is_empty() || self.store.decide(&quiet.requests).await.is_err() {
            return 0;
        }
        // Their keys hold more than this instance's cache may remember.
        if let Some(cache) = &self.deny_cache {
            for request in &quiet.requests {
                cache.forget(&request.key);
            }
        }
        self.metrics.borrow.returned.inc_by(quiet.unused);
        quiet.unused
    }

    /// Which buckets of this request borrow (by their limit's `borrow`); none when no limit
    /// of the request does, or when the store may split it (a Redis Cluster deciding a
    /// request of several keys per slot refunds what one slot charged, which a slice cannot
    /// follow: such requests are decided as without borrowing).
    fn lends(&self, policy: &Policy, buckets: &[BucketRequest]) -> Option<Vec<bool>> {
        self.lender.as_ref()?;
        if buckets.len() > 1 && self.store.splits_requests() {
            return None;
        }
        let lends: Vec<bool> = buckets
            .iter()
            .map(|b| policy.limits.get(b.limit).is_some_and(|l| l.borrow))
            .collect();
        lends.contains(&true).then_some(lends)
    }

    /// A request admitted from slices: every bucket paid its cost from its slice, which
    /// then holds `left`; that is what the headers show (what this instance can still admit
    /// for sure, never more than the bucket would).
    fn record_borrowed(
        &self,
        policy: &Policy,
        buckets: &[BucketRequest],
        left: &[f64],
    ) -> Decision {
        self.metrics.checks.allowed.inc();
        let limits = buckets
            .iter()
            .zip(left)
            .map(|(bucket, &tokens)| {
                policy.limits[bucket.limit].counters.allowed.inc();
                self.metrics.borrow.used.inc_by(bucket.cost);
                let paid = BucketOutcome {
                    tokens,
                    enough: true,
                    window: None,
                };
                LimitState::of(bucket, &paid)
            })
            .collect();
        Decision {
            allowed: true,
            limits,
            degraded: false,
            leases: Vec::new(),
            reservations: Vec::new(),
        }
    }

    /// The deny cache's say: a denial, or the probe to teach with the store's answer (none
    /// when there is no cache or it may not speak for these buckets), and, when the check
    /// waited for another's probe, the budget of its own store call.
    async fn consult_cache<'c, 'b>(
        &'c self,
        policy: &Policy,
        buckets: &'b [BucketRequest],
    ) -> Result<(Option<Probe<'c, 'b>>, Option<Duration>), CachedDenial> {
        let Some(cache) = &self.deny_cache else {
            return Ok((None, None));
        };
        if !self.cacheable(policy) {
            return Ok((None, None));
        }
        let mut waited = false;
        loop {
            match cache.consult(buckets, waited) {
                Consult::Deny(denial) => return Err(denial),
                Consult::Ask(probe) => {
                    return Ok((Some(probe), waited.then(|| cache.store_timeout())));
                }
                Consult::Wait => {
                    cache.wait(buckets).await;
                    waited = true;
                }
            }
        }
    }

    /// Whether only time can raise this policy's buckets, as the deny cache requires. A store
    /// that splits a request (a Redis Cluster, per slot) refunds the buckets it charged when
    /// another slot denies; a request spans slots when its limits are keyed on different
    /// parts, so then any bucket may be raised by a refund, here or on another instance.
    fn cacheable(&self, policy: &Policy) -> bool {
        !self.store.splits_requests()
            || (policy
                .limits
                .windows(2)
                .all(|pair| pair[0].key == pair[1].key)
                // A gRPC request's descriptors carry different values: it may span slots
                // whatever the limits key on.
                && policy.limits.iter().all(|limit| limit.descriptor.is_none()))
    }

    /// A denial by the cache, shaped like the store's: the denying bucket carries its token
    /// ceiling (so `Retry-After` and `RateLimit` come from the cached bound); the others were
    /// not looked at and are reported as able to pay, which the headers of a denial never show.
    fn record_cached_denial(
        &self,
        policy: &Policy,
        buckets: &[BucketRequest],
        denial: CachedDenial,
    ) -> Decision {
        self.metrics.checks.denied.inc();
        let limits = buckets
            .iter()
            .enumerate()
            .map(|(index, bucket)| {
                let denied = index == denial.bucket;
                let cached = BucketOutcome {
                    tokens: if denied { denial.tokens } else { bucket.burst },
                    enough: !denied,
                    window: None,
                };
                let state = LimitState::of(bucket, &cached);
                if denied {
                    self.count_denial(policy, bucket, &state);
                }
                state
            })
            .collect();
        Decision {
            allowed: false,
            limits,
            degraded: false,
            leases: Vec::new(),
            reservations: Vec::new(),
        }
    }

    fn on_store_error(
        &self,
        policy: &Policy,
        buckets: &[BucketRequest],
        error: &StoreError,
    ) -> Verdict {
        log::debug!("store failed, answering per on_error: {error}");
        match (&self.fallback, self.on_error) {
            (Some(fallback), OnError::Local) => {
                // Recorded with the scaled numbers: the headers must describe the bucket that
                // decided, or `Retry-After` would be N times too short.
                let scaled = self.split_among_instances(buckets);
                let decided = fallback.decide_sync(&scaled);
                Verdict::Decided(self.record(policy, &scaled, decided, true))
            }
            (_, OnError::Deny) => {
                self.metrics.checks.error_denied.inc();
                Verdict::StoreFailed { allow: false }
            }
            (_, OnError::Error) => {
                self.metrics.checks.error.inc();
                Verdict::StoreError {
                    why: error.to_string(),
                }
            }
            _ => {
                self.metrics.checks.error_allowed.inc();
                Verdict::StoreFailed { allow: true }
            }
        }
    }

    /// Each of N instances enforces `rate / N` and `burst / N` (at least one token, so a small
    /// burst still admits something).
    fn split_among_instances(&self, buckets: &[BucketRequest]) -> Vec<BucketRequest> {
        let n = count_f64(self.instances());
        buckets
            .iter()
            .map(|b| BucketRequest {
                rate: b.rate / n,
                burst: (b.burst / n).max(1.0),
                ..b.clone()
            })
            .collect()
    }

    /// Counts the decision and turns it into a [`Decision`]; `buckets` are the requests as the
    /// store decided them.
    fn record(
        &self,
        policy: &Policy,
        buckets: &[BucketRequest],
        decided: StoreDecision,
        degraded: bool,
    ) -> Decision {
        let checks = &self.metrics.checks;
        match (decided.allowed, degraded) {
            (true, false) => checks.allowed.inc(),
            (false, false) => checks.denied.inc(),
            (true, true) => checks.error_allowed.inc(),
            (false, true) => checks.error_denied.inc(),
        }
        let limits = buckets
            .iter()
            .zip(&decided.buckets)
            .map(|(bucket, outcome)| {
                let limit = &policy.limits[bucket.limit];
                let state = LimitState::of(bucket, outcome);
                match (outcome.enough, limit.shadow) {
                    (true, _) => limit.counters.allowed.inc(),
                    (false, true) => limit.counters.shadow_denied.inc(),
                    (false, false) => self.count_denial(policy, bucket, &state),
                }
                state
            })
            .collect();
        let (mut leases, mut reservations) = (Vec::new(), Vec::new());
        if decided.allowed {
            for (bucket, outcome) in buckets.iter().zip(&decided.buckets) {
                let limit = &policy.limits[bucket.limit];
                if let (Some(lease), true) = (bucket.meter.lease(), outcome.enough) {
                    limit.counters.leases_taken.inc();
                    leases.push(limit.lease_id(&policy.key_prefix, &bucket.key, lease));
                }
                if let (Some(reserve), true) =
                    (bucket.meter.reserve(), outcome.enough && bucket.cost > 0)
                {
                    limit.counters.reservations_opened.inc();
                    reservations.push(limit.reservation_id(
                        &policy.key_prefix,
                        &bucket.key,
                        reserve,
                        bucket.cost,
                    ));
                }
            }
        }
        Decision {
            allowed: decided.allowed,
            limits,
            degraded,
            leases,
            reservations,
        }
    }

    /// A limit denied `bucket`: its counter, its key's place in the top list, the deny log.
    /// Only denials come here, so the allowed path pays nothing for them.
    fn count_denial(&self, policy: &Policy, bucket: &BucketRequest, state: &LimitState) {
        let limit = &policy.limits[bucket.limit];
        limit.counters.denied.inc();
        let tail = keys::tail_in_key(&bucket.key, &policy.key_prefix, &limit.name);
        limit.counters.denied_keys.record(tail);
        if let Some(log) = &self.denial_log {
            log.note(&limit.name, tail, state.wait_secs(), &policy.salt);
        }
    }
}
