//! Hostile input to `/check`: random and adversarial headers (invalid UTF-8 and obs-text bytes,
//! 8 KiB values, 1,000-hop X-Forwarded-For, duplicated headers, IPv6 zones, garbage
//! X-Original-URL, huge costs), and floods of distinct keys.
//!
//! Most cases run in process through the library path `/check` takes (client IP, description,
//! applicable limits, keys, decision, rendering); a smaller sample goes as raw bytes through the
//! running binary into a real Redis, whose keys are then inspected. Generated cases come from a
//! seeded generator: a failure names the seed and case, and `TOLLGATE_FUZZ_SEED=<seed>` replays it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::support::chaos;
#[cfg(feature = "e2e")]
use crate::support::limit;
use crate::support::{block_on, HttpClient, RedisServer, Tollgate};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use tollgate::base::keys::MAX_TAIL;
use tollgate::config::{Config, OnError};
use tollgate::limiter::Limiter;
use tollgate::observe::metrics::Metrics;
use tollgate::policy::Policy;
use tollgate::request::OriginalRequest;
use tollgate::store::memory::MemoryStore;
use tollgate::store::AnyStore;

/// Generated cases run in process: the fast tier runs fewer (each run draws a new seed); the
/// second tier the full hundred thousand.
const IN_PROCESS_CASES: u64 = 10_000;
#[cfg(feature = "e2e")]
const IN_PROCESS_CASES_E2E: u64 = 100_000;
const HTTP_CASES: u64 = 2_000;

/// splitmix64: small, fast, and good enough to drive a fuzzer reproducibly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

fn seed() -> u64 {
    std::env::var("TOLLGATE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// Header names `/check` reads, plus a few it does not.
const NAMES: &[&str] = &[
    "x-forwarded-for",
    "x-real-ip",
    "x-forwarded-method",
    "x-original-method",
    "x-forwarded-uri",
    "x-original-uri",
    "x-original-url",
    "x-forwarded-host",
    "host",
    "x-api-key",
    "x-ratelimit-cost",
    "x-user-id",
    "cookie",
];

const NASTY: &[&str] = &[
    "",
    " ",
    ",",
    ",,,",
    "unknown",
    "::",
    "::1",
    "::ffff:127.0.0.1",
    "fe80::1%eth0",
    "fe80::1%",
    "[fe80::1%25eth0]:443",
    "[::1]:99999",
    "[::1",
    "::1]",
    "2001:DB8::1",
    "2001:db8:0:0:0:0:0:1%zone-with-a-long-name-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "127.0.0.1:80",
    "127.0.0.1:",
    "256.1.1.1",
    "1.2.3",
    "0.0.0.0",
    "255.255.255.255",
    "http://",
    "://",
    "http://@/",
    "http://[::1/x",
    "https://user:pass@api.example.com:8443/v1/items?x=1#frag",
    "https://api.example.com:99999999999999999999/",
    "//no-scheme/path",
    "/path?query#frag",
    "?only-query",
    "#",
    "%",
    "%00",
    "|",
    "a|b",
    "#0123456789abcdef0123456789abcdef",
    "%anon",
    "0",
    "-1",
    "+3",
    "1e9",
    " 7 ",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999999999",
    "GET",
    "get",
    "DELETE",
];

/// A header value `HeaderValue` accepts: visible ASCII, space, tab, and obs-text (0x80-0xff,
/// which is never valid UTF-8 on its own).
fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| match rng.below(10) {
            0 => 0x80 + rng.below(0x80) as u8,
            1 => b'\t',
            _ => 0x20 + rng.below(0x5f) as u8,
        })
        .collect()
}

fn random_ip(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => format!("127.0.0.{}", rng.below(256)),
        1 => format!("2001:db8::{:x}", rng.below(0x10000)),
        2 => "::1".into(),
        _ => format!(
            "{}.{}.{}.{}",
            rng.below(256),
            rng.below(256),
            rng.below(256),
            rng.below(256)
        ),
    }
}

fn long_forwarded_for(rng: &mut Rng, hops: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(hops * 16);
    for i in 0..hops {
        if i > 0 {
            out.extend_from_slice(if rng.chance(50) { b", " } else { b"," });
        }
        if rng.chance(3) {
            out.extend_from_slice(rng.pick(NASTY).as_bytes());
        } else {
            out.extend_from_slice(random_ip(rng).as_bytes());
        }
    }
    out
}

