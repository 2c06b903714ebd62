//! The token-bucket and quota arithmetic, the Rust twin of `lua/token_bucket.lua` and
//! `lua/report.lua`. Pure functions of state and time, so they are tested with an injected
//! clock. Time is microseconds on the store's clock; quotas read it as Unix time (UTC).
//!
//! A bucket is kept as how far it is below full, its debt, in whole micro-tokens: `tokens =
//! burst - debt`, so new numbers for a key (an override, a reload) apply at once to what it
//! owes. The arithmetic is the script's, operation for operation, so both stores reach the same
//! integers.
use super::{BucketOutcome, BucketRequest, Meter, Period, ReportCharge, Settle, Window};
use crate::base::rate::count_f64;

/// A stored key. A bucket: its `debt` in micro-tokens as of `ts_us`. A quota: `debt` counts
/// what was used in the period that starts at `ts_us`. A concurrency key, as the store counted
/// it at `ts_us`: `debt` is the leases held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub debt: u64,
    pub ts_us: u64,
}

const MICROS: u64 = 1_000_000;
/// Micro-tokens per token.
const MICRO: f64 = 1_000_000.0;

/// A whole number of tokens in micro-tokens (exact: bursts and costs are at most 10^9 + 1).
fn micro(count: f64) -> f64 {
    count * MICRO
}

/// Tokens from micro-tokens, the quotient the Redis store computes from the scripts' levels.
fn tokens_of(micro_tokens: f64) -> f64 {
    micro_tokens / MICRO
}

/// A quota at `now_us`: what was used in the current period, the period's start (µs) and
/// where the period stands. A count from an earlier period is void.
#[expect(
    clippy::cast_precision_loss,
    reason = "a quota's count stays far below 2^53"
)]
fn quota_now(stored: Option<Bucket>, period: Period, now_us: u64) -> (f64, u64, Window) {
    let now_s = (now_us / MICROS) as i64;
    let (start, end) = period.bounds(now_s);
    let start_us = u64::try_from(start).unwrap_or(0) * MICROS;
    let used = match stored {
        Some(quota) if quota.ts_us == start_us => quota.debt as f64,
        _ => 0.0,
    };
    let window = Window {
        ends_in_s: u64::try_from(end - now_s).unwrap_or(0),
        length_s: u64::try_from(end - start).unwrap_or(0),
    };
    (used, start_us, window)
}

/// Whether a key holding `level` can pay `cost`. A cost of 0 (a look) asks that one whole
/// request is left: a refilling bucket holds a sliver above 0 almost always, which admits
/// nothing.
pub fn can_pay(level: f64, cost: u64) -> bool {
    level >= count_f64(cost.max(1))
}

impl Bucket {
    /// When this key may be dropped: a bucket once full again (then it is indistinguishable
    /// from an absent one), a quota when its period ends.
    pub fn forget_at_us(&self, request: &BucketRequest) -> u64 {
        match request.meter {
            Meter::Bucket | Meter::Reserve(_) | Meter::Borrow(_) => self.full_at_us(request.rate),
            Meter::Quota(period) => {
                let (_, end) = period.bounds((self.ts_us / MICROS) as i64);
                u64::try_from(end).unwrap_or(0) * MICROS
            }
            Meter::Concurrency(lease) => self.ts_us.saturating_add(lease.ttl_ms * 1000),
        }
    }

    /// When this bucket is full again (its debt refilled at `rate`); from then on it is
    /// indistinguishable from an absent one and may be dropped. The memory store drops it
    /// then; `lua/token_bucket.lua` has Redis delete the key in the millisecond after.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a debt is below 2^53; the wait is >= 0 and `as` saturates: a bucket that \
                  never refills is kept for good"
    )]
    pub fn full_at_us(&self, rate: f64) -> u64 {
        let wait_us = (self.debt as f64 / rate).ceil();
        self.ts_us.saturating_add(wait_us as u64)
    }
}

/// The debt of `stored` at `now_us`, in micro-tokens: lowered by the whole micro-tokens
/// refilled at `rate` since it was written (rounded down, as the script does), never below 0;
/// a clock that went backwards counts as no time passing. Absent: 0 (full).
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "debts and microseconds since 1970 stay below 2^53, exact in f64; the result is \
              an integer in 0..=debt"
)]
pub fn debt_now(stored: Option<Bucket>, now_us: u64, rate: f64) -> u64 {
    match stored {
        None => 0,
        Some(bucket) if bucket.debt == 0 => 0,
        Some(bucket) => {
            let elapsed = now_us.saturating_sub(bucket.ts_us) as f64;
            let refill = (elapsed * rate).floor();
            (bucket.debt as f64 - refill).max(0.0) as u64
        }
    }
}

