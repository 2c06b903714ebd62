//! Time as a parameter: everything that measures elapsed time (the memory store, the circuit
//! breaker, the deny cache) reads a [`Clock`], so tests advance a [`ManualClock`] instead of
//! sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A monotonic time source, in microseconds since an arbitrary origin.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> u64;
}

/// Monotonic time since the clock was created: immune to wall-clock steps.
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to.
#[derive(Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn advance_ms(&self, ms: u64) {
        self.advance_us(ms * 1000);
    }

    pub fn advance_us(&self, us: u64) {
        self.0.fetch_add(us, Ordering::SeqCst);
    }

    pub fn set_us(&self, us: u64) {
        self.0.store(us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_us(&self) -> u64 {
        (**self).now_us()
    }
}
