//! Runtime overrides: per-key policies an operator sets through the admin API
//! (`PUT /v1/overrides/{limit}?key=...`), held in the store and in force on every instance
//! within a second. They beat the overrides of the config file, and a reload of the file keeps
//! them (the [`Limiter`](crate::limiter::Limiter) hands them to each new policy).
//!
//! Every instance holds the overrides it knows in a [`Table`] behind an atomic pointer: a check
//! looks up its key tail there without a lock or a store call. [`sync`] keeps the table in step
//! with Redis (a version per limit, polled a few times a second) or, on the memory store,
//! writes it directly.
//!
//! An entry's numbers are kept as the operator gave them: what is left out (a rate, a burst)
//! is the limit's own at each check, as for the file's overrides. Its expiry is absolute, in
//! milliseconds of the store's clock; each instance tracks the offset of that clock from its
//! own, so all of them drop an entry at the same moment.

pub mod sync;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use prometheus::IntGaugeVec;
use serde::{Deserialize, Serialize};

use crate::base::clock::{Clock, MonotonicClock};
use crate::base::rate::count_f64;
use crate::config::{MAX_BURST, MAX_REFILL_SECS};
use crate::policy::overrides::Override;

/// Most runtime overrides one limit may hold: each change reloads the limit's entries on every
/// instance, so they are meant for a few customers at a time, not as a database.
pub const MAX_PER_LIMIT: usize = 10_000;

/// Longest `ttl_s`: ten years, as for a bucket's refill.
pub const MAX_TTL_S: u64 = 10 * 365 * 86_400;

/// One key's runtime override, as stored (compact JSON, one letter per field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// When it stops applying, in ms of the store's clock; none: until deleted.
    #[serde(rename = "x", default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// The key values as the operator gave them, one per key part (for listing).
    #[serde(rename = "k")]
    pub key: Vec<String>,
    /// Tokens per second; none: the limit's own.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// A quota limit's quota for this key.
    #[serde(rename = "q", default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
    #[serde(rename = "u", default, skip_serializing_if = "std::ops::Not::not")]
    pub unlimited: bool,
}

/// A limit's own numbers, which an entry keeps for what it leaves out. Passed by value so
/// this table needs nothing from the limit that holds it.
#[derive(Debug, Clone, Copy)]
pub struct Own {
    pub rate: f64,
    pub burst: u64,
    /// How far below 0 reports may drive a key (`max_debt`, or 0): an entry's bucket must
    /// refill it within what the store can express.
    pub debt: u64,
    /// The limit is a quota: its entries set `quota`, never `rate` or `burst`.
    pub quota: bool,
}

impl Entry {
    /// The policy this entry gives a key of a limit with numbers `own`. None when the entry
    /// no longer fits the limit (a reload turned a bucket into a quota or back, or gave it a
    /// `max_debt` the entry's rate cannot refill in time), or holds numbers the store cannot
    /// carry (written by an older release that checked less): the file's policy applies then.
    pub fn applied(&self, own: Own) -> Option<Override> {
        if self.unlimited {
            return Some(Override::Unlimited);
        }
        let (rate, burst) = match (own.quota, self.quota) {
            (true, Some(quota)) => (own.rate, quota),
            (false, None) => (
                self.rate.unwrap_or(own.rate),
                self.burst.unwrap_or(own.burst),
            ),
            _ => return None,
        };
        storable(rate, burst, own).then_some(Override::Bucket { rate, burst })
    }

    fn expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms
            .is_some_and(|at| i64::try_from(at).unwrap_or(i64::MAX) <= now_ms)
    }
}

/// Whether the store can carry a key of these numbers: a burst (or quota) of 1 to
/// [`MAX_BURST`], and a bucket that refills its burst and its limit's debt within
/// [`MAX_REFILL_SECS`]. What a `PUT` checks; checked again on every use of a stored entry.
fn storable(rate: f64, burst: u64, own: Own) -> bool {
    if !(1..=MAX_BURST).contains(&burst) {
        return false;
    }
    own.quota
        || (rate.is_finite()
            && rate > 0.0
            && count_f64(burst.saturating_add(own.debt).min(2 * MAX_BURST)) / rate
                <= MAX_REFILL_SECS)
}

/// A limit's name, the version its entries were read at, and its unexpired entries (key
/// tail, entry), to write back into a store.
pub type Snapshot = (String, i64, Vec<(Box<[u8]>, Entry)>);

/// One limit's runtime overrides and the store version they were read at.
#[derive(Debug, Default, Clone)]
pub struct LimitEntries {
    pub version: i64,
    pub entries: HashMap<Box<[u8]>, Entry>,
}

