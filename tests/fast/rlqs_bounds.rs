//! Envoy's quota service kept within bounds whatever Envoy sends, against the real binary and
//! a real Redis: a message's pools decided in few store calls, buckets that differ only in
//! entries the rule does not key on sharing one share, reports that never touch the checks'
//! breaker, and what one stream may keep.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::BlanketRule;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;

use crate::support::commandstats::{script_calls, wait_for_start_up_polls};
use crate::support::rlqs::{read, Envoy};
use crate::support::{grpc, redis_config, wait_until, RedisServer, QUIET_POLL};

const SHARED: &str = r#"
[rlqs]
assignment_ttl_s = 10
[[rlqs.buckets]]
domain = "edge"
match = { name = "per_tenant" }
limit = "per-tenant"
key = ["tenant"]

[[limits]]
name = "per-tenant"
rate = 10
burst = 20
key = ["descriptor:tenant"]

[[limits]]
name = "per-user"
rate = "1/min"
burst = 5
key = ["header:x-user"]
"#;

/// `n` bucket ids of tenant `tenant`, told apart by an entry the rule does not key on.
fn routes(tenant: &str, n: usize) -> Vec<Vec<(String, String)>> {
    (0..n)
        .map(|k| {
            vec![
                ("name".to_string(), "per_tenant".to_string()),
                ("tenant".to_string(), tenant.to_string()),
                ("route".to_string(), format!("/r{k}")),
            ]
        })
        .collect()
}

/// `ids` as one message's usages, each with `requests`.
async fn report_all(
    envoy: &mut Envoy,
    ids: &[Vec<(String, String)>],
    requests: u64,
) -> envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse {
    let borrowed: Vec<Vec<(&str, &str)>> = ids
        .iter()
        .map(|id| id.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
        .collect();
    let usages: Vec<(&[(&str, &str)], u64)> =
        borrowed.iter().map(|id| (&id[..], requests)).collect();
    envoy.report(&usages).await
}

/// 300 buckets of one tenant, told apart by their route: one share of the tenant's pool for
/// the stream, decided in one store call, its parts within the limit together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_of_one_pool_share_one_holder_decided_in_one_call() {
    let redis = RedisServer::start();
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, QUIET_POLL, SHARED));
    wait_for_start_up_polls(&redis, 1);
    let mut envoy = Envoy::connect(addr).await;
    let ids = routes("acme", 300);
    let before = script_calls(&redis);
    let answer = report_all(&mut envoy, &ids, 3).await;
    assert_eq!(script_calls(&redis) - before, 1, "one call for the pool");
    assert_eq!(answer.bucket_action.len(), 300);
    let (mut sizes, mut rates) = (0, 0);
    for i in 0..300 {
        let ((max, fill, interval), _) = read(&answer, i);
        if interval > 0 {
            sizes += u64::from(max);
            rates += u64::from(fill);
        }
    }
    assert!(
        sizes <= 20 && rates <= 36_000,
        "the parts fit the limit: {sizes} tokens, {rates} per hour"
    );
    let peek = crate::support::http::admin_json(
        tollgate.admin,
        "GET",
        "/v1/buckets/per-tenant?key=acme",
        None,
        "",
    );
    let peek: serde_json::Value = serde_json::from_str(&peek.body).expect("JSON");
    assert_eq!(peek["shares"]["envoys"], 1, "one holder: {peek}");
    assert_eq!(tollgate.metric("tollgate_rlqs_buckets"), 300.0);
}

