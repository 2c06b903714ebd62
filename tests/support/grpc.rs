//! A tonic client for Envoy's rate limit service, and tollgates that serve it.

use std::net::SocketAddr;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

use super::{free_port, Tollgate};

/// A client of the rate limit service.
pub type Client = RateLimitServiceClient<Channel>;

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

/// A tollgate serving gRPC on a free port, and that port.
pub fn tollgate(config: &str) -> (Tollgate, SocketAddr) {
    tollgate_with_env(config, &[])
}

pub fn tollgate_with_env(config: &str, env: &[(&str, &str)]) -> (Tollgate, SocketAddr) {
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let grpc_text = grpc.to_string();
    let mut all = vec![("TOLLGATE_GRPC_LISTEN", grpc_text.as_str())];
    all.extend_from_slice(env);
    (Tollgate::start_with_env(config, &all), grpc)
}

pub async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the gRPC listener")
}

/// One descriptor from `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("a decision")
        .into_inner()
}

/// The value of a header in `response_headers_to_add`.
pub fn header<'r>(response: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}
