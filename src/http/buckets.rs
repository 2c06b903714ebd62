//! `GET /v1/buckets/{limit}?key=<part>&key=<part>` (peek) and `DELETE` (reset) on the admin
//! listener.
//!
//! The `key` values are the limit's key parts in order, raw, as `/check` reads them (an `ip`
//! part as the client's address, a `host` or `path` as sent), read by [`NamedKey::parse`] as
//! for every admin endpoint. The limiter builds the bucket exactly as a check does
//! ([`Target::of`]), so a peek reads and a reset deletes the very bucket the next check draws
//! from. A peek charges nothing; a reset needs the admin token and makes every instance's deny
//! cache forget the bucket. Each handler parses, asks the limiter, and renders its answer.

use std::borrow::Cow;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::json;

use super::admin::{self, AdminError, NamedKey, Operator};
use crate::state::AppState;
use tollgate_core::base::redact::Caller;
use tollgate_core::base::redact::Salt;
use tollgate_core::kinds::PeekView;
use tollgate_core::limiter::peek::Target;
use tollgate_core::policy::overrides::Override;

#[derive(Serialize)]
struct Peek<'a> {
    limit: &'a str,
    /// The key values as the caller may see them (fingerprints for callers without the token).
    key: Vec<Cow<'a, str>>,
    #[serde(flatten)]
    state: PeekView,
    /// What the next check with the limit's cost would get: "allowed" or "denied".
    next_check: &'static str,
    cost: u64,
    /// The key's own policy: "unlimited", its rate and burst, or none.
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    own: Option<serde_json::Value>,
    /// The key's shares among Envoy's quota filters (RLQS), for a limit `[[rlqs.buckets]]`
    /// names.
    #[serde(skip_serializing_if = "Option::is_none")]
    shares: Option<serde_json::Value>,
    /// A global limit's key in a region: its floor and its share.
    #[serde(skip_serializing_if = "Option::is_none")]
    region: Option<serde_json::Value>,
}

fn override_view(own: Option<Override>) -> Option<serde_json::Value> {
    own.map(|own| match own {
        Override::Unlimited => json!("unlimited"),
        Override::Bucket { rate, burst } => json!({ "rate_per_s": rate, "burst": burst }),
    })
}

fn shown_key<'a>(values: &'a [String], salt: &Salt, caller: Caller) -> Vec<Cow<'a, str>> {
    values
        .iter()
        .map(|value| salt.shown(value, caller))
        .collect()
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
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let caller = admin::caller(&request, policy.admin_token.as_deref());
    let named = NamedKey::parse(&policy, &name, request.query_string())?;
    let key = shown_key(&named.values, &policy.salt, caller);
    let target = Target::of(&policy, named.index, &named.tail);
    if target.unlimited() {
        // No check ever draws from this bucket.
        return Ok(json(serde_json::to_string_pretty(&json!({
            "limit": named.limit.name,
            "key": key,
            "next_check": "allowed",
            "override": "unlimited",
        }))));
    }
    let _slot = admin::ReadSlot::take(&state.admin_reads)?;
    let peeked = state.limiter.peek(&policy, &target).await?;
    Ok(json(serde_json::to_string_pretty(&Peek {
        limit: &named.limit.name,
        key,
        state: peeked.state,
        next_check: if peeked.allowed { "allowed" } else { "denied" },
        cost: peeked.cost,
        own: override_view(target.own),
        shares: peeked.shares,
        region: peeked.region,
    })))
}

/// `DELETE /v1/buckets/{limit}`: the bucket reads full at the next check on every instance.
pub async fn reset(
    _: Operator,
    request: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let named = NamedKey::parse(&policy, &name, request.query_string())?;
    let key = named.limit.store_key(&policy.key_prefix, &named.tail);
    let existed = state.limiter.reset(&key).await?;
    log::info!(
        "bucket of limit {:?} for key [{}] reset by the operator",
        named.limit.name,
        shown_key(&named.values, &policy.salt, Caller::Anonymous).join(", ")
    );
    Ok(json(serde_json::to_string_pretty(&json!({
        "limit": named.limit.name,
        "key": named.values,
        "reset": true,
        "was_full": !existed,
    }))))
}
