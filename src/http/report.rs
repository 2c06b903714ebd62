//! `POST /report` on the admin listener: charges known after the response. Needs
//! `Authorization: Bearer <admin_token>`; without a configured token it is refused outright.

use actix_web::{web, HttpRequest, HttpResponse, ResponseError};

use super::admin::{AdminError, Operator};
use crate::state::AppState;
use tollgate_core::limiter::report::{self, Item, ReportError, Reports};
use tollgate_core::observe::trace::{self, attribute, Kind, Span};
use tollgate_core::policy::Policy;

pub async fn report(
    operator: Operator,
    request: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let Some(tracer) = &state.tracer else {
        return record(operator, &body, &state, None).await;
    };
    let headers = request.headers();
    let caller = trace::incoming(|name| headers.get(name).and_then(|v| v.to_str().ok()));
    let Some(mut span) = tracer.start(Kind::Report, &caller) else {
        return record(operator, &body, &state, None).await;
    };
    let answer = record(operator, &body, &state, Some(&mut span)).await;
    let status = match &answer {
        Ok(response) => response.status(),
        Err(error) => {
            span.fail(error.to_string());
            error.status_code()
        }
    };
    span.set_int(attribute::STATUS, i64::from(status.as_u16()));
    tracer.finish(span);
    answer
}

/// The report itself; `span` gets the limits it names.
async fn record(
    _: Operator,
    body: &[u8],
    state: &AppState,
    span: Option<&mut Span>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let reports = report::parse(body, &policy).map_err(|error| match error {
        ReportError::NotReported { ref field, .. } => AdminError::NotFound {
            detail: error.to_string(),
            field: Some(field.clone()),
        },
        ReportError::Malformed { ref field, .. } | ReportError::UnknownLimit { ref field, .. } => {
            AdminError::bad(field.clone(), error.to_string())
        }
    })?;
    if let Some(span) = span {
        span.set_strs(attribute::LIMITS, limits_named(&reports, &policy));
    }
    let charged = state
        .limiter
        .report(&policy, &reports)
        .await
        .map_err(|error| AdminError::Unavailable(error.to_string()))?;
    let body = match (reports.listed, charged.as_slice()) {
        (false, [one]) => serde_json::to_string(one),
        _ => serde_json::to_string(&charged),
    };
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(body.unwrap_or_default()))
}

/// The names of the limits a report body names, each once, in body order.
fn limits_named<'p>(reports: &Reports, policy: &'p Policy) -> Vec<&'p str> {
    let mut names: Vec<&str> = Vec::new();
    for item in &reports.items {
        let limit = match item {
            Item::Charge(charge) => charge.bucket.limit,
            Item::Settle(settle) => settle.bucket.limit,
            Item::Unlimited { limit } | Item::Release { limit, .. } => *limit,
        };
        let name = policy.limits[limit].name.as_str();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}
