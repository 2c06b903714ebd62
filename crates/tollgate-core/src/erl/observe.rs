//! envoyproxy/ratelimit's metrics, for dashboards and alerts written against it (Envoy
//! Gateway's among them): per stats key (see `erl::policy::StatsKey`) the
//! counters `total_hits`, `over_limit`, `near_limit`, `within_limit` and `shadow_mode`, counted
//! as it counts them, and its service-level counters. Read two ways: as Prometheus series under
//! the names and labels of its built-in statsd mapping ([`ErlStats::render`]), and as statsd
//! counters, the increase since the last flush ([`ErlStats::statsd_lines`]).
//!
//! A key's counters are found in one of [`SHARDS`] maps, each behind its own lock, held for
//! reading on the hot path (a key's first count takes it for writing once); counting itself is
//! atomic adds. A key, like a series of envoyproxy/ratelimit, exists from its first count.
//!
//! Keys that carry a request's values (`detailed_metric`, `value_to_metric`, a descriptor's
//! own `limit`) come from clients, so they are bounded: at most `envoy.metrics.max_keys` at
//! once, a new one past that counted in its rule's overflow key instead (logged once), and
//! each dropped by [`ErlStats::sweep`] once it counted nothing for [`IDLE_SWEEPS`] sweeps. A dropped key's
//! counts stay in its Prometheus series while another key of that series lives, so a series
//! never goes down; a series whose every key went is gone, and starts again from 0 if it comes
//! back (a counter reset, as after a restart). Keys the configuration spells alone (one per
//! rule) and overflow keys are neither capped nor dropped.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

use render::Labels;

mod render;

/// Independent maps of keys: requests for different keys rarely meet on one lock.
pub const SHARDS: usize = 16;

/// Sweeps (one per flush interval) a key carrying request values may count nothing before it
/// is dropped: 5 minutes at the default interval of 10 s.
pub const IDLE_SWEEPS: u32 = 30;

/// The counters of one stats key, in envoyproxy/ratelimit's order of names.
const STATS: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];
const TOTAL_HITS: usize = 0;
const OVER_LIMIT: usize = 1;
const NEAR_LIMIT: usize = 2;
const WITHIN_LIMIT: usize = 3;
const SHADOW_MODE: usize = 4;

/// The upper bounds of the response time histogram: the Prometheus client's defaults, which
/// envoyproxy/ratelimit's statsd exporter uses.
const RESPONSE_TIME_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What one rule did to one descriptor, in envoyproxy/ratelimit's terms: a counter of `limit`
/// per window that stood at `before` and was asked for `hits` more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hits {
    pub limit: u64,
    pub before: u64,
    pub hits: u64,
    /// The rule is in shadow mode: what is over the limit is also counted as `shadow_mode`.
    pub shadow: bool,
}

/// A stats key to count under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsName<'a> {
    pub key: &'a str,
    /// For a key carrying request values, where its rule counts once the most such keys
    /// are held; `None` for a key the configuration spells alone.
    pub overflow: Option<&'a str>,
}

impl<'a> StatsName<'a> {
    /// A key the configuration spells alone: never capped, never dropped.
    pub fn fixed(key: &'a str) -> StatsName<'a> {
        StatsName {
            key,
            overflow: None,
        }
    }

    /// A key carrying request values, `overflow` its rule's overflow key.
    pub fn from_request(key: &'a str, overflow: &'a str) -> StatsName<'a> {
        StatsName {
            key,
            overflow: Some(overflow),
        }
    }
}

/// The counters of one key, and what the statsd flush last sent of each.
#[derive(Debug, Default)]
struct KeyCounters {
    counts: [AtomicU64; 5],
    flushed: [AtomicU64; 5],
    /// It carries request values: counted against the cap, dropped once idle.
    capped: bool,
    /// `total_hits` at the last sweep (every count adds to it), and the sweeps since it last
    /// changed.
    swept: AtomicU64,
    idle: AtomicU32,
}

/// Service-level counters (`ratelimit.service.*`, `ratelimit_server.ShouldRateLimit.*`).
#[derive(Debug, Default)]
struct Service {
    redis_error: AtomicU64,
    service_error: AtomicU64,
    total_requests: AtomicU64,
    config_load_success: AtomicU64,
    config_load_error: AtomicU64,
    flushed: [AtomicU64; 5],
    /// Response times in whole milliseconds, as envoyproxy/ratelimit times them: per bucket
    /// (not cumulative), their sum and count.
    response_buckets: [AtomicU64; RESPONSE_TIME_BUCKETS.len()],
    response_ms_sum: AtomicU64,
    response_count: AtomicU64,
}

