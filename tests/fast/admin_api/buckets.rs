//! Peeking at and resetting buckets: on one instance, across instances' deny caches, on the
//! memory store, a Cluster and behind Sentinel.

use super::*;

#[test]
fn a_peek_shows_what_the_next_check_sees_and_charges_nothing() {
    let redis = RedisServer::start();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(&redis, "", LIMITS)
    );
    let fleet: Vec<Tollgate> = (0..3).map(|_| Tollgate::start(&config)).collect();
    let bucket = "tollgate:per-key:{acme}";

    for tollgate in &fleet {
        assert_eq!(check_key(tollgate, "acme").status, 200);
    }
    let before = stored(&redis, bucket);
    let seen = peek(&fleet[1], "per-key", &["acme"], Some(BEARER));
    let again = peek(&fleet[2], "per-key", &["acme"], None);
    assert_eq!(stored(&redis, bucket), before, "a peek wrote to the bucket");
    let tokens = seen["tokens"].as_f64().unwrap();
    assert!((2.0..2.1).contains(&tokens), "{seen}");
    assert_eq!(seen["remaining"], 2);
    assert_eq!(seen["burst"], 5.0);
    assert_eq!(seen["next_check"], "allowed");
    assert_eq!(seen["key"][0], "acme", "the operator sees the key itself");
    assert!(again["tokens"].as_f64().unwrap() >= tokens);
    assert_eq!(again["remaining"], 2);

    // The next check, on another instance, draws from that very bucket.
    let next = check_key(&fleet[0], "acme");
    assert_eq!(next.status, 200);
    assert_eq!(next.header("x-ratelimit-remaining"), Some("1"));
    let reset_after: u64 = next.header("x-ratelimit-reset").unwrap().parse().unwrap();
    let full_in = seen["full_in_s"].as_u64().unwrap();
    assert!(
        reset_after.abs_diff(full_in + 60) <= 1,
        "{reset_after} vs {full_in}"
    );

    let drained = check_key(&fleet[0], "acme");
    assert_eq!(drained.header("x-ratelimit-remaining"), Some("0"));
    let empty = peek(&fleet[2], "per-key", &["acme"], None);
    assert_eq!(empty["remaining"], 0);
    assert_eq!(empty["next_check"], "denied");
    assert_eq!(check_key(&fleet[1], "acme").status, 429);

    // Scripts flushed (as by a Redis restart): the peek reloads its script, like a check.
    redis.cli(&["SCRIPT", "FLUSH"]);
    assert_eq!(peek(&fleet[0], "per-key", &["acme"], None)["remaining"], 0);

    // An overridden key: its own numbers, said so.
    let vip = peek(&fleet[0], "per-key", &["vip"], None);
    assert_eq!(vip["burst"], 50.0);
    assert_eq!(vip["override"]["burst"], 50);
}

