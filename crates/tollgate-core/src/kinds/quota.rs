//! A calendar quota: at most `quota` per `period` (UTC on the store's clock), counted in whole
//! requests; the rate is unused. Its key counts what was used in the current period, a count
//! from an earlier period void.

use serde::Serialize;

use super::twin::{Beside, Found, Keep, Kept, Stored};
use super::{
    can_pay, BucketOutcome, BucketRequest, Configured, Kind, LimitView, Meter, PeekView, Peeked,
    ReportCharge, ScriptArg, Window,
};
use crate::base::calendar::Period;
use crate::base::rate::count_f64;
use crate::base::rate::RateSpec;
use crate::config::{ConfigError, LimitConfig, MAX_BURST};

const MICROS: u64 = 1_000_000;

/// A quota's period, after checking that it has quota and period and nothing of a bucket.
pub fn checked(config: &LimitConfig, at: &str) -> Result<Period, ConfigError> {
    let Some(quota) = config.quota else {
        return Err(ConfigError::new(
            format!("{at}.quota"),
            "is required with period: at most this many per period",
        ));
    };
    let Some(period) = config.period else {
        return Err(ConfigError::new(
            format!("{at}.period"),
            "is required with quota: \"hour\", \"day\", \"week\" or \"month\"",
        ));
    };
    if quota == 0 || quota > MAX_BURST {
        return Err(ConfigError::new(
            format!("{at}.quota"),
            format!("must be between 1 and {MAX_BURST}"),
        ));
    }
    if config.rate != RateSpec::default() || config.burst != 0 {
        let key = if config.rate != RateSpec::default() {
            "rate"
        } else {
            "burst"
        };
        return Err(ConfigError::new(
            format!("{at}.{key}"),
            "a quota limit takes quota and period, not rate and burst (use two limits for both)",
        ));
    }
    if config.max_debt.is_some() {
        return Err(ConfigError::new(
            format!("{at}.max_debt"),
            "applies to buckets only: a report counts in full against a quota",
        ));
    }
    Ok(period)
}

/// A quota at `now_us`: what was used in the current period, the period's start (µs) and
/// where the period stands. A count from an earlier period is void.
#[expect(
    clippy::cast_precision_loss,
    reason = "a quota's count stays far below 2^53"
)]
fn now(stored: Option<Stored>, period: Period, now_us: u64) -> (f64, u64, Window) {
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

impl Kind for Period {
    fn is_token_bucket(&self) -> bool {
        false
    }

    fn for_check(&self) -> Meter {
        Meter::Quota(*self)
    }

    fn policy_window_secs(&self, _rate: f64, _burst: u64) -> u64 {
        self.fixed_secs().unwrap_or(30 * 86_400)
    }

    fn limit_view(&self, limit: &Configured<'_>) -> LimitView {
        LimitView::Quota(Shown {
            quota: limit.burst,
            period: *self,
        })
    }

    fn script_arg(&self, _rate: f64) -> ScriptArg {
        ScriptArg::Code(self.code())
    }

    fn peek_arg(&self, _rate: f64) -> ScriptArg {
        ScriptArg::Code(self.code())
    }

    fn level_scale(&self) -> f64 {
        1.0
    }

    /// The two numbers a quota's reply gives: `ends_in_s length_s`.
    fn read_window(&self, numbers: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Window>> {
        let ends_in_s = numbers()?;
        let length_s = numbers()?;
        Some(Some(Window {
            ends_in_s: ends_in_s.max(1),
            length_s,
        }))
    }

    fn find(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        now_us: u64,
    ) -> (BucketOutcome, u64) {
        let (used, _, window) = now(stored, *self, now_us);
        let tokens = request.burst - used;
        let outcome = BucketOutcome {
            tokens,
            enough: can_pay(tokens, request.cost),
            window: Some(window),
        };
        (outcome, 0)
    }

    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "quota counts stay below 2^53"
    )]
    fn charge(
        &self,
        request: &BucketRequest,
        _debt: u64,
        outcome: &mut BucketOutcome,
        state: &mut Option<Stored>,
        now_us: u64,
    ) {
        outcome.tokens -= count_f64(request.cost);
        *state = Some(Stored {
            debt: (request.burst - outcome.tokens) as u64,
            ts_us: now(None, *self, now_us).1,
        });
    }

    /// A report counts the whole cost. Mirrors `lua/report.lua`.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "quota counts stay below 2^53"
    )]
    fn report(
        &self,
        charge: &ReportCharge,
        state: &mut Option<Stored>,
        now_us: u64,
    ) -> BucketOutcome {
        let request = &charge.bucket;
        let (used, start_us, window) = now(*state, *self, now_us);
        let used = used + count_f64(request.cost);
        *state = Some(Stored {
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

    /// When its period ends.
    fn forget_at_us(&self, stored: &Stored, _rate: f64) -> u64 {
        let (_, end) = self.bounds((stored.ts_us / MICROS) as i64);
        u64::try_from(end).unwrap_or(0) * MICROS
    }

    fn alone(&self, _key: &str, _beside: &Beside) -> bool {
        true
    }

    fn find_in(
        &self,
        _request: &BucketRequest,
        stored: Option<Stored>,
        _beside: &mut Beside,
        _now_us: u64,
    ) -> Found {
        Found::stored(stored)
    }

    fn keep_in(&self, keep: Keep<'_>, _beside: &mut Beside) -> Kept {
        Kept::stored(keep.state, |state| self.forget_at_us(state, 0.0))
    }

    fn peek_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        _beside: &Beside,
        now_us: u64,
    ) -> BucketOutcome {
        self.find(request, stored, now_us).0
    }

    fn peek_view(&self, request: &BucketRequest, peeked: &Peeked) -> PeekView {
        PeekView::Quota(Peek {
            quota: request.burst,
            used: request.burst - peeked.outcome.tokens,
            remaining: peeked.remaining,
            period: *self,
            period_ends_in_s: peeked.reset_secs,
        })
    }
}

/// A quota as `GET /v1/limits` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shown {
    pub quota: u64,
    pub period: Period,
}

/// A quota as `GET /v1/buckets` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peek {
    pub quota: f64,
    pub used: f64,
    pub remaining: u64,
    pub period: Period,
    pub period_ends_in_s: u64,
}
