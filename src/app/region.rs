//! A region's reporter (one limit across regions, `docs/regions.md`): every instance adds its
//! demand to the region store each interval; the one holding the reporter's lease drains it
//! and reports it to the home's quota service as one holder of each pool, one message at a
//! time (stop and wait: each answer belongs to the report before it), and writes each share
//! the home assigns beside its key's bucket, ending a TTL after the store's time read before
//! the report was sent. A check never waits on any of this.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix_web::web;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::Streaming;

use crate::state::AppState;
use tollgate_core::config::regions::RegionConfig;
use tollgate_core::kinds::global::Share;
use tollgate_core::limiter::region::Wanted;
use tollgate_core::policy::regions::{domain_of, KEY_ENTRY, LIMIT_ENTRY};

/// The most keys one report carries, the busiest first (the home answers at most 4,096 per
/// message, and a large one may not be answered within [`LATEST_ANSWER`]); the rest wait for
/// the next interval.
const KEYS_PER_REPORT: usize = 1024;

/// The latest an answer may be applied after its report's time was read: the home counts a
/// share from its own now to a TTL and a second later, and takes the holder to apply the
/// share it last sent only while that share has more than 2 s to go (its escrow pays for
/// nothing more), which holds when an answer is applied within a second of its report.
/// Later answers are dropped, and their stream with them.
const LATEST_ANSWER: Duration = Duration::from_millis(800);

/// The open stream to the home.
struct Link {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

/// A share this region holds: what the metrics sum per limit.
#[derive(Clone, Copy)]
struct Held {
    rate: f64,
    size: u64,
    until_us: u64,
}

/// Runs for as long as the instance does.
pub async fn report(state: web::Data<AppState>, region: RegionConfig, holder: String) {
    let every = Duration::from_millis(region.report_every_ms);
    let every_ms = region.report_every_ms;
    let domain = domain_of(&region.name, region.floor);
    let metrics = state.metrics.region.clone();
    let mut link: Option<Link> = None;
    let mut held: HashMap<(String, String), Held> = HashMap::new();
    // Keys drained but not reported (past KEYS_PER_REPORT, the busiest kept up to four
    // reports' worth): the next report's, added to what it drains.
    let mut carried: Vec<Wanted> = Vec::new();
    let mut last_answer = Instant::now();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        metrics
            .assignment_age
            .set(last_answer.elapsed().as_secs_f64());
        // Demand is advice: a failed add loses one interval's counts.
        if let Err(error) = state
            .limiter
            .flush_demand(every_ms.saturating_mul(10))
            .await
        {
            log::debug!("region: demand not added: {error}");
        }
        match state
            .limiter
            .region_lease(&holder, every_ms.saturating_mul(3))
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                // Another instance reports: ours, if any, ends.
                link = None;
                continue;
            }
            Err(error) => {
                log::debug!("region: lease not renewed: {error}");
                link = None;
                continue;
            }
        }
        let drained_at = Instant::now();
        let (t0, mut wanted) = match state.limiter.drain_demand().await {
            Ok(drained) => drained,
            Err(error) => {
                log::debug!("region: demand not drained: {error}");
                continue;
            }
        };
        held.retain(|_, share| share.until_us > t0);
        merge(&mut wanted, std::mem::take(&mut carried));
        if wanted.is_empty() {
            publish(&state, &held, &[], every);
            continue;
        }
        wanted.sort_by_key(|w| std::cmp::Reverse(w.requests));
        carried = wanted.split_off(wanted.len().min(KEYS_PER_REPORT));
        carried.truncate(4 * KEYS_PER_REPORT);
        let open = match link.take() {
            Some(open) => Some(open),
            None => connect(&region, every).await,
        };
        let Some(mut open) = open else {
            metrics.link_up.set(0);
            continue;
        };
        let message = RateLimitQuotaUsageReports {
            domain: domain.clone(),
            bucket_quota_usages: wanted.iter().map(usage).collect(),
        };
        // Stop and wait: the answer must come within LATEST_ANSWER of the report, or the
        // stream is dropped (a late answer would be taken for the next report's).
        let answered = async {
            open.reports.send(message).await.ok()?;
            open.answers.message().await.ok().flatten()
        };
        let patience = LATEST_ANSWER.saturating_sub(drained_at.elapsed());
        let Ok(Some(answer)) = tokio::time::timeout(patience, answered).await else {
            log::debug!("region: no answer from the home at {}", region.home);
            metrics.link_up.set(0);
            continue;
        };
        metrics.link_up.set(1);
        last_answer = Instant::now();
        metrics.assignment_age.set(0.0);
        let policy = state.limiter.policy();
        let mut late = false;
        for action in answer.bucket_action {
            if drained_at.elapsed() > LATEST_ANSWER {
                late = true;
                break;
            }
            let Some((limit, key, share)) = share_of(&action, t0) else {
                continue;
            };
            match state.limiter.put_share(&policy, &limit, &key, share).await {
                Ok(Some(_)) => {
                    held.insert(
                        (limit, key),
                        Held {
                            rate: share.rate,
                            size: share.size,
                            until_us: share.until_us,
                        },
                    );
                }
                Ok(None) => {}
                Err(error) => log::debug!("region: share of {limit} not written: {error}"),
            }
        }
        publish(&state, &held, &wanted, every);
        if late {
            log::debug!("region: the home's answer came too late to apply whole");
            metrics.link_up.set(0);
            continue;
        }
        link = Some(open);
    }
}

