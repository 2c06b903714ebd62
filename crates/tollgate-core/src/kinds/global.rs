//! A global limit's key in a region (`scope = "global"`, `docs/DESIGN.md`, "One limit across
//! regions"): a token bucket decided against the region's numbers for the key, its *floor*
//! (a fixed fraction of the limit's rate and burst, never moved) plus the *share* the home
//! last assigned it, kept beside the bucket until its end on the store's clock. Refill is
//! piecewise: the floor and share's rate until the share ends, the floor's after; a share is
//! written only through [`put_share`], which first brings the bucket to now under the old
//! one and never adds tokens. The Rust twin of `lua/global.lua` and `lua/global_share.lua`,
//! operation for operation, in micro-tokens.

use super::tokens::{self, Shown};
pub use super::twin::Share;
use super::twin::{Beside, Found, Keep, Kept, Stored};
use super::{
    can_pay, BucketOutcome, BucketRequest, Configured, Kind, LimitView, Meter, PeekView, Peeked,
    ScriptArg, Window,
};

use crate::config::regions::floor_ppm;
use crate::config::{Config, LimitConfig};

const MICRO: f64 = 1_000_000.0;
/// The longest a bucket is kept (`lua/bounds.lua`'s `MAX_TTL_US`): two refills of ten years.
const MAX_TTL_US: f64 = 2.0 * 315_360_000.0 * MICRO;

/// A global limit's key in this region: its floor, in millionths of the limit's numbers (0 at
/// home, which admits nothing of a global limit itself).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Global {
    pub floor_ppm: u32,
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
        Some(Global { floor_ppm })
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

    /// `global_write`: the bucket at `level` as of `now_us`, and when it is full again
    /// (µs), piecewise as it refills.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a debt and a time below 2^53, at least 0"
    )]
    pub fn write(&self, level: f64, now_us: u64) -> (Stored, u64) {
        let now = now_us as f64;
        let (debt, full) = if now < self.u {
            let debt = self.s1 - level;
            let mut full = now + (debt / self.r1).ceil();
            if full > self.u {
                let at_u = (level + ((self.u - now) * self.r1).floor()).min(self.fc);
                full = if self.fr > 0.0 {
                    self.u + ((self.fc - at_u) / self.fr).ceil()
                } else {
                    now + MAX_TTL_US
                };
            }
            (debt, full)
        } else {
            let debt = self.fc - level;
            let full = if self.fr > 0.0 {
                now + (debt / self.fr).ceil()
            } else {
                now + MAX_TTL_US
            };
            (debt, full)
        };
        let full = full.min(now + MAX_TTL_US).max(now);
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
/// level capped at the new size. Returns the level (micro-tokens) and what to store, `(state,
/// forget at)`: nothing for an absent bucket, full at the size its next check finds.
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
    let level = old.level(stored, now_us);
    beside.shares.insert(request.key.clone(), share);
    let new = RegionNumbers::of(global, request.rate, request.burst, Some(share));
    let size = new.size_at(now_us);
    match stored {
        Some(_) => {
            let level = level.min(size);
            (level, Some(new.write(level, now_us)))
        }
        None => (size, None),
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

    fn script_arg(&self, rate: f64) -> ScriptArg {
        ScriptArg::Text(format!("G{}:{rate}", self.floor_ppm))
    }

    fn peek_arg(&self, rate: f64) -> ScriptArg {
        self.script_arg(rate)
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
        let level = numbers.level(stored, now_us);
        Found::stored(Some(Stored {
            debt: (request.burst * MICRO - level).max(0.0) as u64,
            ts_us: now_us,
        }))
    }

    /// A charged key is written at its level against the region's numbers; anything else
    /// keeps what is stored (the script writes only a charge).
    fn keep_in(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept {
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
        let tokens = numbers.level(stored, now_us) / MICRO;
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
