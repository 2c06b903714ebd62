//! `GET /v1/buckets/{limit}?key=<part>&key=<part>` (peek) and `DELETE` (reset) on the admin
//! listener.
//!
//! The `key` values are the limit's key parts in order, raw, as `/check` reads them (an `ip`
//! part as the client's address, a `host` or `path` as sent). The store key is built exactly as
//! for a check ([`keys::tail_of_given`], the override lookup, [`keys::assemble`]), so a peek
//! reads and a reset deletes the very bucket the next check draws from. A peek charges nothing;
//! a reset needs the admin token and makes every instance's deny cache forget the bucket.
//!
//! Query values are decoded as HTML forms and `curl --data-urlencode` encode them (`+` is a
//! space, a plus is `%2B`), strictly: `%` must start a two-digit escape.

use std::borrow::Cow;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::json;

use super::admin::{self, problem, shown, Caller};
use crate::config::OnMissing;
use crate::decision::LimitState;
use crate::keys::{self, KeyPart};
use crate::limits::{Limit, Policy};
use crate::overrides::Override;
use crate::server::AppState;
use crate::store::{BucketOutcome, BucketRequest, Meter, Period, Store};

/// Longest query accepted: a key part longer than the store keeps raw is hashed anyway, and
/// anything near this is a mistake or an attack.
pub const MAX_QUERY: usize = 16 * 1024;

/// The bucket a request names, or the answer that refuses it.
struct Named<'p> {
    limit: &'p Limit,
    values: Vec<String>,
    bucket: BucketRequest,
    /// The key's override, if it has one.
    own: Option<Override>,
}

/// Why a request names no bucket: the problem answer to give.
struct Refused {
    status: StatusCode,
    detail: String,
    field: Option<String>,
}

impl Refused {
    fn new(status: StatusCode, detail: String, field: Option<String>) -> Refused {
        Refused {
            status,
            detail,
            field,
        }
    }

    fn answer(self) -> HttpResponse {
        problem(self.status, self.detail, self.field)
    }
}

/// Parses `{limit}` and the `key` values into the store key a check would use.
fn named<'p>(policy: &'p Policy, name: &str, query: &str) -> Result<Named<'p>, Refused> {
    let Some((index, limit)) = policy
        .limits
        .iter()
        .enumerate()
        .find(|(_, limit)| limit.name == name)
    else {
        return Err(Refused::new(
            StatusCode::NOT_FOUND,
            format!("no limit named {name:?}: GET /v1/limits lists them"),
            Some("limit".into()),
        ));
    };
    let values = key_values(query)
        .map_err(|why| Refused::new(StatusCode::BAD_REQUEST, why, Some("key".into())))?;
    let expected = || {
        limit
            .key
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if values.len() != limit.key.len() {
        return Err(Refused::new(
            StatusCode::BAD_REQUEST,
            format!(
                "limit {name:?} is keyed on {} part(s) [{}]: give one key= per part, in that order (got {})",
                limit.key.len(),
                expected(),
                values.len()
            ),
            Some("key".into()),
        ));
    }
    for (i, (part, value)) in limit.key.iter().zip(&values).enumerate() {
        if let KeyPart::Const(text) = part {
            if text != value {
                return Err(Refused::new(
                    StatusCode::BAD_REQUEST,
                    format!("key[{i}] is the constant part {part}: give {text:?}"),
                    Some(format!("key[{i}]")),
                ));
            }
        }
    }
    let anonymous = limit.on_missing == OnMissing::Anonymous;
    let tail = keys::tail_of_given(&limit.key, &values, anonymous, policy.client_ip.ipv6_prefix)
        .map_err(|(i, why)| {
            let part = &limit.key[i];
            Refused::new(
                StatusCode::BAD_REQUEST,
                format!("key[{i}] ({part}) {why}"),
                Some(format!("key[{i}]")),
            )
        })?;
    // As a check looks them up: a runtime override before the file's.
    let own = policy
        .runtime
        .view()
        .get(limit, &tail)
        .or_else(|| limit.overrides.get(&tail));
    let (rate, burst) = match own {
        Some(Override::Bucket { rate, burst }) => (rate, burst),
        _ => (limit.rate, limit.burst),
    };
    let bucket = BucketRequest {
        key: keys::assemble(&policy.key_prefix, &limit.name, &tail),
        rate,
        burst: burst as f64,
        cost: match limit.charge {
            crate::config::Charge::Report => 0,
            crate::config::Charge::Request => limit.cost,
        },
        shadow: limit.shadow,
        limit: index,
        meter: limit.meter,
    };
    Ok(Named {
        limit,
        values,
        bucket,
        own,
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

#[derive(Serialize)]
struct Peek<'a> {
    limit: &'a str,
    /// The key values as the caller may see them (fingerprints for callers without the token).
    key: Vec<Cow<'a, str>>,
    #[serde(flatten)]
    state: PeekState,
    /// What the next check with the limit's cost would get: "allowed" or "denied".
    next_check: &'static str,
    cost: u64,
    /// The key's own policy: "unlimited", its rate and burst, or none.
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    own: Option<serde_json::Value>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum PeekState {
    Bucket {
        /// Tokens held now (exact; may be negative for a reported limit in debt).
        tokens: f64,
        /// Whole tokens, as `X-RateLimit-Remaining` shows them.
        remaining: u64,
        burst: f64,
        rate_per_s: f64,
        /// Seconds until full, as `X-RateLimit-Reset` shows it.
        full_in_s: u64,
    },
    Quota {
        quota: f64,
        used: f64,
        remaining: u64,
        period: Period,
        period_ends_in_s: u64,
    },
}

fn peek_state(bucket: &BucketRequest, outcome: &BucketOutcome) -> PeekState {
    let state = LimitState {
        limit: bucket.limit,
        cost: bucket.cost,
        rate: bucket.rate,
        burst: bucket.burst,
        tokens: outcome.tokens,
        enough: outcome.enough,
        window: outcome.window,
    };
    match bucket.meter {
        Meter::Bucket => PeekState::Bucket {
            tokens: outcome.tokens,
            remaining: state.remaining(),
            burst: bucket.burst,
            rate_per_s: bucket.rate,
            full_in_s: state.reset_secs(),
        },
        Meter::Quota(period) => PeekState::Quota {
            quota: bucket.burst,
            used: bucket.burst - outcome.tokens,
            remaining: state.remaining(),
            period,
            period_ends_in_s: state.reset_secs(),
        },
    }
}

fn override_view(own: Option<Override>) -> Option<serde_json::Value> {
    own.map(|own| match own {
        Override::Unlimited => json!("unlimited"),
        Override::Bucket { rate, burst } => json!({ "rate_per_s": rate, "burst": burst }),
    })
}

fn shown_key<'a>(values: &'a [String], caller: Caller) -> Vec<Cow<'a, str>> {
    values.iter().map(|value| shown(value, caller)).collect()
}

fn store_failed(error: &crate::store::StoreError) -> HttpResponse {
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the store did not answer ({error}): retry"),
        None,
    );
    response.headers_mut().insert(
        actix_web::http::header::RETRY_AFTER,
        actix_web::http::header::HeaderValue::from_static("1"),
    );
    response
}

