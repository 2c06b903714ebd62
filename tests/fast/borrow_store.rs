//! Borrowed tokens in the store: the same scenarios on every store (`support::stores`: the
//! memory store and a real `redis-server` running `lua/token_bucket.lua`), so the script and
//! its Rust twin (`kinds::borrow`) cannot drift apart.

use crate::support::stores::{every_store, StoreUnderTest};
use tollgate_core::kinds::borrow::{Borrow, GiveBack};
use tollgate_core::kinds::{BucketRequest, Meter, Slice};
use tollgate_core::store::StoreDecision;

/// The horizon of these scenarios: 1 s.
const GRID_US: u64 = 1_000_000;

fn borrowing(key: &str, rate: f64, burst: f64, want: u64, give: Option<GiveBack>) -> BucketRequest {
    BucketRequest {
        meter: Meter::Borrow(Borrow {
            grid_us: GRID_US,
            want,
            give,
        }),
        ..BucketRequest::bucket(key, rate, burst)
    }
}

fn plain(key: &str, rate: f64, burst: f64) -> BucketRequest {
    BucketRequest::bucket(key, rate, burst).limit(1)
}

fn give_back(h: &dyn StoreUnderTest, key: &str, slice: Slice, unused: u64) -> Option<GiveBack> {
    Some(GiveBack {
        deadline_us: h.stored_deadline(key, slice),
        taken: slice.tokens,
        unused,
        incarnation: slice.incarnation,
    })
}

fn close(h: &dyn StoreUnderTest, got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= h.tolerance(),
        "{}: {what}: {got}, expected {want}",
        h.name()
    );
}

fn only_slice(h: &dyn StoreUnderTest, decision: &StoreDecision) -> Slice {
    assert_eq!(decision.slices.len(), 1, "{}: one slice taken", h.name());
    decision.slices[0]
}

fn a_slice_is_taken_beside_the_cost_and_does_not_refill_while_held(
    h: &dyn StoreUnderTest,
) -> Slice {
    let key = format!("tg:{}:{{take}}", h.name());
    let decision = h.decide(&[borrowing(&key, 10.0, 20.0, 8, None)]);
    assert!(decision.allowed);
    let slice = only_slice(h, &decision);
    assert_eq!(
        slice.tokens,
        8,
        "{}: what it wanted, under half of 19",
        h.name()
    );
    let ahead = slice.deadline_us - slice.now_us;
    assert!(
        ahead > GRID_US && ahead <= 2 * GRID_US,
        "{}: the deadline is one to two horizons ahead: {ahead}",
        h.name()
    );
    close(
        h,
        decision.buckets[0].tokens,
        11.0,
        "left after the cost and the slice",
    );
    // Half a second refills 5 of the debt of 9, but the 8 held do not refill.
    h.advance(500, &[&key]);
    let request = borrowing(&key, 10.0, 20.0, 0, None);
    assert_eq!(
        h.peek(&request).tokens,
        12.0,
        "{}: held tokens stay out",
        h.name()
    );
    let held = h.reserved(&request);
    assert_eq!(
        (held.tokens, held.held),
        (8, 1),
        "{}: peek shows them",
        h.name()
    );
    slice
}

fn a_give_back_returns_the_unused_and_keeps_the_used_as_debt(h: &dyn StoreUnderTest, slice: Slice) {
    let key = format!("tg:{}:{{take}}", h.name());
    let request = borrowing(&key, 10.0, 20.0, 0, give_back(h, &key, slice, 5));
    let decision = h.decide(std::slice::from_ref(&request));
    assert!(decision.allowed && decision.slices.is_empty());
    // Debt 8 (all held) - 5 unused + 1 charged = 4.
    close(h, decision.buckets[0].tokens, 16.0, "after the give-back");
    assert_eq!(h.reserved(&request).tokens, 0, "{}: nothing held", h.name());
    // The same give-back again finds no group: nothing changes.
    let decision = h.decide(&[borrowing(&key, 10.0, 20.0, 0, give_back(h, &key, slice, 5))]);
    close(
        h,
        decision.buckets[0].tokens,
        15.0,
        "a second give-back is void",
    );
}

