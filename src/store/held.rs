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

/// The held groups of one bucket: `(deadline in µs, micro-tokens held)`, an empty one `(0, 0)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Groups(pub [(u64, u64); 2]);

impl Groups {
    /// Micro-tokens held by the groups still live.
    pub fn held(&self) -> u64 {
        self.0.iter().map(|g| g.1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.held() == 0
    }

    /// The last deadline of a live group.
    pub fn last_deadline(&self) -> Option<u64> {
        self.0.iter().filter(|g| g.1 > 0).map(|g| g.0).max()
    }

    /// The debt of `stored` at `now_us` for a borrowing read: the groups ended by `now_us`
    /// are dropped in deadline order, each ending after the debt refilled up to its deadline,
    /// never below what was held then. Returns the debt and whether a group ended.
    pub fn settle(&mut self, stored: Option<Bucket>, now_us: u64, rate: f64) -> (u64, bool) {
        let mut state = stored.unwrap_or(Bucket {
            debt: 0,
            ts_us: now_us,
        });
        let mut ended = false;
        let mut order = [0, 1];
        order.sort_by_key(|&i| self.0[i].0);
        for i in order {
            let (deadline, tokens) = self.0[i];
            if tokens == 0 || deadline > now_us {
                continue;
            }
            let debt = debt_now(Some(state), deadline, rate).max(self.held());
            state = Bucket {
                debt,
                ts_us: deadline.max(state.ts_us),
            };
            self.0[i] = (0, 0);
            ended = true;
        }
        (debt_now(Some(state), now_us, rate).max(self.held()), ended)
    }

    /// Applies a give-back to the group it names (none when that group has ended): the group
    /// loses what was taken, the debt what was not used. Whether anything changed.
    pub fn give_back(&mut self, debt: &mut u64, give: GiveBack) -> bool {
        let Some(group) = self
            .0
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

    /// Holds `tokens` more (micro-tokens) in the group ending at `deadline_us`; false when
    /// both groups are live with other deadlines (then nothing is taken).
    pub fn take(&mut self, deadline_us: u64, tokens: u64) -> bool {
        let slot = match self.0.iter().position(|g| g.1 > 0 && g.0 == deadline_us) {
            Some(i) => i,
            None => match self.0.iter().position(|g| g.1 == 0) {
                Some(i) => i,
                None => return false,
            },
        };
        self.0[slot] = (deadline_us, self.0[slot].1 + tokens);
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

    #[test]
    fn held_tokens_do_not_refill_while_their_group_lives() {
        let mut groups = Groups([(2_000_000, 50 * MICRO), (0, 0)]);
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
        let mut groups = Groups([(1_000_000, 50 * MICRO), (0, 0)]);
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
        let mut groups = Groups([(2_000_000, 50 * MICRO), (0, 0)]);
        let mut debt = 50 * MICRO;
        let give = GiveBack {
            deadline_us: 2_000_000,
            taken: 50,
            unused: 30,
        };
        assert!(groups.give_back(&mut debt, give));
        assert_eq!((debt, groups.held()), (20 * MICRO, 0));
        // Its group is gone: a second give-back does nothing.
        assert!(!groups.give_back(&mut debt, give));
        assert_eq!(debt, 20 * MICRO);
    }

    #[test]
    fn a_third_deadline_finds_no_group_and_takes_nothing() {
        let mut groups = Groups([(2, 1), (3, 1)]);
        assert!(!groups.take(4, 1));
        assert!(groups.take(3, 1));
        assert_eq!(groups.0[1], (3, 2));
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
