//! Setting, reading and deleting overrides through the admin API, across instances.

use super::*;

#[test]
fn an_override_set_on_one_instance_is_enforced_by_all_three_within_a_second() {
    let redis = RedisServer::start();
    let [a, b, c] = three(&redis, Some(TOKEN));
    for tollgate in [&a, &b, &c] {
        assert!(policy_of(tollgate, "roomy", "acme").contains("q=1000"));
    }

    let started = Instant::now();
    let answer = put(&a, "roomy", "acme", r#"{"burst": 5000}"#);
    assert_eq!(answer.status, 200, "{answer:?}");
    let mut seen_after = Vec::new();
    for tollgate in [&a, &b, &c] {
        assert!(
            wait_until(Duration::from_secs(3), || policy_of(
                tollgate, "roomy", "acme"
            )
            .contains("q=5000")),
            "an instance never applied the override"
        );
        seen_after.push(started.elapsed());
    }
    let slowest = seen_after.iter().max().copied().unwrap_or_default();
    println!("override in force on all three after {slowest:?} ({seen_after:?})");
    assert!(slowest <= Duration::from_secs(1), "took {slowest:?}");
    assert!(
        policy_of(&b, "roomy", "other").contains("q=1000"),
        "other keys keep the limit"
    );

    // Counted exactly: a fresh key gets the override's burst across the three, no more.
    assert_eq!(put(&b, "tight", "big", r#"{"burst": 5}"#).status, 200);
    for tollgate in [&a, &b, &c] {
        assert!(wait_until(Duration::from_secs(3), || listed(
            tollgate,
            "tight",
            Some(TOKEN)
        )
        .as_array()
        .is_some_and(|l| l.len() == 1)));
    }
    assert_eq!(admitted(&[&a, &b, &c], "big", 9), 5);
    assert_eq!(
        admitted(&[&a, &b, &c], "small", 9),
        2,
        "the limit's own burst"
    );

    // The runtime override beats the file's (burst 3) for the same key.
    assert_eq!(put(&c, "tight", "file-key", r#"{"burst": 6}"#).status, 200);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(admitted(&[&a, &b, &c], "file-key", 9), 6);
}

#[test]
fn get_shows_key_values_to_the_token_holder_and_fingerprints_to_others() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&config(&redis, Some(TOKEN)));
    assert_eq!(
        put(
            &tollgate,
            "tight",
            "sk_live_abc",
            r#"{"rate": "2/s", "burst": 7, "ttl_s": 600}"#
        )
        .status,
        200
    );
    let mine = listed(&tollgate, "tight", Some(TOKEN));
    assert_eq!(mine[0]["key"][0], "sk_live_abc");
    assert_eq!(mine[0]["burst"], 7);
    assert_eq!(mine[0]["rate_per_s"], 2.0);
    let left = mine[0]["expires_in_s"].as_u64().expect("an expiry");
    assert!((590..=600).contains(&left), "{left}");
    let theirs = listed(&tollgate, "tight", None);
    let shown = theirs[0]["key"][0].as_str().unwrap();
    assert_eq!(shown.len(), 12);
    assert_ne!(shown, "sk_live_abc");
    assert!(!theirs.to_string().contains("sk_live_abc"));
    let wrong = listed(&tollgate, "tight", Some("not-the-token"));
    assert_eq!(
        wrong[0]["key"][0], shown,
        "a wrong token reads as anonymous"
    );

    // An IP part is normalised as /check keys it (an IPv6 client by its /64) and shown as is.
    let answer = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/per-ip?key=2001:DB8:0:0::1&key=acme",
        Some(TOKEN),
        r#"{"unlimited": true}"#,
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        listed(&tollgate, "per-ip", None)[0]["key"][0],
        "2001:DB8:0:0::1"
    );
}

#[test]
fn unlimited_and_ttl_expire_everywhere_and_delete_restores_the_limit() {
    let redis = RedisServer::start();
    let [a, b, c] = three(&redis, Some(TOKEN));
    assert_eq!(
        put(&a, "tight", "vip", r#"{"unlimited": true, "ttl_s": 2}"#).status,
        200
    );
    let set_at = Instant::now();
    for tollgate in [&a, &b, &c] {
        assert!(wait_until(Duration::from_secs(1), || {
            listed(tollgate, "tight", None)
                .as_array()
                .is_some_and(|l| l.len() == 1)
        }));
    }
    let unlimited = check(&b, "tight", "vip");
    assert_eq!(unlimited.status, 200);
    assert_eq!(
        unlimited.header("ratelimit-policy"),
        None,
        "no limit applied"
    );
    assert_eq!(admitted(&[&a, &b, &c], "vip", 12), 12);
    assert_eq!(
        redis
            .cli(&["--scan", "--pattern", "tollgate:tight:*"])
            .trim(),
        "",
        "an unlimited key makes no store call"
    );

    // After its TTL every instance enforces the limit's own numbers again.
    let left = Duration::from_millis(2100).saturating_sub(set_at.elapsed());
    std::thread::sleep(left);
    assert_eq!(admitted(&[&a, &b, &c], "vip", 6), 2);
    for tollgate in [&a, &b, &c] {
        assert_eq!(listed(tollgate, "tight", None), serde_json::json!([]));
    }
    // The expired entry leaves the store too (dropped by the next load), not kept forever.
    assert!(wait_until(Duration::from_secs(2), || redis
        .cli(&["HLEN", "tollgate:{tollgate:overrides}:limit:tight"])
        .trim()
        == "0"));

    // DELETE restores the limit on every instance.
    assert_eq!(put(&a, "tight", "gone", r#"{"burst": 50}"#).status, 200);
    assert_eq!(admitted(&[&a], "gone", 3), 3);
    let deleted = admin_json(
        c.admin,
        "DELETE",
        "/v1/overrides/tight?key=gone",
        Some(TOKEN),
        "",
    );
    assert_eq!(deleted.status, 204, "{deleted:?}");
    std::thread::sleep(Duration::from_secs(1));
    // The bucket kept its debt (3 taken); back under burst 2 the limit's own numbers bind at
    // once: 2 - 3 is below empty, and nothing passes until the refill (0.001/s).
    assert_eq!(admitted(&[&a, &b, &c], "gone", 6), 0);
    let again = admin_json(
        c.admin,
        "DELETE",
        "/v1/overrides/tight?key=gone",
        Some(TOKEN),
        "",
    );
    assert_eq!(again.status, 404);
}

#[test]
fn a_quota_limit_takes_a_quota_override_only() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&config(&redis, Some(TOKEN)));
    let refused = put(&tollgate, "monthly", "acme", r#"{"burst": 10}"#);
    assert_eq!(refused.status, 400);
    assert!(
        refused.body.contains("\"field\":\"burst\""),
        "{}",
        refused.body
    );
    assert_eq!(
        put(&tollgate, "monthly", "acme", r#"{"quota": 5}"#).status,
        200
    );
    let admitted = (0..7)
        .filter(|_| check(&tollgate, "monthly", "acme").status == 200)
        .count();
    assert_eq!(admitted, 5);
    let refused = put(&tollgate, "tight", "acme", r#"{"quota": 5}"#);
    assert_eq!(refused.status, 400);
    assert!(
        refused.body.contains("\"field\":\"quota\""),
        "{}",
        refused.body
    );
}

/// A limit holds at most 10,000 runtime overrides: one more is refused with 409 and changes
/// nothing; once one is gone there is room again.
#[test]
fn a_full_limit_refuses_one_more_override_with_409() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&config(&redis, Some(TOKEN)));
    let hash = "tollgate:{tollgate:overrides}:limit:tight";
    // 10,000 entries written straight into the store, as 10,000 PUTs would leave them.
    redis.cli(&[
        "EVAL",
        "for i = 1, tonumber(ARGV[1]) do \
           redis.call('HSET', KEYS[1], 'filler' .. i, cjson.encode({k = {'filler' .. i}, b = 5})) \
         end",
        "1",
        hash,
        "10000",
    ]);

    let refused = put(&tollgate, "tight", "newcomer", r#"{"burst": 4}"#);
    assert_eq!(refused.status, 409, "{refused:?}");
    assert!(refused.body.contains("10000"), "{}", refused.body);
    assert_eq!(
        redis.cli(&["HLEN", hash]).trim(),
        "10000",
        "nothing written"
    );
    assert_eq!(
        admitted(&[&tollgate], "newcomer", 4),
        2,
        "the file's burst still"
    );

    redis.cli(&["HDEL", hash, "filler1"]);
    assert_eq!(
        put(&tollgate, "tight", "newcomer", r#"{"burst": 4}"#).status,
        200
    );
    assert!(
        wait_until(Duration::from_secs(3), || policy_of(
            &tollgate, "tight", "newcomer"
        )
        .contains("q=4")),
        "the override applies once there was room"
    );
}

#[test]
fn the_memory_store_offers_the_same_api() {
    let tollgate = Tollgate::start(&memory_config());
    assert_eq!(
        put(&tollgate, "tight", "big", r#"{"burst": 5}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "big", 8), 5);
    assert_eq!(
        put(
            &tollgate,
            "tight",
            "file-key",
            r#"{"burst": 4, "ttl_s": 1}"#
        )
        .status,
        200
    );
    assert_eq!(
        listed(&tollgate, "tight", Some(TOKEN))
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        put(&tollgate, "tight", "vip", r#"{"unlimited": true}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "vip", 10), 10);
    // A reload of the file keeps them: here no store could bring them back.
    tollgate.signal("HUP");
    assert!(wait_until(Duration::from_secs(3), || tollgate
        .metric("tollgate_config_reloads_total{result=\"success\"}")
        == 1.0));
    assert_eq!(admitted(&[&tollgate], "vip", 10), 10);
    let deleted = admin_json(
        tollgate.admin,
        "DELETE",
        "/v1/overrides/tight?key=vip",
        Some(TOKEN),
        "",
    );
    assert_eq!(deleted.status, 204);
    assert_eq!(admitted(&[&tollgate], "vip", 4), 2);
    std::thread::sleep(Duration::from_millis(1100));
    // The TTL passed: back to the file's override (burst 3).
    assert_eq!(admitted(&[&tollgate], "file-key", 5), 3);
    let refused = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/tight?key=a&key=b",
        Some(TOKEN),
        "{}",
    );
    assert_eq!(refused.status, 400);
}

/// Admissions of `key` on `tight` by checks on `tollgate` until its answers carry
/// `policy` (the override reached it), and whether they ever did.
fn admitted_until_policy(tollgate: &Tollgate, key: &str, policy: &str) -> (usize, bool) {
    let mut admitted = 0;
    let seen = wait_until(Duration::from_secs(3), || {
        let answer = check(tollgate, "tight", key);
        if answer.status == 200 {
            admitted += 1;
        }
        answer
            .header("ratelimit-policy")
            .is_some_and(|p| p.contains(policy))
    });
    (admitted, seen)
}

/// A bucket is stored as its debt, so a raised burst applies to it: a drained key of burst 2
/// raised to 10 admits 8 more at once, on every instance, not after a slow refill (0.001/s).
#[test]
fn a_raised_burst_on_a_drained_key_grants_the_difference_at_once_everywhere() {
    let redis = RedisServer::start();
    let [a, b, c] = three(&redis, Some(TOKEN));
    assert_eq!(admitted(&[&a, &b, &c], "drained", 6), 2);
    assert_eq!(put(&a, "tight", "drained", r#"{"burst": 10}"#).status, 200);
    let mut after = 0;
    for tollgate in [&a, &b, &c] {
        let (admitted, seen) = admitted_until_policy(tollgate, "drained", "q=10");
        assert!(seen, "an instance never applied the override");
        after += admitted;
    }
    after += admitted(&[&a, &b, &c], "drained", 12);
    assert_eq!(after, 8, "burst 10 less the 2 already taken");
}

#[test]
fn on_the_memory_store_a_raised_burst_grants_the_difference_and_a_lowered_one_binds() {
    // The memory store applies an override at once: counts are exact.
    let tollgate = Tollgate::start(&memory_config());
    assert_eq!(admitted(&[&tollgate], "raised", 4), 2);
    assert_eq!(
        put(&tollgate, "tight", "raised", r#"{"burst": 5}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "raised", 6), 3);

    // Lowered: 1 of 10 taken, then burst 2 leaves 1, not 2.
    assert_eq!(
        put(&tollgate, "tight", "lowered", r#"{"burst": 10}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "lowered", 1), 1);
    assert_eq!(
        put(&tollgate, "tight", "lowered", r#"{"burst": 2}"#).status,
        200
    );
    assert_eq!(admitted(&[&tollgate], "lowered", 4), 1);
}