/// 2,000 tenants in one message: a store call per batch of pools, never one per bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_many_pools_takes_a_call_per_batch() {
    let redis = RedisServer::start();
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, QUIET_POLL, SHARED));
    wait_for_start_up_polls(&redis, 1);
    let mut envoy = Envoy::connect(addr).await;
    let ids: Vec<Vec<(String, String)>> = (0..2000)
        .map(|t| {
            vec![
                ("name".to_string(), "per_tenant".to_string()),
                ("tenant".to_string(), format!("t{t}")),
            ]
        })
        .collect();
    let before = script_calls(&redis);
    let answer = report_all(&mut envoy, &ids, 1).await;
    let calls = script_calls(&redis) - before;
    let batches = 2000u64.div_ceil(tollgate_core::limiter::rlqs::POOLS_PER_CALL as u64);
    assert_eq!(calls, batches, "a call per {} pools", batches);
    assert_eq!(answer.bucket_action.len(), 2000);
    let served = (0..2000).filter(|i| read(&answer, *i).0 .2 > 0).count();
    assert_eq!(served, 2000, "every tenant has a token bucket");
    assert_eq!(tollgate.metric("tollgate_rlqs_store_errors_total"), 0.0);
}

/// A store that refuses RLQS's pools (an ACL without their keys) fails the reports, and their
/// own breaker opens; the checks' stays closed and the store decides them. A bucket never
/// served is answered as `on_error` answers a check (here: allow), so each message gets an
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_reports_open_their_own_breaker_never_the_checks() {
    let redis = RedisServer::start();
    redis.cli(&[
        "ACL",
        "SETUSER",
        "tollgate",
        "on",
        ">pw",
        "~tollgate:instances",
        "~tollgate:{tollgate:overrides}:*",
        "~tollgate:per-user:*",
        "&*",
        "+@all",
    ]);
    let url = format!("redis://tollgate:pw@127.0.0.1:{}/0", redis.port);
    let config = redis_config(&redis, "", SHARED).replace(&redis.url(), &url);
    let (tollgate, addr) = grpc::tollgate(&config);
    let mut envoy = Envoy::connect(addr).await;
    for round in 0..6 {
        let answer = report_all(&mut envoy, &routes(&format!("t{round}"), 1), 1).await;
        let ((_, rule, interval), _) = read(&answer, 0);
        assert_eq!(
            (rule, interval),
            (BlanketRule::AllowAll as u32, 0),
            "a bucket never served, per on_error = allow: {answer:?}"
        );
    }
    assert!(tollgate.metric("tollgate_rlqs_store_errors_total") >= 3.0);
    assert_eq!(tollgate.metric("tollgate_rlqs_store_up"), 0.0);
    assert_eq!(tollgate.metric("tollgate_store_up"), 1.0);
    let statuses: Vec<u16> = (0..7)
        .map(|_| tollgate.check(&[("x-user", "u1")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(
        tollgate.metric("tollgate_checks_total{result=\"error_allowed\"}"),
        0.0
    );
}

/// A bucket id past 4 KiB is never kept (a mapped one is denied), nor is an unmatched one;
/// one pool takes at most 1,024 of a stream's buckets (the rest are denied); a connection
/// holds at most 8 quota streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_keeps_what_its_caps_allow() {
    let redis = RedisServer::start();
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", SHARED));
    let mut envoy = Envoy::connect(addr).await;
    let big = "x".repeat(5000);
    let oversized = [
        ("name", "per_tenant"),
        ("tenant", "acme"),
        ("route", big.as_str()),
    ];
    let unmatched = [("name", "other"), ("route", big.as_str())];
    let answer = envoy.report(&[(&oversized, 1), (&unmatched, 1)]).await;
    assert_eq!(read(&answer, 0).0, (0, BlanketRule::DenyAll as u32, 0));
    assert_eq!(read(&answer, 1).0, (0, BlanketRule::AllowAll as u32, 0));
    assert_eq!(tollgate.metric("tollgate_rlqs_buckets"), 0.0);

    let answer = report_all(&mut envoy, &routes("acme", 1100), 1).await;
    let denied = (0..1100)
        .filter(|i| read(&answer, *i).0 == (0, BlanketRule::DenyAll as u32, 0))
        .count();
    assert!(denied >= 76, "{denied} denied");
    assert_eq!(tollgate.metric("tollgate_rlqs_buckets"), 1024.0);
    assert_eq!(tollgate.metric("tollgate_rlqs_untracked_total"), 77.0);

    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("an address")
        .connect()
        .await
        .expect("connect");
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..10 {
        let mut client = RateLimitQuotaServiceClient::new(channel.clone());
        let (sender, outbound) = tokio::sync::mpsc::channel::<RateLimitQuotaUsageReports>(1);
        let outbound = futures_util::stream::unfold(outbound, |mut rx| async move {
            rx.recv().await.map(|next| (next, rx))
        });
        match client.stream_rate_limit_quotas(outbound).await {
            Ok(stream) => open.push((sender, stream)),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
                refused += 1;
            }
        }
    }
    assert_eq!((open.len(), refused), (8, 2));
    drop(open);
    assert!(wait_until(Duration::from_secs(5), || {
        tollgate.metric("tollgate_rlqs_streams") == 1.0
    }));
}

/// Streams past `rlqs.max_holders` reporting one tenant are given nothing (deny-all) and
/// counted; the first ones keep their shares. Every report costs the store a pass over the
/// pool's holders: before the cap, 512 streams on one pool made each report read 512 holders
/// and the checks' calls queued behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_takes_at_most_max_holders_streams() {
    let redis = RedisServer::start();
    // Room for three holders' parts (20 tokens run out at the second).
    let config = SHARED
        .replace(
            "assignment_ttl_s = 10",
            "assignment_ttl_s = 10\nmax_holders = 3",
        )
        .replace("rate = 10\nburst = 20", "rate = 1000\nburst = 1000");
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, QUIET_POLL, &config));
    let ids = routes("acme", 1);
    let mut envoys = Vec::new();
    let mut actions = Vec::new();
    for _ in 0..5 {
        let mut envoy = Envoy::connect(addr).await;
        let answer = report_all(&mut envoy, &ids, 1).await;
        actions.push(read(&answer, 0).0);
        envoys.push(envoy);
    }
    let deny_all = (0, BlanketRule::DenyAll as u32, 0);
    assert!(
        actions[..3]
            .iter()
            .all(|&(max, _, interval)| max > 0 && interval > 0),
        "the first three are served: {actions:?}"
    );
    assert_eq!(actions[3..], [deny_all, deny_all], "{actions:?}");
    assert_eq!(tollgate.metric("tollgate_rlqs_pool_full_total"), 2.0);
    // One of the first three reports again: still served.
    let again = report_all(&mut envoys[0], &ids, 1).await;
    assert!(read(&again, 0).0 .2 > 0, "a holder keeps its place");
}

