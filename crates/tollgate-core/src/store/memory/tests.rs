use super::*;
use crate::base::clock::ManualClock;
use std::sync::Arc;

fn request(key: &str) -> BucketRequest {
    BucketRequest::bucket(key, 1.0, 2.0)
}

#[test]
fn memory_is_bounded_by_max_buckets() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(640, clock.clone());
    for i in 0..100_000 {
        store.decide_sync(&[request(&format!("k{i}"))]);
    }
    assert!(store.len() <= 640, "held {}", store.len());
}

#[test]
fn buckets_drained_at_the_same_moment_are_dropped_only_as_needed() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(640, clock);
    for i in 0..=640 {
        store.decide_sync(&[request(&format!("k{i}"))]);
    }
    // One past the cap: a 64th of the cap (10) goes, the newcomer stays.
    assert_eq!(store.len(), 631);
    assert_eq!(store.held.load(Ordering::Relaxed), 631);
}

#[test]
fn refilled_buckets_are_dropped_first() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(64, clock.clone());
    store.decide_sync(&[request("old")]);
    clock.advance_ms(10_000);
    for i in 0..1000 {
        store.decide_sync(&[request(&format!("k{i}"))]);
    }
    assert!(store.len() <= 64);
}

#[test]
fn a_single_bucket_drains_and_refills_like_the_script() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(1000, clock.clone());
    let one = [request("solo")];
    assert!(store.decide_sync(&one).allowed);
    assert_eq!(store.decide_sync(&one).buckets[0].tokens, 0.0);
    let denied = store.decide_sync(&one);
    assert!(!denied.allowed && !denied.buckets[0].enough);
    clock.advance_ms(1000);
    assert!(store.decide_sync(&one).allowed);
    assert!(!store.decide_sync(&one).allowed);
}

#[test]
fn a_peek_charges_nothing_and_a_reset_refills() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(1000, clock.clone());
    let one = [request("solo")];
    assert!(store.decide_sync(&one).allowed && store.decide_sync(&one).allowed);
    for _ in 0..3 {
        let peeked = store.peek_now(&one[0]);
        assert_eq!(peeked.tokens, 0.0);
        assert!(!peeked.enough);
    }
    assert!(store.reset_now("solo"));
    assert!(!store.reset_now("solo"));
    assert_eq!(store.held.load(Ordering::Relaxed), 0);
    assert_eq!(store.peek_now(&one[0]).tokens, one[0].burst);
    assert!(store.decide_sync(&one).allowed);
}

#[test]
fn buckets_in_different_shards_are_decided_together() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(1000, clock);
    let reqs: Vec<_> = (0..10).map(|i| request(&format!("multi{i}"))).collect();
    assert!(store.decide_sync(&reqs).allowed);
    assert!(store.decide_sync(&reqs).allowed);
    let third = store.decide_sync(&reqs);
    assert!(!third.allowed);
    assert!(third.buckets.iter().all(|b| !b.enough));
}
