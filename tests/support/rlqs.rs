//! A tonic client standing for Envoy's quota filter (`rate_limit_quota`): one stream, and the
//! reading of its answers.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tonic::Streaming;

/// One fake Envoy: a stream, and a way to send it reports.
pub struct Envoy {
    pub reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    pub answers: Streaming<RateLimitQuotaResponse>,
}

impl Envoy {
    pub async fn connect(addr: std::net::SocketAddr) -> Envoy {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        let (reports, outbound) = mpsc::channel(8);
        let outbound = futures_util::stream::unfold(outbound, |mut rx| async move {
            rx.recv().await.map(|next| (next, rx))
        });
        let answers = client
            .stream_rate_limit_quotas(outbound)
            .await
            .expect("the stream opens")
            .into_inner();
        Envoy { reports, answers }
    }

    pub async fn report(&mut self, usages: &[(&[(&str, &str)], u64)]) -> RateLimitQuotaResponse {
        self.report_in("edge", usages)
            .await
            .expect("no stream error")
    }

    /// One message of reports in `domain`; the stream's error, if it ends with one.
    pub async fn report_in(
        &mut self,
        domain: &str,
        usages: &[(&[(&str, &str)], u64)],
    ) -> Result<RateLimitQuotaResponse, tonic::Status> {
        let message = RateLimitQuotaUsageReports {
            domain: domain.into(),
            bucket_quota_usages: usages
                .iter()
                .map(|(id, allowed)| BucketQuotaUsage {
                    bucket_id: Some(bucket(id)),
                    time_elapsed: None,
                    num_requests_allowed: *allowed,
                    num_requests_denied: 0,
                })
                .collect(),
        };
        self.reports.send(message).await.expect("send");
        tokio::time::timeout(Duration::from_secs(5), self.answers.message())
            .await
            .expect("an answer within 5 s")
            .map(|answer| answer.expect("the stream is open"))
    }
}

pub fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
    }
}

/// (max_tokens, tokens_per_fill, fill_interval s) of a token bucket action, or the blanket
/// rule as (0, rule, 0); and the TTL in seconds.
pub fn read(response: &RateLimitQuotaResponse, i: usize) -> ((u32, u32, i64), i64) {
    let action = &response.bucket_action[i];
    let Some(Kind::QuotaAssignmentAction(assign)) = &action.bucket_action else {
        panic!("not an assignment: {action:?}");
    };
    let ttl = assign.assignment_time_to_live.expect("a TTL").seconds;
    let strategy = assign
        .rate_limit_strategy
        .as_ref()
        .and_then(|s| s.strategy)
        .expect("a strategy");
    let numbers = match strategy {
        Strategy::TokenBucket(tb) => (
            tb.max_tokens,
            tb.tokens_per_fill.expect("tokens_per_fill").value,
            tb.fill_interval.expect("fill_interval").seconds,
        ),
        Strategy::BlanketRule(rule) => (0, rule as u32, 0),
        Strategy::RequestsPerTimeUnit(_) => panic!("Envoy 1.40 ignores requests_per_time_unit"),
    };
    (numbers, ttl)
}