/// Every counter of envoyproxy/ratelimit's metrics, shared by every worker.
#[derive(Debug)]
pub struct ErlStats {
    shards: [RwLock<HashMap<Box<str>, KeyCounters>>; SHARDS],
    near_limit_ratio: f32,
    /// The response time histogram observes milliseconds rather than seconds (its name stays
    /// `_seconds`, as envoyproxy/ratelimit's `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` does).
    response_time_ms: bool,
    service: Service,
    /// Keys carrying request values held now, and how many may be.
    capped_keys: AtomicUsize,
    max_keys: usize,
    /// Set when the cap was first reached (and logged).
    overflowed: AtomicBool,
    /// What dropped keys counted, per Prometheus series that still has a key. Held through a
    /// whole render and a whole sweep, so a render sees a dropped key's counts exactly once.
    retired: Mutex<HashMap<Labels, [u64; 5]>>,
}

impl ErlStats {
    /// `max_keys`: how many keys carrying request values may be held at once.
    pub fn new(near_limit_ratio: f32, response_time_ms: bool, max_keys: usize) -> ErlStats {
        ErlStats {
            shards: std::array::from_fn(|_| RwLock::default()),
            near_limit_ratio,
            response_time_ms,
            service: Service::default(),
            capped_keys: AtomicUsize::new(0),
            max_keys,
            overflowed: AtomicBool::new(false),
            retired: Mutex::default(),
        }
    }

    /// Counts one descriptor's hits against its rule, as envoyproxy/ratelimit's limiter does:
    /// all hits in `total_hits`; those within the limit in `within_limit`, the part of them
    /// beyond the near-limit threshold also in `near_limit`; over the limit, the part beyond it
    /// in `over_limit` (and `shadow_mode` for a shadow rule), the part between the thresholds
    /// in `near_limit`. Nothing for no hits.
    pub fn count(&self, name: StatsName<'_>, hits: Hits) {
        let Hits {
            limit,
            before,
            hits,
            shadow,
        } = hits;
        if hits == 0 {
            return;
        }
        let after = before.saturating_add(hits);
        let near = near_threshold(limit, self.near_limit_ratio);
        let mut add = [0u64; 5];
        add[TOTAL_HITS] = hits;
        if after > limit {
            let over = if before >= limit { hits } else { after - limit };
            add[OVER_LIMIT] = over;
            if before < limit {
                add[NEAR_LIMIT] = limit - near.max(before);
            }
            if shadow {
                add[SHADOW_MODE] = over;
            }
        } else {
            add[WITHIN_LIMIT] = hits;
            if after > near {
                add[NEAR_LIMIT] = if before >= near { hits } else { after - near };
            }
        }
        self.with_key(name, |counters| {
            for (counter, n) in counters.counts.iter().zip(add) {
                if n > 0 {
                    counter.fetch_add(n, Ordering::Relaxed);
                }
            }
        });
    }

    /// Counts hits that reached no decision (the store failed): `total_hits` only, as
    /// envoyproxy/ratelimit counts them before it asks Redis.
    pub fn count_undecided(&self, name: StatsName<'_>, hits: u64) {
        if hits > 0 {
            self.with_key(name, |c| {
                c.counts[TOTAL_HITS].fetch_add(hits, Ordering::Relaxed);
            });
        }
    }

