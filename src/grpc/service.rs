//! `ShouldRateLimit` as tonic serves it: a tower `Service` for the one method,
//! named as Envoy's `envoy.service.ratelimit.v3.RateLimitService`.
//!
//! Written here rather than taken from the generated server for its codec: tonic's default
//! allocates an 8 KiB buffer per call for the request and another for the answer, where
//! Envoy's messages take a few hundred bytes. Allocations that size skip glibc's per-thread
//! cache; they were a tenth of a call's CPU. The buffers here start at 1 KiB and grow as a
//! bigger message needs.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::future::BoxFuture;
use tonic::body::Body;
use tonic::codec::{BufferSettings, Codec};
use tonic::codegen::{http, Service, StdError};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::{ProstDecoder, ProstEncoder};

use super::ShouldRateLimit;
use tollgate_core::observe::trace::{self, Kind};

/// The method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// A message's buffer to start with (and to grow by): glibc serves up to 1,032 bytes from its
/// per-thread cache.
const BUFFER: usize = 1024;
/// tonic's own: how much an encoder writes before it lets other tasks run.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// The rate limit service, for [`tonic::transport::Server::add_service`].
#[derive(Clone)]
pub struct RateLimitService {
    handler: Arc<ShouldRateLimit>,
}

impl RateLimitService {
    pub fn new(handler: ShouldRateLimit) -> RateLimitService {
        RateLimitService {
            handler: Arc::new(handler),
        }
    }
}

impl NamedService for RateLimitService {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<B> Service<http::Request<B>> for RateLimitService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let unimplemented = Status::unimplemented("no such method").into_http();
            return Box::pin(std::future::ready(Ok(unimplemented)));
        }
        let method = Call(Arc::clone(&self.handler));
        Box::pin(async move { Ok(Grpc::new(SmallBuffers).unary(method, request).await) })
    }
}

/// One call of the method: the decision, counted.
struct Call(Arc<ShouldRateLimit>);

impl UnaryService<RateLimitRequest> for Call {
    type Response = RateLimitResponse;
    type Future = BoxFuture<'static, Result<Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let handler = Arc::clone(&self.0);
        // Boxed: a span is rare (sampled), and the future stays small without one.
        let span = handler.state.tracer.as_ref().and_then(|tracer| {
            let metadata = request.metadata();
            let caller = trace::incoming(|name| metadata.get(name).and_then(|v| v.to_str().ok()));
            tracer.start(Kind::Grpc, &caller).map(Box::new)
        });
        // Only the message is kept across the decision: the future, boxed, then fits a size
        // that glibc's per-thread cache serves.
        let request = request.into_inner();
        Box::pin(async move {
            let started = Instant::now();
            let mut span = span;
            let answer = handler.decide(&request, span.as_deref_mut()).await;
            if let (Some(tracer), Some(span)) = (&handler.state.tracer, span) {
                tracer.finish(*span);
            }
            let counters = &handler.state.metrics.grpc;
            match &answer {
                Ok(response) if response.overall_code == i32::from(Code::OverLimit) => {
                    counters.over_limit.inc();
                }
                Ok(_) => counters.ok.inc(),
                // Only a store failure under `on_error = "error"` answers UNKNOWN.
                Err(status) if status.code() == tonic::Code::Unknown => counters.error.inc(),
                Err(_) => counters.invalid.inc(),
            }
            let elapsed = started.elapsed();
            counters.duration.observe(elapsed.as_secs_f64());
            if let Some(stats) = &handler.state.erl_stats {
                stats.request_served(elapsed);
            }
            answer.map(Response::new)
        })
    }
}

/// Protobuf, with buffers sized for Envoy's messages.
#[derive(Default)]
struct SmallBuffers;

impl Codec for SmallBuffers {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ProstEncoder<RateLimitResponse>;
    type Decoder = ProstDecoder<RateLimitRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(BUFFER, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::new(BUFFER, YIELD_THRESHOLD))
    }
}
