//! The memory store's side of the kinds, the Rust twin of `lua/token_bucket.lua`: what a key
//! holds ([`Stored`]), what the store keeps beside it ([`Beside`]), and the decision of
//! several keys at once, all or nothing ([`decide`]). Pure functions of state and time, so
//! they are tested with an injected clock; each kind's own step is in its file.

use std::collections::HashMap;

use super::{BucketOutcome, BucketRequest, Kind, Slice};

/// A stored key. A bucket: its `debt` in micro-tokens as of `ts_us`. A quota: `debt` counts
/// what was used in the period that starts at `ts_us`. A concurrency key, as the store counted
/// it at `ts_us`: `debt` is the leases held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub debt: u64,
    pub ts_us: u64,
}

/// The marker a bucket's value starts with in Redis, `v1:<debt> <ts>` (`lua/stored.lua`).
/// The next change of format changes it; a value that starts with a letter but not with this
/// marker is of a format this release does not know, and the scripts refuse it rather than
/// read it as full.
pub const BUCKET_FORMAT: &str = "v1:";

/// A bucket's value in a format this release does not know ([`Stored::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownFormat;

impl Stored {
    /// A bucket's value as the scripts write it, without held groups: `v1:<debt> <ts>`.
    pub fn value(&self) -> String {
        format!("{BUCKET_FORMAT}{} {}", self.debt, self.ts_us)
    }

    /// A bucket's value as the scripts read it (`read_bucket`), its held groups aside: the
    /// marked form, or the unmarked `<debt> <ts>` of a build from before the marker, read the
    /// same; `Ok(None)` for garbage, which reads as full; a value of another format refused.
    pub fn parse(value: &str) -> Result<Option<Stored>, UnknownFormat> {
        let (marked, body) = match value.strip_prefix(BUCKET_FORMAT) {
            Some(body) => (true, body),
            None if value.starts_with(|c: char| c.is_ascii_alphabetic()) => {
                return Err(UnknownFormat)
            }
            None => (false, value),
        };
        let mut fields = body.splitn(3, ' ');
        let number = |field: Option<&str>| {
            field
                .filter(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))?
                .parse()
                .ok()
        };
        match (number(fields.next()), number(fields.next())) {
            (Some(debt), Some(ts_us)) => Ok(Some(Stored { debt, ts_us })),
            _ if marked => Err(UnknownFormat),
            _ => Ok(None),
        }
    }
}

/// What the memory store keeps beside its keys' levels, each kind its own part (the Redis
/// store keeps the same in the key itself or in keys beside it), by key.
#[derive(Default)]
pub struct Beside {
    /// Concurrency keys: each held lease's id and when it expires (µs); a lease is held while
    /// its expiry is after now, as the Redis script counts it.
    pub(super) leases: HashMap<String, Vec<(u128, u64)>>,
    /// Reserving buckets' reservations: held while their expiry is after now.
    pub(super) reservations: HashMap<String, Vec<Reservation>>,
    /// Their expired reservations, open to one late settle until `until` (their expiry and
    /// [`LATE_SETTLE_GRACE_US`](super::reserve::LATE_SETTLE_GRACE_US)), at most
    /// [`MAX_LATE_SETTLES`](super::reserve::MAX_LATE_SETTLES) per bucket.
    pub(super) late: HashMap<String, Vec<Reservation>>,
    /// Borrowing buckets' held groups (`lua/token_bucket.lua` writes them in the bucket's
    /// value).
    pub(super) borrowed: HashMap<String, Groups>,
    /// Global limits' shares (`lua/global.lua` keeps each beside its bucket).
    pub(super) shares: HashMap<String, Share>,
}

/// A reservation held beside its bucket (`lua/token_bucket.lua` keeps `<id>:<estimate>` scored
/// by `until`; `lua/stored.lua`'s sweep files an expired one as `<id>:<estimate>:<r|k>`).
/// What a reserving bucket does with them is [`reserve`](super::reserve)'s.
#[derive(Debug, Clone, Copy)]
pub struct Reservation {
    pub id: u128,
    pub estimate: u64,
    pub until: u64,
    /// Held: whether the check that took it gives expired estimates back (what an idle sweep
    /// applies, with no check to ask). Expired: whether its expiry gave the estimate back, what
    /// its late settle goes by.
    pub refund: bool,
}

