//! The answer in a domain of envoyproxy/ratelimit rules, shaped as envoyproxy/ratelimit shapes
//! it: per descriptor its rule's configured limit (name, requests per unit, unit) and what is
//! left; an unlimited descriptor OK with 4294967295 left; a descriptor no rule limits OK with
//! nothing; a shadow-mode descriptor OK even when over. The request is OVER_LIMIT when a
//! descriptor that is not in quota mode is over, or when every quota-mode descriptor is, and
//! never in global shadow mode.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration;

use super::header;
use crate::grpc::plan::{EnvoyDescriptor, Plan};
use crate::http::response::each_quota_header;
use crate::limiter::decision::{Decision, Verdict};
use crate::policy::descriptors::envoy::{Kind, UNLIMITED_REMAINING};
use crate::policy::limits::Policy;

pub fn respond(verdict: &Verdict, plan: &Plan, policy: &Policy) -> RateLimitResponse {
    let decision = match verdict {
        Verdict::Decided(decision) => Some(decision),
        _ => None,
    };
    let mut rate_over = 0;
    let mut quota_over = 0;
    let mut quotas = 0;
    let statuses: Vec<DescriptorStatus> = plan
        .envoy
        .iter()
        .map(|descriptor| {
            let (status, over) = status(descriptor, decision, policy);
            if descriptor.kind == Kind::Unlimited {
                // Counted neither way, as envoyproxy/ratelimit counts it.
            } else if descriptor.quota {
                quotas += 1;
                quota_over += usize::from(over);
            } else {
                rate_over += usize::from(over);
            }
            status
        })
        .collect();
    let denied =
        (rate_over > 0 || (quotas > 0 && quotas == quota_over)) && !policy.envoy.shadow_mode;
    let mut headers = Vec::new();
    if let Some(decision) = decision {
        each_quota_header(decision, policy, |name, value| {
            headers.push(header(name.as_str(), &value.to_string()));
        });
        if denied {
            if let Some(seconds) = decision.retry_after(policy) {
                headers.push(header("retry-after", &seconds.to_string()));
            }
        }
    }
    RateLimitResponse {
        overall_code: if denied { Code::OverLimit } else { Code::Ok }.into(),
        statuses,
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

/// One descriptor's status, and whether it counts as over the limit (never in shadow mode).
fn status(
    descriptor: &EnvoyDescriptor,
    decision: Option<&Decision>,
    policy: &Policy,
) -> (DescriptorStatus, bool) {
    let limit = || RateLimit {
        name: descriptor
            .rule
            .map(|r| policy.envoy.rules[r].name.clone())
            .unwrap_or_default(),
        requests_per_unit: descriptor.requests_per_unit,
        unit: descriptor.unit,
    };
    let (over, remaining, reset) = match descriptor.kind {
        Kind::NoLimit => {
            return (
                DescriptorStatus {
                    code: Code::Ok.into(),
                    ..DescriptorStatus::default()
                },
                false,
            )
        }
        Kind::Unlimited => {
            return (
                DescriptorStatus {
                    code: Code::Ok.into(),
                    limit_remaining: UNLIMITED_REMAINING,
                    ..DescriptorStatus::default()
                },
                false,
            )
        }
        Kind::Zero => (descriptor.zero_over(), 0, descriptor.unit_secs),
        Kind::Bucket => {
            let state = decision.and_then(|d| d.limits.get(descriptor.bucket));
            match state {
                Some(state) if state.enough => (
                    false,
                    u32::try_from(state.remaining()).unwrap_or(u32::MAX),
                    state.reset_secs(),
                ),
                Some(state) => (true, 0, state.reset_secs()),
                None => (false, descriptor.requests_per_unit, 0),
            }
        }
    };
    let over = over && !descriptor.shadow;
    (
        DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok }.into(),
            current_limit: Some(limit()),
            limit_remaining: remaining,
            duration_until_reset: Some(Duration {
                seconds: i64::try_from(reset).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            ..DescriptorStatus::default()
        },
        over,
    )
}
