//! Coalescing: the checks that reach one thread in one turn of its event loop are decided by
//! one `token_bucket.lua` call in its batch form, instead of one call each. Redis then pays one
//! `TIME`, one script invocation and one reply for the lot; the requests are still decided one
//! after another, in the order they arrived, so a batch decides exactly what separate calls
//! would have.
//!
//! Nothing waits for a batch to fill by default: the first check queued on a thread schedules
//! the call, which goes out once that thread has run its ready tasks and polled for I/O once
//! more (a poll that does not block while work is pending), carrying whatever was queued
//! meanwhile. A lone check goes alone, in the single form, a task hop later; under load the
//! batches grow by themselves (12.6 checks per call on average at saturation with 64
//! connections, where without the extra poll they were 8.7; latency at a distance is the same
//! either way). With `store.coalesce_window_ms`, the call goes that long after the thread's
//! first queued check instead: Redis is woken about once per window and thread rather than once
//! per call, and each check waits up to that much longer. The call runs in a task of its own,
//! so a client that goes away cannot take the other checks of its batch with it.
//!
//! On a Cluster a batch holds one slot's checks only (a script may touch one slot): the queue
//! is split by the slot of each request's keys (a request spanning slots never comes here).

use std::cell::RefCell;
use std::mem;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;
use redis::{Cmd, Value};
use tokio::sync::oneshot;

use super::connection::Connection;
use super::script::{call_script, script_command, LuaScript};
use super::wire::{bucket_args, classify};
use crate::kinds::BucketRequest;
use crate::store::StoreError;

/// Most requests one call carries: a bigger batch would hold Redis, which runs one script at a
/// time, for longer than a few single calls do; the rest of a queue goes in further calls,
/// sent at once.
const MAX_BATCH: usize = 32;

/// The script's batch marker (its first argument; no rate or period reads so).
const BATCH: &str = "*";

/// A queued check and where its answer goes.
struct Pending {
    buckets: Vec<BucketRequest>,
    /// Send the script whole: the connection may not have it yet.
    whole: bool,
    deadline: Instant,
    answer: oneshot::Sender<Result<Value, StoreError>>,
}

type Queue = Arc<Mutex<Vec<Pending>>>;

/// One thread's queue for one coalescer, on one runtime.
struct ThreadQueue {
    owner: Weak<()>,
    runtime: tokio::runtime::Id,
    queue: Queue,
}

thread_local! {
    static QUEUES: RefCell<Vec<ThreadQueue>> = const { RefCell::new(Vec::new()) };
}

pub struct Coalescer {
    /// This coalescer's identity in the threads' queues.
    alive: Arc<()>,
    connection: Arc<Connection>,
    script: Arc<LuaScript>,
    /// How long a thread's first queued check waits for others (`store.coalesce_window_ms`);
    /// zero: one turn of its event loop.
    window: Duration,
}

impl Coalescer {
    pub fn new(connection: Arc<Connection>, script: Arc<LuaScript>) -> Coalescer {
        Coalescer {
            alive: Arc::new(()),
            connection,
            script,
            window: Duration::ZERO,
        }
    }

    /// Has each thread's first queued check wait `window` for others before their call goes.
    pub fn with_window(mut self, window: Duration) -> Coalescer {
        self.window = window;
        self
    }

    /// Queues one request's buckets for the next call from this thread; the answer is its
    /// share of the reply (one request's reply text), or the call's error. `None` outside a
    /// Tokio runtime.
    pub fn submit(
        &self,
        buckets: &[&BucketRequest],
        whole: bool,
        deadline: Instant,
    ) -> Option<oneshot::Receiver<Result<Value, StoreError>>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let queue = self.thread_queue(runtime.id());
        let (answer, receiver) = oneshot::channel();
        let pending = Pending {
            buckets: buckets.iter().map(|&b| b.clone()).collect(),
            whole,
            deadline,
            answer,
        };
        let first = {
            let mut queued = queue.lock().unwrap_or_else(PoisonError::into_inner);
            queued.push(pending);
            queued.len() == 1
        };
        if first {
            // Spawned, not awaited here: the tasks already woken on this thread run first and
            // may queue more; and the call outlives any one check's future.
            runtime.spawn(flush(
                queue,
                Arc::clone(&self.connection),
                Arc::clone(&self.script),
                self.window,
            ));
        }
        Some(receiver)
    }

    fn thread_queue(&self, runtime: tokio::runtime::Id) -> Queue {
        let owner = Arc::as_ptr(&self.alive);
        QUEUES.with_borrow_mut(|queues| {
            if let Some(found) = queues
                .iter()
                .find(|q| q.owner.as_ptr() == owner && q.runtime == runtime)
            {
                return Arc::clone(&found.queue);
            }
            queues.retain(|q| q.owner.strong_count() > 0);
            let queue = Queue::default();
            queues.push(ThreadQueue {
                owner: Arc::downgrade(&self.alive),
                runtime,
                queue: Arc::clone(&queue),
            });
            queue
        })
    }
}