fn json(body: serde_json::Result<String>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body.unwrap_or_default())
}

/// `GET /v1/buckets/{limit}`: the bucket as the next check would find it, charging nothing.
pub async fn peek(
    request: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let policy = state.limiter.policy();
    let caller = Caller::of(&request, policy.admin_token.as_deref());
    let named = match named(&policy, &name, request.query_string()) {
        Ok(named) => named,
        Err(refused) => return refused.answer(),
    };
    let key = shown_key(&named.values, caller);
    if named.own == Some(Override::Unlimited) {
        // No check ever draws from this bucket.
        return json(serde_json::to_string_pretty(&json!({
            "limit": named.limit.name,
            "key": key,
            "next_check": "allowed",
            "override": "unlimited",
        })));
    }
    let outcome = match state.limiter.store().peek(&named.bucket).await {
        Ok(outcome) => outcome,
        Err(error) => return store_failed(&error),
    };
    json(serde_json::to_string_pretty(&Peek {
        limit: &named.limit.name,
        key,
        state: peek_state(&named.bucket, &outcome),
        next_check: if outcome.enough { "allowed" } else { "denied" },
        cost: named.bucket.cost,
        own: override_view(named.own),
    }))
}

/// `DELETE /v1/buckets/{limit}`: the bucket reads full at the next check on every instance.
pub async fn reset(
    request: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let policy = state.limiter.policy();
    if let Some(refusal) = admin::refuse_unless_operator(
        &request,
        policy.admin_token.as_deref(),
        "DELETE /v1/buckets",
    ) {
        return refusal;
    }
    let named = match named(&policy, &name, request.query_string()) {
        Ok(named) => named,
        Err(refused) => return refused.answer(),
    };
    let existed = match state.limiter.store().reset(&named.bucket.key).await {
        Ok(existed) => existed,
        Err(error) => return store_failed(&error),
    };
    // This instance forgets at once; the others when the reset channel tells them.
    state.limiter.forget_denials(&named.bucket.key);
    log::info!(
        "bucket of limit {:?} for key [{}] reset by the operator",
        named.limit.name,
        shown_key(&named.values, Caller::Anonymous).join(", ")
    );
    json(serde_json::to_string_pretty(&json!({
        "limit": named.limit.name,
        "key": named.values,
        "reset": true,
        "was_full": !existed,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

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
