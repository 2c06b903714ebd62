//! What a store key counts: a limit's *kind*. Each kind is a unit of code in a file of its
//! own, owning all that differs between kinds: how a limit of it is built and checked from
//! its config, how it is spelled to the Lua scripts and read back from their replies, its step
//! in the memory store (the scripts' Rust twin), what a peek and `GET /v1/limits` show of it,
//! and its report or settle where it has them:
//!
//! - [`bucket`]: a token bucket (`rate` and `burst`);
//! - [`quota`]: at most `quota` per calendar `period`;
//! - [`concurrency`]: at most `concurrency` leases held at once;
//! - [`reserve`]: a token bucket whose charge is held as a reservation until settled;
//! - [`borrow`]: a token bucket from which instances borrow slices of tokens;
//! - [`global`]: a global limit's key in a region, decided against its floor and share.
//!
//! [`Meter`] names a key's kind and hands every question to it in one place ([`meter`], one
//! match); [`Kind`] lists what a kind answers, all a new kind has to fill in, and
//! [`build`] chooses a limit's kind from its config. Shared by the kinds: [`tokens`], the
//! token-bucket arithmetic of the plain, reserving and borrowing buckets; [`twin`], what the
//! memory store keeps beside its keys' levels and how it decides several keys at once.
//!
//! The layer sits below the store and knows no connection, lock or shard: both stores, the
//! policy and the admin API ask it the same questions.

pub mod borrow;
pub mod bucket;
pub mod build;
pub mod concurrency;
pub mod global;
pub mod meter;
pub mod quota;
pub mod reserve;
pub mod tokens;
pub mod twin;

use serde::Serialize;

use crate::base::calendar::Period;
use crate::base::rate::count_f64;

use borrow::Borrow;
use concurrency::Lease;
use reserve::Reserve;
use twin::{Beside, Found, Keep, Kept, Stored};

/// What a store key counts. Each kind is named as a limit's config names it: `rate` and
/// `burst` make a `Bucket`, then `quota`, `concurrency`, `reserve` and `borrow`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Meter {
    /// A token bucket: `rate` per second, capacity `burst`.
    #[default]
    Bucket,
    /// At most `burst` per calendar period (UTC on the store's clock); `rate` is unused.
    Quota(Period),
    /// At most `burst` leases held at once (`rate` is unused, the cost is one lease).
    Concurrency(Lease),
    /// A token bucket whose charge is held as a reservation until settled.
    Reserve(Reserve),
    /// A token bucket from which the instance borrows (`docs/DESIGN.md`).
    Borrow(Borrow),
    /// A global limit's key in a region: its floor and the home's share (`docs/regions.md`).
    Global(global::Global),
}

/// What every kind answers, by topic: the policy's questions, the scripts' spelling, the
/// arithmetic, the memory twin's step, the peek. A new kind implements it in a file of its
/// own, adds a variant to [`Meter`] (an arm to [`meter`]'s match) and to the views it shows
/// ([`LimitView`], [`PeekView`]), and its choice from the config to [`build`]; the stores,
/// the policy and the admin API then ask it as they ask the others.
pub trait Kind {
    /// A token bucket at heart: `rate` and `burst`, refilling with time, its level in
    /// micro-tokens. Quotas and concurrency keys count whole requests and ignore the rate.
    fn is_token_bucket(&self) -> bool;

    /// This kind as one check asks for it: a lease or a reservation with an id of its own.
    fn for_check(&self) -> Meter;

    /// The `RateLimit-Policy` window (`w=`) of a limit of this kind with `rate` and `burst`:
    /// a bucket's full refill, a quota's period (a month: 30 days; its length is filled in
    /// per decision), a lease's lifetime.
    fn policy_window_secs(&self, rate: f64, burst: u64) -> u64;

