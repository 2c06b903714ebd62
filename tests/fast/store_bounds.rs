//! Every number a key can carry fits what the store can express, so no debt is ever forgiven:
//! an override on a `charge = "report"` limit is checked with the limit's `max_debt` (file,
//! runtime `PUT`, entries an older release stored), and the shipped scripts refuse numbers
//! they cannot carry and never hand `PEXPIREAT` an expiry that `%d` turned into INT64_MIN.

use crate::support::http::admin_json;
use crate::support::{redis_config, tollgate_command, RedisServer, TempDir, Tollgate};
use tollgate_core::store::redis::script::{BUCKET_SCRIPT, REPORT_SCRIPT};

const TOKEN: &str = "store-bounds-token-0123";

/// A reported limit whose debt may reach a billion tokens: at 100/s it refills in 116 days.
const DEEP_DEBT: &str = r#"
[[limits]]
name = "llm"
rate = 100
burst = 1000
max_debt = 1000000000
charge = "report"
key = ["header:x-api-key"]
"#;

/// A debt that a rate of 1e-7/s refills in 3e8 years: the expiry overflowed `%d`, and
/// `PEXPIREAT` with INT64_MIN deleted the bucket, so the checks after the first passed
/// (`429 200 200 200`). Such a debt is kept (at most twenty years) and every check denies.
#[test]
fn a_debt_too_deep_to_expire_is_kept_and_every_check_denies() {
    let redis = RedisServer::start();
    let key = "tg:llm:{deep}";
    let now = redis.cli(&["TIME"]);
    let mut time = now.split_whitespace();
    let (s, us) = (time.next().unwrap(), time.next().unwrap());
    let ts = format!("{s}{us:0>6}");
    redis.cli(&["HSET", key, "tokens", "-1000000000", "ts", &ts]);
    let decided: Vec<&str> = (0..4)
        .map(|_| {
            let reply = redis.cli(&["EVAL", BUCKET_SCRIPT, "1", key, "1e-7", "1", "0", "0"]);
            if reply.starts_with("0 ") {
                "429"
            } else {
                "200"
            }
        })
        .collect();
    assert_eq!(decided, ["429", "429", "429", "429"]);
    let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
    let twenty_years_ms = 2 * 315_360_000_000_i64;
    assert!(
        ttl > twenty_years_ms - 60_000 && ttl <= twenty_years_ms + 1,
        "PTTL {ttl}"
    );
}

/// A report whose numbers cannot expire in time is refused whole, before anything is written;
/// before, the script wrote the debt and then failed on `PEXPIRE 1e+19`.
#[test]
fn the_report_script_refuses_numbers_it_cannot_expire_before_writing() {
    let redis = RedisServer::start();
    let reply = redis.cli(&[
        "EVAL",
        REPORT_SCRIPT,
        "1",
        "tg:llm:{r}",
        "1e-7",
        "1",
        "1000000000",
        "1000000000",
    ]);
    assert!(reply.contains("out of bounds"), "{reply}");
    assert_eq!(redis.cli(&["EXISTS", "tg:llm:{r}"]).trim(), "0");
    // Numbers within bounds: the expiry is a whole number of milliseconds.
    let reply = redis.cli(&[
        "EVAL",
        REPORT_SCRIPT,
        "1",
        "tg:llm:{r}",
        "3.2",
        "1000",
        "1000000000",
        "1000000000",
    ]);
    assert!(!reply.contains("ERR"), "{reply}");
    let ttl: i64 = redis.cli(&["PTTL", "tg:llm:{r}"]).trim().parse().unwrap();
    assert!(ttl > 300_000_000_000, "PTTL {ttl}");
}

#[test]
fn a_runtime_override_that_cannot_refill_the_debt_in_time_is_refused() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start(&format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(&redis, "", DEEP_DEBT)
    ));
    let put = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/llm?key=deep",
        Some(TOKEN),
        r#"{"rate": 1e-7, "burst": 1}"#,
    );
    assert_eq!(put.status, 400, "{}", put.body);
    assert!(put.body.contains("max_debt"), "{}", put.body);
    assert!(put.body.contains("\"field\":\"rate\""), "{}", put.body);
    // A rate that refills the debt within ten years is taken.
    let put = admin_json(
        tollgate.admin,
        "PUT",
        "/v1/overrides/llm?key=deep",
        Some(TOKEN),
        r#"{"rate": 4, "burst": 1}"#,
    );
    assert_eq!(put.status, 200, "{}", put.body);
}

#[test]
fn a_file_override_that_cannot_refill_the_debt_in_time_is_refused_naming_it() {
    let dir = TempDir::new("bounds");
    let config =
        format!("{DEEP_DEBT}[[limits.overrides]]\nkey = [\"deep\"]\nrate = 1e-7\nburst = 1\n");
    let output = tollgate_command()
        .arg("validate")
        .arg("--config")
        .arg(dir.write("tollgate.toml", &config))
        .output()
        .expect("run tollgate");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("limits.llm.overrides[0].rate"), "{err}");
    assert!(err.contains("max_debt"), "{err}");
}

/// An entry an older release let through (rate 1e-7 on a billion-token debt) is ignored: the
/// key keeps the limit's numbers, and a deep report is never forgiven.
#[test]
fn a_stored_override_the_store_cannot_carry_is_ignored_and_the_debt_kept() {
    let redis = RedisServer::start();
    redis.cli(&[
        "HSET",
        "tollgate:{tollgate:overrides}:limit:llm",
        "deep",
        r#"{"k":["deep"],"r":1e-7,"b":1}"#,
    ]);
    redis.cli(&["HSET", "tollgate:{tollgate:overrides}:versions", "llm", "1"]);
    let tollgate = Tollgate::start(&format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(&redis, "", DEEP_DEBT)
    ));
    let report = admin_json(
        tollgate.admin,
        "POST",
        "/report",
        Some(TOKEN),
        r#"{"limit": "llm", "key": ["deep"], "cost": 1000000000}"#,
    );
    assert_eq!(report.status, 200, "{}", report.body);
    let statuses: Vec<u16> = (0..4)
        .map(|_| tollgate.check(&[("x-api-key", "deep")]).status)
        .collect();
    assert_eq!(statuses, [429, 429, 429, 429]);
    let ttl: i64 = redis
        .cli(&["PTTL", "tollgate:llm:{deep}"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 9_000_000_000, "the debt lives ~116 days: PTTL {ttl}");
}
