//! Shares of one limit among the Envoys that stream to tollgate (RLQS): the Rust twin of
//! `lua/shares.lua`, a pure function of the pool's holders, one holder's report and the
//! store's time, so it is tested with an injected clock and random demand.
//!
//! A *pool* is one (limit, key). Its capacity is counted in whole *units*: `rate_units`
//! tokens per fill interval (a rate share of `u` units is `u / fill_interval_s` tokens per
//! second) and `size_units` tokens of bucket size. A *holder* is one Envoy's stream. Every
//! assignment sent to a holder counts against the pool until its expiry (the TTL sent, plus
//! a margin for the trip to Envoy), even after a smaller one replaced it: so a cut is in force
//! before the capacity it frees is handed to another holder, and the sums of what the Envoys
//! may hold never pass the pool's units ([`allocate`]'s invariant, checked by the tests).
//!
//! Sums of sizes are not enough for the tokens: Envoy starts a grown bucket at its old fill
//! fraction and a first one full. So a size grows only with tokens from the pool's
//! [`Escrow`], the size nobody counts, which refills only at the rate nobody counts: the pool
//! behaves as one global bucket (DESIGN, "The escrow").
//!
//! All arithmetic is on integers or on `f64` operations performed in the same order as the
//! script's, so both stores reach the same integers.

/// The most steps one holder's staircase keeps (see [`Holding`]); past it the two oldest
/// merge, conservatively (the larger value, the later expiry).
pub const MAX_STEPS: usize = 8;

/// What one holder has been given, as the pool counts it.
///
/// Each dimension is a staircase: `(units, until_us)` steps, oldest first, values strictly
/// falling as expiries rise. An assignment of `g` units until `u` drops the steps it covers
/// (those of at most `g` units; they expire before `u`) and is appended, so what the holder
/// may hold at any later instant is the first unexpired step's value: the largest
/// assignment sent to it that has not expired yet, whether or not a smaller one replaced it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// Demand at its last report, in milli-requests per second.
    pub demand_milli: u64,
    /// When it last reported (µs, store clock).
    pub last_us: u64,
    pub rate_steps: Vec<(u64, u64)>,
    pub size_steps: Vec<(u64, u64)>,
}

/// The value of a staircase at `now_us`.
fn level(steps: &[(u64, u64)], now_us: u64) -> u64 {
    steps
        .iter()
        .find(|(_, until)| *until > now_us)
        .map_or(0, |(units, _)| *units)
}

/// A staircase after sending `units` until `until_us` at `now_us`. A denial (0) is kept as
/// a step too, so the newest step is always what was last sent.
fn push(steps: &mut Vec<(u64, u64)>, units: u64, until_us: u64, now_us: u64) {
    steps.retain(|(held, until)| *until > now_us && *held > units);
    steps.push((units, until_us));
    if steps.len() > MAX_STEPS {
        let (_, later) = steps.remove(1);
        steps[0].1 = later;
    }
}

impl Holding {
    /// What this holder may hold at `now_us` (rate units, size units).
    pub fn counted(&self, now_us: u64) -> (u64, u64) {
        (
            level(&self.rate_steps, now_us),
            level(&self.size_steps, now_us),
        )
    }

    /// The size last sent to it, if Envoy surely still applies it when an answer sent at
    /// `now_us` arrives (else 0: Envoy's next bucket may start full). A step lasts the TTL
    /// plus [`TRIP_MARGIN_US`] from its sending and Envoy starts the TTL on receipt, so it
    /// holds the assignment until at least `until − TRIP_MARGIN_US`; the answer takes up to
    /// [`TRIP_MARGIN_US`] to arrive.
    pub fn last_sent_size(&self, now_us: u64) -> u64 {
        self.size_steps
            .last()
            .filter(|(_, until)| *until > now_us.saturating_add(2 * TRIP_MARGIN_US))
            .map_or(0, |(units, _)| *units)
    }

    /// Whether it may be forgotten at `now_us`: nothing it was given counts, and it has not
    /// reported for `quiet_us`.
    pub fn lapsed(&self, now_us: u64, quiet_us: u64) -> bool {
        let counts = |steps: &[(u64, u64)]| steps.iter().any(|(_, until)| *until > now_us);
        !counts(&self.rate_steps)
            && !counts(&self.size_steps)
            && self.last_us.saturating_add(quiet_us) <= now_us
    }

