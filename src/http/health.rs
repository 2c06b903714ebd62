//! `/healthz` (the process serves), `/readyz` (tollgate can decide) and `/metrics`.

use actix_web::{web, HttpResponse};

use crate::state::{AppState, Readiness};

/// Liveness: never looks at the store, so a Redis outage cannot restart tollgate.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

/// Readiness: tollgate can decide (see [`AppState::readiness`]); 503 with the reason
/// otherwise.
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let (mut answer, text) = match state.readiness().await {
        Readiness::Ready => (HttpResponse::Ok(), "ready\n".to_string()),
        Readiness::Degraded(error) => (
            HttpResponse::Ok(),
            format!("ready (degraded, store failing: {error})\n"),
        ),
        Readiness::NotReady(why) => (
            HttpResponse::ServiceUnavailable(),
            format!("not ready: {why}\n"),
        ),
    };
    answer.content_type("text/plain").body(text)
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
