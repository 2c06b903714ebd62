//! Envoy's quota service (RLQS) against the real binary and a real Redis, through a tonic
//! client standing for Envoy's filter: config refusals, the answers to report messages, and
//! shares split between two streams within the limit.

use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::BlanketRule;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;

use crate::support::rlqs::{read, Envoy};
use crate::support::{grpc, redis_config, tollgate_command, RedisServer, TempDir};

fn validate(config: &str) -> std::process::Output {
    let dir = TempDir::new("rlqs-cli");
    let mut command: Command = tollgate_command();
    command
        .arg("validate")
        .arg("--config")
        .arg(dir.write("tollgate.toml", config))
        .output()
        .expect("run tollgate validate")
}

const LIMITS: &str = r#"
grpc_listen = "127.0.0.1:0"
[[limits]]
name = "per-tenant"
rate = 10
burst = 20
key = ["descriptor:tenant"]
[[limits]]
name = "two-parts"
rate = 10
burst = 20
key = ["const:edge", "descriptor:tenant", "descriptor:route"]
[[limits]]
name = "monthly"
quota = 100
period = "month"
key = ["descriptor:tenant"]
"#;

#[test]
fn validate_refuses_every_bad_bucket_rule_in_one_line_naming_its_key() {
    let cases: &[(&str, &str)] = &[
        (
            "[[rlqs.buckets]]\nlimit = \"nope\"\nkey = [\"tenant\"]\n",
            "rlqs.buckets[0].limit: no limit is named \"nope\"",
        ),
        (
            "[[rlqs.buckets]]\nlimit = \"per-tenant\"\nkey = []\n",
            "rlqs.buckets[0].key: limit \"per-tenant\" is keyed on 1 part(s)",
        ),
        (
            "[[rlqs.buckets]]\nlimit = \"two-parts\"\nkey = [\"tenant\"]\n",
            "rlqs.buckets[0].key: limit \"two-parts\" is keyed on 2 part(s) besides constants",
        ),
        (
            "[[rlqs.buckets]]\nlimit = \"monthly\"\nkey = [\"tenant\"]\n",
            "rlqs.buckets[0].limit: limit \"monthly\" is not a token bucket",
        ),
        (
            "[[rlqs.buckets]]\nlimit = \"per-tenant\"\nkey = [\"\"]\n",
            "rlqs.buckets[0].key",
        ),
        ("[rlqs]\nassignment_ttl_s = 0\n", "rlqs.assignment_ttl_s"),
        ("[rlqs]\nreserve = 0.9\n", "rlqs.reserve"),
        ("[rlqs]\nabandon_after_s = 0\n", "rlqs.abandon_after_s"),
        ("[rlqs]\nunmatched = \"maybe\"\n", "unmatched"),
    ];
    for (rule, expected) in cases {
        let output = validate(&format!("{LIMITS}{rule}"));
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{rule}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(expected), "{expected:?} in: {err}");
    }
    let without_grpc = LIMITS.replace("grpc_listen = \"127.0.0.1:0\"", "");
    let output = validate(&format!(
        "{without_grpc}[[rlqs.buckets]]\nlimit = \"per-tenant\"\nkey = [\"tenant\"]\n"
    ));
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("rlqs.buckets"));
    let fine = validate(&format!(
        "{LIMITS}[[rlqs.buckets]]\ndomain = \"edge\"\nmatch = {{ name = \"t\" }}\nlimit = \"two-parts\"\nkey = [\"tenant\", \"route\"]\n"
    ));
    assert_eq!(
        fine.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&fine.stderr)
    );
    let printed = String::from_utf8_lossy(&fine.stdout);
    assert!(
        printed.contains("rlqs          1 bucket rule(s), unmatched allow, ttl 8 s")
            && printed
                .contains("domain edge  match [name=t]  -> limit two-parts  key [tenant, route]"),
        "{printed}"
    );
}