    /// Why a runtime override cannot apply to a limit of this kind, if it cannot (the rest of
    /// "limit \"name\" ...: overrides are not supported on it").
    fn refuses_overrides(&self) -> Option<&'static str> {
        None
    }

    /// A limit of this kind as `GET /v1/limits` shows it.
    fn limit_view(&self, limit: &Configured<'_>) -> LimitView;

    /// The first argument a check (`lua/token_bucket.lua`) and a report (`lua/report.lua`)
    /// take for a key of this kind at `rate`.
    fn script_arg(&self, rate: f64) -> ScriptArg;

    /// The first argument of a peek (`lua/peek.lua`), which reads a key and charges nothing.
    fn peek_arg(&self, rate: f64) -> ScriptArg;

    /// What a level in a check's reply is divided by to read as tokens.
    fn level_scale(&self) -> f64;

    /// The window of a key of this kind after a script ran, drawing what its reply gives
    /// from `numbers`; `None` when they are missing (a malformed reply).
    fn read_window(&self, numbers: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Window>>;

    /// The slice a check of bucket `index` took, read from the numbers after the windows of
    /// its reply (`now`: the reply's time); `None` when they are missing.
    fn read_slice(
        &self,
        numbers: &mut dyn FnMut() -> Option<u64>,
        index: usize,
        now: &str,
    ) -> Option<Option<Slice>> {
        let _ = (numbers, index, now);
        Some(None)
    }

    /// What a peek's reply says is held aside beside the key (reservations, borrowed tokens);
    /// `None` when the numbers are missing.
    fn read_held(&self, numbers: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Reserved>> {
        let _ = numbers;
        Some(None)
    }

    // `find`, `charge`, `report` and `forget_at_us` default to the token bucket's arithmetic,
    // which the plain, reserving and borrowing buckets share (`tokens`); quotas and
    // concurrency limits count otherwise.

    /// The key as a check finds it at `now_us` from its `stored` state, before any charge: its
    /// outcome, and the debt a charge adds to (a token bucket's, in micro-tokens).
    fn find(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        now_us: u64,
    ) -> (BucketOutcome, u64) {
        tokens::find(request, stored, now_us)
    }

    /// Charges the key found with `debt` (its request allowed and the key able to pay):
    /// `outcome` shows what is left, `state` what is stored.
    fn charge(
        &self,
        request: &BucketRequest,
        debt: u64,
        outcome: &mut BucketOutcome,
        state: &mut Option<Stored>,
        now_us: u64,
    ) {
        tokens::charge(request, debt, outcome, state, now_us);
    }

    /// Applies a charge known after the response (`lua/report.lua`).
    fn report(
        &self,
        charge: &ReportCharge,
        state: &mut Option<Stored>,
        now_us: u64,
    ) -> BucketOutcome {
        tokens::report(charge, state, now_us)
    }

    /// When a key of this kind stored as `stored` may be forgotten: it then reads as absent.
    fn forget_at_us(&self, stored: &Stored, rate: f64) -> u64 {
        stored.full_at_us(rate)
    }

    /// Whether the memory store may decide a lone request for `key` from its stored state
    /// alone: nothing kept beside it changes the reading.
    fn alone(&self, key: &str, beside: &Beside) -> bool {
        let _ = (key, beside);
        false
    }

    /// The key as a check finds it in the memory store, doing first what the script does
    /// before it decides (expired reservations swept, ended groups settled).
    fn find_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &mut Beside,
        now_us: u64,
    ) -> Found;

    /// After the decision: what the memory store keeps beside the key (a lease taken, a
    /// reservation held, a slice lent), and whether and until when it stores its state.
    fn keep_in(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept;

    /// The key as the next check would find it in the memory store; nothing is written.
    fn peek_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &Beside,
        now_us: u64,
    ) -> BucketOutcome;

    /// Whether a key of this kind holds anything aside (reservations, borrowed tokens), which
    /// a peek reads too ([`Kind::held_in`], [`Kind::read_held`]).
    fn holds_aside(&self) -> bool {
        false
    }

    /// What the memory store holds aside beside `key` now (a peek).
    fn held_in(&self, key: &str, beside: &Beside, now_us: u64) -> Reserved {
        let _ = (key, beside, now_us);
        Reserved::default()
    }

    /// The key of `request` as `GET /v1/buckets` shows it.
    fn peek_view(&self, request: &BucketRequest, peeked: &Peeked) -> PeekView;
}

/// One bucket's first argument to a script, as [`Kind::script_arg`] and [`Kind::peek_arg`]
/// spell it: the Redis store writes it (a number the cheapest way it can).
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptArg {
    /// A token bucket's rate, tokens per second.
    Number(f64),
    /// A fixed word: a quota's period code, a peek's concurrency mark.
    Code(&'static str),
    /// The kind's letter and its fields, `:`-separated as the script splits them.
    Text(String),
}

/// Where a quota's period (or a lease's lifetime) stands after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Whole seconds until the period ends (at least 1).
    pub ends_in_s: u64,
    /// The period's length in seconds (a month's depends on the month).
    pub length_s: u64,
}

/// One key to draw from.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketRequest {
    /// The full store key, built by [`crate::base::keys`].
    pub key: String,
    /// Tokens per second.
    pub rate: f64,
    /// Capacity.
    pub burst: f64,
    /// 0: admitted while the key is not used up (tokens or quota left above 0), charged nothing.
    pub cost: u64,
    /// Reported, never denies.
    pub shadow: bool,
    /// The caller's tag for this bucket (the index of its limit); stores pass it through.
    pub limit: usize,
    pub meter: Meter,
}

