//! A flood of quota buckets never reaches `/check`: a real Envoy 1.40 on the shipped
//! `config/envoy/rlqs.yaml`, in front of two tollgate replicas on one Redis with the default
//! store deadline (50 ms), is sent 2,000 requests of distinct `x-tenant` values by a plain
//! HTTP client. Envoy makes a bucket of each and reports them all every 5 s; meanwhile a
//! tenant under its limit is served through Envoy and a user is checked on `/check` at both
//! replicas. No replica answers a check per `on_error`, the user is held to its limit, and
//! every bucket keeps an assignment, round after round.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::envoy::Envoy;
use crate::support::proxies::backend::Backend;
use crate::support::{grpc, redis_config, HttpClient, RedisServer, Tollgate};

const LIMITS: &str = r#"
[[rlqs.buckets]]
domain = "edge"
match = { name = "per_tenant" }
limit = "per-tenant"
key = ["tenant"]

[[limits]]
name = "per-tenant"
rate = 100
burst = 100
key = ["descriptor:tenant"]

[[limits]]
name = "per-user"
rate = "1/min"
burst = 5
key = ["header:x-user"]
"#;

/// How long the flood's buckets are reported after they were made: six rounds.
const ROUNDS_S: u64 = 30;

/// Statuses of `tenant`'s requests through `envoy` at `rate` per second until `stop`.
fn tenant_load(
    envoy: SocketAddr,
    tenant: &'static str,
    rate: f64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(f64, u16)>> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut client = HttpClient::connect(envoy).expect("connect to Envoy");
        let mut seen = Vec::new();
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let due = start + Duration::from_secs_f64(sent as f64 / rate);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            sent += 1;
            let status = client
                .get("/", &[("x-tenant", tenant)])
                .map_or(0, |r| r.status);
            if status == 0 {
                client = HttpClient::connect(envoy).expect("reconnect to Envoy");
            }
            seen.push((start.elapsed().as_secs_f64(), status));
        }
        seen
    })
}

/// `/check` of one user on `replicas` in turn, 20 per second, until `stop`.
fn check_load(
    replicas: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    admitted: Arc<Mutex<u64>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut clients: Vec<HttpClient> = replicas
            .iter()
            .map(|addr| HttpClient::connect(*addr).expect("connect to tollgate"))
            .collect();
        let mut turn = 0;
        while !stop.load(Ordering::Relaxed) {
            let client = &mut clients[turn % 2];
            turn += 1;
            if let Ok(response) = client.get("/check", &[("x-user", "u1")]) {
                if response.status == 200 {
                    *admitted.lock().unwrap() += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

#[test]
fn a_flood_of_buckets_leaves_checks_and_other_tenants_alone() {
    let redis = RedisServer::start();
    // The production store deadline: the one a flood of reports used to exhaust.
    // Without the deny cache, every check of the user reaches Redis.
    let config = redis_config(&redis, "timeout_ms = 50\ndeny_cache = false\n", LIMITS);
    let replicas: Vec<(Tollgate, SocketAddr)> = (0..2).map(|_| grpc::tollgate(&config)).collect();
    let app = Backend::start();
    let grpc_addrs: Vec<SocketAddr> = replicas.iter().map(|(_, grpc)| *grpc).collect();
    let mut envoy = Envoy::rlqs(&grpc_addrs, app.addr);

    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(Mutex::new(0u64));
    let started = Instant::now();
    let checks = check_load(
        replicas.iter().map(|(t, _)| t.addr).collect(),
        stop.clone(),
        admitted.clone(),
    );
    let acme = tenant_load(envoy.addr, "acme", 10.0, stop.clone());

    // The flood: 2,000 tenants, one request each, over four connections.
    let flood: Vec<_> = (0..4)
        .map(|lane| {
            let addr = envoy.addr;
            std::thread::spawn(move || {
                let mut client = HttpClient::connect(addr).expect("connect to Envoy");
                for t in (lane..2000).step_by(4) {
                    let tenant = format!("flood-{t}");
                    if client.get("/", &[("x-tenant", tenant.as_str())]).is_err() {
                        client = HttpClient::connect(addr).expect("reconnect to Envoy");
                    }
                }
            })
        })
        .collect();
    for thread in flood {
        thread.join().expect("a flood lane");
    }
    let flooded_at = started.elapsed().as_secs_f64();
    let assigned = |replicas: &[(Tollgate, SocketAddr)]| -> f64 {
        replicas
            .iter()
            .map(|(t, _)| t.metric("tollgate_rlqs_assignments_total{action=\"token_bucket\"}"))
            .sum()
    };
    // Two rounds for Envoy to report every bucket, then four more, of which at least three
    // must be answered whole: a window of exactly three cut the rounds at its edges, and on
    // a loaded machine a round's answers spread over more than a second (2.8 rounds counted).
    std::thread::sleep(Duration::from_secs(10));
    let before = assigned(&replicas);
    std::thread::sleep(Duration::from_secs(ROUNDS_S - 10));
    let after = assigned(&replicas);
    stop.store(true, Ordering::Relaxed);
    checks.join().expect("the checks");
    let acme = acme.join().expect("acme's load");
    let elapsed = started.elapsed().as_secs_f64();

    if let Some(status) = envoy.exited() {
        panic!("Envoy crashed ({status}): {}", envoy.log());
    }
    for (i, (tollgate, _)) in replicas.iter().enumerate() {
        let errors = tollgate.metric("tollgate_checks_total{result=\"error_allowed\"}");
        assert_eq!(
            errors,
            0.0,
            "replica {i} answered checks per on_error: {}",
            tollgate.metrics()
        );
        assert_eq!(tollgate.metric("tollgate_store_up"), 1.0, "replica {i}");
    }
    let admitted = *admitted.lock().unwrap();
    let bound = 5 + (elapsed / 60.0).ceil() as u64;
    assert!(
        admitted <= bound,
        "u1: {admitted} admitted, at most {bound}"
    );
    // Every bucket answered every round: 2,001 buckets, three whole rounds in four.
    assert!(
        after - before >= 3.0 * 2001.0,
        "{} token buckets sent in four rounds for 2,001 buckets",
        after - before
    );
    // acme, 10/s under its 100/s: refused only before its first assignment (the shipped
    // `no_assignment_behavior` denies), never once the flood is reported.
    let refused_late: Vec<&(f64, u16)> = acme
        .iter()
        .filter(|(t, status)| *t > 2.0 && *status != 200)
        .collect();
    assert!(
        refused_late.is_empty(),
        "acme refused after its first assignment (flood made by {flooded_at:.1} s): {:?}",
        &refused_late[..refused_late.len().min(20)]
    );
}
