//! The Redis store: `lua/token_bucket.lua` run with `EVALSHA` over multiplexed async
//! connections (one round trip per check, no worker ever blocks), to one node, a Cluster or a
//! Sentinel-managed master (`redis/connection.rs`). Checks that queue on one thread together
//! are decided by one call in the script's batch form (`redis/coalesce.rs`). To one node, each worker has a connection
//! of its own, driven on its own thread; readiness asks every one of them.
//!
//! Failure handling, in layers: every call has a deadline of `store.timeout_ms` (connection
//! wait included); a dropped connection is re-established one attempt per call, so a refused
//! or rejected connection fails at once with its real cause (a Cluster refreshes its slot map,
//! Sentinel is asked for the new master); a circuit breaker stops calling a Redis that keeps
//! failing, and each time it opens a single-node connection is replaced by a fresh one, since a
//! connection that went silent (a host gone without a reset, a black hole) reports only
//! timeouts and would otherwise be kept forever. A connection that may be new (first use, a
//! failed call, a renewal, a new Sentinel master) is sent the script whole (`EVAL`), so a
//! (re)connect costs one round trip beyond the connect itself; `NOSCRIPT` anyway (a node
//! restarted or promoted behind the same connection) is answered by `EVAL`, once, to the same
//! node. Every socket runs with `TCP_NODELAY`: concurrent calls share a connection, and
//! Nagle's algorithm would hold each write back until the previous one is acknowledged.
//!
//! On a Cluster, a script may only touch keys of one slot. A request whose buckets span slots
//! is decided by `redis/cross_slot.rs`: per slot, all at once, refunding what was charged when
//! another slot denies.
mod admin;
mod calls;
mod coalesce;
mod connection;
mod cross_slot;
mod deadline;
mod global;
pub mod overrides;
pub mod resets;
mod rlqs;
pub mod script;
mod sentinel;
mod wire;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::{Cmd, TlsCertificates, Value};

use self::coalesce::Coalescer;
use self::connection::Connection;
pub use self::connection::{certificates, Topology};
use self::script::{
    call_script, LuaScript, BUCKET_SCRIPT, INSTANCES_SCRIPT, REFUND_SCRIPT, REPORT_SCRIPT,
};
use self::wire::classify;
use super::breaker::{Admission, Breaker, Failure};
use super::{Store, StoreDecision, StoreError};
use crate::base::timings::Timings;
use crate::kinds::reserve::{Settle, Settled};
use crate::kinds::{BucketOutcome, BucketRequest, ReportCharge, Reserved};
use crate::observe::metrics::Metrics;

/// Which calls a script call belongs to, and so which breaker admits it and learns from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Checks, reports and the admin's reads: the breaker `tollgate_store_up` mirrors, whose
    /// opening renews the connection and answers checks per `on_error`.
    Checks,
    /// RLQS's reports: a breaker of their own. A flood of them that times out opens only it;
    /// they never renew the connection or count in the checks' latency and error metrics.
    Shares,
}

/// A script call admitted by the breaker.
struct Call {
    started: Instant,
    /// The connection epoch it was sent in.
    epoch: u64,
    /// Send the script whole (`EVAL`).
    whole: bool,
}

pub struct RedisStore {
    connection: Arc<Connection>,
    /// Batches the checks that queue on a thread into one `token_bucket.lua` call.
    coalescer: Coalescer,
    /// Bumped by every call that failed in a way that may replace the connection (dropped,
    /// refused, timed out): the next connection starts without our scripts.
    failures: AtomicU64,
    /// Shared with the coalescer, which sends it for batched checks.
    bucket_script: Arc<LuaScript>,
    report_script: LuaScript,
    refund_script: LuaScript,
    instances_script: LuaScript,
    peek_script: LuaScript,
    reset_script: LuaScript,
    release_script: LuaScript,
    settle_script: LuaScript,
    shares_script: LuaScript,
    shares_peek_script: LuaScript,
    global_share_script: LuaScript,
    region_script: LuaScript,
    timeout: Duration,
    breaker: Breaker,
    /// RLQS's reports' breaker (see [`Lane::Shares`]).
    shares_breaker: Breaker,
    /// Why the store refuses scripts, while it does: readiness says so even while the
    /// breaker keeps calls away.
    scripts_refused: ArcSwapOption<String>,
    /// The connection epoch in which the store last ran a script (a probe's or a call's): a
    /// probe in a newer one asks again.
    scripts_ran_in: AtomicU64,
    /// Set by the first call or probe the store answered: not ready until then.
    answered: AtomicBool,
    metrics: Metrics,
}

