//! The admin API against real processes: `GET /v1/limits`, and `GET`/`DELETE /v1/buckets` on
//! three instances sharing one real Redis with their deny caches on, on the memory store, with
//! and without an admin token, and under hostile query strings.

use std::time::{Duration, Instant};

use crate::support::{
    commandstats, redis_config, short_timings, tollgate_command, HttpClient, RedisServer, Tollgate,
    QUIET_POLL, SHORT_TIMINGS,
};

const TOKEN: &str = "s3cr3t-admin-token-for-tests";
const BEARER: &str = "Bearer s3cr3t-admin-token-for-tests";

/// One token a minute: within a test, buckets change only by checks and resets.
const LIMITS: &str = r#"
[[exempt]]
name = "office"
cidrs = ["10.9.0.0/16"]

[[limits]]
name = "per-key"
rate = "1/min"
burst = 5
key = ["header:x-api-key"]
[[limits.overrides]]
key = ["vip"]
rate = "100/s"
burst = 50

[[limits]]
name = "per-ip"
rate = "1/min"
burst = 1000
key = ["ip"]
"#;

/// How long after the call that taught it a cached denial surely still denies: the cache's
/// `MAX_WINDOW_US` (a second), less a margin for the clock readings around it.
const CACHED_WINDOW: Duration = Duration::from_millis(900);

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// `?key=v1&key=v2`, each value percent-encoded but for unreserved characters.
fn query(values: &[&str]) -> String {
    let encoded: Vec<String> = values
        .iter()
        .map(|value| {
            let mut out = String::from("key=");
            for byte in value.bytes() {
                if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                    out.push(char::from(byte));
                } else {
                    out.push_str(&format!("%{byte:02X}"));
                }
            }
            out
        })
        .collect();
    format!("?{}", encoded.join("&"))
}

