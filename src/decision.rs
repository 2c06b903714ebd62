//! The outcome of one check, as a value: allowed or not, and for every applicable limit what
//! is left. Everything the response headers need is derived here; only `http::headers` turns
//! it into bytes.

use crate::limits::{Limit, Policy};

/// One applicable limit after the decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitState {
    /// Index of the limit in the policy that decided.
    pub limit: usize,
    pub cost: u64,
    /// Tokens left after the decision.
    pub tokens: f64,
    /// Whether the bucket held the cost.
    pub enough: bool,
}

/// What `/check` decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No limit applies to this request.
    Unlimited,
    /// Decided by the store (or, when `degraded`, by the local fallback).
    Decided(Decision),
    /// A key part is missing and the limit says `on_missing = "deny"`.
    MissingKey { limit: usize },
    /// The store failed and `on_error` is `allow` or `deny`.
    StoreFailed { allow: bool },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    pub limits: Vec<LimitState>,
    /// True when the local fallback decided because the store failed.
    pub degraded: bool,
}

/// Rounds seconds up to a whole number, at least 0; huge or NaN values saturate.
pub fn ceil_secs(seconds: f64) -> u64 {
    if seconds.is_nan() || seconds <= 0.0 {
        0
    } else {
        seconds.ceil().min(u64::MAX as f64) as u64
    }
}

impl LimitState {
    /// Whole tokens left, as `RateLimit: r=` and `X-RateLimit-Remaining` show them.
    pub fn remaining(&self) -> u64 {
        self.tokens.max(0.0).floor() as u64
    }

    /// Seconds until the bucket is full again.
    pub fn reset_secs(&self, limit: &Limit) -> u64 {
        ceil_secs((limit.burst as f64 - self.tokens) / limit.rate)
    }

    /// Seconds until this bucket could pay the cost; `None` if it never can (cost > burst).
    pub fn wait_secs(&self, limit: &Limit) -> Option<u64> {
        if self.cost > limit.burst {
            return None;
        }
        Some(ceil_secs((self.cost as f64 - self.tokens) / limit.rate).max(1))
    }

    /// A limit that stopped this request: not enough tokens, and not a shadow limit.
    pub fn denies(&self, limit: &Limit) -> bool {
        !self.enough && !limit.shadow
    }
}

impl Decision {
    /// The denying limits, as (state, limit).
    pub fn violated<'p>(
        &'p self,
        policy: &'p Policy,
    ) -> impl Iterator<Item = (&'p LimitState, &'p Limit)> {
        self.limits
            .iter()
            .map(|state| (state, &policy.limits[state.limit]))
            .filter(|(state, limit)| state.denies(limit))
    }

    /// `Retry-After` for a denial: the longest wait among the denying limits, at least 1 s;
    /// `None` when one of them can never pass (cost above its burst) or nothing was denied.
    pub fn retry_after(&self, policy: &Policy) -> Option<u64> {
        let mut longest = None;
        for (state, limit) in self.violated(policy) {
            let wait = state.wait_secs(limit)?;
            longest = Some(longest.map_or(wait, |l: u64| l.max(wait)));
        }
        longest
    }

    /// The limit the headers describe: on a denial, the denying limit with the longest wait;
    /// otherwise the one with the fewest tokens left (ties: the longest until full).
    pub fn most_restrictive<'p>(
        &'p self,
        policy: &'p Policy,
    ) -> Option<(&'p LimitState, &'p Limit)> {
        let with_limits = self.limits.iter().map(|s| (s, &policy.limits[s.limit]));
        if !self.allowed {
            return self.violated(policy).max_by_key(|(state, limit)| {
                (
                    state.wait_secs(limit).unwrap_or(u64::MAX),
                    state.reset_secs(limit),
                )
            });
        }
        with_limits
            .min_by_key(|(state, limit)| (state.remaining(), u64::MAX - state.reset_secs(limit)))
    }
}
