//! Envoy's quota service: `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`, the
//! bidirectional `StreamRateLimitQuotas` that Envoy's `rate_limit_quota` filter opens (one
//! per server and domain, shared by its workers). Each message of usage reports is answered
//! with one assignment per bucket: a share of the limit its `[[rlqs.buckets]]` rule maps it
//! to (`report`), rendered as Envoy's bucket action (`action`).
//!
//! Envoy 1.40's reports are read leniently: `time_elapsed` is whole seconds and 0 on a
//! bucket's first report, so demand is measured on the store's clock instead.

mod action;
mod report;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use actix_web::web;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::Stream;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

pub use report::MAX_BUCKETS_PER_MESSAGE;

use crate::state::AppState;
use tollgate_core::limiter::rlqs::TrackedBytes;

/// The service's name, as gRPC health reports it.
pub const SERVICE_NAME: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// Answers a stream may have queued for Envoy before its reports wait.
const QUEUED_ANSWERS: usize = 4;
/// The most quota streams one connection may hold open: Envoy opens one per (server, domain),
/// and each stream tracks up to `report::MAX_TRACKED_BYTES`.
pub const MAX_STREAMS_PER_CONNECTION: usize = 8;

/// The service, for [`tonic::transport::Server::add_service`] (see [`RlqsService::server`]).
#[derive(Clone)]
pub struct RlqsService {
    state: web::Data<AppState>,
    /// This instance's streams are told apart from every other replica's by it.
    instance: u64,
    streams: Arc<AtomicU64>,
    /// What every stream of the instance tracks, together.
    tracked: Arc<TrackedBytes>,
    /// Open streams per connection (by the peer's address).
    per_connection: Arc<Mutex<HashMap<SocketAddr, usize>>>,
    /// True once a shutdown began: streams end after the close notice, so each Envoy opens
    /// its stream again on another replica while its assignments still hold.
    stopping: watch::Receiver<bool>,
}

impl RlqsService {
    pub fn new(state: web::Data<AppState>, stopping: watch::Receiver<bool>) -> RlqsService {
        RlqsService {
            state,
            instance: random_id(),
            streams: Arc::default(),
            tracked: Arc::default(),
            per_connection: Arc::default(),
            stopping,
        }
    }

    pub fn server(self) -> RateLimitQuotaServiceServer<RlqsService> {
        RateLimitQuotaServiceServer::new(self)
    }
}

/// A random instance id (a hash of the time with a random seed if the OS has no randomness).
fn random_id() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::getrandom(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(std::time::SystemTime::now())
}

type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let place = match request.remote_addr() {
            Some(peer) => Some(Place::take(&self.per_connection, peer).ok_or_else(|| {
                Status::resource_exhausted(format!(
                    "at most {MAX_STREAMS_PER_CONNECTION} quota streams per connection"
                ))
            })?),
            None => None,
        };
        let mut inbound = request.into_inner();
        let (answers, queued) = mpsc::channel(QUEUED_ANSWERS);
        let number = self.streams.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:016x}.{number:x}", self.instance);
        log::debug!("rlqs: stream {id} opened");
        let mut stream =
            report::Stream::new(self.state.clone(), id.clone(), Arc::clone(&self.tracked));
        let mut stopping = self.stopping.clone();
        let notice = self.state.timings.close_notice;
        let leave = async move {
            let _ = stopping.wait_for(|stop| *stop).await;
            tokio::time::sleep(notice).await;
        };
        // Messages are answered in order, one at a time: a share is decided before the next
        // report of the same bucket is read.
        tokio::spawn(async move {
            let _place = place;
            tokio::pin!(leave);
            loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    () = answers.closed() => break,
                    () = &mut leave => break,
                };
                let reports = match message {
                    Ok(Some(reports)) => reports,
                    Ok(None) => {
                        log::debug!("rlqs: stream {id} ended by Envoy");
                        break;
                    }
                    Err(status) => {
                        log::debug!("rlqs: stream {id} ended: {status}");
                        break;
                    }
                };
                if let Err(status) = stream.admit(&reports) {
                    log::debug!("rlqs: stream {id} refused: {status}");
                    let _ = answers.send(Err(status)).await;
                    break;
                }
                let answer = stream.answer(reports).await;
                if !answer.bucket_action.is_empty() && answers.send(Ok(answer)).await.is_err() {
                    break;
                }
            }
        });
        let out = futures_util::stream::unfold(queued, |mut queued| async move {
            queued.recv().await.map(|next| (next, queued))
        });
        Ok(Response::new(Box::pin(out)))
    }
}

/// One stream's place among its connection's, given back when the stream ends.
struct Place {
    counts: Arc<Mutex<HashMap<SocketAddr, usize>>>,
    peer: SocketAddr,
}

impl Place {
    /// A place for a new stream of `peer`'s connection, if it has fewer than the most.
    fn take(counts: &Arc<Mutex<HashMap<SocketAddr, usize>>>, peer: SocketAddr) -> Option<Place> {
        let mut open = counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(peer).or_default();
        if *count >= MAX_STREAMS_PER_CONNECTION {
            return None;
        }
        *count += 1;
        Some(Place {
            counts: Arc::clone(counts),
            peer,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}
