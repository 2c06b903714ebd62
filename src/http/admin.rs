//! What every admin endpoint shares: who is calling (holder of the admin token or not), the
//! refusal of mutating calls without the token, key values shown as fingerprints to callers
//! without it, and `application/problem+json` answers.

use std::borrow::Cow;
use std::net::IpAddr;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Who sent an admin request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Sent `Authorization: Bearer <admin_token>` matching the configured token.
    Operator,
    /// Anyone else: may read, sees key values as fingerprints, may not change anything.
    Anonymous,
}

impl Caller {
    /// Reads the bearer token. The comparison takes the same time wherever the tokens differ
    /// (digests compared in full), so response times do not leak the token.
    pub fn of(request: &HttpRequest, token: Option<&str>) -> Caller {
        match (token, bearer(request)) {
            (Some(token), Some(given)) if same_secret(given, token) => Caller::Operator,
            _ => Caller::Anonymous,
        }
    }
}

fn bearer(request: &HttpRequest) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|given| !given.is_empty())
}

fn same_secret(given: &str, token: &str) -> bool {
    let (a, b) = (Sha256::digest(given), Sha256::digest(token));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The refusal of a mutating call (`what`, e.g. "DELETE /v1/buckets"), unless the caller
/// holds the admin token: 403 naming the setting when no token is configured, 401 otherwise.
pub fn refuse_unless_operator(
    request: &HttpRequest,
    token: Option<&str>,
    what: &str,
) -> Option<HttpResponse> {
    if token.is_none() {
        return Some(problem(
            StatusCode::FORBIDDEN,
            format!("{what} is disabled: set admin_token (or admin_token_file, or the environment variable TOLLGATE_ADMIN_TOKEN)"),
            None,
        ));
    }
    if Caller::of(request, token) == Caller::Operator {
        return None;
    }
    let mut refusal = problem(
        StatusCode::UNAUTHORIZED,
        "needs Authorization: Bearer <admin_token>".into(),
        None,
    );
    refusal
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(refusal)
}

/// A key value as `caller` may see it: IP addresses (and networks, `2001:db8::/64`) as they
/// are, anything else (API keys, user ids) as the first 12 hex digits of its SHA-256 for
/// callers without the token, so a read-only view never leaks a credential.
pub fn shown(value: &str, caller: Caller) -> Cow<'_, str> {
    if caller == Caller::Operator || is_address(value) {
        return Cow::Borrowed(value);
    }
    Cow::Owned(fingerprint(value))
}

/// First 12 hex digits of the value's SHA-256.
pub fn fingerprint(value: &str) -> String {
    let digest = Sha256::digest(value.as_bytes());
    let mut out = String::with_capacity(12);
    for byte in &digest[..6] {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

fn is_address(value: &str) -> bool {
    let address = value.split_once('/').map_or(value, |(address, _)| address);
    address.parse::<IpAddr>().is_ok()
}

/// An RFC 9457 problem answer; `field` names the offending input when there is one.
pub fn problem(status: StatusCode, detail: String, field: Option<String>) -> HttpResponse {
    let mut body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(field) = field {
        body["field"] = json!(field);
    }
    HttpResponse::build(status)
        .content_type("application/problem+json")
        .body(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_shown_other_values_fingerprinted() {
        assert_eq!(shown("203.0.113.9", Caller::Anonymous), "203.0.113.9");
        assert_eq!(shown("2001:db8::/64", Caller::Anonymous), "2001:db8::/64");
        let hidden = shown("sk_live_secret", Caller::Anonymous);
        assert_eq!(hidden.len(), 12);
        assert_ne!(hidden, "sk_live_secret");
        assert_eq!(hidden, fingerprint("sk_live_secret"));
        assert_eq!(shown("sk_live_secret", Caller::Operator), "sk_live_secret");
    }

    #[test]
    fn fingerprint_is_the_sha256_prefix() {
        // sha256("abc") = ba7816bf8f01cfea414140de5dae2223...
        assert_eq!(fingerprint("abc"), "ba7816bf8f01");
    }
}
