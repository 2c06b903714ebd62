//! How long tollgate's background duties wait: every fixed interval in one value, built once
//! at start and handed to each duty (the heartbeat, the reset channel, Sentinel, the config
//! directory watch, gRPC health, the circuit breaker, the drain).
//!
//! [`Timings::default`] holds the production values. It is no config key: operators tune
//! none of these.

use std::time::Duration;

/// Every fixed interval of the background duties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How often an instance with `on_error = "local"` announces itself in the store.
    pub heartbeat_every: Duration,
    /// An instance silent this long is no longer counted.
    pub instance_ttl: Duration,
    /// How often a quiet reset-channel subscription is checked to be alive.
    pub reset_ping_every: Duration,
    /// First pause after a failed reset-channel subscription; doubled per failure up to
    /// [`Timings::reset_max_backoff`].
    pub reset_first_backoff: Duration,
    pub reset_max_backoff: Duration,
    /// How often the sentinels are asked for the master even when all is well (a failover may
    /// also come without any failed call, e.g. `SENTINEL FAILOVER` while idle).
    pub sentinel_poll_every: Duration,
    /// At most one question to the sentinels every this long, however many calls fail.
    pub sentinel_min_gap: Duration,
    /// How often a served envoyproxy/ratelimit config directory is looked at for changes.
    pub watch_every: Duration,
    /// How often the gRPC health service asks whether tollgate can decide.
    pub grpc_health_every: Duration,
    /// How long an open circuit breaker rejects calls before it lets a probe through. Short,
    /// so recovery is quick.
    pub breaker_open_for: Duration,
    /// In-flight checks get this long to finish after SIGTERM, the close notice included.
    pub shutdown_grace: Duration,
    /// After SIGTERM, how long requests on open keep-alive connections are still answered
    /// (with `Connection: close`) before idle connections are closed. Closing a busy
    /// keep-alive connection without notice loses the request the client is sending at that
    /// moment. New connections are refused from the start of the notice.
    pub close_notice: Duration,
}

impl Default for Timings {
    /// The production values.
    fn default() -> Self {
        Timings {
            heartbeat_every: Duration::from_secs(2),
            instance_ttl: Duration::from_secs(6),
            reset_ping_every: Duration::from_secs(5),
            reset_first_backoff: Duration::from_millis(100),
            reset_max_backoff: Duration::from_secs(2),
            sentinel_poll_every: Duration::from_secs(1),
            sentinel_min_gap: Duration::from_millis(100),
            watch_every: Duration::from_secs(1),
            grpc_health_every: Duration::from_secs(1),
            breaker_open_for: Duration::from_millis(250),
            shutdown_grace: Duration::from_secs(10),
            close_notice: Duration::from_secs(1),
        }
    }
}

impl Timings {
    /// [`Timings::shutdown_grace`] less [`Timings::close_notice`]: how long the servers wait
    /// for in-flight checks once the notice is over.
    pub fn after_notice(&self) -> Duration {
        self.shutdown_grace.saturating_sub(self.close_notice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_wait_nine_seconds_after_the_notice() {
        assert_eq!(Timings::default().after_notice(), Duration::from_secs(9));
    }
}
