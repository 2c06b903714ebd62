//! The token-bucket and quota arithmetic, the Rust twin of `lua/token_bucket.lua` and
//! `lua/report.lua`. Pure functions of state and time, so they are tested with an injected
//! clock. Time is microseconds on the store's clock; quotas read it as Unix time (UTC).
use super::{BucketOutcome, BucketRequest, Lease, Meter, Period, ReportCharge, Window};
use crate::base::rate::count_f64;

/// A stored key. A bucket: `tokens` as of `ts_us`. A quota: `tokens` counts what was used in
/// the period that starts at `ts_us`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub tokens: f64,
    pub ts_us: u64,
}

const MICROS: u64 = 1_000_000;

/// A quota at `now_us`: what was used in the current period, the period's start (µs) and
/// where the period stands. A count from an earlier period is void.
fn quota_now(stored: Option<Bucket>, period: Period, now_us: u64) -> (f64, u64, Window) {
    let now_s = (now_us / MICROS) as i64;
    let (start, end) = period.bounds(now_s);
    let start_us = u64::try_from(start).unwrap_or(0) * MICROS;
    let used = match stored {
        Some(quota) if quota.ts_us == start_us => quota.tokens,
        _ => 0.0,
    };
    let window = Window {
        ends_in_s: u64::try_from(end - now_s).unwrap_or(0),
        length_s: u64::try_from(end - start).unwrap_or(0),
    };
    (used, start_us, window)
}

/// Whether a key holding `level` can pay `cost`; a cost of 0 asks only that it is not used up.
pub fn can_pay(level: f64, cost: u64) -> bool {
    level >= count_f64(cost) && level > 0.0
}

impl Bucket {
    /// When this key may be dropped: a bucket once full again (then it is indistinguishable
    /// from an absent one), a quota when its period ends.
    pub fn forget_at_us(&self, request: &BucketRequest) -> u64 {
        match request.meter {
            Meter::Bucket => self.full_at_us(request.rate, request.burst),
            Meter::Quota(period) => {
                let (_, end) = period.bounds((self.ts_us / MICROS) as i64);
                u64::try_from(end).unwrap_or(0) * MICROS
            }
            Meter::Lease(lease) => self.ts_us.saturating_add(lease.ttl_ms * 1000),
        }
    }

    /// When this bucket is full again; from then on it is indistinguishable from an absent
    /// one and may be dropped. The memory store drops it then; `lua/token_bucket.lua` has
    /// Redis delete the key in the millisecond after.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "the wait is >= 0 and `as` saturates: a bucket that never refills is kept for good"
    )]
    pub fn full_at_us(&self, rate: f64, burst: f64) -> u64 {
        let missing = (burst - self.tokens).max(0.0);
        let wait_us = (missing / rate * 1_000_000.0).ceil();
        self.ts_us.saturating_add(wait_us as u64)
    }
}

/// Tokens available at `now_us`: absent means full; refill at `rate`, capped at `burst`; a
/// clock that went backwards counts as no time passing.
#[expect(
    clippy::cast_precision_loss,
    reason = "microseconds since 1970 stay below 2^53 (until the year 2255), exact in f64"
)]
pub fn refilled(stored: Option<Bucket>, now_us: u64, rate: f64, burst: f64) -> f64 {
    match stored {
        None => burst,
        Some(bucket) => {
            let elapsed_s = now_us.saturating_sub(bucket.ts_us) as f64 / 1_000_000.0;
            (bucket.tokens + elapsed_s * rate).min(burst)
        }
    }
}

/// A concurrency key's window as the headers show it: a slot frees whenever a holder releases,
/// which no store can foresee, so a denial asks to retry in 1 s; the policy's window is the
/// lease's lifetime.
pub fn lease_window(lease: Lease) -> Window {
    Window {
        ends_in_s: 1,
        length_s: lease.ttl_ms.div_ceil(1000),
    }
}

/// The free slots of a concurrency key whose state the store counted as `stored` (its
/// `tokens` the slots free now; absent: all free).
fn lease_level(stored: Option<Bucket>, burst: f64) -> f64 {
    stored.map_or(burst, |state| state.tokens)
}