/// A quiet key's slice goes back in a call of its own: cost 0, asking for nothing.
fn a_give_back_alone_charges_nothing(h: &dyn StoreUnderTest) {
    let key = format!("tg:{}:{{alone}}", h.name());
    let taken = h.decide(&[borrowing(&key, 10.0, 20.0, 8, None)]);
    let slice = only_slice(h, &taken);
    let alone = BucketRequest {
        cost: 0,
        ..borrowing(&key, 10.0, 20.0, 0, give_back(h, &key, slice, 6))
    };
    let decision = h.decide(std::slice::from_ref(&alone));
    assert!(decision.allowed && decision.slices.is_empty());
    // Debt 1 charged + 8 held, less 6 unused: 3.
    close(
        h,
        decision.buckets[0].tokens,
        17.0,
        "after the give-back alone",
    );
    assert_eq!(h.reserved(&alone).tokens, 0, "{}: nothing held", h.name());
}

fn near_empty_the_slice_shrinks_to_nothing(h: &dyn StoreUnderTest) {
    let key = format!("tg:{}:{{edge}}", h.name());
    let slow = |want| borrowing(&key, 0.001, 3.0, want, None);
    let first = h.decide(&[slow(10)]);
    assert_eq!(only_slice(h, &first).tokens, 1, "{}: half of 2", h.name());
    close(h, first.buckets[0].tokens, 1.0, "after the first");
    let second = h.decide(&[slow(10)]);
    assert!(
        second.allowed && second.slices.is_empty(),
        "{}: none left to lend",
        h.name()
    );
    close(h, second.buckets[0].tokens, 0.0, "after the second");
    assert!(!h.decide(&[slow(10)]).allowed, "{}: then denied", h.name());
}

fn a_denied_request_takes_nothing_but_its_give_back_happens(h: &dyn StoreUnderTest) {
    let (lender, tight) = (
        format!("tg:{}:{{lender}}", h.name()),
        format!("tg:{}:{{tight}}", h.name()),
    );
    let taken = h.decide(&[borrowing(&lender, 10.0, 20.0, 8, None)]);
    let slice = only_slice(h, &taken);
    assert!(h.decide(&[plain(&tight, 0.001, 1.0)]).allowed);
    let both = [
        borrowing(&lender, 10.0, 20.0, 8, give_back(h, &lender, slice, 8)),
        plain(&tight, 0.001, 1.0),
    ];
    let decision = h.decide(&both);
    assert!(
        !decision.allowed && decision.slices.is_empty(),
        "{}",
        h.name()
    );
    // The 8 unused came back; the request's own token was never charged: 20 - 1.
    close(
        h,
        decision.buckets[0].tokens,
        19.0,
        "the lender after a denial",
    );
    assert_eq!(h.reserved(&both[0]).tokens, 0, "{}", h.name());
}

fn an_ended_group_counts_as_used_from_its_deadline(h: &dyn StoreUnderTest) {
    let key = format!("tg:{}:{{ends}}", h.name());
    let decision = h.decide(&[borrowing(&key, 1.0, 20.0, 8, None)]);
    let slice = only_slice(h, &decision);
    let ahead_s = (slice.deadline_us - slice.now_us) as f64 / 1e6;
    h.advance(3000, &[&key]);
    // At the deadline the debt of 9 had refilled to 9 - ahead (< 8): held, it stays 8; from
    // there it refills for 3 - ahead seconds. Then this check costs 1.
    let after = h.decide(&[borrowing(&key, 1.0, 20.0, 0, None)]);
    close(
        h,
        after.buckets[0].tokens,
        20.0 - (8.0 - (3.0 - ahead_s)) - 1.0,
        "the ended group's tokens, used at its deadline",
    );
    assert_eq!(h.reserved(&borrowing(&key, 1.0, 20.0, 0, None)).tokens, 0);
}

fn a_reset_forgets_the_held_tokens(h: &dyn StoreUnderTest) {
    let key = format!("tg:{}:{{reset}}", h.name());
    let request = borrowing(&key, 1.0, 20.0, 8, None);
    assert_eq!(
        only_slice(h, &h.decide(std::slice::from_ref(&request))).tokens,
        8
    );
    h.reset(&key);
    assert_eq!(h.peek(&request).tokens, 20.0, "{}: full again", h.name());
    assert_eq!(h.reserved(&request).tokens, 0, "{}: nothing held", h.name());
}

