//! Shares of one limit among the Envoys that stream to tollgate (RLQS): the Rust twin of
//! `lua/rlqs.lua`, a pure function of the pool's holders, one holder's report and the
//! store's time, so it is tested with an injected clock and random demand.
//!
//! A *pool* is one (limit, key). Its capacity is counted in whole *units*: `rate_units`
//! tokens per fill interval (a rate share of `u` units is `u / fill_interval_s` tokens per
//! second) and `size_units` tokens of bucket size. A *holder* is one Envoy stream's share of a
//! pool; its *members* are that Envoy's buckets whose ids map to the pool (ids that differ only
//! in entries the rule does not key on), each enforcing its part of the holder's share. Every
//! assignment sent to a holder counts against the pool until its expiry (the TTL sent, plus
//! a margin for the trip to Envoy), even after a smaller one replaced it: so a cut is in force
//! before the capacity it frees is handed to another holder, and the sums of what the Envoys
//! may hold never pass the pool's units ([`allocate`]'s invariant, checked by the tests).
//!
//! Sums of sizes are not enough for the tokens: Envoy starts a grown bucket at its old fill
//! fraction and a first one full. So a member's size grows only with tokens from the pool's
//! [`Escrow`], the size nobody counts, which refills only at the rate nobody counts: the pool
//! behaves as one global bucket (DESIGN, "The escrow").
//!
//! All arithmetic is on integers or on `f64` operations performed in the same order as the
//! script's, so both stores reach the same integers.

mod escrow;
mod holding;
mod pools;

use holding::{level, push};
pub use holding::{Holding, MAX_STEPS};
pub use pools::Pools;

/// The margin for a trip between tollgate and Envoy: an assignment counts for its TTL plus
/// this from its sending.
pub const TRIP_MARGIN_US: u64 = 1_000_000;

/// The pool's hash field holding its [`Escrow`] (a holder id always contains a `.`).
pub const ESCROW_FIELD: &str = "escrow";
/// Escrow tokens are counted in millionths.
pub const MICRO: u64 = 1_000_000;
/// The longest a pool's record outlives its holders' steps for its escrow to refill (about
/// 31 years: only a burst refilled at far less than a token an hour reaches it).
pub const MAX_FILL_US: u64 = 1_000_000_000_000_000;

/// The unassigned part of a pool's size (`E = size_units − Σ counted sizes`) and the tokens
/// it holds (`micro / MICRO ≤ E`): a growth takes its tokens from here, a cut frees size
/// empty, and it refills only at the rate nobody counts. See DESIGN, "The escrow".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Escrow {
    /// Tokens held, in millionths.
    pub micro: u64,
    /// Rate units nobody counted at the last report (tokens per fill interval).
    pub free_rate: u64,
    /// When it was last brought up to date (µs, store clock).
    pub at_us: u64,
}

impl Escrow {
    /// The stored form: `micro free_rate at_us`.
    pub fn encode(&self) -> String {
        format!("{} {} {}", self.micro, self.free_rate, self.at_us)
    }

    /// The stored form read back; anything else reads as absent.
    pub fn decode(text: &str) -> Option<Escrow> {
        let mut numbers = text.split(' ').map(|n| n.parse::<u64>().ok());
        let mut next = || numbers.next().flatten();
        let escrow = Escrow {
            micro: next()?,
            free_rate: next()?,
            at_us: next()?,
        };
        next().is_none().then_some(escrow)
    }
}

/// One pool as stored: its holders, its escrow (absent in a pool never written, or one
/// written before the escrow existed), and when the record may vanish (µs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    pub holders: Vec<(String, Holding)>,
    pub escrow: Option<Escrow>,
    pub expires_us: u64,
}

/// What a member (one Envoy bucket) was last sent: rate and size units, and until when that
/// assignment counts (µs, store clock; 0 for nothing sent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    pub rate: u64,
    pub size: u64,
    pub until_us: u64,
}

/// One member of the reporting holder, as its stream knows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Member {
    /// It reported in this message: it is sent a new part of the share. A member that did
    /// not keeps what it was sent, which counts within the holder's share until it expires.
    pub reported: bool,
    /// Requests it allowed and denied since its last report.
    pub requests: u64,
    pub last: Sent,
}

