//! What an answer says, whatever protocol carries it: whether and why the request is refused
//! ([`Refusal`]), and the quota headers of the configured families and `Retry-After`, rendered
//! once for `/check` (HTTP) and for the gRPC service's `response_headers_to_add`.

use std::borrow::Cow;

use http::HeaderName;

use crate::config::HeaderFamily;
use crate::limiter::decision::{Decision, LimitState, Verdict};
use crate::policy::{limit, Policy};

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RETRY_AFTER: HeaderName = http::header::RETRY_AFTER;

/// Why a request is refused, whatever protocol answers. Each protocol maps a kind onto its own
/// form: HTTP a status (`response.deny_status`, or 503 when the store failed) and a problem
/// body, gRPC `OVER_LIMIT`; both send the `Retry-After` it gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal<'v> {
    /// Limits denied it; the decision says which and for how long.
    OverLimit(&'v Decision),
    /// The key of limit `limit` (its index in the policy) is missing, and the limit says
    /// `on_missing = "deny"`.
    MissingKey { limit: usize },
    /// The store failed and `on_error` is `deny` (or `error`, which HTTP answers alike): the
    /// service is unavailable for a moment.
    StoreFailed,
}

/// How long a client refused because the store failed is asked to wait: the breaker tries the
/// store again within a second.
pub const STORE_FAILED_RETRY_AFTER_S: u64 = 1;

impl<'v> Refusal<'v> {
    /// The refusal `verdict` is, or `None` when it admits the request (a shadow limit's denial
    /// admits: the decision's `allowed` says).
    pub fn of(verdict: &'v Verdict) -> Option<Refusal<'v>> {
        match verdict {
            Verdict::Unlimited | Verdict::Exempt | Verdict::StoreFailed { allow: true } => None,
            Verdict::Decided(decision) => {
                (!decision.allowed).then_some(Refusal::OverLimit(decision))
            }
            Verdict::MissingKey { limit } => Some(Refusal::MissingKey { limit: *limit }),
            Verdict::StoreFailed { allow: false } | Verdict::StoreError { .. } => {
                Some(Refusal::StoreFailed)
            }
        }
    }

    /// `Retry-After` in seconds: a denial's longest wait among its denying limits (none when
    /// one of them can never pass), none for a missing key (waiting does not bring it),
    /// [`STORE_FAILED_RETRY_AFTER_S`] when the store failed.
    pub fn retry_after(self, policy: &Policy) -> Option<u64> {
        match self {
            Refusal::OverLimit(decision) => decision.retry_after(policy),
            Refusal::MissingKey { .. } => None,
            Refusal::StoreFailed => Some(STORE_FAILED_RETRY_AFTER_S),
        }
    }
}

/// A header value: a number, or text built for this answer.
pub enum QuotaValue {
    Number(u64),
    Text(String),
}

impl std::fmt::Display for QuotaValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuotaValue::Number(number) => write!(f, "{number}"),
            QuotaValue::Text(text) => f.write_str(text),
        }
    }
}

/// The protocol an answer goes out in: gRPC answers may carry one family more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// `/check` and the other HTTP answers: the families of `[response] headers`.
    Http,
    /// The gRPC service's `response_headers_to_add`: those, and the `ratelimit` family when
    /// `envoy.response_headers` is on.
    Grpc,
}

/// Hands each header of an answer to `put`: the quota headers of the configured families
/// and, when the request is refused, `Retry-After` (none when a denying limit can never
/// pass). The one rendering shared by `/check` and the gRPC service's
/// `response_headers_to_add`; returns the `Retry-After` it gave.
pub fn each_header(
    decision: &Decision,
    policy: &Policy,
    refused: bool,
    carrier: Carrier,
    mut put: impl FnMut(HeaderName, QuotaValue),
) -> Option<u64> {
    each_quota_header(decision, policy, carrier, &mut put);
    let retry_after = refused.then(|| decision.retry_after(policy)).flatten();
    if let Some(seconds) = retry_after {
        put(RETRY_AFTER, QuotaValue::Number(seconds));
    }
    retry_after
}

fn each_quota_header(
    decision: &Decision,
    policy: &Policy,
    carrier: Carrier,
    mut put: impl FnMut(HeaderName, QuotaValue),
) {
    let Some((state, limit)) = decision.most_restrictive(policy) else {
        return;
    };
    let (remaining, reset) = (state.remaining(), state.reset_secs());
    let configured = match (carrier, &policy.response.grpc_headers) {
        (Carrier::Grpc, Some(families)) => families,
        _ => &policy.response.headers,
    };
    let added = (carrier == Carrier::Grpc
        && policy.erl.response_headers
        && !configured.contains(&HeaderFamily::Ratelimit))
    .then_some(HeaderFamily::Ratelimit);
    for family in configured.iter().copied().chain(added) {
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
            HeaderFamily::Ratelimit => {
                let names = &policy.ratelimit_names;
                put(names.limit.clone(), QuotaValue::Number(state.capacity()));
                put(names.remaining.clone(), QuotaValue::Number(remaining));
                put(names.reset.clone(), QuotaValue::Number(reset));
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
    let month = limit
        .meter
        .period()
        .is_some_and(|period| period.fixed_secs().is_none());
    let reported_month = month && state.window.is_some();
    if !(state.has_own_numbers(limit) || reported_month) {
        return Cow::Borrowed(&limit.policy_item);
    }
    Cow::Owned(limit::policy_item(
        &limit.name,
        state.capacity(),
        state.window_secs(),
    ))
}
