//! What a store key counts ([`Meter`]), and how each kind is spelled to the Lua scripts and
//! read back from their replies. The one place that knows: a check's and a report's arguments
//! (`redis::wire`) and a peek's (`redis::admin`) each ask the meter, as does the reading of a
//! reply's windows and levels; the memory store runs the same kinds without spelling them.

use crate::base::calendar::Period;

/// What a store key counts. Each kind is named as a limit's config names it: `rate` and
/// `burst` make a `Bucket`, then `quota`, `concurrency`, `reserve` and `borrow`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Meter {
    /// A token bucket: `rate` per second, capacity `burst`.
    #[default]
    Bucket,
    /// At most `burst` per calendar period (UTC on the store's clock); `rate` is unused.
    Quota(Period),
    /// At most `burst` leases held at once (`rate` is unused, the cost is one lease): a set
    /// of lease ids, each expiring `ttl_ms` after it was taken unless released before.
    Concurrency(Lease),
    /// A token bucket (as [`Meter::Bucket`]) whose charge is held as a reservation: the check
    /// charges the estimate (`cost`) and records it under `id` beside the bucket, so that
    /// [`Store::settle`](super::Store::settle) can replace it with the actual cost, once.
    Reserve(Reserve),
    /// A token bucket (as [`Meter::Bucket`]) from which the instance borrows: the check may
    /// give back a slice and take a new one beside its own cost (`docs/DESIGN.md`).
    Borrow(Borrow),
}

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
    /// The incarnation of the groups it was taken into ([`crate::store::Slice`]): a bucket
    /// deleted and held again since (`FLUSHALL`) has another, and the give-back does nothing.
    pub incarnation: u64,
}

/// One bucket's first argument to a script, as [`Meter::script_arg`] and [`Meter::peek_arg`]
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

impl Meter {
    /// The first argument a check (`lua/token_bucket.lua`) and a report (`lua/report.lua`)
    /// take for a bucket of `rate` tokens per second: the rate itself (a plain bucket), the
    /// period's code (a quota), or the kind's letter and its fields (`L<ttl>:<lease>`,
    /// `R<ttl>:<id>:<r|k>:<rate>`, `B<grid>:<want>:<deadline>:<taken>:<unused>:<rate>`).
    pub fn script_arg(&self, rate: f64) -> ScriptArg {
        match self {
            Meter::Bucket => ScriptArg::Number(rate),
            Meter::Quota(period) => ScriptArg::Code(period.code()),
            Meter::Concurrency(lease) => {
                ScriptArg::Text(format!("L{}:{}", lease.ttl_ms, lease.member()))
            }
            Meter::Reserve(reserve) => ScriptArg::Text(format!(
                "R{}:{:032x}:{}:{}",
                reserve.ttl_ms,
                reserve.id,
                reserve.expiry_code(),
                rate
            )),
            Meter::Borrow(borrow) => {
                let give = borrow.give.unwrap_or(GiveBack {
                    deadline_us: 0,
                    taken: 0,
                    unused: 0,
                    incarnation: 0,
                });
                ScriptArg::Text(format!(
                    "B{}:{}:{}:{}:{}:{}:{}",
                    borrow.grid_us.max(1),
                    borrow.want,
                    give.deadline_us,
                    give.taken,
                    give.unused,
                    give.incarnation,
                    rate
                ))
            }
        }
    }

    /// The first argument of a peek (`lua/peek.lua`), which reads a key and charges nothing:
    /// the rate as text (a plain bucket), `B<rate>`, the period's code, `L`, or
    /// `R<r|k><rate>`.
    pub fn peek_arg(&self, rate: f64) -> ScriptArg {
        match self {
            Meter::Bucket => ScriptArg::Text(rate.to_string()),
            Meter::Borrow(_) => ScriptArg::Text(format!("B{rate}")),
            Meter::Quota(period) => ScriptArg::Code(period.code()),
            Meter::Concurrency(_) => ScriptArg::Code("L"),
            Meter::Reserve(reserve) => {
                ScriptArg::Text(format!("R{}{}", reserve.expiry_code(), rate))
            }
        }
    }

    /// What a level in a check's reply is divided by to read as tokens: a token bucket's comes
    /// in micro-tokens (an integer, cheaper for the script to print; the quotient is what
    /// `%.6f` of it would read back as), a quota's and a concurrency key's in whole requests.
    pub fn level_scale(&self) -> f64 {
        match self {
            Meter::Bucket | Meter::Reserve(_) | Meter::Borrow(_) => 1_000_000.0,
            Meter::Quota(_) | Meter::Concurrency(_) => 1.0,
        }
    }

