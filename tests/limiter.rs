//! The decision without HTTP and without Redis: a `Limiter` over the memory store on a manual
//! clock, and over a store that fails on demand to pin down every `on_error` answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use figment::providers::{Format, Toml};
use tollgate::config::{Config, OnError};
use tollgate::decision::Verdict;
use tollgate::limiter::Limiter;
use tollgate::limits::Policy;
use tollgate::metrics::Metrics;
use tollgate::request::Described;
use tollgate::store::memory::{ManualClock, MemoryStore};
use tollgate::store::{BucketRequest, Store, StoreDecision, StoreError};

fn config(limits: &str) -> Config {
    let toml = format!("{limits}\n");
    let config: Config =
        figment::Figment::from(figment::providers::Serialized::defaults(Config::default()))
            .merge(Toml::string(&toml))
            .extract()
            .expect("test config parses");
    config.validate().expect("test config is valid");
    config
}

const TWO_LIMITS: &str = r#"
[[limits]]
name = "per-ip"
rate = 10
burst = 3
key = ["ip"]
[[limits]]
name = "per-key"
rate = 1
burst = 2
key = ["header:x-api-key"]
"#;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn check<S: Store>(limiter: &Limiter<S>, pairs: &[(&str, &str)]) -> Verdict {
    let policy = limiter.policy();
    let map = headers(pairs);
    let request = Described::new(&map, "GET", "/", "192.0.2.1".parse().unwrap());
    block_on(limiter.check(&policy, &request))
}

/// The memory store never awaits, so its futures complete on the first poll.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(future)
}

fn memory_limiter(limits: &str) -> (Limiter<MemoryStore<Arc<ManualClock>>>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let metrics = Metrics::new();
    let config = config(limits);
    let policy = Policy::compile(&config, &metrics).unwrap();
    let store = MemoryStore::with_clock(1000, clock.clone());
    (
        Limiter::new(store, policy, OnError::Allow, 1000, metrics),
        clock,
    )
}

fn allowed(verdict: &Verdict) -> bool {
    match verdict {
        Verdict::Decided(decision) => decision.allowed,
        Verdict::Unlimited | Verdict::StoreFailed { allow: true } => true,
        _ => false,
    }
}

#[test]
fn limits_are_charged_together_or_not_at_all() {
    let (limiter, clock) = memory_limiter(TWO_LIMITS);
    let key = [("x-api-key", "k")];
    assert!(allowed(&check(&limiter, &key)));
    assert!(allowed(&check(&limiter, &key)));
    let Verdict::Decided(denied) = check(&limiter, &key) else {
        panic!("decided")
    };
    assert!(!denied.allowed);
    let ip = denied.limits.iter().find(|s| s.limit == 0).unwrap();
    assert_eq!(
        ip.tokens, 1.0,
        "per-ip was not charged for the denied request"
    );
    // Without an API key only per-ip applies (on_missing = skip), and it has one token left.
    assert!(allowed(&check(&limiter, &[])));
    assert!(!allowed(&check(&limiter, &[])));
    clock.advance_ms(1000);
    assert!(
        allowed(&check(&limiter, &key)),
        "a second refills per-key by one"
    );
}

#[test]
fn retry_after_is_the_longest_wait_among_denying_limits() {
    let (limiter, _clock) = memory_limiter(
        "[[limits]]\nname = \"slow\"\nrate = 0.25\nburst = 1\nkey = [\"ip\"]\n[[limits]]\nname = \"fast\"\nrate = 1\nburst = 1\nkey = [\"ip\"]\n",
    );
    assert!(allowed(&check(&limiter, &[])));
    let Verdict::Decided(decision) = check(&limiter, &[]) else {
        panic!("decided")
    };
    let policy = limiter.policy();
    assert_eq!(decision.retry_after(&policy), Some(4));
    let (_, limit) = decision.most_restrictive(&policy).unwrap();
    assert_eq!(limit.name, "slow");
}

/// A store that fails while `failing` is set; otherwise a memory store.
struct FlakyStore {
    inner: MemoryStore<Arc<ManualClock>>,
    failing: AtomicBool,
}

impl Store for FlakyStore {
    async fn decide(&self, buckets: &[BucketRequest]) -> Result<StoreDecision, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout);
        }
        self.inner.decide(buckets).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

fn flaky_limiter(on_error: OnError) -> (Limiter<FlakyStore>, Metrics) {
    let metrics = Metrics::new();
    let config =
        config("[[limits]]\nname = \"k\"\nrate = 1\nburst = 10\nkey = [\"header:x-api-key\"]\n");
    let policy = Policy::compile(&config, &metrics).unwrap();
    let store = FlakyStore {
        inner: MemoryStore::with_clock(100, Arc::new(ManualClock::default())),
        failing: AtomicBool::new(true),
    };
    (
        Limiter::new(store, policy, on_error, 100, metrics.clone()),
        metrics,
    )
}

#[test]
fn on_error_allow_answers_allow_and_counts_error_allowed() {
    let (limiter, metrics) = flaky_limiter(OnError::Allow);
    assert_eq!(
        check(&limiter, &[("x-api-key", "k")]),
        Verdict::StoreFailed { allow: true }
    );
    assert_eq!(metrics.checks.error_allowed.get(), 1);
}

#[test]
fn on_error_deny_answers_deny_and_counts_error_denied() {
    let (limiter, metrics) = flaky_limiter(OnError::Deny);
    assert_eq!(
        check(&limiter, &[("x-api-key", "k")]),
        Verdict::StoreFailed { allow: false }
    );
    assert_eq!(metrics.checks.error_denied.get(), 1);
}

#[test]
fn on_error_local_splits_each_limit_among_the_instances() {
    let (limiter, metrics) = flaky_limiter(OnError::Local);
    limiter.set_instances(2);
    // burst 10 split two ways: 5 local tokens, then denials.
    let verdicts: Vec<bool> = (0..7)
        .map(|_| allowed(&check(&limiter, &[("x-api-key", "k")])))
        .collect();
    assert_eq!(verdicts, [true, true, true, true, true, false, false]);
    assert_eq!(metrics.checks.error_allowed.get(), 5);
    assert_eq!(metrics.checks.error_denied.get(), 2);
    match check(&limiter, &[("x-api-key", "k")]) {
        Verdict::Decided(decision) => assert!(decision.degraded),
        other => panic!("local fallback decides, got {other:?}"),
    }
    limiter.store().failing.store(false, Ordering::SeqCst);
    assert!(
        allowed(&check(&limiter, &[("x-api-key", "k")])),
        "the store decides again once it answers"
    );
}