#[test]
fn a_reset_is_obeyed_by_every_instance_s_deny_cache_at_the_next_check() {
    let redis = RedisServer::start();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(&redis, QUIET_POLL, LIMITS)
    );
    let fleet: Vec<Tollgate> = (0..3).map(|_| Tollgate::start(&config)).collect();
    commandstats::wait_for_start_up_polls(&redis, 3);
    wait_for_listeners(&redis, 3);

    // A cached denial lasts at most a second (`MAX_WINDOW_US`) from the call that taught it:
    // the scenario proves something only when the checks after the reset come within that
    // second of the caches' lessons. On a starved machine it may not; then it runs again.
    for attempt in 0..10 {
        let key = format!("flooder-{attempt}");
        for _ in 0..4 {
            assert_eq!(check_key(&fleet[0], &key).status, 200);
        }
        // The fifth check empties the bucket, and teaches the first instance's cache.
        let learned = Instant::now();
        assert_eq!(check_key(&fleet[0], &key).status, 200);
        // Every instance learns the denial from Redis, then answers it from its cache.
        for tollgate in &fleet {
            assert_eq!(check_key(tollgate, &key).status, 429);
        }
        let calls = commandstats::script_calls(&redis);
        for tollgate in &fleet {
            assert_eq!(check_key(tollgate, &key).status, 429);
        }
        let spent = commandstats::script_calls(&redis) - calls;
        if learned.elapsed() >= CACHED_WINDOW {
            eprintln!("attempt {attempt}: the caches' lessons expired before the count");
            continue;
        }
        assert_eq!(spent, 0, "every instance's deny cache answered");

        let path = format!("/v1/buckets/per-key{}", query(&[&key]));
        let reset = admin_call(&fleet[0], "DELETE", &path, Some(BEARER));
        assert_eq!(reset.status, 200, "{}", reset.body);
        assert_eq!(json(&reset.body)["was_full"], false);
        // The instance that reset the bucket forgets it before answering; the others as soon
        // as they hear of it on the reset channel, which a starved machine may delay.
        assert_eq!(
            check_key(&fleet[0], &key).status,
            200,
            "the resetter denied"
        );
        let mut waits = Vec::new();
        for tollgate in &fleet[1..] {
            let asked = Instant::now();
            crate::support::wait_until(CACHED_WINDOW.saturating_sub(learned.elapsed()), || {
                check_key(tollgate, &key).status == 200
            });
            waits.push(asked.elapsed());
        }
        // Allowed before the cached denials expired: the reset made them go.
        if learned.elapsed() < CACHED_WINDOW {
            eprintln!("allowed after the reset within {waits:?} (attempt {attempt})");
            return;
        }
        eprintln!(
            "attempt {attempt}: an instance still denied {learned:?} after its lesson",
            learned = learned.elapsed()
        );
    }
    panic!(
        "no attempt saw every instance obey the reset within a second of its cached denial: \
         the reset went unheard, or the machine never ran the scenario that fast"
    );
}

#[test]
fn on_the_memory_store_a_peek_and_a_reset_work_alike() {
    let limits = LIMITS.replace(
        "[[exempt]]",
        &format!("admin_token = \"{TOKEN}\"\n[[exempt]]"),
    );
    let tollgate = Tollgate::start(&limits);
    for _ in 0..5 {
        assert_eq!(check_key(&tollgate, "acme").status, 200);
    }
    let empty = peek(&tollgate, "per-key", &["acme"], None);
    assert_eq!(empty["remaining"], 0);
    assert_eq!(empty["next_check"], "denied");
    assert_eq!(check_key(&tollgate, "acme").status, 429);
    let path = format!("/v1/buckets/per-key{}", query(&["acme"]));
    assert_eq!(admin_call(&tollgate, "DELETE", &path, None).status, 401);
    assert_eq!(check_key(&tollgate, "acme").status, 429);
    let reset = admin_call(&tollgate, "DELETE", &path, Some(BEARER));
    assert_eq!(reset.status, 200, "{}", reset.body);
    let full = peek(&tollgate, "per-key", &["acme"], None);
    assert_eq!(full["remaining"], 5);
    let next = check_key(&tollgate, "acme");
    assert_eq!(next.status, 200);
    assert_eq!(next.header("x-ratelimit-remaining"), Some("4"));
}

