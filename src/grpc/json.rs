//! envoyproxy/ratelimit's HTTP endpoints on the public listener: `POST /json` takes a
//! `RateLimitRequest` in protobuf's JSON form and answers the `RateLimitResponse` in the same
//! form (429 when OVER_LIMIT, 400 for a request that cannot be read or decided), as its
//! `/json` does, except that a store failure under `on_error = "error"` is a 503 (it answers
//! 400 for every error); `GET /healthcheck` answers `OK` while tollgate can decide, 500
//! otherwise.

use actix_web::{web, HttpResponse};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use serde_json::Value;

use super::ShouldRateLimit;
use crate::state::AppState;
use tollgate_core::answer::STORE_FAILED_RETRY_AFTER_S;
use tollgate_erl::grpc::json::{request_of, response_json};

/// The two routes, for the public listener.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/json", web::post().to(decide))
        .route("/healthcheck", web::get().to(healthcheck));
}

async fn decide(state: web::Data<AppState>, body: web::Bytes) -> HttpResponse {
    let Some(request) = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| request_of(&v))
    else {
        return HttpResponse::BadRequest().body("Bad Request\n");
    };
    match ShouldRateLimit::new(state).decide(&request, None).await {
        Ok(response) => {
            let mut answer = if response.overall_code == i32::from(Code::OverLimit) {
                HttpResponse::TooManyRequests()
            } else {
                HttpResponse::Ok()
            };
            answer
                .content_type("application/json")
                .body(response_json(&response).to_string())
        }
        // The store failed (`on_error = "error"`): not the request's fault.
        Err(status) if status.code() == tonic::Code::Unknown => HttpResponse::ServiceUnavailable()
            .insert_header(("retry-after", STORE_FAILED_RETRY_AFTER_S.to_string()))
            .body(format!("{}\n", status.message())),
        Err(_) => HttpResponse::BadRequest().body("Bad Request\n"),
    }
}

async fn healthcheck(state: web::Data<AppState>) -> HttpResponse {
    if state.can_decide().await {
        HttpResponse::Ok().body("OK")
    } else {
        HttpResponse::InternalServerError().finish()
    }
}
