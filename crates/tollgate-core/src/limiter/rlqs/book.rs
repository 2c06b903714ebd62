//! What one quota stream keeps of its buckets (the stream holds its `Book`; the type lives
//! behind the door, since it speaks the store's words): which are members of which of its shares, what
//! each was last sent, when each last reported requests. Time is a parameter (µs on the
//! limiter's clock), so the bookkeeping is tested without a stream or a store.
//!
//! Bounded whatever Envoy sends: ids of at most [`MAX_BUCKET_ID_BYTES`], at most
//! [`MAX_BUCKETS_PER_STREAM`] of them and [`MAX_TRACKED_BYTES`] in all, and
//! [`MAX_MEMBERS_PER_POOL`] in one pool; every stream of the instance together at most
//! [`MAX_INSTANCE_TRACKED_BYTES`] ([`TrackedBytes`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::store::rlqs::{Member, Sent};

/// The most buckets one stream tracks.
pub const MAX_BUCKETS_PER_STREAM: usize = 65_536;
/// The largest bucket id a stream tracks: its entries' keys and values, together.
pub const MAX_BUCKET_ID_BYTES: usize = 4096;
/// The most bytes one stream's tracked buckets and shares take (ids, pool keys, bookkeeping).
pub const MAX_TRACKED_BYTES: usize = 16 << 20;
/// The most bytes every stream of the instance tracks, together: many streams (8 per
/// connection, many connections) each within its own cap still added up without it.
pub const MAX_INSTANCE_TRACKED_BYTES: usize = 64 << 20;
/// The most buckets of one stream in one pool: the members of one share.
pub const MAX_MEMBERS_PER_POOL: usize = 1024;
/// What tracking one bucket or one share costs besides its bytes (counted against
/// [`MAX_TRACKED_BYTES`]).
const ENTRY_BYTES: usize = 96;

/// The bytes every stream of the instance tracks, together, and their cap: each stream's
/// [`Book`] takes what it tracks from it and gives it back when it forgets or ends.
#[derive(Debug)]
pub struct TrackedBytes {
    bytes: AtomicUsize,
    cap: usize,
}

impl Default for TrackedBytes {
    fn default() -> Self {
        TrackedBytes::with_cap(MAX_INSTANCE_TRACKED_BYTES)
    }
}

impl TrackedBytes {
    pub fn with_cap(cap: usize) -> TrackedBytes {
        TrackedBytes {
            bytes: AtomicUsize::new(0),
            cap,
        }
    }

    /// Bytes tracked now, by every stream.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if they fit under the cap.
    fn take(&self, bytes: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(bytes).filter(|total| *total <= self.cap)
            })
            .is_ok()
    }

    fn give(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A bucket id, spelled canonically: its entries sorted, each key and value length-prefixed.
pub type BucketKey = Arc<[u8]>;

/// One tracked bucket: a member of the stream's share of its pool.
struct Tracked {
    pool: Arc<str>,
    /// When it last reported requests (µs).
    used_at_us: u64,
    /// What it was last sent, on the store's clock.
    last: Sent,
    /// Whether this stream ever sent it a share.
    served: bool,
    bytes: usize,
}

/// The stream's share of one pool.
struct Holder {
    /// Its holder id in the pool: the stream's id and a counter.
    id: String,
    members: Vec<BucketKey>,
}

/// What tracking a reported bucket came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Tracking {
    /// A member of its pool's share: decided with the pool.
    Member(BucketKey),
    /// Idle for the abandonment time: forgotten, Envoy is told to forget it too.
    Abandoned,
    /// Past a cap: answered without a share.
    Untracked,
}

/// One stream's buckets and shares.
pub struct Book {
    /// Unique among the streams of every replica: the instance's random id and a counter.
    stream: String,
    buckets: HashMap<BucketKey, Tracked>,
    holders: HashMap<Arc<str>, Holder>,
    next_holder: u64,
    bytes: usize,
    /// The instance's: what this book tracks is taken from it.
    instance: Arc<TrackedBytes>,
}

