//! `lua/token_bucket.lua`'s plain buckets, byte for byte: random sequences of plain checks (one
//! key, a number for its rate), alone or in batches, on keys holding random states (absent,
//! in debt, refilled, written "in the future"), against a real `redis-server`. Every reply,
//! every stored value and every expiry is exactly what the Rust twin (`kinds::tokens`) computes
//! from the state before and the call's own `TIME` (the `now` of its reply). The script decides
//! these checks on a path of their own, reusing within a batch the strings it spelled for the
//! request before; the twin spells nothing, so a string reused where it must not be shows here.

use proptest::prelude::*;

use crate::support::RedisServer;
use tollgate_core::kinds::tokens;
use tollgate_core::kinds::twin::{self, Stored};
use tollgate_core::kinds::BucketRequest;
use tollgate_core::store::redis::script::BUCKET_SCRIPT;

/// The keys' limits, as the script receives them: (rate, burst). One limit per key: the expiry
/// a charge sets is for its own rate, so a key checked at a slower rate after it expired would
/// read as full in Redis and in debt in the twin (a reload's lowered rate, which neither store
/// claims to carry over).
const LIMITS: [(&str, &str); 5] = [
    ("0.3", "7"),
    ("1", "1"),
    ("2.5", "5"),
    ("0.016666666666666666", "100"),
    ("1000", "3"),
];
const KEYS: [&str; 5] = [
    "bytes:{a}",
    "bytes:{b}",
    "bytes:{c}",
    "bytes:{d}",
    "bytes:{e}",
];

#[derive(Debug, Clone)]
struct Check {
    key: usize,
    cost: u64,
    shadow: bool,
}

/// A call: one check alone, or a batch of them.
#[derive(Debug, Clone)]
enum Call {
    Single(Check),
    Batch(Vec<Check>),
}

/// A key before the first call: absent, or in debt (micro-tokens) as of `age_us` ago (below 0:
/// written by a clock ahead of this one), marked with the format (`v1:`) or not (a build from
/// before the marker wrote it: read the same, and marked when written).
type Start = Option<(u64, i64, bool)>;

fn check() -> impl Strategy<Value = Check> {
    (0..KEYS.len(), 0..5u64, any::<bool>()).prop_map(|(key, cost, shadow)| Check {
        key,
        // 4: more than any of these bursts, or the largest cost a check may carry.
        cost: if cost == 4 { 1_000_000_001 } else { cost },
        shadow,
    })
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        check().prop_map(Call::Single),
        proptest::collection::vec(check(), 1..12).prop_map(Call::Batch),
    ]
}

fn start() -> impl Strategy<Value = Start> {
    proptest::option::of((
        prop_oneof![Just(0u64), 1..8_000_000u64, Just(100_000_000u64)],
        -2_000_000..20_000_000i64,
        any::<bool>(),
    ))
}

fn request(check: &Check) -> BucketRequest {
    let (rate, burst) = LIMITS[check.key];
    let request = BucketRequest::bucket(
        KEYS[check.key],
        rate.parse().expect("rate"),
        burst.parse().expect("burst"),
    )
    .cost(check.cost);
    if check.shadow {
        request.shadow()
    } else {
        request
    }
}

/// What the twin expects of one check at `now`: its reply field, and, when it charged (the
/// new state is then in `state`), the key's expiry (ms).
fn expect(check: &Check, state: &mut Option<Stored>, now: u64) -> (String, Option<u64>) {
    let request = request(check);
    let before = *state;
    let debt = tokens::debt_now(before, now, request.rate);
    let (allowed, outcomes) = twin::decide(
        std::slice::from_ref(&request),
        std::slice::from_mut(state),
        now,
    );
    let charged = *state != before;
    let debt = state
        .filter(|_| charged)
        .map_or(debt, |written| written.debt);
    let burst: u64 = LIMITS[check.key].1.parse().expect("burst");
    let level = i128::from(burst) * 1_000_000 - i128::from(debt);
    let reply = format!(
        "{} {now} {level} {}",
        u8::from(allowed),
        u8::from(outcomes[0].enough)
    );
    let expiry = state
        .filter(|_| charged)
        .map(|written| written.full_at_us(request.rate) / 1000 + 1);
    (reply, expiry)
}

