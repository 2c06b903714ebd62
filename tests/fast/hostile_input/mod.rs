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
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tollgate_core::base::keys::MAX_TAIL;
use tollgate_core::config::{Config, OnError};
use tollgate_core::limiter::Limiter;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::policy::Policy;
use tollgate_core::request::OriginalRequest;
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::AnyStore;

mod bounds;
mod generated;

/// Generated cases run in process: the fast tier runs fewer (each run draws a new seed); the
/// second tier the full hundred thousand.
const IN_PROCESS_CASES: u64 = 10_000;
#[cfg(feature = "e2e")]
const IN_PROCESS_CASES_E2E: u64 = 100_000;
const HTTP_CASES: u64 = 2_000;

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

/// Second tier (`cargo test --features e2e`): the long runs, 100,000 generated requests and
/// 20,000 buckets in Redis. One module, so scripts/test.sh runs exactly these by `e2e::`.
#[cfg(feature = "e2e")]
mod e2e {
    #[test]
    fn a_hundred_thousand_hostile_requests_in_process() {
        super::generated::hostile_requests_in_process(super::IN_PROCESS_CASES_E2E);
    }

    #[test]
    fn redis_memory_per_bucket_is_bounded() {
        super::bounds::redis_memory_per_bucket_is_bounded();
    }
}
