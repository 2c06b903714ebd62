//! One shard of the memory store: its buckets, leases, reservations and borrowed groups, and
//! what a decision reads or changes in them.

use std::collections::HashMap;

use crate::store::bucket::Bucket;
use crate::store::held::{self, Groups};
use crate::store::{
    Borrow, BucketOutcome, BucketRequest, Meter, Reserved, Slice, LATE_SETTLE_GRACE_US,
    MAX_LATE_SETTLES,
};

pub struct Entry {
    pub bucket: Bucket,
    pub full_at_us: u64,
}

#[derive(Default)]
pub struct Shard {
    pub buckets: HashMap<String, Entry>,
    /// Concurrency keys: each held lease's id and when it expires (µs); a lease is held while
    /// its expiry is after now, as the Redis script counts it.
    pub leases: HashMap<String, Vec<(u128, u64)>>,
    /// Reserving buckets' reservations, by bucket key: held while their expiry is after now.
    pub reservations: HashMap<String, Vec<Reservation>>,
    /// Their expired reservations, open to one late settle until `until` (their expiry and
    /// [`LATE_SETTLE_GRACE_US`]), at most [`MAX_LATE_SETTLES`] per bucket.
    pub late: HashMap<String, Vec<Reservation>>,
    /// Borrowing buckets' held groups, by bucket key (`lua/token_bucket.lua` writes them in
    /// the bucket's value).
    pub borrowed: HashMap<String, Groups>,
}

/// The tokens held now by a borrowing bucket's live groups (whole tokens, rounded up), and
/// how many groups hold them: what [`Store::reserved`] reports for a borrowing bucket.
pub fn borrowed_now(groups: Option<&Groups>, now: u64) -> Reserved {
    let live = groups
        .into_iter()
        .flat_map(|g| g.slots)
        .filter(|&(deadline, tokens)| tokens > 0 && deadline > now);
    Reserved {
        tokens: live.clone().map(|g| g.1).sum::<u64>().div_ceil(1_000_000),
        held: live.count() as u64,
    }
}

/// A borrowing bucket during a decision.
#[derive(Debug, Clone, Copy)]
pub struct Lent {
    pub groups: Groups,
    /// A group ended or a slice came back: written whatever the decision.
    pub changed: bool,
    /// The bucket as stored before this decision.
    pub found: Option<Bucket>,
}

/// After the decision: each charged borrowing bucket takes its slice, as the script does;
/// a borrowing bucket that neither changed nor was charged keeps its stored state (only the
/// script's writes are mirrored, so both round alike). Returns the slices taken.
#[expect(
    clippy::cast_precision_loss,
    reason = "debts and levels stay below 2^53 micro-tokens"
)]
pub fn lend(
    requests: &[BucketRequest],
    states: &mut [Option<Bucket>],
    outcomes: &mut [BucketOutcome],
    lent: &mut [Option<Lent>],
    allowed: bool,
    now: u64,
) -> Vec<Slice> {
    let mut slices = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        let Some(lent) = lent[index].as_mut() else {
            continue;
        };
        // A plain check of a bucket that holds borrowed tokens keeps them and takes none.
        let borrow = match request.meter {
            Meter::Borrow(borrow) => borrow,
            _ => Borrow::default(),
        };
        let charged = allowed && outcomes[index].enough && request.cost > 0;
        let mut took = false;
        if let (true, Some(state)) = (charged, states[index].as_mut()) {
            let level = request.burst * 1_000_000.0 - state.debt as f64;
            let tokens = held::slice(borrow.want, level);
            let deadline_us = held::deadline(now, borrow.grid_us);
            if tokens > 0 && lent.groups.take(deadline_us, tokens * 1_000_000, now) {
                state.debt += tokens * 1_000_000;
                outcomes[index].tokens = (request.burst * 1_000_000.0 - state.debt as f64) / 1e6;
                took = true;
                slices.push(Slice {
                    bucket: index,
                    tokens,
                    deadline_us,
                    now_us: now,
                    incarnation: lent.groups.incarnation.unwrap_or(now),
                });
            }
        }
        if !(charged || lent.changed || took) {
            states[index] = lent.found;
        }
    }
    slices
}