fn admin_call(
    tollgate: &Tollgate,
    method: &str,
    path: &str,
    auth: Option<&str>,
) -> crate::support::Response {
    let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
    HttpClient::connect(tollgate.admin)
        .and_then(|mut c| c.request(method, path, &headers))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn peek(tollgate: &Tollgate, limit: &str, key: &[&str], auth: Option<&str>) -> serde_json::Value {
    let answer = admin_call(
        tollgate,
        "GET",
        &format!("/v1/buckets/{limit}{}", query(key)),
        auth,
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    json(&answer.body)
}

fn check_key(tollgate: &Tollgate, key: &str) -> crate::support::Response {
    tollgate.check(&[("x-api-key", key), ("x-forwarded-for", "192.0.2.50")])
}

/// A bucket as Redis holds it, `"<debt> <ts>"` (empty when absent).
fn stored(redis: &RedisServer, key: &str) -> String {
    redis.cli(&["GET", key]).trim().to_string()
}

/// Waits until `count` instances listen on the reset channel.
fn wait_for_listeners(redis: &RedisServer, count: usize) {
    let listening = || {
        let out = redis.cli(&["PUBSUB", "NUMSUB", "tollgate:resets"]);
        out.lines()
            .nth(1)
            .and_then(|n| n.trim().parse::<usize>().ok())
            == Some(count)
    };
    assert!(
        crate::support::wait_until(Duration::from_secs(10), listening),
        "{count} instances never subscribed to the reset channel"
    );
}

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
fn without_the_token_nothing_changes() {
    let redis = RedisServer::start();
    let bucket = "tollgate:per-key:{acme}";
    let open = Tollgate::start(&redis_config(&redis, "", LIMITS));
    let guarded = Tollgate::start_with_env(
        &redis_config(&redis, "", LIMITS),
        &[("TOLLGATE_ADMIN_TOKEN", TOKEN)],
    );
    for _ in 0..5 {
        check_key(&open, "acme");
    }
    let before = stored(&redis, bucket);
    assert!(!before.is_empty());
    let path = format!("/v1/buckets/per-key{}", query(&["acme"]));

    for auth in [None, Some(BEARER), Some("Bearer wrong")] {
        let refused = admin_call(&open, "DELETE", &path, auth);
        assert_eq!(refused.status, 403, "{}", refused.body);
        assert!(refused.body.contains("admin_token"), "{}", refused.body);
    }
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Basic czNjcjN0"),
        Some("Bearer "),
    ] {
        let refused = admin_call(&guarded, "DELETE", &path, auth);
        assert_eq!(refused.status, 401, "{auth:?}: {}", refused.body);
    }
    // Refused before the query is read: hostile ones are refused the same way.
    let hostile = admin_call(&guarded, "DELETE", "/v1/buckets/nope?key=%zz", None);
    assert_eq!(hostile.status, 401);
    assert_eq!(
        stored(&redis, bucket),
        before,
        "a refused reset changed the bucket"
    );
    assert_eq!(check_key(&open, "acme").status, 429);

    let done = admin_call(&guarded, "DELETE", &path, Some(BEARER));
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(stored(&redis, bucket), "");
    assert_eq!(check_key(&open, "acme").status, 200);
}

#[test]
fn anonymous_readers_see_fingerprints_of_keys_and_addresses_as_they_are() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start_with_env(
        &redis_config(&redis, "", LIMITS),
        &[("TOLLGATE_ADMIN_TOKEN", TOKEN)],
    );
    let secret = "sk_live_customer_secret";
    let hidden = peek(&tollgate, "per-key", &[secret], None);
    let fingerprint = hidden["key"][0].as_str().unwrap();
    assert_eq!(fingerprint.len(), 12);
    assert!(fingerprint.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(!hidden.to_string().contains(secret));
    let wrong = peek(&tollgate, "per-key", &[secret], Some("Bearer wrong"));
    assert_eq!(wrong["key"][0], fingerprint);
    assert_eq!(
        peek(&tollgate, "per-key", &[secret], Some(BEARER))["key"][0],
        secret
    );

    for ip in ["203.0.113.7", "2001:db8:1:2::/64"] {
        assert_eq!(peek(&tollgate, "per-ip", &[ip], None)["key"][0], ip);
    }
    // An IPv6 client is keyed by its /64: any address in it names the same bucket.
    tollgate.check(&[("x-forwarded-for", "2001:db8:1:2::99")]);
    let by_network = peek(&tollgate, "per-ip", &["2001:db8:1:2::1"], None);
    assert_eq!(by_network["remaining"], 999);
}

#[test]
fn hostile_queries_get_a_4xx_never_a_5xx() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start_with_env(
        &redis_config(&redis, "", LIMITS),
        &[("TOLLGATE_ADMIN_TOKEN", TOKEN)],
    );
    let huge = format!("?key={}", "A".repeat(100 * 1024));
    #[rustfmt::skip]
    let cases: &[(&str, u16, &str)] = &[
        ("/v1/buckets/nope?key=a", 404, "no limit named"),
        ("/v1/buckets/%FF%00?key=a", 404, ""),
        ("/v1/buckets/per-key", 400, "header:x-api-key"),
        ("/v1/buckets/per-key?key=a&key=b", 400, "1 part(s) [header:x-api-key]"),
        ("/v1/buckets/per-key?key=%zz", 400, "%-escape"),
        ("/v1/buckets/per-key?key=%4", 400, "%-escape"),
        ("/v1/buckets/per-key?key=%FF", 400, "UTF-8"),
        ("/v1/buckets/per-key?limit=x", 400, "unknown parameter"),
        ("/v1/buckets/per-key?key=", 400, "empty"),
        ("/v1/buckets/per-ip?key=not-an-ip", 400, "not an IP address"),
        ("/v1/buckets/per-ip?key=10.0.0.1%2Fx", 400, "not an IP address"),
    ];
    for method in ["GET", "DELETE"] {
        for &(path, status, says) in cases {
            let answer = admin_call(&tollgate, method, path, Some(BEARER));
            assert_eq!(answer.status, status, "{method} {path}: {}", answer.body);
            assert!(
                answer.body.contains(says),
                "{method} {path}: {}",
                answer.body
            );
        }
        // 100 KB of query: refused by the parser or by us, never a 5xx, and the process lives.
        let answer = HttpClient::connect(tollgate.admin).and_then(|mut c| {
            c.request(
                method,
                &format!("/v1/buckets/per-key{huge}"),
                &[("authorization", BEARER)],
            )
        });
        if let Ok(answer) = answer {
            assert!(
                (400..500).contains(&answer.status),
                "{method} huge: {}",
                answer.status
            );
        }
    }
    // A long but acceptable key is hashed like a check's, not refused.
    let long = "k".repeat(4000);
    let peeked = peek(&tollgate, "per-key", &[&long], Some(BEARER));
    assert_eq!(peeked["remaining"], 5);
    check_key(&tollgate, &long);
    assert_eq!(peek(&tollgate, "per-key", &[&long], None)["remaining"], 4);
    // Form-encoded as curl --data-urlencode writes it: `+` a space, `%2B` a plus.
    check_key(&tollgate, "a+b c");
    let curl_style = admin_call(&tollgate, "GET", "/v1/buckets/per-key?key=a%2bb+c", None);
    assert_eq!(
        json(&curl_style.body)["remaining"],
        4,
        "{}",
        curl_style.body
    );
    assert_eq!(
        admin_call(&tollgate, "GET", "/healthz", None).status,
        200,
        "still serving"
    );
}

