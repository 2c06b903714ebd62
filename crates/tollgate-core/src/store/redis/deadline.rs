//! A store call's deadline that charges the store, not tollgate's own scheduling.
//!
//! An answer travels through tasks of tollgate's before a check sees it: the connection's
//! driver reads it from the socket, the coalescing call hands it out, the check takes it. Each
//! hop is a task woken on the same thread. When that thread was kept off the CPU (a busy
//! machine), the timer and the answer become ready in the same turn, and the check's task may
//! run before the hops that carry the answer to it: a store that answered in time then counted
//! as a timeout, and the check was answered per `on_error` (its bucket charged all the same).
//! So when the timer fires, the call gets a last look: the runtime runs what is already ready
//! (I/O included, as `yield_now` defers the task until the driver has been polled) a few times,
//! and an answer that is there by then is taken. Nothing waits: against a store that has not
//! answered, the last look costs a few scheduler turns, microseconds.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Instant;

/// Scheduler turns of the last look: one per task an answer passes through after the socket
/// (the connection's driver, the coalescing call, the check itself).
const LAST_LOOK_TURNS: usize = 3;

/// The deadline passed and the call had not answered, even after its last look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// Runs `call` until `deadline`, then gives it its last look (see the module docs).
pub async fn until<F: Future>(deadline: Instant, call: F) -> Result<F::Output, Elapsed> {
    let mut call = pin!(call);
    if let Ok(output) = tokio::time::timeout_at(deadline.into(), call.as_mut()).await {
        return Ok(output);
    }
    for _ in 0..LAST_LOOK_TURNS {
        tokio::task::yield_now().await;
        let look = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        if let Poll::Ready(output) = look {
            return Ok(output);
        }
    }
    Err(Elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// The timer and the answer ready in the same turn, the answer one task hop away (as
    /// behind the coalescing call): the answer is taken.
    #[test]
    fn an_answer_one_hop_away_when_the_timer_fires_is_taken() {
        runtime().block_on(async {
            let deadline = Instant::now() + Duration::from_millis(50);
            let (to_hop, from_store) = tokio::sync::oneshot::channel::<u8>();
            let (to_check, answer) = tokio::sync::oneshot::channel::<u8>();
            // The hop: forwards the store's answer to the check, as a task of its own.
            tokio::spawn(async move {
                if let Ok(value) = from_store.await {
                    let _ = to_check.send(value);
                }
            });
            // The store answers at the deadline exactly: both wake in the same turn.
            tokio::spawn(async move {
                tokio::time::sleep_until(deadline.into()).await;
                let _ = to_hop.send(7);
            });
            assert_eq!(until(deadline, answer).await, Ok(Ok(7)));
        });
    }

    #[test]
    fn no_answer_is_a_timeout_at_the_deadline() {
        runtime().block_on(async {
            let deadline = Instant::now() + Duration::from_millis(20);
            let never = std::future::pending::<()>();
            assert_eq!(until(deadline, never).await, Err(Elapsed));
            assert!(Instant::now() >= deadline, "not before the deadline");
        });
    }
}
