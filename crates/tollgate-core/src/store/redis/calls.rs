//! The bucket scripts' calls: a check decided by `lua/token_bucket.lua` (alone, or in the call
//! this thread sends next with the checks queued beside it), a refund of what one slot charged
//! (`lua/refund.lua`), the reports of one slot (`lua/report.lua`). Each bucket is spelled to
//! the scripts by its kind (`wire`).

use std::time::Instant;

use redis::{Cmd, Value};

use super::deadline;
use super::script::LuaScript;
use super::wire::{as_float, bucket_args, parse_decision, parse_report};
use super::RedisStore;
use crate::kinds::{BucketOutcome, BucketRequest, ReportCharge};
use crate::store::{StoreDecision, StoreError};

impl RedisStore {
    /// One `token_bucket.lua` call deciding `buckets` atomically (on a Cluster they must share
    /// a slot). Also returns the Redis time the call ran at, which a refund needs.
    pub(super) async fn charge(
        &self,
        buckets: &[&BucketRequest],
        deadline: Instant,
    ) -> Result<(StoreDecision, String), StoreError> {
        let shadow = |i: usize| if buckets[i].shadow { "1" } else { "0" };
        let reply = self
            .per_bucket(&self.bucket_script, buckets, shadow, deadline)
            .await?;
        parse_decision(reply, buckets)
    }

    /// As [`RedisStore::charge`], in whichever call this thread sends next (see
    /// `redis/coalesce.rs`).
    pub(super) async fn charge_coalesced(
        &self,
        buckets: &[&BucketRequest],
        deadline: Instant,
    ) -> Result<StoreDecision, StoreError> {
        let script = &self.bucket_script;
        let call = self.begin(script)?;
        let Some(answer) = self.coalescer.submit(buckets, call.whole, deadline) else {
            return Err(StoreError::Other(
                "no async runtime to call Redis from".into(),
            ));
        };
        let result = match deadline::until(deadline, answer).await {
            Ok(Ok(result)) => result,
            // The call's task ended without answering: its runtime is shutting down.
            Ok(Err(_dropped)) => Err(StoreError::Other("the Redis call was dropped".into())),
            Err(_elapsed) => Err(StoreError::Timeout),
        };
        let reply = self.finish(script, &call, result)?;
        parse_decision(reply, buckets).map(|(decision, _)| decision)
    }

    /// Gives back `cost` to each bucket charged by the call whose `charged_at` (per bucket:
    /// that call's `now`, or a quota's period start) is given (`lua/refund.lua`); returns the
    /// tokens each holds afterwards.
    pub(super) async fn refund(
        &self,
        buckets: &[&BucketRequest],
        charged_at: &[String],
        deadline: Instant,
    ) -> Result<Vec<f64>, StoreError> {
        let reply = self
            .per_bucket(
                &self.refund_script,
                buckets,
                |i| charged_at[i].as_str(),
                deadline,
            )
            .await?;
        let malformed = || StoreError::Script("malformed refund reply".into());
        let Value::Array(items) = reply else {
            return Err(malformed());
        };
        if items.len() != buckets.len() {
            return Err(malformed());
        }
        items
            .iter()
            .map(|v| as_float(v).ok_or_else(malformed))
            .collect()
    }

    /// Runs a script whose `KEYS` are the buckets' keys and whose `ARGV` holds, per bucket,
    /// its rate (a quota: its period code), burst (or quota), cost and one script-specific
    /// value (`last`, given the bucket's index).
    async fn per_bucket<'a>(
        &self,
        script: &LuaScript,
        buckets: &[&BucketRequest],
        last: impl Fn(usize) -> &'a str,
        deadline: Instant,
    ) -> Result<Value, StoreError> {
        let keys: Vec<&str> = buckets.iter().map(|b| b.key.as_str()).collect();
        let args = |cmd: &mut Cmd| {
            for (i, bucket) in buckets.iter().enumerate() {
                bucket_args(cmd, bucket, last(i));
            }
        };
        self.run_script(script, &keys, args, deadline).await
    }

    /// One `lua/report.lua` call charging `charges` (on a Cluster they must share a slot).
    pub(super) async fn report_slot(
        &self,
        charges: &[&ReportCharge],
        deadline: Instant,
    ) -> Result<Vec<BucketOutcome>, StoreError> {
        let buckets: Vec<&BucketRequest> = charges.iter().map(|c| &c.bucket).collect();
        let debts: Vec<String> = charges.iter().map(|c| c.max_debt.to_string()).collect();
        let reply = self
            .per_bucket(
                &self.report_script,
                &buckets,
                |i| debts[i].as_str(),
                deadline,
            )
            .await?;
        parse_report(reply, &buckets)
    }
}