const SHARED: &str = r#"
[rlqs]
assignment_ttl_s = 10
reserve = 0.05
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
[[limits.overrides]]
key = ["free-for-all"]
unlimited = true
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_share_one_limit_and_other_buckets_get_blanket_rules() {
    let redis = RedisServer::start();
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", SHARED));
    let acme: &[(&str, &str)] = &[("name", "per_tenant"), ("tenant", "acme")];
    let mut a = Envoy::connect(addr).await;
    let first = a.report(&[(acme, 1)]).await;
    // Alone: the whole limit less the 5% reserve, in units of 1/3600 token per second.
    let ((max_a, fill_a, interval), ttl) = read(&first, 0);
    assert_eq!((max_a, fill_a, interval, ttl), (19, 34_200, 3600, 10));

    let mut b = Envoy::connect(addr).await;
    let ((max_b, fill_b, _), _) = read(&b.report(&[(acme, 1)]).await, 0);
    assert_eq!(
        (max_b, fill_b),
        (1, 900),
        "a newcomer is served from half the reserve"
    );
    assert!(max_a + max_b <= 20 && fill_a + fill_b <= 36_000);

    // a is cut to its part at once; what it frees counts until its old assignment expires.
    let ((max_a, fill_a, _), _) = read(&a.report(&[(acme, 50)]).await, 0);
    assert!(fill_a < 34_200, "{fill_a}");
    let ((max_b2, fill_b2, _), _) = read(&b.report(&[(acme, 50)]).await, 0);
    assert_eq!(
        (max_b2, fill_b2),
        (1, 1800),
        "no growth before the cut expires"
    );
    assert!(max_a + max_b2 <= 20 && fill_a + fill_b2 <= 36_000);

    // Peek shows what both may hold: within the limit.
    let peek = crate::support::http::admin_json(
        tollgate.admin,
        "GET",
        "/v1/buckets/per-tenant?key=acme",
        None,
        "",
    );
    assert_eq!(peek.status, 200, "{peek:?}");
    let peek: serde_json::Value = serde_json::from_str(&peek.body).expect("JSON");
    let shares = &peek["shares"];
    assert_eq!(shares["envoys"], 2, "{peek}");
    let rate = shares["rate_per_s"].as_f64().expect("a rate");
    assert!(rate > 9.0 && rate <= 10.0, "{peek}");
    assert!(shares["burst"].as_u64().is_some_and(|b| b <= 20), "{peek}");

    // Unmapped ids are allowed (the default), unlimited keys too; both with a TTL.
    let other: &[(&str, &str)] = &[("name", "something_else")];
    let free: &[(&str, &str)] = &[("name", "per_tenant"), ("tenant", "free-for-all")];
    let answer = a.report(&[(other, 3), (free, 3)]).await;
    assert_eq!(answer.bucket_action.len(), 2);
    for i in 0..2 {
        let ((_, rule, _), ttl) = read(&answer, i);
        assert_eq!((rule, ttl), (BlanketRule::AllowAll as u32, 10));
    }
    let metrics = tollgate.metrics();
    assert!(metrics.contains("tollgate_rlqs_streams 2"), "{metrics}");
    // Only the buckets with a share are tracked: acme's on each stream.
    assert!(metrics.contains("tollgate_rlqs_buckets 2"), "{metrics}");
    assert!(
        metrics.contains("tollgate_rlqs_reports_total 6"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_rlqs_assignments_total{action=\"allow_all\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_rlqs_share_utilisation{limit=\"per-tenant\"}"),
        "{metrics}"
    );
    drop(a);
    drop(b);
    assert!(crate::support::wait_until(Duration::from_secs(5), || {
        tollgate.metrics().contains("tollgate_rlqs_streams 0")
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_buckets_are_denied_when_configured() {
    let redis = RedisServer::start();
    let config = SHARED.replace("[rlqs]\n", "[rlqs]\nunmatched = \"deny\"\n");
    let (_tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", &config));
    let mut envoy = Envoy::connect(addr).await;
    // A mapped rule whose key entry is missing is unmatched too.
    let answer = envoy
        .report(&[(&[("name", "x")], 1), (&[("name", "per_tenant")], 1)])
        .await;
    for i in 0..2 {
        let ((_, rule, _), _) = read(&answer, i);
        assert_eq!(rule, BlanketRule::DenyAll as u32);
    }
}

/// Six streams on two replicas report as fast as they are answered, with random counts,
/// while peeks read the pool: what may be held never passes the limit, at any peek, and the
/// last assignments of all six (all still in force) fit in it together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_racing_on_two_replicas_never_hold_more_than_the_limit() {
    let redis = RedisServer::start();
    let config = redis_config(&redis, "", SHARED);
    let replicas = [grpc::tollgate(&config), grpc::tollgate(&config)];
    let acme: &'static [(&'static str, &'static str)] =
        &[("name", "per_tenant"), ("tenant", "acme")];
    let mut tasks = Vec::new();
    for i in 0..6u64 {
        let addr = replicas[(i % 2) as usize].1;
        tasks.push(tokio::spawn(async move {
            let mut envoy = Envoy::connect(addr).await;
            let mut last = (0, 0);
            for round in 0..60u64 {
                let requests = (i * 37 + round * 101) % 400;
                let answer = envoy.report(&[(acme, requests)]).await;
                let ((max, fill, interval), _) = read(&answer, 0);
                // A blanket rule (DENY_ALL) holds nothing.
                last = if interval == 0 {
                    (0, 0)
                } else {
                    (u64::from(max), u64::from(fill))
                };
            }
            last
        }));
    }
    let admin = replicas[0].0.admin;
    let peeks = tokio::task::spawn_blocking(move || {
        let mut seen = 0;
        for _ in 0..200 {
            let peek = crate::support::http::admin_json(
                admin,
                "GET",
                "/v1/buckets/per-tenant?key=acme",
                None,
                "",
            );
            let peek: serde_json::Value = serde_json::from_str(&peek.body).expect("JSON");
            let shares = &peek["shares"];
            let rate = shares["rate_per_s"].as_f64().unwrap_or(0.0);
            let burst = shares["burst"].as_u64().unwrap_or(0);
            assert!(rate <= 10.0 && burst <= 20, "held past the limit: {peek}");
            seen += usize::from(shares["envoys"].as_u64().unwrap_or(0) > 1);
        }
        seen
    });
    let mut sums = (0, 0);
    for task in tasks {
        let (max, fill) = task.await.expect("a stream");
        sums = (sums.0 + max, sums.1 + fill);
    }
    assert!(sums.0 <= 20 && sums.1 <= 36_000, "{sums:?}");
    assert!(
        peeks.await.expect("the peeks") > 0,
        "the peeks saw the streams share"
    );
}

/// A replica told to stop ends its quota streams after the close notice (Envoy then opens
/// its stream again on another replica while its assignments hold), and exits promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_ends_its_streams_after_the_close_notice() {
    let redis = RedisServer::start();
    let (mut tollgate, addr) = grpc::tollgate_with_env(
        &redis_config(&redis, "", SHARED),
        &[crate::support::SHORT_TIMINGS],
    );
    let mut envoy = Envoy::connect(addr).await;
    let acme: &[(&str, &str)] = &[("name", "per_tenant"), ("tenant", "acme")];
    envoy.report(&[(acme, 1)]).await;
    tollgate.signal("TERM");
    let notice = crate::support::short_timings().close_notice;
    let ended = tokio::time::timeout(notice * 20, envoy.answers.message()).await;
    assert!(
        matches!(ended, Ok(Ok(None))),
        "the stream ended cleanly: {ended:?}"
    );
    assert_eq!(tollgate.wait_exit(Duration::from_secs(10)), Some(0));
}

/// A bucket reported without requests for `abandon_after_s` is abandoned; one with requests
/// never is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_bucket_is_abandoned() {
    let redis = RedisServer::start();
    let config = SHARED.replace("[rlqs]\n", "[rlqs]\nabandon_after_s = 1\n");
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", &config));
    let mut envoy = Envoy::connect(addr).await;
    let acme: &[(&str, &str)] = &[("name", "per_tenant"), ("tenant", "acme")];
    let busy: &[(&str, &str)] = &[("name", "per_tenant"), ("tenant", "busy")];
    envoy.report(&[(acme, 5), (busy, 5)]).await;
    let first = envoy.report(&[(acme, 0), (busy, 5)]).await;
    let assigned = |answer: &RateLimitQuotaResponse| {
        answer
            .bucket_action
            .iter()
            .all(|a| matches!(a.bucket_action, Some(Kind::QuotaAssignmentAction(_))))
    };
    assert!(assigned(&first), "idle for less than a second: {first:?}");
    // Reports without requests for acme (and with some for busy) until acme is abandoned.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let abandoned = loop {
        let answer = envoy.report(&[(acme, 0), (busy, 5)]).await;
        let kinds: Vec<(bool, bool)> = answer
            .bucket_action
            .iter()
            .map(|a| {
                let is_acme = a.bucket_id.as_ref().and_then(|b| b.bucket.get("tenant"))
                    == Some(&"acme".to_string());
                (
                    is_acme,
                    matches!(a.bucket_action, Some(Kind::AbandonAction(_))),
                )
            })
            .collect();
        assert!(
            kinds.iter().all(|(is_acme, abandon)| *is_acme || !abandon),
            "a bucket with requests is never abandoned: {answer:?}"
        );
        if kinds.iter().any(|(is_acme, abandon)| *is_acme && *abandon) {
            break true;
        }
        if tokio::time::Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        abandoned,
        "acme was abandoned after a second without requests"
    );
    assert!(
        tollgate
            .metrics()
            .contains("tollgate_rlqs_assignments_total{action=\"abandon\"} 1"),
        "{}",
        tollgate.metrics()
    );
}
