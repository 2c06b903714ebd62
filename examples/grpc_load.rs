//! A load generator for Envoy's rate limit service: `CONNS` HTTP/2 connections carrying
//! `STREAMS` concurrent `ShouldRateLimit` calls in all, for `SECONDS`, each call one descriptor
//! `(k, <random of KEYS>)` in domain `bench`. Prints calls per second and latency percentiles.
//! `bench/grpc.sh` runs it next to wrk on `/check` and redis-benchmark on the same script.
//!
//! Usage: `cargo run --release --example grpc_load -- 127.0.0.1:8081 [STREAMS] [SECONDS] [KEYS] [CONNS]`
// Tests and load tools compute ratios and figures; the library's cast lints (Cargo.toml)
// guard its token arithmetic, not these.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

fn arg(index: usize, default: u64) -> u64 {
    std::env::args()
        .nth(index)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8081".into());
    let (streams, seconds, keys, conns) = (arg(2, 64), arg(3, 10), arg(4, 10_000), arg(5, 4));
    let mut clients = Vec::new();
    for _ in 0..conns {
        clients.push(RateLimitServiceClient::connect(format!("http://{addr}")).await?);
    }
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for stream in 0..streams {
        let mut client = clients[(stream % conns) as usize].clone();
        tasks.push(tokio::spawn(async move {
            // A small xorshift per stream: keys spread like redis-benchmark's __rand_int__.
            let mut seed = 0x9e37_79b9_u64 ^ (stream + 1);
            let (mut latencies, mut failed) = (Vec::new(), 0u64);
            while Instant::now() < until {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let request = RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "k".into(),
                            value: (seed % keys).to_string(),
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 0,
                };
                let sent = Instant::now();
                match client.should_rate_limit(request).await {
                    Ok(_) => latencies.push(sent.elapsed()),
                    Err(_) => failed += 1,
                }
            }
            (latencies, failed)
        }));
    }
    let (mut latencies, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (some, errors) = task.await?;
        latencies.extend(some);
        failed += errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "calls/s {:.0} p50_ms {:.3} p99_ms {:.3} calls {} failed {failed}",
        latencies.len() as f64 / elapsed,
        at(0.50),
        at(0.99),
        latencies.len()
    );
    Ok(())
}
