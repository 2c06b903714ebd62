//! One limit across regions, modelled: three regions, each deciding a global key in a memory
//! store of its own (the region's bucket, `kinds::global`) against its floor and the shares
//! its reporter writes, and a home allocating the rest among them with the quota service's
//! allocator (`store::rlqs::allocate`: the same script's twin, escrow included), on one manual
//! clock. Random demand, report delays each way, links cut and restored, streams opened again
//! (a home replica died, a region restarted) and gaps of an hour: in every window, what the
//! regions admitted together is at most `burst + rate × W`. With borrowing, each region's two
//! instances take slices of the key's tokens and admit from them until their group ends (a
//! longer use than an instance makes, `limiter::borrow`), through share cuts and lapses.

use std::sync::Arc;

use proptest::prelude::*;

use tollgate_core::base::clock::{Clock, ManualClock};
use tollgate_core::kinds::borrow::{Borrow, GiveBack};
use tollgate_core::kinds::global::{Global, Share};
use tollgate_core::kinds::{BucketRequest, Meter};
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::rlqs::{allocate, Member, Pool, Sent, ShareRequest};

const S: u64 = 1_000_000;
/// The home's assignment TTL in the model, and what it counts beyond it (the trip margin).
const TTL_US: u64 = 2 * S;
const MARGIN_US: u64 = S;
/// An answer later than this after its report is dropped by the reporter (`app::region`):
/// the home's escrow counts on a holder applying an answer within the margin.
const LATEST_ANSWER_US: u64 = 800_000;

/// One region: its store, its stream to the home and what it has asked.
struct Region {
    store: MemoryStore<Arc<ManualClock>>,
    floor_ppm: u32,
    /// How often its stream was opened again: each stream is a new holder at home.
    stream: u32,
    cut: bool,
    since_report: u64,
    /// Each instance's slice, when borrowing: (deadline, incarnation, taken, left).
    slices: [Option<(u64, u64, u64, u64)>; 2],
}

/// An answer on its way back: (arrives at, region, the share to write, its stream).
type InFlight = (u64, usize, Share, u32);

fn bucket(region: &Region, rate: f64, burst: u64) -> BucketRequest {
    BucketRequest::of(
        "tg:per-tenant:{acme}",
        Meter::Global(Global {
            floor_ppm: region.floor_ppm,
            borrow: None,
        }),
        rate,
        burst as f64,
    )
}

/// What a holder was last sent: the newest steps of its holding (its stream remembers it).
fn last_sent(pool: &Pool, holder: &str) -> Sent {
    pool.holders
        .iter()
        .find(|(id, _)| id == holder)
        .and_then(|(_, h)| {
            let (rate, _) = *h.rate_steps.last()?;
            let (size, until_us) = *h.size_steps.last()?;
            Some(Sent {
                rate,
                size,
                until_us,
            })
        })
        .unwrap_or_default()
}

/// The most any window of the admissions `(µs, count)` passes `burst + rate × W` by.
fn worst_excess(admissions: &[(u64, u64)], rate_per_s: f64, burst: f64) -> f64 {
    let mut worst = f64::MIN;
    for (i, (start, _)) in admissions.iter().enumerate() {
        let mut total = 0;
        for (end, count) in &admissions[i..] {
            total += count;
            let allowed = burst + rate_per_s * (end - start) as f64 / S as f64;
            worst = worst.max(total as f64 - allowed);
        }
    }
    worst
}

