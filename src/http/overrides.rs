//! `/v1/overrides/{limit}` on the admin listener: runtime overrides of one limit's keys.
//!
//! - `GET` lists them as this instance enforces them (key values as fingerprints to callers
//!   without the admin token);
//! - `PUT ?key=<part>&key=<part>` with `{"rate": "100/s", "burst": 200}`, `{"quota": N}` or
//!   `{"unlimited": true}`, and optionally `"ttl_s"`, sets one; `DELETE ?key=...` removes one.
//!   Both need the admin token. Key values are checked and normalised as the file's overrides
//!   are, so an override reaches the very bucket `/check` uses.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};

use super::admin::{find_limit, AdminError, NamedKey, Operator};
use crate::state::AppState;
use tollgate_core::base::rate::RateSpec;
use tollgate_core::base::redact::Caller;
use tollgate_core::base::redact::Salt;
use tollgate_core::config::OverrideConfig;
use tollgate_core::kinds::Kind;
use tollgate_core::policy::limit::Limit;
use tollgate_core::policy::overrides;
use tollgate_core::policy::runtime_overrides::sync::WriteError;
use tollgate_core::policy::runtime_overrides::{Entry, MAX_TTL_S};
use tollgate_core::policy::Policy;

pub async fn list(
    request: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let (_, limit) = find_limit(&policy, &name)?;
    let caller = super::admin::caller(&request, policy.admin_token.as_deref());
    let now = policy.runtime.now_ms();
    let listed: Vec<Value> = policy
        .runtime
        .list(&limit.name)
        .iter()
        .map(|entry| render(entry, &policy.salt, caller, now))
        .collect();
    Ok(json_answer(
        StatusCode::OK,
        &json!({"limit": limit.name, "overrides": listed}),
    ))
}

pub async fn put(
    _: Operator,
    request: HttpRequest,
    name: web::Path<String>,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let target = target(&policy, &name, request.query_string())?;
    if let Some(why) = target.limit.meter.refuses_overrides() {
        return Err(AdminError::Conflict(format!(
            "limit {:?} {why}: overrides are not supported on it",
            target.limit.name
        )));
    }
    let (entry, ttl_s) = parse_body(&body, target.limit, &target.values, &policy)
        .map_err(|(field, reason)| AdminError::bad(field.clone(), format!("{field} {reason}")))?;
    state
        .limiter
        .put_override(
            &policy,
            &target.limit.name,
            target.tail,
            entry.clone(),
            ttl_s * 1000,
        )
        .await
        .map_err(write_failed)?;
    let mut shown = render(&entry, &policy.salt, Caller::Operator, 0);
    if ttl_s > 0 {
        shown["ttl_s"] = json!(ttl_s);
    }
    Ok(json_answer(
        StatusCode::OK,
        &json!({"limit": target.limit.name, "override": shown}),
    ))
}

pub async fn delete(
    _: Operator,
    request: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let target = target(&policy, &name, request.query_string())?;
    let removed = state
        .limiter
        .delete_override(&policy, &target.limit.name, &target.tail)
        .await
        .map_err(write_failed)?;
    if !removed {
        return Err(AdminError::NotFound {
            detail: "no runtime override for this key".into(),
            field: Some("key".into()),
        });
    }
    Ok(HttpResponse::NoContent().finish())
}

/// Longest key value an override accepts: far above any real API key, far below what would
/// cost memory held by every instance.
const MAX_VALUE_BYTES: usize = 1024;

/// The key an override is for. Its values are stored with it (to list them), so each is
/// bounded far above any real API key.
fn target<'p>(policy: &'p Policy, name: &str, query: &str) -> Result<NamedKey<'p>, AdminError> {
    let named = NamedKey::parse(policy, name, query)?;
    if let Some(i) = named.values.iter().position(|v| v.len() > MAX_VALUE_BYTES) {
        return Err(AdminError::bad(
            format!("key[{i}]"),
            format!("key[{i}] is longer than {MAX_VALUE_BYTES} bytes"),
        ));
    }
    Ok(named)
}

