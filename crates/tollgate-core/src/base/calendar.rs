//! Calendar periods in UTC, the Rust twin of the period arithmetic in `lua/token_bucket.lua`
//! and `lua/report.lua`. Redis's Lua has no `os.date`, so both sides count whole days since
//! 1970-01-01 with integer arithmetic only (civil-from-days, after Howard Hinnant), and the
//! two must agree to the second: a table of instants in the tests runs through both.
use serde::{Deserialize, Serialize};

const DAY: i64 = 86_400;

/// How long a quota counts before it starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Hour,
    Day,
    /// ISO week: from Monday 00:00 UTC.
    Week,
    /// Calendar month: from the 1st, 00:00 UTC.
    Month,
}

impl Period {
    /// The code the scripts take for this period.
    pub fn code(self) -> &'static str {
        match self {
            Period::Hour => "h",
            Period::Day => "d",
            Period::Week => "w",
            Period::Month => "m",
        }
    }

    /// The period's length in seconds when it is fixed (a month's is not).
    pub fn fixed_secs(self) -> Option<u64> {
        match self {
            Period::Hour => Some(3_600),
            Period::Day => Some(86_400),
            Period::Week => Some(7 * 86_400),
            Period::Month => None,
        }
    }

    /// `[start, end)` in Unix seconds of the period holding `unix_s`.
    pub fn bounds(self, unix_s: i64) -> (i64, i64) {
        let day = unix_s.div_euclid(DAY);
        match self {
            Period::Hour => {
                let start = unix_s.div_euclid(3_600) * 3_600;
                (start, start + 3_600)
            }
            Period::Day => (day * DAY, (day + 1) * DAY),
            Period::Week => {
                // 1970-01-01 was a Thursday: Monday-based weekday of day 0 is 3.
                let monday = day - (day + 3).rem_euclid(7);
                (monday * DAY, (monday + 7) * DAY)
            }
            Period::Month => {
                let (year, month, day_of_month) = civil_from_days(day);
                let first = day - (day_of_month - 1);
                (first * DAY, (first + days_in_month(year, month)) * DAY)
            }
        }
    }
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        })
    }
}

/// (year, month 1-12, day 1-31) of a day counted from 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days from 1970-01-01 to a civil date (proleptic Gregorian): the inverse of
/// [`civil_from_days`].
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds of a UTC date and time, computed independently of the code under test.
    fn at(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> i64 {
        let mut days = 0;
        for year in 1970..y {
            days += if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 {
                366
            } else {
                365
            };
        }
        for month in 1..mo {
            days += days_in_month(y, month);
        }
        (days + d - 1) * DAY + h * 3_600 + mi * 60 + s
    }

    #[test]
    fn civil_dates_round_trip_over_four_centuries() {
        let mut expected = (1970, 1, 1);
        for day in 0..(400 * 366) {
            assert_eq!(civil_from_days(day), expected, "day {day}");
            let (y, m, d) = expected;
            assert_eq!(days_from_civil(y, m, d), day, "{expected:?}");
            expected = if d < days_in_month(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
        }
    }

    #[rustfmt::skip]
    #[test]
    fn month_ends_leap_days_year_ends_and_week_starts() {
        let cases = [
            // Months of 28, 29, 30 and 31 days: the last second and the first.
            (Period::Month, at(2027, 2, 28, 23, 59, 59), at(2027, 2, 1, 0, 0, 0), at(2027, 3, 1, 0, 0, 0)),
            (Period::Month, at(2027, 3, 1, 0, 0, 0), at(2027, 3, 1, 0, 0, 0), at(2027, 4, 1, 0, 0, 0)),
            (Period::Month, at(2028, 2, 29, 12, 0, 0), at(2028, 2, 1, 0, 0, 0), at(2028, 3, 1, 0, 0, 0)),
            (Period::Month, at(2026, 4, 30, 23, 59, 59), at(2026, 4, 1, 0, 0, 0), at(2026, 5, 1, 0, 0, 0)),
            (Period::Month, at(2026, 12, 31, 23, 59, 59), at(2026, 12, 1, 0, 0, 0), at(2027, 1, 1, 0, 0, 0)),
            (Period::Month, at(2100, 2, 28, 0, 0, 0), at(2100, 2, 1, 0, 0, 0), at(2100, 3, 1, 0, 0, 0)),
            // ISO weeks start on Monday, also across a year end.
            (Period::Week, at(2026, 12, 6, 23, 59, 59), at(2026, 11, 30, 0, 0, 0), at(2026, 12, 7, 0, 0, 0)),
            (Period::Week, at(2026, 12, 7, 0, 0, 0), at(2026, 12, 7, 0, 0, 0), at(2026, 12, 14, 0, 0, 0)),
            (Period::Week, at(2027, 1, 1, 8, 0, 0), at(2026, 12, 28, 0, 0, 0), at(2027, 1, 4, 0, 0, 0)),
            (Period::Week, 0, -3 * DAY, 4 * DAY),
            (Period::Day, at(2028, 2, 29, 23, 59, 59), at(2028, 2, 29, 0, 0, 0), at(2028, 3, 1, 0, 0, 0)),
            (Period::Hour, at(2026, 12, 31, 23, 30, 0), at(2026, 12, 31, 23, 0, 0), at(2027, 1, 1, 0, 0, 0)),
        ];
        for (period, now, start, end) in cases {
            assert_eq!(period.bounds(now), (start, end), "{period} at {now}");
        }
    }
}
