//! A borrowing bucket: a token bucket from which instances borrow slices of tokens, each
//! check of it giving back a slice and taking a new one beside its own cost (`docs/DESIGN.md`,
//! "Borrowed tokens"; the instance's side is `limiter::borrow`).
//!
//! The bucket carries at most two *groups* of held tokens ([`Groups`]), each ending at a
//! deadline on a grid of the horizon. Held tokens are part of the debt but do not refill: a
//! borrow-aware read takes the debt as `max(held, refilled debt)`, so the level never exceeds
//! `burst - held`. When a group ends, its tokens count as used and refill from its deadline
//! on. The arithmetic is the script's (`lua/token_bucket.lua`), operation for operation, in
//! micro-tokens.

use serde::Serialize;

use super::tokens::{self, debt_now, Shown};
use super::twin::{Beside, Found, Groups, Keep, Kept, Lent, Stored};
use super::{
    BucketOutcome, BucketRequest, Configured, Kind, LimitView, Meter, PeekView, Peeked, Reserved,
    ScriptArg, Slice, Window,
};

const MICRO: u64 = 1_000_000;

/// What a borrowing check asks of its bucket besides its cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Borrow {
    /// The horizon: slices end on a grid of this many µs of the store's clock (> 0).
    pub grid_us: u64,
    /// Whole tokens to take beyond the cost, at most (the store grants at most half of what
    /// is left after the cost).
    pub want: u64,
    /// A slice given back first, whatever the decision.
    pub give: Option<GiveBack>,
}

/// A slice an instance returns: its group (deadline and incarnation), what it took and what
/// it did not use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveBack {
    pub deadline_us: u64,
    pub taken: u64,
    pub unused: u64,
    /// The incarnation of the groups it was taken into ([`Slice`]): a bucket deleted and held
    /// again since (`FLUSHALL`) has another, and the give-back does nothing.
    pub incarnation: u64,
}

impl Kind for Borrow {
    fn is_token_bucket(&self) -> bool {
        true
    }

    fn for_check(&self) -> Meter {
        Meter::Borrow(*self)
    }

    fn policy_window_secs(&self, rate: f64, burst: u64) -> u64 {
        tokens::policy_window_secs(rate, burst)
    }

    /// A limit that borrows is a token bucket to its operator.
    fn limit_view(&self, limit: &Configured<'_>) -> LimitView {
        LimitView::Bucket(Shown {
            rate_per_s: limit.rate,
            burst: limit.burst,
        })
    }

    /// `B<grid>:<want>:<deadline>:<taken>:<unused>:<incarnation>:<rate>`.
    fn script_arg(&self, rate: f64) -> ScriptArg {
        let give = self.give.unwrap_or(GiveBack {
            deadline_us: 0,
            taken: 0,
            unused: 0,
            incarnation: 0,
        });
        ScriptArg::Text(format!(
            "B{}:{}:{}:{}:{}:{}:{}",
            self.grid_us.max(1),
            self.want,
            give.deadline_us,
            give.taken,
            give.unused,
            give.incarnation,
            rate
        ))
    }

    /// `B<rate>`.
    fn peek_arg(&self, rate: f64) -> ScriptArg {
        ScriptArg::Text(format!("B{rate}"))
    }

    fn level_scale(&self) -> f64 {
        tokens::MICRO
    }

