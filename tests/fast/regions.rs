//! One limit across regions through the real binary. In a region, a global limit's key with no
//! share is decided against the region's floor alone, in its own store. At home, a region's
//! reporter is a
//! holder of the home's quota service in the reserved domain, its bucket ids naming a global
//! limit and a key's tail in hex, its pool what the floors leave; a region the home does not
//! know, or one saying another floor, is refused with an error status and counted.

use tollgate_core::policy::regions::{domain_of, to_hex, KEY_ENTRY, LIMIT_ENTRY};

use crate::support::rlqs::{read, Envoy};
use crate::support::{grpc, redis_config, RedisServer, Tollgate};

const HOME: &str = r#"
[[limits]]
name = "per-tenant"
rate = 10
burst = 100
key = ["header:x-tenant"]
scope = "global"

[home]
regions = { eu-west = 0.2, us-east = 0.2 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_is_served_from_what_the_floors_leave() {
    let redis = RedisServer::start();
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", HOME));
    let key = to_hex(b"acme");
    let id: &[(&str, &str)] = &[(LIMIT_ENTRY, "per-tenant"), (KEY_ENTRY, key.as_str())];
    let mut eu = Envoy::connect(addr).await;
    let answer = eu
        .report_in(&domain_of("eu-west", 0.2), &[(id, 1)])
        .await
        .expect("served");
    // The pool is 0.6 x (10/s, 100): 6/s and 60 tokens, less the 5% reserve: 57 tokens,
    // 5.7/s in units of 1/3600 token per second.
    let ((max_tokens, per_fill, interval), _) = read(&answer, 0);
    assert_eq!((max_tokens, per_fill, interval), (57, 20_520, 3600));

    let mut us = Envoy::connect(addr).await;
    let ((max_us, fill_us, _), _) = read(
        &us.report_in(&domain_of("us-east", 0.2), &[(id, 1)])
            .await
            .expect("served"),
        0,
    );
    assert!(max_tokens + max_us <= 60 && per_fill + fill_us <= 21_600);

    let metrics = tollgate.metrics();
    assert!(
        metrics.contains("tollgate_rlqs_regions_refused_total 0"),
        "{metrics}"
    );
    drop(tollgate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_regions_and_other_floors_are_refused_and_counted() {
    let redis = RedisServer::start();
    let (tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", HOME));
    let key = to_hex(b"acme");
    let id: &[(&str, &str)] = &[(LIMIT_ENTRY, "per-tenant"), (KEY_ENTRY, key.as_str())];
    for domain in [domain_of("eu-west", 0.3), domain_of("ap-south", 0.2)] {
        let mut region = Envoy::connect(addr).await;
        let refused = region.report_in(&domain, &[(id, 1)]).await;
        let status = refused.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    }
    let metrics = tollgate.metrics();
    assert!(
        metrics.contains("tollgate_rlqs_regions_refused_total 2"),
        "{metrics}"
    );
}

#[test]
fn a_region_decides_a_key_without_a_share_against_its_floor() {
    let redis = RedisServer::start();
    let region = r#"
[[limits]]
name = "per-tenant"
rate = "1/hour"
burst = 20
key = ["header:x-tenant"]
scope = "global"

[region]
name = "eu-west"
home = "127.0.0.1:9"
floor = 0.25
"#;
    let tollgate = Tollgate::start(&redis_config(&redis, "", region));
    let statuses: Vec<u16> = (0..7)
        .map(|_| tollgate.check(&[("x-tenant", "acme")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(tollgate.check(&[("x-tenant", "other")]).status, 200);
}

/// A region and its home, each on its own Redis: the region reports the demand its floor
/// denies, the home assigns it a share of what the floors leave, and the region admits more
/// than its floor alone could (proof that shares arrive and are used), never more than the
/// limit.
#[test]
fn a_region_with_demand_gets_a_share_and_stays_within_the_limit() {
    shares_arrive("", "", "");
}

/// The same with the region's instance borrowing (`borrow = true`): its slices count against
/// the share in force, and it still admits beyond its floor, never past the limit.
#[test]
fn a_borrowing_region_gets_a_share_and_stays_within_the_limit() {
    shares_arrive("", "", "borrow = true\n");
}

/// The same over TLS: the home's gRPC listener with `grpc_tls`, the region trusting its CA
/// with `[region.tls]`.
#[test]
fn a_region_reaches_its_home_over_tls() {
    let certs = crate::support::TempDir::new("region-tls");
    crate::support::make_certificates(certs.path());
    let dir = certs.path().display();
    shares_arrive(
        &format!("grpc_tls = {{ cert_file = \"{dir}/cert.pem\", key_file = \"{dir}/key.pem\" }}\n"),
        &format!("[region.tls]\nca_file = \"{dir}/ca.pem\"\n"),
        "",
    );
}

/// A home (its config preceded by `home_top`) and a region (its config followed by
/// `region_tail`, its limit's table ending with `region_limit`), each on its own Redis: the
/// region admits beyond its floor, never past the limit, and peeks show the share on both
/// sides.
fn shares_arrive(home_top: &str, region_tail: &str, region_limit: &str) {
    let home_redis = RedisServer::start();
    let home_config = r#"
[[limits]]
name = "per-tenant"
rate = 10
burst = 10
key = ["header:x-tenant"]
scope = "global"

[rlqs]
assignment_ttl_s = 2
reserve = 0.0

[home]
regions = { eu-west = 0.2 }
"#;
    let home_config = format!("{home_top}{}", redis_config(&home_redis, "", home_config));
    let (home, addr) = grpc::tollgate(&home_config);
    let region_redis = RedisServer::start();
    let region_config = format!(
        r#"
[[limits]]
name = "per-tenant"
rate = 10
burst = 10
key = ["header:x-tenant"]
scope = "global"
{region_limit}
[region]
name = "eu-west"
home = "{addr}"
floor = 0.2
report_every_ms = 100
{region_tail}"#
    );
    let region = Tollgate::start(&redis_config(&region_redis, "", &region_config));
    let start = std::time::Instant::now();
    let mut admitted = 0u32;
    let mut beyond_the_floor = false;
    while start.elapsed() < std::time::Duration::from_secs(15) {
        if region.check(&[("x-tenant", "acme")]).status == 200 {
            admitted += 1;
        }
        // Read after the check: the time can only be longer than the check's own.
        let elapsed = start.elapsed().as_secs_f64();
        let limit_bound = 10.0 + 10.0 * elapsed + 1.0;
        assert!(
            f64::from(admitted) <= limit_bound,
            "{admitted} admitted in {elapsed} s: past the limit"
        );
        // The floor alone (2/s, 2 tokens) admits at most this many since the start.
        if f64::from(admitted) > 2.0 + 2.0 * elapsed + 1.0 {
            beyond_the_floor = true;
            // A borrowing region goes on until it has admitted from slices.
            if region_limit.is_empty()
                || region.metric("tollgate_borrowed_tokens_total{event=\"used\"}") > 0.0
            {
                break;
            }
        }
        // A borrowing region is asked less than its floor and share give (about 6/s), so that
        // its bucket holds tokens to lend; the other, more than its floor.
        let pause = if region_limit.is_empty() { 20 } else { 150 };
        std::thread::sleep(std::time::Duration::from_millis(pause));
    }
    assert!(
        beyond_the_floor,
        "{admitted} admitted: never beyond the floor; region metrics:\n{}",
        region.metrics()
    );
    if !region_limit.is_empty() {
        let used = region.metric("tollgate_borrowed_tokens_total{event=\"used\"}");
        assert!(
            used > 0.0,
            "never admitted from a slice: {}",
            region.metrics()
        );
    }
    // A peek shows the region's floor and share, and the home's shares by region.
    let peek = |admin| {
        let answer = crate::support::http::admin_json(
            admin,
            "GET",
            "/v1/buckets/per-tenant?key=acme",
            None,
            "",
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        serde_json::from_str::<serde_json::Value>(&answer.body).expect("JSON")
    };
    let here = peek(region.admin);
    assert_eq!(here["region"]["floor"]["burst"], 2.0, "{here}");
    assert!(
        here["region"]["share"]["burst"].as_u64() > Some(0),
        "{here}"
    );
    let at_home = peek(home.admin);
    assert_eq!(at_home["shares"]["regions"], 1, "{at_home}");
    assert_eq!(
        at_home["shares"]["holders"][0]["region"], "eu-west",
        "{at_home}"
    );
    assert_eq!(region.metric("tollgate_region_link_up"), 1.0);
    assert!(region.metric("tollgate_region_share_rate{limit=\"per-tenant\"}") > 0.0);
    assert!(home.metric("tollgate_rlqs_streams") >= 1.0);
}
