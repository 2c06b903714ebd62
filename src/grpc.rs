//! Envoy's rate limit service over gRPC (`envoy.service.ratelimit.v3.RateLimitService`), so
//! Envoy's `envoy.filters.http.ratelimit` filter (and Istio, Contour, Emissary, Gloo, which
//! configure it) can call tollgate in place of envoyproxy/ratelimit.
//!
//! A request's descriptors become buckets (`plan`); the [`Limiter`](crate::limiter::Limiter)
//! decides them all in one atomic store call with the deny cache, breaker, timeouts and
//! `on_error` of `/check`; `answer` renders the verdict. The server that carries it (and
//! `grpc.health.v1.Health`) is the running process's: `app::grpc_server`.

mod answer;
mod erl_count;
pub mod json;
mod plan;
mod service;

use actix_web::web;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::Status;

pub use plan::{MAX_DESCRIPTORS, MAX_ENTRIES};
pub use service::RateLimitService;

use crate::limiter::decision::Verdict;
use crate::state::AppState;

/// The `ShouldRateLimit` handler.
pub struct RateLimiter {
    state: web::Data<AppState>,
}

impl RateLimiter {
    pub fn new(state: web::Data<AppState>) -> RateLimiter {
        RateLimiter { state }
    }

    /// Decides one request: the plan, then one store call for all its buckets.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let policy = self.state.limiter.policy();
        let erl_stats = self.state.erl_stats.as_deref();
        let plan = plan::plan(&policy, request).inspect_err(|_| {
            if let Some(stats) = erl_stats {
                stats.service_error();
            }
        })?;
        let verdict = match plan.missing {
            Some((_, limit)) => {
                self.state.metrics.checks.denied.inc();
                Verdict::MissingKey { limit }
            }
            None => {
                self.state
                    .limiter
                    .decide_showing_all(&policy, &plan.buckets)
                    .await
                    .0
            }
        };
        if let Some(stats) = erl_stats {
            erl_count::count(stats, &verdict, &plan, &policy, request);
        }
        Ok(answer::respond(&verdict, &plan, &policy, request))
    }
}
