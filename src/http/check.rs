//! `/check`: describe the original request, decide, render. Any method, any path below.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};

use super::response;
use crate::state::AppState;
use tollgate_core::observe::trace::{self, attribute, Kind};
use tollgate_core::request::{Headers, OriginalRequest};

pub async fn check(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let started = Instant::now();
    let span = state.tracer.as_ref().and_then(|tracer| {
        let headers = request.headers();
        let caller = trace::incoming(|name| headers.get(name).and_then(|v| v.to_str().ok()));
        tracer.start(Kind::Check, &caller)
    });
    let policy = state.limiter.policy();
    // A TCP peer always exists; the fallback only covers listeners without one.
    let peer = request
        .peer_addr()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |addr| addr.ip());
    let headers = ActixHeaders(request.headers());
    let client_ip = policy.client_ip.client_ip(&headers, peer);
    let path_tail = request.path().get("/check".len()..).unwrap_or("/");
    let original = OriginalRequest::new(&headers, request.method().as_str(), path_tail, client_ip);
    let verdict = state.limiter.check(&policy, &original).await.verdict;
    let form = response::DenyForm::requested(request.headers());
    let response = response::render_as(&verdict, &policy, form);
    if let (Some(tracer), Some(mut span)) = (&state.tracer, span) {
        verdict.attributes(&policy).record(&mut span);
        span.set_int(attribute::STATUS, i64::from(response.status().as_u16()));
        tracer.finish(span);
    }
    state
        .metrics
        .check_duration
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Every path the other routes do not take: `/check/<anything>` is a check, the rest 404.
pub async fn below_check(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if request.path().starts_with("/check/") {
        check(request, state).await
    } else {
        HttpResponse::NotFound().finish()
    }
}

/// actix's header map lent to the core, which reads headers through [`Headers`].
#[derive(Debug)]
pub struct ActixHeaders<'a>(pub &'a actix_web::http::header::HeaderMap);

impl Headers for ActixHeaders<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|value| value.as_bytes())
    }

    fn nth(&self, name: &str, index: usize) -> Option<&[u8]> {
        self.0
            .get_all(name)
            .nth(index)
            .map(|value| value.as_bytes())
    }

    fn count(&self, name: &str) -> usize {
        self.0.get_all(name).count()
    }
}
