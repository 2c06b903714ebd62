//! A global limit's key in a region (`scope = "global"`, `docs/DESIGN.md`, "One limit across
//! regions"): a token bucket decided against the region's numbers for the key, its *floor*
//! (a fixed fraction of the limit's rate and burst, never moved) plus the *share* the home
//! last assigned it, kept beside the bucket until its end on the store's clock. Refill is
//! piecewise: the floor and share's rate until the share ends, the floor's after; a share is
//! written only through [`put_share`], which first brings the bucket to now under the old
//! one and never adds tokens. The Rust twin of `lua/global.lua` and `lua/global_share.lua`,
//! operation for operation, in micro-tokens.

use super::borrow::{self, Borrow, GiveBack};
use super::tokens::{self, Shown};
pub use super::twin::Share;
use super::twin::{Beside, Found, Groups, Keep, Kept, Lent, Stored};
use super::{
    can_pay, BucketOutcome, BucketRequest, Configured, Kind, LimitView, Meter, PeekView, Peeked,
    ScriptArg, Slice, Window,
};

use crate::config::regions::floor_ppm;
use crate::config::{Config, LimitConfig};

const MICRO: f64 = 1_000_000.0;
/// The longest a bucket is kept (`lua/bounds.lua`'s `MAX_TTL_US`): two refills of ten years.
const MAX_TTL_US: f64 = 2.0 * 315_360_000.0 * MICRO;

/// A global limit's key in this region: its floor, in millionths of the limit's numbers (0 at
/// home, which admits nothing of a global limit itself), and, for a check that borrows, what
/// it asks besides its cost (`docs/DESIGN.md`, "Borrowed tokens": the key keeps its held
/// groups as a borrowing bucket does, counted against the size in force).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Global {
    pub floor_ppm: u32,
    pub borrow: Option<Borrow>,
}

impl Global {
    /// The kind of a `scope = "global"` limit: the region's floor; at home, none (the home
    /// keeps the shares and admits nothing of a global limit itself). `None` for a local one.
    pub fn of(config: &Config, limit: &LimitConfig) -> Option<Global> {
        if limit.scope.is_local() {
            return None;
        }
        let floor_ppm = config
            .region
            .as_ref()
            .map_or(0, |region| floor_ppm(region.floor));
        Some(Global {
            floor_ppm,
            borrow: None,
        })
    }

    /// This key's check borrowing `borrow`.
    #[must_use]
    pub fn borrowing(self, borrow: Borrow) -> Global {
        Global {
            borrow: Some(borrow),
            ..self
        }
    }
}

/// The region's numbers for a key: the floor's rate (tokens/s) and size (micro-tokens), the
/// share's and its end, and the size and rate while it counts (the size at most the burst).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegionNumbers {
    fr: f64,
    fc: f64,
    u: f64,
    s1: f64,
    r1: f64,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "sizes, rates and µs since 1970 stay below 2^53, as the script's doubles do"
)]
impl RegionNumbers {
    /// `lua/global.lua`'s `global_numbers`.
    pub fn of(global: Global, rate: f64, burst: f64, share: Option<Share>) -> RegionNumbers {
        let ppm = f64::from(global.floor_ppm);
        let fr = rate * ppm / MICRO;
        let fc = burst * ppm;
        let share = share.unwrap_or_default();
        let sc = share.size as f64 * MICRO;
        let cap = burst * MICRO;
        RegionNumbers {
            fr,
            fc,
            u: share.until_us as f64,
            s1: (fc + sc).min(cap),
            r1: fr + share.rate,
        }
    }

    /// The size at `now_us` (micro-tokens).
    pub fn size_at(&self, now_us: u64) -> f64 {
        if (now_us as f64) < self.u {
            self.s1
        } else {
            self.fc
        }
    }

