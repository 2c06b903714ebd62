//! The stored forms of a bucket on Redis: an earlier release's, a format this release cannot
//! read, and a key that changes kind between bucket and quota.

use crate::support::stores::{Redis, StoreUnderTest};
use tollgate_core::kinds::twin::Stored;
use tollgate_core::kinds::BucketRequest;
use tollgate_core::store::{Store, StoreError};

fn request(key: &str, rate: f64, burst: f64, cost: u64) -> BucketRequest {
    BucketRequest::bucket(key, rate, burst).cost(cost)
}

/// A rolling upgrade: a bucket an earlier release stored (a hash `{tokens, ts}` of decimal
/// floats) is read as the level it held, and the first script that writes it converts it to
/// `"<debt> <ts>"`, so the key continues from its level and no budget is granted twice.
#[test]
fn a_bucket_an_earlier_release_stored_continues_from_its_level() {
    let redis = Redis::start();
    let time = redis.server.cli(&["TIME"]);
    let mut time = time.split_whitespace();
    let (s, us) = (time.next().unwrap(), time.next().unwrap());
    let ts = format!("{s}{us:0>6}");
    let old = |key: &str, tokens: &str| {
        redis
            .server
            .cli(&["HSET", key, "tokens", tokens, "ts", &ts]);
        redis.server.cli(&["PEXPIRE", key, "100000000"]);
    };
    let kind = |key: &str| redis.server.cli(&["TYPE", key]).trim().to_string();
    // 0.001 tokens/s: the time the test takes refills nothing that counts.
    let bucket = request("upgrade:a", 0.001, 5.0, 1);
    old("upgrade:a", "1.5");
    let peeked = redis.peek(&bucket);
    assert!((peeked.tokens - 1.5).abs() < 0.01, "peek {}", peeked.tokens);
    assert_eq!(kind("upgrade:a"), "hash", "a peek writes nothing");
    let first = redis.decide(std::slice::from_ref(&bucket));
    assert!(first.allowed);
    assert!((first.buckets[0].tokens - 0.5).abs() < 0.01, "{:?}", first);
    assert_eq!(kind("upgrade:a"), "string");
    let stored = redis.server.cli(&["GET", "upgrade:a"]);
    let debt = Stored::parse(stored.trim())
        .ok()
        .flatten()
        .expect("\"v1:<debt> <ts>\"")
        .debt;
    assert!((4_490_000..=4_500_000).contains(&debt), "debt {debt}");
    let second = redis.decide(&[bucket]);
    assert!(!second.allowed, "0.5 tokens left, not a fresh burst");

    // A denial converts it too (its expiry is then the new form's, bounded).
    let drained = request("upgrade:b", 0.001, 5.0, 1);
    old("upgrade:b", "0.25");
    assert!(!redis.decide(std::slice::from_ref(&drained)).allowed);
    assert_eq!(kind("upgrade:b"), "string");
    assert!(!redis.decide(&[drained]).allowed);

    // A mangled hash reads as full, as a mangled value of the new form does.
    old("upgrade:c", "nan");
    redis.server.cli(&["SET", "upgrade:d", "12x 5"]);
    for key in ["upgrade:c", "upgrade:d"] {
        let decision = redis.decide(&[request(key, 0.001, 5.0, 1)]);
        assert!(decision.allowed);
        assert_eq!(decision.buckets[0].tokens, 4.0, "{key}");
    }
}

/// The bucket's value carries its format (`v1:`): a value of another format (a later
/// release's, or a marked one this release cannot read) is refused by every script that reads
/// it, an error the instance answers per `on_error`, never read as full; a value without the
/// marker (a build from before it) is read exactly, and marked when written.
#[test]
fn a_bucket_of_another_format_is_refused_not_read_as_full() {
    let time = |redis: &Redis| {
        let time = redis.server.cli(&["TIME"]);
        let mut time = time.split_whitespace();
        let (s, us) = (time.next().unwrap(), time.next().unwrap());
        format!("{s}{us:0>6}")
    };
    // Unmarked: 4 tokens owed of 5, read exactly (1 left), then written marked.
    let redis = Redis::start();
    let ts = time(&redis);
    redis
        .server
        .cli(&["SET", "format:old", &format!("4000000 {ts}")]);
    let bucket = request("format:old", 0.001, 5.0, 1);
    let first = redis.decide(std::slice::from_ref(&bucket));
    assert!(first.allowed, "{first:?}");
    assert!(first.buckets[0].tokens < 0.01, "{first:?}");
    let value = redis.server.cli(&["GET", "format:old"]);
    assert!(value.starts_with("v1:"), "{value}");
    assert!(!redis.decide(&[bucket]).allowed);

    // A store of its own for each value: three refusals in a row would open its breaker.
    let refused = |result: Result<(), StoreError>, what: &str| match result {
        Err(StoreError::Script(why)) => assert!(why.contains("cannot read"), "{what}: {why}"),
        other => panic!("{what}: {other:?}"),
    };
    for value in [
        format!("v2:4000000 {ts}"),
        format!("w1:4000000 {ts}"),
        "v1:12x 5".to_owned(),
        format!("v1:4000000 {ts} soon"),
    ] {
        let redis = Redis::start();
        redis.server.cli(&["SET", "format:new", &value]);
        let bucket = request("format:new", 0.001, 5.0, 1);
        let borrowing = bucket
            .clone()
            .borrowing(tollgate_core::kinds::borrow::Borrow {
                grid_us: 100_000,
                want: 2,
                give: None,
            });
        let decided = redis
            .runtime
            .block_on(redis.store.decide(std::slice::from_ref(&bucket)));
        refused(decided.map(drop), &format!("decide {value:?}"));
        let peeked = redis.runtime.block_on(redis.store.peek(&bucket));
        refused(peeked.map(drop), &format!("peek {value:?}"));
        let decided = redis.runtime.block_on(redis.store.decide(&[borrowing]));
        refused(decided.map(drop), &format!("borrow {value:?}"));
        assert_eq!(redis.server.cli(&["GET", "format:new"]).trim(), value);
    }
}

/// A limit may change kind under one name (a reload from `rate`/`burst` to `quota`, or back):
/// its key then holds the other form (a string for a bucket, a hash for a quota). Each form
/// reads the other as unused and replaces it when charged, never a Redis error.
#[test]
fn a_key_that_changes_between_bucket_and_quota_is_read_as_fresh() {
    let redis = Redis::start();
    let bucket = request("kind:k", 0.001, 5.0, 1);
    let quota = BucketRequest {
        meter: tollgate_core::kinds::Meter::Quota(tollgate_core::base::calendar::Period::Day),
        ..request("kind:k", 0.0, 3.0, 1)
    };
    assert_eq!(
        redis.decide(std::slice::from_ref(&bucket)).buckets[0].tokens,
        4.0
    );
    assert_eq!(redis.peek(&quota).tokens, 3.0);
    for left in [2.0, 1.0] {
        let decision = redis.decide(std::slice::from_ref(&quota));
        assert!(decision.allowed);
        assert_eq!(decision.buckets[0].tokens, left);
    }
    assert_eq!(redis.decide(&[bucket]).buckets[0].tokens, 4.0);
}
