//! Signals with real processes: SIGTERM drains what is in flight and exits 0; SIGHUP reloads
//! the config file atomically, and a broken file keeps the running limits.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{HttpClient, RedisServer, Tollgate};

const CHECK: &[(&str, &str)] = &[("x-forwarded-for", "203.0.113.7")];

/// A Redis-backed config whose store budget outlasts a `CLIENT PAUSE`, so paused checks stay
/// in flight instead of failing over to `on_error`. It does not borrow: a slice taken while
/// warming up would answer the paused checks without Redis.
fn patient_redis_config(redis: &RedisServer) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout_ms = 5000\nborrow = false\n\n\
         [[limits]]\nname = \"per-ip\"\nrate = 1000\nburst = 100000\nkey = [\"ip\"]\n",
        redis.url()
    )
}

#[test]
fn a_client_that_connects_and_waits_before_its_request_is_served() {
    // The public listener hands connections over only once a request has arrived (the kernel
    // holds them until then); one whose request comes late must be served all the same.
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&patient_redis_config(&redis));
    let mut late = HttpClient::connect(tollgate.addr).expect("connect");
    let mut prompt = tollgate.client();
    assert_eq!(prompt.get("/check", CHECK).unwrap().status, 200);
    thread::sleep(Duration::from_millis(2500));
    let answer = late
        .get("/check", CHECK)
        .expect("an answer to the late request");
    assert_eq!(answer.status, 200);
    assert_eq!(prompt.get("/check", CHECK).unwrap().status, 200);
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

/// What became of one `/check` sent on a fresh connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// The kernel refused the connection: the client knows at once to go elsewhere.
    Refused,
    /// A full HTTP response came back.
    Answered,
    /// The request was sent and the connection was reset or closed without a response: the
    /// client cannot tell whether it was counted, and the ingress fails the request.
    Lost,
}

/// One request on a new connection, `Connection: close`, read to the end.
fn check_on_new_connection(addr: std::net::SocketAddr) -> (Attempt, String) {
    use std::io::{Read, Write};
    // Longer than a SYN retransmission, so a dropped SYN ends as refused, not as a timeout.
    let mut stream = match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(stream) => stream,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return (Attempt::Refused, e.to_string())
        }
        Err(e) => return (Attempt::Lost, format!("connect: {e}")),
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(15)));
    let request = format!(
        "GET /check HTTP/1.1\r\nHost: {addr}\r\nX-Forwarded-For: 203.0.113.7\r\n\
         Connection: close\r\n\r\n"
    );
    if let Err(e) = stream.write_all(request.as_bytes()) {
        return (Attempt::Lost, format!("write: {e}"));
    }
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_)
            if answer.starts_with(b"HTTP/1.1 200")
                && answer.windows(4).any(|w| w == b"\r\n\r\n") =>
        {
            (Attempt::Answered, String::new())
        }
        Ok(_) => (
            Attempt::Lost,
            format!("answer: {:?}", String::from_utf8_lossy(&answer)),
        ),
        Err(e) => (Attempt::Lost, format!("read: {e}")),
    }
}

#[test]
fn sigterm_refuses_or_answers_every_new_connection_and_resets_none() {
    let redis = RedisServer::start();
    let mut tollgate = Tollgate::start(&patient_redis_config(&redis));
    let addr = tollgate.addr;
    const CLIENTS: usize = 8;
    // Each client opens a new connection per check, as an ingress without keep-alive to its
    // auth service does, until the door is shut (refused) or the process is gone.
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            thread::spawn(move || {
                let mut seen = Vec::new();
                loop {
                    let (attempt, detail) = check_on_new_connection(addr);
                    seen.push((attempt, detail));
                    if attempt == Attempt::Refused {
                        return (seen, Instant::now());
                    }
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    let terminated = Instant::now();
    tollgate.signal("TERM");
    let code = tollgate.wait_exit(Duration::from_secs(12));
    let exited_after = terminated.elapsed();

    let (mut seen, mut last_refusal) = (Vec::new(), terminated);
    for thread in threads {
        let (attempts, refused_at) = thread.join().unwrap();
        seen.extend(attempts);
        last_refusal = last_refusal.max(refused_at);
    }
    let count = |kind| seen.iter().filter(|(a, _)| *a == kind).count();
    let lost: Vec<&String> = seen
        .iter()
        .filter(|(a, _)| *a == Attempt::Lost)
        .map(|(_, detail)| detail)
        .collect();
    eprintln!(
        "new-connection attempts across SIGTERM: {} answered, {} refused, {} lost; \
         last refusal {:?} after the signal",
        count(Attempt::Answered),
        count(Attempt::Refused),
        lost.len(),
        last_refusal - terminated
    );
    assert!(lost.is_empty(), "requests lost at shutdown: {lost:?}");
    assert!(count(Attempt::Answered) > CLIENTS, "the load ran");
    assert_eq!(
        count(Attempt::Refused),
        CLIENTS,
        "every client was refused in the end"
    );
    assert_eq!(code, Some(0));
    assert!(
        exited_after < Duration::from_secs(11),
        "took {exited_after:?}"
    );
}

fn limited_config(redis: &RedisServer, rate: f64, burst: u32) -> String {
    crate::support::redis_config(
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
    assert!(crate::support::wait_until(
        Duration::from_secs(5),
        || reloads(&tollgate, "success") == 1.0
    ));

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

/// Limits come and go with reloads: the series of a removed one go with it, so six reloads
/// that rename every limit leave `/metrics` with the live limits' series only.
#[test]
fn sighup_drops_the_metric_series_of_removed_limits() {
    let config = |generation: usize| {
        let limits: String = (0..3)
            .map(|i| {
                format!("[[limits]]\nname = \"gen{generation}-{i}\"\nrate = 10\nburst = 10\nkey = [\"ip\"]\n")
            })
            .collect();
        format!("[store]\nbackend = \"memory\"\n{limits}")
    };
    let tollgate = Tollgate::start(&config(0));
    let series = |tollgate: &Tollgate| {
        tollgate
            .metrics()
            .lines()
            .filter(|line| line.starts_with("tollgate_limit_decisions_total{"))
            .count()
    };
    assert_eq!(series(&tollgate), 9, "3 limits, 3 decisions each");
    for generation in 1..=6 {
        replace_file(&tollgate.config_path, &config(generation));
        tollgate.signal("HUP");
        assert!(crate::support::wait_until(Duration::from_secs(5), || {
            reloads(&tollgate, "success") == generation as f64
        }));
        assert_eq!(series(&tollgate), 9, "after reload {generation}");
        let text = tollgate.metrics();
        let gone = format!("limit=\"gen{}-", generation - 1);
        assert!(
            !text.contains(&gone),
            "reload {generation} left {gone}: {text}"
        );
    }
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
        assert!(crate::support::wait_until(
            Duration::from_secs(5),
            || reloads(&tollgate, "failure") == failures + 1.0
        ));
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
    crate::support::redis_config(
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
    assert!(crate::support::wait_until(
        Duration::from_secs(5),
        || reloads(&tollgate, "success") == 1.0
    ));

    // The bucket keeps its debt of 3: the raised burst grants the difference (1) at once, and
    // no more.
    let raised = client.get("/check", CHECK).unwrap();
    assert_eq!(raised.status, 200, "the raise applies to the debt");
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
