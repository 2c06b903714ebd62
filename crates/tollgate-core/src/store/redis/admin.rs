//! What the admin API asks of Redis: a peek (`lua/peek.lua`, read-only, on Redis's clock with
//! the check's arithmetic) and a reset (`lua/reset.lua`: the key deleted and announced on the
//! reset channel in one atomic call). Both go through the same breaker, deadline and script
//! loading as a check, and are routed by their key, so they work on one node, a Cluster or a
//! Sentinel-managed master alike.

use std::time::Instant;

use redis::Value;

use super::wire::as_float;
use super::RedisStore;
use crate::base::keys;
use crate::kinds::reserve::{Settle, Settled};
use crate::kinds::{can_pay, BucketOutcome, BucketRequest, Kind, Reserved};
use crate::store::StoreError;

/// `lua/peek.lua` as shipped, calendar, bounds, stored forms and the global arithmetic included.
pub const PEEK_SCRIPT: &str = concat!(
    include_str!("../../../../../lua/calendar.lua"),
    include_str!("../../../../../lua/bounds.lua"),
    include_str!("../../../../../lua/stored.lua"),
    include_str!("../../../../../lua/groups.lua"),
    include_str!("../../../../../lua/global.lua"),
    include_str!("../../../../../lua/peek.lua")
);
pub const RESET_SCRIPT: &str = include_str!("../../../../../lua/reset.lua");
pub const RELEASE_SCRIPT: &str = include_str!("../../../../../lua/release.lua");
/// `lua/settle.lua` as shipped, bounds and stored forms included.
pub const SETTLE_SCRIPT: &str = concat!(
    include_str!("../../../../../lua/bounds.lua"),
    include_str!("../../../../../lua/stored.lua"),
    include_str!("../../../../../lua/settle.lua")
);

impl RedisStore {
    pub(super) async fn peek_key(
        &self,
        request: &BucketRequest,
    ) -> Result<BucketOutcome, StoreError> {
        let reply = self.peek_reply(request).await?;
        parse_peek(&reply, request).map(|(outcome, _)| outcome)
    }

    /// The reservations a peek finds beside a reserving bucket.
    pub(super) async fn reserved_at(
        &self,
        request: &BucketRequest,
    ) -> Result<Reserved, StoreError> {
        let reply = self.peek_reply(request).await?;
        Ok(parse_peek(&reply, request)?.1.unwrap_or_default())
    }

    async fn peek_reply(&self, request: &BucketRequest) -> Result<Value, StoreError> {
        self.run_script(
            &self.peek_script,
            &[request.key.as_str()],
            |cmd| {
                super::wire::script_arg(cmd, request.meter.peek_arg(request.rate))
                    .arg(request.burst);
            },
            Instant::now() + self.timeout,
        )
        .await
    }

    /// `lua/settle.lua`: one reservation settled, at most once, late too.
    pub(super) async fn settle_reservation(&self, settle: &Settle) -> Result<Settled, StoreError> {
        let Some(reserve) = settle.bucket.meter.reserve() else {
            return Err(StoreError::Other("not a reservation".into()));
        };
        let bucket = &settle.bucket;
        let reservations = crate::store::reservations_key(&bucket.key);
        let late = crate::store::late_reservations_key(&bucket.key);
        let reply = self
            .run_script(
                &self.settle_script,
                &[bucket.key.as_str(), reservations.as_str(), late.as_str()],
                |cmd| {
                    cmd.arg(bucket.rate)
                        .arg(bucket.burst)
                        .arg(bucket.cost)
                        .arg(settle.max_debt)
                        .arg(reserve.member(settle.estimate))
                        .arg(reserve.expiry_code());
                },
                Instant::now() + self.timeout,
            )
            .await?;
        let malformed = || StoreError::Script(format!("unexpected settle reply {reply:?}"));
        let text = match &reply {
            Value::BulkString(bytes) => std::str::from_utf8(bytes).map_err(|_| malformed())?,
            Value::SimpleString(text) => text.as_str(),
            _ => return Err(malformed()),
        };
        Settled::read(text).ok_or_else(malformed)
    }

    /// `lua/release.lua`: one lease given back; whether it was held.
    pub(super) async fn release_lease(&self, key: &str, member: &str) -> Result<bool, StoreError> {
        let reply = self
            .run_script(
                &self.release_script,
                &[key],
                |cmd| {
                    cmd.arg(member);
                },
                Instant::now() + self.timeout,
            )
            .await?;
        match reply {
            Value::Int(held) => Ok(held > 0),
            other => Err(StoreError::Script(format!(
                "unexpected release reply {other:?}"
            ))),
        }
    }

    pub(super) async fn reset_key(&self, key: &str) -> Result<bool, StoreError> {
        let channel = keys::resets_channel_of(key)
            .ok_or_else(|| StoreError::Other("not a bucket key".into()))?;
        let reply = self
            .run_script(
                &self.reset_script,
                &[key],
                |cmd| {
                    cmd.arg(channel.as_str());
                },
                Instant::now() + self.timeout,
            )
            .await?;
        match reply {
            Value::Int(existed) => Ok(existed > 0),
            other => Err(StoreError::Script(format!(
                "unexpected reset reply {other:?}"
            ))),
        }
    }
}

/// `"level"` (a bucket), `"level t w"` (a quota), `"level tokens held"` (a reserving or
/// borrowing bucket) → the key's state before any charge, and what is held aside.
fn parse_peek(
    reply: &Value,
    request: &BucketRequest,
) -> Result<(BucketOutcome, Option<Reserved>), StoreError> {
    let malformed = || StoreError::Script("malformed peek reply".into());
    let text = match reply {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).map_err(|_| malformed())?,
        Value::SimpleString(text) => text.as_str(),
        _ => return Err(malformed()),
    };
    let mut fields = text.split(' ');
    let tokens = fields
        .next()
        .and_then(|f| as_float(&Value::SimpleString(f.into())))
        .ok_or_else(malformed)?;
    let mut number = || fields.next()?.parse::<u64>().ok();
    let reserved = request.meter.read_held(&mut number).ok_or_else(malformed)?;
    let window = request
        .meter
        .read_window(&mut number)
        .ok_or_else(malformed)?;
    if fields.next().is_some() {
        return Err(malformed());
    }
    let outcome = BucketOutcome {
        tokens,
        enough: can_pay(tokens, request.cost),
        window,
    };
    Ok((outcome, reserved))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::calendar::Period;

    fn bucket() -> BucketRequest {
        BucketRequest::bucket("tg:l:{k}", 1.0, 5.0)
    }

    #[test]
    fn peek_replies_parse_and_malformed_ones_are_errors() {
        let text = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let (peeked, _) = parse_peek(&text("0.5"), &bucket()).unwrap();
        assert_eq!(peeked.tokens, 0.5);
        assert!(!peeked.enough);
        let quota = BucketRequest::quota("tg:l:{k}", Period::Day, 5);
        let (peeked, _) = parse_peek(&text("3 60 86400"), &quota).unwrap();
        assert_eq!(peeked.tokens, 3.0);
        assert_eq!(peeked.window.map(|w| w.ends_in_s), Some(60));
        for bad in ["", "x", "1 2"] {
            assert!(parse_peek(&text(bad), &bucket()).is_err(), "{bad:?}");
        }
        assert!(parse_peek(&text("3 60"), &quota).is_err());
    }
}
