//! The Redis store: `lua/token_bucket.lua` run with `EVALSHA` over one multiplexed async
//! connection shared by every worker (one round trip per check, no worker ever blocks).
//!
//! Failure handling, in layers: every call has a deadline of `store.timeout_ms` (connection
//! wait included); the connection manager reconnects after a dropped connection, one attempt
//! at a time, so a refused or rejected connection fails at once with its real cause; a circuit
//! breaker stops calling a Redis that keeps failing; `NOSCRIPT` (a restarted or flushed Redis)
//! is answered by re-sending the script with `EVAL`, once.
//!
//! Whenever the breaker opens (or a probe fails), the connection is replaced by a fresh, lazily
//! connected one: a connection that went silent (a Redis host gone without a reset, a black hole)
//! never reports an error, only timeouts, and would otherwise be kept forever. The breaker's
//! pause is thus the reconnect backoff.

use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, RedisError, Value};

use super::breaker::{Admission, Breaker};
use super::{BucketOutcome, BucketRequest, Store, StoreDecision, StoreError};
use crate::metrics::Metrics;

const BUCKET_SCRIPT: &str = include_str!("../../lua/token_bucket.lua");
const INSTANCES_SCRIPT: &str = include_str!("../../lua/instances.lua");

/// Longest pause between reconnect attempts: short, so recovery follows Redis within ~0.5 s.
const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// A Lua script and its SHA1, as `EVALSHA` wants it.
struct LuaScript {
    source: &'static str,
    sha: String,
}

impl LuaScript {
    fn new(source: &'static str) -> LuaScript {
        LuaScript {
            source,
            sha: redis::Script::new(source).get_hash().to_string(),
        }
    }

    /// `EVALSHA sha numkeys keys... args...`, or `EVAL source ...` when `by_source`.
    fn command(&self, by_source: bool, keys: &[&str], args: impl FnOnce(&mut Cmd)) -> Cmd {
        let mut cmd = if by_source {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(self.source);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&self.sha);
            cmd
        };
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        args(&mut cmd);
        cmd
    }
}

pub struct RedisStore {
    /// Swapped whole by [`RedisStore::renew_connection`].
    connection: ArcSwap<ConnectionManager>,
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
    bucket_script: LuaScript,
    instances_script: LuaScript,
    timeout: Duration,
    breaker: Breaker,
    metrics: Metrics,
}

impl RedisStore {
    /// Creates the store without connecting: tollgate must start (and answer per `on_error`)
    /// while Redis is down. Must be called inside a Tokio runtime.
    pub fn connect_lazily(
        url: &str,
        timeout: Duration,
        metrics: Metrics,
    ) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url)
            // The parser's message may quote the URL, password included: name only the kind.
            .map_err(|e| StoreError::Other(format!("invalid Redis URL ({:?})", e.kind())))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_max_delay(MAX_RECONNECT_DELAY)
            // One attempt per call: the breaker paces reconnection (see `renew_connection`),
            // and the log shows the real error (refused, wrong password) rather than a
            // deadline spent on retries.
            .set_number_of_retries(0);
        let connection = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| StoreError::Other(e.to_string()))?;
        Ok(RedisStore {
            connection: ArcSwap::from_pointee(connection),
            client,
            manager_config: config,
            bucket_script: LuaScript::new(BUCKET_SCRIPT),
            instances_script: LuaScript::new(INSTANCES_SCRIPT),
            timeout,
            breaker: Breaker::new(metrics.store_up.clone(), "redis"),
            metrics,
        })
    }

    /// Runs a script through the breaker and the deadline, reloading it on `NOSCRIPT`.
    async fn run_script(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: impl Fn(&mut Cmd),
    ) -> Result<Value, StoreError> {
        if self.breaker.admit() == Admission::Reject {
            return Err(StoreError::Unavailable);
        }
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, async {
            let mut connection = self.connection();
            match script
                .command(false, keys, &args)
                .query_async(&mut connection)
                .await
            {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script
                        .command(true, keys, &args)
                        .query_async(&mut connection)
                        .await
                }
                other => other,
            }
        })
        .await;
        self.metrics
            .store_duration
            .observe(started.elapsed().as_secs_f64());
        let result = match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_elapsed) => Err(StoreError::Timeout),
        };
        match &result {
            Ok(_) => self.breaker.on_success(),
            Err(e) => {
                self.count_error(e);
                if self.breaker.on_failure(e) {
                    self.renew_connection();
                }
            }
        }
        result
    }

    fn connection(&self) -> ConnectionManager {
        ConnectionManager::clone(&self.connection.load())
    }

    /// Drops the current connection for a fresh lazy one, connected by the next call.
    fn renew_connection(&self) {
        match ConnectionManager::new_lazy_with_config(
            self.client.clone(),
            self.manager_config.clone(),
        ) {
            Ok(fresh) => self.connection.store(std::sync::Arc::new(fresh)),
            Err(e) => log::debug!("cannot renew the Redis connection: {:?}", e.kind()),
        }
    }

    fn count_error(&self, error: &StoreError) {
        let counters = &self.metrics.store_errors;
        match error {
            StoreError::Timeout => counters.timeout.inc(),
            StoreError::Connection(_) => counters.connection.inc(),
            StoreError::Script(_) => counters.script.inc(),
            StoreError::Other(_) => counters.other.inc(),
            StoreError::Unavailable => {}
        }
    }

    /// Records this instance as live and returns how many instances share this Redis (for
    /// `on_error = "local"`).
    pub async fn heartbeat(
        &self,
        registry_key: &str,
        instance: &str,
        ttl: Duration,
    ) -> Result<u64, StoreError> {
        let ttl_ms = ttl.as_millis() as u64;
        let value = self
            .run_script(&self.instances_script, &[registry_key], |cmd| {
                cmd.arg(instance).arg(ttl_ms);
            })
            .await?;
        match value {
            Value::Int(n) if n > 0 => Ok(n as u64),
            other => Err(StoreError::Script(format!("unexpected reply {other:?}"))),
        }
    }
}

