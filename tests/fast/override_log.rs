//! How instances follow runtime overrides in Redis: by the change log, reading only the
//! entries changed since the version they hold, and the whole limit only when the log cannot
//! tell (a trimmed log, a change an older release made). A real Redis, real instances, and
//! Redis's own `MONITOR` to see which commands each catch-up runs.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::admin_overrides::{self, TOKEN};
use crate::support::http::admin_json;
use crate::support::{redis_config, wait_until, RedisServer, Tollgate, QUIET_POLL};

const LIMITS: &str = r#"
[[limits]]
name = "tight"
rate = 0.001
burst = 2
key = ["header:x-api-key"]
"#;
const HASH: &str = "tollgate:{tollgate:overrides}:limit:tight";
const LOG: &str = "tollgate:{tollgate:overrides}:log:tight";
const FLOOR: &str = "tollgate:{tollgate:overrides}:floor:tight";
const VERSIONS: &str = "tollgate:{tollgate:overrides}:versions";

fn start(redis: &RedisServer, store: &str) -> Tollgate {
    Tollgate::start(&format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(redis, store, LIMITS)
    ))
}

fn put(tollgate: &Tollgate, key: &str, body: &str) {
    let answer = admin_overrides::put(tollgate, "tight", key, body);
    assert_eq!(answer.status, 200, "{answer:?}");
}

fn delete(tollgate: &Tollgate, key: &str) {
    let path = format!("/v1/overrides/tight?key={key}");
    let answer = admin_json(tollgate.admin, "DELETE", &path, Some(TOKEN), "");
    assert!(matches!(answer.status, 200 | 204), "{answer:?}");
}

/// The keys `tollgate` holds overrides of `tight` for, sorted.
fn keys_on(tollgate: &Tollgate) -> Vec<String> {
    admin_overrides::keys_on(tollgate, "tight")
}

fn sorted(keys: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    keys.sort();
    keys
}

