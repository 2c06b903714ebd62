//! Who is being denied most, per limit, from memory bounded whatever the number of keys.
//!
//! Each limit's denials count into a [`KeyTop`]: for each of the last [`MINUTES`] minutes a
//! Space-Saving summary (Metwally et al.) of at most [`CAPACITY`] counters. A key already
//! counted gains one; a new key takes over the smallest counter and inherits its count, so a
//! key denied often keeps its counter while a long tail of keys denied once share the last
//! few. Counts may only be overestimated, by at most the count they inherited.
//!
//! Recording is one short lock on one of [`SHARDS`] rings, picked per thread: a flood of one
//! key from every worker never waits on one lock, and no denial is ever dropped. Summaries are
//! merged when someone asks ([`KeyTop::top`]). Keys are recorded as the store key's tail (the
//! escaped part values joined by `|`); [`parts`] reads the values back.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::base::clock::{Clock, MonotonicClock};

/// Counters per minute summary: enough to hold the heavy hitters of a Zipf-like flood over a
/// million keys (see the tests) at a few hundred kB per limit at most.
pub const CAPACITY: usize = 128;
/// Minutes kept: the longest window (15) plus the current, partial one.
pub const MINUTES: usize = 16;
/// Rings per limit; threads are spread over them, so recording rarely waits.
pub const SHARDS: usize = 4;
/// The windows `/v1/top` offers, in minutes.
pub const WINDOWS: [u64; 3] = [1, 5, 15];

const MINUTE_US: u64 = 60_000_000;

/// The denials of one limit, per key, for the last [`MINUTES`] minutes.
pub struct KeyTop {
    shards: [Mutex<Ring>; SHARDS],
    clock: Arc<dyn Clock>,
}

/// What [`KeyTop::top`] found for a window.
#[derive(Debug, Clone, PartialEq)]
pub struct TopList {
    /// The most denied keys, most denied first: (key tail, denials).
    pub keys: Vec<(String, u64)>,
    /// Every denial of the window, counted exactly.
    pub total: u64,
    /// Seconds the window covers (less than its length while the process is young).
    pub covered_s: u64,
}

impl Default for KeyTop {
    fn default() -> Self {
        KeyTop::with_clock(Arc::new(MonotonicClock::default()))
    }
}

impl KeyTop {
    pub fn with_clock(clock: Arc<dyn Clock>) -> KeyTop {
        KeyTop {
            shards: std::array::from_fn(|_| Mutex::new(Ring::default())),
            clock,
        }
    }

    /// Counts one denial of `key` (a store key's tail). Allocates only when the key takes over
    /// a counter whose string is too short for it.
    pub fn record(&self, key: &str) {
        let minute = self.clock.now_us() / MINUTE_US;
        let hash = hash_of(key);
        let mut ring = self.shards[shard_of_thread()]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ring.at(minute).record(key, hash);
    }

    /// The `n` most denied keys over the last `minutes` whole minutes and the current one.
    pub fn top(&self, minutes: u64, n: usize) -> TopList {
        let now_us = self.clock.now_us();
        let now = now_us / MINUTE_US;
        let oldest = now.saturating_sub(minutes);
        let mut merged: HashMap<String, u64> = HashMap::new();
        let mut total = 0;
        for shard in &self.shards {
            let ring = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for slot in ring
                .slots
                .iter()
                .filter(|s| (oldest..=now).contains(&s.minute))
            {
                total += slot.summary.total;
                for counter in &slot.summary.counters {
                    *merged.entry(counter.key.clone()).or_default() += counter.count;
                }
            }
        }
        let mut keys: Vec<(String, u64)> = merged.into_iter().collect();
        keys.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        keys.truncate(n);
        let covered_s = (minutes * 60 + (now_us / 1_000_000) % 60).min(now_us / 1_000_000);
        TopList {
            keys,
            total,
            covered_s: covered_s.max(1),
        }
    }