    /// A `ShouldRateLimit` call answered: one more request, and its time.
    pub fn request_served(&self, elapsed: std::time::Duration) {
        let service = &self.service;
        service.total_requests.fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        #[expect(
            clippy::cast_precision_loss,
            reason = "a response time in milliseconds is far below 2^52"
        )]
        let value = self.observed(ms as f64);
        if let Some(bucket) = RESPONSE_TIME_BUCKETS.iter().position(|&le| value <= le) {
            service.response_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        service.response_ms_sum.fetch_add(ms, Ordering::Relaxed);
        service.response_count.fetch_add(1, Ordering::Relaxed);
    }

    /// A call failed because the store did (`should_rate_limit.redis_error`).
    pub fn store_error(&self) {
        self.service.redis_error.fetch_add(1, Ordering::Relaxed);
    }

    /// A call was refused (`should_rate_limit.service_error`): a malformed request, or no
    /// configuration yet.
    pub fn service_error(&self) {
        self.service.service_error.fetch_add(1, Ordering::Relaxed);
    }

    /// The rules were loaded (`config_load_success`) or refused (`config_load_error`).
    pub fn config_loaded(&self, success: bool) {
        let counter = if success {
            &self.service.config_load_success
        } else {
            &self.service.config_load_error
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn with_key(&self, name: StatsName<'_>, count: impl Fn(&KeyCounters)) {
        if self.counted(name.key, &count) {
            return;
        }
        let Some(overflow) = name.overflow else {
            self.insert(name.key, false, &count);
            return;
        };
        if self.capped_keys.fetch_add(1, Ordering::Relaxed) < self.max_keys {
            self.insert(name.key, true, &count);
            return;
        }
        self.capped_keys.fetch_sub(1, Ordering::Relaxed);
        if !self.overflowed.swap(true, Ordering::Relaxed) {
            log::warn!(
                "envoyproxy/ratelimit's metrics hold {} stats keys carrying request values (its \
                 detailed_metric, value_to_metric, descriptor limits): new ones count in their \
                 rule's `.overflow` key until idle ones are dropped",
                self.max_keys
            );
        }
        if !self.counted(overflow, &count) {
            self.insert(overflow, false, &count);
        }
    }

    /// Counts into `key` if it exists.
    fn counted(&self, key: &str, count: &impl Fn(&KeyCounters)) -> bool {
        let shard = self.shards[shard_of(key)]
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        shard.get(key).map(count).is_some()
    }

    /// Counts into `key`, made now unless another worker made it meanwhile (a `capped` key
    /// then gives its place under the cap back).
    fn insert(&self, key: &str, capped: bool, count: &impl Fn(&KeyCounters)) {
        let mut map = self.shards[shard_of(key)]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(counters) = map.get(key) {
            if capped {
                self.capped_keys.fetch_sub(1, Ordering::Relaxed);
            }
            count(counters);
            return;
        }
        let counters = map.entry(key.into()).or_insert_with(|| KeyCounters {
            capped,
            ..KeyCounters::default()
        });
        count(counters);
    }

    /// Drops the keys carrying request values that counted nothing for [`IDLE_SWEEPS`] calls.
    /// The metrics duty calls it once per flush interval, after the statsd flush: a key idle
    /// for two sweeps or more had its last increase sent. A dropped key's counts are kept for
    /// its Prometheus series while another key of that series lives.
    pub fn sweep(&self) {
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        let mut dropped = 0;
        for shard in &self.shards {
            let idle: Vec<Box<str>> = shard
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter(|(_, counters)| counters.capped && counters.idle_for_long())
                .map(|(key, _)| key.clone())
                .collect();
            if idle.is_empty() {
                continue;
            }
            let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
            for key in idle {
                // One counted since it was looked at stays.
                let unchanged = map.get(&key).is_some_and(|c| {
                    c.counts[TOTAL_HITS].load(Ordering::Relaxed) == c.swept.load(Ordering::Relaxed)
                });
                if !unchanged {
                    continue;
                }
                let Some(counters) = map.remove(&key) else {
                    continue;
                };
                let sums = retired.entry(Labels::of(&key)).or_default();
                for (sum, counter) in sums.iter_mut().zip(&counters.counts) {
                    *sum = sum.saturating_add(counter.load(Ordering::Relaxed));
                }
                dropped += 1;
            }
        }
        if dropped == 0 {
            return;
        }
        self.capped_keys.fetch_sub(dropped, Ordering::Relaxed);
        // A series none of whose keys is left goes with its last key.
        let mut live = HashSet::new();
        for shard in &self.shards {
            let map = shard.read().unwrap_or_else(PoisonError::into_inner);
            live.extend(map.keys().map(|key| Labels::of(key)));
        }
        retired.retain(|labels, _| live.contains(labels));
    }

    /// How many stats keys are held (the ones the configuration spells, overflow keys and keys
    /// carrying request values).
    pub fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.read().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// A response time as the histogram observes it (seconds unless `response_time_ms`).
    fn observed(&self, ms: f64) -> f64 {
        if self.response_time_ms {
            ms
        } else {
            ms / 1000.0
        }
    }
}

impl KeyCounters {
    /// Notes this sweep: whether it counted nothing for [`IDLE_SWEEPS`] sweeps now.
    fn idle_for_long(&self) -> bool {
        let now = self.counts[TOTAL_HITS].load(Ordering::Relaxed);
        if self.swept.swap(now, Ordering::Relaxed) == now {
            self.idle.fetch_add(1, Ordering::Relaxed) + 1 >= IDLE_SWEEPS
        } else {
            self.idle.store(0, Ordering::Relaxed);
            false
        }
    }
}

/// The counter's threshold below which hits are not near the limit, computed in single
/// precision as envoyproxy/ratelimit computes it.
fn near_threshold(limit: u64, ratio: f32) -> u64 {
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "envoyproxy/ratelimit's own float32 arithmetic, floored; limits fit a u32"
    )]
    let near = (f64::from(limit as f32 * ratio)).floor() as u64;
    near
}

fn shard_of(key: &str) -> usize {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    usize::try_from(hasher.finish() % SHARDS as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests;
