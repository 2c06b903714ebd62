//! envoyproxy/ratelimit's metrics, for dashboards and alerts written against it (Envoy
//! Gateway's among them): per stats key (see `policy::descriptors::erl::StatsKey`) the
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
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};

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

    /// The Prometheus text exposition of every series, named and labelled as
    /// envoyproxy/ratelimit's built-in statsd mapping names them: a key's first segment is
    /// `domain`, the next `key1` and, if there is one, the one after `key2` (further segments
    /// add to the same series). A series appears once it counted something.
    pub fn render(&self) -> String {
        let retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        let mut series: BTreeMap<Labels, [u64; 5]> = retired
            .iter()
            .map(|(labels, sums)| (labels.clone(), *sums))
            .collect();
        for shard in &self.shards {
            for (key, counters) in shard.read().unwrap_or_else(PoisonError::into_inner).iter() {
                let sums = series.entry(Labels::of(key)).or_default();
                for (sum, counter) in sums.iter_mut().zip(&counters.counts) {
                    *sum = sum.saturating_add(counter.load(Ordering::Relaxed));
                }
            }
        }
        drop(retired);
        let mut out = String::new();
        for (i, stat) in STATS.iter().enumerate() {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            let mut header = false;
            for (labels, counts) in &series {
                if counts[i] == 0 {
                    continue;
                }
                if !header {
                    help(&mut out, &name, "counter", stat_help(i));
                    header = true;
                }
                let _ = writeln!(out, "{name}{{{}}} {}", labels.0, counts[i]);
            }
        }
        self.render_service(&mut out);
        out
    }

    fn render_service(&self, out: &mut String) {
        let service = &self.service;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let errors = [
            ("redis_error", load(&service.redis_error)),
            ("service_error", load(&service.service_error)),
        ];
        if errors.iter().any(|&(_, n)| n > 0) {
            let name = "ratelimit_service_should_rate_limit_error";
            help(
                out,
                name,
                "counter",
                "ShouldRateLimit calls that failed, by cause.",
            );
            for (kind, n) in errors.into_iter().filter(|&(_, n)| n > 0) {
                let _ = writeln!(out, "{name}{{err_type=\"{kind}\"}} {n}");
            }
        }
        let requests = load(&service.total_requests);
        if requests > 0 {
            let name = "ratelimit_service_total_requests";
            help(out, name, "counter", "gRPC calls served, by method.");
            let _ = writeln!(out, "{name}{{grpc_method=\"ShouldRateLimit\"}} {requests}");
            let name = "ratelimit_service_response_time_seconds";
            help(
                out,
                name,
                "histogram",
                "Time to answer a gRPC call, by method.",
            );
            let mut cumulative = 0;
            for (le, bucket) in RESPONSE_TIME_BUCKETS.iter().zip(&service.response_buckets) {
                cumulative += load(bucket);
                let _ = writeln!(
                    out,
                    "{name}_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{le}\"}} {cumulative}"
                );
            }
            let count = load(&service.response_count);
            #[expect(
                clippy::cast_precision_loss,
                reason = "a sum of milliseconds shown as a float, as Prometheus holds it"
            )]
            let sum = self.observed(load(&service.response_ms_sum) as f64);
            let _ = writeln!(
                out,
                "{name}_bucket{{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(out, "{name}_sum{{grpc_method=\"ShouldRateLimit\"}} {sum}");
            let _ = writeln!(
                out,
                "{name}_count{{grpc_method=\"ShouldRateLimit\"}} {count}"
            );
        }
        for (name, counter, what) in [
            (
                "ratelimit_service_config_load_success",
                &service.config_load_success,
                "Rule sets loaded.",
            ),
            (
                "ratelimit_service_config_load_error",
                &service.config_load_error,
                "Rule sets refused.",
            ),
        ] {
            let n = load(counter);
            if n > 0 {
                help(out, name, "counter", what);
                let _ = writeln!(out, "{name} {n}");
            }
        }
    }

    /// What increased since the last call, as statsd counter lines (`name:N|c`) under
    /// envoyproxy/ratelimit's stat names; each line is handed to `line` without its newline.
    /// Only one flush may run at a time (the statsd duty's loop).
    pub fn statsd_lines(&self, mut line: impl FnMut(&str)) {
        let mut text = String::new();
        let delta = |counter: &AtomicU64, flushed: &AtomicU64| {
            let now = counter.load(Ordering::Relaxed);
            let before = flushed.swap(now, Ordering::Relaxed);
            now.saturating_sub(before)
        };
        for shard in &self.shards {
            // Held for reading only: a key counted for the first time meanwhile waits.
            let map = shard.read().unwrap_or_else(PoisonError::into_inner);
            for (key, counters) in map.iter() {
                for (i, stat) in STATS.iter().enumerate() {
                    let n = delta(&counters.counts[i], &counters.flushed[i]);
                    if n > 0 {
                        text.clear();
                        let _ = write!(text, "ratelimit.service.rate_limit.{key}.{stat}:{n}|c");
                        line(&text);
                    }
                }
            }
        }
        let service = &self.service;
        let counters = [
            (
                "ratelimit.service.call.should_rate_limit.redis_error",
                &service.redis_error,
            ),
            (
                "ratelimit.service.call.should_rate_limit.service_error",
                &service.service_error,
            ),
            (
                "ratelimit_server.ShouldRateLimit.total_requests",
                &service.total_requests,
            ),
            (
                "ratelimit.service.config_load_success",
                &service.config_load_success,
            ),
            (
                "ratelimit.service.config_load_error",
                &service.config_load_error,
            ),
        ];
        for ((name, counter), flushed) in counters.into_iter().zip(&service.flushed) {
            let n = delta(counter, flushed);
            if n > 0 {
                text.clear();
                let _ = write!(text, "{name}:{n}|c");
                line(&text);
            }
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

fn help(out: &mut String, name: &str, kind: &str, what: &str) {
    let _ = writeln!(out, "# HELP {name} {what}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn stat_help(stat: usize) -> &'static str {
    match stat {
        TOTAL_HITS => "Hits of the rule (envoyproxy/ratelimit's stats key in the labels).",
        OVER_LIMIT => "Hits over the rule's limit.",
        NEAR_LIMIT => "Hits beyond the near-limit ratio of the rule's limit.",
        WITHIN_LIMIT => "Hits within the rule's limit.",
        _ => "Hits over the limit of a rule in shadow mode.",
    }
}

/// The labels of a stats key's series, rendered `domain="…",key1="…"[,key2="…"]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Labels(String);

impl Labels {
    fn of(key: &str) -> Labels {
        let mut segments = key.splitn(4, '.');
        let mut text = String::new();
        for (name, value) in ["domain", "key1", "key2"].iter().zip(&mut segments) {
            if !text.is_empty() {
                text.push(',');
            }
            let _ = write!(text, "{name}=\"");
            escape(&mut text, value);
            text.push('"');
        }
        Labels(text)
    }
}

/// A label value in the exposition format: backslash, double quote and newline escaped.
fn escape(into: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => into.push_str("\\\\"),
            '"' => into.push_str("\\\""),
            '\n' => into.push_str("\\n"),
            c => into.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::erl_metrics::{MAX_KEYS, NEAR_LIMIT_RATIO};

    fn counts(stats: &ErlStats, key: &str) -> [u64; 5] {
        let shard = stats.shards[shard_of(key)].read().unwrap();
        let counters = shard.get(key).expect("the key counted");
        std::array::from_fn(|i| counters.counts[i].load(Ordering::Relaxed))
    }

    fn hits(limit: u64, before: u64, hits: u64) -> Hits {
        Hits {
            limit,
            before,
            hits,
            shadow: false,
        }
    }

    /// envoyproxy/ratelimit test/limiter/base_limiter_test.go and its Redis cache tests: a
    /// limit of 10 (near threshold 8) hit one at a time, then with an addend across both
    /// thresholds.
    #[test]
    fn hits_are_counted_as_envoyproxy_ratelimit_counts_them() {
        let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, MAX_KEYS);
        for before in 0..12 {
            stats.count(StatsName::fixed("d.k"), hits(10, before, 1));
        }
        // [total, over, near, within, shadow]: 8 plain, 2 near (9th, 10th), 2 over.
        assert_eq!(counts(&stats, "d.k"), [12, 2, 2, 10, 0]);

        // From 7, 5 more: 2 over (the 11th, 12th), the 2 between 8 and 10 near; the 8th is
        // neither, as there.
        stats.count(StatsName::fixed("d.jump"), hits(10, 7, 5));
        assert_eq!(counts(&stats, "d.jump"), [5, 2, 2, 0, 0]);
        // From 6, 3 more: within, 1 of them (the 9th) beyond the near threshold.
        stats.count(StatsName::fixed("d.near"), hits(10, 6, 3));
        assert_eq!(counts(&stats, "d.near"), [3, 0, 1, 3, 0]);
        // A shadow rule over its limit counts shadow_mode as much as over_limit.
        stats.count(
            StatsName::fixed("d.shadow"),
            Hits {
                shadow: true,
                ..hits(1, 1, 4)
            },
        );
        assert_eq!(counts(&stats, "d.shadow"), [4, 4, 0, 0, 4]);
        // requests_per_unit 0: every hit over.
        stats.count(StatsName::fixed("d.zero"), hits(0, 0, 2));
        assert_eq!(counts(&stats, "d.zero"), [2, 2, 0, 0, 0]);
        // No hits, no series.
        stats.count(StatsName::fixed("d.none"), hits(10, 0, 0));
        assert!(!stats.render().contains("d.none"));
    }

    #[test]
    fn series_are_named_and_labelled_as_the_built_in_mapping_does() {
        let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, MAX_KEYS);
        stats.count(StatsName::fixed("edge.path"), hits(1, 1, 1));
        stats.count(
            StatsName::fixed("edge.rule.masked_remote_address_0_0_0_0/0"),
            hits(1, 1, 2),
        );
        stats.count(
            StatsName::fixed("edge.rule.masked_remote_address_0_0_0_0/0.deeper"),
            hits(1, 1, 3),
        );
        stats.count(StatsName::fixed("edge.q\"uote"), hits(5, 0, 1));
        stats.request_served(std::time::Duration::from_millis(30));
        stats.service_error();
        stats.config_loaded(true);
        let text = stats.render();
        for line in [
            "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"path\"} 1",
            // Segments past key2 add to key2's series.
            "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"rule\",\
             key2=\"masked_remote_address_0_0_0_0/0\"} 5",
            "ratelimit_service_rate_limit_within_limit{domain=\"edge\",key1=\"q\\\"uote\"} 1",
            "ratelimit_service_should_rate_limit_error{err_type=\"service_error\"} 1",
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 1",
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",\
             le=\"0.025\"} 0",
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",\
             le=\"0.05\"} 1",
            "ratelimit_service_response_time_seconds_sum{grpc_method=\"ShouldRateLimit\"} 0.03",
            "ratelimit_service_config_load_success 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(!text.contains("redis_error"), "{text}");
        assert!(!text.contains("config_load_error"), "{text}");
    }

    #[test]
    fn statsd_lines_carry_the_increase_since_the_last_flush() {
        let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, MAX_KEYS);
        stats.count(StatsName::fixed("d.k_v"), hits(2, 0, 1));
        stats.store_error();
        let flush = || {
            let mut lines = Vec::new();
            stats.statsd_lines(|l| lines.push(l.to_string()));
            lines.sort();
            lines
        };
        assert_eq!(
            flush(),
            [
                "ratelimit.service.call.should_rate_limit.redis_error:1|c",
                "ratelimit.service.rate_limit.d.k_v.total_hits:1|c",
                "ratelimit.service.rate_limit.d.k_v.within_limit:1|c",
            ]
        );
        assert!(flush().is_empty());
        stats.count(StatsName::fixed("d.k_v"), hits(2, 1, 2));
        assert_eq!(
            flush(),
            [
                "ratelimit.service.rate_limit.d.k_v.near_limit:1|c",
                "ratelimit.service.rate_limit.d.k_v.over_limit:1|c",
                "ratelimit.service.rate_limit.d.k_v.total_hits:2|c",
            ]
        );
    }

    fn render_sample(stats: &ErlStats, stat: &str, labels: &str) -> Option<u64> {
        let prefix = format!("ratelimit_service_rate_limit_{stat}{{{labels}}} ");
        stats
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
    }

    #[test]
    fn keys_carrying_request_values_are_capped_and_overflow_into_their_rule() {
        let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, 3);
        for user in ["a", "b", "c", "d", "e"] {
            let key = format!("d.user_{user}");
            stats.count(
                StatsName::from_request(&key, "d.user.overflow"),
                hits(10, 0, 1),
            );
        }
        // The first three have keys of their own; the others count in the rule's overflow.
        assert_eq!(counts(&stats, "d.user_c"), [1, 0, 0, 1, 0]);
        assert_eq!(counts(&stats, "d.user.overflow"), [2, 0, 0, 2, 0]);
        assert!(!stats.render().contains("user_d"));
        // A key already held still counts; a key the configuration spells is never capped.
        stats.count(
            StatsName::from_request("d.user_a", "d.user.overflow"),
            hits(10, 1, 1),
        );
        assert_eq!(counts(&stats, "d.user_a"), [2, 0, 0, 2, 0]);
        stats.count(StatsName::fixed("d.plain"), hits(10, 0, 1));
        assert_eq!(counts(&stats, "d.plain"), [1, 0, 0, 1, 0]);
        assert_eq!(stats.keys(), 5);
        assert_eq!(
            render_sample(
                &stats,
                "total_hits",
                "domain=\"d\",key1=\"user\",key2=\"overflow\""
            ),
            Some(2)
        );
    }

    /// A key idle for IDLE_SWEEPS sweeps goes; its counts stay in its series while another
    /// key of the series lives (the series never goes down), and go with the last one. Its
    /// place under the cap is free again, and statsd sees one increase per hit throughout.
    #[test]
    fn idle_keys_are_dropped_and_their_series_never_go_down() {
        let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, 2);
        let name = |key| StatsName::from_request(key, "d.r.s.overflow");
        let mut sent: HashMap<String, u64> = HashMap::new();
        let mut flush = |stats: &ErlStats| {
            stats.statsd_lines(|line| {
                let (key, n) = line.rsplit_once(':').unwrap();
                *sent.entry(key.to_string()).or_default() +=
                    n.strip_suffix("|c").unwrap().parse::<u64>().unwrap();
            });
        };
        // Two keys of one series (segments past key2 add to it).
        let series = "domain=\"d\",key1=\"r\",key2=\"s\"";
        stats.count(name("d.r.s.one"), hits(10, 0, 3));
        stats.count(name("d.r.s.two"), hits(10, 0, 2));
        assert_eq!(render_sample(&stats, "total_hits", series), Some(5));
        let mut last = 5;
        for _ in 0..=IDLE_SWEEPS {
            stats.count(name("d.r.s.two"), hits(10, 0, 1));
            flush(&stats);
            stats.sweep();
            let now = render_sample(&stats, "total_hits", series).unwrap();
            assert_eq!(now, last + 1, "the series went down or skipped");
            last = now;
        }
        assert_eq!(stats.keys(), 1, "d.r.s.one was dropped");
        // Its place is free: a new key has its own counters, not the overflow's.
        stats.count(name("d.r.s.three"), hits(10, 0, 1));
        assert_eq!(counts(&stats, "d.r.s.three"), [1, 0, 0, 1, 0]);
        assert_eq!(render_sample(&stats, "total_hits", series), Some(last + 1));
        // All idle: the series goes with its last key.
        for _ in 0..=IDLE_SWEEPS {
            flush(&stats);
            stats.sweep();
        }
        assert_eq!(stats.keys(), 0);
        assert_eq!(render_sample(&stats, "total_hits", series), None);
        assert!(stats.retired.lock().unwrap().is_empty());
        // Back: from 0, as after a restart; statsd saw every hit once.
        stats.count(name("d.r.s.one"), hits(10, 0, 1));
        flush(&stats);
        assert_eq!(render_sample(&stats, "total_hits", series), Some(1));
        let total = |key: &str| sent[&format!("ratelimit.service.rate_limit.{key}.total_hits")];
        assert_eq!(total("d.r.s.one"), 4);
        assert_eq!(total("d.r.s.two"), 2 + u64::from(IDLE_SWEEPS) + 1);
        assert_eq!(total("d.r.s.three"), 1);
    }

    /// Keys the configuration spells stay however long they are idle.
    #[test]
    fn keys_the_configuration_spells_are_never_dropped() {
        let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, MAX_KEYS);
        stats.count(StatsName::fixed("d.k"), hits(10, 0, 1));
        for _ in 0..=IDLE_SWEEPS * 2 {
            stats.sweep();
        }
        assert_eq!(counts(&stats, "d.k"), [1, 0, 0, 1, 0]);
    }
}