/// The held groups of one borrowing bucket (`lua/token_bucket.lua` writes them in the
/// bucket's value). How they are taken, given back and ended is [`borrow`](super::borrow)'s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Groups {
    /// `(deadline in µs, micro-tokens held)`, an empty one `(0, 0)`.
    pub slots: [(u64, u64); 2],
    /// Which life of them this is: the store's clock when a group was taken while none was
    /// live (the script writes it after them as `i<µs>`). A give-back naming another one is
    /// of a slice taken before the bucket was deleted (`FLUSHALL`, `DEL`) and does nothing.
    pub incarnation: Option<u64>,
}

/// A share of a global limit's key the home assigned this region: `rate` tokens per second
/// and `size` whole tokens more than the floor, until `until_us` of the region store's clock
/// (`lua/global.lua` keeps it beside the bucket). What a key does with it is
/// [`global`](super::global)'s.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Share {
    pub rate: f64,
    pub size: u64,
    pub until_us: u64,
}

/// A borrowing bucket during a decision of the memory store.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lent {
    pub(super) groups: Groups,
    /// A group ended or a slice came back: written whatever the decision.
    pub(super) changed: bool,
    /// The bucket as stored before this decision.
    pub(super) found: Option<Stored>,
}

/// A key as a check found it in the memory store ([`super::Kind::find_in`]).
#[derive(Debug, Clone, Copy)]
pub struct Found {
    /// Its state as the decision reads it.
    pub state: Option<Stored>,
    /// A borrowing bucket's groups as read, for the step after the decision.
    pub(super) lent: Option<Lent>,
}

impl Found {
    /// A key read from its stored state alone.
    pub fn stored(state: Option<Stored>) -> Found {
        Found { state, lent: None }
    }
}

/// One key after the decision, for its kind to keep ([`super::Kind::keep_in`]).
pub struct Keep<'a> {
    pub request: &'a BucketRequest,
    /// Its index in the request (a slice names it).
    pub index: usize,
    /// Whether the whole request was allowed.
    pub allowed: bool,
    pub found: Found,
    /// Its state and outcome after the decision: the step may change both (a slice taken).
    pub state: &'a mut Option<Stored>,
    pub outcome: &'a mut BucketOutcome,
    pub now_us: u64,
}

impl Keep<'_> {
    /// The key paid its cost: the request was allowed, the key could pay, the cost is not 0.
    pub fn charged(&self) -> bool {
        self.allowed && self.outcome.enough && self.request.cost > 0
    }
}

/// What a kind kept of one key after the decision ([`super::Kind::keep_in`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Kept {
    /// When the key's state, if any, may be forgotten; `None`: its state is not stored (a
    /// concurrency key is its leases).
    pub forget_at_us: Option<u64>,
    /// A slice the key lent.
    pub slice: Option<Slice>,
    /// A key counted against the store's cap went (its last lease expired), or came (its
    /// first lease was taken).
    pub key_went: bool,
    pub key_came: bool,
}

impl Kept {
    /// A key whose state is stored until `forget_at_us`.
    pub fn stored(state: &Option<Stored>, forget_at_us: impl Fn(&Stored) -> u64) -> Kept {
        Kept {
            forget_at_us: state.as_ref().map(forget_at_us),
            ..Kept::default()
        }
    }
}

/// Decides `requests` against their current states, all-or-nothing, and writes the new states
/// back into `states` (same order). Mirrors the Lua script step for step: only a charge writes
/// (a denial or a cost of 0 leaves the state as it was).
pub fn decide(
    requests: &[BucketRequest],
    states: &mut [Option<Stored>],
    now_us: u64,
) -> (bool, Vec<BucketOutcome>) {
    let found: Vec<(BucketOutcome, u64)> = requests
        .iter()
        .zip(states.iter())
        .map(|(request, state)| request.meter.find(request, *state, now_us))
        .collect();
    let allowed = requests
        .iter()
        .zip(&found)
        .all(|(request, (outcome, _))| outcome.enough || request.shadow);
    let mut outcomes = Vec::with_capacity(found.len());
    for ((request, (mut outcome, debt)), state) in requests.iter().zip(found).zip(states.iter_mut())
    {
        if allowed && outcome.enough && request.cost > 0 {
            request
                .meter
                .charge(request, debt, &mut outcome, state, now_us);
        }
        outcomes.push(outcome);
    }
    (allowed, outcomes)
}

#[cfg(test)]
mod tests;
