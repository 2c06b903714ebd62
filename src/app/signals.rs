//! Signals: SIGTERM and SIGINT stop the instance (see [`drain`](crate::app::drain)), SIGHUP
//! reloads the limits (see [`reload`](crate::app::reload)); meanwhile a served
//! envoyproxy/ratelimit config directory is looked at every `watch_every` (see
//! [`Timings`](tollgate_core::base::timings::Timings)).

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use crate::app::reload::Reloader;

/// Resolves at SIGTERM or SIGINT; SIGHUP reloads the limits meanwhile, and a change in the
/// served envoyproxy/ratelimit config directory, looked at every `watch_every`. The binary's
/// shutdown future for [`crate::app::server::run`]. The handlers are installed by this call,
/// before any listener answers: a SIGHUP or SIGTERM sent as soon as the instance is ready
/// must be heard, not take its default action (ending the process) because the future had
/// not been polled yet. Must be called inside a Tokio runtime.
pub fn stop_signal(
    reloader: Arc<Reloader>,
    watch_every: Duration,
) -> impl std::future::Future<Output = ()> {
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    async move { serve_signals(handlers, reloader, watch_every).await }
}

type Handler = std::io::Result<tokio::signal::unix::Signal>;

async fn serve_signals(
    handlers: (Handler, Handler, Handler),
    reloader: Arc<Reloader>,
    watch_every: Duration,
) {
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = handlers else {
        log::error!("cannot install signal handlers; stop tollgate with SIGKILL");
        return std::future::pending().await;
    };
    let mut watch = tokio::time::interval(watch_every);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A reload reads and compiles files, which may take a while: it runs on a thread of its
    // own, one at a time, so that SIGTERM is heard meanwhile. A process that stops does not
    // wait for it: the running rules are all it ever served.
    let mut reloading: Option<std::thread::JoinHandle<()>> = None;
    let mut hup_pending = false;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => hup_pending = true,
            _ = watch.tick() => {}
        }
        if reloading
            .as_ref()
            .is_some_and(|running| !running.is_finished())
        {
            continue;
        }
        if !(hup_pending || reloader.dir_changed()) {
            continue;
        }
        let worker = reloader.clone();
        match std::thread::Builder::new()
            .name("reload".into())
            .spawn(move || worker.reload())
        {
            Ok(handle) => {
                reloading = Some(handle);
                hup_pending = false;
            }
            Err(error) => log::error!("reload: cannot start its thread, trying again: {error}"),
        }
    }
}
