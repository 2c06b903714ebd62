//! An assignment as Envoy's `BucketAction`: only `token_bucket` or `blanket_rule` (Envoy 1.40
//! ignores `requests_per_time_unit`, failing open), always with a whole-second TTL of at
//! least 1 s (an assignment without one expires at once).

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};

use tollgate_core::limiter::rlqs::Assignment;
use tollgate_core::observe::metrics::RlqsMetrics;

/// `assignment` for `bucket`, valid for `ttl_s` (at least 1), counted in `metrics`.
pub fn assign(
    bucket: BucketId,
    assignment: Assignment,
    ttl_s: u64,
    metrics: &RlqsMetrics,
) -> BucketAction {
    let strategy = match assignment {
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        } => {
            metrics.token_bucket.inc();
            Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(UInt32Value {
                    value: tokens_per_fill,
                }),
                fill_interval: Some(seconds(fill_interval_s)),
            })
        }
        Assignment::DenyAll => {
            metrics.deny_all.inc();
            Strategy::BlanketRule(BlanketRule::DenyAll as i32)
        }
        Assignment::AllowAll => {
            metrics.allow_all.inc();
            Strategy::BlanketRule(BlanketRule::AllowAll as i32)
        }
    };
    BucketAction {
        bucket_id: Some(bucket),
        bucket_action: Some(Kind::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(ttl_s.max(1))),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

/// Tells Envoy to forget `bucket` (it starts afresh, with `no_assignment_behavior`, if
/// requests come again).
pub fn abandon(bucket: BucketId, metrics: &RlqsMetrics) -> BucketAction {
    metrics.abandon.inc();
    BucketAction {
        bucket_id: Some(bucket),
        bucket_action: Some(Kind::AbandonAction(AbandonAction {})),
    }
}

fn seconds(s: u64) -> Duration {
    Duration {
        seconds: i64::try_from(s).unwrap_or(i64::MAX),
        nanos: 0,
    }
}
