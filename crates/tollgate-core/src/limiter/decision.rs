//! The outcome of one check, as a value: allowed or not, and for every applicable limit what
//! is left. Everything the response headers need is derived here; only `http::response` turns
//! it into bytes.
use crate::kinds::{BucketOutcome, BucketRequest, Window};
use crate::observe::trace::{Attributes, Ruling};
use crate::policy::limit::Limit;
use crate::policy::Policy;

/// One applicable limit after the decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitState {
    /// Index of the limit in the policy that decided.
    pub limit: usize,
    pub cost: u64,
    /// The rate and burst this bucket was decided with: the limit's own, or under
    /// `on_error = "local"` this instance's share of them. Every header derives from these.
    pub rate: f64,
    pub burst: f64,
    /// Tokens left after the decision (a quota: what is left of it).
    pub tokens: f64,
    /// Whether the bucket held the cost.
    pub enough: bool,
    /// A quota's period; `None` for a bucket.
    pub window: Option<Window>,
}

/// What `/check` decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No limit applies to this request.
    Unlimited,
    /// An `[[exempt]]` rule admitted it before any limit was looked at.
    Exempt,
    /// Decided by the store (or, when `degraded`, by the local fallback).
    Decided(Decision),
    /// A key part is missing and the limit says `on_missing = "deny"`.
    MissingKey { limit: usize },
    /// The store failed and `on_error` is `allow` or `deny`.
    StoreFailed { allow: bool },
    /// The store failed and `on_error = "error"`: the caller is told, `why` being the store's
    /// error (gRPC: an error status; HTTP: as `deny`).
    StoreError { why: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    pub limits: Vec<LimitState>,
    /// True when the local fallback decided because the store failed.
    pub degraded: bool,
    /// The ids of the leases this check took (allowed by concurrency limits), as
    /// `X-Tollgate-Lease` shows them; `POST /release` gives each back.
    pub leases: Vec<String>,
    /// The ids of the reservations this check took (allowed by reserving limits), as
    /// `X-Tollgate-Reservation` gives them.
    pub reservations: Vec<String>,
}

use crate::base::rate::{ceil_secs, count_f64, whole, MAX_SF_INTEGER};

impl LimitState {
    /// The bucket `bucket` after the store's `outcome`: the numbers it was decided with and
    /// what is left.
    pub fn of(bucket: &BucketRequest, outcome: &BucketOutcome) -> LimitState {
        LimitState {
            limit: bucket.limit,
            cost: bucket.cost,
            rate: bucket.rate,
            burst: bucket.burst,
            tokens: outcome.tokens,
            enough: outcome.enough,
            window: outcome.window,
        }
    }

    /// Whole tokens left, as `RateLimit: r=` and `X-RateLimit-Remaining` show them.
    pub fn remaining(&self) -> u64 {
        whole(self.tokens)
    }

    /// The capacity shown as `X-RateLimit-Limit` and `q=`: whole tokens.
    pub fn capacity(&self) -> u64 {
        whole(self.burst)
    }

    /// Seconds until the bucket is full again; a quota: until its period ends.
    pub fn reset_secs(&self) -> u64 {
        match self.window {
            Some(window) => window.ends_in_s.min(MAX_SF_INTEGER),
            None => ceil_secs((self.burst - self.tokens) / self.rate),
        }
    }

    /// Seconds until this bucket could pay the cost (a cost of 0: until it holds one whole
    /// request); a quota: until its period ends. `None` if it never can (cost above burst or
    /// quota).
    pub fn wait_secs(&self) -> Option<u64> {
        if count_f64(self.cost) > self.burst {
            return None;
        }
        let wait = match self.window {
            Some(window) => window.ends_in_s.min(MAX_SF_INTEGER),
            None => ceil_secs((count_f64(self.cost.max(1)) - self.tokens) / self.rate),
        };
        Some(wait.max(1))
    }

    /// The `RateLimit-Policy` window: a quota's period, a bucket's full-refill time.
    pub fn window_secs(&self) -> u64 {
        match self.window {
            Some(window) => window.length_s,
            None => ceil_secs(self.burst / self.rate),
        }
    }

    /// Whether this bucket was decided with other numbers than its limit's: its key's
    /// override, or under `on_error = "local"` this instance's share.
    pub fn has_own_numbers(&self, limit: &Limit) -> bool {
        self.rate != limit.rate || self.burst != count_f64(limit.burst)
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
        for (state, _) in self.violated(policy) {
            let wait = state.wait_secs()?;
            longest = Some(longest.map_or(wait, |l: u64| l.max(wait)));
        }
        longest
    }

    /// The limit the headers describe: see [`most_restrictive`].
    pub fn most_restrictive<'p>(
        &'p self,
        policy: &'p Policy,
    ) -> Option<(&'p LimitState, &'p Limit)> {
        most_restrictive(self.limits.iter().map(|s| (s, &policy.limits[s.limit])))
    }
}