/// Every limit's runtime overrides, by limit name. Replaced whole on every change (each
/// limit's entries are shared between versions of the table, so a change copies one limit).
#[derive(Debug, Default)]
pub struct Table {
    limits: HashMap<String, Arc<LimitEntries>>,
}

impl Table {
    fn entries(&self, limit: &str) -> Option<&LimitEntries> {
        self.limits.get(limit).map(Arc::as_ref)
    }
}

/// The runtime overrides this instance knows, and the store's clock.
pub struct RuntimeOverrides {
    table: ArcSwap<Table>,
    clock: Arc<dyn Clock>,
    /// The store's time (ms) minus `clock`'s, learnt from every store answer.
    offset_ms: AtomicI64,
    gauge: Option<IntGaugeVec>,
    /// The store's epoch as last seen (0: none yet); a new one means it lost its data.
    epoch: AtomicI64,
}

impl RuntimeOverrides {
    /// Empty, on the monotonic clock, with the wall clock as the store's until a store answers;
    /// `gauge` (`tollgate_runtime_overrides`) counts entries per limit.
    pub fn new(gauge: Option<IntGaugeVec>) -> RuntimeOverrides {
        RuntimeOverrides::with_clock(Arc::new(MonotonicClock::default()), gauge)
    }

    pub fn with_clock(clock: Arc<dyn Clock>, gauge: Option<IntGaugeVec>) -> RuntimeOverrides {
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let overrides = RuntimeOverrides {
            table: ArcSwap::from_pointee(Table::default()),
            clock,
            offset_ms: AtomicI64::new(0),
            gauge,
            epoch: AtomicI64::new(0),
        };
        overrides.learn_store_time(wall_ms);
        overrides
    }

