//! The answer in a domain of envoyproxy/ratelimit rules, shaped as envoyproxy/ratelimit shapes
//! it: per descriptor its rule's configured limit (name, requests per unit, unit) and what is
//! left; an unlimited descriptor OK with 4294967295 left; a descriptor no rule limits OK with
//! nothing; a shadow-mode descriptor OK even when over. The request is OVER_LIMIT when a
//! descriptor that is not in quota mode is over, or when every quota-mode descriptor is, and
//! never in global shadow mode.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration, ListValue, Struct, Value};

use super::metadata::merge;
use super::plan::{ErlDescriptor, ErlPlan};
use tollgate_core::answer::{each_header, Carrier};
use tollgate_core::erl::policy::{Kind as RuleKind, UNLIMITED_REMAINING};
use tollgate_core::limiter::decision::Decision;
use tollgate_core::policy::Policy;

/// The answer to a request of `plan` that its rules decided (`decision`), or that none
/// limited (`None`).
pub fn respond(
    decision: Option<&Decision>,
    plan: &ErlPlan,
    policy: &Policy,
    request: &RateLimitRequest,
) -> RateLimitResponse {
    let mut rate_over = 0;
    let mut quota_over = 0;
    let mut quotas = 0;
    let statuses: Vec<DescriptorStatus> = plan
        .descriptors
        .iter()
        .map(|descriptor| {
            let (status, over) = status(descriptor, decision, policy);
            if descriptor.kind == RuleKind::Unlimited {
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
    let denied = (rate_over > 0 || (quotas > 0 && quotas == quota_over)) && !policy.erl.shadow_mode;
    let mut headers = Vec::new();
    if let Some(decision) = decision {
        each_header(decision, policy, denied, Carrier::Grpc, |name, value| {
            headers.push(header(name.as_str(), value.to_string()));
        });
    }
    let dynamic_metadata = policy
        .erl
        .dynamic_metadata
        .then(|| metadata(request, plan, &statuses, policy));
    RateLimitResponse {
        overall_code: if denied { Code::OverLimit } else { Code::Ok }.into(),
        statuses,
        response_headers_to_add: headers,
        dynamic_metadata,
        ..RateLimitResponse::default()
    }
}

fn header(name: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: name.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

fn string(text: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(text)),
    }
}

fn number(n: u64) -> Value {
    #[expect(
        clippy::cast_precision_loss,
        reason = "protobuf's Struct holds numbers as doubles, as envoyproxy/ratelimit sends them"
    )]
    let n = n as f64;
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

/// envoyproxy/ratelimit's `dynamic_metadata`: the domain, each descriptor (its entries as
/// `key=value`, its own limit and hits if any), the request's hits if any, and the `metadata`
/// of the rules of the descriptors that passed (unlimited ones aside), merged, the first value
/// of a key kept.
fn metadata(
    request: &RateLimitRequest,
    plan: &ErlPlan,
    statuses: &[DescriptorStatus],
    policy: &Policy,
) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_string(), string(request.domain.clone()));
    let descriptors = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let mut one = HashMap::new();
            let entries = descriptor
                .entries
                .iter()
                .map(|e| string(format!("{}={}", e.key, e.value)))
                .collect();
            one.insert("entries".to_string(), list(entries));
            if let Some(limit) = &descriptor.limit {
                let unit = Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
                one.insert(
                    "limit".to_string(),
                    string(format!(
                        "requests_per_unit:{} unit:{unit}",
                        limit.requests_per_unit
                    )),
                );
            }
            if let Some(hits) = &descriptor.hits_addend {
                one.insert("hitsAddend".to_string(), number(hits.value));
            }
            Value {
                kind: Some(Kind::StructValue(Struct { fields: one })),
            }
        })
        .collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_string(),
            number(u64::from(request.hits_addend)),
        );
    }
    let mut passed = Struct::default();
    for (descriptor, status) in plan.descriptors.iter().zip(statuses) {
        if descriptor.kind == RuleKind::Unlimited || status.code == i32::from(Code::OverLimit) {
            continue;
        }
        let own = descriptor
            .rule
            .and_then(|r| policy.erl.rules[r].metadata.as_ref());
        if let Some(own) = own {
            merge(&mut passed, own);
        }
    }
    if !passed.fields.is_empty() {
        fields.insert(
            "metadata".to_string(),
            Value {
                kind: Some(Kind::StructValue(passed)),
            },
        );
    }
    Struct { fields }
}

/// One descriptor's status, and whether it counts as over the limit (never in shadow mode).
fn status(
    descriptor: &ErlDescriptor,
    decision: Option<&Decision>,
    policy: &Policy,
) -> (DescriptorStatus, bool) {
    let limit = || RateLimit {
        name: descriptor
            .rule
            .map(|r| policy.erl.rules[r].name.clone())
            .unwrap_or_default(),
        requests_per_unit: descriptor.requests_per_unit,
        unit: descriptor.unit,
    };
    let (over, remaining, reset) = match descriptor.kind {
        RuleKind::NoLimit => {
            return (
                DescriptorStatus {
                    code: Code::Ok.into(),
                    ..DescriptorStatus::default()
                },
                false,
            )
        }
        RuleKind::Unlimited => {
            return (
                DescriptorStatus {
                    code: Code::Ok.into(),
                    limit_remaining: UNLIMITED_REMAINING,
                    ..DescriptorStatus::default()
                },
                false,
            )
        }
        RuleKind::Zero => (descriptor.zero_over(), 0, descriptor.unit_secs),
        RuleKind::Bucket => {
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