/// One report of one holder, with the pool's numbers as the policy gives them now.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareRequest {
    /// The pool's store key.
    pub key: String,
    /// The reporting holder (one stream's share of the pool).
    pub holder: String,
    /// Tokens per fill interval of the whole limit: `floor(rate * fill_interval_s)`.
    pub rate_units: u64,
    /// The limit's burst: `floor(burst)`.
    pub size_units: u64,
    /// Units never handed out by demand, so a newcomer is served at once.
    pub reserve_rate: u64,
    pub reserve_size: u64,
    /// The fill interval the units are counted in (whole seconds).
    pub fill_interval_s: u64,
    /// How long the assignment counts from now (its TTL plus the margin), in µs.
    pub hold_us: u64,
    /// The most holders the pool takes: a newcomer to a full pool is given nothing.
    pub max_holders: u64,
    /// The holder's members: every bucket of the stream mapped to this pool.
    pub members: Vec<Member>,
}

impl ShareRequest {
    /// Requests its reporting members allowed and denied, as the holder's demand counts them.
    fn requests(&self) -> u64 {
        self.members
            .iter()
            .filter(|m| m.reported)
            .map(|m| m.requests.min(MAX_REQUESTS))
            .fold(0, u64::saturating_add)
            .min(MAX_REQUESTS)
    }
}

/// What the reporting holder is given, and the pool afterwards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// What the holder's members may hold now, all of them (rate units per fill interval and
    /// size units): the holder's new step.
    pub rate: u64,
    pub size: u64,
    /// Holders in the pool (the reporter included); 0 when the pool was full and the
    /// reporter a newcomer, given nothing.
    pub holders: u64,
    /// What every holder may hold now, summed (the reporter's grant included).
    pub counted_rate: u64,
    pub counted_size: u64,
    /// The store's now (µs): the members' new assignments count until `now_us + hold_us`.
    pub now_us: u64,
    /// Each reporting member's part (rate units, size units), in the order of the request's
    /// members; (0, 0) is a denial.
    pub members: Vec<(u64, u64)>,
}

/// The largest request count one report is taken at (9 million in 5 s: 1.8 million requests
/// per second through one Envoy for one bucket), so that demands summed over a thousand
/// holders stay exact in a double, as the script computes them.
pub const MAX_REQUESTS: u64 = 9_000_000;
/// The reporting interval a first report's requests are spread over (Envoy reports every 5 s).
pub const FIRST_REPORT_MS: u64 = 5_000;
/// No holder's demand counts for more than this many times the pool's rate: an Envoy that
/// reports far more than any limit could use (a bug, or a lie) cannot starve the others.
pub const DEMAND_CAP: u64 = 4;
/// A member's weight in its holder's split is its requests plus one, up to this: the products
/// of the split stay exact in a double.
pub const MAX_WEIGHT: u64 = 1_000_000;

/// The reporter's demand in milli-requests per second: its requests over the time since its
/// last report on the store's clock; a newcomer's is the mean of the others' (or its first
/// report's requests over [`FIRST_REPORT_MS`] when alone or larger); at most [`DEMAND_CAP`]
/// times the pool's rate.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "requests are capped at MAX_REQUESTS so the product is exact; the quotient floors"
)]
fn demand(
    previous: Option<&Holding>,
    request: &ShareRequest,
    now_us: u64,
    others: &[&Holding],
) -> u64 {
    let requests = request.requests() as f64;
    let demand = match previous {
        Some(held) if now_us > held.last_us => {
            let elapsed_ms = ((now_us - held.last_us) / 1000).max(1);
            (requests * 1_000_000.0 / elapsed_ms as f64).floor() as u64
        }
        Some(held) => held.demand_milli,
        None => {
            let own = (requests * 1_000_000.0 / FIRST_REPORT_MS as f64).floor() as u64;
            if others.is_empty() {
                own
            } else {
                let sum: u64 = others
                    .iter()
                    .map(|h| h.demand_milli)
                    .fold(0, u64::saturating_add);
                own.max(sum / others.len() as u64)
            }
        }
    };
    let cap = (DEMAND_CAP as f64 * 1000.0 * request.rate_units as f64
        / request.fill_interval_s.max(1) as f64)
        .floor() as u64;
    demand.min(cap)
}

