//! The plain token bucket: `rate` tokens per second, capacity `burst`, charged by its checks
//! (or by reports, `charge = "report"`). Its arithmetic is [`tokens`]'s, shared
//! with the reserving and borrowing buckets; a key others borrow from holds their groups of
//! slices, which a plain check reads and keeps ([`borrow`]).

use serde::Serialize;

use super::tokens::{self, Shown};
use super::twin::{Beside, Found, Keep, Kept, Stored};
use super::{
    borrow, BucketOutcome, BucketRequest, Configured, Kind, LimitView, Meter, PeekView, Peeked,
    ScriptArg, Window,
};
use crate::config::{check_refill, Charge, ConfigError, LimitConfig, MAX_BURST};

/// The plain token bucket: `rate` tokens per second, capacity `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket;

/// A bucket's rate in tokens per second, after checking its burst and refill time.
pub fn checked(config: &LimitConfig, at: &str) -> Result<f64, ConfigError> {
    const NEEDS: &str =
        "(a bucket takes rate and burst; a quota, quota and period; a concurrency limit, concurrency)";
    let rate = config
        .rate
        .per_second()
        .map_err(|why| ConfigError::new(format!("{at}.rate"), format!("{why} {NEEDS}")))?;
    if config.burst == 0 || config.burst > MAX_BURST {
        return Err(ConfigError::new(
            format!("{at}.burst"),
            format!("must be between 1 and {MAX_BURST} {NEEDS}"),
        ));
    }
    // A bucket in debt refills its burst and its debt before the store may forget it.
    let debt = match config.charge {
        Charge::Report => config.max_debt(),
        Charge::Request => 0,
    };
    check_refill(rate, config.burst, debt, &format!("{at}.rate"))?;
    Ok(rate)
}

impl Kind for Bucket {
    fn is_token_bucket(&self) -> bool {
        true
    }

    fn for_check(&self) -> Meter {
        Meter::Bucket
    }

    fn policy_window_secs(&self, rate: f64, burst: u64) -> u64 {
        tokens::policy_window_secs(rate, burst)
    }

    fn limit_view(&self, limit: &Configured<'_>) -> LimitView {
        LimitView::Bucket(Shown {
            rate_per_s: limit.rate,
            burst: limit.burst,
        })
    }

    fn script_arg(&self, rate: f64) -> ScriptArg {
        ScriptArg::Number(rate)
    }

    fn peek_arg(&self, rate: f64) -> ScriptArg {
        ScriptArg::Text(rate.to_string())
    }

    fn level_scale(&self) -> f64 {
        tokens::MICRO
    }

    fn read_window(&self, _: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Window>> {
        Some(None)
    }

    fn alone(&self, key: &str, beside: &Beside) -> bool {
        // Tokens of this bucket are held: the general path reads them.
        !beside.borrowed.contains_key(key)
    }

    fn find_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &mut Beside,
        now_us: u64,
    ) -> Found {
        // A plain check of a bucket others borrow from reads their groups too.
        if beside.borrowed.contains_key(request.key.as_str()) {
            return borrow::find_in(request, None, stored, beside, now_us);
        }
        Found::stored(stored)
    }

    fn keep_in(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept {
        if keep.found.lent.is_some() {
            // Keeps the groups it read, and takes no slice.
            return borrow::keep_in(keep, borrow::Borrow::default(), beside);
        }
        let rate = keep.request.rate;
        Kept::stored(keep.state, |state| state.full_at_us(rate))
    }

    fn peek_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &Beside,
        now_us: u64,
    ) -> BucketOutcome {
        borrow::peek_in(request, stored, beside, now_us)
    }

    fn peek_view(&self, request: &BucketRequest, peeked: &Peeked) -> PeekView {
        PeekView::Bucket(Peek {
            tokens: peeked.outcome.tokens,
            remaining: peeked.remaining,
            burst: request.burst,
            rate_per_s: request.rate,
            full_in_s: peeked.reset_secs,
        })
    }
}

/// A token bucket as `GET /v1/buckets` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peek {
    /// Tokens held now (exact; may be negative for a reported limit in debt).
    pub tokens: f64,
    /// Whole tokens, as `X-RateLimit-Remaining` shows them.
    pub remaining: u64,
    pub burst: f64,
    pub rate_per_s: f64,
    /// Seconds until full, as `X-RateLimit-Reset` shows it.
    pub full_in_s: u64,
}