/// Huge values, made once: 8 KiB of random bytes or of one letter, and 1,000-hop
/// X-Forwarded-For lists (random hops, or all trusted so the walk visits every one).
struct BigValues {
    blobs: Vec<Vec<u8>>,
    forwarded: Vec<Vec<u8>>,
}

fn big_values() -> &'static BigValues {
    static BIG: std::sync::OnceLock<BigValues> = std::sync::OnceLock::new();
    BIG.get_or_init(|| {
        let mut rng = Rng(7);
        let mut blobs: Vec<Vec<u8>> = (0..4).map(|_| random_bytes(&mut rng, 8 * 1024)).collect();
        blobs.push(vec![b'a'; 8 * 1024]);
        let mut forwarded: Vec<Vec<u8>> =
            (0..4).map(|_| long_forwarded_for(&mut rng, 1000)).collect();
        let trusted: Vec<String> = (0..1000)
            .map(|i| format!("127.0.{}.{}", i / 256, i % 256))
            .collect();
        forwarded.push(trusted.join(", ").into_bytes());
        BigValues { blobs, forwarded }
    })
}

fn random_value(rng: &mut Rng, name: &str) -> Vec<u8> {
    // Huge values are rare per header (hashing 8 KiB is the slow part of a case), yet some
    // thousands of cases carry one.
    if rng.chance(1) {
        let big = big_values();
        return if name == "x-forwarded-for" && rng.chance(70) {
            rng.pick(&big.forwarded).clone()
        } else {
            rng.pick(&big.blobs).clone()
        };
    }
    match rng.below(10) {
        0 | 1 => {
            let hops = 1 + rng.below(8) as usize;
            long_forwarded_for(rng, hops)
        }
        2 | 3 => rng.pick(NASTY).as_bytes().to_vec(),
        4 => random_ip(rng).into_bytes(),
        5 => {
            let mut url = b"https://".to_vec();
            let len = rng.below(300) as usize;
            url.extend(random_bytes(rng, len));
            url
        }
        6 => format!("{}", rng.next()).into_bytes(),
        _ => {
            let len = rng.below(200) as usize;
            random_bytes(rng, len)
        }
    }
}

fn random_headers(rng: &mut Rng) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for _ in 0..rng.below(12) {
        let name = if rng.chance(90) {
            let name = NAMES[rng.below(NAMES.len() as u64) as usize];
            HeaderName::from_static(name)
        } else {
            HeaderName::from_bytes(format!("x-junk-{}", rng.below(50)).as_bytes())
                .expect("valid name")
        };
        let value = random_value(rng, name.as_str());
        // Strip what HeaderValue refuses (controls), keeping every other byte.
        let value: Vec<u8> = value
            .into_iter()
            .filter(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
            .collect();
        let value = HeaderValue::from_bytes(&value).expect("visible bytes and obs-text");
        // Appending duplicates some names: several lines of one header.
        headers.append(name, value);
    }
    headers
}

/// Limits over every key part, every `on_missing`, a cost header, match rules and a shadow
/// limit; used in process and by the binary alike.
const HOSTILE_LIMITS: &str = r#"
[[limits]]
name = "per-ip"
rate = 5
burst = 10
key = ["ip"]

[[limits]]
name = "costly"
rate = 5
burst = 1000
key = ["ip", "header:x-api-key"]
cost_header = "x-ratelimit-cost"
on_missing = "anonymous"

[[limits]]
name = "matched"
rate = 5
burst = 10
key = ["host", "method", "path"]
[limits.match]
hosts = ["api.example.com"]
methods = ["GET", "POST"]
path_prefix = "/"

[[limits]]
name = "everything"
rate = 5
burst = 10
key = ["method", "host", "path", "ip"]

[[limits]]
name = "by-key"
rate = 5
burst = 10
key = ["header:x-api-key"]
on_missing = "deny"

[[limits]]
name = "shadow"
rate = 5
burst = 10
key = ["header:x-user-id"]
shadow = true

[[limits]]
name = "shared"
rate = 5
burst = 10
key = ["const:all"]
"#;

fn hostile_config() -> Config {
    let dir = crate::support::TempDir::new("hostile");
    let path = dir.write("limits.toml", HOSTILE_LIMITS);
    Config::load(Some(&path)).expect("valid hostile limits")
}

