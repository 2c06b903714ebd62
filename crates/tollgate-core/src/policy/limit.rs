//! One limit as it runs, and what it decides for one key: match rules, the bucket key, per-key
//! numbers (overrides), the cost, `on_missing`. The compiled set of limits is a
//! [`Policy`](crate::policy::Policy).
//!
//! Building a [`Limit`] from its [`LimitConfig`](crate::config::LimitConfig) (`build`) is the
//! one place a limit is checked: what exists is valid, and nothing parses the config twice.

use crate::base::keys::{self, KeyPart, Source};
use crate::base::rate::count_f64;
use crate::config::{Charge, OnMissing, MAX_COST, OVER_COST};
use crate::kinds::concurrency::Lease;
use crate::kinds::reserve::Reserve;
use crate::kinds::{BucketRequest, Kind, Meter};
use crate::observe::metrics::LimitCounters;
use crate::policy::descriptors::DescriptorRule;
use crate::policy::matcher::Matcher;
use crate::policy::overrides::{Base, Override, Overrides};
use crate::policy::runtime_overrides::{Own, View};
use crate::request::OriginalRequest;

mod build;

pub use build::LimitInput;

/// One configured limit, ready for the hot path.
pub struct Limit {
    pub name: String,
    /// Tokens per second; 0 for a quota.
    pub rate: f64,
    /// The bucket's capacity, or the quota.
    pub burst: u64,
    pub meter: Meter,
    pub charge: Charge,
    /// How far a report may drive the bucket below 0.
    pub max_debt: u64,
    pub cost: u64,
    pub cost_header: Option<String>,
    /// A reserving limit's least estimate (`reserve`, else 1), and the header that may raise it.
    pub reserve: u64,
    pub reserve_header: Option<String>,
    pub shadow: bool,
    /// This limit's checks may be answered from slices of borrowed tokens (`limiter::borrow`).
    pub borrow: bool,
    pub on_missing: OnMissing,
    pub key: Vec<KeyPart>,
    pub matcher: Matcher,
    pub overrides: Overrides,
    /// Set for a limit of Envoy's rate limit service: it applies to descriptors, never to
    /// `/check`.
    pub descriptor: Option<DescriptorRule>,
    /// This limit's `RateLimit-Policy` item, `"<name>";q=<burst>;w=<window>` (a quota's
    /// window is its period; a month's length is filled in per decision).
    pub policy_item: String,
    /// Detached until [`Policy::compile`](crate::policy::Policy::compile) gives it the exported counters.
    pub counters: LimitCounters,
}

/// A `RateLimit-Policy` item, `"<name>";q=<quota>;w=<window in seconds>`: the one spelling
/// of it, for the precomputed item of each limit and for a key with numbers of its own.
pub fn policy_item(name: &str, quota: u64, window_secs: u64) -> String {
    format!("\"{name}\";q={quota};w={window_secs}")
}

impl Limit {
    /// How far below 0 a key of this limit may go: `max_debt` for a `charge = "report"`
    /// limit, else 0. Whatever numbers a key gets, its bucket must refill this debt too within
    /// what the store can express.
    pub fn debt(&self) -> u64 {
        match self.charge {
            Charge::Report => self.max_debt,
            Charge::Request => 0,
        }
    }

    /// The numbers a runtime override keeps for what it leaves out.
    pub fn own(&self) -> Own {
        Own {
            rate: self.rate,
            burst: self.burst,
            debt: self.debt(),
            quota: self.meter.period().is_some(),
        }
    }

    /// The numbers of the bucket whose key ends in `tail`: a runtime override's, else the
    /// file's, else the limit's own; `None` when an override makes the key unlimited.
    ///
    /// The one place a key's numbers come from: `/check`, gRPC, `POST /report`, peek, reset
    /// and refund all ask here, so an override binds wherever the key is charged or read.
    pub fn numbers_for(&self, runtime: &View<'_>, tail: &[u8]) -> Option<Numbers> {
        let found = runtime
            .get(&self.name, self.own(), tail)
            .or_else(|| self.overrides.get(tail));
        match found {
            Some(Override::Unlimited) => None,
            Some(Override::Bucket { rate, burst }) => Some(Numbers {
                rate,
                burst,
                overridden: true,
            }),
            None => Some(self.own_numbers()),
        }
    }