    /// The stored form (as `lua/shares.lua` writes it): integers separated by spaces: demand,
    /// last report, the rate steps' count then each step's units and expiry, the same for
    /// sizes.
    pub fn encode(&self) -> String {
        let mut text = format!("{} {}", self.demand_milli, self.last_us);
        for steps in [&self.rate_steps, &self.size_steps] {
            text.push_str(&format!(" {}", steps.len()));
            for (units, until) in steps {
                text.push_str(&format!(" {units} {until}"));
            }
        }
        text
    }

    /// The stored form read back; anything else reads as absent.
    pub fn decode(text: &str) -> Option<Holding> {
        let mut numbers = text.split(' ').map(|n| n.parse::<u64>().ok());
        let mut next = || numbers.next().flatten();
        let demand_milli = next()?;
        let last_us = next()?;
        let mut steps = || -> Option<Vec<(u64, u64)>> {
            let count = usize::try_from(next()?).ok().filter(|n| *n <= MAX_STEPS)?;
            (0..count).map(|_| Some((next()?, next()?))).collect()
        };
        let rate_steps = steps()?;
        let size_steps = steps()?;
        if next().is_some() {
            return None;
        }
        Some(Holding {
            demand_milli,
            last_us,
            rate_steps,
            size_steps,
        })
    }
}

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

/// One report of one holder, with the pool's numbers as the policy gives them now.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareRequest {
    /// The pool's store key.
    pub key: String,
    /// The reporting holder (its stream's id).
    pub holder: String,
    /// Requests it allowed and denied since its last report.
    pub requests: u64,
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
}

/// What the reporting holder is given, and the pool afterwards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grant {
    /// Rate units (tokens per fill interval); 0 with `size` 0: deny all.
    pub rate: u64,
    /// Bucket size in tokens.
    pub size: u64,
    /// Holders in the pool (the reporter included).
    pub holders: u64,
    /// What every holder may hold now, summed (the reporter's grant included).
    pub counted_rate: u64,
    pub counted_size: u64,
}

/// The largest request count one report is taken at (9 million in 5 s: 1.8 million requests
/// per second through one Envoy for one bucket), so that demands summed over a thousand
/// holders stay exact in a double, as the script computes them.
pub const MAX_REQUESTS: u64 = 9_000_000;
/// The reporting interval a first report's requests are spread over (Envoy reports every 5 s).
pub const FIRST_REPORT_MS: u64 = 5_000;

