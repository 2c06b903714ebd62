//! A global limit's key in a region, on both stores (`lua/global.lua` and its twin
//! `kinds::global`): decided against the floor and the home's share, refilled piecewise
//! around the share's end, and never given tokens by a share change; borrowed, its slices
//! still out count against a share that is cut or ends.

use tollgate_core::kinds::borrow::{Borrow, GiveBack};
use tollgate_core::kinds::global::Global;
use tollgate_core::kinds::{BucketRequest, Meter, Slice};

use crate::support::stores::{every_store, StoreUnderTest};

/// A global limit of `rate`/s, burst `burst`, with this region's floor at half of it.
fn half(key: &str, rate: f64, burst: f64) -> BucketRequest {
    BucketRequest::of(
        key,
        Meter::Global(Global {
            floor_ppm: 500_000,
            borrow: None,
        }),
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

/// `bucket`'s check borrowing up to `want` tokens on a grid of `grid_ms`, giving `give` back.
fn borrowing(
    bucket: &BucketRequest,
    want: u64,
    grid_ms: u64,
    give: Option<GiveBack>,
) -> BucketRequest {
    bucket.clone().borrowing(Borrow {
        grid_us: grid_ms * 1000,
        want,
        give,
    })
}

/// One borrowing check: admitted, and the slice it took.
fn take(store: &dyn StoreUnderTest, bucket: &BucketRequest, want: u64) -> Slice {
    let decided = store.decide(&[borrowing(bucket, want, 10_000, None)]);
    assert!(decided.allowed, "{}", store.name());
    let [slice] = decided.slices[..] else {
        panic!("{}: one slice, not {:?}", store.name(), decided.slices);
    };
    slice
}

/// The whole slice given back unused, by a check of cost 0.
fn give_back(store: &dyn StoreUnderTest, bucket: &BucketRequest, slice: Slice) {
    let mut back = borrowing(
        bucket,
        0,
        10_000,
        Some(GiveBack {
            deadline_us: store.stored_deadline(&bucket.key, slice),
            taken: slice.tokens,
            unused: slice.tokens,
            incarnation: slice.incarnation,
        }),
    );
    back.cost = 0;
    store.decide(&[back]);
}

/// A share cut while an instance holds a slice taken under it: the slice counts against the
/// new size, so the region's tokens (its level and the slice) never exceed it. Counted as a
/// plain level capped at the new size, the bucket would admit its whole new size on top of
/// the slice (18 here where the new size is 10).
fn a_cut_share_counts_the_slices_out(store: &dyn StoreUnderTest) {
    // Floor: 10 tokens (half of 20), nearly no refill; a share of 10 more.
    let bucket = half("tg:g:{slice-cut}", 0.001, 20.0);
    store.put_share(&bucket, 0.0, 10, 60_000);
    // 1 admitted, 8 more taken into a slice: 11 left of 20.
    let slice = take(store, &bucket, 8);
    assert_eq!(slice.tokens, 8, "{}", store.name());
    close(store, store.peek(&bucket).tokens, 11.0, "after the slice");
    // The home cuts the share to nothing: the floor's 10, of which the slice holds 8.
    let level = store.put_share(&bucket, 0.0, 0, 60_000);
    close(store, level, 2.0, "the new size less the slice still out");
    let plain = admitted(store, &bucket, 20);
    assert!(
        plain + slice.tokens as usize <= 10,
        "{}: {plain} admitted by the store and {} in the slice, past the new size 10",
        store.name(),
        slice.tokens
    );
    assert_eq!(plain, 2, "{}", store.name());
    // Given back unused, the slice's tokens return to the level, never past the size.
    give_back(store, &bucket, slice);
    close(store, store.peek(&bucket).tokens, 8.0, "the slice back");
    assert_eq!(admitted(store, &bucket, 20), 8, "{}", store.name());
}

/// A share that ends with a slice out: the level is cut to the floor's size less the slice,
/// not to the floor's size.
fn a_lapsed_share_counts_the_slices_out(store: &dyn StoreUnderTest) {
    let bucket = half("tg:g:{slice-lapse}", 0.001, 20.0);
    store.put_share(&bucket, 0.0, 10, 2000);
    let slice = take(store, &bucket, 6);
    assert_eq!(slice.tokens, 6, "{}", store.name());
    // 20 - 1 - 6 = 13; the share ends 2 s in, the slice's group 10 to 20 s in.
    store.advance(3000, &[&bucket.key]);
    close(
        store,
        store.peek(&bucket).tokens,
        4.0,
        "the floor's 10 less the slice's 6",
    );
    let plain = admitted(store, &bucket, 20);
    assert_eq!(plain, 4, "{}", store.name());
    assert!(plain + slice.tokens as usize <= 10, "{}", store.name());
}

/// A slice's group that ends counts its tokens as used: they refill from its deadline at the
/// rate in force, never all at once.
fn an_ended_group_of_a_global_key_refills(store: &dyn StoreUnderTest) {
    // Floor 0.5/s and 10 tokens; a share of 0.5/s and 10 tokens for a minute.
    let bucket = half("tg:g:{slice-end}", 1.0, 20.0);
    store.put_share(&bucket, 0.5, 10, 60_000);
    let slice = take(store, &bucket, 9);
    assert_eq!(slice.tokens, 9, "{}", store.name());
    assert_eq!(admitted(store, &bucket, 20), 10, "{}", store.name());
    // 25 s later the group (10 to 20 s ahead) has ended: refilled at 1/s since, never the
    // slice's 9 at once; at most the size.
    store.advance(25_000, &[&bucket.key]);
    let level = store.peek(&bucket).tokens;
    assert!(
        level <= 20.0 + store.tolerance(),
        "{}: {level}",
        store.name()
    );
    assert!(
        level >= 5.0 - store.tolerance(),
        "{}: {level}",
        store.name()
    );
}

every_store!(
    a_cut_share_counts_the_slices_out,
    a_lapsed_share_counts_the_slices_out,
    an_ended_group_of_a_global_key_refills,
    a_key_without_a_share_has_its_floor,
    a_new_key_starts_full_at_floor_and_share,
    a_growing_share_adds_no_tokens,
    a_shrinking_share_caps_the_level,
    a_lapsed_share_refills_piecewise,
    a_lapsed_share_leaves_the_floor,
    a_change_refills_the_past_at_the_old_rate,
);