    /// The window of a key of this kind after a script ran: a quota's is the two numbers its
    /// reply gives (`ends_in_s length_s`, drawn from `numbers`), a concurrency key's its
    /// lease's, a bucket's none. `None` when a quota's numbers are missing (a malformed reply).
    pub fn read_window(&self, mut numbers: impl FnMut() -> Option<u64>) -> Option<Option<Window>> {
        match self {
            Meter::Bucket | Meter::Reserve(_) | Meter::Borrow(_) => Some(None),
            Meter::Concurrency(lease) => Some(Some(lease.window())),
            Meter::Quota(_) => {
                let ends_in_s = numbers()?;
                let length_s = numbers()?;
                Some(Some(Window {
                    ends_in_s: ends_in_s.max(1),
                    length_s,
                }))
            }
        }
    }
}

/// One reservation a check asks for: its id (unique per check), how long it is held
/// unsettled, and what happens to its estimate then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve {
    pub ttl_ms: u64,
    pub id: u128,
    /// An unsettled reservation's estimate is given back when it expires (else it is kept:
    /// the request is taken to have cost its estimate).
    pub refund: bool,
}

impl Reserve {
    /// The reservation as stored beside its bucket: `<id in 32 hex digits>:<estimate>`. The
    /// estimate is part of the member, so a settle names exactly what was held.
    pub fn member(&self, estimate: u64) -> String {
        format!("{:032x}:{estimate}", self.id)
    }

    /// What happens to an unsettled estimate at expiry, as the scripts read it: `r` refunded,
    /// `k` kept.
    pub fn expiry_code(&self) -> &'static str {
        if self.refund {
            "r"
        } else {
            "k"
        }
    }
}

/// One lease a check asks for: its id (unique per check), and how long it lives unreleased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub ttl_ms: u64,
    pub id: u128,
}

impl Lease {
    /// The id as stored (a member of the key's set): 32 lower-case hex digits.
    pub fn member(&self) -> String {
        format!("{:032x}", self.id)
    }

    /// A concurrency key's window as the headers show it: a slot frees whenever a holder
    /// releases, which no store can foresee, so a denial asks to retry in 1 s; the policy's
    /// window is the lease's lifetime.
    pub fn window(&self) -> Window {
        Window {
            ends_in_s: 1,
            length_s: self.ttl_ms.div_ceil(1000),
        }
    }
}

/// Where a quota's period stands after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Whole seconds until the period ends (at least 1).
    pub ends_in_s: u64,
    /// The period's length in seconds (a month's depends on the month).
    pub length_s: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_spelled_to_the_scripts_as_they_split_it() {
        let lease = Lease {
            ttl_ms: 30_000,
            id: 0xab,
        };
        let reserve = Reserve {
            ttl_ms: 60_000,
            id: 1,
            refund: true,
        };
        let borrow = Borrow {
            grid_us: 0,
            want: 4,
            give: None,
        };
        let spelled = |meter: Meter| (meter.script_arg(2.5), meter.peek_arg(2.5));
        assert_eq!(
            spelled(Meter::Bucket),
            (ScriptArg::Number(2.5), ScriptArg::Text("2.5".into()))
        );
        assert_eq!(
            spelled(Meter::Quota(Period::Day)),
            (ScriptArg::Code("d"), ScriptArg::Code("d"))
        );
        assert_eq!(
            spelled(Meter::Concurrency(lease)),
            (
                ScriptArg::Text(format!("L30000:{:032x}", 0xab)),
                ScriptArg::Code("L")
            )
        );
        assert_eq!(
            spelled(Meter::Reserve(reserve)),
            (
                ScriptArg::Text(format!("R60000:{:032x}:r:2.5", 1)),
                ScriptArg::Text("Rr2.5".into())
            )
        );
        assert_eq!(
            spelled(Meter::Borrow(borrow)),
            (
                ScriptArg::Text("B1:4:0:0:0:0:2.5".into()),
                ScriptArg::Text("B2.5".into())
            )
        );
    }

    #[test]
    fn only_a_quota_reads_its_window_from_the_reply() {
        let mut numbers = [0_u64, 3600, 7].into_iter();
        let window = Meter::Quota(Period::Hour).read_window(|| numbers.next());
        assert_eq!(
            window,
            Some(Some(Window {
                ends_in_s: 1,
                length_s: 3600
            }))
        );
        assert_eq!(numbers.next(), Some(7), "two numbers read, no more");
        assert_eq!(Meter::Quota(Period::Hour).read_window(|| None), None);
        assert_eq!(Meter::Bucket.read_window(|| panic!("read")), Some(None));
        let lease = Lease {
            ttl_ms: 1500,
            id: 0,
        };
        assert_eq!(
            Meter::Concurrency(lease).read_window(|| None),
            Some(Some(Window {
                ends_in_s: 1,
                length_s: 2
            }))
        );
    }
}