/// Built the way a limit reads: `BucketRequest::bucket(key, 10.0, 20.0).cost(3)`. Each starts
/// at one token (or one lease) per request, not shadow, tagged with limit 0.
impl BucketRequest {
    /// A token bucket: `rate` tokens per second, capacity `burst`.
    pub fn bucket(key: impl Into<String>, rate: f64, burst: f64) -> BucketRequest {
        BucketRequest {
            key: key.into(),
            rate,
            burst,
            cost: 1,
            shadow: false,
            limit: 0,
            meter: Meter::Bucket,
        }
    }

    /// A key of `meter`'s kind with `rate` (ignored unless a token bucket) and `burst`.
    pub fn of(key: impl Into<String>, meter: Meter, rate: f64, burst: f64) -> BucketRequest {
        let rate = if meter.is_token_bucket() { rate } else { 0.0 };
        BucketRequest {
            meter,
            ..BucketRequest::bucket(key, rate, burst)
        }
    }

    /// At most `count` per calendar `period`.
    pub fn quota(key: impl Into<String>, period: Period, count: u64) -> BucketRequest {
        BucketRequest::of(key, Meter::Quota(period), 0.0, count_f64(count))
    }

    /// At most `count` leases held at once; this request takes `lease`.
    pub fn lease(key: impl Into<String>, count: u64, lease: Lease) -> BucketRequest {
        BucketRequest::of(key, Meter::Concurrency(lease), 0.0, count_f64(count))
    }

    /// A token bucket whose charge (the estimate, [`BucketRequest::cost`]) is held as
    /// `reservation` until settled.
    pub fn reserve(
        key: impl Into<String>,
        rate: f64,
        burst: f64,
        reservation: Reserve,
    ) -> BucketRequest {
        BucketRequest::of(key, Meter::Reserve(reservation), rate, burst)
    }

    /// Charges `cost` tokens (0: a look that charges nothing).
    #[must_use]
    pub fn cost(mut self, cost: u64) -> BucketRequest {
        self.cost = cost;
        self
    }

    /// Reported, never denies.
    #[must_use]
    pub fn shadow(mut self) -> BucketRequest {
        self.shadow = true;
        self
    }

    /// Tagged with the index of its limit.
    #[must_use]
    pub fn limit(mut self, limit: usize) -> BucketRequest {
        self.limit = limit;
        self
    }

    /// A token bucket this instance borrows from as `borrow` says.
    #[must_use]
    pub fn borrowing(mut self, borrow: Borrow) -> BucketRequest {
        self.meter = match self.meter {
            Meter::Global(global) => Meter::Global(global.borrowing(borrow)),
            _ => Meter::Borrow(borrow),
        };
        self
    }
}

