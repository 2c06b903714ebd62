//! The gRPC listener: Envoy's rate limit and quota (RLQS) services and `grpc.health.v1.Health`, on threads of
//! its own. Health reports readiness as `/readyz` does, and NOT_SERVING from the moment a
//! shutdown begins. Plain HTTP/2, or TLS with `grpc_tls` (see [`super::grpc_tls`]). Its
//! connections are bounded (see [`super::grpc_connections`]), and each is sent an HTTP/2
//! PING every `grpc_keepalive_every`: one unanswered for `grpc_keepalive_timeout` is closed.
//!
//! One thread accepts and hands each connection in turn to one of a lane per core: a thread
//! with a single-threaded runtime that serves it to the end, as actix's workers do for HTTP.
//! A call, its Redis batch (batches gather per thread) and that thread's Redis connection then
//! stay on one core. On one multi-threaded runtime, where tasks move between workers, a gRPC
//! call cost a third more CPU, most of it waking threads (docs/benchmarks/grpc.md).

use std::sync::Arc;
use std::thread::JoinHandle;

use actix_web::web;
use futures_util::stream::{self, Stream};
use tokio::sync::{mpsc, watch};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::app::drain::Door;
use crate::app::grpc_connections::{prefaced, Admitted, Cap};
use crate::app::grpc_tls::LiveTls;
use crate::grpc::rlqs::RlqsService;
use crate::grpc::{RateLimitService, ShouldRateLimit};
use crate::state::AppState;

/// Accepted connections waiting for their lane.
const LANE_QUEUE: usize = 64;

/// Serves the rate limit and health services on `listener` (over TLS with `tls`), holding at
/// most `max_connections` connections, until `stopping` turns true; then drains. The returned
/// receiver fires when the server has stopped.
pub fn spawn(
    listener: std::net::TcpListener,
    tls: Option<Arc<LiveTls>>,
    max_connections: u32,
    state: web::Data<AppState>,
    stopping: watch::Receiver<bool>,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let door = Door::of(&listener)?;
    listener.set_nonblocking(true)?;
    let (reporter, health) = tonic_health::server::health_reporter();
    // True once the acceptor stops taking connections: the lanes then drain.
    let (close_lanes, lanes_closed) = watch::channel(false);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut lanes = Vec::with_capacity(workers);
    let mut threads = Vec::with_capacity(workers);
    let timings = state.timings;
    let rlqs = RlqsService::new(state.clone(), stopping.clone());
    for _ in 0..workers {
        let (hand, accepted) = mpsc::channel(LANE_QUEUE);
        let runtime = single_threaded()?;
        let lane = Lane {
            accepted,
            tls: tls.clone(),
            router: tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(timings.grpc_keepalive_every))
                .http2_keepalive_timeout(Some(timings.grpc_keepalive_timeout))
                .add_service(health.clone())
                .add_service(RateLimitService::new(ShouldRateLimit::new(state.clone())))
                .add_service(rlqs.clone().server()),
            state: state.clone(),
            closed: lanes_closed.clone(),
            stopping: stopping.clone(),
        };
        threads.push(
            std::thread::Builder::new()
                .name("tollgate-grpc".into())
                .spawn(move || runtime.block_on(lane.serve()))?,
        );
        lanes.push(hand);
    }
    let runtime = single_threaded()?;
    let (done, stopped) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tollgate-grpc-accept".into())
        .spawn(move || {
            let cap = Cap::new(max_connections);
            let acceptor = accept(listener, lanes, cap, tls, reporter, state, stopping, door);
            if let Err(error) = runtime.block_on(acceptor) {
                log::error!("gRPC server failed: {error}");
            }
            let _ = close_lanes.send(true);
            join(threads);
            let _ = done.send(());
        })?;
    Ok(stopped)
}

fn single_threaded() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn join(threads: Vec<JoinHandle<()>>) {
    for thread in threads {
        if thread.join().is_err() {
            log::error!("a gRPC lane panicked");
        }
    }
}

