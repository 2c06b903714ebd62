//! Slices that fall quiet: a key's last slice goes back to the store without waiting for a
//! request of the key (`docs/DESIGN.md`, "Borrowed tokens", under-admission).
//!
//! A slice installed is due a give-back a quarter of its horizon before its group ends (on
//! the local clock, padded as its usable time is): a busy key's next request, which gives the
//! slice back in the call it makes anyway, nearly always comes first, so the store sees few
//! calls of their own; and one due reaches the store before the group ends, when its unused
//! tokens would count as used, with the quarter horizon to spare for the timer's tick (at most
//! an eighth of the shortest horizon) and the call. The give-backs due go in one call.
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::{Held, Lender};
use crate::kinds::borrow::{Borrow, GiveBack};
use crate::kinds::{BucketRequest, Slice};
use crate::limiter::deny_cache::DRIFT;

/// A shard's slices by when they are due, the soonest first.
#[derive(Default)]
pub(super) struct Due(BinaryHeap<Reverse<DueSlice>>);

/// One slice due: its id, and the request it was taken by (a give-back names its key, limit,
/// numbers and horizon).
struct DueSlice {
    at_us: u64,
    id: u64,
    taken_by: BucketRequest,
}

impl PartialEq for DueSlice {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.id) == (other.at_us, other.id)
    }
}

impl Eq for DueSlice {}

impl PartialOrd for DueSlice {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DueSlice {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at_us, self.id).cmp(&(other.at_us, other.id))
    }
}

impl Due {
    /// Slice `id`, taken by `taken_by` in a call sent at `sent_us` (local clock).
    pub(super) fn push(&mut self, slice: &Slice, sent_us: u64, id: u64, taken_by: &BucketRequest) {
        let grid_us = taken_by.meter.borrow().map_or(0, |b| b.grid_us);
        self.0.push(Reverse(DueSlice {
            at_us: sent_us + due_after_us(slice, grid_us),
            id,
            taken_by: taken_by.clone(),
        }));
    }

    fn pop_due(&mut self, now_us: u64) -> Option<DueSlice> {
        if self.0.peek().is_some_and(|Reverse(e)| e.at_us <= now_us) {
            return self.0.pop().map(|Reverse(e)| e);
        }
        None
    }
}

/// The give-backs of slices that fell quiet, for the store: each a request of cost 0 that
/// gives its slice back and asks for nothing.
pub struct Quiet {
    pub requests: Vec<BucketRequest>,
    /// Their tokens given back unused.
    pub unused: u64,
}

impl Lender {
    /// Takes at most `most` slices whose give-back is due and that no request gave back (a
    /// slice with every token used is dropped: its tokens count as used when its group
    /// ends, as a give-back would count them now). Emptied here, before the call is sent, as
    /// a request's give-back is.
    pub fn quiet(&self, most: usize) -> Quiet {
        let now = self.clock.now_us();
        let mut quiet = Quiet {
            requests: Vec::new(),
            unused: 0,
        };
        for shard in &self.shards {
            let mut shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            while quiet.requests.len() < most {
                let Some(entry) = shard.due.pop_due(now) else {
                    break;
                };
                let Some(holding) = shard.keys.get_mut(entry.taken_by.key.as_str()) else {
                    continue;
                };
                if holding.slice.is_none_or(|held| held.id != entry.id) {
                    continue;
                }
                let Some(held) = holding.slice.take() else {
                    continue;
                };
                if held.left > 0 {
                    quiet.unused += held.left;
                    quiet.requests.push(give_back(entry.taken_by, &held));
                }
            }
        }
        quiet
    }
}

fn give_back(taken_by: BucketRequest, held: &Held) -> BucketRequest {
    let grid_us = taken_by.meter.borrow().map_or(0, |b| b.grid_us);
    // A global limit's key stays one (`borrowing` keeps its kind).
    BucketRequest {
        cost: 0,
        ..taken_by
    }
    .borrowing(Borrow {
        grid_us,
        want: 0,
        give: Some(GiveBack {
            deadline_us: held.deadline_us,
            taken: held.taken,
            unused: held.left,
            incarnation: held.incarnation,
        }),
    })
}

/// How long after its call was sent a slice is due a give-back: its time to the group's end
/// on the store's clock, padded for a faster local clock, less a quarter of its horizon.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "a horizon in µs, far below 2^53; the result is clamped at 0"
)]
fn due_after_us(slice: &Slice, grid_us: u64) -> u64 {
    let to_end = slice.deadline_us.saturating_sub(slice.now_us) as f64 * (1.0 - DRIFT);
    (to_end - (grid_us / 4) as f64).max(0.0) as u64
}