/// A multi-process Redis: second tier (see `e2e` below).
#[cfg(feature = "e2e")]
fn on_a_cluster_a_peek_and_a_reset_reach_the_bucket_s_node_and_every_instance() {
    let cluster = crate::support::cluster::RedisCluster::start();
    let seeds = cluster.seeds();
    let config = |seeds: &[String]| {
        let seeds: Vec<String> = seeds.iter().map(|s| format!("\"{s}\"")).collect();
        format!(
            "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ncluster = [{}]\n\
             timeout_ms = 2000\n\n[[limits]]\nname = \"per-key\"\nrate = \"1/min\"\nburst = 3\n\
             key = [\"header:x-api-key\"]\n",
            seeds.join(", ")
        )
    };
    // Each listens to the first seed it is given: two different nodes.
    let reversed: Vec<String> = seeds.iter().rev().cloned().collect();
    let fleet = [
        Tollgate::start(&config(&seeds)),
        Tollgate::start(&config(&reversed)),
    ];
    let listening = || {
        let on_every_node = seeds.iter().map(|seed| {
            let port = seed
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap();
            crate::support::redis_cli(port, &["PUBSUB", "NUMSUB", "tollgate:resets"])
                .unwrap_or_default()
        });
        on_every_node
            .filter_map(|out| {
                out.lines()
                    .nth(1)
                    .and_then(|n| n.trim().parse::<usize>().ok())
            })
            .sum::<usize>()
            == 2
    };
    assert!(
        crate::support::wait_until(Duration::from_secs(10), listening),
        "not subscribed"
    );

    for attempt in 0..5 {
        let key = format!("flooder-{attempt}");
        for _ in 0..3 {
            assert_eq!(check_key(&fleet[0], &key).status, 200);
        }
        let learned = Instant::now();
        for tollgate in &fleet {
            assert_eq!(check_key(tollgate, &key).status, 429);
            assert_eq!(check_key(tollgate, &key).status, 429);
        }
        assert_eq!(peek(&fleet[1], "per-key", &[&key], None)["remaining"], 0);
        let path = format!("/v1/buckets/per-key{}", query(&[&key]));
        let reset = admin_call(&fleet[0], "DELETE", &path, Some(BEARER));
        assert_eq!(reset.status, 200, "{}", reset.body);
        for tollgate in &fleet {
            let allowed = crate::support::wait_until(Duration::from_millis(150), || {
                check_key(tollgate, &key).status == 200
            });
            assert!(allowed, "an instance still denied after the reset");
        }
        assert_eq!(peek(&fleet[1], "per-key", &[&key], None)["remaining"], 1);
        if learned.elapsed() < Duration::from_millis(900) {
            return;
        }
    }
    panic!("the machine never ran the scenario within a second");
}

