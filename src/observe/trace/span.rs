//! Spans as the handlers use them: [`Tracer::start`] opens one (or none, when not sampled),
//! the handler sets the decision's attributes, [`Tracer::finish`] hands it to the exporter's
//! queue. A full queue drops the span and counts it: a decision never waits on tracing.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus::IntCounter;
use tokio::sync::mpsc;

use super::otlp::{self, KeyValue, Value};
use super::{new_span_id, new_trace_id, Incoming, Sampler, SpanId, TraceId};

/// What the handlers hold: the sampler and the exporter's queue. Cheap to clone.
#[derive(Clone)]
pub struct Tracer {
    sampler: Sampler,
    queue: mpsc::Sender<otlp::Span>,
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
    fn name(self) -> &'static str {
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
    attributes: Vec<KeyValue>,
    error: Option<String>,
}

impl Tracer {
    /// A tracer sampling new traces at `rate` into `queue`.
    pub fn new(rate: f64, queue: mpsc::Sender<otlp::Span>, dropped: IntCounter) -> Tracer {
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
        if self.queue.try_send(span.into_otlp()).is_err() {
            self.dropped.inc();
        }
    }
}

impl Span {
    pub fn set_str(&mut self, key: &str, value: impl Into<String>) {
        self.attributes
            .push(KeyValue::new(key, Value::String(value.into())));
    }

    pub fn set_bool(&mut self, key: &str, value: bool) {
        self.attributes.push(KeyValue::new(key, Value::Bool(value)));
    }

    pub fn set_int(&mut self, key: &str, value: i64) {
        self.attributes.push(KeyValue::new(key, Value::Int(value)));
    }

    pub fn set_strs<'a>(&mut self, key: &str, values: impl IntoIterator<Item = &'a str>) {
        let values = values
            .into_iter()
            .map(|value| otlp::AnyValue {
                value: Some(Value::String(value.to_string())),
            })
            .collect();
        self.attributes.push(KeyValue::new(
            key,
            Value::Array(otlp::ArrayValue { values }),
        ));
    }

    /// Marks the span failed (the request was refused, or the store did not answer).
    pub fn fail(&mut self, message: impl Into<String>) {
        self.error = Some(message.into());
    }

    /// The trace this span belongs to.
    pub fn trace_id(&self) -> &TraceId {
        &self.trace_id
    }

    fn into_otlp(self) -> otlp::Span {
        let elapsed = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let flags = otlp::FLAGS_SAMPLED
            | if self.parent.is_some() {
                otlp::FLAGS_REMOTE_PARENT
            } else {
                otlp::FLAGS_LOCAL_ROOT
            };
        otlp::Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id.to_vec(),
            trace_state: self.trace_state,
            parent_span_id: self.parent.map_or_else(Vec::new, |id| id.to_vec()),
            name: self.kind.name().to_string(),
            kind: otlp::SPAN_KIND_SERVER,
            start_time_unix_nano: self.start_unix_nano,
            end_time_unix_nano: self.start_unix_nano.saturating_add(elapsed),
            attributes: self.attributes,
            status: self.error.map(|message| otlp::Status {
                message,
                code: otlp::STATUS_CODE_ERROR,
            }),
            flags,
        }
    }
}

/// What a decision came to, as a span shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Allowed,
    Denied,
    /// An `[[exempt]]` rule admitted the request before any limit was looked at.
    Exempt,
}

impl Admission {
    pub fn from_allowed(allowed: bool) -> Admission {
        if allowed {
            Admission::Allowed
        } else {
            Admission::Denied
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Admission::Allowed => "allowed",
            Admission::Denied => "denied",
            Admission::Exempt => "exempt",
        }
    }
}

/// A decision's attributes, whatever protocol asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes<'p> {
    pub admission: Admission,
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
        span.set_str(DECISION, self.admission.as_str());
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

    fn tracer(rate: f64) -> (Tracer, mpsc::Receiver<otlp::Span>, IntCounter) {
        let (queue, spans) = mpsc::channel(1);
        let dropped = IntCounter::new("dropped", "test").expect("a counter");
        (Tracer::new(rate, queue, dropped.clone()), spans, dropped)
    }

    fn value(span: &otlp::Span, key: &str) -> Option<Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.clone())
            .and_then(|v| v.value)
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
            admission: Admission::Denied,
            limits: vec!["per-ip", "per-key"],
            denied_by: Some("per-key"),
            on_error: false,
        }
        .record(&mut span);
        tracer.finish(span);
        let sent = spans.try_recv().expect("queued");
        assert_eq!(sent.trace_id, vec![7; 16]);
        assert_eq!(sent.parent_span_id, vec![9; 8]);
        assert_eq!(sent.trace_state, "rojo=1");
        assert_eq!(sent.name, "ShouldRateLimit");
        assert_eq!(sent.flags, otlp::FLAGS_SAMPLED | otlp::FLAGS_REMOTE_PARENT);
        assert!(sent.end_time_unix_nano >= sent.start_time_unix_nano);
        assert_eq!(value(&sent, DECISION), Some(Value::String("denied".into())));
        assert_eq!(
            value(&sent, DENIED_BY),
            Some(Value::String("per-key".into()))
        );
        assert_eq!(value(&sent, ON_ERROR), Some(Value::Bool(false)));
        assert_eq!(
            value(&sent, attribute::DOMAIN),
            Some(Value::String("edge".into()))
        );
        let Some(Value::Array(limits)) = value(&sent, LIMITS) else {
            panic!("limits is an array: {sent:?}");
        };
        assert_eq!(limits.values.len(), 2);
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
