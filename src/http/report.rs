//! `POST /report` on the admin listener: charges known after the response. Needs
//! `Authorization: Bearer <admin_token>`; without a configured token it is refused outright.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};

use super::admin::{self, problem};
use crate::limiter::report::{self, ReportError};
use crate::state::AppState;
use crate::store::Store;

pub async fn report(
    request: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> HttpResponse {
    let policy = state.limiter.policy();
    if let Some(refusal) =
        admin::refuse_unless_operator(&request, policy.admin_token.as_deref(), "POST /report")
    {
        return refusal;
    }
    let reports = match report::parse(&body, &policy) {
        Ok(reports) => reports,
        Err(error) => {
            let status = match error {
                ReportError::NotReported { .. } => StatusCode::NOT_FOUND,
                _ => StatusCode::BAD_REQUEST,
            };
            let field = match &error {
                ReportError::Malformed { field, .. }
                | ReportError::UnknownLimit { field, .. }
                | ReportError::NotReported { field, .. } => field.clone(),
            };
            return problem(status, error.to_string(), Some(field));
        }
    };
    let charged = if reports.charges.is_empty() {
        Ok(Vec::new())
    } else {
        state.limiter.store().report(&reports.charges).await
    };
    match charged {
        Ok(outcomes) => {
            let charged = report::answer(&policy, &reports, &outcomes);
            let body = match (reports.listed, charged.as_slice()) {
                (false, [one]) => serde_json::to_string(one),
                _ => serde_json::to_string(&charged),
            };
            HttpResponse::Ok()
                .content_type("application/json")
                .body(body.unwrap_or_default())
        }
        Err(error) => {
            log::warn!("a report was not recorded (answered 503): {error}");
            let mut response = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store did not record the report ({error}); nothing was charged for certain: retry"),
                None,
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}
