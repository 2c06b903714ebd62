//! Shutdown without losing a request: new connections held back then refused, open ones told
//! to close, in-flight checks finished within a grace period.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;

mod door;
pub use door::Door;

/// In-flight checks get this long to finish after SIGTERM, [`CLOSE_NOTICE`] included.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// After SIGTERM, how long requests on open keep-alive connections are still answered (with
/// `Connection: close`) before idle connections are closed. Closing a busy keep-alive
/// connection without notice loses the request the client is sending at that moment. New
/// connections are refused from the start of the notice.
pub const CLOSE_NOTICE: Duration = Duration::from_secs(1);

/// After new SYNs are held back, how long handshakes already under way get to complete and be
/// accepted before we look whether the accept queue is empty.
const HANDSHAKE_SETTLE: Duration = Duration::from_millis(50);
/// How long the accept thread gets to act on a pause before the queue is inspected.
const PAUSE_SETTLE: Duration = Duration::from_millis(10);

/// Stops the HTTP servers gracefully and tells the gRPC service (`stopping`): new
/// connections are refused (none the kernel already accepted is reset); for
/// [`CLOSE_NOTICE`] every answer says `Connection: close` (`draining`), then idle
/// connections close and in-flight checks finish.
pub async fn drain(
    servers: Vec<ServerHandle>,
    doors: Vec<Door>,
    draining: Arc<AtomicBool>,
    stopping: tokio::sync::watch::Sender<bool>,
) {
    log::info!("shutting down: no new connections, finishing in-flight checks");
    let notice_ends = Instant::now() + CLOSE_NOTICE;
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