/// The targets of every holder (sorted by id), given their demands: at least one unit each
/// for the eligible ones, then the rest of `budget` in proportion to demand, capped at
/// demand plus a quarter, the spare split evenly.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "units stay below 2^53; every quotient is floored, so the sum stays within budget"
)]
fn rate_targets(budget: u64, demands: &[f64], eligible: &[bool]) -> Vec<u64> {
    let count = eligible.iter().filter(|e| **e).count() as u64;
    let spare = budget.saturating_sub(count) as f64;
    let total: f64 = demands
        .iter()
        .zip(eligible)
        .filter(|(_, e)| **e)
        .map(|(d, _)| *d)
        .sum();
    demands
        .iter()
        .zip(eligible)
        .map(|(mine, chosen)| {
            if !chosen {
                return 0;
            }
            let extra = if total * 1.25 >= spare {
                if total > 0.0 {
                    (spare * mine / total).floor()
                } else {
                    0.0
                }
            } else {
                (mine * 1.25 + (spare - total * 1.25) / count as f64).floor()
            };
            1 + extra as u64
        })
        .collect()
}

/// Which entries get at least one unit: all when `units` allow, else the `units` with the
/// highest `weights` (ties: the first).
fn heaviest(weights: &[u64], units: u64) -> Vec<bool> {
    let n = weights.len();
    if (n as u64) <= units {
        return vec![true; n];
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| weights[*b].cmp(&weights[*a]).then(a.cmp(b)));
    let mut chosen = vec![false; n];
    for index in order
        .into_iter()
        .take(usize::try_from(units).unwrap_or(usize::MAX))
    {
        chosen[index] = true;
    }
    chosen
}

/// `budget` split by `weights` (each at least 1): one unit each, then the spare in
/// proportion; with fewer units than weights, one unit each to the heaviest. The running sum
/// is held to the budget, whatever a quotient rounded to.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "spare < 2^33 and weights <= MAX_WEIGHT keep the products exact; quotients floor"
)]
fn split(budget: u64, weights: &[u64]) -> Vec<u64> {
    let k = weights.len() as u64;
    if budget < k {
        return heaviest(weights, budget)
            .into_iter()
            .map(u64::from)
            .collect();
    }
    let total = weights.iter().sum::<u64>() as f64;
    let spare = (budget - k) as f64;
    let mut given = 0u64;
    weights
        .iter()
        .map(|w| {
            let part = (1 + (spare * *w as f64 / total).floor() as u64).min(budget - given);
            given += part;
            part
        })
        .collect()
}

