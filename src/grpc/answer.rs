//! A [`Verdict`] turned into Envoy's `RateLimitResponse`: the overall code, one status per
//! descriptor, and the same rate-limit headers `/check` sends, for Envoy to add to the client's
//! response.
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration;

use super::plan::RulesPlan;
use tollgate_core::answer::{each_header, Carrier, Refusal};
use tollgate_core::base::calendar::Period;
use tollgate_core::limiter::decision::{most_restrictive, Decision, LimitState, Verdict};
use tollgate_core::policy::limit::Limit;
use tollgate_core::policy::Policy;

/// The answer in a domain of `[[limits]]`: each descriptor the status of its limits.
pub fn respond(verdict: &Verdict, plan: &RulesPlan, policy: &Policy) -> RateLimitResponse {
    // Every refusal is OVER_LIMIT; a decision's descriptors each have their own status.
    match verdict {
        Verdict::Decided(decision) => decided(decision, plan, policy),
        Verdict::MissingKey { .. } => {
            let mut response = uniform(Code::Ok, plan.per_descriptor.len(), Vec::new());
            response.overall_code = Code::OverLimit.into();
            if let Some((index, _)) = plan.missing {
                response.statuses[index].code = Code::OverLimit.into();
            }
            response
        }
        _ => undecided(verdict, plan.per_descriptor.len(), policy),
    }
}

/// The answer to a request that no limit decided, in any domain: OVER_LIMIT with
/// `Retry-After` when it is refused (the store failed), else OK (exempt, unlimited, or the
/// store failed under `on_error = "allow"`).
pub fn undecided(verdict: &Verdict, descriptors: usize, policy: &Policy) -> RateLimitResponse {
    // No exemption applies to descriptors (exemptions describe HTTP requests).
    match Refusal::of(verdict) {
        None => uniform(Code::Ok, descriptors, Vec::new()),
        Some(refusal) => {
            let retry_after = refusal
                .retry_after(policy)
                .map(|seconds| header("retry-after", seconds.to_string()));
            uniform(
                Code::OverLimit,
                descriptors,
                retry_after.into_iter().collect(),
            )
        }
    }
}

fn uniform(code: Code, descriptors: usize, headers: Vec<HeaderValue>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code.into(),
        statuses: vec![
            DescriptorStatus {
                code: code.into(),
                ..DescriptorStatus::default()
            };
            descriptors
        ],
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

fn decided(decision: &Decision, plan: &RulesPlan, policy: &Policy) -> RateLimitResponse {
    let statuses = plan
        .per_descriptor
        .iter()
        .map(|buckets| descriptor_status(decision, buckets, policy))
        .collect();
    let mut headers = Vec::with_capacity(6);
    each_header(
        decision,
        policy,
        !decision.allowed,
        Carrier::Grpc,
        |name, value| {
            headers.push(header(name.as_str(), value.to_string()));
        },
    );
    let overall = if decision.allowed {
        Code::Ok
    } else {
        Code::OverLimit
    };
    RateLimitResponse {
        overall_code: overall.into(),
        statuses,
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

/// OVER_LIMIT when one of the descriptor's limits denied; the numbers of its most
/// restrictive limit. A descriptor no limit applies to is OK with no numbers.
fn descriptor_status(decision: &Decision, buckets: &[usize], policy: &Policy) -> DescriptorStatus {
    let states = buckets
        .iter()
        .filter_map(|&i| decision.limits.get(i))
        .map(|state| (state, &policy.limits[state.limit]));
    let Some((state, limit)) = most_restrictive(states) else {
        return DescriptorStatus {
            code: Code::Ok.into(),
            ..DescriptorStatus::default()
        };
    };
    let code = if state.denies(limit) {
        Code::OverLimit
    } else {
        Code::Ok
    };
    DescriptorStatus {
        code: code.into(),
        current_limit: Some(current_limit(state, limit)),
        limit_remaining: u32::try_from(state.remaining()).unwrap_or(u32::MAX),
        duration_until_reset: Some(Duration {
            seconds: i64::try_from(state.reset_secs()).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        ..DescriptorStatus::default()
    }
}

/// The rate as Envoy's `requests_per_unit` and `unit`: the shortest unit in which it is a
/// whole number of requests (`"100/min"` reads back as 100 per MINUTE), else per day rounded.
fn current_limit(state: &LimitState, limit: &Limit) -> RateLimit {
    if let Some(period) = limit.meter.period() {
        let unit = match period {
            Period::Hour => Unit::Hour,
            Period::Day => Unit::Day,
            Period::Week => Unit::Week,
            Period::Month => Unit::Month,
        };
        return RateLimit {
            name: limit.name.clone(),
            requests_per_unit: u32::try_from(state.capacity().max(1)).unwrap_or(u32::MAX),
            unit: unit.into(),
        };
    }
    const UNITS: [(Unit, f64); 4] = [
        (Unit::Second, 1.0),
        (Unit::Minute, 60.0),
        (Unit::Hour, 3_600.0),
        (Unit::Day, 86_400.0),
    ];
    let (unit, per_unit) = UNITS
        .iter()
        .map(|&(unit, seconds)| (unit, state.rate * seconds))
        .find(|(_, n)| *n >= 1.0 && (n - n.round()).abs() < 1e-6)
        .unwrap_or((Unit::Day, state.rate * 86_400.0));
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "clamped to 1..=u32::MAX first, so the cast is exact"
    )]
    let requests_per_unit = per_unit.round().clamp(1.0, f64::from(u32::MAX)) as u32;
    RateLimit {
        name: limit.name.clone(),
        requests_per_unit,
        unit: unit.into(),
    }
}

fn header(name: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: name.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(rate: f64) -> LimitState {
        LimitState {
            limit: 0,
            cost: 1,
            rate,
            burst: 10.0,
            tokens: 1.0,
            enough: true,
            window: None,
        }
    }

    #[test]
    fn rates_read_back_in_the_shortest_whole_unit() {
        let config = tollgate_core::config::Config::default();
        let policy =
            Policy::compile(&config, &tollgate_core::observe::metrics::Metrics::new()).unwrap();
        let limit = &policy.limits[0];
        let shown = |rate: f64| {
            let l = current_limit(&state(rate), limit);
            (l.requests_per_unit, Unit::try_from(l.unit).unwrap())
        };
        assert_eq!(shown(50.0), (50, Unit::Second));
        assert_eq!(shown(100.0 / 60.0), (100, Unit::Minute));
        assert_eq!(shown(1.0 / 3_600.0), (1, Unit::Hour));
        assert_eq!(shown(1e-9), (1, Unit::Day));
    }
}
