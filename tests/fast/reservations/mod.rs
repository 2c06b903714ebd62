//! Reservations: a `charge = "report"` bucket that takes an estimate at `/check` and settles it
//! by id at `POST /report`. The same scenarios run on every store (`support::stores`: the
//! memory store and a real `redis-server` running `lua/token_bucket.lua`, `lua/settle.lua`);
//! then the real binary end to end, several instances on one Redis; then random interleavings
//! against the memory store, checking the bound at every step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use crate::support::fixtures::ONE_SLOT_PER_KEY;
use crate::support::stores::{every_store, Redis, StoreUnderTest};
use crate::support::{redis_config, RedisServer, Response, Tollgate};
use tollgate_core::base::clock::ManualClock;
use tollgate_core::kinds::reserve::{Reserve, Settle, MAX_LATE_SETTLES};
use tollgate_core::kinds::{BucketRequest, Meter, Reserved};
use tollgate_core::store::memory::MemoryStore;

mod model;
mod on_stores;
mod through_the_binary;

const TOKEN: &str = "test-admin-token-0123456789";
/// Slow enough that the milliseconds a Redis step takes refill nothing visible.
const RATE: f64 = 0.001;
const BURST: f64 = 10.0;

fn reserve(key: &str, id: u128, estimate: u64, ttl_ms: u64, refund: bool) -> BucketRequest {
    BucketRequest::reserve(key, RATE, BURST, Reserve { ttl_ms, id, refund }).cost(estimate)
}

fn settle(request: &BucketRequest, estimate: u64, actual: u64) -> Settle {
    Settle {
        bucket: request.clone().cost(actual),
        estimate,
        max_debt: BURST,
    }
}

/// A decision as these scenarios read it: whether it was allowed, and each bucket's tokens.
fn decide(store: &dyn StoreUnderTest, buckets: &[BucketRequest]) -> (bool, Vec<f64>) {
    let decided = StoreUnderTest::decide(store, buckets);
    (
        decided.allowed,
        decided.buckets.iter().map(|b| b.tokens).collect(),
    )
}

/// The tokens a peek finds in a bucket.
fn peek(store: &dyn StoreUnderTest, bucket: &BucketRequest) -> f64 {
    StoreUnderTest::peek(store, bucket).tokens
}

/// Whole tokens, as the rate refills at most a few micro-tokens during a Redis step.
fn whole(tokens: f64) -> f64 {
    (tokens * 1000.0).round() / 1000.0
}

fn reserving(extra: &str) -> String {
    format!(
        "[[limits]]\nname = \"tokens\"\nrate = \"100/m\"\nburst = 100\ncharge = \"report\"\nmax_debt = 0\nreserve = 10\nreserve_header = \"x-estimate\"\nkey = [\"header:x-api-key\"]\n{extra}"
    )
}

fn start(redis: &RedisServer, limits: &str) -> Tollgate {
    Tollgate::start(&format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(redis, "", limits)
    ))
}

fn report(tollgate: &Tollgate, body: &serde_json::Value) -> Response {
    crate::support::http::admin_json(
        tollgate.admin,
        "POST",
        "/report",
        Some(TOKEN),
        &body.to_string(),
    )
}

fn json(response: &Response) -> serde_json::Value {
    assert_eq!(response.status, 200, "{}", response.body);
    serde_json::from_str(&response.body).expect("JSON")
}
