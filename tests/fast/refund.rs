//! `lua/refund.lua` on a real Redis: it undoes a charge exactly when nobody touched the bucket
//! since, and never gives back refill that the burst cap discarded meanwhile (which would
//! admit more than `burst` in a moment).

use std::time::Duration;

use crate::support::RedisServer;

const BUCKET: &str = tollgate_core::store::redis::script::BUCKET_SCRIPT;
const REFUND: &str = tollgate_core::store::redis::script::REFUND_SCRIPT;
const KEY: &str = "tg:per-user:{alice}";

/// Charges `cost` (burst 10); returns (tokens after, `now` of the call).
fn charge(redis: &RedisServer, rate: &str, cost: u32) -> (f64, String) {
    let out = redis.cli(&["EVAL", BUCKET, "1", KEY, rate, "10", &cost.to_string(), "0"]);
    // "allowed now level enough", the level in micro-tokens
    let fields: Vec<&str> = out.split_whitespace().collect();
    let level: f64 = fields[2].parse().expect("level");
    (level / 1e6, fields[1].to_string())
}

fn refund(redis: &RedisServer, rate: &str, cost: u32, charged_at: &str) -> f64 {
    let out = redis.cli(&[
        "EVAL",
        REFUND,
        "1",
        KEY,
        rate,
        "10",
        &cost.to_string(),
        charged_at,
    ]);
    out.trim().parse().expect("tokens")
}

#[test]
fn an_untouched_charge_is_refunded_exactly() {
    let redis = RedisServer::start();
    // A slow refill (0.1/s), so the time redis-cli takes on a busy machine hardly counts.
    charge(&redis, "0.1", 5);
    let (after, charged_at) = charge(&redis, "0.1", 2);
    assert!((3.0..3.1).contains(&after), "{after}");
    let back = refund(&redis, "0.1", 2, &charged_at);
    // The 2 tokens come back, plus the refill of the moments in between.
    assert!((5.0..5.3).contains(&back), "{back}");
}

#[test]
fn refill_the_cap_discarded_is_not_given_back() {
    let redis = RedisServer::start();
    let (_, charged_at) = charge(&redis, "2", 1);
    // 9 tokens + 0.7 s x 2/s: full again; the cap discarded the refill the charge made room for.
    std::thread::sleep(Duration::from_millis(700));
    let (after, _) = charge(&redis, "2", 5);
    assert!((after - 5.0).abs() < 0.01, "{after}");
    // Without the charge the bucket would hold 5 (plus a moment's refill): a full refund would
    // make it 6.
    let back = refund(&redis, "2", 1, &charged_at);
    assert!(back < 5.5, "gave back refill the cap had discarded: {back}");
}

#[test]
fn an_expired_bucket_is_left_alone() {
    let redis = RedisServer::start();
    let back = refund(&redis, "10", 1, "1764669600123456");
    assert_eq!(back, 10.0);
    assert_eq!(redis.cli(&["EXISTS", KEY]).trim(), "0");
}
