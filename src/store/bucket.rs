//! The token-bucket arithmetic, the Rust twin of `lua/token_bucket.lua`. Pure functions of
//! state and time, so they are tested with an injected clock.

use super::{BucketOutcome, BucketRequest};

/// A stored bucket: `tokens` as of `ts_us` (microseconds on the store's clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub tokens: f64,
    pub ts_us: u64,
}

impl Bucket {
    /// When this bucket is full again; from then on it is indistinguishable from an absent
    /// one and may be dropped. The memory store drops it then; `lua/token_bucket.lua` has
    /// Redis delete the key in the millisecond after.
    pub fn full_at_us(&self, rate: f64, burst: f64) -> u64 {
        let missing = (burst - self.tokens).max(0.0);
        self.ts_us
            .saturating_add((missing / rate * 1_000_000.0).ceil().min(u64::MAX as f64) as u64)
    }
}

/// Tokens available at `now_us`: absent means full; refill at `rate`, capped at `burst`; a
/// clock that went backwards counts as no time passing.
pub fn refilled(stored: Option<Bucket>, now_us: u64, rate: f64, burst: f64) -> f64 {
    match stored {
        None => burst,
        Some(bucket) => {
            let elapsed_s = now_us.saturating_sub(bucket.ts_us) as f64 / 1_000_000.0;
            (bucket.tokens + elapsed_s * rate).min(burst)
        }
    }
}

/// Decides `requests` against their current states, all-or-nothing, and writes the new states
/// back into `states` (same order). Mirrors the Lua script step for step.
pub fn decide(
    requests: &[BucketRequest],
    states: &mut [Option<Bucket>],
    now_us: u64,
) -> (bool, Vec<BucketOutcome>) {
    let mut outcomes: Vec<BucketOutcome> = requests
        .iter()
        .zip(states.iter())
        .map(|(request, state)| {
            let tokens = refilled(*state, now_us, request.rate, request.burst);
            BucketOutcome {
                tokens,
                enough: tokens >= request.cost as f64,
            }
        })
        .collect();
    let allowed = requests
        .iter()
        .zip(&outcomes)
        .all(|(request, outcome)| outcome.enough || request.shadow);
    for ((request, outcome), state) in requests.iter().zip(&mut outcomes).zip(states.iter_mut()) {
        if allowed && outcome.enough {
            outcome.tokens -= request.cost as f64;
        }
        *state = Some(Bucket {
            tokens: outcome.tokens,
            ts_us: now_us,
        });
    }
    (allowed, outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(rate: f64, burst: f64, cost: u64) -> BucketRequest {
        BucketRequest {
            key: "k".into(),
            rate,
            burst,
            cost,
            shadow: false,
            limit: 0,
        }
    }

    const SECOND: u64 = 1_000_000;

    /// (stored tokens, age of the stored state in µs (negative: in the future), rate, burst,
    /// cost) → (allowed, tokens after).
    #[allow(clippy::type_complexity)]
    const CASES: &[(&str, Option<(f64, i64)>, f64, f64, u64, bool, f64)] = &[
        ("absent bucket is full", None, 10.0, 5.0, 1, true, 4.0),
        (
            "refill over one second",
            Some((0.0, 1_000_000)),
            2.0,
            5.0,
            1,
            true,
            1.0,
        ),
        (
            "refill is capped at burst",
            Some((1.0, 3_600_000_000)),
            2.0,
            5.0,
            1,
            true,
            4.0,
        ),
        (
            "fractional rate: 0.5/s after 1s is not enough",
            Some((0.0, 1_000_000)),
            0.5,
            1.0,
            1,
            false,
            0.5,
        ),
        (
            "fractional rate: 0.5/s after 2s is enough",
            Some((0.0, 2_000_000)),
            0.5,
            1.0,
            1,
            true,
            0.0,
        ),
        (
            "cost above one takes several tokens",
            Some((5.0, 0)),
            1.0,
            5.0,
            3,
            true,
            2.0,
        ),
        (
            "cost above the tokens left denies and keeps them",
            Some((2.0, 0)),
            1.0,
            5.0,
            3,
            false,
            2.0,
        ),
        (
            "cost above burst never passes",
            None,
            1.0,
            5.0,
            6,
            false,
            5.0,
        ),
        (
            "clock going backwards adds nothing",
            Some((1.0, -5_000_000)),
            100.0,
            5.0,
            1,
            true,
            0.0,
        ),
    ];

    #[test]
    fn bucket_arithmetic_table() {
        let now = 10_000 * SECOND;
        for &(name, stored, rate, burst, cost, allowed, after) in CASES {
            let mut states = [stored.map(|(tokens, age)| Bucket {
                tokens,
                ts_us: (now as i64 - age) as u64,
            })];
            let (ok, outcomes) = decide(&[request(rate, burst, cost)], &mut states, now);
            assert_eq!(ok, allowed, "{name}: allowed");
            assert!(
                (outcomes[0].tokens - after).abs() < 1e-9,
                "{name}: tokens {}",
                outcomes[0].tokens
            );
            assert_eq!(
                states[0].map(|b| b.ts_us),
                Some(now),
                "{name}: ts persisted"
            );
        }
    }

    #[test]
    fn one_denying_bucket_charges_none() {
        let reqs = [request(1.0, 5.0, 1), request(1.0, 5.0, 1)];
        let mut states = [
            None,
            Some(Bucket {
                tokens: 0.0,
                ts_us: 0,
            }),
        ];
        let (ok, outcomes) = decide(&reqs, &mut states, 0);
        assert!(!ok);
        assert_eq!(outcomes[0].tokens, 5.0);
        assert!(outcomes[0].enough && !outcomes[1].enough);
    }

    #[test]
    fn a_shadow_bucket_never_denies() {
        let mut shadow = request(1.0, 5.0, 1);
        shadow.shadow = true;
        let reqs = [request(1.0, 5.0, 1), shadow];
        let mut states = [
            None,
            Some(Bucket {
                tokens: 0.0,
                ts_us: 0,
            }),
        ];
        let (ok, outcomes) = decide(&reqs, &mut states, 0);
        assert!(ok);
        assert_eq!(outcomes[0].tokens, 4.0);
        assert!(!outcomes[1].enough);
    }

    #[test]
    fn full_at_is_when_the_bucket_refills() {
        let bucket = Bucket {
            tokens: 1.0,
            ts_us: 10 * SECOND,
        };
        assert_eq!(bucket.full_at_us(2.0, 5.0), 12 * SECOND);
    }
}
