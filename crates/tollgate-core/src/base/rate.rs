//! Rates as operators write them: a number of tokens per second (`20`, `0.5`) or
//! `"<number>/<unit>"` (`"100/min"`, `"5000/day"`), and the time arithmetic shared by limits
//! and decisions.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A `rate` as written in the config. Parsed into tokens per second by [`RateSpec::per_second`];
/// kept as written so `validate` can show both forms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RateSpec {
    PerSecond(f64),
    Text(String),
}

/// Units a rate may be written in, with their length in seconds.
const UNITS: &[(&str, f64)] = &[
    ("s", 1.0),
    ("sec", 1.0),
    ("second", 1.0),
    ("m", 60.0),
    ("min", 60.0),
    ("minute", 60.0),
    ("h", 3600.0),
    ("hour", 3600.0),
    ("d", 86_400.0),
    ("day", 86_400.0),
];

impl RateSpec {
    /// Tokens per second, or why the written form is not a rate. Always finite and > 0.
    pub fn per_second(&self) -> Result<f64, String> {
        let rate = match self {
            RateSpec::PerSecond(rate) => *rate,
            RateSpec::Text(text) => parse_text(text)?,
        };
        if rate.is_finite() && rate > 0.0 {
            Ok(rate)
        } else {
            Err("must be > 0".into())
        }
    }
}

fn parse_text(text: &str) -> Result<f64, String> {
    let Some((count, unit)) = text.split_once('/') else {
        return text
            .trim()
            .parse::<f64>()
            .map_err(|_| format!("{text:?} is not a rate: write a number or \"<number>/<unit>\""));
    };
    let count: f64 = count
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: {:?} is not a number", count.trim()))?;
    let unit = unit.trim();
    let seconds = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, seconds)| *seconds)
        .ok_or_else(|| {
            format!("{text:?}: unknown unit {unit:?} (use s, sec, second, m, min, minute, h, hour, d or day)")
        })?;
    Ok(count / seconds)
}

impl fmt::Display for RateSpec {
    /// The written form: `20/s` for a plain number, the text as given otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RateSpec::PerSecond(rate) => write!(f, "{rate}/s"),
            RateSpec::Text(text) => f.write_str(text.trim()),
        }
    }
}

/// No rate: what a quota limit has (refused by [`RateSpec::per_second`]).
impl Default for RateSpec {
    fn default() -> Self {
        RateSpec::PerSecond(0.0)
    }
}

impl From<f64> for RateSpec {
    fn from(rate: f64) -> Self {
        RateSpec::PerSecond(rate)
    }
}

/// Largest integer a structured header field may carry (15 digits, RFC 9651).
pub const MAX_SF_INTEGER: u64 = 999_999_999_999_999;

/// [`MAX_SF_INTEGER`] as a float (below 2^53, so exact).
const MAX_SF_INTEGER_F64: f64 = 999_999_999_999_999.0;

/// Rounds seconds up to a whole number, at least 0; huge or NaN values saturate at the largest
/// structured-field integer, so every header that shows seconds stays parseable.
pub fn ceil_secs(seconds: f64) -> u64 {
    if seconds.is_nan() || seconds <= 0.0 {
        0
    } else {
        whole(seconds.ceil())
    }
}

/// A count (tokens, a cost, a burst, a quota, a number of instances) as a float for the bucket
/// arithmetic. The config bounds counts to 10^9, far below 2^53, where every integer is exact.
#[expect(
    clippy::cast_precision_loss,
    reason = "counts are at most 10^9 (MAX_BURST), exact in f64"
)]
pub fn count_f64(count: u64) -> f64 {
    count as f64
}

/// `part / whole` for a figure a person reads (a share, a rate per minute): approximate
/// beyond 2^53, which no count shown this way reaches. A `whole` of 0 counts as 1.
#[expect(
    clippy::cast_precision_loss,
    reason = "a displayed ratio; counts are far below 2^53"
)]
pub fn ratio(part: u64, whole: u64) -> f64 {
    part as f64 / whole.max(1) as f64
}

/// A float floored to a whole number within `0..=MAX_SF_INTEGER` (NaN and negatives give 0):
/// tokens, capacities and seconds as headers show them.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "clamped to 0..=MAX_SF_INTEGER first (f64::max maps NaN to 0), so the cast is exact"
)]
pub fn whole(value: f64) -> u64 {
    value.max(0.0).floor().min(MAX_SF_INTEGER_F64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(t: &str) -> Result<f64, String> {
        RateSpec::Text(t.into()).per_second()
    }

    #[test]
    fn whole_floors_into_the_header_range_and_maps_nan_and_negatives_to_zero() {
        assert_eq!(whole(2.9), 2);
        assert_eq!(whole(-0.5), 0);
        assert_eq!(whole(f64::NAN), 0);
        assert_eq!(whole(f64::INFINITY), MAX_SF_INTEGER);
        assert_eq!(whole(MAX_SF_INTEGER_F64), MAX_SF_INTEGER);
        assert_eq!(count_f64(1_000_000_000), 1e9);
    }

    #[test]
    fn every_unit_and_its_long_name_is_understood() {
        assert_eq!(text("10/s"), Ok(10.0));
        assert_eq!(text("10/sec"), Ok(10.0));
        assert_eq!(text("10/second"), Ok(10.0));
        assert_eq!(text("120/m"), Ok(2.0));
        assert_eq!(text("120/min"), Ok(2.0));
        assert_eq!(text("120/minute"), Ok(2.0));
        assert_eq!(text("7200/h"), Ok(2.0));
        assert_eq!(text("7200/hour"), Ok(2.0));
        assert_eq!(text("172800/d"), Ok(2.0));
        assert_eq!(text("172800/day"), Ok(2.0));
        assert_eq!(text(" 1.5 / s "), Ok(1.5));
    }

    #[test]
    fn unknown_units_zero_and_garbage_are_refused_with_the_reason() {
        assert!(text("10/fortnight").unwrap_err().contains("unknown unit"));
        assert!(text("10/mins").unwrap_err().contains("unknown unit"));
        assert!(text("ten/s").unwrap_err().contains("not a number"));
        assert_eq!(text("0/s"), Err("must be > 0".into()));
        assert_eq!(text("-5/min"), Err("must be > 0".into()));
        assert_eq!(text("inf/s"), Err("must be > 0".into()));
        assert_eq!(
            RateSpec::PerSecond(f64::NAN).per_second(),
            Err("must be > 0".into())
        );
        assert!(text("").is_err());
    }

    #[test]
    fn the_written_form_is_kept() {
        assert_eq!(RateSpec::PerSecond(20.0).to_string(), "20/s");
        assert_eq!(RateSpec::PerSecond(0.5).to_string(), "0.5/s");
        assert_eq!(RateSpec::Text("100/min".into()).to_string(), "100/min");
    }
}