#[test]
fn the_limits_are_listed_with_override_counts_and_never_the_token() {
    let redis = RedisServer::start();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(&redis, "", LIMITS)
    );
    let (tollgate, log) = Tollgate::start_logged(&config, &[("RUST_LOG", "debug,redis=debug")]);
    let listed = admin_call(&tollgate, "GET", "/v1/limits", Some(BEARER));
    assert_eq!(listed.status, 200);
    let limits = json(&listed.body);
    let per_key = &limits["limits"][0];
    assert_eq!(per_key["name"], "per-key");
    assert_eq!(per_key["rate_per_s"], 1.0 / 60.0);
    assert_eq!(per_key["burst"], 5);
    assert_eq!(per_key["key"][0], "header:x-api-key");
    assert_eq!(per_key["on_missing"], "skip");
    assert_eq!(per_key["overrides"]["file"], 1);
    assert_eq!(limits["limits"][1]["key"][0], "ip");
    assert_eq!(limits["exempt"][0]["name"], "office");
    assert_eq!(limits["exempt"][0]["cidrs"][0], "10.9.0.0/16");
    assert!(!listed.body.contains("vip"), "override keys are not listed");
    let public = tollgate.client().get("/v1/limits", &[]).unwrap();
    assert_eq!(
        public.status, 404,
        "the admin API is not on the public listener"
    );

    // Exercise every admin path once, so each had its chance to log.
    check_key(&tollgate, "acme");
    peek(&tollgate, "per-key", &["acme"], Some(BEARER));
    let path = format!("/v1/buckets/per-key{}", query(&["acme"]));
    admin_call(&tollgate, "DELETE", &path, Some(BEARER));
    admin_call(&tollgate, "DELETE", &path, Some("Bearer wrong"));
    let validate = tollgate_command()
        .args(["validate", "--config"])
        .arg(&tollgate.config_path)
        .output()
        .expect("run validate");
    assert!(validate.status.success());
    let printed = String::from_utf8_lossy(&validate.stdout).into_owned()
        + &String::from_utf8_lossy(&validate.stderr);
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains("reset by the operator"), "{logged}");
    for (place, text) in [
        ("/v1/limits", &listed.body),
        ("validate", &printed),
        ("the log", &logged),
    ] {
        assert!(!text.contains(TOKEN), "the token appears in {place}");
    }
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