/// Tokens available at `now_us`: `burst` less the debt refilled at `rate`; absent means full.
/// Below 0 for a bucket in debt, or one whose burst was lowered since it was charged.
#[expect(
    clippy::cast_precision_loss,
    reason = "a debt stays below 2^53, exact in f64"
)]
pub fn refilled(stored: Option<Bucket>, now_us: u64, rate: f64, burst: f64) -> f64 {
    tokens_of(micro(burst) - debt_now(stored, now_us, rate) as f64)
}

/// A bucket's level in micro-tokens, and whether it can pay `cost` (compared in micro-tokens,
/// exactly as the script compares).
#[expect(
    clippy::cast_precision_loss,
    reason = "a debt stays below 2^53, exact in f64"
)]
fn bucket_level(request: &BucketRequest, debt: u64) -> (f64, bool) {
    let level = micro(request.burst) - debt as f64;
    let cost = micro(count_f64(request.cost.max(1)));
    (level, level >= cost)
}

/// The free slots of a concurrency key whose leases the store counted as `stored` (absent:
/// all free).
#[expect(clippy::cast_precision_loss, reason = "leases held are at most 10^9")]
fn lease_level(stored: Option<Bucket>, burst: f64) -> f64 {
    stored.map_or(burst, |state| burst - state.debt as f64)
}

/// A key as a check finds it at `now_us`, before any charge: a bucket's tokens (and its debt
/// now), or a quota's remainder and window; `enough` says whether `request.cost` could be paid.
fn find(request: &BucketRequest, stored: Option<Bucket>, now_us: u64) -> (BucketOutcome, u64) {
    match request.meter {
        Meter::Bucket | Meter::Reserve(_) | Meter::Borrow(_) => {
            let debt = debt_now(stored, now_us, request.rate);
            let (level, enough) = bucket_level(request, debt);
            let outcome = BucketOutcome {
                tokens: tokens_of(level),
                enough,
                window: None,
            };
            (outcome, debt)
        }
        Meter::Quota(period) => {
            let (used, _, window) = quota_now(stored, period, now_us);
            let tokens = request.burst - used;
            let outcome = BucketOutcome {
                tokens,
                enough: can_pay(tokens, request.cost),
                window: Some(window),
            };
            (outcome, 0)
        }
        Meter::Concurrency(lease) => {
            let tokens = lease_level(stored, request.burst);
            let outcome = BucketOutcome {
                tokens,
                enough: can_pay(tokens, request.cost),
                window: Some(lease.window()),
            };
            (outcome, 0)
        }
    }
}

/// A key as a check would find it at `now_us`, before any charge: a bucket's tokens refilled,
/// a quota's remainder and window; `enough` says whether `request.cost` could be paid. Nothing
/// is written. Mirrors `lua/peek.lua`.
pub fn peek(request: &BucketRequest, stored: Option<Bucket>, now_us: u64) -> BucketOutcome {
    find(request, stored, now_us).0
}

/// Decides `requests` against their current states, all-or-nothing, and writes the new states
/// back into `states` (same order). Mirrors the Lua script step for step: only a charge writes
/// (a denial or a cost of 0 leaves the state as it was).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a debt plus a cost in micro-tokens stays below 2^53"
)]
pub fn decide(
    requests: &[BucketRequest],
    states: &mut [Option<Bucket>],
    now_us: u64,
) -> (bool, Vec<BucketOutcome>) {
    let found: Vec<(BucketOutcome, u64)> = requests
        .iter()
        .zip(states.iter())
        .map(|(request, state)| find(request, *state, now_us))
        .collect();
    let allowed = requests
        .iter()
        .zip(&found)
        .all(|(request, (outcome, _))| outcome.enough || request.shadow);
    let mut outcomes = Vec::with_capacity(found.len());
    for ((request, (mut outcome, debt)), state) in requests.iter().zip(found).zip(states.iter_mut())
    {
        if allowed && outcome.enough && request.cost > 0 {
            match request.meter {
                // A reservation's record is the store's to write (it knows the id).
                Meter::Bucket | Meter::Reserve(_) | Meter::Borrow(_) => {
                    let cost = micro(count_f64(request.cost));
                    let (level, _) = bucket_level(request, debt);
                    outcome.tokens = tokens_of(level - cost);
                    *state = Some(Bucket {
                        debt: debt.saturating_add(cost as u64),
                        ts_us: now_us,
                    });
                }
                Meter::Quota(period) => {
                    outcome.tokens -= count_f64(request.cost);
                    *state = Some(Bucket {
                        debt: (request.burst - outcome.tokens) as u64,
                        ts_us: quota_now(None, period, now_us).1,
                    });
                }
                // The store adds the lease to its set itself (it knows the lease's id).
                Meter::Concurrency(_) => outcome.tokens -= count_f64(request.cost),
            }
        }
        outcomes.push(outcome);
    }
    (allowed, outcomes)
}

