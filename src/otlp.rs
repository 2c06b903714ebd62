//! Spans out to an OpenTelemetry collector, over OTLP. The observe layer opens and closes a
//! decision's span and queues it as plain values
//! ([`FinishedSpan`](tollgate_core::observe::trace::FinishedSpan)); here the spans become OTLP's
//! protobuf messages and leave over HTTP or gRPC:
//! - `messages`: the OTLP trace messages, and a finished span spelled in them;
//! - `export`: the background task that batches finished spans, spells them as OTLP and sends
//!   them to the collector, off the request path.
//!
//! The server's, not the core's: it needs prost, hyper and tonic, which the core does without.

mod export;
mod messages;

pub use export::spawn_exporter;
