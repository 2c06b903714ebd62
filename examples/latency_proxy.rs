//! A loopback TCP proxy that delays each direction by a fixed time: Redis "at a distance" for
//! `bench/distance.sh`. The same proxy as the tests' (`tests/support/latency.rs`).
//! Prints `port <n>` once listening, then each second `late_us <n>`: the most a chunk was
//! delivered after its due time in that second (a loaded machine wakes the proxy late, and the
//! link was then slower than asked).
//!
//! Usage: `cargo run --release --example latency_proxy -- <upstream port> <one-way µs>`
// Tests and load tools compute ratios and figures; the library's cast lints (Cargo.toml)
// guard its token arithmetic, not these.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

#[allow(dead_code)] // the tests use the rest of it
#[path = "../tests/support/latency.rs"]
mod latency;

use std::io::Write as _;
use std::time::Duration;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>());
    let (Some(Ok(upstream)), Some(Ok(one_way_us))) = (args.next(), args.next()) else {
        eprintln!("usage: latency_proxy <upstream port> <one-way µs>");
        std::process::exit(2);
    };
    let Ok(upstream) = u16::try_from(upstream) else {
        eprintln!("upstream port out of range: {upstream}");
        std::process::exit(2);
    };
    let proxy = latency::LatencyProxy::start(upstream, Duration::from_micros(one_way_us));
    let mut out = std::io::stdout();
    let _ = writeln!(out, "port {}", proxy.port);
    loop {
        let _ = out.flush();
        std::thread::sleep(Duration::from_secs(1));
        let _ = writeln!(out, "late_us {}", proxy.take_lateness().as_micros());
    }
}