/// Applies one report to a key's state: a bucket is charged down to `-max_debt` at most (a
/// deeper debt that is already there stays, nothing is given back); a quota counts the whole
/// cost. Mirrors `lua/report.lua`.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "quota counts stay below 2^53"
)]
pub fn report(charge: &ReportCharge, state: &mut Option<Bucket>, now_us: u64) -> BucketOutcome {
    let request = &charge.bucket;
    match request.meter {
        Meter::Bucket | Meter::Reserve(_) | Meter::Borrow(_) => {
            let debt = debt_now(*state, now_us, request.rate);
            let charged = charged_debt(debt, request, request.cost, charge.max_debt);
            write_debt(state, debt, charged, now_us);
            bucket_outcome(request, charged)
        }
        Meter::Quota(period) => {
            let (used, start_us, window) = quota_now(*state, period, now_us);
            let used = used + count_f64(request.cost);
            *state = Some(Bucket {
                debt: used as u64,
                ts_us: start_us,
            });
            let tokens = request.burst - used;
            BucketOutcome {
                tokens,
                enough: tokens >= 1.0,
                window: Some(window),
            }
        }
        // Never reported (a concurrency limit is charged by /check only): nothing changes.
        Meter::Concurrency(lease) => {
            let tokens = lease_level(*state, request.burst);
            BucketOutcome {
                tokens,
                enough: tokens >= 1.0,
                window: Some(lease.window()),
            }
        }
    }
}

/// `debt` charged `cost` more, down to `-max_debt` at most (a deeper debt already there
/// stays: nothing is given back).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "debts in micro-tokens stay below 2^53"
)]
fn charged_debt(debt: u64, request: &BucketRequest, cost: u64, max_debt: f64) -> u64 {
    let deepest = micro(request.burst + max_debt);
    let mut charged = debt as f64 + micro(count_f64(cost));
    if charged > deepest {
        charged = deepest.max(debt as f64);
    }
    charged as u64
}

/// Stores `new` as the debt at `now_us` when it differs from `old` (the debt refilled to now).
fn write_debt(state: &mut Option<Bucket>, old: u64, new: u64, now_us: u64) {
    if new != old {
        *state = Some(Bucket {
            debt: new,
            ts_us: now_us,
        });
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "a debt stays below 2^53, exact in f64"
)]
fn bucket_outcome(request: &BucketRequest, debt: u64) -> BucketOutcome {
    let tokens = tokens_of(micro(request.burst) - debt as f64);
    BucketOutcome {
        tokens,
        enough: tokens >= 1.0,
        window: None,
    }
}

/// Gives back `tokens` to a bucket at `now_us` (reservations settled below their estimate, or
/// expired under `refund`): its debt goes down, never below 0 (a bucket never holds more than
/// its burst). Mirrors `give_back` in `lua/bounds.lua`.
pub fn give_back(state: &mut Option<Bucket>, tokens: u64, now_us: u64, rate: f64) {
    if tokens == 0 {
        return;
    }
    let debt = debt_now(*state, now_us, rate);
    let lowered = debt.saturating_sub(tokens.saturating_mul(MICROS));
    write_debt(state, debt, lowered, now_us);
}

