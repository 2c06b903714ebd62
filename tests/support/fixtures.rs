//! Named config fixtures: the `[[limits]]` tables several test files use alike, so each is
//! written once and a reader knows it by name. Append them to a config's other text; each
//! starts and ends on a line of its own.

/// Two limits of one request a minute: per client IP, and per API key (skipped when the
/// header is absent).
pub const PER_IP_AND_PER_KEY_PER_MINUTE: &str = r#"
[[limits]]
name = "per-ip"
rate = "1/min"
burst = 1
key = ["ip"]

[[limits]]
name = "per-key"
rate = "1/min"
burst = 1
key = ["header:x-api-key"]
on_missing = "skip"
"#;

/// One request in flight per API key (`concurrency = 1`, limit "slots").
pub const ONE_SLOT_PER_KEY: &str = r#"
[[limits]]
name = "slots"
concurrency = 1
key = ["header:x-api-key"]
"#;

/// A limit `validate` refuses: a rate of 0 (limit "x").
pub const A_ZERO_RATE: &str = r#"
[[limits]]
name = "x"
rate = 0
burst = 1
key = ["ip"]
"#;
