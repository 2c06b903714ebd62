//! The token-bucket arithmetic the plain, reserving and borrowing buckets share: the Rust
//! twin of `lua/token_bucket.lua` and `lua/report.lua`.
//!
//! A bucket is kept as how far it is below full, its debt, in whole micro-tokens: `tokens =
//! burst - debt`, so new numbers for a key (an override, a reload) apply at once to what it
//! owes. The arithmetic is the script's, operation for operation, so both stores reach the same
//! integers. Time is microseconds on the store's clock.

use serde::Serialize;

use super::twin::Stored;
use super::{BucketOutcome, BucketRequest, ReportCharge};
use crate::base::rate::{ceil_secs, count_f64};

const MICROS: u64 = 1_000_000;
/// Micro-tokens per token: a token bucket's level in a check's reply is in micro-tokens (an
/// integer, cheaper for the script to print; the quotient is what `%.6f` of it would read
/// back as).
pub const MICRO: f64 = 1_000_000.0;

/// A token bucket's `RateLimit-Policy` window: its full refill.
pub fn policy_window_secs(rate: f64, burst: u64) -> u64 {
    ceil_secs(count_f64(burst) / rate)
}

/// A token bucket as `GET /v1/limits` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shown {
    pub rate_per_s: f64,
    pub burst: u64,
}

/// A whole number of tokens in micro-tokens (exact: bursts and costs are at most 10^9 + 1).
fn micro(count: f64) -> f64 {
    count * MICRO
}

/// Tokens from micro-tokens, the quotient the Redis store computes from the scripts' levels.
fn tokens_of(micro_tokens: f64) -> f64 {
    micro_tokens / MICRO
}

impl Stored {
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
pub fn debt_now(stored: Option<Stored>, now_us: u64, rate: f64) -> u64 {
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
pub fn refilled(stored: Option<Stored>, now_us: u64, rate: f64, burst: f64) -> f64 {
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

/// A token bucket as a check finds it at `now_us`, before any charge: its tokens and its
/// debt now; `enough` says whether `request.cost` could be paid.
pub fn find(request: &BucketRequest, stored: Option<Stored>, now_us: u64) -> (BucketOutcome, u64) {
    let debt = debt_now(stored, now_us, request.rate);
    let (level, enough) = bucket_level(request, debt);
    let outcome = BucketOutcome {
        tokens: tokens_of(level),
        enough,
        window: None,
    };
    (outcome, debt)
}

/// Charges a token bucket found with `debt` its cost at `now_us`.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a debt plus a cost in micro-tokens stays below 2^53"
)]
pub fn charge(
    request: &BucketRequest,
    debt: u64,
    outcome: &mut BucketOutcome,
    state: &mut Option<Stored>,
    now_us: u64,
) {
    let cost = micro(count_f64(request.cost));
    let (level, _) = bucket_level(request, debt);
    outcome.tokens = tokens_of(level - cost);
    *state = Some(Stored {
        debt: debt.saturating_add(cost as u64),
        ts_us: now_us,
    });
}

/// Applies one report to a token bucket: charged down to `-max_debt` at most (a deeper debt
/// that is already there stays, nothing is given back). Mirrors `lua/report.lua`.
pub fn report(charge: &ReportCharge, state: &mut Option<Stored>, now_us: u64) -> BucketOutcome {
    let request = &charge.bucket;
    let debt = debt_now(*state, now_us, request.rate);
    let charged = charged_debt(debt, request, request.cost, charge.max_debt);
    write_debt(state, debt, charged, now_us);
    bucket_outcome(request, charged)
}

/// `debt` charged `cost` more, down to `-max_debt` at most (a deeper debt already there
/// stays: nothing is given back).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "debts in micro-tokens stay below 2^53"
)]
pub fn charged_debt(debt: u64, request: &BucketRequest, cost: u64, max_debt: f64) -> u64 {
    let deepest = micro(request.burst + max_debt);
    let mut charged = debt as f64 + micro(count_f64(cost));
    if charged > deepest {
        charged = deepest.max(debt as f64);
    }
    charged as u64
}

/// Stores `new` as the debt at `now_us` when it differs from `old` (the debt refilled to now).
pub fn write_debt(state: &mut Option<Stored>, old: u64, new: u64, now_us: u64) {
    if new != old {
        *state = Some(Stored {
            debt: new,
            ts_us: now_us,
        });
    }
}

/// A token bucket with `debt`, as a report's or a settle's answer shows it.
#[expect(
    clippy::cast_precision_loss,
    reason = "a debt stays below 2^53, exact in f64"
)]
pub fn bucket_outcome(request: &BucketRequest, debt: u64) -> BucketOutcome {
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
pub fn give_back(state: &mut Option<Stored>, tokens: u64, now_us: u64, rate: f64) {
    if tokens == 0 {
        return;
    }
    let debt = debt_now(*state, now_us, rate);
    let lowered = debt.saturating_sub(tokens.saturating_mul(MICROS));
    write_debt(state, debt, lowered, now_us);
}