    /// What checks read: one atomic load, no lock.
    pub fn view(&self) -> View<'_> {
        View {
            table: self.table.load(),
            overrides: self,
        }
    }

    /// Now on the store's clock, as far as this instance can tell.
    pub fn now_ms(&self) -> i64 {
        self.local_ms() + self.offset_ms.load(Ordering::Relaxed)
    }

    fn local_ms(&self) -> i64 {
        i64::try_from(self.clock.now_us() / 1000).unwrap_or(i64::MAX)
    }

    /// Records the store's time as just read from it.
    pub fn learn_store_time(&self, store_ms: i64) {
        self.offset_ms
            .store(store_ms - self.local_ms(), Ordering::Relaxed);
    }

    /// The store's epoch this instance last saw (0: none yet).
    pub fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Records the store's epoch, once what a new one asks for is done.
    pub fn learn_epoch(&self, epoch: i64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The version of `limit`'s entries this instance holds (0: none ever).
    pub fn version(&self, limit: &str) -> i64 {
        self.table.load().entries(limit).map_or(0, |e| e.version)
    }

    /// Whether `limit` holds an entry whose expiry has passed (the store should drop it).
    pub fn has_expired(&self, limit: &str) -> bool {
        let now = self.now_ms();
        self.table
            .load()
            .entries(limit)
            .is_some_and(|e| e.entries.values().any(|entry| entry.expired(now)))
    }

    /// Names of the limits holding entries, with their versions.
    pub fn known(&self) -> Vec<(String, i64)> {
        self.table
            .load()
            .limits
            .iter()
            .map(|(name, entries)| (name.clone(), entries.version))
            .collect()
    }

    /// Every limit's version and unexpired entries (none, when a deletion emptied it), to
    /// write back into a store that lost them.
    pub fn snapshot(&self) -> Vec<Snapshot> {
        let now = self.now_ms();
        self.table
            .load()
            .limits
            .iter()
            .map(|(name, limit)| {
                let live = limit
                    .entries
                    .iter()
                    .filter(|(_, entry)| !entry.expired(now))
                    .map(|(tail, entry)| (tail.clone(), entry.clone()))
                    .collect::<Vec<_>>();
                (name.clone(), limit.version, live)
            })
            .collect()
    }

    /// `limit`'s unexpired entries, sorted by their key values.
    pub fn list(&self, limit: &str) -> Vec<Entry> {
        let now = self.now_ms();
        let table = self.table.load();
        let mut listed: Vec<Entry> = table
            .entries(limit)
            .map(|e| {
                e.entries
                    .values()
                    .filter(|entry| !entry.expired(now))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        listed
    }

    /// Installs `limit`'s entries as read from the store at `version`, expired ones left out.
    pub fn replace(&self, limit: &str, mut entries: LimitEntries) {
        let now = self.now_ms();
        entries.entries.retain(|_, e| !e.expired(now));
        self.change(limit, |current| *current = entries.clone());
    }

    /// Brings `limit`'s entries to the store's `version` with what changed since the version
    /// held: an entry set, or removed (`None`). Expired entries go on the way.
    pub fn apply(
        &self,
        limit: &str,
        version: i64,
        changes: impl IntoIterator<Item = (Box<[u8]>, Option<Entry>)>,
    ) {
        let now = self.now_ms();
        let changes: Vec<_> = changes.into_iter().collect();
        self.change(limit, |current| {
            for (tail, entry) in &changes {
                match entry {
                    Some(entry) => current.entries.insert(tail.clone(), entry.clone()),
                    None => current.entries.remove(tail),
                };
            }
            current.entries.retain(|_, e| !e.expired(now));
            current.version = version;
        });
    }

    /// Sets one entry (memory store: the table is the store). Expired entries are dropped on
    /// the way; fails with the count when the limit is full.
    pub fn insert(&self, limit: &str, tail: Box<[u8]>, entry: Entry) -> Result<(), usize> {
        let now = self.now_ms();
        let current = self
            .table
            .load()
            .entries(limit)
            .cloned()
            .unwrap_or_default();
        let live = current.entries.values().filter(|e| !e.expired(now)).count();
        if !current.entries.contains_key(&tail) && live >= MAX_PER_LIMIT {
            return Err(live);
        }
        self.change(limit, |entries| {
            entries.entries.retain(|_, e| !e.expired(now));
            entries.entries.insert(tail.clone(), entry.clone());
            entries.version += 1;
        });
        Ok(())
    }

    /// Removes one entry (memory store); whether there was one in force.
    pub fn remove(&self, limit: &str, tail: &[u8]) -> bool {
        let now = self.now_ms();
        let mut removed = false;
        self.change(limit, |entries| {
            removed = entries
                .entries
                .remove(tail)
                .is_some_and(|entry| !entry.expired(now));
            entries.entries.retain(|_, e| !e.expired(now));
            entries.version += 1;
        });
        removed
    }

    /// Swaps in a table where `limit`'s entries went through `edit`; other limits are shared.
    fn change(&self, limit: &str, mut edit: impl FnMut(&mut LimitEntries)) {
        let mut count = 0;
        self.table.rcu(|table| {
            let mut limits = table.limits.clone();
            let mut entries = limits
                .get(limit)
                .map(|e| LimitEntries::clone(e))
                .unwrap_or_default();
            edit(&mut entries);
            count = entries.entries.len();
            if entries.entries.is_empty() && entries.version == 0 {
                limits.remove(limit);
            } else {
                limits.insert(limit.to_string(), Arc::new(entries));
            }
            Table { limits }
        });
        if let Some(gauge) = &self.gauge {
            gauge
                .with_label_values(&[limit])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}

/// The table as one check sees it.
pub struct View<'a> {
    table: Guard<Arc<Table>>,
    overrides: &'a RuntimeOverrides,
}

impl View<'_> {
    /// The runtime override of the limit `name` (numbers `own`) for the key tail `tail`, if
    /// one is in force.
    pub fn get(&self, name: &str, own: Own, tail: &[u8]) -> Option<Override> {
        if self.table.limits.is_empty() {
            return None;
        }
        let entry = self.table.entries(name)?.entries.get(tail)?;
        if entry.expired(self.overrides.now_ms()) {
            return None;
        }
        entry.applied(own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::ManualClock;

    const BUCKET: Own = Own {
        rate: 10.0,
        burst: 20,
        debt: 0,
        quota: false,
    };

    fn entry(burst: Option<u64>, expires_at_ms: Option<u64>) -> Entry {
        Entry {
            expires_at_ms,
            key: vec!["acme".into()],
            rate: None,
            burst,
            quota: None,
            unlimited: false,
        }
    }

    #[test]
    fn a_stored_entry_the_store_cannot_carry_applies_nothing() {
        let mut slow = entry(Some(1), None);
        slow.rate = Some(1e-7);
        assert!(slow.applied(BUCKET).is_some(), "1e7 s to refill its burst");
        let reported = Own {
            debt: 1_000_000_000,
            ..BUCKET
        };
        assert_eq!(slow.applied(reported), None, "1e16 s to refill its debt");
        assert_eq!(entry(Some(0), None).applied(BUCKET), None);
        assert_eq!(entry(Some(2_000_000_000), None).applied(BUCKET), None);
    }

    fn on_manual_clock() -> (Arc<ManualClock>, RuntimeOverrides) {
        let clock = Arc::new(ManualClock::default());
        let overrides = RuntimeOverrides::with_clock(clock.clone(), None);
        overrides.learn_store_time(1_000_000);
        (clock, overrides)
    }

    #[test]
    fn an_entry_keeps_the_limits_own_numbers_for_what_it_leaves_out() {
        assert_eq!(
            entry(Some(500), None).applied(BUCKET),
            Some(Override::Bucket {
                rate: 10.0,
                burst: 500
            })
        );
        let quota = Entry {
            quota: Some(5),
            burst: None,
            ..entry(None, None)
        };
        assert_eq!(quota.applied(BUCKET), None, "a quota entry on a bucket");
    }

    #[test]
    fn an_entry_stops_applying_when_the_store_clock_passes_its_expiry() {
        let (clock, overrides) = on_manual_clock();
        overrides
            .insert(
                "l",
                b"acme".to_vec().into(),
                entry(Some(500), Some(1_002_000)),
            )
            .unwrap();
        assert!(overrides.view().get("l", BUCKET, b"acme").is_some());
        assert!(!overrides.has_expired("l"));
        clock.advance_ms(1_999);
        assert!(overrides.view().get("l", BUCKET, b"acme").is_some());
        clock.advance_ms(1);
        assert_eq!(overrides.view().get("l", BUCKET, b"acme"), None);
        assert!(overrides.has_expired("l"));
        assert!(overrides.list("l").is_empty());
    }

    #[test]
    fn the_store_clock_is_followed_not_the_local_one() {
        let (_clock, overrides) = on_manual_clock();
        overrides
            .insert(
                "l",
                b"acme".to_vec().into(),
                entry(Some(500), Some(1_002_000)),
            )
            .unwrap();
        // The store's clock is found to be 5 s ahead: the entry has expired there.
        overrides.learn_store_time(1_005_000);
        assert_eq!(overrides.view().get("l", BUCKET, b"acme"), None);
    }

    #[test]
    fn insert_and_remove_bump_the_version_and_drop_expired_entries() {
        let (clock, overrides) = on_manual_clock();
        overrides
            .insert("l", b"old".to_vec().into(), entry(Some(5), Some(1_000_500)))
            .unwrap();
        overrides
            .insert("l", b"acme".to_vec().into(), entry(Some(6), None))
            .unwrap();
        assert_eq!(overrides.version("l"), 2);
        clock.advance_ms(600);
        assert!(!overrides.remove("l", b"old"), "expired: not in force");
        assert!(overrides.remove("l", b"acme"));
        assert_eq!(overrides.version("l"), 4);
        // Held empty, at its version: a write-back after a store lost its data carries the
        // deletion too.
        let held = overrides.snapshot();
        assert!(
            matches!(held.as_slice(), [(name, 4, entries)] if name == "l" && entries.is_empty())
        );
    }

    #[test]
    fn changes_set_and_remove_entries_and_take_the_store_version() {
        let (clock, overrides) = on_manual_clock();
        let tail = |t: &str| t.as_bytes().to_vec().into_boxed_slice();
        overrides.replace(
            "l",
            LimitEntries {
                version: 7,
                entries: [
                    (tail("kept"), entry(Some(5), None)),
                    (tail("gone"), entry(Some(6), None)),
                    (tail("brief"), entry(Some(7), Some(1_000_500))),
                ]
                .into(),
            },
        );
        clock.advance_ms(600);
        overrides.apply(
            "l",
            9,
            [
                (tail("gone"), None),
                (tail("new"), Some(entry(Some(8), None))),
            ],
        );
        assert_eq!(overrides.version("l"), 9);
        // Every entry here has the same key values, so the list's order among them is not
        // defined: compare them sorted.
        let mut bursts: Vec<_> = overrides.list("l").iter().map(|e| e.burst).collect();
        bursts.sort_unstable();
        assert_eq!(bursts, [Some(5), Some(8)], "kept and new; gone removed");
        assert!(
            !overrides.has_expired("l"),
            "the expired entry went on the way"
        );
    }

    #[test]
    fn a_stored_entry_is_compact_json() {
        let text = serde_json::to_string(&entry(Some(200), None)).unwrap();
        assert_eq!(text, r#"{"k":["acme"],"b":200}"#);
        let back: Entry = serde_json::from_str(r#"{"x":5,"k":["acme"],"u":true}"#).unwrap();
        assert!(back.unlimited);
        assert_eq!(back.expires_at_ms, Some(5));
    }
}
