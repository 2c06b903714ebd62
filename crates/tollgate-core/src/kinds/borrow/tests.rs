use super::*;

/// Groups taken at 7 µs.
fn live(slots: [(u64, u64); 2]) -> Groups {
    Groups {
        slots,
        incarnation: Some(7),
    }
}

#[test]
fn a_give_back_to_another_incarnation_does_nothing() {
    let mut groups = live([(2_000_000, 50 * MICRO), (0, 0)]);
    let mut debt = 50 * MICRO;
    let stale = GiveBack {
        deadline_us: 2_000_000,
        taken: 50,
        unused: 50,
        incarnation: 6,
    };
    assert!(!groups.give_back(&mut debt, stale));
    assert_eq!((debt, groups.held()), (50 * MICRO, 50 * MICRO));
    // Once none is live, the next take starts another.
    let mut fresh = Groups::default();
    assert!(fresh.take(2_000_000, MICRO, 9));
    assert_eq!(fresh.incarnation, Some(9));
    let (_, ended) = fresh.settle(None, 2_000_000, 1.0);
    assert!(ended && fresh.incarnation.is_none());
}

#[test]
fn held_tokens_do_not_refill_while_their_group_lives() {
    let mut groups = live([(2_000_000, 50 * MICRO), (0, 0)]);
    let stored = Some(Stored {
        debt: 60 * MICRO,
        ts_us: 0,
    });
    // 10 tokens/s for 1 s refills 10 of the 60: still 50 held.
    assert_eq!(groups.settle(stored, 1_000_000, 10.0), (50 * MICRO, false));
    // 5 s: the refill would empty the debt, but 50 are held.
    assert_eq!(groups.settle(stored, 1_500_000, 100.0), (50 * MICRO, false));
}

#[test]
fn an_ended_group_counts_as_used_and_refills_from_its_deadline() {
    let mut groups = live([(1_000_000, 50 * MICRO), (0, 0)]);
    let stored = Some(Stored {
        debt: 50 * MICRO,
        ts_us: 0,
    });
    // Ends at 1 s with 50 owed; by 2 s, 10 of them refilled.
    assert_eq!(groups.settle(stored, 2_000_000, 10.0), (40 * MICRO, true));
    assert!(groups.is_empty());
}

#[test]
fn a_give_back_returns_the_unused_and_keeps_the_used_as_debt() {
    let mut groups = live([(2_000_000, 50 * MICRO), (0, 0)]);
    let mut debt = 50 * MICRO;
    let give = GiveBack {
        deadline_us: 2_000_000,
        taken: 50,
        unused: 30,
        incarnation: 7,
    };
    assert!(groups.give_back(&mut debt, give));
    assert_eq!((debt, groups.held()), (20 * MICRO, 0));
    // Its group is gone: a second give-back does nothing.
    assert!(!groups.give_back(&mut debt, give));
    assert_eq!(debt, 20 * MICRO);
}

#[test]
fn a_third_deadline_finds_no_group_and_takes_nothing() {
    let mut groups = live([(2, 1), (3, 1)]);
    assert!(!groups.take(4, 1, 1));
    assert!(groups.take(3, 1, 1));
    assert_eq!(groups.slots[1], (3, 2));
    assert_eq!(groups.incarnation, Some(7), "the same life goes on");
}

#[test]
fn slices_are_at_most_half_the_level_and_none_near_empty() {
    assert_eq!(slice(100, 1_999_999.0), 0);
    assert_eq!(slice(100, 2_000_000.0), 1);
    assert_eq!(slice(100, 51_000_000.0), 25);
    assert_eq!(slice(10, 51_000_000.0), 10);
    assert_eq!(deadline(1_050, 100), 1_200);
}
