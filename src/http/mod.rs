//! The HTTP surface: `/check` on the public listener; `/metrics` only on the admin listener;
//! `/healthz` and `/readyz` on both.

pub mod check;
pub mod headers;
pub mod health;

use actix_web::web;

/// Routes of the public listener, the one the ingress calls.
pub fn public_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource(["/check", "/check/{tail:.*}"]).to(check::check))
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz));
}

/// Routes of the admin listener: never exposed through the ingress.
pub fn admin_routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(health::metrics))
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz));
}