/// The longest key any request can make: `<prefix>:<limit>:<tail>`, the tail at most
/// `MAX_TAIL` bytes (or `#` and 32 hex digits when hashed).
/// `<prefix>:<limit>:{<tail>}`: the tail is at most `MAX_TAIL` bytes, or `#` + 32 hex digits.
fn max_key_len(prefix: &str, longest_limit_name: usize) -> usize {
    prefix.len() + 1 + longest_limit_name + 1 + MAX_TAIL.max(33) + 2
}

#[test]
fn ten_thousand_hostile_requests_in_process() {
    hostile_requests_in_process(IN_PROCESS_CASES);
}

fn hostile_requests_in_process(cases: u64) {
    let seed = seed();
    let started = Instant::now();
    // Two threads, as `/check` runs on several workers sharing one limiter.
    let config = hostile_config();
    let metrics = Metrics::new();
    let policy = Policy::compile(&config, &metrics).expect("valid policy");
    let limiter = Limiter::new(
        AnyStore::Memory(MemoryStore::new(10_000)),
        Policy::compile(&config, &metrics).expect("valid policy"),
        OnError::Allow,
        10_000,
        metrics,
    );
    let longest_name = config
        .limits
        .iter()
        .map(|l| l.name.len())
        .max()
        .unwrap_or(0);
    let key_bound = max_key_len(&config.store.key_prefix, longest_name);
    std::thread::scope(|scope| {
        for half in 0..2 {
            let (policy, limiter) = (&policy, &limiter);
            scope.spawn(move || {
                for case in (half * cases / 2)..((half + 1) * cases / 2) {
                    one_case(seed, case, policy, limiter, key_bound);
                }
            });
        }
    });
    eprintln!(
        "{cases} in-process cases in {:.1} s (seed {seed})",
        started.elapsed().as_secs_f64()
    );
}

