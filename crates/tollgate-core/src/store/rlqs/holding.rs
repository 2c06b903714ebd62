//! What one holder has been given, as its pool counts it: a staircase per dimension.

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
pub(super) fn level(steps: &[(u64, u64)], now_us: u64) -> u64 {
    steps
        .iter()
        .find(|(_, until)| *until > now_us)
        .map_or(0, |(units, _)| *units)
}

/// A staircase after sending `units` until `until_us` at `now_us`. A denial (0) is kept as
/// a step too, so the newest step is always what was last sent.
pub(super) fn push(steps: &mut Vec<(u64, u64)>, units: u64, until_us: u64, now_us: u64) {
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

    /// Whether it may be forgotten at `now_us`: nothing it was given counts, and it has not
    /// reported for `quiet_us`.
    pub fn lapsed(&self, now_us: u64, quiet_us: u64) -> bool {
        let counts = |steps: &[(u64, u64)]| steps.iter().any(|(_, until)| *until > now_us);
        !counts(&self.rate_steps)
            && !counts(&self.size_steps)
            && self.last_us.saturating_add(quiet_us) <= now_us
    }

    /// The stored form (as `lua/rlqs.lua` writes it): integers separated by spaces: demand,
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