/// A multi-process Redis: second tier (see `e2e` below).
#[cfg(feature = "e2e")]
fn behind_sentinel_a_peek_and_a_reset_reach_the_master_and_every_instance() {
    use crate::support::cluster::{SentinelSetup, MASTER_NAME};
    let setup = SentinelSetup::start();
    let urls: Vec<String> = setup.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ntimeout_ms = 2000\n\
         sentinel = {{ master = \"{MASTER_NAME}\", urls = [{}] }}\n\n[[limits]]\n\
         name = \"per-key\"\nrate = \"1/min\"\nburst = 3\nkey = [\"header:x-api-key\"]\n",
        urls.join(", ")
    );
    let fleet = [Tollgate::start(&config), Tollgate::start(&config)];
    wait_for_listeners(&setup.master, 2);
    for _ in 0..3 {
        assert_eq!(check_key(&fleet[0], "acme").status, 200);
    }
    for tollgate in &fleet {
        assert_eq!(check_key(tollgate, "acme").status, 429);
    }
    assert_eq!(peek(&fleet[1], "per-key", &["acme"], None)["remaining"], 0);
    let path = format!("/v1/buckets/per-key{}", query(&["acme"]));
    assert_eq!(
        admin_call(&fleet[1], "DELETE", &path, Some(BEARER)).status,
        200
    );
    for tollgate in &fleet {
        let allowed = crate::support::wait_until(Duration::from_millis(150), || {
            check_key(tollgate, "acme").status == 200
        });
        assert!(allowed, "an instance still denied after the reset");
    }
}

#[test]
fn the_reset_channel_survives_its_keep_alive_pings() {
    // The subscriber pings Redis every `reset_ping_every` (5 s; here 500 ms) to notice a dead
    // connection. A ping it misreads would drop the channel each time, and with it every
    // cached denial.
    let redis = RedisServer::start();
    let config = redis_config(&redis, "", LIMITS);
    let _tollgate = Tollgate::start_with_env(&config, &[SHORT_TIMINGS]);
    wait_for_listeners(&redis, 1);
    let subscriber = || redis.cli(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    let fields = |list: &str, name: &str| -> Vec<String> {
        list.split_whitespace()
            .filter_map(|field| field.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_string)
            .collect()
    };
    let first = subscriber();
    // Two pings and a margin (production's 11.5 s over 5 s pings, scaled).
    let ping_every = short_timings().reset_ping_every;
    std::thread::sleep(ping_every * 23 / 10);
    let after = subscriber();
    let ages: Vec<u64> = fields(&after, "age")
        .iter()
        .filter_map(|age| age.parse().ok())
        .collect();
    assert_eq!(ages.len(), 1, "one subscriber: {after}");
    assert!(ages[0] >= 1, "resubscribed since: {after}");
    assert_eq!(
        fields(&after, "id"),
        fields(&first, "id"),
        "resubscribed: {after}"
    );
    assert_eq!(fields(&after, "cmd"), ["ping"], "it pinged: {after}");
}

#[test]
fn an_instance_that_lost_the_reset_channel_forgets_its_cached_denials_when_back() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&redis_config(&redis, QUIET_POLL, LIMITS));
    commandstats::wait_for_start_up_polls(&redis, 1);
    wait_for_listeners(&redis, 1);
    // As above: only a scenario run within a second of the cache's lesson proves anything.
    for attempt in 0..10 {
        let key = format!("flooder-{attempt}");
        for _ in 0..4 {
            check_key(&tollgate, &key);
        }
        // The fifth check empties the bucket, and teaches the cache.
        let learned = Instant::now();
        check_key(&tollgate, &key);
        assert_eq!(check_key(&tollgate, &key).status, 429);
        let calls = commandstats::script_calls(&redis);
        assert_eq!(check_key(&tollgate, &key).status, 429);
        let spent = commandstats::script_calls(&redis) - calls;
        if learned.elapsed() >= CACHED_WINDOW {
            eprintln!("attempt {attempt}: the cache's lesson expired before the count");
            continue;
        }
        assert_eq!(spent, 0, "the cache answered");
        // A reset this instance cannot hear: its subscription is cut, the bucket deleted.
        redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        redis.cli(&["DEL", &format!("tollgate:per-key:{{{key}}}")]);
        wait_for_listeners(&redis, 1);
        // Subscribed again, the instance forgets what it cached, just after Redis counts the
        // subscription: poll, within the cached window.
        crate::support::wait_until(CACHED_WINDOW.saturating_sub(learned.elapsed()), || {
            check_key(&tollgate, &key).status == 200
        });
        if learned.elapsed() < CACHED_WINDOW {
            return;
        }
        eprintln!(
            "attempt {attempt}: still denied {:?} after the lesson",
            learned.elapsed()
        );
    }
    panic!(
        "no attempt saw the instance forget its cached denial within a second of learning it: \
         it kept it, or the machine never ran the scenario that fast"
    );
}

/// Second tier (`cargo test --features e2e`): tests that start more than one Redis process.
/// One module, so scripts/test.sh runs exactly these by `e2e::`.
#[cfg(feature = "e2e")]
mod e2e {
    #[test]
    fn on_a_cluster_a_peek_and_a_reset_reach_the_bucket_s_node_and_every_instance() {
        super::on_a_cluster_a_peek_and_a_reset_reach_the_bucket_s_node_and_every_instance();
    }

    #[test]
    fn behind_sentinel_a_peek_and_a_reset_reach_the_master_and_every_instance() {
        super::behind_sentinel_a_peek_and_a_reset_reach_the_master_and_every_instance();
    }
}