    /// `global_level`: the level at `now_us` of a bucket stored as `stored` (absent: full).
    pub fn level(&self, stored: Option<Stored>, now_us: u64) -> f64 {
        let now = now_us as f64;
        let Some(stored) = stored else {
            return self.size_at(now_us);
        };
        let (debt, at) = (stored.debt as f64, stored.ts_us as f64);
        if at < self.u {
            let mut level = self.s1 - debt;
            let t1 = now.min(self.u);
            if t1 > at {
                level += ((t1 - at) * self.r1).floor();
            }
            level = level.min(self.s1);
            if now < self.u {
                return level;
            }
            level = level.min(self.fc);
            level += ((now - self.u) * self.fr).floor();
            return level.min(self.fc);
        }
        let mut level = self.fc - debt;
        if now > at {
            level += ((now - at) * self.fr).floor();
        }
        level.min(self.fc)
    }

    /// `global_refill`: the level at `to` of a bucket at `level` at `from`, no group ending
    /// between: refilled piecewise around the share's end, capped at the size then less `held`
    /// (micro-tokens held by slices, which do not refill).
    pub fn refill(&self, level: f64, from: f64, to: f64, held: f64) -> f64 {
        let mut level = level;
        if from < self.u {
            let t1 = to.min(self.u);
            if t1 > from {
                level += ((t1 - from) * self.r1).floor();
            }
            level = level.min(self.s1 - held);
            if to < self.u {
                return level;
            }
            level = level.min(self.fc - held);
            level += ((to - self.u) * self.fr).floor();
            return level.min(self.fc - held);
        }
        if to > from {
            level += ((to - from) * self.fr).floor();
        }
        level.min(self.fc - held)
    }

    /// `global_lent`: the level at `now_us` of a bucket stored as `stored` holding `groups`:
    /// the groups ended by now ended in deadline order (the level refilled up to each, its
    /// tokens then used), then `give` given back. Returns the level and whether a group
    /// ended or a slice came back (the script then writes whatever it decides).
    pub fn lent(
        &self,
        stored: Option<Stored>,
        groups: &mut Groups,
        give: Option<GiveBack>,
        now_us: u64,
    ) -> (f64, bool) {
        let now = now_us as f64;
        let size = self.size_at(now_us);
        let Some(stored) = stored else {
            *groups = Groups::default();
            return (size, false);
        };
        let mut held = groups.held() as f64;
        let at = stored.ts_us as f64;
        let mut level = if at < self.u { self.s1 } else { self.fc } - stored.debt as f64;
        let mut from = at;
        let mut changed = false;
        let mut order = [0, 1];
        order.sort_by_key(|&i| groups.slots[i].0);
        for i in order {
            let (deadline, tokens) = groups.slots[i];
            if tokens == 0 || deadline > now_us {
                continue;
            }
            let d = deadline as f64;
            level = self.refill(level, from, d, held);
            from = from.max(d);
            held -= tokens as f64;
            groups.slots[i] = (0, 0);
            changed = true;
        }
        level = self.refill(level, from, now, held);
        if groups.is_empty() {
            groups.incarnation = None;
        }
        if let Some(give) = give.filter(|g| groups.incarnation == Some(g.incarnation)) {
            if let Some(group) = groups
                .slots
                .iter_mut()
                .find(|g| g.1 > 0 && g.0 == give.deadline_us)
            {
                let taken = give.taken.saturating_mul(1_000_000).min(group.1);
                if taken > 0 {
                    group.1 -= taken;
                    if group.1 == 0 {
                        group.0 = 0;
                    }
                    let unused = give.unused.saturating_mul(1_000_000).min(taken);
                    level = (level + unused as f64).min(size);
                    changed = true;
                }
            }
        }
        (level, changed)
    }

    /// `global_full`: when a bucket at `level` at `t` is full again (µs), piecewise.
    fn full(&self, level: f64, t: f64) -> f64 {
        if t < self.u {
            let mut full = t + ((self.s1 - level) / self.r1).ceil();
            if full > self.u {
                let at_u = (level + ((self.u - t) * self.r1).floor()).min(self.fc);
                full = if self.fr > 0.0 {
                    self.u + ((self.fc - at_u) / self.fr).ceil()
                } else {
                    t + MAX_TTL_US
                };
            }
            return full;
        }
        if self.fr > 0.0 {
            t + ((self.fc - level.min(self.fc)) / self.fr).ceil()
        } else {
            t + MAX_TTL_US
        }
    }

