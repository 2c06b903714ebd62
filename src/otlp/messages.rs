//! The OTLP trace messages tollgate sends (`opentelemetry.proto.collector.trace.v1` and the
//! parts of `trace.v1`, `resource.v1` and `common.v1` it fills), as protobuf. Written out
//! here, with their field numbers, rather than generated: a handful of messages, and neither
//! a build script nor a second protobuf toolchain for them.

use tollgate_core::observe::trace::{AttributeValue, FinishedSpan};

/// `ExportTraceServiceRequest`: the body of every export, HTTP or gRPC.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `ExportTraceServiceResponse`: what the collector answers (a partial success names the
/// spans it rejected).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportTracePartialSuccess>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTracePartialSuccess {
    #[prost(int64, tag = "1")]
    pub rejected_spans: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

/// The process that made the spans (`service.name`, ...).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub trace_state: String,
    /// Empty for a root span.
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub name: String,
    /// `SpanKind`: 2 is SERVER.
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    /// W3C trace flags (bit 0: sampled) and bits 8-9: whether the parent is remote.
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

/// `SpanKind.SPAN_KIND_SERVER`.
pub const SPAN_KIND_SERVER: i32 = 2;
/// `Status.StatusCode.STATUS_CODE_ERROR`.
pub const STATUS_CODE_ERROR: i32 = 2;
/// Span flags: sampled, and the parent's remoteness known and remote
/// (`SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`).
pub const FLAGS_SAMPLED: u32 = 0x1;
pub const FLAGS_REMOTE_PARENT: u32 = 0x300;
/// Span flags: sampled, the remoteness known, and no remote parent.
pub const FLAGS_LOCAL_ROOT: u32 = 0x100;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(int32, tag = "3")]
    pub code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3, 5")]
    pub value: Option<Value>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(string, tag = "1")]
    String(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
    #[prost(message, tag = "5")]
    Array(ArrayValue),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<AnyValue>,
}

impl KeyValue {
    pub fn new(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: Some(AnyValue { value: Some(value) }),
        }
    }
}

impl From<AttributeValue> for Value {
    fn from(value: AttributeValue) -> Value {
        match value {
            AttributeValue::Str(text) => Value::String(text),
            AttributeValue::Bool(flag) => Value::Bool(flag),
            AttributeValue::Int(number) => Value::Int(number),
            AttributeValue::Strs(texts) => Value::Array(ArrayValue {
                values: texts
                    .into_iter()
                    .map(|text| AnyValue {
                        value: Some(Value::String(text)),
                    })
                    .collect(),
            }),
        }
    }
}

impl From<FinishedSpan> for Span {
    /// A sampled server span; its parent, when it has one, is the caller's (remote).
    fn from(span: FinishedSpan) -> Span {
        let flags = FLAGS_SAMPLED
            | if span.parent.is_some() {
                FLAGS_REMOTE_PARENT
            } else {
                FLAGS_LOCAL_ROOT
            };
        Span {
            trace_id: span.trace_id.to_vec(),
            span_id: span.span_id.to_vec(),
            trace_state: span.trace_state,
            parent_span_id: span.parent.map_or_else(Vec::new, |id| id.to_vec()),
            name: span.kind.name().to_string(),
            kind: SPAN_KIND_SERVER,
            start_time_unix_nano: span.start_unix_nano,
            end_time_unix_nano: span.end_unix_nano,
            attributes: span
                .attributes
                .into_iter()
                .map(|(key, value)| KeyValue::new(key, value.into()))
                .collect(),
            status: span.error.map(|message| Status {
                message,
                code: STATUS_CODE_ERROR,
            }),
            flags,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::observe::trace::Kind;

    fn finished(parent: Option<[u8; 8]>) -> FinishedSpan {
        FinishedSpan {
            trace_id: [7; 16],
            span_id: [3; 8],
            parent,
            trace_state: "rojo=1".into(),
            kind: Kind::Grpc,
            start_unix_nano: 10,
            end_unix_nano: 25,
            attributes: vec![
                ("tollgate.decision", AttributeValue::Str("denied".into())),
                ("tollgate.on_error", AttributeValue::Bool(false)),
                ("rpc.grpc.status_code", AttributeValue::Int(0)),
                (
                    "tollgate.limits",
                    AttributeValue::Strs(vec!["per-ip".into(), "per-key".into()]),
                ),
            ],
            error: Some("over the limit".into()),
        }
    }

    fn string(text: &str) -> AnyValue {
        AnyValue {
            value: Some(Value::String(text.into())),
        }
    }

    #[test]
    fn a_callers_child_is_a_server_span_under_a_remote_parent() {
        let span = Span::from(finished(Some([9; 8])));
        assert_eq!(
            span,
            Span {
                trace_id: vec![7; 16],
                span_id: vec![3; 8],
                trace_state: "rojo=1".into(),
                parent_span_id: vec![9; 8],
                name: "ShouldRateLimit".into(),
                kind: SPAN_KIND_SERVER,
                start_time_unix_nano: 10,
                end_time_unix_nano: 25,
                attributes: vec![
                    KeyValue::new("tollgate.decision", Value::String("denied".into())),
                    KeyValue::new("tollgate.on_error", Value::Bool(false)),
                    KeyValue::new("rpc.grpc.status_code", Value::Int(0)),
                    KeyValue::new(
                        "tollgate.limits",
                        Value::Array(ArrayValue {
                            values: vec![string("per-ip"), string("per-key")],
                        }),
                    ),
                ],
                status: Some(Status {
                    message: "over the limit".into(),
                    code: STATUS_CODE_ERROR,
                }),
                flags: FLAGS_SAMPLED | FLAGS_REMOTE_PARENT,
            }
        );
    }

    #[test]
    fn a_root_has_no_parent_id_and_says_its_parent_is_not_remote() {
        let span = Span::from(FinishedSpan {
            error: None,
            ..finished(None)
        });
        assert!(span.parent_span_id.is_empty());
        assert_eq!(span.flags, FLAGS_SAMPLED | FLAGS_LOCAL_ROOT);
        assert_eq!(span.status, None);
    }
}