    fn read_window(&self, _: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Window>> {
        Some(None)
    }

    /// `s d i`: the whole tokens taken beyond the cost (0: none), their group's deadline and
    /// the groups' incarnation.
    fn read_slice(
        &self,
        numbers: &mut dyn FnMut() -> Option<u64>,
        index: usize,
        now: &str,
    ) -> Option<Option<Slice>> {
        let tokens = numbers()?;
        let deadline_us = numbers()?;
        let incarnation = numbers()?;
        if tokens == 0 {
            return Some(None);
        }
        Some(Some(Slice {
            bucket: index,
            tokens,
            deadline_us,
            now_us: now.parse().ok()?,
            incarnation,
        }))
    }

    fn holds_aside(&self) -> bool {
        true
    }

    /// The tokens held by live slices (micro-tokens, shown rounded up), and their groups.
    fn read_held(&self, numbers: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Reserved>> {
        let micro = numbers()?;
        let groups = numbers()?;
        Some(Some(Reserved {
            tokens: micro.div_ceil(MICRO),
            held: groups,
        }))
    }

    fn find_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &mut Beside,
        now_us: u64,
    ) -> Found {
        find_in(request, self.give, stored, beside, now_us)
    }

    fn keep_in(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept {
        keep_in(keep, *self, beside)
    }

    fn peek_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &Beside,
        now_us: u64,
    ) -> BucketOutcome {
        peek_in(request, stored, beside, now_us)
    }

    /// The tokens its live groups hold now (whole tokens, rounded up), and how many groups.
    fn held_in(&self, key: &str, beside: &Beside, now_us: u64) -> Reserved {
        let live = beside
            .borrowed
            .get(key)
            .into_iter()
            .flat_map(|g| g.slots)
            .filter(|&(deadline, tokens)| tokens > 0 && deadline > now_us);
        Reserved {
            tokens: live.clone().map(|g| g.1).sum::<u64>().div_ceil(MICRO),
            held: live.count() as u64,
        }
    }

    fn peek_view(&self, request: &BucketRequest, peeked: &Peeked) -> PeekView {
        PeekView::Borrowing(Peek {
            tokens: peeked.outcome.tokens,
            remaining: peeked.remaining,
            burst: request.burst,
            rate_per_s: request.rate,
            full_in_s: peeked.reset_secs,
            borrowed: peeked.held.map_or(0, |held| held.tokens),
            borrowed_here: peeked.borrowed_here,
        })
    }
}

impl Beside {
    /// Forgets a bucket's borrowed groups (a reset).
    pub fn forget_borrowed(&mut self, key: &str) {
        self.borrowed.remove(key);
    }
}

/// A bucket holding groups as a check finds it in the memory store: its groups ended by now
/// settled, then `give` given back, whatever the decision.
pub(super) fn find_in(
    request: &BucketRequest,
    give: Option<GiveBack>,
    stored: Option<Stored>,
    beside: &Beside,
    now_us: u64,
) -> Found {
    let mut groups = beside
        .borrowed
        .get(request.key.as_str())
        .copied()
        .unwrap_or_default();
    let (mut debt, ended) = groups.settle(stored, now_us, request.rate);
    let gave = give.is_some_and(|give| groups.give_back(&mut debt, give));
    Found {
        state: Some(Stored {
            debt,
            ts_us: now_us,
        }),
        lent: Some(Lent {
            groups,
            changed: ended || gave,
            found: stored,
        }),
    }
}

/// After the decision: a charged borrowing bucket takes its slice, as the script does (a
/// plain check of a bucket that holds borrowed tokens keeps them and takes none, `borrow`
/// default); one that neither changed nor was charged keeps its stored state (only the
/// script's writes are mirrored, so both round alike). Its groups are kept.
#[expect(
    clippy::cast_precision_loss,
    reason = "debts and levels stay below 2^53 micro-tokens"
)]
pub(super) fn keep_in(keep: Keep<'_>, borrow: Borrow, beside: &mut Beside) -> Kept {
    let request = keep.request;
    let Some(mut lent) = keep.found.lent else {
        let rate = request.rate;
        return Kept::stored(keep.state, |state| state.full_at_us(rate));
    };
    let charged = keep.charged();
    let mut slice = None;
    if let (true, Some(state)) = (charged, keep.state.as_mut()) {
        let level = request.burst * 1_000_000.0 - state.debt as f64;
        let tokens = self::slice(borrow.want, level);
        let deadline_us = deadline(keep.now_us, borrow.grid_us);
        if tokens > 0 && lent.groups.take(deadline_us, tokens * MICRO, keep.now_us) {
            state.debt += tokens * MICRO;
            keep.outcome.tokens = (request.burst * 1_000_000.0 - state.debt as f64) / 1e6;
            slice = Some(Slice {
                bucket: keep.index,
                tokens,
                deadline_us,
                now_us: keep.now_us,
                incarnation: lent.groups.incarnation.unwrap_or(keep.now_us),
            });
        }
    }
    if !(charged || lent.changed || slice.is_some()) {
        *keep.state = lent.found;
    }
    if lent.groups.is_empty() {
        beside.borrowed.remove(request.key.as_str());
    } else {
        beside.borrowed.insert(request.key.clone(), lent.groups);
    }
    Kept {
        forget_at_us: keep
            .state
            .map(|state| forget_at_us(state.debt, keep.now_us, &lent.groups, request.rate)),
        slice,
        ..Kept::default()
    }
}

/// A bucket as the next check would find it in the memory store: its held tokens do not
/// refill, and ended groups count as used.
pub(super) fn peek_in(
    request: &BucketRequest,
    stored: Option<Stored>,
    beside: &Beside,
    now_us: u64,
) -> BucketOutcome {
    let mut groups = beside
        .borrowed
        .get(request.key.as_str())
        .copied()
        .unwrap_or_default();
    let (debt, _) = groups.settle(stored, now_us, request.rate);
    tokens::find(
        request,
        Some(Stored {
            debt,
            ts_us: now_us,
        }),
        now_us,
    )
    .0
}

