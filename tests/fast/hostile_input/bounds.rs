//! Hostile requests through the binary and floods of keys: Redis keys and memory stay
//! bounded.

use super::generated::{random_headers, seed, Rng};
use super::*;

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
pub(super) fn redis_memory_per_bucket_is_bounded() {
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