/// Sends everything queued on `queue`, after `window` (or one turn of the event loop): one call
/// per slot and per [`MAX_BATCH`] requests, all at once.
async fn flush(
    queue: Queue,
    connection: Arc<Connection>,
    script: Arc<LuaScript>,
    window: Duration,
) {
    if window.is_zero() {
        // Tokio defers a yielded task until it has run out of ready tasks and polled for I/O:
        // requests read in that turn join this call.
        tokio::task::yield_now().await;
    } else {
        // Redis is woken once per window and thread, not once per turn: what it saves is the
        // cost of each call and wake-up, which outweighs a check's own at a few per call.
        tokio::time::sleep(window).await;
    }
    let queued = mem::take(&mut *queue.lock().unwrap_or_else(PoisonError::into_inner));
    let batches = if connection.is_cluster() {
        by_slot(queued)
    } else {
        vec![queued]
    };
    let calls = batches.into_iter().flat_map(|mut batch| {
        let mut parts = Vec::with_capacity(batch.len().div_ceil(MAX_BATCH));
        while batch.len() > MAX_BATCH {
            let rest = batch.split_off(MAX_BATCH);
            parts.push(mem::replace(&mut batch, rest));
        }
        parts.push(batch);
        parts
    });
    let calls = calls.map(|batch| call(&connection, &script, batch));
    futures_util::future::join_all(calls).await;
}