/// One key after a decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketOutcome {
    /// Tokens left after the call (after the charge, if the request was allowed); for a
    /// quota, what is left of it. Negative for a bucket in debt.
    pub tokens: f64,
    /// Whether the key held its cost (cost 0: held one whole request).
    pub enough: bool,
    /// For a quota: its period; for a concurrency key: its lease's lifetime.
    pub window: Option<Window>,
}

/// A charge known after the response (`POST /report`): always applied. A bucket goes at most
/// `max_debt` below 0; a quota counts the whole cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportCharge {
    /// `key`, `rate`, `burst`, `meter` and `cost` as for a check; `shadow` is ignored.
    pub bucket: BucketRequest,
    pub max_debt: f64,
}

/// A slice a check took: `tokens` whole tokens held until `deadline_us` of the store's clock,
/// which read `now_us` when it decided (a borrowing bucket, [`borrow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// Index of the bucket in the request.
    pub bucket: usize,
    pub tokens: u64,
    pub deadline_us: u64,
    pub now_us: u64,
    /// Which life of the bucket's held groups it went into: the store's clock (µs) when the
    /// first of them was taken after none was held. Its give-back names it.
    pub incarnation: u64,
}

/// What is held aside beside a key (a peek): a reserving bucket's reservations, or the
/// tokens a borrowing bucket's live slices hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Their estimates' (or slices') sum, in whole tokens.
    pub tokens: u64,
    /// How many reservations (or groups of slices) hold them.
    pub held: u64,
}

/// Whether a key holding `level` can pay `cost`. A cost of 0 (a look) asks that one whole
/// request is left: a refilling bucket holds a sliver above 0 almost always, which admits
/// nothing.
pub fn can_pay(level: f64, cost: u64) -> bool {
    level >= count_f64(cost.max(1))
}

/// A limit's numbers as `GET /v1/limits` shows them beside its kind.
pub struct Configured<'a> {
    pub rate: f64,
    pub burst: u64,
    /// A reserving limit's least estimate, and the header that may raise it.
    pub reserve: u64,
    pub reserve_header: Option<&'a str>,
}

/// A limit's kind as `GET /v1/limits` shows it, its fields beside the limit's own.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum LimitView {
    Bucket(tokens::Shown),
    Quota(quota::Shown),
    Concurrency(concurrency::Shown),
    Reserving(reserve::Shown),
}

/// What a peek found of a key, for its kind to show.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peeked {
    pub outcome: BucketOutcome,
    /// Whole tokens left, and the seconds until full (a quota: until its period ends), as
    /// the headers show them.
    pub remaining: u64,
    pub reset_secs: u64,
    /// What the store holds aside beside the key, when its kind holds anything.
    pub held: Option<Reserved>,
    /// Borrowed tokens this instance holds unused.
    pub borrowed_here: u64,
}

/// A key as `GET /v1/buckets` shows it, its fields beside the peek's own.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PeekView {
    Bucket(bucket::Peek),
    Quota(quota::Peek),
    Concurrency(concurrency::Peek),
    Borrowing(borrow::Peek),
    Reserving(reserve::Peek),
}

impl Beside {
    /// Drops what has expired by `now_us` when the memory store makes room, each kind its
    /// own (`bucket`: whether a key's level is still stored); returns the keys dropped that
    /// counted against the store's cap.
    pub fn drop_expired(&mut self, now_us: u64, bucket: impl Fn(&str) -> bool) -> usize {
        let freed = self.drop_expired_leases(now_us);
        self.drop_ended_shares(now_us);
        self.drop_idle_reservations(now_us, bucket);
        freed
    }
}

/// An id no other check draws (a lease's, a reservation's): 128 random bits (from the OS;
/// should it fail, from a per-process random hasher over a counter and the time).
fn fresh_id() -> u128 {
    let mut bytes = [0u8; 16];
    if getrandom::getrandom(&mut bytes).is_ok() {
        return u128::from_le_bytes(bytes);
    }
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let state = std::hash::RandomState::new();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (u128::from(state.hash_one((count, nanos))) << 64) | u128::from(state.hash_one((nanos, count)))
}

#[cfg(test)]
mod tests;
