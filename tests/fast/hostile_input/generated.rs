//! Generated hostile requests, in process: random names, values, addresses and sizes,
//! each answered with a defined status.

use super::*;

/// splitmix64: small, fast, and good enough to drive a fuzzer reproducibly.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

pub(super) fn seed() -> u64 {
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

pub(super) fn random_headers(rng: &mut Rng) -> HeaderMap {
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

#[test]
fn ten_thousand_hostile_requests_in_process() {
    hostile_requests_in_process(IN_PROCESS_CASES);
}

pub(super) fn hostile_requests_in_process(cases: u64) {
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