/// Redis's clock, in µs.
fn time_us(redis: &RedisServer) -> u64 {
    let time = redis.cli(&["TIME"]);
    let mut parts = time
        .split_whitespace()
        .map(|part| part.parse::<u64>().expect("TIME"));
    let (s, us) = (parts.next().expect("s"), parts.next().expect("µs"));
    s * 1_000_000 + us
}

fn args(check: &Check, batch: bool) -> Vec<String> {
    let (rate, burst) = LIMITS[check.key];
    let mut args = if batch {
        vec!["1".to_owned()]
    } else {
        Vec::new()
    };
    args.extend([rate.to_owned(), burst.to_owned(), check.cost.to_string()]);
    args.push(if check.shadow { "1" } else { "0" }.to_owned());
    args
}

fn run(redis: &RedisServer, starts: &[Start], calls: &[Call]) -> Result<(), TestCaseError> {
    let mut connection = redis::Client::open(redis.url())
        .and_then(|client| client.get_connection())
        .expect("a connection");
    redis.cli(&["FLUSHDB"]);
    let mut states: Vec<Option<Stored>> = vec![None; KEYS.len()];
    // The expiry (ms) each key was last written with.
    let mut expiries = vec![0u64; KEYS.len()];
    let time = time_us(redis);
    for (i, start) in starts.iter().enumerate() {
        if let Some((debt, age_us, marked)) = *start {
            let ts = time.saturating_add_signed(-age_us);
            let stored = Stored { debt, ts_us: ts };
            let value = if marked {
                stored.value()
            } else {
                format!("{debt} {ts}")
            };
            redis.cli(&["SET", KEYS[i], &value]);
            states[i] = Some(stored);
            expiries[i] = u64::MAX;
        }
    }
    for call in calls {
        let checks = match call {
            Call::Single(check) => std::slice::from_ref(check),
            Call::Batch(checks) => checks.as_slice(),
        };
        let batch = matches!(call, Call::Batch(_));
        let mut command = redis::cmd("EVAL");
        command.arg(BUCKET_SCRIPT).arg(checks.len());
        for check in checks {
            command.arg(KEYS[check.key]);
        }
        if batch {
            command.arg("*");
        }
        for check in checks {
            command.arg(args(check, batch));
        }
        let reply: String = command.query(&mut connection).expect("the script decides");
        let now: u64 = reply
            .split(' ')
            .nth(1)
            .and_then(|now| now.parse().ok())
            .expect("now");
        let mut want = Vec::new();
        for check in checks {
            let (field, expiry) = expect(check, &mut states[check.key], now);
            want.push(field);
            if let Some(expiry) = expiry {
                expiries[check.key] = expiry;
            }
        }
        prop_assert_eq!(&reply, &want.join(" , "), "{:?}", call);
        for (i, key) in KEYS.iter().enumerate() {
            let (value, expiry): (Option<String>, i64) = redis::pipe()
                .atomic()
                .get(*key)
                .cmd("PEXPIRETIME")
                .arg(*key)
                .query(&mut connection)
                .expect("read the key");
            match (value, states[i]) {
                // Never written since the start: as it was set, marked or not.
                (Some(value), Some(state)) if expiries[i] == u64::MAX => {
                    prop_assert_eq!(Stored::parse(&value), Ok(Some(state)), "{}", key);
                    prop_assert_eq!(expiry, -1, "{}", key);
                }
                (Some(value), Some(state)) => {
                    prop_assert_eq!(value, state.value(), "{}", key);
                    let want = i64::try_from(expiries[i]).unwrap_or(-1);
                    prop_assert_eq!(expiry, want, "{}", key);
                }
                // Expired: Redis drops a key only once its expiry has passed.
                (None, Some(state)) => prop_assert!(
                    expiries[i] < time_us(redis) / 1000,
                    "{} gone while the twin holds {:?}, expiring at {} ms",
                    key,
                    state,
                    expiries[i]
                ),
                (value, None) => prop_assert!(value.is_none(), "{} written: {:?}", key, value),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Replies, stored values and expiries of plain checks are the twin's, byte for byte.
    #[test]
    fn plain_checks_reply_and_store_the_twins_bytes(
        starts in proptest::collection::vec(start(), KEYS.len()),
        calls in proptest::collection::vec(call(), 1..8),
    ) {
        thread_local! {
            static REDIS: RedisServer = RedisServer::start();
        }
        REDIS.with(|redis| run(redis, &starts, &calls))?;
    }
}
