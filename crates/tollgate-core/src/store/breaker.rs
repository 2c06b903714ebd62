//! A circuit breaker in front of the store. After [`FAILURE_THRESHOLD`] consecutive failures it
//! opens: calls fail at once (no waiting on a dead Redis) for `breaker_open_for` (see
//! [`Timings`](crate::base::timings::Timings)); then one call is let through as a probe
//! (half-open). A success closes it; a failure reopens it. Each transition is
//! logged once and mirrored in `tollgate_store_up`.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use prometheus::IntGauge;

use std::sync::Arc;

use crate::base::clock::{Clock, MonotonicClock};

/// Consecutive failures that open the breaker.
pub const FAILURE_THRESHOLD: u32 = 3;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// What the breaker lets a caller do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Call the store.
    Call,
    /// Call the store as the single recovery probe.
    Probe,
    /// Do not call; answer as if the store failed.
    Reject,
}

pub struct Breaker {
    state: AtomicU8,
    failures: AtomicU32,
    reopen_at_us: AtomicU64,
    /// How long an open breaker rejects calls before probing. Short, so recovery is quick.
    open_for_us: u64,
    clock: Arc<dyn Clock>,
    up: IntGauge,
    name: &'static str,
}

impl Breaker {
    /// A breaker that stays open for `open_for` before each probe.
    pub fn new(up: IntGauge, name: &'static str, open_for: Duration) -> Breaker {
        Breaker::with_clock(up, name, open_for, Arc::new(MonotonicClock::default()))
    }

    /// A breaker reading `clock` (tests advance a manual one).
    pub fn with_clock(
        up: IntGauge,
        name: &'static str,
        open_for: Duration,
        clock: Arc<dyn Clock>,
    ) -> Breaker {
        up.set(1);
        Breaker {
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            reopen_at_us: AtomicU64::new(0),
            open_for_us: u64::try_from(open_for.as_micros()).unwrap_or(u64::MAX),
            clock,
            up,
            name,
        }
    }

    fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    pub fn admit(&self) -> Admission {
        match self.state.load(Ordering::Acquire) {
            CLOSED => Admission::Call,
            OPEN if self.now_us() >= self.reopen_at_us.load(Ordering::Acquire) => {
                // Exactly one caller wins the probe.
                match self.state.compare_exchange(
                    OPEN,
                    HALF_OPEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => Admission::Probe,
                    Err(_) => Admission::Reject,
                }
            }
            _ => Admission::Reject,
        }
    }

    pub fn on_success(&self) {
        self.failures.store(0, Ordering::Release);
        if self.state.swap(CLOSED, Ordering::AcqRel) != CLOSED {
            self.up.set(1);
            log::info!("{} is answering again: circuit closed", self.name);
        }
    }

    /// Counts a failure, and says what it did to the circuit.
    pub fn on_failure(&self, why: &dyn std::fmt::Display) -> Failure {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let state = self.state.load(Ordering::Acquire);
        let should_open = (state == CLOSED && failures >= FAILURE_THRESHOLD) || state == HALF_OPEN;
        if !should_open {
            return Failure::Counted;
        }
        let opened = self.open();
        if opened == Failure::Opened {
            log::warn!(
                "{} failed {failures} times in a row ({why}): circuit open, answering per on_error",
                self.name
            );
        }
        opened
    }

    /// Opens the circuit at once, whatever the count, for a failure no retry can change until
    /// an operator acts (the store refuses scripts). Probes go on as usual, so the circuit
    /// closes by itself once the store answers again.
    pub fn trip(&self, why: &dyn std::fmt::Display) -> Failure {
        self.failures.store(FAILURE_THRESHOLD, Ordering::Release);
        let opened = self.open();
        if opened == Failure::Opened {
            log::error!("{}: {why}: circuit open, answering per on_error", self.name);
        }
        opened
    }

    /// Opens the circuit until the next probe: `Opened` if it was closed, `ProbeFailed` if a
    /// probe was out.
    fn open(&self) -> Failure {
        self.reopen_at_us.store(
            self.now_us().saturating_add(self.open_for_us),
            Ordering::Release,
        );
        if self.state.swap(OPEN, Ordering::AcqRel) != CLOSED {
            return Failure::ProbeFailed;
        }
        self.up.set(0);
        Failure::Opened
    }
}

/// What one failure did to the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Counted; the circuit stays as it was.
    Counted,
    /// It reached the threshold and opened a closed circuit.
    Opened,
    /// The probe failed and the circuit opened again.
    ProbeFailed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::ManualClock;
    use crate::base::timings::Timings;

    /// The production time open: 250 ms.
    const OPEN_FOR_US: u64 = 250_000;

    fn breaker() -> (Breaker, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::default());
        let up = IntGauge::new("up", "up").unwrap();
        let open_for = Timings::default().breaker_open_for;
        assert_eq!(open_for, Duration::from_micros(OPEN_FOR_US));
        (
            Breaker::with_clock(up, "test store", open_for, clock.clone()),
            clock,
        )
    }

    fn after_open_for(clock: &ManualClock) {
        clock.advance_us(OPEN_FOR_US);
    }

    #[test]
    fn opens_after_consecutive_failures_and_probes_once() {
        let (b, clock) = breaker();
        for i in 1..=FAILURE_THRESHOLD {
            assert_eq!(b.admit(), Admission::Call);
            let expected = if i == FAILURE_THRESHOLD {
                Failure::Opened
            } else {
                Failure::Counted
            };
            assert_eq!(b.on_failure(&"boom"), expected, "opens on the last");
        }
        assert_eq!(b.admit(), Admission::Reject);
        assert_eq!(b.up.get(), 0);
        clock.advance_us(OPEN_FOR_US - 1);
        assert_eq!(
            b.admit(),
            Admission::Reject,
            "still open 1 µs before the end"
        );
        clock.advance_us(1);
        assert_eq!(b.admit(), Admission::Probe);
        assert_eq!(b.admit(), Admission::Reject);
        b.on_success();
        assert_eq!(b.admit(), Admission::Call);
        assert_eq!(b.up.get(), 1);
    }

    #[test]
    fn a_failed_probe_reopens() {
        let (b, clock) = breaker();
        for _ in 0..FAILURE_THRESHOLD {
            b.on_failure(&"boom");
        }
        after_open_for(&clock);
        assert_eq!(b.admit(), Admission::Probe);
        assert_eq!(b.on_failure(&"still down"), Failure::ProbeFailed);
        assert_eq!(b.admit(), Admission::Reject, "a failed probe reopens");
        assert_eq!(b.up.get(), 0);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let (b, _) = breaker();
        b.on_failure(&"x");
        b.on_failure(&"x");
        b.on_success();
        b.on_failure(&"x");
        assert_eq!(b.admit(), Admission::Call);
    }

    #[test]
    fn a_trip_opens_at_once_and_probes_as_usual() {
        let (b, clock) = breaker();
        assert_eq!(b.trip(&"refuses scripts"), Failure::Opened);
        assert_eq!(b.admit(), Admission::Reject);
        assert_eq!(b.up.get(), 0);
        after_open_for(&clock);
        assert_eq!(b.admit(), Admission::Probe);
        assert_eq!(b.trip(&"still refuses"), Failure::ProbeFailed);
        assert_eq!(b.admit(), Admission::Reject);
        after_open_for(&clock);
        assert_eq!(b.admit(), Admission::Probe);
        b.on_success();
        assert_eq!(b.admit(), Admission::Call);
        assert_eq!(b.up.get(), 1);
    }
}
