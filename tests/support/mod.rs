//! Test harness: a real `redis-server` on a free loopback port, real `tollgate` processes, and
//! a small keep-alive HTTP/1.1 client. Everything started here is stopped on drop.
#![allow(dead_code)] // each test file uses a different part of the harness

pub mod chaos;
// Redis Cluster and Sentinel: more than one Redis process, so only the second tier may
// start them (the compiler keeps the rule).
#[cfg(feature = "e2e")]
pub mod cluster;
pub mod commandstats;
pub mod deploy;
pub mod fixtures;
// A real Envoy: a process of its own per test, so only the second tier starts one.
#[cfg(feature = "e2e")]
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod latency;
pub mod link;
pub mod pressed;
// An OTLP trace receiver on Python's grpcio: a process of its own, second tier only.
#[cfg(feature = "e2e")]
pub mod otlp;
pub mod proxies;
pub mod rlqs;
pub mod stores;
// A real statsd daemon: a process of its own per test, so only the second tier starts one.
#[cfg(feature = "e2e")]
pub mod statsd;
pub mod xds;

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod answers;
mod certs;
mod config_text;
mod process;
mod redis_server;

pub use self::answers::*;
pub use self::certs::*;
pub use self::config_text::*;
pub use self::http::{HttpClient, Response};
pub use self::process::*;
pub use self::redis_server::*;

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    free_port_pair(0)
}

/// A free loopback port whose `port + offset` is free too (a Redis Cluster node's bus port).
///
/// Picked below the kernel's ephemeral range, so no outgoing connection of a parallel test can
/// take it between picking and the server's bind (a cluster node then died on its bus port),
/// and never handed out twice in one run, neither as a port nor as a partner.
pub fn free_port_pair(offset: u16) -> u16 {
    use std::collections::BTreeSet;
    use std::hash::{BuildHasher as _, RandomState};
    use std::sync::Mutex;
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

    const LOWEST: u16 = 10_000;
    let highest = ephemeral_range_start().saturating_sub(offset);
    assert!(
        highest > LOWEST + 1_000,
        "the ephemeral port range starts too low for test ports"
    );
    let is_free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for _ in 0..10_000 {
        let spread = RandomState::new().hash_one(given.len()) % u64::from(highest - LOWEST);
        let port = LOWEST + u16::try_from(spread).expect("below highest - LOWEST");
        let partner = port + offset;
        if !given.contains(&port)
            && !given.contains(&partner)
            && is_free(port)
            && (offset == 0 || is_free(partner))
        {
            // The partner is reserved too: a cluster node binds its bus port only when it
            // starts, and a test that picked that port meanwhile killed the node.
            given.insert(port);
            given.insert(partner);
            return port;
        }
    }
    panic!("no free loopback port below the ephemeral range");
}

/// Where the kernel starts handing out ports to outgoing connections (Linux's default when
/// unknown).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// The environment that starts a tollgate with every background interval a tenth of
/// production's (the testing-only divisor, see CONTRIBUTING.md): pass it to
/// [`Tollgate::start_with_env`] and wait in multiples of [`short_timings`].
pub const SHORT_TIMINGS: (&str, &str) = (tollgate_core::base::timings::TEST_SCALE_ENV, "10");

/// The intervals of a tollgate started with [`SHORT_TIMINGS`].
pub fn short_timings() -> tollgate_core::base::timings::Timings {
    tollgate_core::base::timings::Timings::for_test_scale(SHORT_TIMINGS.1).expect("a valid divisor")
}

/// Polls `ready` every 20 ms until it holds or `within` passes.
pub fn wait_until(within: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ready()
}

/// The store the tests run against: Redis, or Valkey with `STORE_UNDER_TEST=valkey` (the
/// Valkey leg of scripts/test.sh). Any other value stops the test, so a typo never runs Redis
/// under Valkey's name.
pub fn store_is_valkey() -> bool {
    match std::env::var("STORE_UNDER_TEST").as_deref() {
        Err(_) | Ok("redis") => false,
        Ok("valkey") => true,
        Ok(other) => panic!("STORE_UNDER_TEST={other:?}: redis or valkey"),
    }
}

/// The store's own program: `server` or `cli` (`redis-server`, `valkey-cli`, ...).
pub fn store_binary(program: &str) -> PathBuf {
    let store = if store_is_valkey() { "valkey" } else { "redis" };
    require_binary(&format!("{store}-{program}"))
}

fn require_binary(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("`{name}` is not installed: run scripts/test.sh, which installs what the tests need")
    })
}

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "tollgate-test-{label}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(contents.as_bytes()))
            .expect("write temp file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
