// A Zipf sample and its expected shares: statistics, where the cast lints guard nothing.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::base::clock::ManualClock;

/// A seeded generator (SplitMix64): the same stream on every run.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Ranks 0..keys drawn with probability proportional to 1 / (rank + 1)^s.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(keys: usize, s: f64) -> Zipf {
        let mut sum = 0.0;
        let cumulative = (1..=keys)
            .map(|rank| {
                sum += 1.0 / (rank as f64).powf(s);
                sum
            })
            .collect();
        Zipf { cumulative }
    }

    fn draw(&self, random: &mut SplitMix) -> usize {
        let target = random.unit() * self.cumulative[self.cumulative.len() - 1];
        self.cumulative
            .partition_point(|&c| c < target)
            .min(self.cumulative.len() - 1)
    }
}

/// Key names that do not sort like their ranks, so nothing can lean on the order.
fn key_of(rank: usize) -> String {
    format!("k{:016x}", hash_of(&rank.to_string()))
}

/// Feeds `draws` Zipf denials over `keys` keys into `top` from `threads` threads, spread over
/// `minutes` minutes; returns the true top 10 (exact counts).
fn flood(top: &KeyTop, clock: &ManualClock, s: f64, draws: usize, minutes: u64) -> Vec<String> {
    let zipf = Zipf::new(1_000_000, s);
    let mut random = SplitMix(0x7011_6a7e ^ s.to_bits());
    let mut exact: HashMap<usize, u64> = HashMap::new();
    let per_minute = draws / minutes as usize;
    for _ in 0..minutes {
        let batch: Vec<usize> = (0..per_minute).map(|_| zipf.draw(&mut random)).collect();
        for &rank in &batch {
            *exact.entry(rank).or_default() += 1;
        }
        // Two threads, as two workers would record: they land on different shards.
        std::thread::scope(|scope| {
            for half in batch.chunks(batch.len().div_ceil(2)) {
                scope.spawn(move || {
                    for &rank in half {
                        top.record(&key_of(rank));
                    }
                });
            }
        });
        clock.advance_ms(60_000);
    }
    clock.advance_ms(1_000);
    let mut ranks: Vec<(usize, u64)> = exact.into_iter().collect();
    ranks.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranks
        .iter()
        .take(10)
        .map(|&(rank, _)| key_of(rank))
        .collect()
}

fn reported_top_ten_holds_nine_of_the_true_ones(s: f64) {
    let clock = Arc::new(ManualClock::default());
    clock.set_us(3_600_000_000);
    let top = KeyTop::with_clock(clock.clone());
    let truth = flood(&top, &clock, s, 1_000_000, 5);
    let reported = top.top(5, 10);
    let found = truth
        .iter()
        .filter(|key| reported.keys.iter().any(|(k, _)| k == *key))
        .count();
    assert!(
        found >= 9,
        "s = {s}: {found} of the true top 10 reported: {:?} vs {truth:?}",
        reported.keys
    );
    assert_eq!(reported.total, 1_000_000);
}

#[test]
fn zipf_one_over_a_million_keys_reports_nine_of_the_true_top_ten() {
    reported_top_ten_holds_nine_of_the_true_ones(1.0);
}

#[test]
fn zipf_one_point_one_over_a_million_keys_reports_nine_of_the_true_top_ten() {
    reported_top_ten_holds_nine_of_the_true_ones(1.1);
}

#[test]
fn memory_stays_fixed_after_a_million_distinct_keys() {
    let clock = Arc::new(ManualClock::default());
    let top = KeyTop::with_clock(clock.clone());
    for minute in 0..20u64 {
        for i in 0..50_000u64 {
            top.record(&format!("198.51.{minute}.{i}"));
        }
        clock.advance_ms(60_000);
        assert!(top.counters() <= SHARDS * MINUTES * CAPACITY);
    }
    // One thread records into one shard: its 16 minutes are full, nothing more.
    assert_eq!(top.counters(), MINUTES * CAPACITY);
}

#[test]
fn windows_count_only_their_minutes() {
    let clock = Arc::new(ManualClock::default());
    clock.set_us(10 * MINUTE_US);
    let top = KeyTop::with_clock(clock.clone());
    for _ in 0..30 {
        top.record("old");
    }
    clock.advance_ms(10 * 60_000);
    for _ in 0..20 {
        top.record("new");
    }
    clock.advance_ms(30_000);
    let one = top.top(1, 10);
    assert_eq!(one.keys, vec![("new".to_string(), 20)]);
    assert_eq!((one.total, one.covered_s), (20, 90));
    let fifteen = top.top(15, 10);
    assert_eq!(
        fifteen.keys,
        vec![("old".to_string(), 30), ("new".to_string(), 20)]
    );
    assert_eq!(fifteen.total, 50);
    // 16 minutes later the old minute is gone, even though its slot was never reused.
    clock.advance_ms(16 * 60_000);
    assert_eq!(top.top(15, 10).total, 0);
}

#[test]
fn a_young_process_covers_only_its_age() {
    let clock = Arc::new(ManualClock::default());
    clock.set_us(20_000_000);
    let top = KeyTop::with_clock(clock);
    assert_eq!(top.top(15, 10).covered_s, 20);
}

#[test]
fn summary_counts_exactly_while_it_has_room() {
    let mut summary = Summary::default();
    for (key, times) in [("a", 3), ("b", 5), ("c", 1)] {
        for _ in 0..times {
            summary.record(key, hash_of(key));
        }
    }
    let entries: Vec<_> = summary.entries().collect();
    assert_eq!(entries, vec![("b", 5), ("a", 3), ("c", 1)]);
}

#[test]
fn a_new_key_takes_over_the_smallest_counter_when_full() {
    let mut summary = Summary::default();
    for i in 0..CAPACITY {
        let key = format!("k{i}");
        summary.record(&key, hash_of(&key));
        summary.record(&key, hash_of(&key));
    }
    summary.record("k0", hash_of("k0"));
    summary.record("newcomer", hash_of("newcomer"));
    let entries: Vec<_> = summary.entries().collect();
    assert_eq!(entries.len(), CAPACITY);
    assert_eq!(entries[0], ("k0", 3));
    // It inherits the count it replaced (2) plus its own: an overestimate, never an under.
    assert!(entries.contains(&("newcomer", 3)));
}

#[test]
fn tails_are_read_back_into_their_values() {
    assert_eq!(
        crate::base::keys::tail_in_key("tg:per-ip:{203.0.113.9}", "tg", "per-ip"),
        "203.0.113.9"
    );
    assert_eq!(crate::base::keys::tail_in_key("odd", "tg", "per-ip"), "odd");
    assert_eq!(parts("a%7Cb|GET"), vec!["a|b", "GET"]);
    assert_eq!(parts("100%25|%anon"), vec!["100%", "(anonymous)"]);
    assert_eq!(parts("#0123abcd"), vec!["#0123abcd"]);
    assert_eq!(parts("bad%zz"), vec!["bad%zz"]);
}