/// One request with a chosen `Host` header.
fn with_host(tollgate: &Tollgate, path: &str, host: &str) -> crate::support::Response {
    HttpClient::connect(tollgate.admin)
        .and_then(|mut client| {
            client.send_raw(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        })
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// A page that rebinds its own DNS name to the admin address reaches it with its own name in
/// `Host`: the admin API answers only IP literals, `localhost` and the names configured.
#[test]
fn the_admin_api_refuses_a_host_that_is_not_an_address_or_a_configured_name() {
    let plain = Tollgate::in_process(LIMITS);
    // The router matches the decoded path: a percent-encoded spelling is the same endpoint.
    for path in [
        "/v1/limits",
        "/v1/top",
        "/v1/overrides/per-key",
        "/%761/limits",
        "/v%31/limits",
        "/%76%31/top?window=1m",
        "/%761/buckets/per-key?key=k",
        "/%761/overrides/per-key",
        "/v1%2Flimits",
        "//v1/limits",
    ] {
        let refused = with_host(&plain, path, "rebind.evil.example");
        assert_eq!(refused.status, 421, "{path}: {}", refused.body);
        assert!(refused.body.contains("admin_hosts"), "{}", refused.body);
    }
    for host in ["127.0.0.1", "localhost:9090", "[::1]:9090"] {
        assert_eq!(with_host(&plain, "/v1/limits", host).status, 200, "{host}");
    }
    // Probes and metrics are not the admin API: any Host reaches them.
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(with_host(&plain, path, "rebind.evil.example").status, 200);
    }
    let named = Tollgate::in_process(&format!(
        "admin_hosts = [\"tollgate-admin.ops.svc\"]\n{LIMITS}"
    ));
    assert_eq!(
        with_host(&named, "/v1/limits", "Tollgate-Admin.ops.svc:9090").status,
        200
    );
    assert_eq!(with_host(&named, "/v1/limits", "ops.svc").status, 421);
}

/// The two POST endpoints an application calls, `/report` and `/release`, are the admin API
/// too: a rebinding page's `Host` is refused before the body is read.
#[test]
fn report_and_release_refuse_a_host_that_is_not_an_address_or_a_configured_name() {
    let plain = Tollgate::in_process(LIMITS);
    let post = |path: &str, host: &str| {
        let body = r#"{"lease": "per-key.6b.00000000000000000000000000000001"}"#;
        HttpClient::connect(plain.admin)
            .and_then(|mut client| {
                client.send_raw(
                    format!(
                        "POST {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: \
                         application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
            })
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    };
    for path in [
        "/release",
        "/report",
        "/rel%65ase",
        "/r%65port",
        "/%72eport",
    ] {
        let refused = post(path, "rebind.evil.example");
        assert_eq!(refused.status, 421, "{path}: {}", refused.body);
        assert!(refused.body.contains("admin_hosts"), "{}", refused.body);
        assert_ne!(post(path, "127.0.0.1:9090").status, 421, "{path}");
    }
}

/// Peeks call the store on the connection the readiness probe pings it on: at most a few are
/// in flight, and the rest are answered at once, so a flood of them never queues ahead of
/// the probe.
#[test]
fn admin_reads_in_flight_are_bounded_and_the_rest_answered_at_once() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&redis_config(&redis, "", LIMITS));
    assert_eq!(
        admin_call(&tollgate, "GET", "/v1/buckets/per-key?key=a", None).status,
        200
    );
    redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let answers: Vec<crate::support::Response> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..16)
            .map(|i| {
                let tollgate = &tollgate;
                scope.spawn(move || {
                    admin_call(
                        tollgate,
                        "GET",
                        &format!("/v1/buckets/per-key?key=k{i}"),
                        None,
                    )
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().expect("peek")).collect()
    });
    let busy = answers
        .iter()
        .filter(|a| a.status == 503 && a.body.contains("in flight"))
        .count();
    assert!(busy >= 16 - 8, "answered at once: {busy} of 16");
    assert!(answers
        .iter()
        .filter(|a| a.body.contains("in flight"))
        .all(|a| a.header("retry-after") == Some("1")));
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
