//! Envoy's rate limit service through a tonic client, against the real binary and a real
//! Redis: decisions and answers, all-or-nothing across descriptors, exactness across
//! instances, malformed requests, a dead Redis, health and drain.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::grpc::{self, ask, descriptor, header, request, OK, OVER_LIMIT};
use crate::support::limit;
use crate::support::{redis_config, RedisServer};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::Code;

mod clients;
mod decisions;
mod failures;
mod health;

/// One test at a time: several start three processes each, and the timing promises are about
/// tollgate, not about these tests competing for two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A per-user limit and a per-path limit that barely refills.
const TWO_LIMITS: &str = r#"
[response]
headers = ["ietf", "x-ratelimit"]

[[limits]]
name = "per-user"
rate = 0.001
burst = 5
key = ["descriptor:user"]
[limits.match]
domains = ["edge"]

[[limits]]
name = "per-path"
rate = 0.001
burst = 1
key = ["descriptor:path"]
[limits.match]
domains = ["edge"]
"#;

use serde::Deserialize as _;
