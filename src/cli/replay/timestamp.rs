//! Log timestamps as Unix microseconds: nginx's `$time_local`, `$time_iso8601` and `$msec`.

use tollgate_core::base::calendar::days_from_civil;

/// A log timestamp as Unix µs: `$time_local` (`10/Oct/2000:13:55:36 -0700`),
/// `$time_iso8601` (`2000-10-10T13:55:36-07:00`, fractions and `Z` accepted) or `$msec`
/// (`971211336.123`).
pub fn parse_time_us(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() >= 20 && b.get(2) == Some(&b'/') {
        time_local(b)
    } else if b.len() >= 19 && b.get(4) == Some(&b'-') {
        iso8601(b)
    } else {
        epoch(text)
    }
}

fn digits(b: &[u8]) -> Option<i64> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
}

fn month(b: &[u8]) -> Option<i64> {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let position = MONTHS.iter().position(|m| m.as_slice() == b)?;
    i64::try_from(position).ok().map(|m| m + 1)
}

fn to_us(
    (year, month, day): (i64, i64, i64),
    (hour, minute, second): (i64, i64, i64),
    micros: i64,
    offset_s: i64,
) -> Option<u64> {
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    u64::try_from(secs.checked_mul(1_000_000)?.checked_add(micros)?).ok()
}

/// `+hhmm`, `+hh:mm`, `-...` or `Z`, in seconds east of UTC.
fn offset(b: &[u8]) -> Option<i64> {
    match b {
        b"Z" | b"z" => Some(0),
        [sign @ (b'+' | b'-'), h1, h2, rest @ ..] => {
            let minutes = match rest {
                [b':', m1, m2] | [m1, m2] => digits(&[*m1, *m2])?,
                [] => 0,
                _ => return None,
            };
            let total = digits(&[*h1, *h2])? * 3600 + minutes * 60;
            Some(if *sign == b'-' { -total } else { total })
        }
        _ => None,
    }
}

fn time_local(b: &[u8]) -> Option<u64> {
    // dd/Mon/yyyy:hh:mm:ss +zzzz
    if b.len() != 26 || b[2] != b'/' || b[6] != b'/' || b[11] != b':' || b[20] != b' ' {
        return None;
    }
    let date = (digits(&b[7..11])?, month(&b[3..6])?, digits(&b[0..2])?);
    let time = (
        digits(&b[12..14])?,
        digits(&b[15..17])?,
        digits(&b[18..20])?,
    );
    to_us(date, time, 0, offset(&b[21..])?)
}

fn iso8601(b: &[u8]) -> Option<u64> {
    // yyyy-mm-ddThh:mm:ss[.fff][zone]
    if b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let date = (digits(&b[0..4])?, digits(&b[5..7])?, digits(&b[8..10])?);
    let time = (
        digits(&b[11..13])?,
        digits(&b[14..16])?,
        digits(&b[17..19])?,
    );
    let mut rest = &b[19..];
    let mut micros = 0;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let end = fraction
            .iter()
            .position(|c| !c.is_ascii_digit())
            .unwrap_or(fraction.len());
        let mut scaled = fraction[..end.min(6)].to_vec();
        scaled.resize(6, b'0');
        micros = digits(&scaled)?;
        rest = &fraction[end..];
    }
    let zone = if rest.is_empty() { 0 } else { offset(rest)? };
    to_us(date, time, micros, zone)
}

fn epoch(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let seconds = u64::try_from(digits(whole.as_bytes())?).ok()?;
    let mut micros = 0;
    if !fraction.is_empty() {
        let mut scaled = fraction.as_bytes()[..fraction.len().min(6)].to_vec();
        scaled.resize(6, b'0');
        micros = u64::try_from(digits(&scaled)?).ok()?;
    }
    seconds.checked_mul(1_000_000)?.checked_add(micros)
}
