//! Signals: SIGTERM and SIGINT stop the instance (see [`drain`](crate::app::drain)), SIGHUP
//! reloads the limits (see [`reload`](crate::app::reload)); meanwhile a served
//! envoyproxy/ratelimit config directory is looked at every `watch_every` (see
//! [`Timings`](crate::base::timings::Timings)).

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use crate::app::reload::Reloader;

/// Resolves at SIGTERM or SIGINT; SIGHUP reloads the limits meanwhile, and a change in the
/// served envoyproxy/ratelimit config directory, looked at every `watch_every`. The binary's
/// shutdown future for [`crate::app::server::run`].
pub async fn stop_signal(reloader: Arc<Reloader>, watch_every: Duration) {
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        log::error!("cannot install signal handlers; stop tollgate with SIGKILL");
        return std::future::pending().await;
    };
    let mut watch = tokio::time::interval(watch_every);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => reloader.reload(),
            _ = watch.tick() => reloader.reload_if_changed(),
        }
    }
}
