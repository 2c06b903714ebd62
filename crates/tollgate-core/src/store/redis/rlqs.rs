//! RLQS shares in Redis: `lua/rlqs.lua` decides holders' reports on Redis's clock, each pool
//! atomically, several pools per call, so replicas never hand out the same capacity;
//! `lua/rlqs_peek.lua` reads a pool. Reports go through RLQS's own breaker and deadline
//! ([`Lane::Shares`]): a flood of reports never opens the checks' breaker.

use std::time::Instant;

use redis::{Cmd, Value};

use super::{cross_slot, Lane, RedisStore};
use crate::store::rlqs::{Grant, Holding, ShareRequest, ESCROW_FIELD};
use crate::store::StoreError;

pub const SHARES_SCRIPT: &str = include_str!("../../../../../lua/rlqs.lua");
pub const SHARES_PEEK_SCRIPT: &str = include_str!("../../../../../lua/rlqs_peek.lua");

impl RedisStore {
    /// The reports decided, one result per request. On a Cluster one call per slot, one after
    /// the other (the caller bounds the calls in flight).
    pub(super) async fn share_pools(
        &self,
        requests: &[ShareRequest],
        deadline: Instant,
    ) -> Vec<Result<Grant, StoreError>> {
        let groups = if self.connection.is_cluster() {
            cross_slot::group_keys_by_slot(requests.iter().map(|r| r.key.as_str()))
        } else {
            vec![(0..requests.len()).collect()]
        };
        let mut results: Vec<Option<Result<Grant, StoreError>>> = vec![None; requests.len()];
        for group in groups {
            let members: Vec<&ShareRequest> = group.iter().map(|&i| &requests[i]).collect();
            match self.share_slot(&members, deadline).await {
                Ok(grants) => {
                    for (&i, grant) in group.iter().zip(grants) {
                        results[i] = Some(grant);
                    }
                }
                Err(error) => {
                    for &i in &group {
                        results[i] = Some(Err(error.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(StoreError::Script("no share decided".into()))))
            .collect()
    }

    /// One `lua/rlqs.lua` call for `requests` (on a Cluster they share a slot).
    /// The pools of one slot, in as many calls as the script needs: it decides pools in
    /// order until the holders it read would make a call long, and leaves the rest for the
    /// next call. A failed call fails the pools not yet decided.
    async fn share_slot(
        &self,
        requests: &[&ShareRequest],
        deadline: Instant,
    ) -> Result<Vec<Result<Grant, StoreError>>, StoreError> {
        let mut grants = Vec::with_capacity(requests.len());
        let mut rest = requests;
        while !rest.is_empty() {
            let replies = match self.share_call(rest, deadline).await {
                Ok(replies) => replies,
                Err(error) if grants.is_empty() => return Err(error),
                Err(error) => {
                    grants.extend(rest.iter().map(|_| Err(error.clone())));
                    break;
                }
            };
            let (decided, later) = rest.split_at(replies.len());
            grants.extend(
                replies
                    .iter()
                    .zip(decided)
                    .map(|(reply, request)| parse_grant(reply, request)),
            );
            rest = later;
        }
        Ok(grants)
    }

    /// One script call for `requests`: the replies of the first of them it decided (at least
    /// one).
    async fn share_call(
        &self,
        requests: &[&ShareRequest],
        deadline: Instant,
    ) -> Result<Vec<Value>, StoreError> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key.as_str()).collect();
        let args = |cmd: &mut Cmd| {
            for request in requests {
                share_args(cmd, request);
            }
        };
        let reply = self
            .run_script_in(Lane::Shares, &self.shares_script, &keys, args, deadline)
            .await?;
        let Value::Array(replies) = reply else {
            return Err(StoreError::Script(format!(
                "unexpected shares reply {reply:?}"
            )));
        };
        if replies.is_empty() || replies.len() > requests.len() {
            return Err(StoreError::Script(format!(
                "{} shares replies to {} reports",
                replies.len(),
                requests.len()
            )));
        }
        Ok(replies)
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

/// One pool's arguments, as `lua/rlqs.lua` reads them.
fn share_args(cmd: &mut Cmd, request: &ShareRequest) {
    cmd.arg(request.holder.as_str())
        .arg(request.rate_units)
        .arg(request.size_units)
        .arg(request.reserve_rate)
        .arg(request.reserve_size)
        .arg(request.fill_interval_s)
        .arg(request.hold_us)
        .arg(request.max_holders)
        .arg(request.members.len());
    for member in &request.members {
        cmd.arg(u8::from(member.reported))
            .arg(member.requests)
            .arg(member.last.rate)
            .arg(member.last.size)
            .arg(member.last.until_us);
    }
}

/// One pool's reply: `{rate, size, holders, counted_rate, counted_size, now_us, (rate, size)
/// per reporting member}`.
fn parse_grant(reply: &Value, request: &ShareRequest) -> Result<Grant, StoreError> {
    let malformed = || StoreError::Script(format!("unexpected shares reply {reply:?}"));
    let Value::Array(items) = reply else {
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
    let reported = request.members.iter().filter(|m| m.reported).count();
    let [rate, size, holders, counted_rate, counted_size, now_us, ref parts @ ..] = numbers[..]
    else {
        return Err(malformed());
    };
    if parts.len() != 2 * reported {
        return Err(malformed());
    }
    Ok(Grant {
        rate,
        size,
        holders,
        counted_rate,
        counted_size,
        now_us,
        members: parts.chunks(2).map(|pair| (pair[0], pair[1])).collect(),
    })
}
