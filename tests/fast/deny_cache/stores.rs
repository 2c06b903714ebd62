//! The deny cache in front of stores that hang or split: answers within the timeout, and
//! nothing a refund can raise is cached.

use super::*;

/// A store that denies the first call (the bucket is empty) and never answers again.
struct DeniesThenHangs(std::sync::atomic::AtomicU32);

impl Store for DeniesThenHangs {
    async fn decide(&self, buckets: &[BucketRequest]) -> Result<StoreDecision, StoreError> {
        if self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            let empty = BucketOutcome {
                tokens: 0.0,
                enough: false,
                window: None,
            };
            return Ok(StoreDecision {
                allowed: false,
                buckets: vec![empty; buckets.len()],
                slices: Vec::new(),
            });
        }
        std::future::pending().await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// On tokio's paused clock (its timers fire when every task waits, so the waits below are
/// exact whatever the machine's load) with the cache on a manual clock.
#[tokio::test(start_paused = true)]
async fn a_check_waiting_for_a_hanging_probe_still_answers_within_the_timeout() {
    let timeout = Duration::from_millis(50);
    let metrics = Metrics::new();
    // The built-in default: one limit per client IP, 20/s: a cached window of 50 ms.
    let policy = Policy::compile(&Config::default(), &metrics).expect("compiles");
    let store = DeniesThenHangs(Default::default());
    let clock = Arc::new(ManualClock::default());
    let cache = DenyCache::with_clock(100, timeout, clock.clone());
    let limiter =
        Arc::new(Limiter::new(store, policy, OnError::Allow, 100, metrics).with_cache(cache));
    let check = |limiter: Arc<Limiter<DeniesThenHangs>>| async move {
        let map = HeaderMap::new();
        let original = OriginalRequest::new(&map, "GET", "/", IpAddr::V4(Ipv4Addr::LOCALHOST));
        let policy = limiter.policy();
        limiter.check(&policy, &original).await.by
    };
    assert_eq!(check(limiter.clone()).await, DecidedBy::Store);
    assert_eq!(check(limiter.clone()).await, DecidedBy::DenyCache);
    clock.advance_us(60_000);
    // The window is over: this one probes, and the store never answers it.
    let _probe = tokio::spawn(check(limiter.clone()));
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(1), check(limiter.clone())).await;
    assert_eq!(answer, Ok(DecidedBy::OnError), "no answer within 1 s");
    // It waited the probe wait, then gave its own call the full timeout: not the probe's
    // whole timeout first.
    assert_eq!(started.elapsed(), MAX_PROBE_WAIT + timeout);
}

/// A store that, like a Redis Cluster, may decide a request per slot and refund a part.
struct Splitting(tollgate_core::store::memory::MemoryStore);

impl Store for Splitting {
    async fn decide(&self, buckets: &[BucketRequest]) -> Result<StoreDecision, StoreError> {
        self.0.decide(buckets).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn splits_requests(&self) -> bool {
        true
    }
}

/// Cached denials out of 60 flooded checks, on a store that splits requests.
async fn cached_on_a_splitting_store(limits: &str) -> usize {
    let dir = TempDir::new("deny-cache-split");
    let path = dir.write("tollgate.toml", limits);
    let config = Config::load(Some(&path)).expect("valid config");
    let metrics = Metrics::new();
    let policy = Policy::compile(&config, &metrics).expect("compiles");
    let store = Splitting(tollgate_core::store::memory::MemoryStore::new(100));
    let limiter = Limiter::new(store, policy, OnError::Deny, 100, metrics)
        .with_deny_cache(100, Duration::from_secs(1));
    let policy = limiter.policy();
    let map = headers("flooder", 1);
    let mut cached = 0;
    for _ in 0..60 {
        let original = OriginalRequest::new(&map, "GET", "/", IpAddr::V4(Ipv4Addr::LOCALHOST));
        let by = limiter.check(&policy, &original).await.by;
        cached += usize::from(by == DecidedBy::DenyCache);
    }
    cached
}

/// On a Cluster, a request whose limits are keyed on different parts spans slots, and its
/// buckets may be refunded (here or by another instance): the cache must not speak for them.
#[tokio::test]
async fn buckets_a_refund_can_raise_are_never_cached() {
    assert_eq!(cached_on_a_splitting_store(LIMITS).await, 0);
    let one_shape = "[[limits]]\nname = \"a\"\nrate = 1\nburst = 2\nkey = [\"header:x-api-key\"]\n\
                     [[limits]]\nname = \"b\"\nrate = 5\nburst = 4\nkey = [\"header:x-api-key\"]\n";
    assert!(
        cached_on_a_splitting_store(one_shape).await > 40,
        "limits keyed alike share a slot: no refunds, cached as usual"
    );
}