    /// `global_write`: the bucket at `level` as of `now_us`, and when it is full again
    /// (µs), piecewise as it refills.
    pub fn write(&self, level: f64, now_us: u64) -> (Stored, u64) {
        self.write_from(level, now_us, now_us)
    }

    /// [`write`](Self::write) for a bucket holding groups: its refill counted from `from_us`
    /// (the last live deadline), so it is kept until its groups end.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a debt and a time below 2^53, at least 0"
    )]
    pub fn write_from(&self, level: f64, now_us: u64, from_us: u64) -> (Stored, u64) {
        let now = now_us as f64;
        let debt = if now < self.u { self.s1 } else { self.fc } - level;
        // expire_at: the time to full clamped to 0..=MAX_TTL_US.
        let full = self
            .full(level, from_us as f64)
            .min(now + MAX_TTL_US)
            .max(now);
        (
            Stored {
                debt: debt.max(0.0) as u64,
                ts_us: now_us,
            },
            full as u64,
        )
    }
}

/// The bucket of `request` (a global limit's key) given `share` at `now_us` in the memory
/// store, as `lua/global_share.lua` writes it: brought to now under the old share, kept at its
/// level capped at the new size less what slices hold of it. Returns the level (micro-tokens) and what to store, `(state,
/// forget at)`: nothing for an absent bucket, full at the size its next check finds.
#[expect(
    clippy::cast_precision_loss,
    reason = "micro-tokens held stay below 2^53"
)]
pub fn put_share(
    global: Global,
    request: &BucketRequest,
    stored: Option<Stored>,
    beside: &mut Beside,
    share: Share,
    now_us: u64,
) -> (f64, Option<(Stored, u64)>) {
    let old = RegionNumbers::of(
        global,
        request.rate,
        request.burst,
        beside.shares.get(request.key.as_str()).copied(),
    );
    // Held groups (instances borrow from the key): the ended ones ended, under the old share.
    let mut groups = beside.borrowed.get(request.key.as_str()).copied();
    let level = match groups.as_mut() {
        Some(groups) => old.lent(stored, groups, None, now_us).0,
        None => old.level(stored, now_us),
    };
    beside.shares.insert(request.key.clone(), share);
    let new = RegionNumbers::of(global, request.rate, request.burst, Some(share));
    let size = new.size_at(now_us);
    match stored {
        Some(_) => {
            // The slices still out count against the new size.
            let held = groups.map_or(0, |g| g.held());
            let level = level.min(size - held as f64);
            let written = match groups {
                Some(groups) if !groups.is_empty() => {
                    beside.borrowed.insert(request.key.clone(), groups);
                    new.write_from(
                        level,
                        now_us,
                        groups.last_deadline().unwrap_or(now_us).max(now_us),
                    )
                }
                _ => {
                    beside.borrowed.remove(request.key.as_str());
                    new.write(level, now_us)
                }
            };
            (level, Some(written))
        }
        None => (size, None),
    }
}