impl Groups {
    /// Micro-tokens held by the groups still live.
    pub fn held(&self) -> u64 {
        self.slots.iter().map(|g| g.1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.held() == 0
    }

    /// The last deadline of a live group.
    pub fn last_deadline(&self) -> Option<u64> {
        self.slots.iter().filter(|g| g.1 > 0).map(|g| g.0).max()
    }

    /// The debt of `stored` at `now_us` for a borrowing read: the groups ended by `now_us`
    /// are dropped in deadline order, each ending after the debt refilled up to its deadline,
    /// never below what was held then; with none left live, their incarnation ends. Returns the
    /// debt and whether a group ended.
    pub fn settle(&mut self, stored: Option<Stored>, now_us: u64, rate: f64) -> (u64, bool) {
        let mut state = stored.unwrap_or(Stored {
            debt: 0,
            ts_us: now_us,
        });
        let mut ended = false;
        let mut order = [0, 1];
        order.sort_by_key(|&i| self.slots[i].0);
        for i in order {
            let (deadline, tokens) = self.slots[i];
            if tokens == 0 || deadline > now_us {
                continue;
            }
            let debt = debt_now(Some(state), deadline, rate).max(self.held());
            state = Stored {
                debt,
                ts_us: deadline.max(state.ts_us),
            };
            self.slots[i] = (0, 0);
            ended = true;
        }
        if self.is_empty() {
            self.incarnation = None;
        }
        (debt_now(Some(state), now_us, rate).max(self.held()), ended)
    }

    /// Applies a give-back to the group it names (none when that group has ended, or when
    /// these groups are another incarnation): the group loses what was taken, the debt what was
    /// not used. Whether anything changed.
    pub fn give_back(&mut self, debt: &mut u64, give: GiveBack) -> bool {
        if self.incarnation != Some(give.incarnation) {
            return false;
        }
        let Some(group) = self
            .slots
            .iter_mut()
            .find(|g| g.1 > 0 && g.0 == give.deadline_us)
        else {
            return false;
        };
        let taken = give.taken.saturating_mul(MICRO).min(group.1);
        if taken == 0 {
            return false;
        }
        let unused = give.unused.saturating_mul(MICRO).min(taken);
        group.1 -= taken;
        if group.1 == 0 {
            group.0 = 0;
        }
        *debt = debt.saturating_sub(unused);
        true
    }

    /// Holds `tokens` more (micro-tokens) in the group ending at `deadline_us`, at `now_us`
    /// (a new incarnation when none is under way); false when both groups are live with other
    /// deadlines (then nothing is taken).
    pub fn take(&mut self, deadline_us: u64, tokens: u64, now_us: u64) -> bool {
        let slot = match self
            .slots
            .iter()
            .position(|g| g.1 > 0 && g.0 == deadline_us)
        {
            Some(i) => i,
            None => match self.slots.iter().position(|g| g.1 == 0) {
                Some(i) => i,
                None => return false,
            },
        };
        self.slots[slot] = (deadline_us, self.slots[slot].1 + tokens);
        self.incarnation.get_or_insert(now_us);
        true
    }
}

/// The deadline of a slice taken at `now_us` on a grid of `grid_us`: the end of the next
/// grid step, between one and two steps ahead.
pub fn deadline(now_us: u64, grid_us: u64) -> u64 {
    let grid = grid_us.max(1);
    (now_us / grid + 2) * grid
}

/// Whole tokens a check takes beyond its cost: what it wants, at most half of `level` (the
/// micro-tokens left after its cost), so near empty it takes none.
pub fn slice(want: u64, level: f64) -> u64 {
    if level < 2.0 * 1_000_000.0 {
        return 0;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "level is positive and below 2^53 micro-tokens here"
    )]
    let half = (level / 2_000_000.0).floor() as u64;
    want.min(half)
}

/// When a borrowing bucket may be forgotten: once full, counting its whole debt as refilling
/// only from the last deadline of its groups (never before the script's key expires).
pub fn forget_at_us(debt: u64, now_us: u64, groups: &Groups, rate: f64) -> u64 {
    Stored {
        debt,
        ts_us: groups.last_deadline().unwrap_or(now_us).max(now_us),
    }
    .full_at_us(rate)
}

/// A borrowing bucket as `GET /v1/buckets` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peek {
    /// Tokens in the bucket now, the borrowed ones taken out.
    pub tokens: f64,
    pub remaining: u64,
    pub burst: f64,
    pub rate_per_s: f64,
    pub full_in_s: u64,
    /// Tokens borrowed by every instance and held now (used or not), and this instance's
    /// share of them still unused.
    pub borrowed: u64,
    pub borrowed_here: u64,
}

#[cfg(test)]
mod tests;