/// The body as an entry and its `ttl_s` (0: none), checked as a file override is.
fn parse_body(
    body: &[u8],
    limit: &Limit,
    values: &[String],
    policy: &Policy,
) -> Result<(Entry, u64), (String, String)> {
    let bad = |field: &str, reason: &str| (field.to_string(), reason.to_string());
    let object: Map<String, Value> = match serde_json::from_slice(body) {
        Ok(Value::Object(object)) => object,
        _ => return Err(bad("body", "must be a JSON object")),
    };
    let mut config = OverrideConfig {
        key: values.to_vec(),
        rate: None,
        burst: None,
        quota: None,
        unlimited: false,
    };
    let mut ttl_s = 0;
    for (field, value) in &object {
        match (field.as_str(), value) {
            ("rate", Value::String(text)) => config.rate = Some(RateSpec::Text(text.clone())),
            ("rate", Value::Number(n)) => {
                config.rate = n.as_f64().map(RateSpec::PerSecond);
            }
            ("rate", _) => {
                return Err(bad("rate", "must be like \"100/s\" or a number per second"))
            }
            ("burst", v) => {
                config.burst =
                    Some(count(v).ok_or_else(|| bad("burst", "must be a positive integer"))?)
            }
            ("quota", v) => {
                config.quota =
                    Some(count(v).ok_or_else(|| bad("quota", "must be a positive integer"))?)
            }
            ("unlimited", Value::Bool(flag)) => config.unlimited = *flag,
            ("unlimited", _) => return Err(bad("unlimited", "must be true or false")),
            ("ttl_s", v) => {
                ttl_s = count(v)
                    .filter(|ttl| (1..=MAX_TTL_S).contains(ttl))
                    .ok_or_else(|| {
                        bad(
                            "ttl_s",
                            &format!("must be an integer between 1 and {MAX_TTL_S} (ten years)"),
                        )
                    })?;
            }
            (other, _) => {
                let other: String = other.chars().take(64).collect();
                return Err((
                    other,
                    "is not a field of an override (rate, burst, quota, unlimited, ttl_s)".into(),
                ));
            }
        }
    }
    let base = limit.base(policy.client_ip.ipv6_prefix);
    overrides::parse(&config, base).map_err(|error| {
        let field = if error.key.is_empty() {
            "body".to_string()
        } else {
            error.key.clone()
        };
        (field, error.reason)
    })?;
    let entry = Entry {
        expires_at_ms: None,
        key: config.key,
        rate: config.rate.as_ref().and_then(|spec| spec.per_second().ok()),
        burst: config.burst,
        quota: config.quota,
        unlimited: config.unlimited,
    };
    Ok((entry, ttl_s))
}

/// A non-negative integer (a float with a fraction is not one).
fn count(value: &Value) -> Option<u64> {
    value.as_u64()
}

/// An entry as `caller` may see it; `now_ms` on the store's clock dates its expiry.
fn render(entry: &Entry, salt: &Salt, caller: Caller, now_ms: i64) -> Value {
    let key: Vec<String> = entry
        .key
        .iter()
        .map(|value| salt.shown(value, caller).into_owned())
        .collect();
    let mut shown = json!({ "key": key });
    if entry.unlimited {
        shown["unlimited"] = json!(true);
    }
    if let Some(rate) = entry.rate {
        shown["rate_per_s"] = json!(rate);
    }
    if let Some(burst) = entry.burst {
        shown["burst"] = json!(burst);
    }
    if let Some(quota) = entry.quota {
        shown["quota"] = json!(quota);
    }
    if let Some(at) = entry.expires_at_ms {
        let left_ms = i64::try_from(at).unwrap_or(i64::MAX).saturating_sub(now_ms);
        // Whole seconds, rounded up: an entry listed is still in force.
        shown["expires_in_s"] = json!((left_ms.max(0) + 999) / 1000);
    }
    shown
}

fn write_failed(error: WriteError) -> AdminError {
    match error {
        WriteError::Full(_) => AdminError::Conflict(error.to_string()),
        WriteError::Store(cause) => {
            log::warn!("a runtime override was not changed (answered 503): {cause}");
            AdminError::Unavailable(format!(
                "the store did not take the change ({cause}); retry"
            ))
        }
    }
}

fn json_answer(status: StatusCode, body: &Value) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("application/json")
        .body(body.to_string())
}