/// Requests grouped by their keys' slot, in order of first appearance; order within a slot is
/// kept.
fn by_slot(queued: Vec<Pending>) -> Vec<Vec<Pending>> {
    let mut groups: Vec<(Option<Slot>, Vec<Pending>)> = Vec::new();
    for pending in queued {
        let slot = pending
            .buckets
            .first()
            .map(|b| Slot::for_key(b.key.as_bytes()));
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(pending),
            None => groups.push((slot, vec![pending])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

/// One script call for `batch`, its reply handed out request by request.
async fn call(connection: &Connection, script: &LuaScript, batch: Vec<Pending>) {
    if batch.is_empty() {
        return;
    }
    let whole = batch.iter().any(|p| p.whole);
    let deadline = batch
        .iter()
        .map(|p| p.deadline)
        .max()
        .unwrap_or_else(Instant::now);
    let result = super::deadline::until(
        deadline,
        call_script(connection, whole, |whole| command(script, whole, &batch)),
    )
    .await;
    match result {
        Ok(Ok(reply)) => hand_out(reply, batch),
        Ok(Err(e)) => fail(batch, &classify(&e)),
        Err(_elapsed) => fail(batch, &StoreError::Timeout),
    }
}

/// `EVALSHA` (or `EVAL`, when `whole`) of the batch: one request alone goes in the script's
/// single form, several in its batch form.
fn command(script: &LuaScript, whole: bool, batch: &[Pending]) -> Cmd {
    let mut cmd = script_command(script.source, &script.sha, whole);
    let keys: usize = batch.iter().map(|p| p.buckets.len()).sum();
    cmd.arg(keys);
    for bucket in batch.iter().flat_map(|p| &p.buckets) {
        cmd.arg(&bucket.key);
    }
    let single = batch.len() == 1;
    if !single {
        cmd.arg(BATCH);
    }
    for pending in batch {
        if !single {
            cmd.arg(pending.buckets.len());
        }
        for bucket in &pending.buckets {
            bucket_args(&mut cmd, bucket, if bucket.shadow { "1" } else { "0" });
        }
    }
    cmd
}

/// Gives each request its own reply: the whole reply for a lone request, else its part of the
/// batch's replies, which are joined by " , ". A reply of the wrong shape fails them all.
fn hand_out(reply: Value, batch: Vec<Pending>) {
    if batch.len() == 1 {
        if let Some(pending) = batch.into_iter().next() {
            let _ = pending.answer.send(Ok(reply));
        }
        return;
    }
    let parts: Option<Vec<&[u8]>> = match &reply {
        Value::BulkString(bytes) => Some(
            bytes
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .collect(),
        ),
        _ => None,
    };
    match parts.filter(|parts| parts.len() == batch.len()) {
        Some(parts) => {
            for (pending, part) in batch.into_iter().zip(parts) {
                // A check whose client went away no longer listens: nothing to do.
                let _ = pending.answer.send(Ok(Value::BulkString(part.to_vec())));
            }
        }
        None => fail(
            batch,
            &StoreError::Script("malformed batch reply".to_string()),
        ),
    }
}

fn fail(batch: Vec<Pending>, error: &StoreError) {
    for pending in batch {
        let _ = pending.answer.send(Err(error.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(keys: &[&str]) -> (Pending, oneshot::Receiver<Result<Value, StoreError>>) {
        let (answer, receiver) = oneshot::channel();
        let buckets = keys
            .iter()
            .map(|key| BucketRequest::bucket(*key, 2.0, 5.0))
            .collect();
        let pending = Pending {
            buckets,
            whole: false,
            deadline: Instant::now(),
            answer,
        };
        (pending, receiver)
    }

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<other>".to_string(),
            })
            .collect()
    }

    fn script() -> LuaScript {
        LuaScript {
            source: "return 1",
            sha: "sha".to_string(),
            loaded_in: std::sync::atomic::AtomicU64::new(0),
        }
    }

    #[test]
    fn a_lone_request_goes_in_the_single_form() {
        let (one, _r) = pending(&["a", "b"]);
        let cmd = command(&script(), false, &[one]);
        assert_eq!(
            args(&cmd),
            ["EVALSHA", "sha", "2", "a", "b", "2", "5", "1", "0", "2", "5", "1", "0"]
        );
    }

    #[test]
    fn several_requests_go_in_the_batch_form_keys_first_then_each_request_s_count_and_args() {
        let (one, _r1) = pending(&["a", "b"]);
        let (two, _r2) = pending(&["c"]);
        let cmd = command(&script(), true, &[one, two]);
        assert_eq!(
            args(&cmd),
            [
                "EVAL", "return 1", "3", "a", "b", "c", "*", "2", "2", "5", "1", "0", "2", "5",
                "1", "0", "1", "2", "5", "1", "0"
            ]
        );
    }

    #[test]
    fn a_batch_reply_is_handed_out_in_order_and_a_short_one_fails_every_request() {
        let (one, r1) = pending(&["a"]);
        let (two, r2) = pending(&["b"]);
        hand_out(
            Value::BulkString(b"1 7 4 1 , 0 7 0 0".to_vec()),
            vec![one, two],
        );
        let text = |r: oneshot::Receiver<Result<Value, StoreError>>| match r.blocking_recv() {
            Ok(Ok(Value::BulkString(bytes))) => String::from_utf8(bytes).unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(text(r1), "1 7 4 1");
        assert_eq!(text(r2), "0 7 0 0");

        let (one, r1) = pending(&["a"]);
        let (two, r2) = pending(&["b"]);
        hand_out(Value::BulkString(b"1 7 4 1".to_vec()), vec![one, two]);
        for r in [r1, r2] {
            assert!(matches!(r.blocking_recv(), Ok(Err(StoreError::Script(_)))));
        }
    }

    #[test]
    fn requests_are_grouped_by_slot_keeping_their_order() {
        // {x} and {y} hash to different slots; keys with the same tag share one.
        let (a, _ra) = pending(&["k:{x}"]);
        let (b, _rb) = pending(&["k:{y}"]);
        let (c, _rc) = pending(&["other:{x}"]);
        let groups = by_slot(vec![a, b, c]);
        let keys: Vec<Vec<&str>> = groups
            .iter()
            .map(|g| g.iter().map(|p| p.buckets[0].key.as_str()).collect())
            .collect();
        assert_eq!(keys, [vec!["k:{x}", "other:{x}"], vec!["k:{y}"]]);
    }
}