impl Store for RedisStore {
    async fn decide(&self, buckets: &[BucketRequest]) -> Result<StoreDecision, StoreError> {
        if buckets.is_empty() {
            return Ok(StoreDecision {
                allowed: true,
                buckets: Vec::new(),
            });
        }
        let keys: Vec<&str> = buckets.iter().map(|b| b.key.as_str()).collect();
        let reply = self
            .run_script(&self.bucket_script, &keys, |cmd| {
                for bucket in buckets {
                    cmd.arg(bucket.rate)
                        .arg(bucket.burst)
                        .arg(bucket.cost)
                        .arg(if bucket.shadow { "1" } else { "0" });
                }
            })
            .await?;
        parse_decision(reply, buckets.len())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        if self.breaker.admit() == Admission::Reject {
            return Err(StoreError::Unavailable);
        }
        let mut connection = self.connection();
        let result = tokio::time::timeout(
            self.timeout,
            redis::cmd("PING").query_async::<Value>(&mut connection),
        )
        .await;
        let result = match result {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_) => Err(StoreError::Timeout),
        };
        match &result {
            Ok(()) => self.breaker.on_success(),
            Err(e) => {
                if self.breaker.on_failure(e) {
                    self.renew_connection();
                }
            }
        }
        result
    }
}

/// `{allowed, tokens_1, enough_1, ...}` → [`StoreDecision`].
fn parse_decision(reply: Value, count: usize) -> Result<StoreDecision, StoreError> {
    let malformed = || StoreError::Script("malformed token bucket reply".into());
    let Value::Array(items) = reply else {
        return Err(malformed());
    };
    if items.len() != 1 + 2 * count {
        return Err(malformed());
    }
    let allowed = as_int(&items[0]).ok_or_else(malformed)? == 1;
    let buckets = items[1..]
        .chunks_exact(2)
        .map(|pair| {
            Some(BucketOutcome {
                tokens: as_float(&pair[0])?,
                enough: as_int(&pair[1])? == 1,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(malformed)?;
    Ok(StoreDecision { allowed, buckets })
}

fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn as_float(value: &Value) -> Option<f64> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        Value::Double(x) => Some(*x),
        Value::Int(n) => Some(*n as f64),
        _ => None,
    }
}

/// Maps a client error onto the kinds counted in `tollgate_store_errors_total`.
fn classify(error: &RedisError) -> StoreError {
    if error.is_timeout() {
        StoreError::Timeout
    } else if error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error()
    {
        StoreError::Connection(error.to_string())
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

    #[test]
    fn replies_parse_into_decisions() {
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"4.5".to_vec()),
            Value::Int(1),
        ]);
        let decision = parse_decision(reply, 1).unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.buckets[0].tokens, 4.5);
        assert!(parse_decision(Value::Array(vec![Value::Int(1)]), 1).is_err());
    }

    #[test]
    fn the_script_sha_is_stable() {
        let script = LuaScript::new(BUCKET_SCRIPT);
        assert_eq!(script.sha.len(), 40);
    }
}
