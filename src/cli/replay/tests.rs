use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::*;
use tollgate_core::config::OnError;
use tollgate_core::limiter::decision::Verdict;
use tollgate_core::limiter::Limiter;

fn args(format: LogFormat) -> ReplayArgs {
    ReplayArgs {
        logs: Vec::new(),
        log_format: format,
        format: OutputFormat::Json,
        top: 10,
        host: None,
        field_ip: "remote_addr".into(),
        field_time: "msec".into(),
        field_method: "request_method".into(),
        field_path: "request_uri".into(),
        field_host: "host".into(),
        field_headers: vec!["x-api-key=http_x_api_key".into()],
    }
}

static CONFIGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn config(toml: &str) -> Config {
    let n = CONFIGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("tollgate-replay-{}-{n}.toml", std::process::id()));
    std::fs::write(&path, toml).expect("write config");
    let config = Config::load(Some(&path)).expect("valid config");
    let _ = std::fs::remove_file(path);
    config
}

const PER_IP: &str = "[store]\nbackend = \"memory\"\n\n[[exempt]]\nname = \"office\"\ncidrs = [\"10.0.0.0/8\"]\n\n[[limits]]\nname = \"per-ip\"\nrate = 2\nburst = 3\nkey = [\"ip\"]\n\n[[limits]]\nname = \"per-key\"\nrate = \"60/min\"\nburst = 5\nkey = [\"header:x-api-key\"]\n[limits.match]\npath_prefix = \"/api/\"\n";

#[test]
fn timestamps_of_every_nginx_shape_are_read_as_unix_microseconds() {
    // 2000-10-10T20:55:36Z
    let expected = 971_211_336_000_000;
    assert_eq!(parse_time_us("10/Oct/2000:13:55:36 -0700"), Some(expected));
    assert_eq!(parse_time_us("2000-10-10T13:55:36-07:00"), Some(expected));
    assert_eq!(parse_time_us("2000-10-10T20:55:36Z"), Some(expected));
    assert_eq!(
        parse_time_us("2000-10-10T20:55:36.25+00:00"),
        Some(expected + 250_000)
    );
    assert_eq!(parse_time_us("971211336.123"), Some(expected + 123_000));
    assert_eq!(parse_time_us("971211336"), Some(expected));
    for bad in [
        "",
        "yesterday",
        "10/Foo/2000:13:55:36 -0700",
        "2000-13-10T20:55:36Z",
    ] {
        assert_eq!(parse_time_us(bad), None, "{bad}");
    }
}

