//! Shutdown without losing a request: new connections held back then refused, open ones told
//! to close, in-flight checks finished within a grace period (the `close_notice` and
//! `shutdown_grace` of [`Timings`](tollgate_core::base::timings::Timings)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;

mod door;
pub use door::Door;

/// After new SYNs are held back, how long handshakes already under way get to complete and be
/// accepted before we look whether the accept queue is empty.
const HANDSHAKE_SETTLE: Duration = Duration::from_millis(50);
/// How long the accept thread gets to act on a pause before the queue is inspected.
const PAUSE_SETTLE: Duration = Duration::from_millis(10);

/// Stops the HTTP servers gracefully and tells the gRPC service (`stopping`): new
/// connections are refused (none the kernel already accepted is reset); for `close_notice`
/// every answer says `Connection: close` (`draining`), then idle connections close and
/// in-flight checks finish.
pub async fn drain(
    servers: Vec<ServerHandle>,
    doors: Vec<Door>,
    draining: Arc<AtomicBool>,
    stopping: tokio::sync::watch::Sender<bool>,
    close_notice: Duration,
) {
    log::info!("shutting down: no new connections, finishing in-flight checks");
    let notice_ends = Instant::now() + close_notice;
    draining.store(true, Ordering::Relaxed);
    // The gRPC service drains on its own (see `grpc_server::spawn`).
    stopping.send_replace(true);
    stop_accepting(&servers, &doors, notice_ends).await;
    tokio::time::sleep_until(notice_ends.into()).await;
    let stops = servers.iter().map(|server| server.stop(true));
    for stop in stops.collect::<Vec<_>>() {
        stop.await;
    }
}

/// Hold new SYNs back, let actix accept what the kernel queued until the queues stay empty,
/// then take the sockets out of LISTEN so later clients are refused at once.
async fn stop_accepting(servers: &[ServerHandle], doors: &[Door], give_up: Instant) {
    for door in doors {
        if let Err(error) = door.hold_new_connections() {
            log::warn!("cannot hold new connections back; some may be reset: {error}");
        }
    }
    loop {
        tokio::time::sleep(HANDSHAKE_SETTLE).await;
        for server in servers {
            server.pause().await;
        }
        tokio::time::sleep(PAUSE_SETTLE).await;
        if !doors.iter().any(Door::has_waiting) {
            break;
        }
        if Instant::now() >= give_up {
            log::warn!("closing listeners with connections still queued; they are reset");
            break;
        }
        for server in servers {
            server.resume().await;
        }
    }
    for door in doors {
        if let Err(error) = door.shut() {
            log::warn!("cannot shut a listener: {error}");
        }
    }
}
