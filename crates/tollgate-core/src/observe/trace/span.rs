//! Spans as the handlers use them: [`Tracer::start`] opens one (or none, when not sampled),
//! the handler sets the decision's attributes, [`Tracer::finish`] hands it to the exporter's
//! queue as a [`FinishedSpan`]. A full queue drops the span and counts it: a decision never
//! waits on tracing.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus::IntCounter;
use tokio::sync::mpsc;

use super::{new_span_id, new_trace_id, Incoming, Sampler, SpanId, TraceId};

/// What the handlers hold: the sampler and the exporter's queue. Cheap to clone.
#[derive(Clone)]
pub struct Tracer {
    sampler: Sampler,
    queue: mpsc::Sender<FinishedSpan>,
    /// Spans dropped because the queue was full (the collector slow or away).
    dropped: IntCounter,
}

/// The protocol a span answered on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Envoy's `ShouldRateLimit`.
    Grpc,
    /// `/check` (ext_authz, `auth_request`, ForwardAuth).
    Check,
    /// `POST /report`.
    Report,
}

impl Kind {
    /// The span's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Grpc => "ShouldRateLimit",
            Kind::Check => "check",
            Kind::Report => "report",
        }
    }
}

/// A recorded span, open.
pub struct Span {
    trace_id: TraceId,
    span_id: SpanId,
    parent: Option<SpanId>,
    trace_state: String,
    kind: Kind,
    start_unix_nano: u64,
    started: Instant,
    attributes: Vec<(&'static str, AttributeValue)>,
    error: Option<String>,
}

/// A span, closed: what the exporter's queue carries, in plain values. The exporter spells it
/// in its protocol's messages, in its own task, off the request path.
///
/// Every span is sampled (an unsampled one is never opened) and answers a request (a
/// server's span); its parent, if any, is the caller's, so always remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedSpan {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The caller's span; `None` for a new root.
    pub parent: Option<SpanId>,
    /// W3C `tracestate`, passed on as the caller sent it (empty without one).
    pub trace_state: String,
    /// The protocol it answered on, which names it.
    pub kind: Kind,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// In the order they were set.
    pub attributes: Vec<(&'static str, AttributeValue)>,
    /// Why it failed (the request was refused, or the store did not answer), if it did.
    pub error: Option<String>,
}

/// An attribute's value: the types OpenTelemetry's attributes take that a decision uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeValue {
    Str(String),
    Bool(bool),
    Int(i64),
    Strs(Vec<String>),
}

impl Tracer {
    /// A tracer sampling new traces at `rate` into `queue`.
    pub fn new(rate: f64, queue: mpsc::Sender<FinishedSpan>, dropped: IntCounter) -> Tracer {
        Tracer {
            sampler: Sampler::new(rate),
            queue,
            dropped,
        }
    }

    /// Opens the span of one request: a child of `caller`'s span, or a new root. `None` when
    /// it is not sampled, so nothing is recorded.
    pub fn start(&self, kind: Kind, caller: &Incoming<'_>) -> Option<Span> {
        let trace_id = caller
            .parent
            .map_or_else(new_trace_id, |parent| parent.trace_id);
        if !self.sampler.sampled(&trace_id, caller.sampled) {
            return None;
        }
        let start_unix_nano = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            });
        Some(Span {
            trace_id,
            span_id: new_span_id(),
            parent: caller.parent.map(|parent| parent.span_id),
            trace_state: caller
                .parent
                .map_or_else(String::new, |parent| parent.trace_state.to_string()),
            kind,
            start_unix_nano,
            started: Instant::now(),
            attributes: Vec::with_capacity(6),
            error: None,
        })
    }

    /// Closes `span` and queues it for export; dropped (and counted) if the queue is full.
    pub fn finish(&self, span: Span) {
        if self.queue.try_send(span.close()).is_err() {
            self.dropped.inc();
        }
    }
}

impl Span {
    pub fn set_str(&mut self, key: &'static str, value: impl Into<String>) {
        self.attributes
            .push((key, AttributeValue::Str(value.into())));
    }

    pub fn set_bool(&mut self, key: &'static str, value: bool) {
        self.attributes.push((key, AttributeValue::Bool(value)));
    }

    pub fn set_int(&mut self, key: &'static str, value: i64) {
        self.attributes.push((key, AttributeValue::Int(value)));
    }

    pub fn set_strs<'a>(&mut self, key: &'static str, values: impl IntoIterator<Item = &'a str>) {
        let values = values.into_iter().map(str::to_string).collect();
        self.attributes.push((key, AttributeValue::Strs(values)));
    }

    /// Marks the span failed (the request was refused, or the store did not answer).
    pub fn fail(&mut self, message: impl Into<String>) {
        self.error = Some(message.into());
    }

    /// The trace this span belongs to.
    pub fn trace_id(&self) -> &TraceId {
        &self.trace_id
    }

    fn close(self) -> FinishedSpan {
        let elapsed = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        FinishedSpan {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            trace_state: self.trace_state,
            kind: self.kind,
            start_unix_nano: self.start_unix_nano,
            end_unix_nano: self.start_unix_nano.saturating_add(elapsed),
            attributes: self.attributes,
            error: self.error,
        }
    }
}

/// What a decision came to, as a span shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ruling {
    Allowed,
    Denied,
    /// An `[[exempt]]` rule admitted the request before any limit was looked at.
    Exempt,
}