    /// The limit's own numbers, as configured, whatever the overrides say.
    pub fn own_numbers(&self) -> Numbers {
        Numbers {
            rate: self.rate,
            burst: self.burst,
            overridden: false,
        }
    }

    /// The store key of this limit's bucket whose key ends in `tail`.
    pub fn store_key(&self, prefix: &str, tail: &[u8]) -> String {
        keys::assemble(prefix, &self.name, tail)
    }

    /// The request for this limit's (at `index` in its policy) bucket at `key`, with the key's
    /// `numbers` ([`Limit::numbers_for`]) and a `cost`: built alike for every path.
    ///
    /// A concurrency limit's request carries a fresh lease id, a reserving one's a fresh
    /// reservation id: each check takes its own. A quota's and a concurrency limit's rate is 0,
    /// overridden or not.
    pub fn bucket(&self, key: String, index: usize, numbers: Numbers, cost: u64) -> BucketRequest {
        let meter = self.meter.for_check();
        let request = BucketRequest::of(key, meter, numbers.rate, count_f64(numbers.burst))
            .cost(cost)
            .limit(index);
        if self.shadow {
            request.shadow()
        } else {
            request
        }
    }

    /// The id a client is given for the lease `lease` of this limit at store key `key`
    /// (`X-Tollgate-Lease`): `<limit>.<key tail in hex>.<lease id>`, visible ASCII, and all
    /// [`Policy::lease_of`](crate::policy::Policy::lease_of) needs to find the lease again.
    pub fn lease_id(&self, prefix: &str, key: &str, lease: Lease) -> String {
        self.held_id(prefix, key, &lease.member())
    }

    /// The id a client is given for the reservation of `estimate` tokens that a check took
    /// from this limit's bucket at `key` (`X-Tollgate-Reservation`): as a lease's,
    /// `<limit>.<key tail in hex>.<id>:<estimate>`, the last part as the store keeps it.
    pub fn reservation_id(
        &self,
        prefix: &str,
        key: &str,
        reserve: Reserve,
        estimate: u64,
    ) -> String {
        self.held_id(prefix, key, &reserve.member(estimate))
    }

    fn held_id(&self, prefix: &str, key: &str, member: &str) -> String {
        let tail = keys::tail_in_key(key, prefix, &self.name);
        let mut id = String::with_capacity(self.name.len() + 2 * tail.len() + member.len() + 2);
        id.push_str(&self.name);
        id.push('.');
        for byte in tail.bytes() {
            id.push_str(&format!("{byte:02x}"));
        }
        id.push('.');
        id.push_str(member);
        id
    }

    /// The key tail of part values given explicitly (an admin query, a `POST /report` body),
    /// one per part in order: the tail `/check` builds for a request carrying them
    /// ([`keys::build_tail`] of typed values), an empty value standing for an absent part only under
    /// `on_missing = "anonymous"`, a `const` part's value its text. Fails with the index of the
    /// value at fault and why.
    pub fn tail_of_given(
        &self,
        values: &[String],
        ipv6_prefix: u8,
    ) -> Result<Vec<u8>, (usize, String)> {
        if values.len() != self.key.len() {
            let parts: Vec<String> = self.key.iter().map(ToString::to_string).collect();
            return Err((
                values.len().min(self.key.len()),
                format!(
                    "limit {:?} is keyed on {} part(s) [{}]: give one value per part, in that order (got {})",
                    self.name,
                    self.key.len(),
                    parts.join(", "),
                    values.len()
                ),
            ));
        }
        for (i, (part, value)) in self.key.iter().zip(values).enumerate() {
            if let KeyPart::Const(text) = part {
                if text != value {
                    return Err((i, format!("is the constant part {part}: give {text:?}")));
                }
            }
        }
        let anonymous = self.on_missing == OnMissing::Anonymous;
        keys::build_tail(&self.key, Source::Typed(values), anonymous, ipv6_prefix)
            .map_err(|bad| (bad.index, format!("({}) {}", self.key[bad.index], bad.why)))
    }