/// `more` added to `wanted`, the requests of a key in both summed.
fn merge(wanted: &mut Vec<Wanted>, more: Vec<Wanted>) {
    if more.is_empty() {
        return;
    }
    let mut at: HashMap<(String, String), usize> = wanted
        .iter()
        .enumerate()
        .map(|(i, w)| ((w.limit.clone(), w.key.clone()), i))
        .collect();
    for want in more {
        match at.get(&(want.limit.clone(), want.key.clone())) {
            Some(&i) => wanted[i].requests = wanted[i].requests.saturating_add(want.requests),
            None => {
                at.insert((want.limit.clone(), want.key.clone()), wanted.len());
                wanted.push(want);
            }
        }
    }
}

/// One key's demand as a bucket's usage: allowed and denied are not told apart.
fn usage(wanted: &Wanted) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [
                (LIMIT_ENTRY.to_string(), wanted.limit.clone()),
                (KEY_ENTRY.to_string(), wanted.key.clone()),
            ]
            .into(),
        }),
        time_elapsed: None,
        num_requests_allowed: wanted.requests,
        num_requests_denied: 0,
    }
}

/// The share an action assigns, ending its TTL after `t0` (µs of the region store): a token
/// bucket's numbers, or nothing beyond the floor for a blanket rule (a denial, or a key the
/// home leaves unlimited: the region's own numbers then decide). An abandon changes nothing.
fn share_of(action: &BucketAction, t0: u64) -> Option<(String, String, Share)> {
    let bucket = &action.bucket_id.as_ref()?.bucket;
    let limit = bucket.get(LIMIT_ENTRY)?.clone();
    let key = bucket.get(KEY_ENTRY)?.clone();
    let Some(Kind::QuotaAssignmentAction(assign)) = &action.bucket_action else {
        return None;
    };
    let ttl_s = u64::try_from(assign.assignment_time_to_live.as_ref()?.seconds).ok()?;
    let until_us = t0.saturating_add(ttl_s.saturating_mul(1_000_000));
    let strategy = assign.rate_limit_strategy.as_ref()?.strategy.as_ref()?;
    let share = match strategy {
        Strategy::TokenBucket(bucket) => {
            let per_fill = f64::from(bucket.tokens_per_fill.as_ref()?.value);
            let interval = bucket.fill_interval.as_ref()?.seconds;
            let interval = u32::try_from(interval).ok().filter(|s| *s > 0)?;
            Share {
                rate: per_fill / f64::from(interval),
                size: u64::from(bucket.max_tokens),
                until_us,
            }
        }
        Strategy::BlanketRule(rule) => {
            let _ = BlanketRule::try_from(*rule);
            Share {
                rate: 0.0,
                size: 0,
                until_us,
            }
        }
        _ => return None,
    };
    Some((limit, key, share))
}

/// Where the home is and how to speak to it: TLS with `[region.tls]`'s files (read at each
/// connection, so renewed ones are used from the next), else plain HTTP/2.
fn endpoint(region: &RegionConfig) -> Result<Endpoint, String> {
    let home = &region.home;
    let Some(files) = &region.tls else {
        return Endpoint::from_shared(format!("http://{home}")).map_err(|e| e.to_string());
    };
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let mut tls = match &files.ca_file {
        Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&files.cert_file, &files.key_file) {
        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    let host = home
        .rsplit_once(':')
        .map_or(home.as_str(), |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Endpoint::from_shared(format!("https://{home}"))
        .and_then(|endpoint| endpoint.tls_config(tls.domain_name(host)))
        .map_err(|e| e.to_string())
}

/// A stream to the home, or `None` when it cannot be opened within `patience`.
async fn connect(region: &RegionConfig, patience: Duration) -> Option<Link> {
    let open = async {
        let endpoint = endpoint(region)
            .map_err(|why| log::debug!("region: no link to the home: {why}"))
            .ok()?;
        let channel = endpoint.connect().await.ok()?;
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (reports, outbound) = mpsc::channel(1);
        let outbound = futures_util::stream::unfold(outbound, |mut rx| async move {
            rx.recv().await.map(|next| (next, rx))
        });
        let answers = client
            .stream_rate_limit_quotas(outbound)
            .await
            .ok()?
            .into_inner();
        Some(Link { reports, answers })
    };
    tokio::time::timeout(patience.max(Duration::from_secs(1)), open)
        .await
        .ok()
        .flatten()
}

/// The region's metrics by limit: the shares held now, and the last interval's demand over
/// what the floors and shares of those keys refill in it.
#[expect(
    clippy::cast_precision_loss,
    reason = "sizes and request counts far below 2^52"
)]
fn publish(
    state: &AppState,
    held: &HashMap<(String, String), Held>,
    wanted: &[Wanted],
    every: Duration,
) {
    let metrics = &state.metrics.region;
    let policy = state.limiter.policy();
    for limit in &policy.limits {
        let tollgate_core::kinds::Meter::Global(global) = limit.meter else {
            continue;
        };
        let (mut rate, mut size) = (0.0, 0u64);
        for ((name, _), share) in held {
            if *name == limit.name {
                rate += share.rate;
                size = size.saturating_add(share.size);
            }
        }
        metrics
            .share_rate
            .with_label_values(&[limit.name.as_str()])
            .set(rate);
        metrics
            .share_burst
            .with_label_values(&[limit.name.as_str()])
            .set(size as f64);
        let floor_rate = limit.rate * f64::from(global.floor_ppm) / 1_000_000.0;
        let (mut requests, mut refill) = (0u64, 0.0);
        for want in wanted.iter().filter(|w| w.limit == limit.name) {
            requests = requests.saturating_add(want.requests);
            let share = held
                .get(&(want.limit.clone(), want.key.clone()))
                .map_or(0.0, |h| h.rate);
            refill += (floor_rate + share) * every.as_secs_f64();
        }
        let utilisation = if refill > 0.0 {
            requests as f64 / refill
        } else {
            0.0
        };
        metrics
            .utilisation
            .with_label_values(&[limit.name.as_str()])
            .set(utilisation);
    }
}
