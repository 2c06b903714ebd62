//! A rate limit service that decides nothing: every `ShouldRateLimit` is answered `OK` at once,
//! one `OK` status per descriptor, no headers. `bench/envoy.sh` puts it behind the same Envoy
//! config as tollgate, so the difference between the two is what tollgate's decision costs
//! through Envoy. It also serves `grpc.health.v1.Health` (SERVING), which the shipped
//! `config/envoy/ratelimit.yaml` health-checks.
//!
//! Usage: `cargo run --release --example rls_stub -- 127.0.0.1:8081`

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

struct AlwaysOk;

#[tonic::async_trait]
impl RateLimitService for AlwaysOk {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok.into(),
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

// One worker thread: the machine running the bench is small and shared.
#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8081".into())
        .parse()?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<AlwaysOk>>()
        .await;
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitServiceServer::new(AlwaysOk))
        .serve(addr)
        .await?;
    Ok(())
}
