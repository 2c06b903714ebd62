//! What every admin endpoint shares: who is calling (holder of the admin token or not), the
//! refusal of mutating calls without the token ([`Operator`]), errors that render themselves
//! as `application/problem+json` ([`AdminError`]), the `Host` guard and the bound on reads. How a
//! key value is shown to a caller without the token is [`tollgate_core::base::redact`]'s.

use actix_web::http::header;
use actix_web::http::StatusCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;
use sha2::{Digest, Sha256};

mod error;

use crate::state::AppState;
pub use error::{AdminError, Operator};
use tollgate_core::base::redact::Caller;
use tollgate_core::policy::limit::Limit;
use tollgate_core::policy::Policy;

/// Most admin reads calling the store (peeks) in flight at once; more are answered `503` with
/// `Retry-After: 1` without a store call, so the readiness probe (which pings the store on the
/// same connection) never waits behind them.
pub const MAX_ADMIN_READS: usize = 8;

/// A slot among [`MAX_ADMIN_READS`], given back on drop.
pub struct ReadSlot<'s>(&'s AtomicUsize);

impl<'s> ReadSlot<'s> {
    /// A slot, or the `503` to answer when every one is taken.
    pub fn take(in_flight: &'s AtomicUsize) -> Result<ReadSlot<'s>, AdminError> {
        let taken = in_flight.fetch_add(1, Ordering::AcqRel);
        let slot = ReadSlot(in_flight);
        if taken >= MAX_ADMIN_READS {
            drop(slot);
            return Err(AdminError::Unavailable(format!(
                "{MAX_ADMIN_READS} admin reads are in flight already: retry"
            )));
        }
        Ok(slot)
    }
}

impl Drop for ReadSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Paths of the admin listener any `Host` may reach: the probes and `/metrics`, spelled as is.
const UNGUARDED: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Refuses the admin API (`/v1/...`, `/report`, `/release`) to a request whose `Host` is not an IP
/// literal, `localhost` or a name in `admin_hosts`: a web page that rebinds its own DNS name
/// to this address then cannot read it from a browser. Every path but the probes and `/metrics`
/// is checked, as sent: the router matches the decoded path, so a list of guarded paths would
/// miss their percent-encoded spellings (`/%761/limits` is `/v1/limits`).
pub async fn host_guard(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    if !UNGUARDED.contains(&request.path()) {
        let allowed = match request.app_data::<web::Data<AppState>>() {
            Some(state) => {
                let policy = state.limiter.policy();
                let host = request
                    .headers()
                    .get(header::HOST)
                    .and_then(|host| host.to_str().ok())
                    .or_else(|| request.uri().authority().map(|a| a.as_str()));
                host.is_some_and(|host| host_allowed(host, &policy.admin_hosts))
            }
            None => true,
        };
        if !allowed {
            let refusal = problem(
                StatusCode::MISDIRECTED_REQUEST,
                "the Host header is not an IP address, localhost or a name in admin_hosts".into(),
                Some("host".into()),
            );
            return Ok(request.into_response(refusal).map_into_right_body());
        }
    }
    next.call(request)
        .await
        .map(ServiceResponse::map_into_left_body)
}

/// Whether a `Host` value (`name`, `name:port`, `192.0.2.1:9090`, `[::1]:9090`) names this
/// admin API: an IP literal, `localhost` or one of `names` (lower-case, no trailing dot).
pub fn host_allowed(host: &str, names: &[String]) -> bool {
    let name = if let Some(bracketed) = host.strip_prefix('[') {
        let Some((inside, rest)) = bracketed.split_once(']') else {
            return false;
        };
        if !(rest.is_empty() || port(rest.strip_prefix(':'))) {
            return false;
        }
        return inside.parse::<std::net::Ipv6Addr>().is_ok();
    } else {
        match host.rsplit_once(':') {
            Some((name, tail)) if !name.contains(':') => {
                if !port(Some(tail)) {
                    return false;
                }
                name
            }
            _ => host,
        }
    };
    if name.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || names.iter().any(|known| name.eq_ignore_ascii_case(known))
}

fn port(digits: Option<&str>) -> bool {
    digits.is_some_and(|d| !d.is_empty() && d.len() <= 5 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// Longest query accepted: a key part longer than the store keeps raw is hashed anyway, and
/// anything near this is a mistake or an attack.
pub const MAX_QUERY: usize = 16 * 1024;

/// Who is asking: reads the bearer token. The comparison takes the same time wherever the
/// tokens differ (digests compared in full), so response times do not leak the token.
pub fn caller(request: &HttpRequest, token: Option<&str>) -> Caller {
    match (token, bearer(request)) {
        (Some(token), Some(given)) if same_secret(given, token) => Caller::Operator,
        _ => Caller::Anonymous,
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

/// A limit and one of its keys, as `/v1/…/{limit}?key=<part>&key=<part>` names them, resolved
/// to the key tail a check builds for the same values ([`Limit::tail_of_given`]): so a peek, a
/// reset and an override reach the very bucket the next check draws from.
///
/// Query values are decoded as HTML forms and `curl --data-urlencode` encode them (`+` is a
/// space, a plus is `%2B`), strictly: `%` must start a two-digit escape.
pub struct NamedKey<'p> {
    /// The limit's position in the policy.
    pub index: usize,
    pub limit: &'p Limit,
    /// The decoded values, one per key part.
    pub values: Vec<String>,
    pub tail: Vec<u8>,
}

impl<'p> NamedKey<'p> {
    /// 404 for an unknown limit; 400 naming the field for anything wrong in the query.
    pub fn parse(policy: &'p Policy, name: &str, query: &str) -> Result<Self, AdminError> {
        let (index, limit) = find_limit(policy, name)?;
        let values = key_values(query).map_err(|why| AdminError::bad("key", why))?;
        let field = |i: usize| {
            if values.len() == limit.key.len() {
                format!("key[{i}]")
            } else {
                "key".into()
            }
        };
        let tail = limit
            .tail_of_given(&values, policy.client_ip.ipv6_prefix)
            .map_err(|(i, why)| {
                let detail = if values.len() == limit.key.len() {
                    format!("key[{i}] {why}")
                } else {
                    format!("{why}: one key= per part")
                };
                AdminError::bad(field(i), detail)
            })?;
        Ok(NamedKey {
            index,
            limit,
            values,
            tail,
        })
    }
}

/// The limit named `name`, and its position in the policy; 404 naming the field otherwise.
pub fn find_limit<'p>(policy: &'p Policy, name: &str) -> Result<(usize, &'p Limit), AdminError> {
    policy
        .limits
        .iter()
        .enumerate()
        .find(|(_, limit)| limit.name == name)
        .ok_or_else(|| AdminError::NotFound {
            detail: format!("no limit named {name:?}: GET /v1/limits lists them"),
            field: Some("limit".into()),
        })
}

/// The `key` values of a query string, percent-decoded. Any other parameter, a malformed
/// escape or a value that is not UTF-8 is refused, with why.
fn key_values(query: &str) -> Result<Vec<String>, String> {
    if query.len() > MAX_QUERY {
        return Err(format!(
            "the query is {} bytes; at most {MAX_QUERY} are accepted",
            query.len()
        ));
    }
    let mut values = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "key" {
            return Err(format!(
                "unknown parameter {:?}: only key=<part> (once per key part)",
                String::from_utf8_lossy(&percent_decode(name).unwrap_or_default())
            ));
        }
        let bytes = percent_decode(value)
            .ok_or_else(|| format!("key value {} has a malformed %-escape", values.len()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("key value {} is not UTF-8 once decoded", values.len()))?;
        values.push(text);
    }
    Ok(values)
}

/// Strict form decoding: every `%` starts two hex digits; `+` is a space.
fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    Some(out)
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
    fn only_ip_literals_localhost_and_configured_names_reach_the_admin_api() {
        let names = [
            "tollgate-admin".to_string(),
            "admin.example.com".to_string(),
        ];
        for allowed in [
            "127.0.0.1",
            "10.1.2.3:9090",
            "[::1]:9090",
            "[2001:db8::1]",
            "localhost",
            "LOCALHOST:9090",
            "localhost.",
            "tollgate-admin:9090",
            "Admin.Example.COM.",
        ] {
            assert!(host_allowed(allowed, &names), "{allowed:?}");
        }
        for refused in [
            "evil.example",
            "evil.example:9090",
            "tollgate-admin.evil.example",
            "127.0.0.1.nip.io",
            "[::1",
            "[::1]x",
            "10.1.2.3:90x",
            "10.1.2.3:",
            "",
            "localhost:99999999",
        ] {
            assert!(!host_allowed(refused, &names), "{refused:?}");
        }
    }

    #[test]
    fn key_values_are_decoded_strictly_as_curl_encodes_them() {
        // `curl --data-urlencode "key=a|b+c d"`
        assert_eq!(
            key_values("key=203.0.113.9&key=a%7cb%2bc+d%20e").unwrap(),
            ["203.0.113.9", "a|b+c d e"]
        );
        assert_eq!(key_values("").unwrap(), Vec::<String>::new());
        assert_eq!(key_values("key=").unwrap(), [""]);
        for bad in [
            "key=%",
            "key=%4",
            "key=%zz",
            "key=%ff",
            "limit=x",
            "key=a&kee=b",
        ] {
            assert!(key_values(bad).is_err(), "{bad:?}");
        }
        assert!(key_values(&format!("key={}", "a".repeat(MAX_QUERY))).is_err());
    }
}