impl RedisStore {
    /// Creates the store without connecting: tollgate must start (and answer per `on_error`)
    /// while Redis is down. Must be called inside a Tokio runtime. `timings` paces the breaker
    /// and the following of a Sentinel master.
    pub fn open(
        topology: &Topology<'_>,
        tls: Option<&TlsCertificates>,
        timeout: Duration,
        metrics: Metrics,
        timings: &Timings,
    ) -> Result<RedisStore, StoreError> {
        let connection = Arc::new(Connection::open(topology, tls, timeout, timings)?);
        let bucket_script = Arc::new(LuaScript::new(BUCKET_SCRIPT));
        Ok(RedisStore {
            coalescer: Coalescer::new(Arc::clone(&connection), Arc::clone(&bucket_script)),
            connection,
            failures: AtomicU64::new(0),
            bucket_script,
            report_script: LuaScript::new(REPORT_SCRIPT),
            refund_script: LuaScript::new(REFUND_SCRIPT),
            instances_script: LuaScript::new(INSTANCES_SCRIPT),
            peek_script: LuaScript::new(admin::PEEK_SCRIPT),
            reset_script: LuaScript::new(admin::RESET_SCRIPT),
            release_script: LuaScript::new(admin::RELEASE_SCRIPT),
            settle_script: LuaScript::new(admin::SETTLE_SCRIPT),
            shares_script: LuaScript::new(rlqs::SHARES_SCRIPT),
            shares_peek_script: LuaScript::new(rlqs::SHARES_PEEK_SCRIPT),
            global_share_script: LuaScript::new(script::GLOBAL_SHARE_SCRIPT),
            region_script: LuaScript::new(script::REGION_SCRIPT),
            timeout,
            breaker: Breaker::new(metrics.store_up.clone(), "redis", timings.breaker_open_for),
            shares_breaker: Breaker::new(
                metrics.rlqs.store_up.clone(),
                "redis (RLQS reports)",
                timings.breaker_open_for,
            ),
            scripts_refused: ArcSwapOption::empty(),
            // No epoch yet: the first probe asks.
            scripts_ran_in: AtomicU64::new(u64::MAX),
            answered: AtomicBool::new(false),
            metrics,
        })
    }

    /// Has checks queued on a thread wait `window` for one another before their script call
    /// goes out (`store.coalesce_window_ms`).
    pub fn with_coalesce_window(mut self, window: Duration) -> RedisStore {
        self.coalescer = self.coalescer.with_window(window);
        self
    }

    /// Connects the calling thread's connection now (see `Connection::warm_up`), patient as
    /// a connect is, then probes it, so a store that refuses scripts is said at start.
    pub async fn warm_up(&self) {
        self.connection
            .warm_up(connection::connect_timeout(self.timeout))
            .await;
        self.ask_scripts().await;
    }

    /// Runs a trivial script once, so that a store refusing scripts is said at start. Only
    /// that refusal counts: a store not answering yet is the checks' and probes' to find, as
    /// before, and must not open the breaker ahead of the first check.
    async fn ask_scripts(&self) {
        if self.admit().is_err() {
            return;
        }
        let epoch = self.epoch();
        let script = redis::cmd("EVAL").arg("return 1").arg(0).clone();
        let by = Instant::now() + connection::connect_timeout(self.timeout);
        match deadline::until(by, self.connection.query(&script)).await {
            Ok(Ok(_)) => self.on_success(epoch),
            Ok(Err(e)) => {
                if let error @ StoreError::ScriptsRefused(_) = classify(&e) {
                    self.on_failure(&error);
                }
            }
            Err(_elapsed) => {}
        }
    }

    /// Which connection calls go over now: changes when the connection may have been replaced.
    fn epoch(&self) -> u64 {
        self.failures
            .load(Ordering::Acquire)
            .wrapping_add(self.connection.generation())
    }

    /// Runs a script through the breaker and the deadline. On a connection that has not run it
    /// yet the script is sent whole (`EVAL`, which also loads it), so the first call after a
    /// (re)connect costs one round trip, not `EVALSHA` + `NOSCRIPT` + `EVAL`; a `NOSCRIPT`
    /// anyway (a node restarted, flushed or promoted behind the same connection) is answered
    /// by `EVAL`, once, to the same node.
    async fn run_script(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: impl Fn(&mut Cmd),
        deadline: Instant,
    ) -> Result<Value, StoreError> {
        self.run_script_in(Lane::Checks, script, keys, args, deadline)
            .await
    }

