//! [`Verdict`] → HTTP response: status, `RateLimit-Policy` / `RateLimit` (IETF draft),
//! `X-RateLimit-*`, `Retry-After`, and a problem+json body on denials.

use std::borrow::Cow;

use actix_web::http::header::HeaderName;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, HttpResponseBuilder};
use serde::Serialize;

use crate::config::HeaderFamily;
use crate::decision::{Decision, LimitState, Verdict};
use crate::limits::Policy;
use crate::store::Meter;

// Names as constants: a `&str` name is parsed and validated on every insert (4% of a
// memory-store check's instructions in `bench/profile.sh`).
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

pub fn render(verdict: &Verdict, policy: &Policy) -> HttpResponse {
    match verdict {
        // Empty 200: nginx keeps its keep-alive connection to tollgate only without a body.
        Verdict::Unlimited | Verdict::Exempt | Verdict::StoreFailed { allow: true } => {
            HttpResponse::Ok().finish()
        }
        Verdict::Decided(decision) if decision.allowed => {
            let mut response = HttpResponse::Ok();
            quota_headers(&mut response, decision, policy);
            response.finish()
        }
        Verdict::Decided(decision) => denied(decision, policy),
        Verdict::MissingKey { limit } => {
            let name = &policy.limits[*limit].name;
            problem(
                &mut deny_builder(policy),
                deny_status(policy),
                format!("the request lacks the key of limit {name:?}"),
                vec![name.as_str()],
                None,
            )
        }
        Verdict::StoreFailed { allow: false } => {
            let mut response = HttpResponse::ServiceUnavailable();
            response.insert_header((actix_web::http::header::RETRY_AFTER, "1"));
            problem(
                &mut response,
                StatusCode::SERVICE_UNAVAILABLE,
                "the rate-limit store is unavailable".into(),
                Vec::new(),
                Some(1),
            )
        }
    }
}

fn deny_status(policy: &Policy) -> StatusCode {
    StatusCode::from_u16(policy.response.deny_status).unwrap_or(StatusCode::TOO_MANY_REQUESTS)
}

fn deny_builder(policy: &Policy) -> HttpResponseBuilder {
    HttpResponse::build(deny_status(policy))
}

fn denied(decision: &Decision, policy: &Policy) -> HttpResponse {
    let mut response = deny_builder(policy);
    quota_headers(&mut response, decision, policy);
    let retry_after = decision.retry_after(policy);
    let violated: Vec<&str> = decision
        .violated(policy)
        .map(|(_, limit)| limit.name.as_str())
        .collect();
    let detail = match retry_after {
        Some(seconds) => {
            response.insert_header((actix_web::http::header::RETRY_AFTER, seconds));
            format!(
                "rate limit exceeded ({}); retry in {seconds} s",
                violated.join(", ")
            )
        }
        None => match decision
            .violated(policy)
            .find(|(s, _)| s.wait_secs().is_none())
        {
            Some((state, limit)) => format!(
                "request cost {} exceeds the {} {} of limit {:?}: it can never pass",
                state.cost,
                if state.window.is_some() {
                    "quota"
                } else {
                    "burst"
                },
                state.capacity(),
                limit.name
            ),
            None => format!("rate limit exceeded ({})", violated.join(", ")),
        },
    };
    problem(
        &mut response,
        deny_status(policy),
        detail,
        violated,
        retry_after,
    )
}

/// RFC 9457 problem details.
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    limits: Vec<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
}

fn problem(
    response: &mut HttpResponseBuilder,
    status: StatusCode,
    detail: String,
    limits: Vec<&str>,
    retry_after: Option<u64>,
) -> HttpResponse {
    let body = Problem {
        kind: "about:blank",
        title: status.canonical_reason().unwrap_or("Denied"),
        status: status.as_u16(),
        detail,
        limits,
        retry_after,
    };
    response
        .content_type("application/problem+json")
        .body(serde_json::to_string(&body).unwrap_or_default())
}

/// The quota headers of the families configured in `response.headers`.
fn quota_headers(response: &mut HttpResponseBuilder, decision: &Decision, policy: &Policy) {
    each_quota_header(decision, policy, |name, value| {
        response.insert_header((name, value));
    });
}

/// A header value: a number, or text built for this answer.
pub enum QuotaValue {
    Number(u64),
    Text(String),
}

impl actix_web::http::header::TryIntoHeaderValue for QuotaValue {
    type Error = actix_web::http::header::InvalidHeaderValue;

    fn try_into_value(self) -> Result<actix_web::http::header::HeaderValue, Self::Error> {
        match self {
            QuotaValue::Number(number) => Ok(number.into()),
            QuotaValue::Text(text) => text.try_into_value(),
        }
    }
}

impl std::fmt::Display for QuotaValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuotaValue::Number(number) => write!(f, "{number}"),
            QuotaValue::Text(text) => f.write_str(text),
        }
    }
}

/// Hands each quota header of the configured families to `put`: the one rendering shared by
/// `/check` and the gRPC service's `response_headers_to_add`.
pub fn each_quota_header(
    decision: &Decision,
    policy: &Policy,
    mut put: impl FnMut(HeaderName, QuotaValue),
) {
    let Some((state, limit)) = decision.most_restrictive(policy) else {
        return;
    };
    let (remaining, reset) = (state.remaining(), state.reset_secs());
    for family in &policy.response.headers {
        match family {
            HeaderFamily::Ietf => {
                let items = match decision.limits.as_slice() {
                    // One limit, the common case: its item as is, without a Vec and a join.
                    [only] => policy_item(only, policy).into_owned(),
                    all => all
                        .iter()
                        .map(|s| policy_item(s, policy))
                        .collect::<Vec<_>>()
                        .join(", "),
                };
                put(RATELIMIT_POLICY, QuotaValue::Text(items));
                put(
                    RATELIMIT,
                    QuotaValue::Text(format!("\"{}\";r={remaining};t={reset}", limit.name)),
                );
            }
            HeaderFamily::XRatelimit => {
                put(X_RATELIMIT_LIMIT, QuotaValue::Number(state.capacity()));
                put(X_RATELIMIT_REMAINING, QuotaValue::Number(remaining));
                put(X_RATELIMIT_RESET, QuotaValue::Number(reset));
            }
        }
    }
}

/// A limit's `RateLimit-Policy` item: precomputed, unless the key has its own numbers (an
/// override, or this instance's share of the limit under the local fallback), or it is a
/// month whose length the store reported (a denial from the deny cache did not look at the
/// quota: it shows the nominal 30 days).
fn policy_item<'p>(state: &LimitState, policy: &'p Policy) -> Cow<'p, str> {
    let limit = &policy.limits[state.limit];
    let month = matches!(limit.meter, Meter::Quota(period) if period.fixed_secs().is_none());
    let reported_month = month && state.window.is_some();
    if !(state.has_own_numbers(limit) || reported_month) {
        return Cow::Borrowed(&limit.policy_item);
    }
    Cow::Owned(format!(
        "\"{}\";q={};w={}",
        limit.name,
        state.capacity(),
        state.window_secs()
    ))
}