impl Global {
    /// [`Kind::keep_in`] for a key read with its groups (it borrows, or others hold tokens of
    /// it): a charged borrowing check takes its slice, at most half of what is left, as the
    /// script does; the key is written when charged, or when a group ended or a slice came
    /// back; its groups are kept, and it is kept until the last of them ends.
    #[expect(
        clippy::cast_precision_loss,
        reason = "levels and debts stay below 2^53 micro-tokens"
    )]
    fn keep_lent(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept {
        let request = keep.request;
        let Some(mut lent) = keep.found.lent else {
            return Kept::default();
        };
        let numbers = RegionNumbers::of(
            *self,
            request.rate,
            request.burst,
            beside.share_of(&request.key),
        );
        let charged = keep.charged();
        let mut slice = None;
        let mut written = None;
        if let Some(state) = *keep.state {
            let mut level = request.burst * MICRO - state.debt as f64;
            if let (true, Some(borrow)) = (charged, self.borrow) {
                let tokens = borrow::slice(borrow.want, level);
                let deadline_us = borrow::deadline(keep.now_us, borrow.grid_us);
                if tokens > 0
                    && lent
                        .groups
                        .take(deadline_us, tokens * 1_000_000, keep.now_us)
                {
                    level -= (tokens * 1_000_000) as f64;
                    keep.outcome.tokens = level / MICRO;
                    slice = Some(Slice {
                        bucket: keep.index,
                        tokens,
                        deadline_us,
                        now_us: keep.now_us,
                        incarnation: lent.groups.incarnation.unwrap_or(keep.now_us),
                    });
                }
            }
            if charged || lent.changed || slice.is_some() {
                let from = lent
                    .groups
                    .last_deadline()
                    .unwrap_or(keep.now_us)
                    .max(keep.now_us);
                written = Some(numbers.write_from(level, keep.now_us, from));
            }
        }
        if lent.groups.is_empty() {
            beside.borrowed.remove(request.key.as_str());
        } else {
            beside.borrowed.insert(request.key.clone(), lent.groups);
        }
        match written {
            Some((state, forget_at_us)) => {
                *keep.state = Some(state);
                Kept {
                    forget_at_us: Some(forget_at_us),
                    slice,
                    ..Kept::default()
                }
            }
            None => {
                *keep.state = None;
                Kept::default()
            }
        }
    }
}

impl Beside {
    /// The share of a global limit's key, if one is kept.
    pub fn share_of(&self, key: &str) -> Option<Share> {
        self.shares.get(key).copied()
    }

    /// Forgets the shares that ended by `now_us`: a share no longer read is no share, and a
    /// debt then reads below the floor's size (never more generous).
    pub(super) fn drop_ended_shares(&mut self, now_us: u64) {
        self.shares.retain(|_, share| share.until_us > now_us);
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "levels stay below 2^53 micro-tokens"
)]
impl Kind for Global {
    fn is_token_bucket(&self) -> bool {
        true
    }

    fn for_check(&self) -> Meter {
        Meter::Global(*self)
    }

    fn policy_window_secs(&self, rate: f64, burst: u64) -> u64 {
        tokens::policy_window_secs(rate, burst)
    }

    fn limit_view(&self, limit: &Configured<'_>) -> LimitView {
        LimitView::Bucket(Shown {
            rate_per_s: limit.rate,
            burst: limit.burst,
        })
    }

    /// `G<floor>:<rate>`; borrowing, `G<floor>:<grid>:<want>:<deadline>:<taken>:<unused>:
    /// <incarnation>:<rate>`.
    fn script_arg(&self, rate: f64) -> ScriptArg {
        let Some(borrow) = self.borrow else {
            return ScriptArg::Text(format!("G{}:{rate}", self.floor_ppm));
        };
        let give = borrow.give.unwrap_or(GiveBack {
            deadline_us: 0,
            taken: 0,
            unused: 0,
            incarnation: 0,
        });
        ScriptArg::Text(format!(
            "G{}:{}:{}:{}:{}:{}:{}:{rate}",
            self.floor_ppm,
            borrow.grid_us.max(1),
            borrow.want,
            give.deadline_us,
            give.taken,
            give.unused,
            give.incarnation,
        ))
    }

    fn peek_arg(&self, rate: f64) -> ScriptArg {
        ScriptArg::Text(format!("G{}:{rate}", self.floor_ppm))
    }

    /// A borrowing check's `s d i`, as a borrowing bucket's.
    fn read_slice(
        &self,
        numbers: &mut dyn FnMut() -> Option<u64>,
        index: usize,
        now: &str,
    ) -> Option<Option<Slice>> {
        match self.borrow {
            Some(borrow) => borrow.read_slice(numbers, index, now),
            None => Some(None),
        }
    }