/// What the reservations of `held` expired by `now_us` had reserved.
pub fn expired_estimates(held: &[Reservation], now_us: u64) -> u64 {
    held.iter()
        .filter(|r| r.until <= now_us)
        .map(|r| r.estimate)
        .sum()
}

/// A reservation held beside its bucket (`lua/token_bucket.lua` keeps `<id>:<estimate>` scored
/// by `until`; `lua/bounds.lua`'s sweep files an expired one as `<id>:<estimate>:<r|k>`).
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

impl Shard {
    /// Moves the expired reservations of bucket `key` to its late ones, each given back when
    /// `refund` says so, as `sweep` in `lua/bounds.lua`; the tokens given back.
    pub fn sweep(&mut self, key: &str, now_us: u64, refund: impl Fn(&Reservation) -> bool) -> u64 {
        let Some(held) = self.reservations.get_mut(key) else {
            return 0;
        };
        let (mut gone, live): (Vec<Reservation>, Vec<Reservation>) =
            held.iter().partition(|r| r.until <= now_us);
        if gone.is_empty() {
            return 0;
        }
        for r in &mut gone {
            r.refund = refund(r);
        }
        let back = gone.iter().filter(|r| r.refund).map(|r| r.estimate).sum();
        if live.is_empty() {
            self.reservations.remove(key);
        } else {
            *held = live;
        }
        let late = self.late.entry(key.to_owned()).or_default();
        late.retain(|r| r.until > now_us);
        late.extend(gone.into_iter().map(|r| Reservation {
            until: r.until.saturating_add(LATE_SETTLE_GRACE_US),
            ..r
        }));
        if late.len() > MAX_LATE_SETTLES {
            late.sort_unstable_by_key(|r| r.until);
            late.drain(..late.len() - MAX_LATE_SETTLES);
        }
        back
    }

    /// Settles the late reservation `id` of bucket `key` (expired, within its grace, not
    /// settled before): `None` when it is not there, else whether its expiry gave it back.
    pub fn take_late(&mut self, key: &str, id: u128, estimate: u64, now_us: u64) -> Option<bool> {
        let late = self.late.get_mut(key)?;
        late.retain(|r| r.until > now_us);
        let found = late
            .iter()
            .position(|r| r.id == id && r.estimate == estimate)
            .map(|at| late.swap_remove(at).refund);
        if late.is_empty() {
            self.late.remove(key);
        }
        found
    }

    /// Drops the reservations of bucket `key` that `gone` picks, and the key's set once empty;
    /// whether any was dropped.
    pub fn drop_reservations(&mut self, key: &str, gone: impl Fn(&Reservation) -> bool) -> bool {
        let Some(held) = self.reservations.get_mut(key) else {
            return false;
        };
        let before = held.len();
        held.retain(|r| !gone(r));
        let dropped = held.len() < before;
        if held.is_empty() {
            self.reservations.remove(key);
        }
        dropped
    }

    /// Leases of `key` held at `now_us`.
    pub fn held_leases(&self, key: &str, now_us: u64) -> usize {
        self.leases.get(key).map_or(0, |set| {
            set.iter().filter(|(_, until)| *until > now_us).count()
        })
    }

    /// Drops the expired leases of `key`, and the key once none is left; whether it went.
    pub fn prune_leases(&mut self, key: &str, now_us: u64) -> bool {
        let Some(set) = self.leases.get_mut(key) else {
            return false;
        };
        set.retain(|(_, until)| *until > now_us);
        if set.is_empty() {
            self.leases.remove(key);
            return true;
        }
        false
    }
}
