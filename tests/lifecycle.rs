//! SPEC §8 with real processes: SIGTERM drains what is in flight and exits 0; SIGHUP reloads
//! the config file atomically, and a broken file keeps the running limits.

mod support;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use support::{HttpClient, RedisServer, Tollgate};

const CHECK: &[(&str, &str)] = &[("x-forwarded-for", "203.0.113.7")];

/// A Redis-backed config whose store budget outlasts a `CLIENT PAUSE`, so paused checks stay
/// in flight instead of failing over to `on_error`.
fn patient_redis_config(redis: &RedisServer) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 5000\n\n\
         [[limits]]\nname = \"per-ip\"\nrate = 1000\nburst = 100000\nkey = [\"ip\"]\n",
        redis.url()
    )
}

#[test]
fn sigterm_finishes_checks_in_flight_and_exits_zero() {
    let redis = RedisServer::start();
    let mut tollgate = Tollgate::start(&patient_redis_config(&redis));
    const CLIENTS: usize = 16;
    // Connected and warmed up (script loaded) before Redis is paused.
    let clients: Vec<HttpClient> = (0..CLIENTS)
        .map(|_| {
            let mut client = tollgate.client();
            assert_eq!(client.get("/check", CHECK).unwrap().status, 200);
            client
        })
        .collect();

    redis.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let sent = Arc::new(Barrier::new(CLIENTS + 1));
    let threads: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            let sent = sent.clone();
            thread::spawn(move || {
                sent.wait();
                let answer = client.get("/check", CHECK);
                (answer, Instant::now())
            })
        })
        .collect();
    sent.wait();
    // Give every request time to reach tollgate and block on the paused Redis.
    thread::sleep(Duration::from_millis(300));
    let terminated = Instant::now();
    tollgate.signal("TERM");

    // Nothing new is served once the signal is handled; the old checks still finish.
    thread::sleep(Duration::from_millis(500));
    let late = HttpClient::connect(tollgate.addr).and_then(|mut c| c.get("/check", CHECK));
    assert!(late.is_err(), "a connection made after SIGTERM was served");
    for thread in threads {
        let (answer, at) = thread.join().unwrap();
        let response = answer.expect("a check in flight at SIGTERM got a full response");
        assert_eq!(response.status, 200);
        assert!(response.header("ratelimit").is_some());
        assert!(at > terminated, "the check was answered before SIGTERM");
    }
    let code = tollgate.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(0), "exit after draining");
    assert!(terminated.elapsed() < Duration::from_secs(10));
}

#[test]
fn sigterm_under_keepalive_load_answers_every_request_sent() {
    let redis = RedisServer::start();
    let mut tollgate = Tollgate::start(&patient_redis_config(&redis));
    let addr = tollgate.addr;
    const CLIENTS: usize = 32;
    // Each client sends on one keep-alive connection until the server says `Connection:
    // close`. A request written and then met by a closed or reset connection is lost: that
    // is what an ingress sees as a failed auth subrequest.
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            thread::spawn(move || {
                let mut client = HttpClient::connect(addr).unwrap();
                let (mut answered, mut lost) = (0u32, Vec::new());
                loop {
                    match client.get("/check", CHECK) {
                        Ok(response) => {
                            if response.status == 200 {
                                answered += 1;
                            } else {
                                lost.push(format!("status {}", response.status));
                            }
                            // The server's way to end a keep-alive connection cleanly.
                            if response.header("connection") == Some("close") {
                                break;
                            }
                        }
                        // Written but never answered (reset, or closed without a word).
                        Err(error) => {
                            lost.push(error.to_string());
                            break;
                        }
                    }
                }
                (answered, lost)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    let terminated = Instant::now();
    tollgate.signal("TERM");
    let code = tollgate.wait_exit(Duration::from_secs(12));
    let exited_after = terminated.elapsed();

    let mut answered = 0;
    for thread in threads {
        let (count, lost) = thread.join().unwrap();
        assert!(lost.is_empty(), "requests lost at shutdown: {lost:?}");
        answered += count;
    }
    assert!(
        answered > CLIENTS as u32,
        "the load ran ({answered} checks)"
    );
    assert_eq!(code, Some(0));
    assert!(
        exited_after < Duration::from_secs(11),
        "took {exited_after:?}"
    );
}

fn limited_config(redis: &RedisServer, rate: f64, burst: u32) -> String {
    support::redis_config(
        redis,
        "",
        &format!("[[limits]]\nname = \"per-ip\"\nrate = {rate}\nburst = {burst}\nkey = [\"ip\"]\n"),
    )
}

/// Replaces the file the way a ConfigMap update or an editor's save does: write, then rename.
fn replace_file(path: &std::path::Path, contents: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, contents).unwrap();
    std::fs::rename(&next, path).unwrap();
}

fn reloads(tollgate: &Tollgate, result: &str) -> f64 {
    tollgate.metric(&format!(
        "tollgate_config_reloads_total{{result=\"{result}\"}}"
    ))
}

#[test]
fn sighup_applies_a_changed_rate_and_burst_to_the_next_request() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&limited_config(&redis, 1.0, 5));
    let mut client = tollgate.client();
    let before = client.get("/check", CHECK).unwrap();
    assert_eq!(
        before.header("ratelimit-policy"),
        Some("\"per-ip\";q=5;w=5")
    );
    assert_eq!(before.header("x-ratelimit-limit"), Some("5"));

    replace_file(&tollgate.config_path, &limited_config(&redis, 10.0, 50));
    tollgate.signal("HUP");
    assert!(support::wait_until(Duration::from_secs(5), || reloads(
        &tollgate, "success"
    ) == 1.0));

    // Same keep-alive connection, same bucket: only the limit changed.
    let after = client.get("/check", CHECK).unwrap();
    assert_eq!(after.status, 200);
    assert_eq!(
        after.header("ratelimit-policy"),
        Some("\"per-ip\";q=50;w=5")
    );
    assert_eq!(after.header("x-ratelimit-limit"), Some("50"));
    assert_eq!(reloads(&tollgate, "failure"), 0.0);
}

