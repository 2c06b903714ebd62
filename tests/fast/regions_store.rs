//! A global limit's key in a region, on both stores (`lua/global.lua` and its twin
//! `kinds::global`): decided against the floor and the home's share, refilled piecewise
//! around the share's end, and never given tokens by a share change.

use tollgate_core::kinds::global::Global;
use tollgate_core::kinds::{BucketRequest, Meter};

use crate::support::stores::{every_store, StoreUnderTest};

/// A global limit of `rate`/s, burst `burst`, with this region's floor at half of it.
fn half(key: &str, rate: f64, burst: f64) -> BucketRequest {
    BucketRequest::of(
        key,
        Meter::Global(Global { floor_ppm: 500_000 }),
        rate,
        burst,
    )
}

fn close(store: &dyn StoreUnderTest, seen: f64, want: f64, what: &str) {
    assert!(
        (seen - want).abs() <= store.tolerance(),
        "{} ({}): {seen} tokens, expected {want}",
        what,
        store.name()
    );
}

fn admitted(store: &dyn StoreUnderTest, bucket: &BucketRequest, tries: usize) -> usize {
    (0..tries)
        .filter(|_| store.decide(std::slice::from_ref(bucket)).allowed)
        .count()
}

/// With no share, a key is decided against its floor alone: half the burst.
fn a_key_without_a_share_has_its_floor(store: &dyn StoreUnderTest) {
    let bucket = half("tg:g:{floor}", 0.001, 10.0);
    assert_eq!(admitted(store, &bucket, 12), 5, "{}", store.name());
    close(store, store.peek(&bucket).tokens, 0.0, "after the floor");
}

/// A key whose share came before its first check starts full at floor + share.
fn a_new_key_starts_full_at_floor_and_share(store: &dyn StoreUnderTest) {
    let bucket = half("tg:g:{new}", 0.001, 20.0);
    let level = store.put_share(&bucket, 0.0, 6, 60_000);
    close(store, level, 16.0, "the level after the share");
    assert_eq!(admitted(store, &bucket, 20), 16, "{}", store.name());
}

/// A share that grows never adds tokens: the level stays; the larger size refills.
fn a_growing_share_adds_no_tokens(store: &dyn StoreUnderTest) {
    let bucket = half("tg:g:{grow}", 1.0, 10.0);
    assert_eq!(admitted(store, &bucket, 6), 5, "{}", store.name());
    let level = store.put_share(&bucket, 1.0, 5, 60_000);
    close(store, level, 0.0, "the level after the growth");
    assert_eq!(admitted(store, &bucket, 1), 0, "{}", store.name());
    // 1.5 tokens a second now: 3 s bring 4.5.
    store.advance(3000, &[&bucket.key]);
    close(
        store,
        store.peek(&bucket).tokens,
        4.5,
        "refilled at floor + share",
    );
}

/// A share that shrinks caps the level at the smaller size.
fn a_shrinking_share_caps_the_level(store: &dyn StoreUnderTest) {
    let bucket = half("tg:g:{shrink}", 0.001, 20.0);
    store.put_share(&bucket, 0.0, 10, 60_000);
    assert_eq!(admitted(store, &bucket, 2), 2, "{}", store.name());
    close(store, store.peek(&bucket).tokens, 18.0, "before the cut");
    let level = store.put_share(&bucket, 0.0, 3, 60_000);
    close(store, level, 13.0, "capped at floor + the smaller share");
    assert_eq!(admitted(store, &bucket, 20), 13, "{}", store.name());
}

/// A share that ends without any event is not credited past its end: floor + share's rate
/// until then, the floor's after, the level capped at the floor's size at the end.
fn a_lapsed_share_refills_piecewise(store: &dyn StoreUnderTest) {
    // Floor: 1/s, 10 tokens; share: 2/s, 10 tokens more, for 2 s.
    let bucket = half("tg:g:{lapse}", 2.0, 20.0);
    store.put_share(&bucket, 2.0, 10, 2000);
    assert_eq!(admitted(store, &bucket, 25), 20, "{}", store.name());
    // 4 s later: 2 s at 3/s (6 tokens), then 2 s at 1/s: 8, where 4 s at 3/s would be 12.
    store.advance(4000, &[&bucket.key]);
    close(store, store.peek(&bucket).tokens, 8.0, "refilled piecewise");
    assert_eq!(admitted(store, &bucket, 10), 8, "{}", store.name());
}

/// A level above the floor at the share's end is cut to the floor's size.
fn a_lapsed_share_leaves_the_floor(store: &dyn StoreUnderTest) {
    let bucket = half("tg:g:{cut}", 0.001, 20.0);
    store.put_share(&bucket, 0.0, 10, 2000);
    assert_eq!(admitted(store, &bucket, 2), 2, "{}", store.name());
    store.advance(3000, &[&bucket.key]);
    close(store, store.peek(&bucket).tokens, 10.0, "the floor's size");
    assert_eq!(admitted(store, &bucket, 20), 10, "{}", store.name());
}

/// A change brings the bucket to now under the old share first: the stretch before it is
/// refilled at the old rate, not the new one.
fn a_change_refills_the_past_at_the_old_rate(store: &dyn StoreUnderTest) {
    // Floor 0.5/s and 10 tokens; a share of 0 rate and 10 tokens, spent whole.
    let bucket = half("tg:g:{past}", 1.0, 20.0);
    store.put_share(&bucket, 0.0, 10, 60_000);
    assert_eq!(admitted(store, &bucket, 25), 20, "{}", store.name());
    store.advance(4000, &[&bucket.key]);
    // 4 s at 0.5/s under the old share: 2 tokens, whatever the new rate says.
    let level = store.put_share(&bucket, 5.0, 10, 60_000);
    close(store, level, 2.0, "brought to now at the old rate");
    store.advance(1000, &[&bucket.key]);
    close(
        store,
        store.peek(&bucket).tokens,
        7.5,
        "then at the new rate",
    );
}

every_store!(
    a_key_without_a_share_has_its_floor,
    a_new_key_starts_full_at_floor_and_share,
    a_growing_share_adds_no_tokens,
    a_shrinking_share_caps_the_level,
    a_lapsed_share_refills_piecewise,
    a_lapsed_share_leaves_the_floor,
    a_change_refills_the_past_at_the_old_rate,
);
