//! The decision without HTTP and without Redis: a `Limiter` over the memory store on a manual
//! clock, and over a store that fails on demand to pin down every `on_error` answer; plus, end
//! to end through the binary, the headers of the local fallback (two instances whose Redis
//! dies) and the keying of IPv6 clients by network.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::support::block_on;
use crate::support::limit;
use crate::support::{assert_header, assert_x_ratelimit};
use figment::providers::{Format, Toml};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tollgate_core::base::clock::ManualClock;
use tollgate_core::config::{Config, OnError};
use tollgate_core::kinds::BucketRequest;
use tollgate_core::limiter::decision::Verdict;
use tollgate_core::limiter::Limiter;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::policy::Policy;
use tollgate_core::request::OriginalRequest;
use tollgate_core::store::memory::MemoryStore;
use tollgate_core::store::{Store, StoreDecision, StoreError};

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
    let request = OriginalRequest::new(&map, "GET", "/", "192.0.2.1".parse().unwrap());
    block_on(limiter.check(&policy, &request)).verdict
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
    flaky_limiter_with(on_error, 1.0, 10, 100)
}

fn flaky_limiter_with(
    on_error: OnError,
    rate: f64,
    burst: u64,
    max_buckets: usize,
) -> (Limiter<FlakyStore>, Metrics) {
    let metrics = Metrics::new();
    let config = config(&format!(
        "[[limits]]\nname = \"k\"\nrate = {rate}\nburst = {burst}\nkey = [\"header:x-api-key\"]\n"
    ));
    let policy = Policy::compile(&config, &metrics).unwrap();
    let store = FlakyStore {
        inner: MemoryStore::with_clock(100, Arc::new(ManualClock::default())),
        failing: AtomicBool::new(true),
    };
    (
        Limiter::new(store, policy, on_error, max_buckets, metrics.clone()),
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

#[test]
fn the_local_fallback_keeps_every_drained_client_below_max_buckets() {
    // One token refilled in 1000 s: drained stays drained for the whole test. 95% of the cap:
    // a cap counted per shard (10,000 / 64) would drop clients from the fuller shards.
    let (limiter, _) = flaky_limiter_with(OnError::Local, 0.001, 1, 10_000);
    let key = |i: usize| format!("client-{i}");
    for i in 0..9_500 {
        assert!(allowed(&check(&limiter, &[("x-api-key", &key(i))])));
    }
    let came_back_full = (0..9_500)
        .filter(|&i| allowed(&check(&limiter, &[("x-api-key", &key(i))])))
        .count();
    assert_eq!(
        came_back_full, 0,
        "of 9,500 drained clients under a cap of 10,000"
    );
}

#[test]
fn local_fallback_headers_describe_this_instances_share_of_the_limit() {
    let (limiter, _) = flaky_limiter_with(OnError::Local, 0.5, 10, 100);
    limiter.set_instances(2);
    let key = [("x-api-key", "k")];
    for _ in 0..5 {
        assert!(allowed(&check(&limiter, &key)));
    }
    let verdict = check(&limiter, &key);
    let response = tollgate::http::response::render(&verdict, &limiter.policy());
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    // This instance holds burst 5 refilled at 0.25/s: one token takes 4 s, all five 20 s.
    assert_eq!(response.status(), 429);
    assert_eq!(header("retry-after").as_deref(), Some("4"));
    assert_eq!(header("x-ratelimit-limit").as_deref(), Some("5"));
    assert_eq!(header("x-ratelimit-remaining").as_deref(), Some("0"));
    assert_eq!(header("x-ratelimit-reset").as_deref(), Some("20"));
    assert_eq!(
        header("ratelimit-policy").as_deref(),
        Some("\"k\";q=5;w=20")
    );
    assert_eq!(header("ratelimit").as_deref(), Some("\"k\";r=0;t=20"));
}

/// The same through the real binary: two instances learn N = 2 from Redis, Redis dies, and the
/// local answers carry the halved limit.
#[test]
fn local_fallback_headers_through_two_instances_whose_redis_died() {
    use crate::support::{short_timings, Tollgate, SHORT_TIMINGS};
    let mut redis = crate::support::RedisServer::start();
    let limits = &limit("per-ip", 0.01, 20, &["ip"]);
    let config = crate::support::redis_config(&redis, "on_error = \"local\"", limits);
    let a = Tollgate::start_with_env(&config, &[SHORT_TIMINGS]);
    let _b = Tollgate::start_with_env(&config, &[SHORT_TIMINGS]);
    assert!(crate::support::wait_until(
        std::time::Duration::from_secs(5),
        || redis.cli(&["ZCARD", "tollgate:instances"]).trim() == "2"
    ));
    // The first instance learns N = 2 at its next heartbeat (every 2 s; here 200 ms): wait
    // two and a half.
    std::thread::sleep(short_timings().heartbeat_every * 5 / 2);
    redis.kill();
    let mut client = a.client();
    let client_ip = [("X-Forwarded-For", "198.51.100.21")];
    let statuses: Vec<u16> = (0..11)
        .map(|_| client.get("/check", &client_ip).unwrap().status)
        .collect();
    assert_eq!(statuses, [[200; 10].as_slice(), &[429]].concat());
    let denied = client.get("/check", &client_ip).unwrap();
    // burst 10 at 0.005/s on this instance: one token in 200 s, all ten in 2000 s.
    assert_header(&denied, "retry-after", Some("200"));
    assert_x_ratelimit(&denied, 10, 0, 2000);
    assert_header(&denied, "ratelimit-policy", Some("\"per-ip\";q=10;w=2000"));
}

/// Statuses of one check each from `clients`, in order, on a tollgate allowing one request per
/// client key (burst 1, refilled in 1000 s).
fn one_check_each(ipv6_prefix: Option<u8>, clients: &[&str]) -> Vec<u16> {
    let client_ip = ipv6_prefix.map_or(String::new(), |p| {
        format!("[client_ip]\nipv6_prefix = {p}\n")
    });
    let tollgate = crate::support::Tollgate::start(&format!(
        "{client_ip}[[limits]]\nname = \"per-ip\"\nrate = 0.001\nburst = 1\nkey = [\"ip\"]\n"
    ));
    clients
        .iter()
        .map(|ip| tollgate.check(&[("X-Forwarded-For", ip)]).status)
        .collect()
}

#[test]
fn two_addresses_of_one_ipv6_64_share_a_bucket_by_default() {
    let statuses = one_check_each(
        None,
        &[
            "2001:db8:1:2::1",
            "2001:db8:1:2:ffff:ffff:ffff:fffe",
            "2001:db8:1:3::1",
            "192.0.2.1",
            "192.0.2.2",
        ],
    );
    assert_eq!(statuses, [200, 429, 200, 200, 200]);
}

#[test]
fn with_ipv6_prefix_128_each_ipv6_address_has_its_own_bucket() {
    let statuses = one_check_each(
        Some(128),
        &["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::1"],
    );
    assert_eq!(statuses, [200, 200, 429]);
}

#[test]
fn a_cost_header_can_raise_the_configured_cost_but_never_lower_it() {
    let (limiter, _clock) = memory_limiter(
        "[[limits]]\nname = \"c\"\nrate = 1\nburst = 100\ncost = 5\ncost_header = \"x-cost\"\nkey = [\"ip\"]\n",
    );
    let charged = |value: &str| match check(&limiter, &[("x-cost", value)]) {
        Verdict::Decided(decision) => decision.limits[0].cost,
        other => panic!("decided, got {other:?}"),
    };
    assert_eq!(charged("1"), 5, "cheaper than configured");
    assert_eq!(charged("0"), 5);
    assert_eq!(charged("-3"), 5);
    assert_eq!(charged("2.5"), 5, "malformed");
    assert_eq!(charged("lots"), 5, "malformed");
    assert_eq!(charged("7"), 7, "dearer than configured");
    let Verdict::Decided(decision) = check(&limiter, &[]) else {
        panic!("decided")
    };
    assert_eq!(decision.limits[0].cost, 5, "no header");
    assert_eq!(decision.limits[0].tokens, 100.0 - 5.0 * 6.0 - 7.0);
}