impl Ruling {
    pub fn from_allowed(allowed: bool) -> Ruling {
        if allowed {
            Ruling::Allowed
        } else {
            Ruling::Denied
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Ruling::Allowed => "allowed",
            Ruling::Denied => "denied",
            Ruling::Exempt => "exempt",
        }
    }
}

/// A decision's attributes, whatever protocol asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes<'p> {
    pub ruling: Ruling,
    /// The limits applied (their names), in the policy's order.
    pub limits: Vec<&'p str>,
    /// The limit that denied (the one the answer describes), if one did.
    pub denied_by: Option<&'p str>,
    /// The store failed and `on_error` answered (`allow` and `local` admit: fail-open).
    pub on_error: bool,
}

/// The attribute names, in one place (docs/REFERENCE.md lists them).
pub mod attribute {
    /// `allowed`, `denied` or `exempt`.
    pub const DECISION: &str = "tollgate.decision";
    /// The names of the limits applied (an array).
    pub const LIMITS: &str = "tollgate.limits";
    /// The limit that denied.
    pub const DENIED_BY: &str = "tollgate.denied_by";
    /// Whether the store failed and `on_error` answered.
    pub const ON_ERROR: &str = "tollgate.on_error";
    /// `ShouldRateLimit`'s domain.
    pub const DOMAIN: &str = "tollgate.domain";
    /// The HTTP status answered (`/check`, `/report`).
    pub const STATUS: &str = "http.response.status_code";
    /// The gRPC status answered (`ShouldRateLimit`): 0 unless the request was refused.
    pub const GRPC_STATUS: &str = "rpc.grpc.status_code";
}
use attribute::{DECISION, DENIED_BY, LIMITS, ON_ERROR};

impl Attributes<'_> {
    /// Sets the decision's attributes on `span`.
    pub fn record(&self, span: &mut Span) {
        span.set_str(DECISION, self.ruling.as_str());
        if !self.limits.is_empty() {
            span.set_strs(LIMITS, self.limits.iter().copied());
        }
        if let Some(limit) = self.denied_by {
            span.set_str(DENIED_BY, limit);
        }
        span.set_bool(ON_ERROR, self.on_error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::trace::RemoteSpan;

    fn tracer(rate: f64) -> (Tracer, mpsc::Receiver<FinishedSpan>, IntCounter) {
        let (queue, spans) = mpsc::channel(1);
        let dropped = IntCounter::new("dropped", "test").expect("a counter");
        (Tracer::new(rate, queue, dropped.clone()), spans, dropped)
    }

    fn value<'s>(span: &'s FinishedSpan, key: &str) -> Option<&'s AttributeValue> {
        span.attributes
            .iter()
            .find(|(name, _)| *name == key)
            .map(|(_, value)| value)
    }

    #[test]
    fn a_finished_span_is_the_callers_child_with_the_decisions_attributes() {
        let (tracer, mut spans, _) = tracer(0.0);
        let caller = Incoming {
            parent: Some(RemoteSpan {
                trace_id: [7; 16],
                span_id: [9; 8],
                trace_state: "rojo=1",
            }),
            sampled: Some(true),
        };
        let mut span = tracer
            .start(Kind::Grpc, &caller)
            .expect("the caller sampled it");
        span.set_str(attribute::DOMAIN, "edge");
        Attributes {
            ruling: Ruling::Denied,
            limits: vec!["per-ip", "per-key"],
            denied_by: Some("per-key"),
            on_error: false,
        }
        .record(&mut span);
        tracer.finish(span);
        let sent = spans.try_recv().expect("queued");
        assert_eq!(sent.trace_id, [7; 16]);
        assert_eq!(sent.parent, Some([9; 8]));
        assert_ne!(sent.span_id, [9; 8]);
        assert_eq!(sent.trace_state, "rojo=1");
        assert_eq!(sent.kind.name(), "ShouldRateLimit");
        assert!(sent.end_unix_nano >= sent.start_unix_nano);
        assert_eq!(sent.error, None);
        let text = |text: &str| AttributeValue::Str(text.into());
        assert_eq!(value(&sent, DECISION), Some(&text("denied")));
        assert_eq!(value(&sent, DENIED_BY), Some(&text("per-key")));
        assert_eq!(value(&sent, ON_ERROR), Some(&AttributeValue::Bool(false)));
        assert_eq!(value(&sent, attribute::DOMAIN), Some(&text("edge")));
        assert_eq!(
            value(&sent, LIMITS),
            Some(&AttributeValue::Strs(vec![
                "per-ip".into(),
                "per-key".into()
            ]))
        );
    }

    #[test]
    fn an_unsampled_caller_gets_no_span_and_a_full_queue_drops_and_counts() {
        let (tracer, _spans, dropped) = tracer(1.0);
        let not_sampled = Incoming {
            parent: None,
            sampled: Some(false),
        };
        assert!(tracer.start(Kind::Check, &not_sampled).is_none());
        let root = Incoming::default();
        let first = tracer
            .start(Kind::Check, &root)
            .expect("rate 1 samples all");
        let second = tracer
            .start(Kind::Report, &root)
            .expect("rate 1 samples all");
        assert_ne!(first.trace_id(), second.trace_id());
        tracer.finish(first);
        tracer.finish(second);
        assert_eq!(dropped.get(), 1, "the queue holds one span");
    }
}
