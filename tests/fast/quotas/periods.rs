//! Calendar periods: the Rust twin and the shipped script agree on the boundaries, and a
//! used-up period denies until it ends on both stores.

use super::*;

/// Unix seconds of a UTC date and time, counted here without the code under test.
pub(crate) fn utc(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> i64 {
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = |y: i64, m: i64| match m {
        2 if leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let days: i64 = (1970..y)
        .map(|y| if leap(y) { 366 } else { 365 })
        .sum::<i64>()
        + (1..mo).map(|m| month_days(y, m)).sum::<i64>()
        + d
        - 1;
    days * 86_400 + h * 3_600 + mi * 60 + s
}

const DAY: i64 = 86_400;

/// One boundary: the last second of a period and the first of the next, with both periods'
/// lengths. Month ends of 28, 29, 30 and 31 days, a leap day, a year end, ISO week starts.
#[rustfmt::skip]
fn boundaries() -> Vec<(&'static str, Period, i64, i64, i64)> {
    vec![
        // (what, period, first second of the next period, length before, length after)
        ("February of 28 days ends", Period::Month, utc(2027, 3, 1, 0, 0, 0), 28 * DAY, 31 * DAY),
        ("February of 29 days ends", Period::Month, utc(2028, 3, 1, 0, 0, 0), 29 * DAY, 31 * DAY),
        ("a 30-day month ends", Period::Month, utc(2026, 5, 1, 0, 0, 0), 30 * DAY, 31 * DAY),
        ("a 31-day month ends", Period::Month, utc(2026, 9, 1, 0, 0, 0), 31 * DAY, 30 * DAY),
        ("the year ends", Period::Month, utc(2027, 1, 1, 0, 0, 0), 31 * DAY, 31 * DAY),
        ("January begins a leap year's February", Period::Month, utc(2028, 2, 1, 0, 0, 0), 31 * DAY, 29 * DAY),
        ("2100 is no leap year", Period::Month, utc(2100, 3, 1, 0, 0, 0), 28 * DAY, 31 * DAY),
        ("the leap day ends", Period::Day, utc(2028, 3, 1, 0, 0, 0), DAY, DAY),
        ("the leap day begins", Period::Day, utc(2028, 2, 29, 0, 0, 0), DAY, DAY),
        ("an ISO week starts on Monday", Period::Week, utc(2026, 12, 7, 0, 0, 0), 7 * DAY, 7 * DAY),
        ("an ISO week spans the year end", Period::Week, utc(2027, 1, 4, 0, 0, 0), 7 * DAY, 7 * DAY),
        ("a week starts on a leap day", Period::Week, utc(2044, 2, 29, 0, 0, 0), 7 * DAY, 7 * DAY),
        ("an hour ends at the year end", Period::Hour, utc(2027, 1, 1, 0, 0, 0), 3_600, 3_600),
    ]
}

const QUOTA: u64 = 3;

fn quota_request(key: &str, period: Period) -> BucketRequest {
    BucketRequest::quota(key, period, QUOTA)
}

/// What one charge answered: what is left, seconds until the period ends, its length.
type Seen = (f64, u64, u64);

/// The instants of one boundary and the answers due there: one charge in the last
/// microsecond of the old period, two in the first microsecond of the new one (the count of
/// the old period is void).
fn script(start_of_next: i64, before: i64, after: i64) -> Vec<(u64, Seen)> {
    let last = (start_of_next as u64 - 1) * 1_000_000 + 999_999;
    let first = start_of_next as u64 * 1_000_000;
    let q = QUOTA as f64;
    vec![
        (last, (q - 1.0, 1, before as u64)),
        (first, (q - 1.0, after as u64, after as u64)),
        (first, (q - 2.0, after as u64, after as u64)),
    ]
}

#[test]
fn period_boundaries_agree_between_the_rust_twin_and_the_shipped_script() {
    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let shipped = tollgate_core::store::redis::script::BUCKET_SCRIPT;
    const TIME: &str = "redis.call('TIME')";
    assert_eq!(
        shipped.matches(TIME).count(),
        1,
        "the shipped script reads the clock exactly once"
    );

    let clock = Arc::new(ManualClock::default());
    let memory = MemoryStore::with_clock(1_000, clock.clone());
    for (row, (what, period, next, before, after)) in boundaries().into_iter().enumerate() {
        let key = format!("tg:q{row}:{{k}}");
        for (step, (at_us, due)) in script(next, before, after).into_iter().enumerate() {
            // The Rust twin, on a clock set to the instant.
            clock.set_us(at_us);
            let decided = memory.decide_sync(&[quota_request(&key, period)]);
            let outcome = decided.buckets[0];
            let window = outcome.window.expect("a quota reports its window");
            let twin: Seen = (outcome.tokens, window.ends_in_s, window.length_s);
            assert!(decided.allowed, "{what}, step {step}: memory store admits");
            assert_eq!(twin, due, "{what}, step {step}: Rust twin");

            // The shipped script, its clock replaced by the same instant.
            let reply = pinned_eval(
                &mut conn,
                shipped,
                at_us,
                &key,
                &[period.code(), &QUOTA.to_string(), "1", "0"],
            );
            let (allowed, tokens, window) = bucket_reply(&reply);
            assert!(allowed, "{what}, step {step}: Redis admits");
            let (ends_in, length) = window.expect("a quota reports its window");
            let script_seen: Seen = (tokens, ends_in, length);
            assert_eq!(script_seen, due, "{what}, step {step}: shipped script");
        }
    }
}

#[test]
fn a_used_up_period_denies_until_it_ends_on_both_stores() {
    let redis = RedisServer::start();
    let mut conn = redis::Client::open(redis.url())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let shipped = tollgate_core::store::redis::script::BUCKET_SCRIPT;
    let clock = Arc::new(ManualClock::default());
    let memory = MemoryStore::with_clock(1_000, clock.clone());
    let end = utc(2028, 3, 1, 0, 0, 0) as u64;
    // Used up on Feb 29 at noon: denied through the last microsecond of February.
    let instants = [
        ((end - 12 * 3_600) * 1_000_000, true),
        ((end - 12 * 3_600) * 1_000_000, true),
        ((end - 12 * 3_600) * 1_000_000, true),
        ((end - 12 * 3_600) * 1_000_000, false),
        ((end - 1) * 1_000_000 + 999_999, false),
        (end * 1_000_000, true),
    ];
    for (step, (at_us, admitted)) in instants.into_iter().enumerate() {
        clock.set_us(at_us);
        let memory_says = memory.decide_sync(&[quota_request("tg:m:{k}", Period::Month)]);
        let reply = pinned_eval(&mut conn, shipped, at_us, "tg:m:{k}", &["m", "3", "1", "0"]);
        assert_eq!(memory_says.allowed, admitted, "step {step}: memory store");
        assert_eq!(bucket_reply(&reply).0, admitted, "step {step}: Redis");
    }
    // The counter expires by itself when its period ends: its TTL runs to the end of March
    // as seen from the pinned clock (at most 31 days).
    let ttl: i64 = redis.cli(&["PTTL", "tg:m:{k}"]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 31 * DAY * 1000, "PTTL {ttl}");
}

/// Runs a shipped script on real Redis with its clock pinned at `at_us`: its one `TIME` call
/// is replaced by that instant, so the shipped arithmetic is what runs.
pub(crate) fn pinned_eval(
    conn: &mut redis::Connection,
    shipped: &str,
    at_us: u64,
    key: &str,
    args: &[&str],
) -> redis::Value {
    const TIME: &str = "redis.call('TIME')";
    assert_eq!(shipped.matches(TIME).count(), 1, "one clock read");
    let instant = format!("{{'{}', '{}'}}", at_us / 1_000_000, at_us % 1_000_000);
    redis::cmd("EVAL")
        .arg(shipped.replacen(TIME, &instant, 1))
        .arg(1)
        .arg(key)
        .arg(args)
        .query(conn)
        .expect("script runs")
}

fn text(value: &redis::Value) -> String {
    match value {
        redis::Value::Int(n) => n.to_string(),
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => panic!("unexpected {other:?}"),
    }
}

/// A one-key `token_bucket.lua` reply as (allowed, level, quota window), read from either
/// shape the script has had: the array `{allowed, tokens, enough, now, t, w}` or the string
/// `"allowed now level enough t w"`. The level is what a quota has left, or a bucket's tokens
/// in micro-tokens.
pub(crate) fn bucket_reply(reply: &redis::Value) -> (bool, f64, Option<(u64, u64)>) {
    let fields: Vec<String> = match reply {
        redis::Value::Array(items) => {
            let mut fields: Vec<String> = items.iter().map(text).collect();
            let now = fields.remove(3);
            fields.insert(1, now);
            fields
        }
        other => text(other).split(' ').map(str::to_string).collect(),
    };
    let window =
        (fields.len() == 6).then(|| (fields[4].parse().expect("t"), fields[5].parse().expect("w")));
    (fields[0] == "1", fields[2].parse().expect("tokens"), window)
}

/// The tokens of a one-key `report.lua` reply.
pub(crate) fn report_reply(reply: &redis::Value) -> f64 {
    match reply {
        redis::Value::Array(items) => text(&items[0]).parse().expect("tokens"),
        other => text(other)
            .split(' ')
            .next()
            .and_then(|t| t.parse().ok())
            .expect("tokens"),
    }
}