impl Verdict {
    /// What a span shows of this verdict: the decision, the limits applied, the one that
    /// denied (the one the answer describes), and whether `on_error` answered.
    pub fn attributes<'p>(&self, policy: &'p Policy) -> Attributes<'p> {
        let name = |index: usize| policy.limits[index].name.as_str();
        let (ruling, limits, denied_by, on_error) = match self {
            Verdict::Unlimited => (Ruling::Allowed, Vec::new(), None, false),
            Verdict::Exempt => (Ruling::Exempt, Vec::new(), None, false),
            Verdict::MissingKey { limit } => (
                Ruling::Denied,
                vec![name(*limit)],
                Some(name(*limit)),
                false,
            ),
            Verdict::StoreFailed { allow } => {
                (Ruling::from_allowed(*allow), Vec::new(), None, true)
            }
            Verdict::StoreError { .. } => (Ruling::Denied, Vec::new(), None, true),
            Verdict::Decided(decision) => (
                Ruling::from_allowed(decision.allowed),
                decision
                    .limits
                    .iter()
                    .map(|state| name(state.limit))
                    .collect(),
                (!decision.allowed)
                    .then(|| decision.most_restrictive(policy))
                    .flatten()
                    .map(|(state, _)| name(state.limit)),
                decision.degraded,
            ),
        };
        Attributes {
            ruling,
            limits,
            denied_by,
            on_error,
        }
    }
}

/// The limit an answer's numbers describe among `states` (all of a decision's, or one gRPC
/// descriptor's): a denying one with the longest wait (ties: the longest until full);
/// otherwise the one with the fewest tokens left (ties: the longest until full).
pub fn most_restrictive<'p>(
    states: impl Iterator<Item = (&'p LimitState, &'p Limit)> + Clone,
) -> Option<(&'p LimitState, &'p Limit)> {
    states
        .clone()
        .filter(|(state, limit)| state.denies(limit))
        .max_by_key(|(state, _)| (state.wait_secs().unwrap_or(u64::MAX), state.reset_secs()))
        .or_else(|| {
            states.min_by_key(|(state, _)| (state.remaining(), u64::MAX - state.reset_secs()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::observe::metrics::Metrics;

    fn two_limits() -> Policy {
        use figment::providers::Format as _;
        let config: Config = figment::Figment::new()
            .merge(figment::providers::Toml::string(
                "[[limits]]\nname = \"per-ip\"\nrate = 1\nburst = 5\nkey = [\"ip\"]\n\
                 [[limits]]\nname = \"per-key\"\nrate = 1\nburst = 2\nkey = [\"header:k\"]\n",
            ))
            .extract()
            .expect("a config");
        Policy::compile(&config, &Metrics::new()).expect("a valid config")
    }

    fn state(limit: usize, tokens: f64, enough: bool) -> LimitState {
        LimitState {
            limit,
            cost: 1,
            rate: 1.0,
            burst: 5.0,
            tokens,
            enough,
            window: None,
        }
    }

    fn decided(allowed: bool, limits: Vec<LimitState>, degraded: bool) -> Verdict {
        Verdict::Decided(Decision {
            allowed,
            limits,
            degraded,
            leases: Vec::new(),
            reservations: Vec::new(),
        })
    }

    #[test]
    fn a_span_shows_the_decision_the_limits_applied_and_the_one_that_denied() {
        let policy = two_limits();
        let denied = decided(
            false,
            vec![state(0, 3.0, true), state(1, 0.0, false)],
            false,
        );
        assert_eq!(
            denied.attributes(&policy),
            Attributes {
                ruling: Ruling::Denied,
                limits: vec!["per-ip", "per-key"],
                denied_by: Some("per-key"),
                on_error: false,
            }
        );
        let allowed = decided(true, vec![state(0, 3.0, true)], false);
        assert_eq!(allowed.attributes(&policy).ruling, Ruling::Allowed);
        assert_eq!(allowed.attributes(&policy).denied_by, None);
        let missing = Verdict::MissingKey { limit: 1 }.attributes(&policy);
        assert_eq!(
            (missing.ruling, missing.denied_by),
            (Ruling::Denied, Some("per-key"))
        );
        let exempt = Verdict::Exempt.attributes(&policy);
        assert_eq!((exempt.ruling, exempt.limits.len()), (Ruling::Exempt, 0));
    }

    #[test]
    fn a_span_says_when_on_error_answered() {
        let policy = two_limits();
        let open = Verdict::StoreFailed { allow: true }.attributes(&policy);
        assert_eq!((open.ruling, open.on_error), (Ruling::Allowed, true));
        let closed = Verdict::StoreFailed { allow: false }.attributes(&policy);
        assert_eq!((closed.ruling, closed.on_error), (Ruling::Denied, true));
        let local = decided(true, vec![state(0, 1.0, true)], true).attributes(&policy);
        assert!(local.on_error);
        assert!(!Verdict::Unlimited.attributes(&policy).on_error);
    }

    #[test]
    fn seconds_stay_within_the_structured_field_integer_range() {
        assert_eq!(ceil_secs(1.2), 2);
        assert_eq!(ceil_secs(-1.0), 0);
        assert_eq!(ceil_secs(f64::NAN), 0);
        assert_eq!(ceil_secs(1e18), MAX_SF_INTEGER);
        assert_eq!(ceil_secs(f64::INFINITY), MAX_SF_INTEGER);
    }

    #[test]
    fn every_number_a_header_shows_is_clamped() {
        let state = LimitState {
            limit: 0,
            cost: 1,
            rate: 1e-18,
            burst: 1e18,
            tokens: 1e17,
            enough: true,
            window: None,
        };
        assert_eq!(state.remaining(), MAX_SF_INTEGER);
        assert_eq!(state.capacity(), MAX_SF_INTEGER);
        assert_eq!(state.reset_secs(), MAX_SF_INTEGER);
        let drained = LimitState {
            tokens: 0.0,
            ..state
        };
        assert_eq!(drained.wait_secs(), Some(MAX_SF_INTEGER));
    }
}