impl Drop for Book {
    fn drop(&mut self) {
        self.instance.give(self.bytes);
    }
}

impl Book {
    pub fn new(stream: String, instance: Arc<TrackedBytes>) -> Book {
        Book {
            stream,
            buckets: HashMap::new(),
            holders: HashMap::new(),
            next_holder: 0,
            bytes: 0,
            instance,
        }
    }

    /// Buckets tracked.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Tracks a reported bucket of `pool` as a member of the stream's share of it, or says
    /// why not: idle for `abandon_after_us` (abandoned), or past a cap. A bucket a reload
    /// mapped to another pool joins that pool's share as a newcomer.
    pub fn track(
        &mut self,
        bucket: &HashMap<String, String>,
        pool: &Arc<str>,
        requests: u64,
        now_us: u64,
        abandon_after_us: u64,
    ) -> Tracking {
        let Some(key) = canonical(bucket) else {
            return Tracking::Untracked;
        };
        if let Some((known, tracked)) = self.buckets.get_key_value(&key[..]) {
            let idle = now_us.saturating_sub(tracked.used_at_us) >= abandon_after_us;
            if requests == 0 && idle {
                self.forget(&key);
                return Tracking::Abandoned;
            }
            if tracked.pool == *pool {
                let known = Arc::clone(known);
                if let Some(tracked) = self.buckets.get_mut(&key[..]) {
                    if requests > 0 {
                        tracked.used_at_us = now_us;
                    }
                }
                return Tracking::Member(known);
            }
            self.forget(&key);
        }
        let bytes = key.len() + ENTRY_BYTES;
        let holder_bytes = if self.holders.contains_key(pool) {
            0
        } else {
            pool.len() + ENTRY_BYTES
        };
        let members = self.holders.get(pool).map_or(0, |h| h.members.len());
        if self.buckets.len() >= MAX_BUCKETS_PER_STREAM
            || self.bytes + bytes + holder_bytes > MAX_TRACKED_BYTES
            || members >= MAX_MEMBERS_PER_POOL
            || !self.instance.take(bytes + holder_bytes)
        {
            return Tracking::Untracked;
        }
        let key: BucketKey = Arc::from(key);
        let stream = &self.stream;
        let next = &mut self.next_holder;
        let holder = self.holders.entry(Arc::clone(pool)).or_insert_with(|| {
            *next += 1;
            Holder {
                id: format!("{stream}.{:x}", *next - 1),
                members: Vec::new(),
            }
        });
        holder.members.push(Arc::clone(&key));
        self.bytes += bytes + holder_bytes;
        self.buckets.insert(
            Arc::clone(&key),
            Tracked {
                pool: Arc::clone(pool),
                used_at_us: now_us,
                last: Sent::default(),
                served: false,
                bytes,
            },
        );
        Tracking::Member(key)
    }

    /// Stops tracking a bucket; a share left without members is dropped (what it was sent
    /// counts in the store until it expires).
    fn forget(&mut self, key: &[u8]) {
        let Some(tracked) = self.buckets.remove(key) else {
            return;
        };
        let mut freed = tracked.bytes;
        if let Some(holder) = self.holders.get_mut(&tracked.pool) {
            holder.members.retain(|member| &member[..] != key);
            if holder.members.is_empty() {
                self.holders.remove(&tracked.pool);
                freed += tracked.pool.len() + ENTRY_BYTES;
            }
        }
        self.bytes -= freed;
        self.instance.give(freed);
    }

    /// The stream's holder id in `pool` (empty for a pool it holds no share of).
    /// Names the stream's holders after `region` (`<region>.<stream>.<n>`), for the metrics
    /// and peeks of a home; only before it holds anything, so a holder keeps its id.
    pub fn name_after(&mut self, region: &str) {
        if self.holders.is_empty() && !self.stream.starts_with(&format!("{region}.")) {
            self.stream = format!("{region}.{}", self.stream);
        }
    }

    pub fn holder(&self, pool: &str) -> String {
        self.holders
            .get(pool)
            .map(|h| h.id.clone())
            .unwrap_or_default()
    }