fn one_case(seed: u64, case: u64, policy: &Policy, limiter: &Limiter<AnyStore>, key_bound: usize) {
    let mut rng = Rng(seed ^ case.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let headers = random_headers(&mut rng);
    let peer: IpAddr = if rng.chance(70) {
        IpAddr::from([127, 0, 0, 1])
    } else {
        random_ip(&mut rng)
            .parse()
            .unwrap_or(IpAddr::from([203, 0, 113, 1]))
    };
    let method = *rng.pick(&["GET", "POST", "DELETE", "PATCH"]);
    let tail_len = rng.below(40) as usize;
    let tail_bytes = random_bytes(&mut rng, tail_len);
    let tail = String::from_utf8_lossy(&tail_bytes);
    let at = || format!("seed {seed} case {case} (TOLLGATE_FUZZ_SEED={seed})");

    let client_ip = policy.client_ip.client_ip(&headers, peer);
    if !policy.client_ip.trusted.iter().any(|n| n.contains(&peer)) {
        assert_eq!(
            client_ip,
            peer.to_canonical(),
            "{}: untrusted peer chose its IP",
            at()
        );
    }
    let original = OriginalRequest::new(&headers, method, &tail, client_ip);
    if let Ok(buckets) = policy.applicable(&original) {
        for bucket in &buckets {
            assert!(
                bucket.key.len() <= key_bound
                    && bucket.key.bytes().all(|b| (0x20..=0x7e).contains(&b)),
                "{}: unbounded or unprintable key {:?}",
                at(),
                bucket.key
            );
            assert!(bucket.cost >= 1, "{}: a cost below 1", at());
        }
    }
    // The memory store answers at once, so polling the future once decides.
    let verdict = block_on(limiter.check(policy, &original)).verdict;
    let response = tollgate::http::response::render(&verdict, policy);
    assert!(
        [200, 429].contains(&response.status().as_u16()),
        "{}: status {}",
        at(),
        response.status()
    );
}

/// One raw HTTP/1.1 request with the generated headers, each written byte for byte.
fn raw_request(rng: &mut Rng) -> Vec<u8> {
    let mut raw = b"GET /check".to_vec();
    if rng.chance(30) {
        raw.extend(format!("/p{}", rng.below(1000)).as_bytes());
    }
    raw.extend_from_slice(b" HTTP/1.1\r\n");
    let headers = random_headers(rng);
    for (name, value) in &headers {
        raw.extend_from_slice(name.as_str().as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(value.as_bytes());
        raw.extend_from_slice(b"\r\n");
    }
    if !headers.contains_key("host") {
        raw.extend_from_slice(b"host: tollgate\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    raw
}

#[test]
fn hostile_requests_through_the_binary_keep_redis_keys_bounded() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&crate::support::redis_config(&redis, "", HOSTILE_LIMITS));
    let seed = seed();
    let mut statuses = std::collections::BTreeMap::new();
    let mut client = tollgate.client();
    for case in 0..HTTP_CASES {
        let mut rng = Rng(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let raw = raw_request(&mut rng);
        let status = match client.send_raw(&raw) {
            Ok(response) => response.status,
            // The connection broke: once more on a fresh one, to see the real answer.
            Err(_) => {
                client = tollgate.client();
                client.send_raw(&raw).map_or(0, |r| r.status)
            }
        };
        if status == 400 {
            // The HTTP parser refused the request and closes the connection.
            client = tollgate.client();
        }
        *statuses.entry(status).or_insert(0u64) += 1;
        assert!(
            status < 500,
            "seed {seed} case {case}: status {status} for {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(300)])
        );
    }
    eprintln!("{HTTP_CASES} raw requests (seed {seed}): statuses {statuses:?}");
    let decided = statuses.get(&200).unwrap_or(&0) + statuses.get(&429).unwrap_or(&0);
    assert!(decided > HTTP_CASES / 2, "most requests must be decided");
    assert!(!statuses.contains_key(&0), "a request got no answer");
    // Still serving (the shared limit may well be spent by now).
    assert!([200, 429].contains(&tollgate.check(&[]).status));

    // Every key and its memory, in one pipelined round trip.
    let mut redis_conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to Redis");
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("tollgate:*")
        .query(&mut redis_conn)
        .expect("KEYS");
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("MEMORY").arg("USAGE").arg(key);
    }
    let usages: Vec<Option<u64>> = pipe.query(&mut redis_conn).expect("MEMORY USAGE");
    let longest_name = hostile_config()
        .limits
        .iter()
        .map(|l| l.name.len())
        .max()
        .unwrap_or(0);
    let bound = max_key_len("tollgate", longest_name);
    let longest = keys.iter().map(|k| k.len()).max().unwrap_or(0);
    let heaviest = usages.into_iter().flatten().max().unwrap_or(0);
    eprintln!(
        "{} keys in Redis, longest {longest} bytes (bound {bound}), largest MEMORY USAGE {heaviest} bytes",
        keys.len()
    );
    assert!(!keys.is_empty());
    assert!(longest <= bound, "a key of {longest} bytes");
    assert!(heaviest <= 256, "a bucket of {heaviest} bytes");
}

/// Sends `count` checks, each from a distinct client address, pipelined in batches on one
/// connection; returns how many were answered 200 or 429.
fn flood(addr: SocketAddr, first: u64, count: u64) -> u64 {
    const BATCH: u64 = 256;
    let connect = || {
        let stream = TcpStream::connect(addr).expect("connect");
        // Only so that a dead tollgate fails the test instead of hanging it: a batch of 256 on
        // a loaded 2-core machine beside other tests took more than 10 s once.
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let writer = stream.try_clone().expect("clone");
        (writer, BufReader::new(stream))
    };
    let (mut writer, mut reader) = connect();
    let mut answered = 0;
    let mut sent = 0;
    let mut line = String::new();
    while sent < count {
        let batch = BATCH.min(count - sent);
        let mut raw = Vec::with_capacity(batch as usize * 80);
        for i in 0..batch {
            let n = first + sent + i;
            // Distinct IPv6 clients from 2001:db8::/32 (documentation range), each in its own
            // /64: an IPv6 client is keyed by its /64 network.
            let _ = write!(
                raw,
                "GET /check HTTP/1.1\r\nhost: t\r\nx-forwarded-for: 2001:db8:{:x}:{:x}::1\r\n\r\n",
                n >> 16,
                n & 0xffff
            );
        }
        // Every answer so far was read: a connection tollgate closed as idle (its keep-alive
        // ran out while this thread waited for a core) is opened again for the next batch.
        if writer.write_all(&raw).is_err() {
            (writer, reader) = connect();
            writer.write_all(&raw).expect("send batch");
        }
        for _ in 0..batch {
            line.clear();
            reader.read_line(&mut line).expect("status line");
            let ok = line.starts_with("HTTP/1.1 200") || line.starts_with("HTTP/1.1 429");
            let mut length = 0usize;
            loop {
                line.clear();
                reader.read_line(&mut line).expect("header");
                let header = line.trim_end();
                if header.is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("body");
            answered += u64::from(ok);
        }
        sent += batch;
    }
    answered
}

/// A flood of distinct keys against the memory store: its bucket cap (`store.max_buckets`)
/// holds the process's memory. CI floods 60,000 keys into a cap of 10,000;
/// `TOLLGATE_FLOOD_KEYS=1000000 TOLLGATE_FLOOD_CAP=100000` runs the full million.
#[test]
fn a_flood_of_distinct_keys_keeps_memory_bounded() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (keys, cap) = (
        env("TOLLGATE_FLOOD_KEYS", 60_000),
        env("TOLLGATE_FLOOD_CAP", 10_000),
    );
    let tollgate = Tollgate::start(&format!("[store]\nmax_buckets = {cap}\n"));
    let pid = tollgate.pid();
    let started = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let addr = tollgate.addr;
            std::thread::spawn(move || flood(addr, t * keys / 2, keys / 2))
        })
        .collect();
    let answered: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("flood thread"))
        .sum();
    let peak = chaos::peak_rss_kib(pid);
    eprintln!(
        "{answered} distinct keys in {:.1} s; tollgate VmHWM {} MiB (VmRSS {} MiB)",
        started.elapsed().as_secs_f64(),
        peak / 1024,
        chaos::rss_kib(pid) / 1024
    );
    assert_eq!(answered, keys / 2 * 2);
    // The cap's buckets (~100-200 bytes each) plus the runtime, whatever the flood's size.
    assert!(peak < 64 * 1024 + cap * 400 / 1024, "peak RSS {peak} KiB");
    let mut client = HttpClient::connect(tollgate.addr).expect("connect");
    assert_eq!(client.get("/check", &[]).expect("answer").status, 200);
}