/// The reporter's demand in milli-requests per second: its requests over the time since its
/// last report on the store's clock; a newcomer's is the mean of the others' (or its first
/// report's requests over [`FIRST_REPORT_MS`] when alone or larger).
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "requests are capped at MAX_REQUESTS so the product is exact; the quotient floors"
)]
fn demand(previous: Option<&Holding>, requests: u64, now_us: u64, others: &[&Holding]) -> u64 {
    let requests = requests.min(MAX_REQUESTS) as f64;
    match previous {
        Some(held) if now_us > held.last_us => {
            let elapsed_ms = ((now_us - held.last_us) / 1000).max(1);
            (requests * 1_000_000.0 / elapsed_ms as f64).floor() as u64
        }
        Some(held) => held.demand_milli,
        None => {
            let own = (requests * 1_000_000.0 / FIRST_REPORT_MS as f64).floor() as u64;
            if others.is_empty() {
                return own;
            }
            let sum: u64 = others
                .iter()
                .map(|h| h.demand_milli)
                .fold(0, u64::saturating_add);
            own.max(sum / others.len() as u64)
        }
    }
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

/// Which holders (sorted by id) get at least one unit: all when `units` allow, else the
/// `units` with the highest demand (ties: the lower id).
fn eligible(demands: &[u64], units: u64) -> Vec<bool> {
    let n = demands.len();
    if (n as u64) <= units {
        return vec![true; n];
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| demands[*b].cmp(&demands[*a]).then(a.cmp(b)));
    let mut chosen = vec![false; n];
    for index in order
        .into_iter()
        .take(usize::try_from(units).unwrap_or(usize::MAX))
    {
        chosen[index] = true;
    }
    chosen
}

/// One report: updates the reporter's demand, forgets holders whose assignments all lapsed,
/// and gives the reporter `min(target, free)` in each dimension, where `free` is the pool
/// less what every other holder may still hold, or what the reporter may hold already if
/// that is more (a pool whose limit was lowered: cuts go out, nothing grows); a size above
/// the one last sent to the reporter takes the difference from the escrow, and is limited to
/// what it holds. `pool` is as stored (holders in any order); it is updated in place, its
/// escrow and expiry included. A grant of 0 in either dimension is a denial (0, 0).
///
/// Invariant: if every holder's counted units summed to at most the pool's before the call,
/// they do after it, at every later instant (counted units only fall as time passes).
#[expect(
    clippy::cast_precision_loss,
    reason = "demands in milli-requests per second stay far below 2^53"
)]
pub fn allocate(pool: &mut Pool, request: &ShareRequest, now_us: u64) -> Grant {
    let fresh = pool.holders.is_empty() && pool.escrow.is_none();
    // The escrow, refilled since its last update over the pool as it was then.
    let mut tokens = refilled(pool.escrow, fresh, &pool.holders, request, now_us);
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
    let demand_milli = demand(previous.as_ref(), request.requests, now_us, &others);
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
    let chosen = eligible(&demands, rate_budget.min(size_budget));
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
    let (mut grant_rate, mut grant_size) = (rate.min(free_rate), size.min(free_size));
    // A growth past the size last sent needs its tokens from the escrow (Envoy keeps a
    // changed bucket's fill fraction and starts a first one full).
    let last_sent = holders[who].1.last_sent_size(now_us);
    if grant_size > last_sent {
        grant_size = grant_size.min(last_sent.saturating_add(tokens / MICRO));
    }
    if grant_rate == 0 || grant_size == 0 {
        (grant_rate, grant_size) = (0, 0);
    }
    tokens -= grant_size.saturating_sub(last_sent) * MICRO;
    let held = &mut holders[who].1;
    // The assignments it replaces keep counting until their own expiry.
    let until = now_us.saturating_add(request.hold_us);
    push(&mut held.rate_steps, grant_rate, until, now_us);
    push(&mut held.size_steps, grant_size, until, now_us);
    let (mine_rate, mine_size) = held.counted(now_us);
    pool.escrow = Some(Escrow {
        micro: tokens,
        free_rate: request
            .rate_units
            .saturating_sub(used_rate.saturating_add(mine_rate)),
        at_us: now_us,
    });
    pool.expires_us = expiry(&pool.holders, tokens, request, now_us);
    Grant {
        rate: grant_rate,
        size: grant_size,
        holders: pool.holders.len() as u64,
        counted_rate: used_rate.saturating_add(mine_rate),
        counted_size: used_size.saturating_add(mine_size),
    }
}

/// The escrow's tokens (millionths) at `now_us`, as a bucket capped at the unassigned size:
/// from its last update, each stretch between two step expiries of the pool as it was then
/// (`holders`, as read; nothing was sent in between) adds the rate no Envoy can be refilling
/// in that stretch, and is capped at that stretch's unassigned size (refill past the cap is
/// lost, as in a full bucket). A pool never written starts full, one written before the
/// escrow existed empty.
///
/// The rate of a stretch is the pool's rate less the counted rates of the holders whose
/// counted size is above 0: an Envoy applies at most what its holder counts, so one whose
/// counted size is 0 holds no token and refills none, and a rate step that expired refills
/// nothing from then on. The pool's rate is the smaller of the one given now and the one the
/// stored free rate was computed with (free plus what was counted then), so a changed limit
/// never credits the past stretches with more than either.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the same double operations as the script; the result is capped at the unassigned size"
)]
fn refilled(
    escrow: Option<Escrow>,
    fresh: bool,
    holders: &[(String, Holding)],
    request: &ShareRequest,
    now_us: u64,
) -> u64 {
    let cap_at = |t: u64| -> f64 {
        let used = holders
            .iter()
            .map(|(_, h)| level(&h.size_steps, t))
            .fold(0u64, u64::saturating_add);
        request
            .size_units
            .saturating_sub(used)
            .saturating_mul(MICRO) as f64
    };
    let Some(e) = escrow else {
        return if fresh { cap_at(now_us) as u64 } else { 0 };
    };
    // Rate units counted at `t`: all of them, or only those of holders that may hold a token.
    let rate_at = |t: u64, refilling_only: bool| -> u64 {
        holders
            .iter()
            .filter(|(_, h)| !refilling_only || level(&h.size_steps, t) > 0)
            .map(|(_, h)| level(&h.rate_steps, t))
            .fold(0u64, u64::saturating_add)
    };
    let ceiling = e
        .free_rate
        .saturating_add(rate_at(e.at_us, false))
        .min(request.rate_units);
    let fill = request.fill_interval_s.max(1) as f64;
    let mut times: Vec<u64> = holders
        .iter()
        .flat_map(|(_, h)| h.rate_steps.iter().chain(&h.size_steps))
        .map(|(_, until)| *until)
        .filter(|until| *until > e.at_us && *until < now_us)
        .collect();
    times.sort_unstable();
    times.dedup();
    times.push(now_us);
    let mut tokens = e.micro as f64;
    let mut t = e.at_us;
    for tau in times {
        let free = ceiling.saturating_sub(rate_at(t, true));
        let refill = (free as f64 * tau.saturating_sub(t) as f64 / fill).floor();
        tokens = (tokens + refill).min(cap_at(t));
        t = tau;
    }
    tokens.min(cap_at(now_us)) as u64
}

