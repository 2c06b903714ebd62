//! `POST /report` on the admin listener: charges known after the response. Needs
//! `Authorization: Bearer <admin_token>`; without a configured token it is refused outright.

use actix_web::{web, HttpResponse};

use super::admin::{AdminError, Operator};
use crate::limiter::report::{self, ReportError};
use crate::state::AppState;
use crate::store::Store;

pub async fn report(
    _: Operator,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let reports = report::parse(&body, &policy).map_err(|error| match error {
        ReportError::NotReported { ref field, .. } => AdminError::NotFound {
            detail: error.to_string(),
            field: Some(field.clone()),
        },
        ReportError::Malformed { ref field, .. } | ReportError::UnknownLimit { ref field, .. } => {
            AdminError::bad(field.clone(), error.to_string())
        }
    })?;
    let outcomes = if reports.charges.is_empty() {
        Vec::new()
    } else {
        state
            .limiter
            .store()
            .report(&reports.charges)
            .await
            .map_err(|error| {
                log::warn!("a report was not recorded (answered 503): {error}");
                AdminError::Unavailable(format!(
                    "the store did not record the report ({error}); nothing was charged for certain: retry"
                ))
            })?
    };
    let charged = report::answer(&policy, &reports, &outcomes);
    let body = match (reports.listed, charged.as_slice()) {
        (false, [one]) => serde_json::to_string(one),
        _ => serde_json::to_string(&charged),
    };
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(body.unwrap_or_default()))
}