    /// [`RedisStore::run_script`] through `lane`'s breaker.
    async fn run_script_in(
        &self,
        lane: Lane,
        script: &LuaScript,
        keys: &[&str],
        args: impl Fn(&mut Cmd),
        deadline: Instant,
    ) -> Result<Value, StoreError> {
        let call = match lane {
            Lane::Checks => self.begin(script)?,
            Lane::Shares => self.begin_share(script)?,
        };
        let result = deadline::until(
            deadline,
            call_script(&self.connection, call.whole, |whole| {
                script.command(whole, keys, &args)
            }),
        )
        .await;
        let result = match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_elapsed) => Err(StoreError::Timeout),
        };
        match lane {
            Lane::Checks => self.finish(script, &call, result),
            Lane::Shares => self.finish_share(script, &call, result),
        }
    }

    /// Admits an RLQS report through its own breaker.
    fn begin_share(&self, script: &LuaScript) -> Result<Call, StoreError> {
        if self.shares_breaker.admit() == Admission::Reject {
            return Err(StoreError::Unavailable);
        }
        let epoch = self.epoch();
        Ok(Call {
            started: Instant::now(),
            epoch,
            whole: script.loaded_in.load(Ordering::Acquire) != epoch,
        })
    }

    /// Accounts for an RLQS report's result in its own breaker and error counter only. A
    /// connection it found broken is the checks' to renew: they meet it too.
    fn finish_share(
        &self,
        script: &LuaScript,
        call: &Call,
        result: Result<Value, StoreError>,
    ) -> Result<Value, StoreError> {
        match &result {
            Ok(_) => {
                script.loaded_in.store(call.epoch, Ordering::Release);
                self.shares_breaker.on_success();
            }
            Err(e) => {
                self.metrics.rlqs.store_errors.inc();
                self.shares_breaker.on_failure(e);
            }
        }
        result
    }

    /// Admits a call through the breaker and notes how to send `script` on this epoch.
    fn begin(&self, script: &LuaScript) -> Result<Call, StoreError> {
        self.admit()?;
        let epoch = self.epoch();
        Ok(Call {
            started: Instant::now(),
            epoch,
            whole: script.loaded_in.load(Ordering::Acquire) != epoch,
        })
    }

    /// Accounts for a call's result: latency, breaker, error counters, and whether `script`
    /// is now known to the connection.
    fn finish(
        &self,
        script: &LuaScript,
        call: &Call,
        result: Result<Value, StoreError>,
    ) -> Result<Value, StoreError> {
        self.metrics
            .store_duration
            .observe(call.started.elapsed().as_secs_f64());
        match &result {
            Ok(_) => {
                script.loaded_in.store(call.epoch, Ordering::Release);
                self.on_success(call.epoch);
            }
            Err(e) => {
                self.count_error(e);
                self.on_failure(e);
            }
        }
        result
    }

    /// The breaker's word on whether a call may go out now; while it keeps calls away from a
    /// store that refuses scripts, that is the answer.
    fn admit(&self) -> Result<(), StoreError> {
        match self.breaker.admit() {
            Admission::Reject => Err(match self.scripts_refused.load_full() {
                Some(why) => StoreError::ScriptsRefused(why.to_string()),
                None => StoreError::Unavailable,
            }),
            _ => Ok(()),
        }
    }

    /// A call or probe that ran a script in `epoch` (or, for a probe, found it known to run).
    fn on_success(&self, epoch: u64) {
        self.answered.store(true, Ordering::Release);
        self.scripts_ran_in.store(epoch, Ordering::Release);
        if self.scripts_refused.swap(None).is_some() {
            log::info!("redis runs tollgate's scripts again");
        }
        self.breaker.on_success();
    }

    /// A failed call: the breaker counts it, and the next script goes whole if the connection
    /// may be new. The connection is replaced when the breaker opens, and again when a probe
    /// fails on a connection that had time to connect: a younger one may still be connecting
    /// (a handshake takes several round trips, a call one), and replacing it at every probe
    /// would start each probe from nothing, never to recover from a far Redis.
    fn on_failure(&self, error: &StoreError) {
        if self.connection.discovering() {
            // The sentinels have not named a first master yet: no failure of the store, so the
            // breaker does not open ahead of it.
            self.note_failure(error);
            return;
        }
        let failure = match error {
            // No retry helps: the circuit opens at once, and stays open until a probe runs a
            // script.
            StoreError::ScriptsRefused(why) => {
                self.scripts_refused.store(Some(Arc::new(why.clone())));
                self.breaker.trip(error)
            }
            _ => self.breaker.on_failure(error),
        };
        match failure {
            Failure::Opened => self.connection.renew(),
            Failure::ProbeFailed => self
                .connection
                .renew_if_older_than(connection::connect_timeout(self.timeout)),
            Failure::Counted => {}
        }
        self.note_failure(error);
    }

    /// A call that timed out or lost its connection may leave the next call on a new one:
    /// scripts then go whole.
    fn note_failure(&self, error: &StoreError) {
        if matches!(error, StoreError::Timeout | StoreError::Connection(_)) {
            self.failures.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn count_error(&self, error: &StoreError) {
        let counters = &self.metrics.store_errors;
        match error {
            StoreError::Timeout => counters.timeout.inc(),
            StoreError::Connection(_) => counters.connection.inc(),
            StoreError::Script(_) | StoreError::ScriptsRefused(_) => counters.script.inc(),
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
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let value = self
            .run_script(
                &self.instances_script,
                &[registry_key],
                |cmd| {
                    cmd.arg(instance).arg(ttl_ms);
                },
                Instant::now() + self.timeout,
            )
            .await?;
        match value {
            Value::Int(n) if n > 0 => Ok(n.unsigned_abs()),
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
                slices: Vec::new(),
            });
        }
        // One deadline for the whole decision, refunds included.
        let deadline = Instant::now() + self.timeout;
        if self.connection.is_cluster() {
            let groups = cross_slot::group_by_slot(buckets);
            if groups.len() > 1 {
                return cross_slot::decide(self, buckets, &groups, deadline).await;
            }
        }
        let all: Vec<&BucketRequest> = buckets.iter().collect();
        self.charge_coalesced(&all, deadline).await
    }

    async fn report(&self, charges: &[ReportCharge]) -> Result<Vec<BucketOutcome>, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let groups = if self.connection.is_cluster() {
            cross_slot::group_keys_by_slot(charges.iter().map(|c| c.bucket.key.as_str()))
        } else {
            vec![(0..charges.len()).collect()]
        };
        // Nothing to undo across slots: a report is never refused. A failed slot fails the
        // whole answer (503), and the caller's retry may charge the other slots twice: the
        // store keeps no record of reports, so "at least once" is what a failure can promise.
        let calls = groups.iter().map(|group| {
            let members: Vec<&ReportCharge> = group.iter().map(|&i| &charges[i]).collect();
            async move { self.report_slot(&members, deadline).await }
        });
        let answers = futures_util::future::join_all(calls).await;
        let mut outcomes = vec![None; charges.len()];
        for (group, answer) in groups.iter().zip(answers) {
            for (&index, outcome) in group.iter().zip(answer?) {
                outcomes[index] = Some(outcome);
            }
        }
        outcomes
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| StoreError::Script("a slot answered for too few reports".into()))
    }

    async fn share(
        &self,
        requests: &[crate::store::rlqs::ShareRequest],
        deadline: Instant,
    ) -> Vec<Result<crate::store::rlqs::Grant, StoreError>> {
        self.share_pools(requests, deadline).await
    }

    async fn shares_of(
        &self,
        key: &str,
    ) -> Result<(u64, Vec<(String, crate::store::rlqs::Holding)>), StoreError> {
        self.shares_at(key).await
    }

    async fn peek(&self, bucket: &BucketRequest) -> Result<BucketOutcome, StoreError> {
        self.peek_key(bucket).await
    }

    async fn put_share(
        &self,
        bucket: &BucketRequest,
        share: crate::kinds::global::Share,
    ) -> Result<(f64, u64), StoreError> {
        self.put_share_at(bucket, share).await
    }

    async fn region(
        &self,
        op: crate::store::region::RegionOp,
    ) -> Result<crate::store::region::RegionReply, StoreError> {
        self.region_at(op).await
    }

    async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        self.reset_key(key).await
    }

    async fn release(&self, key: &str, member: &str) -> Result<bool, StoreError> {
        self.release_lease(key, member).await
    }

    async fn settle(&self, settle: &Settle) -> Result<Settled, StoreError> {
        self.settle_reservation(settle).await
    }

    async fn reserved(&self, bucket: &BucketRequest) -> Result<Reserved, StoreError> {
        self.reserved_at(bucket).await
    }

    fn splits_requests(&self) -> bool {
        self.connection.is_cluster()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.admit()?;
        let epoch = self.epoch();
        // Once per connection epoch the probe also runs a script: a store that answers PING
        // but refuses scripts cannot decide anything.
        let ask_scripts = self.scripts_ran_in.load(Ordering::Acquire) != epoch;
        // Sent together, so the probe still costs one round trip: readiness must not need two
        // where a check needs one.
        let probe = async {
            if ask_scripts {
                let script = redis::cmd("EVAL").arg("return 1").arg(0).clone();
                futures_util::future::try_join(
                    self.connection.ping(),
                    self.connection.query(&script),
                )
                .await?;
            } else {
                self.connection.ping().await?;
            }
            Ok::<_, redis::RedisError>(())
        };
        let result = match deadline::until(Instant::now() + self.timeout, probe).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_) => Err(StoreError::Timeout),
        };
        // The breaker and the connection learn from a probe as from a check; the error
        // counters count checks only, so probes every second do not swell them.
        match &result {
            Ok(()) => self.on_success(epoch),
            Err(e) => self.on_failure(e),
        }
        result
    }

    fn has_answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }
}
