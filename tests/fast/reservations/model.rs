//! Random interleavings against the memory store, checking the bound at every step.

use super::*;

/// One step of a random interleaving: a check reserving `estimate`, a settle of the n-th
/// open reservation at `actual`, or time passing. A check or settle comes from an instance
/// whose `on_reservation_expiry` is `refund` when its flag says so (in the mixed runs).
#[derive(Debug, Clone)]
enum Op {
    Check(u64, bool),
    Settle(usize, u64, bool),
    Pass(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..=6, any::<bool>()).prop_map(|(estimate, refund)| Op::Check(estimate, refund)),
        (0usize..8, 0u64..=8, any::<bool>())
            .prop_map(|(n, actual, refund)| Op::Settle(n, actual, refund)),
        (1u64..=3_000).prop_map(Op::Pass),
    ]
}

/// Where an unsettled reservation stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expiry {
    Live,
    /// Expired, not yet moved by a check or settle: its estimate still charged.
    Due,
    Kept,
    GivenBack,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever checks, settles (retried, late or not), expiries and refunds interleave, on
    /// instances with one expiry mode or each with its own: a check is admitted exactly when
    /// the bucket holds its estimate, a settle finds its reservation exactly when it was never
    /// settled (live, or expired and settled late), and what is held, settled and kept never
    /// exceeds burst + rate × t (max_debt 0: a settle above its estimate charges only down to
    /// 0).
    #[test]
    fn held_and_settled_never_exceed_the_bound(
        ops in proptest::collection::vec(op(), 1..60),
        // 0: every instance keeps, 1: every one refunds, 2: each op's own.
        modes in 0u8..3,
    ) {
        const RATE_PER_S: f64 = 1.0;
        const BURST: f64 = 8.0;
        const TTL_MS: u64 = 2_000;
        let clock = Arc::new(ManualClock::default());
        clock.set_us(1_000_000_000_000);
        let store = MemoryStore::with_clock(1_000, clock.clone());
        let mode = |own: bool| match modes {
            0 => false,
            1 => true,
            _ => own,
        };
        let request = |estimate: u64, id: u128, refund: bool| BucketRequest {
            key: "k".into(),
            rate: RATE_PER_S,
            burst: BURST,
            cost: estimate,
            shadow: false,
            limit: 0,
            meter: Meter::Reserve(Reserve { ttl_ms: TTL_MS, id, refund }),
        };
        // A check or settle first moves the due ones, as its own mode says.
        let sweep = |open: &mut Vec<(u128, u64, u64, Expiry)>, spent: &mut f64, refund: bool| {
            for (_, estimate, _, expiry) in open.iter_mut() {
                if *expiry == Expiry::Due {
                    *expiry = if refund {
                        *spent -= *estimate as f64;
                        Expiry::GivenBack
                    } else {
                        Expiry::Kept
                    };
                }
            }
        };
        // Unsettled reservations: (id, estimate, taken at ms, where it stands); and the
        // settled ones (id, estimate). `spent` is what was taken for good: settled costs as
        // charged, estimates expired and not given back.
        let mut open: Vec<(u128, u64, u64, Expiry)> = Vec::new();
        let mut settled: Vec<(u128, u64)> = Vec::new();
        let mut spent = 0.0;
        let mut now_ms = 0u64;
        let mut next_id = 1u128;
        for op in ops {
            match op {
                Op::Check(estimate, own) => {
                    let asked = request(estimate, next_id, mode(own));
                    next_id += 1;
                    let before = store.peek_now(&asked).tokens;
                    let decided = store.decide_sync(std::slice::from_ref(&asked));
                    prop_assert_eq!(decided.allowed, before >= estimate as f64);
                    sweep(&mut open, &mut spent, mode(own));
                    if decided.allowed {
                        open.push((next_id - 1, estimate, now_ms, Expiry::Live));
                    }
                }
                Op::Settle(n, actual, own) => {
                    // An unsettled one, or (one time in three) one settled before: a retry.
                    let retry = n % 3 == 2 && !settled.is_empty();
                    let (id, estimate) = if retry {
                        settled[n % settled.len()]
                    } else if let Some((id, estimate, _, _)) = open.get(n % open.len().max(1)) {
                        (*id, *estimate)
                    } else {
                        continue;
                    };
                    let asked = request(estimate, id, mode(own));
                    let before = store.peek_now(&asked).tokens;
                    let done = store.settle_now(&Settle {
                        bucket: BucketRequest { cost: actual, ..asked },
                        estimate,
                        max_debt: 0.0,
                    });
                    prop_assert_eq!(done.held, !retry);
                    sweep(&mut open, &mut spent, mode(own));
                    if done.held {
                        let expiry = open
                            .iter()
                            .find(|(open_id, ..)| *open_id == id)
                            .map(|(.., expiry)| *expiry);
                        // What the check's charge stands for now: the estimate, unless it was
                        // given back at expiry (whatever this settle's mode).
                        let standing = match expiry {
                            Some(Expiry::GivenBack) => 0,
                            _ => estimate,
                        };
                        if expiry == Some(Expiry::Kept) {
                            spent -= estimate as f64;
                        }
                        let extra = (actual.saturating_sub(standing) as f64).min(before.max(0.0));
                        spent += actual.min(standing) as f64 + extra;
                        open.retain(|(open_id, ..)| *open_id != id);
                        settled.push((id, estimate));
                    }
                }
                Op::Pass(ms) => {
                    clock.advance_ms(ms);
                    now_ms += ms;
                    // Expired ones cost their estimate until a check or settle gives it back
                    // (under `refund`) or a late settle replaces it by the actual cost.
                    for (_, estimate, at, expiry) in &mut open {
                        if *expiry == Expiry::Live && *at + TTL_MS <= now_ms {
                            *expiry = Expiry::Due;
                            spent += *estimate as f64;
                        }
                    }
                }
            }
            let held: u64 = open
                .iter()
                .filter(|(.., expiry)| *expiry == Expiry::Live)
                .map(|(_, estimate, _, _)| estimate)
                .sum();
            prop_assert_eq!(store.reserved_now(&request(1, 0, false)).tokens, held);
            let bound = BURST + RATE_PER_S * now_ms as f64 / 1000.0;
            prop_assert!(
                held as f64 + spent <= bound + 1e-6,
                "held {} + spent {} > {}", held, spent, bound
            );
        }
    }
}