/// One report: updates the reporter's demand, forgets holders whose assignments all lapsed,
/// and gives the reporter `min(target, free)` in each dimension, where `free` is the pool
/// less what every other holder may still hold, or what the reporter may hold already if
/// that is more (a pool whose limit was lowered: cuts go out, nothing grows). That grant,
/// less what its members that did not report still hold, is split among the members that
/// did, in proportion to their requests; a member's size above the one it surely still
/// applies takes the difference from the escrow, and is limited to what it holds. `pool` is
/// as stored (holders in any order); it is updated in place, its escrow and expiry included.
/// A member's part of 0 in either dimension is a denial (0, 0).
///
/// Invariant: if every holder's counted units summed to at most the pool's before the call,
/// they do after it, at every later instant (counted units only fall as time passes).
#[expect(
    clippy::cast_precision_loss,
    reason = "demands in milli-requests per second stay far below 2^53"
)]
pub fn allocate(pool: &mut Pool, request: &ShareRequest, now_us: u64) -> Grant {
    if let Some(refused) = refuse_when_full(pool, request, now_us) {
        return refused;
    }
    let fresh = pool.holders.is_empty() && pool.escrow.is_none();
    // The escrow, refilled since its last update over the pool as it was then.
    let mut tokens = escrow::refilled(pool.escrow, fresh, &pool.holders, request, now_us);
    let holders = &mut pool.holders;
    holders.retain(|(id, h)| *id == request.holder || !h.lapsed(now_us, request.hold_us));
    holders.sort_by(|a, b| a.0.cmp(&b.0));
    let me = holders.iter().position(|(id, _)| *id == request.holder);
    let previous = me.map(|i| holders[i].1.clone());
    let others: Vec<&Holding> = holders
        .iter()
        .filter(|(id, _)| *id != request.holder)
        .map(|(_, h)| h)
        .collect();
    let demand_milli = demand(previous.as_ref(), request, now_us, &others);
    let alone = others.is_empty();
    let newcomer = previous.is_none();
    let (mut used_rate, mut used_size) = (0u64, 0u64);
    for h in &others {
        let (rate, size) = h.counted(now_us);
        used_rate = used_rate.saturating_add(rate);
        used_size = used_size.saturating_add(size);
    }
    let mut mine = previous.unwrap_or_default();
    mine.demand_milli = demand_milli;
    mine.last_us = now_us;
    let who = match me {
        Some(i) => {
            holders[i].1 = mine;
            i
        }
        None => {
            let at = holders
                .iter()
                .position(|(id, _)| *id > request.holder)
                .unwrap_or(holders.len());
            holders.insert(at, (request.holder.clone(), mine));
            at
        }
    };
    let demands: Vec<u64> = holders.iter().map(|(_, h)| h.demand_milli).collect();
    let rate_budget = request.rate_units.saturating_sub(request.reserve_rate);
    let size_budget = request.size_units.saturating_sub(request.reserve_size);
    let chosen = heaviest(&demands, rate_budget.min(size_budget));
    let scale = request.fill_interval_s as f64 / 1000.0;
    let rate_demands: Vec<f64> = demands.iter().map(|d| *d as f64 * scale).collect();
    let targets = rate_targets(rate_budget, &rate_demands, &chosen);
    let rate = targets[who];
    // Sizes follow the rate targets: the same rule, weighted by them.
    let size = if rate == 0 {
        0
    } else {
        let weights: Vec<f64> = targets.iter().map(|t| *t as f64).collect();
        size_target(size_budget, &weights, &chosen, who)
    };
    // What X may take: what the others leave free, or at least what it may hold already
    // (a cut never raises the sum, even in a pool whose limit was lowered below what is out).
    let (held_rate, held_size) = holders[who].1.counted(now_us);
    let mut free_rate = request.rate_units.saturating_sub(used_rate).max(held_rate);
    let mut free_size = request.size_units.saturating_sub(used_size).max(held_size);
    // A newcomer beside others takes at most half of what is free (at least one unit), so
    // the next newcomer finds some too.
    if newcomer && !alone {
        free_rate = (free_rate / 2).max(free_rate.min(1));
        free_size = (free_size / 2).max(free_size.min(1));
    }
    let (grant_rate, grant_size) = (rate.min(free_rate), size.min(free_size));
    let (parts, total_rate, total_size) =
        members_parts(request, grant_rate, grant_size, &mut tokens, now_us);
    let held = &mut holders[who].1;
    // The assignments it replaces keep counting until their own expiry.
    let until = now_us.saturating_add(request.hold_us);
    push(&mut held.rate_steps, total_rate, until, now_us);
    push(&mut held.size_steps, total_size, until, now_us);
    let (mine_rate, mine_size) = held.counted(now_us);
    pool.escrow = Some(Escrow {
        micro: tokens,
        free_rate: request
            .rate_units
            .saturating_sub(used_rate.saturating_add(mine_rate)),
        at_us: now_us,
    });
    pool.expires_us = escrow::expiry(&pool.holders, tokens, request, now_us);
    Grant {
        rate: total_rate,
        size: total_size,
        holders: pool.holders.len() as u64,
        counted_rate: used_rate.saturating_add(mine_rate),
        counted_size: used_size.saturating_add(mine_size),
        now_us,
        members: parts,
    }
}

