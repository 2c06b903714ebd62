//! Assertions on the rate-limit headers of an answer, so a test states the numbers it is
//! about and a failure prints the whole answer.

use super::Response;

/// An admitted request: 200, `X-RateLimit-Limit: limit`, `X-RateLimit-Remaining: remaining`.
#[track_caller]
pub fn assert_allowed(response: &Response, limit: u64, remaining: u64) {
    assert_eq!(response.status, 200, "{response:?}");
    assert_header(response, "x-ratelimit-limit", Some(&limit.to_string()));
    assert_header(
        response,
        "x-ratelimit-remaining",
        Some(&remaining.to_string()),
    );
}

/// A denied request: 429, with `Retry-After: retry_after` (`None`: no such header, as when no
/// wait would help).
#[track_caller]
pub fn assert_denied(response: &Response, retry_after: Option<u64>) {
    assert_eq!(response.status, 429, "{response:?}");
    let retry_after = retry_after.map(|s| s.to_string());
    assert_header(response, "retry-after", retry_after.as_deref());
}

/// The `X-RateLimit-*` family: limit, remaining and reset (seconds).
#[track_caller]
pub fn assert_x_ratelimit(response: &Response, limit: u64, remaining: u64, reset: u64) {
    assert_header(response, "x-ratelimit-limit", Some(&limit.to_string()));
    assert_header(
        response,
        "x-ratelimit-remaining",
        Some(&remaining.to_string()),
    );
    assert_header(response, "x-ratelimit-reset", Some(&reset.to_string()));
}

/// The IETF pair as written: `RateLimit-Policy: <policy>` and `RateLimit: <ratelimit>`
/// (`"per-key";q=3;w=3` and `"per-key";r=2;t=1`).
#[track_caller]
pub fn assert_ietf(response: &Response, policy: &str, ratelimit: &str) {
    assert_header(response, "ratelimit-policy", Some(policy));
    assert_header(response, "ratelimit", Some(ratelimit));
}

/// One header's value, or its absence (`None`).
#[track_caller]
pub fn assert_header(response: &Response, name: &str, value: Option<&str>) {
    assert_eq!(response.header(name), value, "{name} in {response:?}");
}