/// Every command Redis runs while it lives, scripts' own included (`redis-cli MONITOR`).
struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(redis: &RedisServer) -> Monitor {
        let mut child = Command::new(crate::support::store_binary("cli"))
            .args(["-p", &redis.port.to_string(), "MONITOR"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli MONITOR");
        let stdout = child.stdout.take().expect("piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().expect("not poisoned").push(line);
            }
        });
        let monitor = Monitor { child, lines };
        // MONITOR answers OK once it listens; a PING after that shows up in it.
        assert!(
            wait_until(Duration::from_secs(5), || {
                redis.cli(&["PING"]);
                monitor.saw(|line| line.contains("\"PING\""))
            }),
            "MONITOR did not start"
        );
        monitor
    }

    fn saw(&self, what: impl Fn(&str) -> bool) -> bool {
        self.count(what) > 0
    }

    fn count(&self, what: impl Fn(&str) -> bool) -> usize {
        let lines = self.lines.lock().expect("not poisoned");
        lines.iter().filter(|line| what(line)).count()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn reads_whole_limit(line: &str) -> bool {
    line.contains("\"HGETALL\"") && line.contains(HASH)
}

#[test]
fn every_instance_follows_a_change_by_reading_only_what_changed() {
    let redis = RedisServer::start();
    let [a, b, c] = [(); 3].map(|_| start(&redis, ""));
    let seeded: Vec<String> = (0..40).map(|i| format!("seed-{i}")).collect();
    for key in &seeded {
        put(&a, key, r#"{"burst": 5}"#);
    }
    let mut expected: Vec<&str> = seeded.iter().map(String::as_str).collect();
    assert!(
        wait_until(Duration::from_secs(5), || [&a, &b, &c]
            .iter()
            .all(|t| keys_on(t) == sorted(&expected))),
        "all three hold the 40 seeded entries"
    );

    let monitor = Monitor::start(&redis);
    put(&a, "new-1", r#"{"burst": 7}"#);
    put(&b, "new-2", r#"{"unlimited": true}"#);
    put(&c, "seed-3", r#"{"burst": 9}"#);
    delete(&a, "seed-4");
    delete(&b, "seed-5");
    expected.retain(|k| !["seed-4", "seed-5"].contains(k));
    expected.extend(["new-1", "new-2"]);
    assert!(
        wait_until(Duration::from_secs(5), || [&a, &b, &c]
            .iter()
            .all(|t| keys_on(t) == sorted(&expected))),
        "every change reaches all three: {:?}",
        keys_on(&c)
    );
    assert_eq!(
        monitor.count(reads_whole_limit),
        0,
        "no instance read the whole limit to follow five changes"
    );
    assert!(
        monitor.saw(|line| line.contains("\"HMGET\"") && line.contains(HASH)),
        "the changed entries were read one by one"
    );
}

#[test]
fn a_change_an_older_release_made_is_read_with_the_whole_limit() {
    let redis = RedisServer::start();
    let [a, b] = [(); 2].map(|_| start(&redis, ""));
    put(&a, "first", r#"{"burst": 5}"#);
    assert!(wait_until(Duration::from_secs(5), || keys_on(&b) == ["first"]));

    // An older release writes an entry and moves the version, with no trace in the log; one
    // of its entries expires soon, with no place in the expiry index.
    let version: i64 = redis
        .cli(&["HGET", VERSIONS, "tight"])
        .trim()
        .parse()
        .unwrap();
    let now_ms: i64 = redis
        .cli(&["TIME"])
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse::<i64>()
        .unwrap()
        * 1000;
    redis.cli(&["HSET", HASH, "old", r#"{"k":["old"],"u":true}"#]);
    let brief = format!(r#"{{"x":{},"k":["brief"],"u":true}}"#, now_ms + 3_000);
    redis.cli(&["HSET", HASH, "brief", &brief]);
    redis.cli(&["HSET", VERSIONS, "tight", &(version + 1).to_string()]);

    assert!(
        wait_until(Duration::from_secs(5), || keys_on(&b)
            == ["brief", "first", "old"]),
        "b reads the whole limit: {:?}",
        keys_on(&b)
    );
    assert!(
        wait_until(Duration::from_secs(10), || redis
            .cli(&["HEXISTS", HASH, "brief"])
            .trim()
            == "0"),
        "the older release's expiring entry was indexed and is dropped from the store on time"
    );
    assert!(wait_until(Duration::from_secs(5), || keys_on(&b) == ["first", "old"]));
}

#[test]
fn an_instance_behind_a_trimmed_log_reads_the_whole_limit() {
    let redis = RedisServer::start();
    let a = start(&redis, "");
    // b polls rarely: it catches up only after its own writes.
    let b = start(&redis, QUIET_POLL);
    put(&b, "first", r#"{"burst": 5}"#);
    assert_eq!(keys_on(&b), ["first"]);

    put(&a, "while-away-1", r#"{"burst": 6}"#);
    put(&a, "while-away-2", r#"{"burst": 7}"#);
    // The log is trimmed past the first change b missed, as a log of twice the cap would be.
    let popped = redis.cli(&["ZPOPMIN", LOG, "2"]);
    let newest_popped = popped.lines().last().unwrap().trim().to_string();
    assert!(popped.contains("while-away-1"), "{popped}");
    redis.cli(&["SET", FLOOR, &newest_popped]);

    put(&b, "back", r#"{"burst": 8}"#);
    assert_eq!(
        keys_on(&b),
        ["back", "first", "while-away-1", "while-away-2"],
        "b cannot tell what changed from the log: it reads the whole limit"
    );
}

/// The log and the history keep at most twice the cap; past it the oldest go and the floor
/// moves to the newest version trimmed. Run on the scripts themselves, the last with a cap of 2.
#[test]
fn the_change_log_is_trimmed_past_twice_the_cap_and_the_floor_follows() {
    let redis = RedisServer::start();
    let with_log = |script: &str| format!("{}{script}", include_str!("../../lua/override_log.lua"));
    let history = "tollgate:{tollgate:overrides}:history:tight";
    let expiries = "tollgate:{tollgate:overrides}:expiries:tight";
    let epoch = "tollgate:{tollgate:overrides}:epoch";
    let keys = [VERSIONS, HASH, LOG, expiries, FLOOR, history, epoch];
    let run = |script: &str, args: &[&str]| {
        let mut command = vec!["EVAL", script, "7"];
        command.extend(keys);
        command.push("tight");
        command.extend(args);
        redis.cli(&command)
    };
    let put = with_log(include_str!("../../lua/override_put.lua"));
    let versions: Vec<String> = (0..5)
        .map(|i| {
            let tail = format!("k{i}");
            let reply = run(
                &put,
                &[&tail, &format!(r#"{{"k":["{tail}"]}}"#), "0", "100"],
            );
            reply.lines().last().unwrap().trim().to_string()
        })
        .collect();
    assert_eq!(
        redis.cli(&["ZCARD", LOG]).trim(),
        "5",
        "below twice the cap of 100"
    );
    assert_eq!(redis.cli(&["GET", FLOOR]).trim(), "", "nothing trimmed yet");

    // One more change, under a cap of 2: the log (5 tails) and the history (6 versions) are
    // past 4, and keep their newest 2.
    run(
        &with_log(include_str!("../../lua/override_delete.lua")),
        &["k0", "2"],
    );
    assert_eq!(redis.cli(&["ZRANGE", LOG, "0", "-1"]).trim(), "k4\nk0");
    assert_eq!(redis.cli(&["ZCARD", history]).trim(), "2");
    assert_eq!(
        redis.cli(&["GET", FLOOR]).trim(),
        versions[3],
        "the floor is the newest version trimmed"
    );
}