/// Accepts until a shutdown has given open connections their notice, handing connections to
/// the lanes in turn (and closing those past the cap); reports health meanwhile.
#[allow(clippy::too_many_arguments)]
async fn accept(
    listener: std::net::TcpListener,
    lanes: Vec<mpsc::Sender<Admitted>>,
    mut cap: Cap,
    tls: Option<Arc<LiveTls>>,
    reporter: HealthReporter,
    state: web::Data<AppState>,
    mut stopping: watch::Receiver<bool>,
    door: Door,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let timings = state.timings;
    // Every service has a status from the first call on.
    set_status(&reporter, readiness(&state).await).await;
    if let Some(live) = tls {
        tokio::spawn(crate::app::grpc_tls::follow(live, timings.watch_every));
    }
    tokio::spawn(report_readiness(
        reporter.clone(),
        state.clone(),
        stopping.clone(),
    ));
    let shutdown = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
        set_status(&reporter, ServingStatus::NotServing).await;
        if let Err(error) = door.hold_new_connections() {
            log::warn!("cannot hold new gRPC connections back: {error}");
        }
        // Open connections keep being answered while Envoy's health checks learn we leave.
        tokio::time::sleep(timings.close_notice).await;
    };
    tokio::pin!(shutdown);
    let mut lanes = lanes.iter().cycle();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors and the like: the next accept may succeed.
                Err(error) => {
                    log::warn!("gRPC listener: cannot accept: {error}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        // Registered again with the lane's own runtime there.
        let Some(admitted) = cap.admit(stream.into_std()?) else {
            continue;
        };
        let Some(lane) = lanes.next() else {
            return Ok(());
        };
        if lane.send(admitted).await.is_err() {
            log::error!("a gRPC lane has stopped; closing the listener");
            return Ok(());
        }
    }
}

/// One lane: a single-threaded runtime serving the connections handed to it.
struct Lane {
    accepted: mpsc::Receiver<Admitted>,
    tls: Option<Arc<LiveTls>>,
    router: tonic::transport::server::Router,
    state: web::Data<AppState>,
    closed: watch::Receiver<bool>,
    stopping: watch::Receiver<bool>,
}

impl Lane {
    async fn serve(self) {
        let Lane {
            accepted,
            tls,
            router,
            state,
            mut closed,
            mut stopping,
        } = self;
        // This thread's Redis connection, made before its first call.
        let warm = state.clone();
        tokio::spawn(async move { warm.limiter.store().warm_up().await });
        let timings = state.timings;
        let drain = async move {
            let _ = closed.wait_for(|closed| *closed).await;
        };
        let server = async move {
            match tls {
                Some(config) => {
                    let incoming = crate::app::grpc_tls::handshakes(
                        accepted,
                        config,
                        timings.grpc_first_bytes_within,
                    );
                    router
                        .serve_with_incoming_shutdown(received(incoming), drain)
                        .await
                }
                None => {
                    let incoming = prefaced(accepted, timings.grpc_first_bytes_within);
                    router
                        .serve_with_incoming_shutdown(received(incoming), drain)
                        .await
                }
            }
        };
        // In-flight calls finish (each within the store timeout); a connection still open
        // when the grace period ends is cut.
        let grace_over = async move {
            let _ = stopping.wait_for(|stop| *stop).await;
            tokio::time::sleep(timings.shutdown_grace).await;
        };
        tokio::select! {
            result = server => if let Err(error) = result {
                log::error!("gRPC server failed: {error}");
            },
            () = grace_over => log::warn!("gRPC connections still open after the grace period; closing them"),
        }
    }
}

/// A receiver as a stream.
fn received<T>(receiver: mpsc::Receiver<T>) -> impl Stream<Item = T> {
    stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|next| (next, receiver))
    })
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

/// The overall status ("") and the rate limit and quota services' own.
async fn set_status(reporter: &HealthReporter, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status(
            <RateLimitService as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    reporter
        .set_service_status(crate::grpc::rlqs::SERVICE_NAME, status)
        .await;
}
