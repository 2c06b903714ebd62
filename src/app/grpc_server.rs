//! The gRPC listener: Envoy's rate limit service and `grpc.health.v1.Health`, in a runtime of
//! its own. Health reports readiness as `/readyz` does, and NOT_SERVING from the moment a
//! shutdown begins. Plain HTTP/2, or TLS with `grpc_tls` (see [`super::grpc_tls`]).

use std::sync::Arc;

use actix_web::web;
use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::app::drain::Door;
use crate::grpc::{RateLimitService, RateLimiter};
use crate::state::AppState;

/// Serves the rate limit and health services on `listener` (over TLS with `tls`), in a
/// runtime of its own on its own threads, until `stopping` turns true; then drains. The
/// returned receiver fires when the server has stopped.
pub fn spawn(
    listener: std::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: web::Data<AppState>,
    stopping: watch::Receiver<bool>,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let door = Door::of(&listener)?;
    listener.set_nonblocking(true)?;
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("tollgate-grpc")
        .enable_all()
        .build()?;
    let (done, stopped) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tollgate-grpc".into())
        .spawn(move || {
            if let Err(error) = runtime.block_on(serve(listener, tls, state, stopping, door)) {
                log::error!("gRPC server failed: {error}");
            }
            let _ = done.send(());
        })?;
    Ok(stopped)
}

async fn serve(
    listener: std::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: web::Data<AppState>,
    mut stopping: watch::Receiver<bool>,
    door: Door,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let timings = state.timings;
    let (reporter, health) = tonic_health::server::health_reporter();
    // Every service has a status from the first call on.
    set_status(&reporter, readiness(&state).await).await;
    tokio::spawn(report_readiness(
        reporter.clone(),
        state.clone(),
        stopping.clone(),
    ));
    let mut signalled = stopping.clone();
    let shutdown = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
        set_status(&reporter, ServingStatus::NotServing).await;
        if let Err(error) = door.hold_new_connections() {
            log::warn!("cannot hold new gRPC connections back: {error}");
        }
        // Open connections keep being answered while Envoy's health checks learn we leave.
        tokio::time::sleep(timings.close_notice).await;
    };
    let router = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitService::new(RateLimiter::new(state)));
    let server = async move {
        match tls {
            Some(config) => {
                let incoming = crate::app::grpc_tls::incoming(listener, config);
                let incoming = futures_util::stream::unfold(incoming, |mut incoming| async move {
                    incoming.recv().await.map(|next| (next, incoming))
                });
                router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
            None => {
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
        }
    };
    // In-flight calls finish (each within the store timeout); a connection still open when
    // the grace period ends is cut.
    let grace_over = async move {
        let _ = signalled.wait_for(|stop| *stop).await;
        tokio::time::sleep(timings.shutdown_grace).await;
    };
    tokio::select! {
        result = server => result?,
        () = grace_over => log::warn!("gRPC connections still open after the grace period; closing them"),
    }
    Ok(())
}

/// SERVING while tollgate can decide (the store answers, or `on_error` decides without it),
/// NOT_SERVING otherwise and from the start of a shutdown on; asked every
/// `grpc_health_every`.
async fn report_readiness(
    reporter: HealthReporter,
    state: web::Data<AppState>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(state.timings.grpc_health_every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopping.wait_for(|stop| *stop) => return,
        }
        let status = readiness(&state).await;
        if *stopping.borrow() {
            return;
        }
        set_status(&reporter, status).await;
    }
}

/// The health status of [`AppState::can_decide`].
async fn readiness(state: &AppState) -> ServingStatus {
    if state.can_decide().await {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// The overall status ("") and the rate limit service's own.
async fn set_status(reporter: &HealthReporter, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status(
            <RateLimitService as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
}