/// Runs the events; the admissions worldwide, `(µs, count)`.
#[allow(clippy::too_many_lines)]
fn run(
    rate_per_s: u64,
    burst: u64,
    floors_ppm: [u32; 3],
    events: &[(usize, u64, u8, u64, u64, u64)],
    latest_answer_us: u64,
    borrow_grid_us: Option<u64>,
) -> Vec<(u64, u64)> {
    let clock = Arc::new(ManualClock::default());
    let mut now = 1_000 * S;
    clock.set_us(now);
    let mut regions: Vec<Region> = floors_ppm
        .iter()
        .map(|&floor_ppm| Region {
            store: MemoryStore::with_clock(100, Arc::clone(&clock)),
            floor_ppm,
            stream: 0,
            cut: false,
            since_report: 0,
            slices: [None, None],
        })
        .collect();
    let rest_ppm = 1_000_000 - floors_ppm.iter().sum::<u32>();
    let rest = f64::from(rest_ppm) / 1e6;
    let rate_units = (rate_per_s as f64 * rest * 3600.0).floor() as u64;
    let size_units = (burst as f64 * rest).floor() as u64;
    let mut pool = Pool::default();
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut admissions = Vec::new();
    for &(r, gap, kind, wanted, up_us, down_us) in events {
        let next = now + gap;
        // Answers arriving before the next event are written when they arrive.
        in_flight.sort_by_key(|a| a.0);
        while let Some(&(at, region, share, stream)) = in_flight.first() {
            if at > next {
                break;
            }
            in_flight.remove(0);
            clock.set_us(at);
            let target = &regions[region];
            if target.cut || target.stream != stream {
                continue;
            }
            target
                .store
                .put_share_now(&bucket(target, rate_per_s as f64, burst), share)
                .expect("a global key");
        }
        now = next;
        clock.set_us(now);
        let region = &mut regions[r];
        match kind {
            // The stream opens again (a home replica died, the region restarted): a new
            // holder at home; answers on the old stream are lost.
            0 => region.stream += 1,
            // The link is cut or restored: nothing crosses while it is cut.
            1 => region.cut = !region.cut,
            // A report: the region reads its store's time (t0) and sends; the home decides
            // `up_us` later; the answer comes `down_us` after that.
            2..=4 => {
                if region.cut {
                    continue;
                }
                let t0 = now;
                let holder = format!("r{r}.{}", region.stream);
                let ask = ShareRequest {
                    key: "pool".into(),
                    holder: holder.clone(),
                    members: vec![Member {
                        reported: true,
                        requests: region.since_report,
                        last: last_sent(&pool, &holder),
                    }],
                    rate_units,
                    size_units,
                    reserve_rate: rate_units / 20,
                    reserve_size: size_units / 20,
                    fill_interval_s: 3600,
                    hold_us: TTL_US + MARGIN_US,
                    max_holders: 64,
                };
                region.since_report = 0;
                let decided_at = t0 + up_us;
                // The model keeps the home's clock moving forward: a report decided before
                // an earlier one is decided with it.
                let decided_at = decided_at.max(pool_last(&pool));
                let grant = allocate(&mut pool, &ask, decided_at);
                let arrives = decided_at + down_us;
                if arrives - t0 > latest_answer_us {
                    continue;
                }
                let share = Share {
                    rate: grant.rate as f64 / 3600.0,
                    size: grant.size,
                    until_us: t0 + TTL_US,
                };
                in_flight.push((arrives, r, share, region.stream));
            }
            // Requests: each decided alone in the region's store.
            _ => {
                let request = bucket(region, rate_per_s as f64, burst);
                let mut admitted = 0;
                for n in 0..wanted {
                    let Some(grid_us) = borrow_grid_us else {
                        if region
                            .store
                            .decide_sync(std::slice::from_ref(&request))
                            .allowed
                        {
                            admitted += 1;
                        }
                        continue;
                    };
                    // Instances in turn; each admits from its slice until its group ends.
                    let slot = &mut region.slices[usize::try_from(n % 2).unwrap_or(0)];
                    if let Some((deadline, _, _, left)) = slot.as_mut() {
                        if *deadline > now && *left > 0 {
                            *left -= 1;
                            admitted += 1;
                            continue;
                        }
                    }
                    let give =
                        slot.take()
                            .map(|(deadline_us, incarnation, taken, left)| GiveBack {
                                deadline_us,
                                taken,
                                unused: left,
                                incarnation,
                            });
                    let asked = request.clone().borrowing(Borrow {
                        grid_us,
                        want: (burst / 2).max(1),
                        give,
                    });
                    let decided = region.store.decide_sync(std::slice::from_ref(&asked));
                    if decided.allowed {
                        admitted += 1;
                    }
                    *slot = decided
                        .slices
                        .first()
                        .map(|s| (s.deadline_us, s.incarnation, s.tokens, s.tokens));
                }
                region.since_report += wanted;
                if admitted > 0 {
                    admissions.push((now, admitted));
                }
            }
        }
    }
    let _ = clock.now_us();
    admissions
}