    /// Counters held: at most `SHARDS * MINUTES * CAPACITY`, whatever was recorded.
    pub fn counters(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let ring = shard.lock().unwrap_or_else(PoisonError::into_inner);
                ring.slots
                    .iter()
                    .map(|s| s.summary.counters.len())
                    .sum::<usize>()
            })
            .sum()
    }
}

/// One shard's summaries, one per minute, reused in turn.
struct Ring {
    slots: Vec<Slot>,
}

impl Default for Ring {
    fn default() -> Self {
        Ring {
            slots: (0..MINUTES)
                .map(|_| Slot {
                    // No minute is `u64::MAX`: an unused slot is in no window.
                    minute: u64::MAX,
                    summary: Summary::default(),
                })
                .collect(),
        }
    }
}

impl Ring {
    /// The summary of `minute`, emptied first if it still holds an older one.
    fn at(&mut self, minute: u64) -> &mut Summary {
        let slot = &mut self.slots[usize::try_from(minute % MINUTES as u64).unwrap_or_default()];
        if slot.minute != minute {
            slot.minute = minute;
            slot.summary.reset();
        }
        &mut slot.summary
    }
}

struct Slot {
    minute: u64,
    summary: Summary,
}

/// A Space-Saving summary; counters kept sorted by count, largest first, so a heavy key is
/// found within the first few comparisons and the smallest counter is the last.
#[derive(Default)]
pub struct Summary {
    counters: Vec<Counter>,
    total: u64,
}

struct Counter {
    hash: u64,
    count: u64,
    key: String,
}

impl Summary {
    pub fn record(&mut self, key: &str, hash: u64) {
        self.total += 1;
        let found = self
            .counters
            .iter()
            .position(|c| c.hash == hash && c.key == key);
        let at = match found {
            Some(at) => {
                self.counters[at].count += 1;
                at
            }
            None if self.counters.len() < CAPACITY => {
                self.counters.push(Counter {
                    hash,
                    count: 1,
                    key: key.to_owned(),
                });
                self.counters.len() - 1
            }
            None => {
                let at = self.counters.len() - 1;
                let smallest = &mut self.counters[at];
                smallest.hash = hash;
                smallest.count += 1;
                // Reuses the string's buffer: no allocation once buffers are long enough.
                smallest.key.clear();
                smallest.key.push_str(key);
                at
            }
        };
        self.rise(at);
    }

    /// Keeps the order after counter `at` grew by one.
    fn rise(&mut self, mut at: usize) {
        while at > 0 && self.counters[at - 1].count < self.counters[at].count {
            self.counters.swap(at - 1, at);
            at -= 1;
        }
    }

    fn reset(&mut self) {
        self.counters.clear();
        self.total = 0;
    }

    /// (key, count) of every counter, largest first.
    pub fn entries(&self) -> impl Iterator<Item = (&str, u64)> {
        self.counters.iter().map(|c| (c.key.as_str(), c.count))
    }
}

/// A fixed-key hash: cheap, and the same in every shard.
pub fn hash_of(key: &str) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(key)
}

/// This thread's shard, handed out in turn the first time a thread records.
fn shard_of_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|shard| {
        if shard.get() == usize::MAX {
            shard.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        shard.get()
    })
}

/// The part values of a key tail, unescaped. A tail hashed because it was long or unprintable
/// (`#` and hex digits) is one value, as is; a part absent under `on_missing = "anonymous"`
/// reads `(anonymous)`.
pub fn parts(tail: &str) -> Vec<Cow<'_, str>> {
    if tail.starts_with('#') {
        return vec![Cow::Borrowed(tail)];
    }
    tail.split('|').map(unescape).collect()
}

fn unescape(part: &str) -> Cow<'_, str> {
    if part == "%anon" {
        return Cow::Borrowed("(anonymous)");
    }
    if !part.contains('%') {
        return Cow::Borrowed(part);
    }
    let mut out = Vec::with_capacity(part.len());
    let bytes = part.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%')
            .then(|| part.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match decoded {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests;