/// Redis memory per bucket, measured: distinct keys through tollgate, `used_memory` before
/// and after.
#[cfg(feature = "e2e")]
fn redis_memory_per_bucket_is_bounded() {
    const KEYS: u64 = 20_000;
    let redis = RedisServer::start();
    // A key lives until its one token is back, 1,000 s: none expires during the measurement,
    // even when a busy machine makes the flood take minutes (at 50 s, the first keys of a
    // slow flood were gone before DBSIZE counted them).
    let limits = &limit("per-ip", 0.001, 100, &["ip"]);
    let tollgate = Tollgate::start(&crate::support::redis_config(&redis, "", limits));
    let used = || {
        redis
            .cli(&["INFO", "memory"])
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:")?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = used();
    let flooded = Instant::now();
    assert_eq!(flood(tollgate.addr, 0, KEYS), KEYS);
    let flood_took = flooded.elapsed();
    let after = used();
    let dbsize: u64 = redis.cli(&["DBSIZE"]).trim().parse().unwrap_or(0);
    let per_bucket = (after - before) / dbsize.max(1);
    let sample = redis.cli(&["MEMORY", "USAGE", "tollgate:per-ip:{2001:db8::/64}"]);
    eprintln!(
        "{dbsize} buckets in {flood_took:.1?}: {per_bucket} bytes each of used_memory; \
         MEMORY USAGE of one: {}",
        sample.trim()
    );
    assert!(dbsize >= KEYS, "{dbsize} keys of {KEYS}");
    assert!(per_bucket <= 256, "{per_bucket} bytes per bucket");
}

/// Second tier (`cargo test --features e2e`): the long runs, 100,000 generated requests and
/// 20,000 buckets in Redis. One module, so scripts/test.sh runs exactly these by `e2e::`.
#[cfg(feature = "e2e")]
mod e2e {
    #[test]
    fn a_hundred_thousand_hostile_requests_in_process() {
        super::hostile_requests_in_process(super::IN_PROCESS_CASES_E2E);
    }

    #[test]
    fn redis_memory_per_bucket_is_bounded() {
        super::redis_memory_per_bucket_is_bounded();
    }
}