/// The latest time the pool was decided at (its holders' newest steps less the hold).
fn pool_last(pool: &Pool) -> u64 {
    pool.holders
        .iter()
        .filter_map(|(_, h)| {
            h.size_steps
                .last()
                .map(|(_, until)| until - (TTL_US + MARGIN_US))
        })
        .max()
        .unwrap_or(0)
}

fn events() -> impl Strategy<Value = Vec<(usize, u64, u8, u64, u64, u64)>> {
    let gap = prop_oneof![
        20 => 0u64..1_500_000,
        1 => Just(3_600 * S),
    ];
    prop::collection::vec(
        (
            0usize..3,
            gap,
            0u8..10,
            0u64..40,
            0u64..400_000,
            0u64..400_000,
        ),
        1..200,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Three regions with floors summing to at most 1 and the home sharing the rest: in every
    /// window, worldwide, at most `burst + rate × W`, whatever the demand, delays, cuts,
    /// new streams and long gaps.
    #[test]
    fn regions_never_admit_past_the_limit_worldwide(
        rate_per_s in 1u64..30,
        burst in 4u64..80,
        floors in (1u32..300_000, 1u32..300_000, 1u32..300_000),
        events in events(),
    ) {
        let floors = [floors.0, floors.1, floors.2];
        let admissions = run(rate_per_s, burst, floors, &events, LATEST_ANSWER_US, None);
        let excess = worst_excess(&admissions, rate_per_s as f64, burst as f64);
        prop_assert!(excess <= 1e-6, "{} past burst + rate × W: {:?}", excess, admissions);
    }

    /// The same with borrowing: each region's instances hold slices of the key's tokens (on
    /// a horizon of 100 ms, 1 s or 10 s, longer than the home's TTL) through the home's cuts
    /// and the shares' ends, and admit from them: still at most `burst + rate × W` worldwide
    /// (the slices out count against the share in force).
    #[test]
    fn regions_that_borrow_never_admit_past_the_limit_worldwide(
        rate_per_s in 1u64..30,
        burst in 4u64..80,
        floors in (1u32..300_000, 1u32..300_000, 1u32..300_000),
        grid_us in prop_oneof![Just(100_000u64), Just(S), Just(10 * S)],
        events in events(),
    ) {
        let floors = [floors.0, floors.1, floors.2];
        let admissions =
            run(rate_per_s, burst, floors, &events, LATEST_ANSWER_US, Some(grid_us));
        let excess = worst_excess(&admissions, rate_per_s as f64, burst as f64);
        prop_assert!(excess <= 1e-6, "{} past burst + rate × W: {:?}", excess, admissions);
    }
}

/// Borrowing regions still get and use shares: one region with all the demand admits beyond
/// its floor alone.
#[test]
fn a_borrowing_region_with_all_the_demand_gets_the_rest() {
    let mut events = Vec::new();
    for _ in 0..40 {
        events.push((0, 100_000, 2, 0, 50_000, 50_000));
        events.push((0, 100_000, 9, 20, 0, 0));
    }
    let admissions = run(
        10,
        10,
        [100_000, 100_000, 100_000],
        &events,
        LATEST_ANSWER_US,
        Some(S),
    );
    let admitted: u64 = admissions.iter().map(|(_, n)| n).sum();
    assert!(admitted > 30, "{admitted} admitted: {admissions:?}");
}

/// Shares do move: one region with all the demand admits beyond its floor alone.
#[test]
fn a_region_with_all_the_demand_gets_the_rest() {
    let mut events = Vec::new();
    for _ in 0..40 {
        events.push((0, 100_000, 2, 0, 50_000, 50_000));
        events.push((0, 100_000, 9, 20, 0, 0));
    }
    let admissions = run(
        10,
        10,
        [100_000, 100_000, 100_000],
        &events,
        LATEST_ANSWER_US,
        None,
    );
    let admitted: u64 = admissions.iter().map(|(_, n)| n).sum();
    // 8 s of demand: the floor alone (1/s, 1 token) admits at most 9.
    assert!(admitted > 30, "{admitted} admitted: {admissions:?}");
}
