//! `POST /report` on the admin listener: charges known after the response. Needs
//! `Authorization: Bearer <admin_token>`; without a configured token it is refused outright.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::report::{self, ReportError};
use crate::server::AppState;
use crate::store::Store;

pub async fn report(
    request: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> HttpResponse {
    let policy = state.limiter.policy();
    if let Some(refusal) = refuse_unauthorized(&request, policy.admin_token.as_deref()) {
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
    match state.limiter.store().report(&reports.charges).await {
        Ok(outcomes) => {
            let charged = report::answer(&policy, &reports.charges, &outcomes);
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

/// The refusal, unless the caller holds the admin token. The comparison takes the same time
/// wherever the tokens differ (digests compared in full), so response times do not leak it.
fn refuse_unauthorized(request: &HttpRequest, token: Option<&str>) -> Option<HttpResponse> {
    let Some(token) = token else {
        return Some(problem(
            StatusCode::FORBIDDEN,
            "POST /report is disabled: set admin_token (or admin_token_file, or the environment variable TOLLGATE_ADMIN_TOKEN)".into(),
            None,
        ));
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    let (a, b) = (Sha256::digest(given.trim()), Sha256::digest(token));
    let differ = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    if given.is_empty() || differ != 0 {
        let mut refusal = problem(
            StatusCode::UNAUTHORIZED,
            "needs Authorization: Bearer <admin_token>".into(),
            None,
        );
        refusal
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return Some(refusal);
    }
    None
}

fn problem(status: StatusCode, detail: String, field: Option<String>) -> HttpResponse {
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