#[cfg(feature = "e2e")]
mod e2e {
    use super::*;
    use crate::support::chaos::rss_kib;

    /// 200 messages each with a 3 MB bucket id (unmatched, then mapped in turn): nothing of
    /// them is kept, and the process stays small.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_bucket_ids_are_never_kept() {
        let redis = RedisServer::start();
        let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", SHARED));
        let mut envoy = Envoy::connect(addr).await;
        let start = rss_kib(tollgate.pid());
        for i in 0..200 {
            let big = format!("{i}{}", "x".repeat(3_000_000));
            let id: Vec<(&str, &str)> = if i % 2 == 0 {
                vec![("big", big.as_str())]
            } else {
                vec![
                    ("name", "per_tenant"),
                    ("tenant", "acme"),
                    ("big", big.as_str()),
                ]
            };
            let answer = envoy.report(&[(&id, 1)]).await;
            assert_eq!(answer.bucket_action.len(), 1);
        }
        let end = rss_kib(tollgate.pid());
        eprintln!("RSS {start} KiB before, {end} KiB after 200 messages of 3 MB ids");
        assert_eq!(tollgate.metric("tollgate_rlqs_buckets"), 0.0);
        assert!(
            end < 128 * 1024,
            "RSS {end} KiB after 200 messages of 3 MB ids"
        );
    }
}
