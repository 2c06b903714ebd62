//! Overrides when the store restarts, loses data or writes, or is a Redis Cluster.

use super::*;

#[test]
fn overrides_outlive_a_redis_restart_and_a_reload() {
    let mut redis = RedisServer::start();
    let [a, b, c] = three(&redis, Some(TOKEN));
    assert_eq!(put(&a, "roomy", "acme", r#"{"burst": 4000}"#).status, 200);
    for tollgate in [&a, &b, &c] {
        assert!(wait_until(Duration::from_secs(2), || policy_of(
            tollgate, "roomy", "acme"
        )
        .contains("q=4000")));
    }

    // Redis down: a change is refused with 503 + Retry-After; instances keep what they know.
    redis.kill();
    let refused = put(&b, "roomy", "beta", r#"{"burst": 3000}"#);
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"));
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(listed(&c, "roomy", Some(TOKEN))[0]["burst"], 4000);

    // Redis back, empty (no persistence): the instances write back what they held.
    redis.restart();
    assert!(
        wait_until(Duration::from_secs(5), || redis
            .cli(&["HLEN", "tollgate:{tollgate:overrides}:limit:roomy"])
            .trim()
            == "1"),
        "the overrides were not written back"
    );
    let fresh = Tollgate::start(&config(&redis, Some(TOKEN)));
    assert!(wait_until(Duration::from_secs(3), || policy_of(
        &fresh, "roomy", "acme"
    )
    .contains("q=4000")));
    for tollgate in [&a, &b, &c] {
        assert!(wait_until(Duration::from_secs(3), || policy_of(
            tollgate, "roomy", "acme"
        )
        .contains("q=4000")));
    }

    // A reload of the file keeps them.
    a.signal("HUP");
    std::thread::sleep(Duration::from_millis(500));
    assert!(policy_of(&a, "roomy", "acme").contains("q=4000"));
    assert_eq!(
        a.metric("tollgate_config_reloads_total{result=\"success\"}"),
        1.0
    );
    assert_eq!(a.metric("tollgate_runtime_overrides{limit=\"roomy\"}"), 1.0);
}

/// A multi-process Redis: second tier (see `e2e` below).
#[cfg(feature = "e2e")]
fn on_a_redis_cluster_an_override_and_its_version_share_a_slot() {
    let cluster = crate::support::cluster::RedisCluster::start();
    let seeds: Vec<String> = cluster.seeds().iter().map(|s| format!("\"{s}\"")).collect();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ncluster = [{}]\ntimeout_ms = 2000\n{LIMITS}",
        seeds.join(", ")
    );
    let (a, b) = (Tollgate::start(&config), Tollgate::start(&config));
    let answer = put(&a, "tight", "big", r#"{"burst": 4, "ttl_s": 600}"#);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(wait_until(Duration::from_secs(1), || listed(
        &b,
        "tight",
        Some(TOKEN)
    )
    .as_array()
    .is_some_and(|l| l.len() == 1)));
    assert_eq!(admitted(&[&a, &b], "big", 8), 4);
    let deleted = admin_json(
        b.admin,
        "DELETE",
        "/v1/overrides/tight?key=big",
        Some(TOKEN),
        "",
    );
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert!(wait_until(Duration::from_secs(1), || listed(
        &a, "tight", None
    ) == serde_json::json!(
        []
    )));
}

