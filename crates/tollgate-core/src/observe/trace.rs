//! Tracing: a decision's span, a child of the caller's trace.
//!
//! This file reads the caller's trace context from its headers (a pure function: headers in,
//! context out, never a panic), decides whether a span is sampled, and draws ids. `span`
//! holds the [`Tracer`] the handlers open spans with, the attributes of a decision, and the
//! [`FinishedSpan`] a closed span is, in plain values, on the exporter's queue. The exporter
//! that sends them to a collector over OTLP is the server's (`tollgate::otlp`): this layer knows
//! no protocol of the collector's.
//!
//! Headers read, first found wins: W3C `traceparent` (with `tracestate`); B3's single `b3`;
//! B3's `x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled` (and `x-b3-flags: 1`, debug, which
//! means sampled). A header that is malformed is ignored as if absent, and the next is tried.

mod span;

use std::cell::Cell;

pub use span::{attribute, AttributeValue, Attributes, FinishedSpan, Kind, Ruling, Span, Tracer};

/// A trace id: 16 bytes, never all zero.
pub type TraceId = [u8; 16];
/// A span id: 8 bytes, never all zero.
pub type SpanId = [u8; 8];

/// The span that called us, as its headers named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSpan<'a> {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// W3C `tracestate`, passed on as it came (empty without one).
    pub trace_state: &'a str,
}

/// What the caller's headers say about the trace: the parent span if any, and the caller's
/// sampling decision if it made one (B3 may send one without ids, or ids without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Incoming<'a> {
    pub parent: Option<RemoteSpan<'a>>,
    pub sampled: Option<bool>,
}

/// The longest `tracestate` passed on: the W3C limit is 32 members; 512 characters is what
/// the specification asks every vendor to accept.
const MAX_TRACE_STATE: usize = 512;

/// Reads the trace context from the headers `header` finds (by lowercase name).
pub fn incoming<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Incoming<'a> {
    if let Some(context) = header("traceparent").and_then(traceparent) {
        let trace_state = header("tracestate")
            .filter(|state| state.len() <= MAX_TRACE_STATE && is_printable(state))
            .unwrap_or("");
        return Incoming {
            parent: Some(RemoteSpan {
                trace_state,
                ..context.0
            }),
            sampled: Some(context.1),
        };
    }
    if let Some(single) = header("b3").and_then(b3_single) {
        return single;
    }
    b3_multi(&header).unwrap_or_default()
}

/// W3C `traceparent`: `version-traceid-parentid-flags`, lowercase hex. Version `ff` is
/// invalid; a later version than `00` may append fields after a `-`, which are ignored.
fn traceparent(value: &str) -> Option<(RemoteSpan<'static>, bool)> {
    let value = value.trim();
    let bytes = value.as_bytes();
    if bytes.len() < 55 || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    let version = value.get(..2).and_then(hex_lower::<1>)?;
    match version[0] {
        0xff => return None,
        0x00 if bytes.len() != 55 => return None,
        _ if bytes.len() > 55 && bytes[55] != b'-' => return None,
        _ => {}
    }
    let trace_id = value.get(3..35).and_then(hex_lower::<16>)?;
    let span_id = value.get(36..52).and_then(hex_lower::<8>)?;
    let flags = value.get(53..55).and_then(hex_lower::<1>)?;
    let span = remote(trace_id, span_id)?;
    Some((span, flags[0] & 1 == 1))
}

/// B3's single header: `{traceid}-{spanid}[-{sampling}[-{parentspanid}]]`, or the sampling
/// alone (`0`, `1`, `d`).
fn b3_single(value: &str) -> Option<Incoming<'static>> {
    let mut fields = value.trim().split('-');
    let first = fields.next()?;
    let Some(span_field) = fields.next() else {
        return Some(Incoming {
            parent: None,
            sampled: Some(b3_sampling(first)?),
        });
    };
    let sampled = match fields.next() {
        None => None,
        Some(sampling) => Some(b3_sampling(sampling)?),
    };
    if let Some(parent) = fields.next() {
        hex_lower::<8>(parent)?;
    }
    if fields.next().is_some() {
        return None;
    }
    let span = remote(b3_trace_id(first)?, hex_lower::<8>(span_field)?)?;
    Some(Incoming {
        parent: Some(span),
        sampled,
    })
}