/// Settles a reservation that was `held` (else changes nothing): the actual cost replaces the
/// estimate, the difference given back or charged down to `-max_debt` at most. Mirrors
/// `lua/settle.lua`.
pub fn settle(
    settle: &Settle,
    held: bool,
    state: &mut Option<Bucket>,
    now_us: u64,
) -> BucketOutcome {
    let request = &settle.bucket;
    let actual = request.cost;
    if held && actual < settle.estimate {
        give_back(state, settle.estimate - actual, now_us, request.rate);
    } else if held && actual > settle.estimate {
        let debt = debt_now(*state, now_us, request.rate);
        let charged = charged_debt(debt, request, actual - settle.estimate, settle.max_debt);
        write_debt(state, debt, charged, now_us);
    }
    bucket_outcome(request, debt_now(*state, now_us, request.rate))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(rate: f64, burst: f64, cost: u64) -> BucketRequest {
        BucketRequest::bucket("k", rate, burst).cost(cost)
    }

    const SECOND: u64 = 1_000_000;

    /// A bucket holding `tokens` of `burst`, written `age` µs before `now`.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn stored_at(burst: f64, tokens: f64, now: u64, age: i64) -> Bucket {
        Bucket {
            debt: ((burst - tokens) * 1e6) as u64,
            ts_us: now.saturating_add_signed(-age),
        }
    }

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
            let mut states = [stored.map(|(tokens, age)| stored_at(burst, tokens, now, age))];
            let (ok, outcomes) = decide(&[request(rate, burst, cost)], &mut states, now);
            assert_eq!(ok, allowed, "{name}: allowed");
            assert!(
                (outcomes[0].tokens - after).abs() < 1e-9,
                "{name}: tokens {}",
                outcomes[0].tokens
            );
            if allowed {
                assert_eq!(
                    states[0].map(|b| b.ts_us),
                    Some(now),
                    "{name}: ts persisted"
                );
            }
        }
    }

    #[test]
    fn a_peek_finds_what_the_next_decision_finds_and_writes_nothing() {
        let now = 10_000 * SECOND;
        for &(name, stored, rate, burst, cost, allowed, after) in CASES {
            let stored = stored.map(|(tokens, age)| stored_at(burst, tokens, now, age));
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
                debt: 5 * MICROS,
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
                debt: 5 * MICROS,
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
            debt: 4 * MICROS,
            ts_us: 10 * SECOND,
        };
        assert_eq!(bucket.full_at_us(2.0), 12 * SECOND);
    }
}

#[cfg(test)]
mod debt_tests {
    use super::*;

    fn request(rate: f64, burst: f64, cost: u64) -> BucketRequest {
        BucketRequest::bucket("k", rate, burst).cost(cost)
    }

    #[test]
    fn a_raised_burst_grants_the_difference_at_once() {
        let mut states = [None];
        for _ in 0..3 {
            assert!(decide(&[request(0.001, 3.0, 1)], &mut states, 0).0);
        }
        assert!(!decide(&[request(0.001, 3.0, 1)], &mut states, 0).0);
        // Burst 3 -> 10 with the same debt of 3: 7 more now.
        let admitted = (0..10)
            .filter(|_| decide(&[request(0.001, 10.0, 1)], &mut states, 0).0)
            .count();
        assert_eq!(admitted, 7);
    }

    #[test]
    fn a_lowered_burst_binds_at_the_next_check() {
        let mut states = [None];
        for _ in 0..2 {
            assert!(decide(&[request(0.001, 10.0, 1)], &mut states, 0).0);
        }
        // Debt 2 of a burst lowered to 3: one more, then denied.
        let (ok, outcomes) = decide(&[request(0.001, 3.0, 1)], &mut states, 0);
        assert!(ok);
        assert_eq!(outcomes[0].tokens, 0.0);
        assert!(!decide(&[request(0.001, 3.0, 1)], &mut states, 0).0);
    }

    #[test]
    fn a_denial_writes_nothing_so_no_refill_is_rounded_away() {
        // 1 token per hour: 0.83 micro-tokens per 3 ms. Checked every 3 ms, a write per check
        // would round each refill down to nothing and the bucket would never refill.
        let rate = 1.0 / 3600.0;
        let mut states = [None];
        assert!(decide(&[request(rate, 1.0, 1)], &mut states, 0).0);
        let mut now = 0;
        let mut admitted = 0;
        while now <= 3_600 * SECOND_US {
            now += 3_000;
            if decide(&[request(rate, 1.0, 1)], &mut states, now).0 {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 1, "refilled once in the hour");
    }

    const SECOND_US: u64 = 1_000_000;
}