    /// Every member of the stream's share of `pool`: those in `reported` (with their
    /// requests, in that order), then the others, silent in this message.
    pub fn members(&self, pool: &str, reported: &[(BucketKey, u64)]) -> Vec<Member> {
        let last = |key: &[u8]| self.buckets.get(key).map(|t| t.last).unwrap_or_default();
        let mut members: Vec<Member> = reported
            .iter()
            .map(|(key, requests)| Member {
                reported: true,
                requests: *requests,
                last: last(key),
            })
            .collect();
        if let Some(holder) = self.holders.get(pool) {
            // The same allocations as the holder's members: compared by address.
            let reported: HashSet<*const u8> =
                reported.iter().map(|(key, _)| key.as_ptr()).collect();
            members.extend(
                holder
                    .members
                    .iter()
                    .filter(|key| !reported.contains(&key.as_ptr()))
                    .map(|key| Member {
                        reported: false,
                        requests: 0,
                        last: last(key),
                    }),
            );
        }
        members
    }

    /// Records what `key` was sent.
    pub fn sent(&mut self, key: &[u8], sent: Sent) {
        if let Some(tracked) = self.buckets.get_mut(key) {
            tracked.last = sent;
            tracked.served = true;
        }
    }

    /// Whether this stream ever sent `key` a share.
    pub fn served(&self, key: &[u8]) -> bool {
        self.buckets.get(key).is_some_and(|t| t.served)
    }
}

