//! The HTTP surface: `/check` on the public listener; `/metrics` only on the admin listener;
//! `/healthz` and `/readyz` on both; `POST /report` and the admin API (`/v1/limits`,
//! `/v1/buckets`, `/v1/overrides`, `/v1/top`) only on the admin listener.

pub mod admin;
pub mod buckets;
pub mod check;
pub mod health;
pub mod limits;
pub mod overrides;
pub mod release;
pub mod report;
pub mod response;
pub mod top;

use actix_web::web;

/// Routes of the public listener, the one the ingress calls.
///
/// Paths below `/check/` are matched by prefix in [`check::below_check`], not by a
/// `/check/{tail:.*}` pattern: actix matches such patterns with a regex per request, which
/// was 40% of the instructions of a memory-store check (`bench/profile.sh`).
pub fn public_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/check").to(check::check))
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz))
        .default_service(web::to(check::below_check));
}

/// Routes of the admin listener: never exposed through the ingress.
pub fn admin_routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(health::metrics))
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz))
        .service(web::resource("/report").route(web::post().to(report::report)))
        .service(web::resource("/release").route(web::post().to(release::release)))
        .route("/v1/limits", web::get().to(limits::limits))
        .service(
            web::resource("/v1/buckets/{limit}")
                .route(web::get().to(buckets::peek))
                .route(web::delete().to(buckets::reset)),
        )
        .service(
            web::resource("/v1/overrides/{limit}")
                .route(web::get().to(overrides::list))
                .route(web::put().to(overrides::put))
                .route(web::delete().to(overrides::delete)),
        )
        .route("/v1/top", web::get().to(top::top));
}