    fn level_scale(&self) -> f64 {
        MICRO
    }

    fn read_window(&self, _: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Window>> {
        Some(None)
    }

    /// The key's level now under its share, spelled as a bucket of the limit's burst
    /// charged to now, so the token arithmetic decides it (nothing refills at `now_us`).
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a level in 0..=burst in micro-tokens, below 2^53"
    )]
    fn find_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &mut Beside,
        now_us: u64,
    ) -> Found {
        let numbers = RegionNumbers::of(
            *self,
            request.rate,
            request.burst,
            beside.share_of(&request.key),
        );
        let held = beside.borrowed.get(request.key.as_str()).copied();
        if self.borrow.is_none() && held.is_none() {
            let level = numbers.level(stored, now_us);
            return Found::stored(Some(Stored {
                debt: (request.burst * MICRO - level).max(0.0) as u64,
                ts_us: now_us,
            }));
        }
        // Borrowing, or instances hold tokens of it: its groups, as a borrowing bucket's.
        let mut groups = held.unwrap_or_default();
        let give = self.borrow.and_then(|b| b.give);
        let (level, changed) = numbers.lent(stored, &mut groups, give, now_us);
        Found {
            state: Some(Stored {
                debt: (request.burst * MICRO - level).max(0.0) as u64,
                ts_us: now_us,
            }),
            lent: Some(Lent {
                groups,
                changed,
                found: stored,
            }),
        }
    }

    /// A charged key is written at its level against the region's numbers; anything else
    /// keeps what is stored (the script writes only a charge).
    fn keep_in(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept {
        if keep.found.lent.is_some() {
            return self.keep_lent(keep, beside);
        }
        if !keep.charged() {
            *keep.state = None;
            return Kept::default();
        }
        let request = keep.request;
        let numbers = RegionNumbers::of(
            *self,
            request.rate,
            request.burst,
            beside.share_of(&request.key),
        );
        let Some(charged) = *keep.state else {
            return Kept::default();
        };
        let level = request.burst * MICRO - charged.debt as f64;
        let (state, forget_at_us) = numbers.write(level, keep.now_us);
        *keep.state = Some(state);
        Kept {
            forget_at_us: Some(forget_at_us),
            ..Kept::default()
        }
    }

    fn peek_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &Beside,
        now_us: u64,
    ) -> BucketOutcome {
        let numbers = RegionNumbers::of(
            *self,
            request.rate,
            request.burst,
            beside.share_of(&request.key),
        );
        let level = match beside.borrowed.get(request.key.as_str()) {
            Some(groups) => numbers.lent(stored, &mut groups.clone(), None, now_us).0,
            None => numbers.level(stored, now_us),
        };
        let tokens = level / MICRO;
        BucketOutcome {
            tokens,
            enough: can_pay(tokens, request.cost),
            window: None,
        }
    }

    fn peek_view(&self, request: &BucketRequest, peeked: &Peeked) -> PeekView {
        PeekView::Bucket(super::bucket::Peek {
            tokens: peeked.outcome.tokens,
            remaining: peeked.remaining,
            burst: request.burst,
            rate_per_s: request.rate,
            full_in_s: peeked.reset_secs,
        })
    }
}