/// A bucket id's canonical bytes, or `None` when it is larger than [`MAX_BUCKET_ID_BYTES`].
fn canonical(bucket: &HashMap<String, String>) -> Option<Vec<u8>> {
    let size: usize = bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_BUCKET_ID_BYTES {
        return None;
    }
    let mut entries: Vec<(&String, &String)> = bucket.iter().collect();
    entries.sort();
    let mut bytes = Vec::with_capacity(size + 8 * entries.len());
    for (k, v) in entries {
        for text in [k, v] {
            // Both lengths fit: the whole id is at most MAX_BUCKET_ID_BYTES.
            let length = u32::try_from(text.len()).unwrap_or(u32::MAX);
            bytes.extend_from_slice(&length.to_le_bytes());
            bytes.extend_from_slice(text.as_bytes());
        }
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const S: u64 = 1_000_000;

    #[test]
    fn buckets_of_one_pool_are_members_of_one_holder() {
        let mut book = Book::new("s".into(), Arc::default());
        let pool: Arc<str> = Arc::from("pool");
        let a = book.track(&id(&[("t", "x"), ("r", "1")]), &pool, 1, 0, 300 * S);
        let b = book.track(&id(&[("r", "2"), ("t", "x")]), &pool, 1, 0, 300 * S);
        let (Tracking::Member(a), Tracking::Member(b)) = (a, b) else {
            panic!("both tracked");
        };
        assert_eq!(book.holder("pool"), "s.0");
        let members = book.members("pool", &[(Arc::clone(&b), 7)]);
        assert_eq!(members.len(), 2);
        assert!(members[0].reported && members[0].requests == 7);
        assert!(!members[1].reported, "a silent in this message");
        assert_eq!(book.members("pool", &[(a, 1), (b, 1)]).len(), 2);
    }

    #[test]
    fn the_same_id_in_another_order_is_the_same_bucket() {
        let mut book = Book::new("s".into(), Arc::default());
        let pool: Arc<str> = Arc::from("pool");
        book.track(&id(&[("a", "1"), ("b", "2")]), &pool, 1, 0, 300 * S);
        book.track(&id(&[("b", "2"), ("a", "1")]), &pool, 1, 0, 300 * S);
        assert_eq!(book.len(), 1);
    }

    #[test]
    fn an_idle_bucket_is_abandoned_and_a_busy_one_never() {
        let mut book = Book::new("s".into(), Arc::default());
        let pool: Arc<str> = Arc::from("pool");
        let idle = id(&[("t", "idle")]);
        let busy = id(&[("t", "busy")]);
        book.track(&idle, &pool, 1, 0, 10 * S);
        book.track(&busy, &pool, 1, 0, 10 * S);
        assert!(matches!(
            book.track(&idle, &pool, 0, 9 * S, 10 * S),
            Tracking::Member(_)
        ));
        assert!(matches!(
            book.track(&busy, &pool, 5, 10 * S, 10 * S),
            Tracking::Member(_)
        ));
        assert_eq!(
            book.track(&idle, &pool, 0, 10 * S, 10 * S),
            Tracking::Abandoned
        );
        assert!(matches!(
            book.track(&busy, &pool, 0, 19 * S, 10 * S),
            Tracking::Member(_)
        ));
        assert_eq!(book.len(), 1);
    }

    #[test]
    fn what_a_stream_keeps_is_capped() {
        let mut book = Book::new("s".into(), Arc::default());
        let pool: Arc<str> = Arc::from("pool");
        let big = "x".repeat(MAX_BUCKET_ID_BYTES);
        assert_eq!(
            book.track(&id(&[("k", &big)]), &pool, 1, 0, S),
            Tracking::Untracked
        );
        for i in 0..MAX_MEMBERS_PER_POOL {
            let tracked = book.track(&id(&[("r", &i.to_string())]), &pool, 1, 0, S);
            assert!(matches!(tracked, Tracking::Member(_)));
        }
        let past = book.track(&id(&[("r", "one more")]), &pool, 1, 0, S);
        assert_eq!(past, Tracking::Untracked);
        let other: Arc<str> = Arc::from("other");
        assert!(matches!(
            book.track(&id(&[("r", "one more")]), &other, 1, 0, S),
            Tracking::Member(_)
        ));
    }

    #[test]
    fn a_reload_moves_a_bucket_to_its_new_pool_as_a_newcomer() {
        let mut book = Book::new("s".into(), Arc::default());
        let old: Arc<str> = Arc::from("old");
        let new: Arc<str> = Arc::from("new");
        let bucket = id(&[("t", "x")]);
        let Tracking::Member(key) = book.track(&bucket, &old, 1, 0, S) else {
            panic!("tracked");
        };
        book.sent(
            &key,
            Sent {
                rate: 5,
                size: 5,
                until_us: 9 * S,
            },
        );
        assert!(book.served(&key));
        let Tracking::Member(moved) = book.track(&bucket, &new, 1, S, S * 100) else {
            panic!("tracked");
        };
        assert!(!book.served(&moved));
        assert_eq!(book.holder("old"), "", "the old share has no member left");
        assert_eq!(book.members("new", &[(moved, 1)])[0].last, Sent::default());
    }
}

#[cfg(test)]
mod instance_tests {
    use super::*;

    fn id(value: &str) -> HashMap<String, String> {
        HashMap::from([("t".to_string(), value.to_string())])
    }

    /// Streams share the instance's cap: one that filled it leaves none for the next, and
    /// gives it back as it forgets buckets or ends.
    #[test]
    fn streams_share_the_instances_cap() {
        let instance = Arc::new(TrackedBytes::with_cap(2_000));
        let pool: Arc<str> = Arc::from("pool");
        let mut a = Book::new("a".into(), Arc::clone(&instance));
        let mut tracked = 0;
        while matches!(
            a.track(&id(&format!("a{tracked}")), &pool, 1, 0, u64::MAX),
            Tracking::Member(_)
        ) {
            tracked += 1;
        }
        assert!(tracked > 5, "{tracked} tracked");
        assert!(instance.bytes() <= 2_000);
        let mut b = Book::new("b".into(), Arc::clone(&instance));
        assert_eq!(
            b.track(&id("b"), &pool, 1, 0, u64::MAX),
            Tracking::Untracked
        );
        drop(a);
        assert_eq!(instance.bytes(), 0);
        assert!(matches!(
            b.track(&id("b"), &pool, 1, 0, u64::MAX),
            Tracking::Member(_)
        ));
        // Abandoned, the bucket and its share are given back.
        assert_eq!(b.track(&id("b"), &pool, 0, 10, 1), Tracking::Abandoned);
        assert_eq!(instance.bytes(), 0);
    }
}
