//! The wire format of the scripts: a bucket's arguments, and replies parsed into decisions.
use redis::{Cmd, RedisError, Value};

use crate::kinds::{BucketOutcome, BucketRequest, Kind, ScriptArg, Window};
use crate::store::{StoreDecision, StoreError};

/// One bucket's four script arguments: its kind's ([`Kind::script_arg`]: the rate, a quota's
/// period code, or the kind's fields), burst (or quota), cost, and one script-specific value.
///
/// [`Kind::script_arg`]: crate::kinds::Kind::script_arg
pub(super) fn bucket_args(cmd: &mut Cmd, bucket: &BucketRequest, last: &str) {
    script_arg(cmd, bucket.meter.script_arg(bucket.rate));
    number_arg(cmd, bucket.burst).arg(bucket.cost).arg(last);
}

/// A kind's argument, written as a script reads it.
pub(super) fn script_arg(cmd: &mut Cmd, arg: ScriptArg) -> &mut Cmd {
    match arg {
        ScriptArg::Number(x) => number_arg(cmd, x),
        ScriptArg::Code(code) => cmd.arg(code),
        ScriptArg::Text(text) => cmd.arg(text),
    }
}

/// A number for a script: a whole one (rates and bursts almost always are) as an integer,
/// the same number to the script, where printing a float cost the hot path more than every
/// other argument together.
fn number_arg(cmd: &mut Cmd, x: f64) -> &mut Cmd {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a whole number below 2^53 converts exactly"
        )]
        cmd.arg(x as i64)
    } else {
        cmd.arg(x)
    }
}

/// The windows appended to a reply (`t, w` per quota, in order), one per bucket; `None`
/// when numbers are missing or left over.
pub(super) fn windows(items: &[Value], buckets: &[&BucketRequest]) -> Option<Vec<Option<Window>>> {
    let mut numbers = items.iter();
    let mut number = || u64::try_from(as_int(numbers.next()?)?).ok();
    let windows = buckets
        .iter()
        .map(|bucket| bucket.meter.read_window(&mut number))
        .collect::<Option<Vec<_>>>()?;
    numbers.next().is_none().then_some(windows)
}

/// `{tokens_1, ..., tokens_n, now, windows...}` of `lua/report.lua` → outcomes.
pub(super) fn parse_report(
    reply: Value,
    buckets: &[&BucketRequest],
) -> Result<Vec<BucketOutcome>, StoreError> {
    let malformed = || StoreError::Script("malformed report reply".into());
    let Value::Array(items) = reply else {
        return Err(malformed());
    };
    let count = buckets.len();
    if items.len() < count + 1 {
        return Err(malformed());
    }
    let windows = windows(&items[count + 1..], buckets).ok_or_else(malformed)?;
    items[..count]
        .iter()
        .zip(windows)
        .map(|(item, window)| {
            let tokens = as_float(item).ok_or_else(malformed)?;
            Ok(BucketOutcome {
                tokens,
                enough: tokens >= 1.0,
                window,
            })
        })
        .collect()
}

/// `"allowed now level_1 enough_1 ... level_n enough_n t_q1 w_q1 ... s_b1 d_b1 ..."` →
/// [`StoreDecision`] and `now`; `t_q, w_q` follow for each quota, in order, then `s_b, d_b`
/// (the slice taken, its deadline) for each borrowing bucket. A bucket's level is in
/// micro-tokens.
pub(super) fn parse_decision(
    reply: Value,
    requests: &[&BucketRequest],
) -> Result<(StoreDecision, String), StoreError> {
    let malformed = || StoreError::Script("malformed token bucket reply".into());
    let text = match &reply {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).map_err(|_| malformed())?,
        Value::SimpleString(text) => text.as_str(),
        _ => return Err(malformed()),
    };
    let flag = |field: Option<&str>| match field {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    };
    let mut fields = text.split(' ');
    let allowed = flag(fields.next()).ok_or_else(malformed)?;
    let now = fields.next().ok_or_else(malformed)?.to_owned();
    let mut buckets = requests
        .iter()
        .map(|request| {
            let level: f64 = fields.next()?.parse().ok()?;
            Some(BucketOutcome {
                tokens: level / request.meter.level_scale(),
                enough: flag(fields.next())?,
                window: None,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(malformed)?;
    let mut number = || fields.next()?.parse::<u64>().ok();
    for (outcome, request) in buckets.iter_mut().zip(requests) {
        outcome.window = request
            .meter
            .read_window(&mut number)
            .ok_or_else(malformed)?;
    }
    let mut slices = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        let slice = request.meter.read_slice(&mut number, index, &now);
        slices.extend(slice.ok_or_else(malformed)?);
    }
    if fields.next().is_some() {
        return Err(malformed());
    }
    Ok((
        StoreDecision {
            allowed,
            buckets,
            slices,
        },
        now,
    ))
}

pub(super) fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "the scripts' integers (tokens, seconds, microsecond times) are below 2^53"
)]
pub(super) fn as_float(value: &Value) -> Option<f64> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        Value::Double(x) => Some(*x),
        Value::Int(n) => Some(*n as f64),
        _ => None,
    }
}