    /// What an override of this limit keeps for what it leaves out, and what it must fit.
    pub fn base(&self, ipv6_prefix: u8) -> Base {
        Base {
            rate: self.rate,
            burst: self.burst,
            cost: self.cost,
            debt: self.debt(),
            ipv6_prefix,
            quota: self.meter.period().is_some(),
        }
    }

    /// What this limit charges at `/check`: its configured cost or the cost header's; for a
    /// `charge = "report"` limit nothing (0 admits while it is not used up), or, when it
    /// reserves, the estimate.
    pub fn check_cost(&self, request: &OriginalRequest<'_>) -> u64 {
        match self.charge {
            Charge::Report if self.meter.reserve().is_some() => self.estimate_of(request),
            Charge::Report => 0,
            Charge::Request => self.cost_of(request),
        }
    }

    /// What a peek asks the key to hold (`GET /v1/buckets`): the configured cost; for a
    /// `charge = "report"` limit nothing (a check asks one whole request), or, when it
    /// reserves, what the least estimate would reserve.
    pub fn peek_cost(&self) -> u64 {
        match self.charge {
            Charge::Report if self.meter.reserve().is_some() => self.reserve,
            Charge::Report => 0,
            Charge::Request => self.cost,
        }
    }

    /// A reserving limit's estimate: the `reserve_header` value when it is an integer above
    /// `reserve`, else `reserve` (as [`Limit::check_cost`] reads a cost header).
    fn estimate_of(&self, request: &OriginalRequest<'_>) -> u64 {
        at_least(request, self.reserve_header.as_deref(), self.reserve)
    }

    /// The cost of this request: the `cost_header` value when it is an integer above the
    /// configured `cost`, else `cost`. The configured cost is the minimum: neither a smaller
    /// nor a malformed header makes a request cheaper. An integer above [`MAX_COST`] (however
    /// many digits) is [`OVER_COST`]: above every burst, so denied, never charged.
    fn cost_of(&self, request: &OriginalRequest<'_>) -> u64 {
        at_least(request, self.cost_header.as_deref(), self.cost)
    }
}

/// The integer in the header `name` when it is above `floor`, else `floor` (no header, a
/// smaller or a malformed value: never below what the limit configures).
fn at_least(request: &OriginalRequest<'_>, name: Option<&str>, floor: u64) -> u64 {
    name.and_then(|name| request.header(name))
        .and_then(header_cost)
        .map_or(floor, |value| value.max(floor))
}

/// A cost header's value: ASCII digits (surrounding spaces allowed), at most [`MAX_COST`], or
/// [`OVER_COST`] for more digits than that; `None` for anything else. Allocates nothing.
fn header_cost(raw: &[u8]) -> Option<u64> {
    let digits = raw.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut cost: u64 = 0;
    for digit in digits {
        cost = cost * 10 + u64::from(digit - b'0');
        if cost > MAX_COST {
            return Some(OVER_COST);
        }
    }
    Some(cost)
}

/// A key's numbers, wherever they come from ([`Limit::numbers_for`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Numbers {
    /// Tokens per second; 0 for a quota.
    pub rate: f64,
    /// The bucket's capacity, or the quota.
    pub burst: u64,
    /// An override (runtime or file) gave them, not the limit itself.
    pub overridden: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_header_past_the_largest_cost_is_over_it_not_malformed() {
        assert_eq!(header_cost(b"4"), Some(4));
        assert_eq!(header_cost(b" 17 "), Some(17));
        assert_eq!(header_cost(b"1000000000"), Some(MAX_COST));
        assert_eq!(header_cost(b"1000000001"), Some(OVER_COST));
        assert_eq!(header_cost(b"18446744073709551615"), Some(OVER_COST));
        assert_eq!(header_cost(b"18446744073709551616"), Some(OVER_COST));
        assert_eq!(header_cost(&[b'9'; 4096]), Some(OVER_COST));
        for malformed in [&b""[..], b"-3", b"1.5", b"abc", b"1e9", b" ", b"+5"] {
            assert_eq!(header_cost(malformed), None, "{malformed:?}");
        }
    }
}
