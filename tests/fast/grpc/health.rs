//! gRPC health follows readiness, and SIGTERM finishes the RPCs in flight.

use super::*;

type Health = tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>;

async fn health_client(addr: std::net::SocketAddr) -> Health {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect to the gRPC listener");
    Health::new(channel)
}

async fn health(client: &mut Health, service: &str) -> i32 {
    let request = tonic_health::pb::HealthCheckRequest {
        service: service.into(),
    };
    client
        .check(request)
        .await
        .expect("a health answer")
        .into_inner()
        .status
}

const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;
const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_follows_readiness() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start();
    let limits = &limit("u", 10, 10, &["descriptor:user"]);
    let store = |mode: &str| format!("timeout_ms = 50\non_error = \"{mode}\"\n");
    // Health is asked every `grpc_health_every` (1 s; here 100 ms).
    let short = [crate::support::SHORT_TIMINGS];
    let tollgate =
        |mode| grpc::tollgate_with_env(&redis_config(&redis, &store(mode), limits), &short);
    let (_deny, deny) = tollgate("deny");
    let (_allow, allow) = tollgate("allow");
    let (mut deny, mut allow) = (health_client(deny).await, health_client(allow).await);
    assert_eq!(health(&mut deny, "").await, SERVING);
    assert_eq!(health(&mut deny, RLS).await, SERVING);
    let poll = crate::support::short_timings().grpc_health_every / 5;

    redis.kill();
    let mut status = SERVING;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        status = health(&mut deny, RLS).await;
        if status == NOT_SERVING {
            break;
        }
        tokio::time::sleep(poll).await;
    }
    assert_eq!(
        status, NOT_SERVING,
        "on_error = deny cannot decide without Redis"
    );
    assert_eq!(health(&mut deny, "").await, NOT_SERVING);
    assert_eq!(
        health(&mut allow, RLS).await,
        SERVING,
        "allow still decides"
    );

    redis.restart();
    let mut status = NOT_SERVING;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        status = health(&mut deny, RLS).await;
        if status == SERVING {
            break;
        }
        tokio::time::sleep(poll).await;
    }
    assert_eq!(status, SERVING);
}

/// An RPC in flight when SIGTERM arrives is answered by Redis, health turns NOT_SERVING at
/// once, and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_rpcs_and_reports_not_serving() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let limits = &limit("u", 0.01, 10, &["descriptor:user"]);
    let (mut tollgate, addr) = grpc::tollgate(&redis_config(&redis, "", limits));
    let mut client = grpc::client(addr).await;
    let mut checks = health_client(addr).await;
    let one = || request("edge", vec![descriptor(&[("user", "zed")])]);
    assert_eq!(ask(&mut client, one()).await.overall_code, OK);

    // Redis busy for 1 s: the next RPC waits for it, well within the 2 s store timeout.
    let port = redis.port;
    let sleeper =
        std::thread::spawn(move || crate::support::redis_cli(port, &["DEBUG", "SLEEP", "1"]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let in_flight = tokio::spawn(async move { ask(&mut client, one()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tollgate.signal("TERM");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(health(&mut checks, RLS).await, NOT_SERVING);

    let answer = in_flight.await.expect("in-flight RPC");
    assert_eq!(answer.overall_code, OK);
    assert_eq!(
        answer.statuses[0].limit_remaining, 8,
        "decided by Redis, not on_error"
    );
    let _ = sleeper.join();
    assert_eq!(tollgate.wait_exit(Duration::from_secs(12)), Some(0));
}