#[cfg(test)]
#[expect(clippy::cast_precision_loss, reason = "test numbers far below 2^53")]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const S: u64 = 1_000_000;

    /// Micro-tokens the live groups hold at `now_us`.
    fn live(groups: &Groups, now_us: u64) -> f64 {
        groups
            .slots
            .iter()
            .filter(|g| g.1 > 0 && g.0 > now_us)
            .map(|g| g.1 as f64)
            .sum()
    }

    proptest! {
        /// At any time, whatever the share, its end and the groups held: the level a check
        /// reads is at most the size in force then less what live slices hold, so the level
        /// and the slices together never pass the size the home counts.
        #[test]
        fn held_tokens_count_against_the_size_in_force(
            floor_ppm in 1u32..=1_000_000,
            rate in 0.1f64..100.0,
            burst in 1u64..200,
            share_rate in 0.0f64..50.0,
            share_size in 0u64..200,
            share_ends_in in 0u64..20 * S,
            level_of_size in 0.0f64..=1.0,
            held in (0u64..100, 0u64..100),
            deadlines in (1u64..20 * S, 1u64..20 * S),
            read_after in 0u64..30 * S,
        ) {
            let at = 1_000 * S;
            let burst = burst as f64;
            let share = Share { rate: share_rate, size: share_size, until_us: at + share_ends_in };
            let n = RegionNumbers::of(
                Global { floor_ppm, borrow: None },
                rate,
                burst,
                Some(share),
            );
            let mut groups = Groups {
                slots: [(at + deadlines.0, held.0 * S), (at + deadlines.1, held.1 * S)],
                incarnation: Some(at),
            };
            if deadlines.0 == deadlines.1 {
                groups.slots[1] = (0, 0);
            }
            // A bucket written at `at` holding the groups: at most its size less them.
            let size = n.size_at(at);
            let level = ((size - groups.held() as f64) * level_of_size).floor();
            let (stored, _) = n.write(level, at);
            let now = at + read_after;
            let held_then = live(&groups, now);
            let (level, _) = n.lent(Some(stored), &mut groups, None, now);
            prop_assert!(
                level <= n.size_at(now) - held_then,
                "level {level} with {held_then} held, size {}", n.size_at(now)
            );
            prop_assert_eq!(groups.held() as f64, held_then);
        }

        /// A share cut with slices out: the level after the change is at most the new size
        /// less the slices, whatever the level before.
        #[test]
        fn a_cut_leaves_the_new_size_less_the_slices(
            old_size in 0u64..100,
            new_size in 0u64..100,
            held in 1u64..50,
            level_of_size in 0.0f64..=1.0,
            after in 0u64..5 * S,
        ) {
            let at = 1_000 * S;
            let global = Global { floor_ppm: 100_000, borrow: None };
            let request = BucketRequest::of("tg:g:{k}", global.for_check(), 1.0, 100.0);
            let mut beside = Beside::default();
            let old = Share { rate: 1.0, size: old_size, until_us: at + 60 * S };
            beside.shares.insert(request.key.clone(), old);
            let groups = Groups { slots: [(at + 10 * S, held * S), (0, 0)], incarnation: Some(at) };
            beside.borrowed.insert(request.key.clone(), groups);
            let n = RegionNumbers::of(global, 1.0, 100.0, Some(old));
            let level = ((n.size_at(at) - (held * S) as f64) * level_of_size).floor();
            let (stored, _) = n.write_from(level, at, at + 10 * S);
            let now = at + after;
            let new = Share { rate: 0.5, size: new_size, until_us: now + 60 * S };
            let (level, _) = put_share(global, &request, Some(stored), &mut beside, new, now);
            let size = RegionNumbers::of(global, 1.0, 100.0, Some(new)).size_at(now);
            prop_assert!(level <= size - (held * S) as f64, "{level} of {size} with {held} held");
        }
    }

    /// The slice given back returns its unused tokens to the level, never past the size.
    #[test]
    fn a_slice_given_back_returns_to_the_level() {
        let at = 1_000 * S;
        let n = RegionNumbers::of(
            Global {
                floor_ppm: 500_000,
                borrow: None,
            },
            0.001,
            20.0,
            None,
        );
        let mut groups = Groups {
            slots: [(at + 10 * S, 8 * S), (0, 0)],
            incarnation: Some(at),
        };
        let (stored, _) = n.write_from(0.0, at, at + 10 * S);
        let give = GiveBack {
            deadline_us: at + 10 * S,
            taken: 8,
            unused: 5,
            incarnation: at,
        };
        let (level, changed) = n.lent(Some(stored), &mut groups, Some(give), at + S);
        assert!(changed);
        assert_eq!(groups.held(), 0);
        assert!((level - 5.0 * 1e6).abs() < 1e3, "{level}");
    }
}