/// B3's several headers. Ids without a sampling decision leave it to this side.
fn b3_multi<'a>(header: &impl Fn(&str) -> Option<&'a str>) -> Option<Incoming<'static>> {
    let debug = header("x-b3-flags").is_some_and(|flags| flags.trim() == "1");
    let sampled = match header("x-b3-sampled").map(str::trim) {
        _ if debug => Some(true),
        None => None,
        Some("1" | "true") => Some(true),
        Some("0" | "false") => Some(false),
        Some(_) => return None,
    };
    let parent = match (header("x-b3-traceid"), header("x-b3-spanid")) {
        (Some(trace), Some(span)) => Some(remote(
            b3_trace_id(trace.trim())?,
            hex_lower::<8>(span.trim())?,
        )?),
        (None, None) => None,
        _ => return None,
    };
    if parent.is_none() && sampled.is_none() {
        return None;
    }
    Some(Incoming { parent, sampled })
}

fn b3_sampling(field: &str) -> Option<bool> {
    match field {
        "1" | "d" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// B3's trace id: 32 hex digits, or 16 (the high half zero).
fn b3_trace_id(text: &str) -> Option<TraceId> {
    if text.len() == 16 {
        let low = hex_lower::<8>(text)?;
        let mut id = [0; 16];
        id[8..].copy_from_slice(&low);
        Some(id)
    } else {
        hex_lower::<16>(text)
    }
}

/// A remote span, unless either id is all zero (invalid in both formats).
fn remote(trace_id: TraceId, span_id: SpanId) -> Option<RemoteSpan<'static>> {
    (trace_id != [0; 16] && span_id != [0; 8]).then_some(RemoteSpan {
        trace_id,
        span_id,
        trace_state: "",
    })
}

/// Exactly `2 * N` lowercase hex digits as `N` bytes.
fn hex_lower<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |digit: u8| match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// Visible ASCII and spaces only: what `tracestate` may hold, and nothing that would corrupt
/// the exported message's string.
fn is_printable(text: &str) -> bool {
    text.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// Which new traces are sampled: a fraction of trace ids, decided from the id alone (so every
/// instance, and envoyproxy/ratelimit's OpenTelemetry SDK, decides the same for one trace).
/// A caller's own decision is always followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    /// Sampled when the trace id's low 63 bits (its last 8 bytes, shifted right once) are
    /// below this.
    threshold: u64,
}

impl Sampler {
    /// `rate` of the new traces, from 0 (none) to 1 (all); outside that range, the nearest.
    pub fn new(rate: f64) -> Sampler {
        let rate = if rate.is_nan() { 0.0 } else { rate };
        let threshold = if rate >= 1.0 {
            u64::MAX
        } else if rate <= 0.0 {
            0
        } else {
            // 2^63 * rate < 2^63: exact enough, and never past u64.
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "0 < rate < 1, so the product lies in 0..2^63"
            )]
            let threshold = (rate * 9_223_372_036_854_775_808.0) as u64;
            threshold
        };
        Sampler { threshold }
    }

    /// Whether the span of `trace_id` is recorded: the caller's decision when it made one.
    pub fn sampled(&self, trace_id: &TraceId, caller: Option<bool>) -> bool {
        if let Some(decided) = caller {
            return decided;
        }
        if self.threshold == u64::MAX {
            return true;
        }
        let mut low = [0; 8];
        low.copy_from_slice(&trace_id[8..]);
        (u64::from_be_bytes(low) >> 1) < self.threshold
    }
}

thread_local! {
    /// Each thread's id generator (SplitMix64), seeded from the OS once.
    static IDS: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut bytes = [0; 8];
    // Without OS randomness, the thread's address still tells threads apart.
    if getrandom::getrandom(&mut bytes).is_err() {
        return std::ptr::from_ref(&bytes) as usize as u64 ^ 0x9e37_79b9_7f4a_7c15;
    }
    u64::from_be_bytes(bytes)
}

/// The next 64 random bits of this thread (SplitMix64: uniform, cheap; ids need not be secret).
fn next_u64() -> u64 {
    IDS.with(|state| {
        let next = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// A new, non-zero span id.
pub fn new_span_id() -> SpanId {
    loop {
        let id = next_u64();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

/// A new, non-zero trace id.
pub fn new_trace_id() -> TraceId {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&next_u64().to_be_bytes());
    id[8..].copy_from_slice(&new_span_id());
    id
}

/// Lowercase hex of `bytes`, as the headers and the collector's JSON spell ids.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

#[cfg(test)]
mod tests;
