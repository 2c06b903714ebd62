//! `POST /release` on the admin listener: gives back the leases a check took (the value of
//! its `X-Tollgate-Lease` header). Needs `Authorization: Bearer <admin_token>`, as `/report`.
//!
//! Idempotent: a lease released twice, or already expired, is given back once; the answer
//! says how many of the named leases were still held.

use actix_web::{web, HttpResponse};
use serde::Deserialize;

use super::admin::{AdminError, Operator};
use crate::state::AppState;

/// `{"lease": "<id>[,<id>...]"}`: the header's value as it came.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    lease: String,
}

pub async fn release(
    _: Operator,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let body: ReleaseBody = serde_json::from_slice(&body).map_err(|error| {
        AdminError::bad(
            "lease",
            format!("the body must be {{\"lease\": \"<id>\"}} ({error})"),
        )
    })?;
    let mut leases = Vec::new();
    for id in body.lease.split(',').map(str::trim) {
        let found = policy
            .lease_of(id)
            .map_err(|why| AdminError::bad("lease", format!("lease {id:?} {why}")))?;
        leases.push(found);
    }
    let mut released = 0;
    for (limit, key, member) in &leases {
        let held = state
            .limiter
            .release(&policy, *limit, key, member)
            .await
            .map_err(|error| {
                AdminError::Unavailable(format!(
                    "the store did not answer ({error}): retry (a release is idempotent)"
                ))
            })?;
        released += usize::from(held);
    }
    let answer = serde_json::json!({ "leases": leases.len(), "released": released });
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(answer.to_string()))
}