#[test]
fn a_combined_line_gives_address_time_method_and_uri() {
    let line = br#"203.0.113.9 - - [10/Oct/2000:13:55:36 -0700] "GET /api/items?page=2 HTTP/1.1" 200 2326 "-" "curl/8""#;
    let fields = combined(line).expect("parsed");
    assert_eq!(fields.ip.as_deref(), Some("203.0.113.9"));
    assert_eq!(fields.time.as_deref(), Some("10/Oct/2000:13:55:36 -0700"));
    assert_eq!(fields.method.as_deref(), Some("GET"));
    assert_eq!(fields.path.as_deref(), Some("/api/items?page=2"));
    assert!(
        combined(br#"203.0.113.9 - - [10/Oct/2000:13:55:36 -0700] "-" 400 0 "-" "-""#).is_none()
    );
    assert!(combined(b"garbage").is_none());
}

#[test]
fn unparsable_lines_are_counted_never_fatal() {
    let mut replay = Replay::new(&config(PER_IP), &args(LogFormat::Combined)).unwrap();
    let log = "not a log line\n203.0.113.9 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n\n{\"half\": \n";
    replay.read(log.as_bytes()).unwrap();
    let report = replay.report(10);
    assert_eq!((report.requests, report.unparsed), (1, 2));
}

/// One generated request: ms since the start, client, API key, path.
type Event = (u64, &'static str, Option<&'static str>, &'static str);

/// Bursts with known outcomes: 10 at once from one address (burst 3), a slow client that never
/// runs out, an office address that is exempt, an API key hammered on /api/.
fn events() -> Vec<Event> {
    let mut events = Vec::new();
    for _ in 0..10 {
        events.push((0, "203.0.113.1", None, "/"));
    }
    for i in 0..10 {
        events.push((i * 600, "203.0.113.2", None, "/"));
        events.push((i * 600, "10.1.2.3", None, "/"));
    }
    for i in 0..8 {
        // Four addresses (never short of their own tokens), one key: 5 pass, then 1/s.
        let ip = [
            "198.51.100.1",
            "198.51.100.2",
            "198.51.100.3",
            "198.51.100.4",
        ][i % 4];
        events.push((6000 + 100 * i as u64, ip, Some("k-1"), "/api/x"));
    }
    events.sort_by_key(|e| e.0);
    events
}

const START_US: u64 = 1_700_000_000_000_000;

fn json_line(event: &Event) -> String {
    let (ms, ip, key, path) = event;
    let at = START_US + ms * 1000;
    let key = key.map_or(String::new(), |k| format!(",\"http_x_api_key\":\"{k}\""));
    format!(
        "{{\"msec\":\"{}.{:06}\",\"remote_addr\":\"{ip}\",\"request_method\":\"GET\",\"request_uri\":\"{path}\"{key}}}",
        at / 1_000_000,
        at % 1_000_000
    )
}

#[test]
fn replay_decides_each_request_as_check_does_on_the_memory_store() {
    let config = config(PER_IP);
    let events = events();

    // Offline: the replay, line by line.
    let mut replay = Replay::new(&config, &args(LogFormat::Json)).unwrap();
    let offline: Vec<bool> = events
        .iter()
        .map(|e| replay.line(json_line(e).as_bytes()).expect("parsed"))
        .collect();

    // Online: the limiter /check runs, on a memory store whose clock is set to each request's
    // time, with the request described by the headers a proxy forwards.
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(config.store.max_buckets, Arc::clone(&clock));
    let policy = Policy::compile(&config, &Metrics::new()).unwrap();
    let limiter = Limiter::new(store, policy, OnError::Allow, 1000, Metrics::new());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let online: Vec<bool> = events
        .iter()
        .map(|(ms, ip, key, path)| {
            clock.set_us(START_US + ms * 1000);
            let mut headers = HeaderMap::new();
            headers.insert(
                HeaderName::from_static("x-forwarded-uri"),
                HeaderValue::from_static(path),
            );
            if let Some(key) = key {
                headers.insert(
                    HeaderName::from_static("x-api-key"),
                    HeaderValue::from_static(key),
                );
            }
            let ip: IpAddr = ip.parse().unwrap();
            let request = OriginalRequest::new(&headers, "GET", "/", ip);
            let policy = limiter.policy();
            match runtime.block_on(limiter.check(&policy, &request)).verdict {
                Verdict::Decided(decision) => decision.allowed,
                Verdict::Exempt | Verdict::Unlimited => true,
                other => panic!("unexpected {other:?}"),
            }
        })
        .collect();
    assert_eq!(offline, online);

    let report = replay.report(10);
    // 203.0.113.1: 10 at once against a burst of 3. The key: 5, then one token per second
    // over 0.7 s: nothing more. The slow client refills 1.2 tokens between requests.
    assert_eq!(report.requests, 38);
    assert_eq!(report.exempt, 10);
    assert_eq!(report.denied, 7 + 3);
    let per_ip = &report.limits[0];
    assert_eq!(per_ip.denied, 7);
    assert_eq!(per_ip.top[0].key, ["203.0.113.1"]);
    assert_eq!(per_ip.top[0].denied, 7);
    assert_eq!(per_ip.top[0].first_denied, "1700000000.000000");
    let per_key = &report.limits[1];
    assert_eq!(per_key.denied, 3);
    assert_eq!(per_key.top[0].key, ["k-1"]);
    assert_eq!(per_key.top[0].first_denied, "1700000006.500000");
}

#[test]
fn the_json_report_has_the_documented_shape() {
    let mut replay = Replay::new(&config(PER_IP), &args(LogFormat::Json)).unwrap();
    for event in events() {
        replay.line(json_line(&event).as_bytes());
    }
    let json: serde_json::Value = serde_json::to_value(replay.report(1)).unwrap();
    assert_eq!(json["requests"], 38);
    assert_eq!(json["unparsed"], 0);
    let limit = &json["limits"][0];
    assert_eq!(limit["name"], "per-ip");
    assert_eq!(limit["denied"], 7);
    assert_eq!(limit["top"][0]["key"][0], "203.0.113.1");
    assert_eq!(limit["top"][0]["denied"], 7);
    assert!(limit["top"][0]["first_denied"].is_string());
    assert_eq!(limit["top"].as_array().unwrap().len(), 1);
}

#[test]
fn denied_keys_beyond_max_buckets_are_counted_not_listed() {
    let toml = "[store]\nbackend = \"memory\"\nmax_buckets = 2\n\n[[limits]]\nname = \"all\"\nrate = 1\nburst = 1\nkey = [\"ip\"]\n";
    let mut replay = Replay::new(&config(toml), &args(LogFormat::Json)).unwrap();
    for ip in ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"] {
        for _ in 0..2 {
            let event: Event = (0, ip, None, "/");
            replay.line(json_line(&event).as_bytes());
        }
    }
    let report = replay.report(10);
    let limit = &report.limits[0];
    assert!(limit.top.len() <= 2);
    assert_eq!(
        limit.denied,
        limit.top.iter().map(|k| k.denied).sum::<u64>() + limit.keys_untracked
    );
}

#[test]
fn a_line_past_the_maximum_is_skipped_without_growing_the_buffer() {
    let mut replay = Replay::new(&config(PER_IP), &args(LogFormat::Combined)).unwrap();
    let good =
        "203.0.113.9 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"\n";
    let mut log = good.to_string();
    log.push_str(&"x".repeat(MAX_LINE * 3));
    log.push('\n');
    log.push_str(good);
    log.push_str(&"y".repeat(MAX_LINE + 1));
    replay.read(log.as_bytes()).unwrap();
    let report = replay.report(10);
    assert_eq!((report.requests, report.unparsed), (2, 2));
}

#[test]
fn concurrency_limits_are_not_replayed() {
    let toml = "[store]\nbackend = \"memory\"\n\n[[limits]]\nname = \"in-flight\"\nconcurrency = 1\nkey = [\"ip\"]\n";
    let mut replay = Replay::new(&config(toml), &args(LogFormat::Json)).unwrap();
    for event in events() {
        replay.line(json_line(&event).as_bytes());
    }
    let report = replay.report(10);
    assert_eq!(report.requests, 38);
    assert_eq!(report.denied, 0, "a log line holds no lease");
}
