//! RLQS shares in Redis: `lua/shares.lua` decides one holder's report on Redis's clock, in
//! one atomic call per pool, so replicas never hand out the same capacity; `lua/shares_peek.lua`
//! reads a pool. Both go through the breaker, deadline and script loading of a check.

use std::time::Instant;

use redis::Value;

use super::RedisStore;
use crate::store::shares::{Grant, Holding, ShareRequest, ESCROW_FIELD};
use crate::store::StoreError;

pub const SHARES_SCRIPT: &str = include_str!("../../../lua/shares.lua");
pub const SHARES_PEEK_SCRIPT: &str = include_str!("../../../lua/shares_peek.lua");

impl RedisStore {
    pub(super) async fn share_pool(&self, request: &ShareRequest) -> Result<Grant, StoreError> {
        let reply = self
            .run_script(
                &self.shares_script,
                &[request.key.as_str()],
                |cmd| {
                    cmd.arg(request.holder.as_str())
                        .arg(request.requests)
                        .arg(request.rate_units)
                        .arg(request.size_units)
                        .arg(request.reserve_rate)
                        .arg(request.reserve_size)
                        .arg(request.fill_interval_s)
                        .arg(request.hold_us);
                },
                Instant::now() + self.timeout,
            )
            .await?;
        let malformed = || StoreError::Script(format!("unexpected shares reply {reply:?}"));
        let Value::Array(items) = &reply else {
            return Err(malformed());
        };
        let numbers: Vec<u64> = items
            .iter()
            .map(|item| match item {
                Value::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(malformed)?;
        let [rate, size, holders, counted_rate, counted_size] = numbers[..] else {
            return Err(malformed());
        };
        Ok(Grant {
            rate,
            size,
            holders,
            counted_rate,
            counted_size,
        })
    }

    pub(super) async fn shares_at(
        &self,
        key: &str,
    ) -> Result<(u64, Vec<(String, Holding)>), StoreError> {
        let reply = self
            .run_script(
                &self.shares_peek_script,
                &[key],
                |_| {},
                Instant::now() + self.timeout,
            )
            .await?;
        let Value::Array(items) = &reply else {
            return Err(StoreError::Script(format!(
                "unexpected shares peek reply {reply:?}"
            )));
        };
        let text = |value: &Value| match value {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            Value::SimpleString(text) => Some(text.clone()),
            _ => None,
        };
        let now = items
            .first()
            .and_then(text)
            .and_then(|now| now.parse().ok())
            .ok_or_else(|| StoreError::Script("shares peek: no time".into()))?;
        let mut holders: Vec<(String, Holding)> = items[1..]
            .chunks(2)
            .filter_map(|pair| {
                let id = text(pair.first()?)?;
                if id == ESCROW_FIELD {
                    return None;
                }
                let holding = Holding::decode(&text(pair.get(1)?)?)?;
                Some((id, holding))
            })
            .collect();
        holders.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((now, holders))
    }
}
