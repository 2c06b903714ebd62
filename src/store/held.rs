//! Borrowed tokens as the store keeps them, the Rust twin of the borrowing part of
//! `lua/token_bucket.lua` (see `docs/DESIGN.md`, "Borrowed tokens").
//!
//! A borrowing bucket carries at most two *groups* of held tokens, each ending at a
//! deadline on a grid of the horizon. Held tokens are part of the debt but do not refill: a
//! borrow-aware read takes the debt as `max(held, refilled debt)`, so the level never exceeds
//! `burst - held`. When a group ends, its tokens count as used and refill from its deadline
//! on. The arithmetic is the script's, operation for operation, in micro-tokens.
use super::bucket::{debt_now, Bucket};
use super::GiveBack;

const MICRO: u64 = 1_000_000;

/// The held groups of one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Groups {
    /// `(deadline in µs, micro-tokens held)`, an empty one `(0, 0)`.
    pub slots: [(u64, u64); 2],
    /// Which life of them this is: the store's clock when a group was taken while none was
    /// live (the script writes it after them as `i<µs>`). A give-back naming another one is
    /// of a slice taken before the bucket was deleted (`FLUSHALL`, `DEL`) and does nothing.
    pub incarnation: Option<u64>,
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
    pub fn settle(&mut self, stored: Option<Bucket>, now_us: u64, rate: f64) -> (u64, bool) {
        let mut state = stored.unwrap_or(Bucket {
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
            state = Bucket {
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
    Bucket {
        debt,
        ts_us: groups.last_deadline().unwrap_or(now_us).max(now_us),
    }
    .full_at_us(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Groups taken at 7 µs.
    fn live(slots: [(u64, u64); 2]) -> Groups {
        Groups {
            slots,
            incarnation: Some(7),
        }
    }

    #[test]
    fn a_give_back_to_another_incarnation_does_nothing() {
        let mut groups = live([(2_000_000, 50 * MICRO), (0, 0)]);
        let mut debt = 50 * MICRO;
        let stale = GiveBack {
            deadline_us: 2_000_000,
            taken: 50,
            unused: 50,
            incarnation: 6,
        };
        assert!(!groups.give_back(&mut debt, stale));
        assert_eq!((debt, groups.held()), (50 * MICRO, 50 * MICRO));
        // Once none is live, the next take starts another.
        let mut fresh = Groups::default();
        assert!(fresh.take(2_000_000, MICRO, 9));
        assert_eq!(fresh.incarnation, Some(9));
        let (_, ended) = fresh.settle(None, 2_000_000, 1.0);
        assert!(ended && fresh.incarnation.is_none());
    }

    #[test]
    fn held_tokens_do_not_refill_while_their_group_lives() {
        let mut groups = live([(2_000_000, 50 * MICRO), (0, 0)]);
        let stored = Some(Bucket {
            debt: 60 * MICRO,
            ts_us: 0,
        });
        // 10 tokens/s for 1 s refills 10 of the 60: still 50 held.
        assert_eq!(groups.settle(stored, 1_000_000, 10.0), (50 * MICRO, false));
        // 5 s: the refill would empty the debt, but 50 are held.
        assert_eq!(groups.settle(stored, 1_500_000, 100.0), (50 * MICRO, false));
    }

    #[test]
    fn an_ended_group_counts_as_used_and_refills_from_its_deadline() {
        let mut groups = live([(1_000_000, 50 * MICRO), (0, 0)]);
        let stored = Some(Bucket {
            debt: 50 * MICRO,
            ts_us: 0,
        });
        // Ends at 1 s with 50 owed; by 2 s, 10 of them refilled.
        assert_eq!(groups.settle(stored, 2_000_000, 10.0), (40 * MICRO, true));
        assert!(groups.is_empty());
    }

    #[test]
    fn a_give_back_returns_the_unused_and_keeps_the_used_as_debt() {
        let mut groups = live([(2_000_000, 50 * MICRO), (0, 0)]);
        let mut debt = 50 * MICRO;
        let give = GiveBack {
            deadline_us: 2_000_000,
            taken: 50,
            unused: 30,
            incarnation: 7,
        };
        assert!(groups.give_back(&mut debt, give));
        assert_eq!((debt, groups.held()), (20 * MICRO, 0));
        // Its group is gone: a second give-back does nothing.
        assert!(!groups.give_back(&mut debt, give));
        assert_eq!(debt, 20 * MICRO);
    }

    #[test]
    fn a_third_deadline_finds_no_group_and_takes_nothing() {
        let mut groups = live([(2, 1), (3, 1)]);
        assert!(!groups.take(4, 1, 1));
        assert!(groups.take(3, 1, 1));
        assert_eq!(groups.slots[1], (3, 2));
        assert_eq!(groups.incarnation, Some(7), "the same life goes on");
    }

    #[test]
    fn slices_are_at_most_half_the_level_and_none_near_empty() {
        assert_eq!(slice(100, 1_999_999.0), 0);
        assert_eq!(slice(100, 2_000_000.0), 1);
        assert_eq!(slice(100, 51_000_000.0), 25);
        assert_eq!(slice(10, 51_000_000.0), 10);
        assert_eq!(deadline(1_050, 100), 1_200);
    }
}