/// When the pool's record may vanish (µs): after every holder's steps and quiet time, plus
/// the time the escrow needs to refill the whole size at the pool's full rate, so an absent
/// record really means a full escrow (at most [`MAX_FILL_US`] later).
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the same double operations as the script; capped at MAX_FILL_US"
)]
fn expiry(holders: &[(String, Holding)], tokens: u64, request: &ShareRequest, now_us: u64) -> u64 {
    let mut last = now_us.saturating_add(request.hold_us);
    for (_, h) in holders {
        for (_, until) in h.rate_steps.iter().chain(&h.size_steps) {
            last = last.max(*until);
        }
        last = last.max(h.last_us.saturating_add(request.hold_us));
    }
    let missing = request
        .size_units
        .saturating_mul(MICRO)
        .saturating_sub(tokens) as f64;
    let fill_us = (missing * request.fill_interval_s.max(1) as f64
        / request.rate_units.max(1) as f64)
        .ceil()
        .min(MAX_FILL_US as f64);
    last.saturating_add(fill_us as u64)
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

/// The memory store's pools: each behind one lock taken once per report (a report message
/// every few seconds per Envoy, never a request's path).
#[derive(Debug, Default)]
pub struct Pools {
    pools: std::sync::Mutex<std::collections::HashMap<String, Pool>>,
}

impl Pools {
    /// [`allocate`] on the pool `request.key`; a pool past its expiry is dropped.
    pub fn share(&self, request: &ShareRequest, now_us: u64) -> Grant {
        let mut pools = self
            .pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pools.retain(|_, pool| pool.expires_us > now_us);
        let pool = pools.entry(request.key.clone()).or_default();
        allocate(pool, request, now_us)
    }

    /// The holders of pool `key` that still hold something at `now_us`, sorted by id.
    pub fn holders(&self, key: &str, now_us: u64) -> Vec<(String, Holding)> {
        let pools = self
            .pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut holders: Vec<(String, Holding)> = pools
            .get(key)
            .map(|pool| {
                pool.holders
                    .iter()
                    .filter(|(_, h)| h.counted(now_us) != (0, 0))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        holders.sort_by(|a, b| a.0.cmp(&b.0));
        holders
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(holder: &str, requests: u64) -> ShareRequest {
        ShareRequest {
            key: "pool".into(),
            holder: holder.into(),
            requests,
            rate_units: 1000,
            size_units: 100,
            reserve_rate: 50,
            reserve_size: 5,
            fill_interval_s: 100,
            hold_us: 11_000_000,
        }
    }

    #[test]
    fn a_single_envoy_gets_all_but_the_reserve() {
        let mut pool = Pool::default();
        let grant = allocate(&mut pool, &request("a", 100), 1_000_000);
        assert_eq!((grant.rate, grant.size), (950, 95));
        let grant = allocate(&mut pool, &request("a", 100), 6_000_000);
        assert_eq!((grant.rate, grant.size), (950, 95));
    }

    #[test]
    fn a_cut_counts_until_the_assignment_it_replaces_expires() {
        let mut pool = Pool::default();
        allocate(&mut pool, &request("a", 1000), 0);
        // b arrives: only the reserve is free, and a newcomer takes half of it.
        let b = allocate(&mut pool, &request("b", 1000), 1_000_000);
        assert_eq!((b.rate, b.size), (25, 2));
        // a reports: its target is half; it is cut at once...
        let a = allocate(&mut pool, &request("a", 1000), 5_000_000);
        assert_eq!(a.rate, 475);
        // ...but its old 950 counts until 11 s: b cannot grow before.
        let b = allocate(&mut pool, &request("b", 1000), 6_000_000);
        assert_eq!(b.rate, 50);
        let b = allocate(&mut pool, &request("b", 1000), 11_000_001);
        assert_eq!(b.rate, 475);
        assert!(b.counted_rate <= 1000);
    }
}
