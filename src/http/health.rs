//! `/healthz` (the process serves), `/readyz` (tollgate can decide) and `/metrics`.

use actix_web::{web, HttpResponse};

use crate::config::OnError;
use crate::state::AppState;
use crate::store::{Store, StoreError};

/// Liveness: never looks at the store, so a Redis outage cannot restart tollgate.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

/// Readiness: tollgate can decide, i.e. the store answers, or `on_error` lets it decide
/// without the store (`allow`, or `local` with its in-memory fallback); and the rules of an
/// xDS server have arrived (unless `envoy.xds.ready_before_config`). A store that refuses
/// scripts is never ready.
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    if state.unready_for_config() {
        return HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body("not ready: no configuration from the xDS server yet\n");
    }
    match state.limiter.store().ping().await {
        Ok(()) => HttpResponse::Ok()
            .content_type("text/plain")
            .body("ready\n"),
        // Whatever on_error says: this does not heal by itself.
        Err(error @ StoreError::ScriptsRefused(_)) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(format!("not ready: {error}\n")),
        Err(error) if state.limiter.on_error() != OnError::Deny => HttpResponse::Ok()
            .content_type("text/plain")
            .body(format!("ready (degraded, store failing: {error})\n")),
        Err(error) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(format!("not ready: {error}\n")),
    }
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
