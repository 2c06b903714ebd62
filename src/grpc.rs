//! Envoy's rate limit service over gRPC (`envoy.service.ratelimit.v3.RateLimitService`), so
//! Envoy's `envoy.filters.http.ratelimit` filter (and Istio, Contour, Emissary, Gloo, which
//! configure it) can call tollgate in place of envoyproxy/ratelimit.
//!
//! A request's descriptors become buckets (`plan`); the [`Limiter`](tollgate_core::limiter::Limiter)
//! decides them all in one atomic store call with the deny cache, breaker, timeouts and
//! `on_error` of `/check`; `answer` renders the verdict. The server that carries it (and
//! `grpc.health.v1.Health`) is the running process's: `app::grpc_server`.

mod answer;
pub mod json;
mod plan;
pub mod rlqs;
mod service;

use actix_web::web;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::Status;

pub use plan::{MAX_DESCRIPTORS, MAX_ENTRIES};
pub use service::RateLimitService;

use crate::state::AppState;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use plan::{Plan, RulesPlan};
use tollgate_core::erl::observe::ErlStats;
use tollgate_core::kinds::BucketRequest;
use tollgate_core::limiter::decision::Verdict;
use tollgate_core::limiter::CacheMay;
use tollgate_core::observe::trace::{attribute, Ruling, Span};
use tollgate_core::policy::Policy;
use tollgate_erl::grpc::plan::ErlPlan;
use tollgate_erl::grpc::{answer as erl_answer, count};

/// The handler of `ShouldRateLimit` (over gRPC, and envoyproxy/ratelimit's `/json`).
pub struct ShouldRateLimit {
    state: web::Data<AppState>,
}

impl ShouldRateLimit {
    pub fn new(state: web::Data<AppState>) -> ShouldRateLimit {
        ShouldRateLimit { state }
    }

    /// Decides one request: the plan, then one store call for all its buckets; the decision
    /// also set on `span`, when the call is traced.
    pub async fn decide(
        &self,
        request: &RateLimitRequest,
        span: Option<&mut Span>,
    ) -> Result<RateLimitResponse, Status> {
        let policy = self.state.limiter.policy();
        let plan = match plan::plan(&policy, request) {
            Ok(plan) => plan,
            Err(status) => {
                if let Some(stats) = &self.state.erl_stats {
                    stats.service_error();
                }
                if let Some(span) = span {
                    span.set_int(attribute::GRPC_STATUS, i64::from(i32::from(status.code())));
                    span.fail(status.message());
                }
                return Err(status);
            }
        };
        match &plan {
            Plan::Rules(plan) => self.answer(plan, &policy, request, span).await,
            Plan::Erl(plan) => self.answer(plan, &policy, request, span).await,
        }
    }

    /// The verdict on `plan`'s buckets, counted and answered as the plan's domain answers.
    async fn answer(
        &self,
        plan: &impl Shape,
        policy: &Policy,
        request: &RateLimitRequest,
        span: Option<&mut Span>,
    ) -> Result<RateLimitResponse, Status> {
        let verdict = match plan.missing() {
            Some(limit) => {
                self.state.metrics.checks.denied.inc();
                Verdict::MissingKey { limit }
            }
            None => {
                self.state
                    .limiter
                    .decide(policy, plan.buckets(), CacheMay::AnswerAlone)
                    .await
                    .verdict
            }
        };
        if let Some(stats) = &self.state.erl_stats {
            plan.count(stats, &verdict, policy, request);
        }
        if let Verdict::StoreError { why } = &verdict {
            // As envoyproxy/ratelimit answers a Redis error: an error status with the error,
            // for Envoy's `failure_mode_deny` to decide on.
            let status = Status::unknown(why.clone());
            if let Some(span) = span {
                span.set_str(attribute::DOMAIN, request.domain.as_str());
                verdict.attributes(policy).record(span);
                span.set_int(attribute::GRPC_STATUS, i64::from(i32::from(status.code())));
                span.fail(status.message());
            }
            return Err(status);
        }
        let response = plan.respond(&verdict, policy, request);
        if let Some(span) = span {
            let mut attributes = verdict.attributes(policy);
            // The answer is the truth (shadow mode admits what a limit denied).
            let allowed = response.overall_code != i32::from(Code::OverLimit);
            attributes.ruling = Ruling::from_allowed(allowed);
            if allowed {
                attributes.denied_by = None;
            }
            span.set_str(attribute::DOMAIN, request.domain.as_str());
            attributes.record(span);
            span.set_int(attribute::GRPC_STATUS, 0);
        }
        Ok(response)
    }
}

/// What a plan's domain decides for itself: which buckets, a key found missing before any
/// store call, what the request adds to envoyproxy/ratelimit's counters, and how the verdict
/// is answered. The rest of [`ShouldRateLimit::decide`] is the same in every domain.
trait Shape: Sync {
    fn buckets(&self) -> &[BucketRequest];

    /// A limit whose key is missing under `on_missing = "deny"`: refused without a store call.
    fn missing(&self) -> Option<usize> {
        None
    }

    /// What the request adds to envoyproxy/ratelimit's counters (nothing outside its
    /// domains).
    fn count(&self, _: &ErlStats, _: &Verdict, _: &Policy, _: &RateLimitRequest) {}

    fn respond(
        &self,
        verdict: &Verdict,
        policy: &Policy,
        request: &RateLimitRequest,
    ) -> RateLimitResponse;
}

impl Shape for RulesPlan {
    fn buckets(&self) -> &[BucketRequest] {
        &self.buckets
    }

    fn missing(&self) -> Option<usize> {
        self.missing.map(|(_, limit)| limit)
    }

    fn respond(
        &self,
        verdict: &Verdict,
        policy: &Policy,
        _: &RateLimitRequest,
    ) -> RateLimitResponse {
        answer::respond(verdict, self, policy)
    }
}

impl Shape for ErlPlan {
    fn buckets(&self) -> &[BucketRequest] {
        &self.buckets
    }

    fn count(
        &self,
        stats: &ErlStats,
        verdict: &Verdict,
        policy: &Policy,
        request: &RateLimitRequest,
    ) {
        count::count(stats, verdict, self, policy, request);
    }

    fn respond(
        &self,
        verdict: &Verdict,
        policy: &Policy,
        request: &RateLimitRequest,
    ) -> RateLimitResponse {
        match verdict {
            Verdict::Decided(decision) => {
                erl_answer::respond(Some(decision), self, policy, request)
            }
            Verdict::Unlimited => erl_answer::respond(None, self, policy, request),
            // What no rule decided is answered alike in every domain.
            _ => answer::undecided(verdict, self.descriptors.len(), policy),
        }
    }
}
