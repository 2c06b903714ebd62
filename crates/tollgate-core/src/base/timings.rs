//! How long tollgate's background duties wait: every fixed interval in one value, built once
//! at start and handed to each duty (the heartbeat, the reset channel, Sentinel, the config
//! directory watch, gRPC health and connections, the circuit breaker, the drain, the export
//! of spans).
//!
//! [`Timings::default`] holds the production values. Tests of the real binary shorten them
//! all at once with the testing-only environment variable [`TEST_SCALE_ENV`], a divisor:
//! dividing every interval by the same number keeps each relation between them (an instance
//! expires after three missed heartbeats, a backoff grows to its cap, the close notice fits in
//! the grace period), so a shortened instance behaves as a production one on a faster clock.
//! It is not a config key: users are not meant to set it (CONTRIBUTING.md documents it).

use std::time::Duration;

/// The testing-only divisor of every interval (absent: 1, the production values).
pub const TEST_SCALE_ENV: &str = "TOLLGATE_TEST_TIMINGS_SCALE";

/// The largest divisor: every interval stays at least 1 ms (the shortest, the Sentinel gap of
/// 100 ms, becomes 1 ms). A larger one would make the duties spin, not the tests faster.
pub const MAX_TEST_SCALE: u32 = 100;

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
    /// A gRPC connection that has not sent the HTTP/2 preface (plain) or finished its TLS
    /// handshake by then is closed: a silent connection would hold a descriptor forever.
    pub grpc_first_bytes_within: Duration,
    /// How often an HTTP/2 PING goes to a gRPC client; one that does not answer within
    /// [`Timings::grpc_keepalive_timeout`] is closed (a peer gone without a reset).
    pub grpc_keepalive_every: Duration,
    pub grpc_keepalive_timeout: Duration,
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
    /// How long finished spans wait for more before they are exported as a batch (the
    /// OpenTelemetry SDKs' default delay).
    pub trace_export_every: Duration,
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
            grpc_first_bytes_within: Duration::from_secs(10),
            grpc_keepalive_every: Duration::from_secs(60),
            grpc_keepalive_timeout: Duration::from_secs(20),
            breaker_open_for: Duration::from_millis(250),
            shutdown_grace: Duration::from_secs(10),
            close_notice: Duration::from_secs(1),
            trace_export_every: Duration::from_secs(5),
        }
    }
}

impl Timings {
    /// Every interval divided by `divisor` (1 changes nothing).
    pub fn divided_by(self, divisor: u32) -> Timings {
        let divisor = divisor.max(1);
        Timings {
            heartbeat_every: self.heartbeat_every / divisor,
            instance_ttl: self.instance_ttl / divisor,
            reset_ping_every: self.reset_ping_every / divisor,
            reset_first_backoff: self.reset_first_backoff / divisor,
            reset_max_backoff: self.reset_max_backoff / divisor,
            sentinel_poll_every: self.sentinel_poll_every / divisor,
            sentinel_min_gap: self.sentinel_min_gap / divisor,
            watch_every: self.watch_every / divisor,
            grpc_health_every: self.grpc_health_every / divisor,
            grpc_first_bytes_within: self.grpc_first_bytes_within / divisor,
            grpc_keepalive_every: self.grpc_keepalive_every / divisor,
            grpc_keepalive_timeout: self.grpc_keepalive_timeout / divisor,
            breaker_open_for: self.breaker_open_for / divisor,
            shutdown_grace: self.shutdown_grace / divisor,
            close_notice: self.close_notice / divisor,
            trace_export_every: self.trace_export_every / divisor,
        }
    }

    /// The timings for a value of [`TEST_SCALE_ENV`]. Anything but a whole number from 1 to
    /// [`MAX_TEST_SCALE`] is refused.
    pub fn for_test_scale(text: &str) -> Result<Timings, String> {
        let divisor = Some(text)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<u32>().ok())
            .filter(|d| (1..=MAX_TEST_SCALE).contains(d))
            .ok_or_else(|| {
                format!(
                    "must be a whole number from 1 to {MAX_TEST_SCALE} (a testing-only divisor \
                     of the background intervals), not {text:?}"
                )
            })?;
        Ok(Timings::default().divided_by(divisor))
    }

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
    fn one_is_production_and_the_servers_wait_nine_seconds_after_the_notice() {
        assert_eq!(Timings::for_test_scale("1"), Ok(Timings::default()));
        assert_eq!(Timings::default().after_notice(), Duration::from_secs(9));
    }

    #[test]
    fn a_divisor_shortens_every_interval_alike() {
        let short = Timings::for_test_scale("10").unwrap();
        assert_eq!(short.heartbeat_every, Duration::from_millis(200));
        assert_eq!(short.instance_ttl, Duration::from_millis(600));
        assert_eq!(short.reset_ping_every, Duration::from_millis(500));
        assert_eq!(short.breaker_open_for, Duration::from_millis(25));
        assert_eq!(short.after_notice(), Duration::from_millis(900));
        assert_eq!(short, Timings::default().divided_by(10));
    }

    #[test]
    fn the_largest_divisor_leaves_no_interval_zero() {
        let shortest = Timings::for_test_scale(&MAX_TEST_SCALE.to_string()).unwrap();
        let every = [
            shortest.heartbeat_every,
            shortest.instance_ttl,
            shortest.reset_ping_every,
            shortest.reset_first_backoff,
            shortest.reset_max_backoff,
            shortest.sentinel_poll_every,
            shortest.sentinel_min_gap,
            shortest.watch_every,
            shortest.grpc_health_every,
            shortest.grpc_first_bytes_within,
            shortest.grpc_keepalive_every,
            shortest.grpc_keepalive_timeout,
            shortest.breaker_open_for,
            shortest.shutdown_grace,
            shortest.close_notice,
        ];
        assert!(every.iter().all(|d| *d >= Duration::from_millis(1)));
    }

    #[test]
    fn anything_but_a_whole_number_in_range_is_refused() {
        for bad in [
            "",
            "0",
            "101",
            "-1",
            "+5",
            " 5",
            "5 ",
            "2.5",
            "ten",
            "99999999999",
        ] {
            let refused = Timings::for_test_scale(bad).unwrap_err();
            assert!(refused.contains("from 1 to 100"), "{bad:?}: {refused}");
        }
    }
}