/// A key as a check would find it at `now_us`, before any charge: a bucket's tokens refilled,
/// a quota's remainder and window; `enough` says whether `request.cost` could be paid. Nothing
/// is written. Mirrors `lua/peek.lua`.
pub fn peek(request: &BucketRequest, stored: Option<Bucket>, now_us: u64) -> BucketOutcome {
    let (tokens, window) = match request.meter {
        Meter::Bucket => (refilled(stored, now_us, request.rate, request.burst), None),
        Meter::Quota(period) => {
            let (used, _, window) = quota_now(stored, period, now_us);
            (request.burst - used, Some(window))
        }
        Meter::Lease(lease) => (
            lease_level(stored, request.burst),
            Some(lease_window(lease)),
        ),
    };
    BucketOutcome {
        tokens,
        enough: can_pay(tokens, request.cost),
        window,
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
            let (tokens, window) = match request.meter {
                Meter::Bucket => (refilled(*state, now_us, request.rate, request.burst), None),
                Meter::Quota(period) => {
                    let (used, _, window) = quota_now(*state, period, now_us);
                    (request.burst - used, Some(window))
                }
                Meter::Lease(lease) => (
                    lease_level(*state, request.burst),
                    Some(lease_window(lease)),
                ),
            };
            BucketOutcome {
                tokens,
                enough: can_pay(tokens, request.cost),
                window,
            }
        })
        .collect();
    let allowed = requests
        .iter()
        .zip(&outcomes)
        .all(|(request, outcome)| outcome.enough || request.shadow);
    for ((request, outcome), state) in requests.iter().zip(&mut outcomes).zip(states.iter_mut()) {
        if allowed && outcome.enough {
            outcome.tokens -= count_f64(request.cost);
        }
        *state = Some(match request.meter {
            Meter::Bucket => Bucket {
                tokens: outcome.tokens,
                ts_us: now_us,
            },
            Meter::Quota(period) => Bucket {
                tokens: request.burst - outcome.tokens,
                ts_us: quota_now(None, period, now_us).1,
            },
            // The slots left; the store adds the lease to its set when one was taken.
            Meter::Lease(_) => Bucket {
                tokens: outcome.tokens,
                ts_us: now_us,
            },
        });
    }
    (allowed, outcomes)
}

/// Applies one report to a key's state: a bucket is charged down to `-max_debt` at most (a
/// deeper debt that is already there stays, nothing is given back); a quota counts the whole
/// cost. Mirrors `lua/report.lua`.
pub fn report(charge: &ReportCharge, state: &mut Option<Bucket>, now_us: u64) -> BucketOutcome {
    let request = &charge.bucket;
    let cost = count_f64(request.cost);
    match request.meter {
        Meter::Bucket => {
            let level = refilled(*state, now_us, request.rate, request.burst);
            let tokens = (level - cost).max(level.min(-charge.max_debt));
            *state = Some(Bucket {
                tokens,
                ts_us: now_us,
            });
            BucketOutcome {
                tokens,
                enough: tokens > 0.0,
                window: None,
            }
        }
        Meter::Quota(period) => {
            let (used, start_us, window) = quota_now(*state, period, now_us);
            let used = used + cost;
            *state = Some(Bucket {
                tokens: used,
                ts_us: start_us,
            });
            let tokens = request.burst - used;
            BucketOutcome {
                tokens,
                enough: tokens > 0.0,
                window: Some(window),
            }
        }
        // Never reported (a concurrency limit is charged by /check only): nothing changes.
        Meter::Lease(lease) => {
            let tokens = lease_level(*state, request.burst);
            BucketOutcome {
                tokens,
                enough: tokens > 0.0,
                window: Some(lease_window(lease)),
            }
        }
    }
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
            meter: Meter::Bucket,
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
                ts_us: now.saturating_add_signed(-age),
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
    fn a_peek_finds_what_the_next_decision_finds_and_writes_nothing() {
        let now = 10_000 * SECOND;
        for &(name, stored, rate, burst, cost, allowed, after) in CASES {
            let stored = stored.map(|(tokens, age)| Bucket {
                tokens,
                ts_us: now.saturating_add_signed(-age),
            });
            let request = request(rate, burst, cost);
            let peeked = peek(&request, stored, now);
            assert_eq!(peeked.enough, allowed, "{name}: enough");
            let charged = if allowed { count_f64(cost) } else { 0.0 };
            assert!(
                (peeked.tokens - charged - after).abs() < 1e-9,
                "{name}: peeked {}",
                peeked.tokens
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
