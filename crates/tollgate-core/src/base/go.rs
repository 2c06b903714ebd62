//! Go's spellings of booleans and durations. envoyproxy/ratelimit, Envoy Gateway and
//! ingress-nginx are Go programs: their variables and annotations mean what Go's `strconv` and
//! `time` make of them, so tollgate reads them with one parser and each caller rounds as its
//! program does.

use std::time::Duration;

/// Go's `strconv.ParseBool`: exactly these spellings, nothing trimmed or lower-cased (`yes`,
/// `on` and ` true` are errors there, so they are here).
pub fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration`: an optional sign, then numbers (fractions allowed) each followed
/// by `h`, `m`, `s`, `ms`, `us`/`µs` or `ns`; `0` alone needs no unit; nothing is trimmed.
/// A fraction finer than a nanosecond is dropped, as Go drops it. Negative durations (which Go
/// accepts) and those past Go's 292 years are `None`: no caller has a use for either.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_end);
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale: u128 = match unit {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" | "µs" | "μs" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let part = whole
            .checked_mul(scale)?
            .checked_add(go_fraction(fraction, scale))?;
        nanos = nanos.checked_add(part)?;
        rest = tail;
    }
    // Go's limit is an int64 of nanoseconds.
    if nanos > u128::from(i64::MAX.unsigned_abs()) || negative && nanos > 0 {
        return None;
    }
    u64::try_from(nanos).ok().map(Duration::from_nanos)
}

/// The nanoseconds of a fraction of `unit`, computed as Go computes them: the digits that fit
/// an int64, then one float64 product (so `0.3333333333333333333h` is 20 minutes exactly).
fn go_fraction(digits: &str, unit: u128) -> u128 {
    let max = i64::MAX.unsigned_abs();
    let mut value: u64 = 0;
    let mut scale = 1.0_f64;
    for digit in digits.bytes() {
        match value.checked_mul(10).map(|v| v + u64::from(digit - b'0')) {
            Some(next) if next <= max => {
                value = next;
                scale *= 10.0;
            }
            _ => break,
        }
    }
    // Go's own float arithmetic, on numbers below 2^63 and a unit of at most an hour: the
    // product is finite, non-negative and below 2^64.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let nanos = (value as f64 * (unit as f64 / scale)) as u64;
    u128::from(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cases from Go's own `strconv` tests (`atob_test.go`).
    #[test]
    fn booleans_are_read_as_strconv_reads_them() {
        for (text, value) in [
            ("", None),
            ("asdf", None),
            ("0", Some(false)),
            ("f", Some(false)),
            ("F", Some(false)),
            ("FALSE", Some(false)),
            ("false", Some(false)),
            ("False", Some(false)),
            ("1", Some(true)),
            ("t", Some(true)),
            ("T", Some(true)),
            ("TRUE", Some(true)),
            ("true", Some(true)),
            ("True", Some(true)),
            ("yes", None),
            ("on", None),
            (" true", None),
            ("true ", None),
            ("tRUE", None),
            ("2", None),
        ] {
            assert_eq!(parse_bool(text), value, "{text:?}");
        }
    }

    /// Cases from Go's own `time` tests (`time_test.go`, `parseDurationTests`), the negative
    /// ones refused.
    #[test]
    fn durations_are_read_as_time_reads_them() {
        let ns = Duration::from_nanos;
        for (text, value) in [
            ("0", Some(Duration::ZERO)),
            ("5s", Some(Duration::from_secs(5))),
            ("30s", Some(Duration::from_secs(30))),
            ("1478s", Some(Duration::from_secs(1478))),
            ("-0", Some(Duration::ZERO)),
            ("+5s", Some(Duration::from_secs(5))),
            ("-5s", None),
            ("5.0s", Some(Duration::from_secs(5))),
            ("5.6s", Some(Duration::from_millis(5_600))),
            ("5.s", Some(Duration::from_secs(5))),
            (".5s", Some(Duration::from_millis(500))),
            ("1.0s", Some(Duration::from_secs(1))),
            ("1.00s", Some(Duration::from_secs(1))),
            ("1.004s", Some(Duration::from_millis(1_004))),
            ("1.0040s", Some(Duration::from_millis(1_004))),
            ("100.00100s", Some(Duration::from_millis(100_001))),
            ("10ns", Some(ns(10))),
            ("11us", Some(Duration::from_micros(11))),
            ("12µs", Some(Duration::from_micros(12))),
            ("12μs", Some(Duration::from_micros(12))),
            ("13ms", Some(Duration::from_millis(13))),
            ("14s", Some(Duration::from_secs(14))),
            ("15m", Some(Duration::from_secs(15 * 60))),
            ("16h", Some(Duration::from_secs(16 * 3600))),
            ("3h30m", Some(Duration::from_secs(3 * 3600 + 30 * 60))),
            ("10.5s4m", Some(Duration::from_millis(4 * 60_000 + 10_500))),
            (
                "1h2m3s4ms5us6ns",
                Some(ns(3_600_000_000_000
                    + 120_000_000_000
                    + 3_000_000_000
                    + 4_000_000
                    + 5_000
                    + 6)),
            ),
            (
                "39h9m14.425s",
                Some(Duration::from_millis(
                    ((39 * 60 + 9) * 60 + 14) * 1000 + 425,
                )),
            ),
            ("52763797000ns", Some(ns(52_763_797_000))),
            ("0.3333333333333333333h", Some(Duration::from_secs(20 * 60))),
            ("9007199254740993ns", Some(ns(9_007_199_254_740_993))),
            ("9223372036854775807ns", Some(ns(9_223_372_036_854_775_807))),
            (
                "9223372036854775.807us",
                Some(ns(9_223_372_036_854_775_807)),
            ),
            ("0.100000000000000000000h", Some(Duration::from_secs(360))),
            ("0.830103483285477580700h", Some(ns(2_988_372_539_827))),
            ("", None),
            ("3", None),
            ("-", None),
            ("s", None),
            (".", None),
            ("-.", None),
            (".s", None),
            ("+.s", None),
            ("1d", None),
            ("\u{85}\u{85}", None),
            ("\u{ffff}", None),
            ("9223372036854775810ns", None),
            ("9223372036854775808ns", None),
            ("9223372036854775.808us", None),
            ("3000000h", None),
            (" 1s", None),
            ("1s ", None),
            ("1..5s", None),
        ] {
            assert_eq!(parse_duration(text), value, "{text:?}");
        }
    }
}