/// Maps a client error onto the kinds counted in `tollgate_store_errors_total`.
/// A reply that says the server will not run scripts at all: the scripting commands are
/// unknown (renamed away, no Lua engine) or forbidden to this user (`NOPERM`).
fn refuses_scripts(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    (message.contains("unknown command") || message.contains("noperm"))
        && ["'eval'", "'evalsha'", "'script'", "'script|load'"]
            .iter()
            .any(|command| message.contains(command))
}

pub(super) fn classify(error: &RedisError) -> StoreError {
    if error.is_timeout() {
        StoreError::Timeout
    } else if error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error()
    {
        StoreError::Connection(error.to_string())
    } else if refuses_scripts(&error.to_string()) {
        StoreError::ScriptsRefused(error.to_string())
    } else if matches!(
        error.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
    ) || error.to_string().contains("script")
    {
        StoreError::Script(error.to_string())
    } else {
        StoreError::Other(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_bucket() -> BucketRequest {
        BucketRequest::bucket("k", 1.0, 5.0)
    }

    #[test]
    fn a_server_that_will_not_run_scripts_is_told_from_a_failing_script() {
        for message in [
            "NOPERM User tollgate has no permissions to run the 'evalsha' command",
            "ERR unknown command 'EVALSHA', with args beginning with: 'abc' '1' ",
            "ERR unknown command 'EVAL', with args beginning with: ",
        ] {
            assert!(refuses_scripts(message), "{message}");
        }
        for message in [
            "NOPERM User tollgate has no permissions to run the 'zadd' command",
            "ERR Error running script (call to f_1): @user_script:1: oops",
            "NOSCRIPT No matching script. Please use EVAL.",
        ] {
            assert!(!refuses_scripts(message), "{message}");
        }
    }

    #[test]
    fn replies_parse_into_decisions() {
        // Buckets in micro-tokens (one in debt), a quota in whole requests.
        let reply =
            Value::BulkString(b"1 1764669600123456 4500000 1 -2500001 0 7 1 60 3600".to_vec());
        let bucket = one_bucket();
        let quota = BucketRequest::quota("k", crate::base::calendar::Period::Hour, 5);
        let (decision, now) = parse_decision(reply, &[&bucket, &bucket, &quota]).unwrap();
        assert!(decision.allowed);
        assert_eq!(now, "1764669600123456");
        assert_eq!(decision.buckets[0].tokens, 4.5);
        assert!(decision.buckets[0].enough);
        assert_eq!(decision.buckets[1].tokens, -2.500_001);
        assert!(!decision.buckets[1].enough);
        assert_eq!(decision.buckets[2].tokens, 7.0);
        assert_eq!(decision.buckets[2].window.map(|w| w.length_s), Some(3600));
    }

    #[test]
    fn malformed_replies_are_errors() {
        let bucket = one_bucket();
        for reply in [
            "",
            "1",
            "1 5",
            "1 5 4.5",
            "1 5 4.5 2",
            "2 5 4.5 1",
            "1 5 x 1",
            "1 5 4.5 1 7",
        ] {
            let value = Value::BulkString(reply.as_bytes().to_vec());
            assert!(parse_decision(value, &[&bucket]).is_err(), "{reply:?}");
        }
        assert!(parse_decision(Value::Array(vec![Value::Int(1)]), &[&bucket]).is_err());
    }
}
