//! A region's side of one limit across regions in Redis: `lua/global_share.lua` writes a
//! global limit's share beside the key's bucket, after bringing the bucket to now under the
//! old one, in one atomic call; `lua/region.lua` keeps the demand and the reporter's lease.

use std::time::Instant;

use redis::Value;

use super::RedisStore;
use crate::kinds::global::Share;
use crate::kinds::{BucketRequest, Kind, Meter};
use crate::store::region::{RegionOp, RegionReply};
use crate::store::StoreError;

impl RedisStore {
    /// `lua/global_share.lua` for `request`'s key: its level (micro-tokens) and Redis's now.
    pub(super) async fn put_share_at(
        &self,
        request: &BucketRequest,
        share: Share,
    ) -> Result<(f64, u64), StoreError> {
        if !matches!(request.meter, Meter::Global(_)) {
            return Err(StoreError::Other("not a global limit's key".into()));
        }
        let reply = self
            .run_script(
                &self.global_share_script,
                &[request.key.as_str()],
                |cmd| {
                    super::wire::script_arg(cmd, request.meter.script_arg(request.rate))
                        .arg(request.burst)
                        .arg(format!("{:?}", share.rate))
                        .arg(share.size)
                        .arg(share.until_us);
                },
                Instant::now() + self.timeout,
            )
            .await?;
        let text = match &reply {
            Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            Value::SimpleString(text) => text.clone(),
            other => {
                return Err(StoreError::Script(format!(
                    "unexpected share reply {other:?}"
                )))
            }
        };
        let mut fields = text.split(' ').map(str::parse::<u64>);
        match (fields.next(), fields.next()) {
            (Some(Ok(level)), Some(Ok(now))) => Ok((crate::base::rate::count_f64(level), now)),
            _ => Err(StoreError::Script(format!(
                "unexpected share reply {text:?}"
            ))),
        }
    }

    /// `lua/region.lua`: one operation of the region's bookkeeping.
    pub(super) async fn region_at(&self, op: RegionOp) -> Result<RegionReply, StoreError> {
        let deadline = Instant::now() + self.timeout;
        match op {
            RegionOp::Add {
                hash,
                counts,
                ttl_ms,
            } => {
                self.run_script(
                    &self.region_script,
                    &[hash.as_str()],
                    |cmd| {
                        cmd.arg("add").arg(ttl_ms);
                        for (field, count) in &counts {
                            cmd.arg(field.as_str()).arg(*count);
                        }
                    },
                    deadline,
                )
                .await?;
                Ok(RegionReply::Added)
            }
            RegionOp::Lease {
                key,
                holder,
                ttl_ms,
            } => {
                let reply = self
                    .run_script(
                        &self.region_script,
                        &[key.as_str()],
                        |cmd| {
                            cmd.arg("lease").arg(holder.as_str()).arg(ttl_ms);
                        },
                        deadline,
                    )
                    .await?;
                Ok(RegionReply::Lease(matches!(reply, Value::Int(1))))
            }
            RegionOp::Share { key } => {
                let reply = self
                    .run_script(
                        &self.region_script,
                        &[key.as_str()],
                        |cmd| {
                            cmd.arg("share");
                        },
                        deadline,
                    )
                    .await?;
                let malformed = || StoreError::Script("unexpected share reply".into());
                let Value::Array(items) = reply else {
                    return Err(malformed());
                };
                let text = |value: Option<&Value>| match value {
                    Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                    Some(Value::SimpleString(text)) => text.clone(),
                    _ => String::new(),
                };
                let now_us = text(items.first()).parse().map_err(|_| malformed())?;
                let record = text(items.get(1));
                let mut fields = record.split(' ');
                let share = match (fields.next(), fields.next(), fields.next()) {
                    (Some(rate), Some(size), Some(until)) => Some(Share {
                        rate: rate.parse().map_err(|_| malformed())?,
                        size: size.parse().map_err(|_| malformed())?,
                        until_us: until.parse().map_err(|_| malformed())?,
                    }),
                    _ => None,
                };
                Ok(RegionReply::Share { now_us, share })
            }
            RegionOp::Drain { hash } => {
                let reply = self
                    .run_script(
                        &self.region_script,
                        &[hash.as_str()],
                        |cmd| {
                            cmd.arg("drain");
                        },
                        deadline,
                    )
                    .await?;
                let malformed = || StoreError::Script("unexpected drain reply".into());
                let Value::Array(items) = reply else {
                    return Err(malformed());
                };
                let texts: Vec<String> = items
                    .iter()
                    .map(|item| match item {
                        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                        Value::SimpleString(text) => text.clone(),
                        Value::Int(n) => n.to_string(),
                        _ => String::new(),
                    })
                    .collect();
                let (now, rest) = texts.split_first().ok_or_else(malformed)?;
                let now_us = now.parse().map_err(|_| malformed())?;
                let counts = rest
                    .chunks(2)
                    .filter_map(|pair| match pair {
                        [field, count] => Some((field.clone(), count.parse().ok()?)),
                        _ => None,
                    })
                    .collect();
                Ok(RegionReply::Drained { now_us, counts })
            }
        }
    }
}
