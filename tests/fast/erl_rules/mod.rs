//! envoyproxy/ratelimit's YAML served over gRPC (`[envoy] config_dir`), answered as
//! envoyproxy/ratelimit answers. Each test names the envoyproxy/ratelimit case it mirrors
//! (test/config/config_test.go, test/service/ratelimit_test.go); the YAML is written here.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::support::grpc::{self, ask, descriptor, request, Client, OK, OVER_LIMIT};
use crate::support::{redis_config, RedisServer, TempDir, Tollgate};

mod matching;
mod serving;

/// Envoy's unit numbers.
const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const DAY: i32 = 4;

/// Runs these tests one after another: each starts a Redis and a tollgate.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A tollgate serving `yaml` as the one file of an envoyproxy/ratelimit config directory.
pub fn serve_yaml(redis: &RedisServer, yaml: &str) -> (TempDir, Tollgate, std::net::SocketAddr) {
    serve_yaml_with(redis, yaml, "")
}

/// [`serve_yaml`] with more `[envoy]` settings.
fn serve_yaml_with(
    redis: &RedisServer,
    yaml: &str,
    envoy: &str,
) -> (TempDir, Tollgate, std::net::SocketAddr) {
    let dir = TempDir::new("erl");
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), yaml).unwrap();
    let toml = format!(
        "[envoy]\nconfig_dir = {:?}\n{envoy}",
        config.display().to_string()
    );
    let (tollgate, addr) = grpc::tollgate(&redis_config(redis, "", &toml));
    (dir, tollgate, addr)
}

fn with_hits(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.hits_addend = Some(UInt64Value { value: hits });
    descriptor
}

/// (code, requests_per_unit, unit, name, remaining) of every descriptor.
fn shown(response: &RateLimitResponse) -> Vec<(i32, u32, i32, String, u32)> {
    response
        .statuses
        .iter()
        .map(|s| {
            let limit = s.current_limit.clone().unwrap_or_default();
            (
                s.code,
                limit.requests_per_unit,
                limit.unit,
                limit.name,
                s.limit_remaining,
            )
        })
        .collect()
}

async fn one(client: &mut Client, domain: &str, entries: &[(&str, &str)]) -> RateLimitResponse {
    ask(client, request(domain, vec![descriptor(entries)])).await
}

const BASIC: &str = "domain: d
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 2, name: specific}
  - key: key1
    value: free
  - key: key2
    value: value2
    descriptors:
      - key: subkey
        rate_limit: {unit: day, requests_per_unit: 3}
  - key: key3
    rate_limit: {unlimited: true}
  - key: key4
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: key5
    rate_limit: {unit: minute, requests_per_unit: 5}
";