fn a_plain_check_keeps_the_held_tokens(h: &dyn StoreUnderTest) {
    let key = format!("tg:{}:{{plain}}", h.name());
    let taken = h.decide(&[borrowing(&key, 10.0, 20.0, 8, None)]);
    assert_eq!(only_slice(h, &taken).tokens, 8);
    let plain_check = BucketRequest {
        limit: 0,
        ..plain(&key, 10.0, 20.0)
    };
    let decision = h.decide(std::slice::from_ref(&plain_check));
    assert!(
        decision.allowed && decision.slices.is_empty(),
        "{}",
        h.name()
    );
    close(
        h,
        decision.buckets[0].tokens,
        10.0,
        "a plain check after a take",
    );
    assert_eq!(
        h.reserved(&borrowing(&key, 10.0, 20.0, 0, None)).tokens,
        8,
        "{}",
        h.name()
    );
    // Half a second refills 5 of the debt of 10: the 8 held stay out, for a plain peek too.
    h.advance(500, &[&key]);
    assert_eq!(
        h.peek(&plain_check).tokens,
        12.0,
        "{}: held, not refilled",
        h.name()
    );
}

/// The bucket deleted under live slices (`FLUSHALL`, an operator's `DEL`: no reset message, so
/// instances keep their slices), then a slice taken again into a group of the same deadline:
/// a give-back of a slice from before the deletion names that group but not its incarnation,
/// and does nothing. Before, it un-held the new slice's tokens and returned its own unused
/// ones to a bucket that never lent them.
fn a_give_back_from_before_a_flush_does_nothing(h: &dyn StoreUnderTest) {
    const LONG_GRID_US: u64 = 10_000_000;
    let take = |key: &str, give| BucketRequest {
        meter: Meter::Borrow(Borrow {
            grid_us: LONG_GRID_US,
            want: 40,
            give,
        }),
        ..BucketRequest::bucket(key, 1.0, 100.0)
    };
    // Both takes must fall in one grid step for their groups to share a deadline; on Redis's
    // real clock a step may end between them, then the next key tries again.
    for attempt in 0..3 {
        let key = format!("tg:{}:{{flushed{attempt}}}", h.name());
        let stale = only_slice(h, &h.decide(&[take(&key, None)]));
        assert_eq!(stale.tokens, 40, "{}", h.name());
        h.flush(&key);
        let live = only_slice(h, &h.decide(&[take(&key, None)]));
        if live.deadline_us != stale.deadline_us {
            continue;
        }
        let give = GiveBack {
            deadline_us: stale.deadline_us,
            taken: 40,
            unused: 40,
            incarnation: stale.incarnation,
        };
        let request = BucketRequest {
            meter: Meter::Borrow(Borrow {
                grid_us: LONG_GRID_US,
                want: 0,
                give: Some(give),
            }),
            ..BucketRequest::bucket(&key, 1.0, 100.0)
        };
        let decision = h.decide(std::slice::from_ref(&request));
        assert!(decision.allowed, "{}", h.name());
        // 100 - 1 - 40 held by the live slice - 1 for this check.
        close(
            h,
            decision.buckets[0].tokens,
            58.0,
            "the stale give-back returns nothing",
        );
        assert_eq!(
            h.reserved(&request).tokens,
            40,
            "{}: the live slice is still held",
            h.name()
        );
        // The live slice's own give-back still works.
        let own = GiveBack {
            deadline_us: live.deadline_us,
            taken: 40,
            unused: 40,
            incarnation: live.incarnation,
        };
        let decision = h.decide(&[BucketRequest {
            meter: Meter::Borrow(Borrow {
                grid_us: LONG_GRID_US,
                want: 0,
                give: Some(own),
            }),
            ..BucketRequest::bucket(&key, 1.0, 100.0)
        }]);
        close(
            h,
            decision.buckets[0].tokens,
            97.0,
            "the live slice given back",
        );
        return;
    }
    panic!(
        "{}: three grid steps of 10 s ended between two calls",
        h.name()
    );
}

fn borrowing_scenarios(h: &dyn StoreUnderTest) {
    let slice = a_slice_is_taken_beside_the_cost_and_does_not_refill_while_held(h);
    a_give_back_returns_the_unused_and_keeps_the_used_as_debt(h, slice);
    a_give_back_alone_charges_nothing(h);
    near_empty_the_slice_shrinks_to_nothing(h);
    a_denied_request_takes_nothing_but_its_give_back_happens(h);
    an_ended_group_counts_as_used_from_its_deadline(h);
    a_reset_forgets_the_held_tokens(h);
    a_plain_check_keeps_the_held_tokens(h);
    a_give_back_from_before_a_flush_does_nothing(h);
}

every_store!(borrowing_scenarios);
