//! The paced loads' schedule (`regions_load`, `rlqs_load`): requests sent on a plan of
//! `(from, to, rate)` segments, in seconds since the start; the n-th of a segment is due at
//! `from + n / rate`, and one that falls behind goes at once rather than being skipped.

use std::time::{Duration, Instant};

/// Calls `send` once per request of `plan`, each when it is due, with the moment it went (in
/// seconds since `start`).
pub fn paced(plan: &[(f64, f64, f64)], start: Instant, mut send: impl FnMut(f64)) {
    for &(from, to, rate) in plan {
        let mut sent = 0u64;
        loop {
            let at = from + sent as f64 / rate;
            if at >= to {
                break;
            }
            let due = start + Duration::from_secs_f64(at);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            sent += 1;
            send(
                Instant::now()
                    .saturating_duration_since(start)
                    .as_secs_f64(),
            );
        }
    }
}
