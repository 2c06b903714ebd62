//! The yardstick for tollgate's HTTP overhead: a bare actix-web server answering `/check` with
//! the status and headers of a tollgate "allow", without deciding anything. `bench/check.sh`
//! loads it and tollgate (memory store) with the same tool, same run, same requests.
//!
//! Usage: `cargo run --release --example bare -- 127.0.0.1:8081`
// Tests and load tools compute ratios and figures; the library's cast lints (Cargo.toml)
// guard its token arithmetic, not these.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

use actix_web::{web, App, HttpResponse, HttpServer};

async fn allow() -> HttpResponse {
    HttpResponse::Ok()
        .insert_header(("ratelimit-policy", "\"per-key\";q=1000000;w=1000"))
        .insert_header(("ratelimit", "\"per-key\";r=999999;t=1"))
        .insert_header(("x-ratelimit-limit", "1000000"))
        .insert_header(("x-ratelimit-remaining", "999999"))
        .insert_header(("x-ratelimit-reset", "1"))
        .finish()
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8081".into());
    // Same routing shape and worker count (actix's default) as tollgate's public listener.
    HttpServer::new(|| {
        App::new()
            .service(web::resource("/check").to(allow))
            .default_service(web::to(allow))
    })
    .bind(listen)?
    .run()
    .await
}

#[cfg(test)]
mod tests {
    use actix_web::{test, web, App};

    #[actix_web::test]
    async fn answers_like_a_tollgate_allow_on_every_check_path() {
        let app = test::init_service(
            App::new()
                .service(web::resource("/check").to(super::allow))
                .default_service(web::to(super::allow)),
        )
        .await;
        for path in ["/check", "/check/k42"] {
            let response =
                test::call_service(&app, test::TestRequest::get().uri(path).to_request()).await;
            assert_eq!(response.status(), 200);
            for name in ["ratelimit-policy", "ratelimit", "x-ratelimit-remaining"] {
                assert!(response.headers().contains_key(name), "{path}: {name}");
            }
        }
    }
}