/// The store loses its last write (a lossy failover, an older RDB): the version goes back to
/// the one before, and the entry written last is gone. An instance that held the lost entry
/// must still see the next change: a version is never handed out twice, so the next write's
/// version differs from the one that instance holds, and it reloads.
#[test]
fn after_the_store_loses_a_write_the_next_change_still_reaches_every_instance() {
    let redis = RedisServer::start();
    let a = Tollgate::start(&config(&redis, Some(TOKEN)));
    let b = Tollgate::start(&config(&redis, Some(TOKEN)));
    let versions = "tollgate:{tollgate:overrides}:versions";
    let hash = "tollgate:{tollgate:overrides}:limit:tight";
    assert_eq!(put(&a, "tight", "first", r#"{"burst": 5}"#).status, 200);
    let before_lost = redis.cli(&["HGET", versions, "tight"]).trim().to_string();
    assert_eq!(
        put(&a, "tight", "lost", r#"{"unlimited": true}"#).status,
        200
    );
    let keys_on = |tollgate: &Tollgate| keys_on(tollgate, "tight");
    assert!(
        wait_until(Duration::from_secs(5), || keys_on(&b) == ["first", "lost"]),
        "b learns both: {:?}",
        keys_on(&b)
    );
    // The last write is lost: its entry, its version and their traces in the change log and
    // the history of versions (the store as it was before that write).
    redis.cli(&["HDEL", hash, "lost"]);
    redis.cli(&["HSET", versions, "tight", &before_lost]);
    redis.cli(&["ZREM", "tollgate:{tollgate:overrides}:log:tight", "lost"]);
    let after_lost = format!("({before_lost}");
    redis.cli(&[
        "ZREMRANGEBYSCORE",
        "tollgate:{tollgate:overrides}:history:tight",
        &after_lost,
        "+inf",
    ]);
    // The next change, made through another instance.
    assert_eq!(put(&a, "tight", "next", r#"{"burst": 7}"#).status, 200);
    assert!(
        wait_until(Duration::from_secs(5), || keys_on(&b) == ["first", "next"]),
        "b forgets the lost entry and learns the new one: {:?}",
        keys_on(&b)
    );
    assert_eq!(check(&b, "tight", "lost").status, 200);
    assert_eq!(check(&b, "tight", "lost").status, 200);
    assert_eq!(
        check(&b, "tight", "lost").status,
        429,
        "no longer unlimited"
    );
}

/// After Redis lost its data, a deletion wins over an instance that missed it. `b` is paused
/// through the DELETE and through the restart, then polls first: it finds the store empty and
/// writes back the entry it still holds. `a`, which saw the deletion (a newer version of the
/// limit), then writes back its own view, and every instance ends without the entry.
#[test]
fn after_redis_loses_its_data_a_deletion_wins_over_a_stale_instance() {
    let mut redis = RedisServer::start();
    let a = Tollgate::start(&config(&redis, Some(TOKEN)));
    let b = Tollgate::start(&config(&redis, Some(TOKEN)));
    let hash = "tollgate:{tollgate:overrides}:limit:tight";
    assert_eq!(put(&a, "tight", "x", r#"{"unlimited": true}"#).status, 200);
    assert!(
        wait_until(Duration::from_secs(10), || keys_on(&b, "tight") == ["x"]),
        "b learns the override"
    );
    b.signal("STOP");
    let deleted = admin_json(
        a.admin,
        "DELETE",
        "/v1/overrides/tight?key=x",
        Some(TOKEN),
        "",
    );
    assert_eq!(deleted.status, 204, "{deleted:?}");
    a.signal("STOP");
    redis.restart();
    b.signal("CONT");
    assert!(
        wait_until(Duration::from_secs(10), || redis
            .cli(&["HLEN", hash])
            .trim()
            == "1"),
        "b writes back the entry it still holds"
    );
    a.signal("CONT");
    for (name, tollgate) in [("a", &a), ("b", &b)] {
        assert!(
            wait_until(Duration::from_secs(10), || keys_on(tollgate, "tight")
                .is_empty()),
            "{name} still holds the deleted override: {:?}",
            keys_on(tollgate, "tight")
        );
    }
    assert_eq!(redis.cli(&["HLEN", hash]).trim(), "0");
    for tollgate in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(10), || !policy_of(
                tollgate, "roomy", "probe"
            )
            .is_empty()),
            "deciding through Redis again"
        );
    }
    assert_eq!(admitted(&[&a, &b], "x", 5), 2, "x is limited again");
}

/// A change made after Redis lost its data stands: the instances that held the limit before
/// the loss find it changed since and write nothing back over it.
#[test]
fn after_redis_loses_its_data_a_change_made_since_stands_against_a_write_back() {
    let mut redis = RedisServer::start();
    let a = Tollgate::start(&config(&redis, Some(TOKEN)));
    assert_eq!(
        put(&a, "tight", "old", r#"{"unlimited": true}"#).status,
        200
    );
    a.signal("STOP");
    redis.restart();
    let fresh = Tollgate::start(&config(&redis, Some(TOKEN)));
    assert_eq!(put(&fresh, "tight", "new", r#"{"burst": 5}"#).status, 200);
    a.signal("CONT");
    for (name, tollgate) in [("a", &a), ("fresh", &fresh)] {
        assert!(
            wait_until(Duration::from_secs(10), || keys_on(tollgate, "tight")
                == ["new"]),
            "{name} holds {:?}",
            keys_on(tollgate, "tight")
        );
    }
    let hash = "tollgate:{tollgate:overrides}:limit:tight";
    assert_eq!(redis.cli(&["HKEYS", hash]).lines().count(), 1);
}

/// Second tier (`cargo test --features e2e`): tests that start more than one Redis process.
/// One module, so scripts/test.sh runs exactly these by `e2e::`.
#[cfg(feature = "e2e")]
mod e2e {
    #[test]
    fn on_a_redis_cluster_an_override_and_its_version_share_a_slot() {
        super::on_a_redis_cluster_an_override_and_its_version_share_a_slot();
    }
}