/// A newcomer to a pool of `max_holders` live holders is given nothing, and the pool is left
/// as it was (lapsed holders included: the escrow's next refill still counts them). Every
/// report costs a pass over the holders, so their number bounds what one call costs the store.
fn refuse_when_full(pool: &Pool, request: &ShareRequest, now_us: u64) -> Option<Grant> {
    if pool.holders.iter().any(|(id, _)| *id == request.holder) {
        return None;
    }
    let live: Vec<&Holding> = pool
        .holders
        .iter()
        .map(|(_, h)| h)
        .filter(|h| !h.lapsed(now_us, request.hold_us))
        .collect();
    if (live.len() as u64) < request.max_holders {
        return None;
    }
    let (mut counted_rate, mut counted_size) = (0u64, 0u64);
    for h in live {
        let (rate, size) = h.counted(now_us);
        counted_rate = counted_rate.saturating_add(rate);
        counted_size = counted_size.saturating_add(size);
    }
    Some(Grant {
        rate: 0,
        size: 0,
        holders: 0,
        counted_rate,
        counted_size,
        now_us,
        members: request
            .members
            .iter()
            .filter(|m| m.reported)
            .map(|_| (0, 0))
            .collect(),
    })
}

/// The holder's grant split among its reporting members (their parts, and the holder's new
/// totals: the parts plus what the silent members still hold). A member whose size grows
/// past the one it surely still applies takes the growth from the escrow's `tokens`: Envoy
/// keeps a changed bucket's fill fraction and starts a first one full.
fn members_parts(
    request: &ShareRequest,
    grant_rate: u64,
    grant_size: u64,
    tokens: &mut u64,
    now_us: u64,
) -> (Vec<(u64, u64)>, u64, u64) {
    let (mut silent_rate, mut silent_size) = (0u64, 0u64);
    let mut weights = Vec::with_capacity(request.members.len());
    for member in &request.members {
        if member.reported {
            weights.push(member.requests.min(MAX_WEIGHT - 1) + 1);
        } else if member.last.until_us > now_us {
            silent_rate = silent_rate.saturating_add(member.last.rate);
            silent_size = silent_size.saturating_add(member.last.size);
        }
    }
    let rates = split(grant_rate.saturating_sub(silent_rate), &weights);
    let sizes = split(grant_size.saturating_sub(silent_size), &weights);
    let (mut total_rate, mut total_size) = (silent_rate, silent_size);
    let reported = request.members.iter().filter(|m| m.reported);
    let parts = reported
        .zip(rates.into_iter().zip(sizes))
        .map(|(member, (mut rate, mut size))| {
            // Envoy surely still applies it when this answer arrives: it lasts the TTL plus
            // [`TRIP_MARGIN_US`] from its sending and Envoy starts the TTL on receipt, so it
            // holds until at least `until − TRIP_MARGIN_US`; the answer takes up to
            // [`TRIP_MARGIN_US`] to arrive. Else it may start full.
            let last = if member.last.until_us > now_us.saturating_add(2 * TRIP_MARGIN_US) {
                member.last.size
            } else {
                0
            };
            if size > last {
                size = size.min(last.saturating_add(*tokens / MICRO));
            }
            if rate == 0 || size == 0 {
                (rate, size) = (0, 0);
            }
            *tokens -= size.saturating_sub(last) * MICRO;
            total_rate = total_rate.saturating_add(rate);
            total_size = total_size.saturating_add(size);
            (rate, size)
        })
        .collect();
    (parts, total_rate, total_size)
}

/// A size target: at least 1, then `budget` less one per eligible holder in proportion to
/// `weights` (each holder's rate target).
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "units stay below 2^53; the quotient floors, so the sum stays within budget"
)]
fn size_target(budget: u64, weights: &[f64], eligible: &[bool], who: usize) -> u64 {
    let count = eligible.iter().filter(|e| **e).count() as u64;
    let spare = budget.saturating_sub(count) as f64;
    let total: f64 = weights
        .iter()
        .zip(eligible)
        .filter(|(_, e)| **e)
        .map(|(w, _)| *w)
        .sum();
    let extra = if total > 0.0 {
        (spare * weights[who] / total).floor()
    } else {
        0.0
    };
    1 + extra as u64
}

#[cfg(test)]
mod tests;