#[test]
fn sighup_with_a_broken_file_keeps_the_running_limits_and_counts_a_failure() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&limited_config(&redis, 0.1, 5));
    // One token per 10 s: the denial below cannot expire while the reloads happen.
    let mut client = tollgate.client();
    for _ in 0..5 {
        assert_eq!(client.get("/check", CHECK).unwrap().status, 200);
    }
    assert_eq!(client.get("/check", CHECK).unwrap().status, 429);

    for broken in [
        limited_config(&redis, 0.0, 50),  // rate must be > 0
        "[[limits]\nname = ".to_string(), // not TOML
    ] {
        let failures = reloads(&tollgate, "failure");
        replace_file(&tollgate.config_path, &broken);
        tollgate.signal("HUP");
        assert!(support::wait_until(Duration::from_secs(5), || reloads(
            &tollgate, "failure"
        ) == failures
            + 1.0));
        let still = client.get("/check", CHECK).unwrap();
        assert_eq!(still.status, 429, "the old limit still applies");
        assert_eq!(
            still.header("ratelimit-policy"),
            Some("\"per-ip\";q=5;w=50")
        );
    }
    assert_eq!(reloads(&tollgate, "success"), 0.0);
}

fn prefixed_config(redis: &RedisServer, prefix: &str, burst: u32) -> String {
    support::redis_config(
        redis,
        &format!("timeout_ms = 2000\nkey_prefix = \"{prefix}\"\n"),
        &format!("[[limits]]\nname = \"per-ip\"\nrate = 0.1\nburst = {burst}\nkey = [\"ip\"]\n"),
    )
}

#[test]
fn sighup_never_changes_the_key_prefix_so_a_drained_client_stays_denied() {
    let redis = RedisServer::start();
    let (tollgate, log) = Tollgate::start_logged(&prefixed_config(&redis, "before", 3), &[]);
    let mut client = tollgate.client();
    // One token per 10 s: the drained bucket cannot refill during the test.
    for _ in 0..3 {
        assert_eq!(client.get("/check", CHECK).unwrap().status, 200);
    }
    assert_eq!(client.get("/check", CHECK).unwrap().status, 429);

    // A new prefix and a new burst in one file: the burst applies, the prefix waits for a restart.
    replace_file(&tollgate.config_path, &prefixed_config(&redis, "after", 4));
    tollgate.signal("HUP");
    assert!(support::wait_until(Duration::from_secs(5), || reloads(
        &tollgate, "success"
    ) == 1.0));

    let after = client.get("/check", CHECK).unwrap();
    assert_eq!(
        after.status, 429,
        "a reload must not hand out fresh buckets"
    );
    assert_eq!(after.header("x-ratelimit-limit"), Some("4"));
    assert_eq!(
        after.header("ratelimit-policy"),
        Some("\"per-ip\";q=4;w=40")
    );
    assert_eq!(redis.cli(&["KEYS", "after:*"]).trim(), "");
    assert_ne!(redis.cli(&["KEYS", "before:*"]).trim(), "");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("[store] changed in the file; it applies only after a restart"),
        "{logged}"
    );
}
