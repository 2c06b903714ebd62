//! Quotas on a Redis Cluster (refunds and reports across slots) and behind Sentinel.

use super::*;

/// A quota per tenant and a bucket per user: keyed on different parts, so on a Cluster they
/// live in different slots and a denial in one slot must refund the quota charged in the other.
#[cfg(feature = "e2e")]
const ACROSS_SLOTS: &str = r#"
[[limits]]
name = "per-user"
rate = 0.001
burst = 2
key = ["header:x-user"]

[[limits]]
name = "tenant-daily"
quota = 5
period = "day"
key = ["header:x-tenant"]

[[limits]]
name = "tenant-tokens"
quota = 1000
period = "month"
charge = "report"
key = ["header:x-tenant"]

[[limits]]
name = "user-tokens"
rate = 0.001
burst = 100
charge = "report"
key = ["header:x-user"]
"#;

/// The bucket denies while the quota (another slot) admits: the quota must count nothing. With
/// the deny cache on, the denial may come from the cache, which charges nothing either; the
/// Cluster test turns it off so the refund runs.
#[cfg(feature = "e2e")]
fn assert_quota_refunded_across_slots(tollgate: &Tollgate) {
    let from = |user: &'static str| [("x-tenant", "acme"), ("x-user", user)];
    assert_eq!(tollgate.check(&from("u1")).status, 200);
    assert_eq!(tollgate.check(&from("u1")).status, 200);
    let denied = tollgate.check(&from("u1"));
    assert_eq!(denied.status, 429, "{}", denied.body);
    assert!(denied.body.contains("\"per-user\""), "{}", denied.body);
    // The quota counted 2: three more for the tenant, then no more.
    for user in ["u2", "u2", "u3"] {
        assert_eq!(tollgate.check(&from(user)).status, 200, "{user}");
    }
    let over = tollgate.check(&from("u3"));
    assert_eq!(over.status, 429);
    assert!(over.body.contains("\"tenant-daily\""), "{}", over.body);
}

#[cfg(feature = "e2e")]
fn on_a_cluster_quotas_refund_across_slots_and_reports_span_slots() {
    let cluster = crate::support::cluster::RedisCluster::start();
    let seeds: Vec<String> = cluster.seeds().iter().map(|s| format!("\"{s}\"")).collect();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ncluster = [{}]\n\
         timeout_ms = 2000\non_error = \"deny\"\ndeny_cache = false\n{ACROSS_SLOTS}",
        seeds.join(", ")
    );
    let tollgate = Tollgate::start(&config);
    assert!(
        crate::support::wait_until(std::time::Duration::from_secs(10), || tollgate
            .check(&[("x-tenant", "warmup"), ("x-user", "warmup")])
            .header("ratelimit")
            .is_some()),
        "the cluster decides"
    );
    assert_quota_refunded_across_slots(&tollgate);
    // One report body charging keys in two slots.
    let answer = post(
        tollgate.admin,
        Some(TOKEN),
        r#"[{"limit": "tenant-tokens", "key": ["acme"], "cost": 1000},
            {"limit": "user-tokens", "key": ["u9"], "cost": 150}]"#,
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answers = json(&answer);
    assert_eq!(answers[0]["remaining"], 0);
    assert_eq!(answers[1]["remaining"], 0);
    assert!(answers[1]["retry_after"].as_u64().unwrap() > 40_000);
    let denied = tollgate.check(&[("x-tenant", "acme"), ("x-user", "u9")]);
    assert_eq!(denied.status, 429);
}

#[cfg(feature = "e2e")]
fn behind_sentinel_quotas_and_reports_work() {
    let setup = crate::support::cluster::SentinelSetup::start();
    let urls: Vec<String> = setup.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let config = format!(
        "admin_token = \"{TOKEN}\"\n[store]\nbackend = \"redis\"\ntimeout_ms = 2000\n\
         on_error = \"deny\"\nsentinel = {{ master = \"{}\", urls = [{}] }}\n{ACROSS_SLOTS}",
        crate::support::cluster::MASTER_NAME,
        urls.join(", ")
    );
    let tollgate = Tollgate::start(&config);
    assert!(
        crate::support::wait_until(std::time::Duration::from_secs(10), || tollgate
            .check(&[("x-tenant", "warmup"), ("x-user", "warmup")])
            .header("ratelimit")
            .is_some()),
        "the master decides"
    );
    assert_quota_refunded_across_slots(&tollgate);
    let answer = post(
        tollgate.admin,
        Some(TOKEN),
        r#"{"limit": "tenant-tokens", "key": ["acme"], "cost": 1000}"#,
    );
    assert_eq!(json(&answer)["remaining"], 0, "{}", answer.body);
    assert_eq!(
        tollgate
            .check(&[("x-tenant", "acme"), ("x-user", "u7")])
            .status,
        429
    );
}

/// Second tier (`cargo test --features e2e`): a Redis Cluster of six nodes, a Sentinel setup.
/// One module, so scripts/test.sh runs exactly these by the `e2e::` prefix.
#[cfg(feature = "e2e")]
mod e2e {
    #[test]
    fn on_a_cluster_quotas_refund_across_slots_and_reports_span_slots() {
        super::on_a_cluster_quotas_refund_across_slots_and_reports_span_slots();
    }

    #[test]
    fn behind_sentinel_quotas_and_reports_work() {
        super::behind_sentinel_quotas_and_reports_work();
    }
}
