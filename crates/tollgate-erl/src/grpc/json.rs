//! envoyproxy/ratelimit's `/json` forms: a `RateLimitRequest` read from protobuf's JSON form,
//! a `RateLimitResponse` written in it.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Map, Value};

/// A 64-bit integer as protobuf's JSON writes it: a number or a string of digits.
fn uint(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn unit_of(value: &Value) -> Option<i32> {
    match value {
        Value::Number(n) => n.as_i64().and_then(|n| i32::try_from(n).ok()),
        Value::String(s) => Unit::from_str_name(s).map(i32::from),
        _ => None,
    }
}

/// `{"domain": ..., "descriptors": [{"entries": [{"key", "value"}], "limit": {...},
/// "hitsAddend": n}], "hitsAddend": n}`, field names in lowerCamelCase or as in the proto.
pub fn request_of(value: &Value) -> Option<RateLimitRequest> {
    let object = value.as_object()?;
    let field = |o: &'_ Map<String, Value>, camel: &str, snake: &str| {
        o.get(camel).or_else(|| o.get(snake)).cloned()
    };
    let mut request = RateLimitRequest {
        domain: object.get("domain")?.as_str()?.to_string(),
        ..RateLimitRequest::default()
    };
    if let Some(hits) = field(object, "hitsAddend", "hits_addend") {
        request.hits_addend = u32::try_from(uint(&hits)?).ok()?;
    }
    for descriptor in object.get("descriptors")?.as_array()? {
        let descriptor = descriptor.as_object()?;
        let mut parsed = RateLimitDescriptor::default();
        for entry in descriptor.get("entries")?.as_array()? {
            parsed.entries.push(Entry {
                key: entry.get("key")?.as_str()?.to_string(),
                value: entry
                    .get("value")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            });
        }
        if let Some(limit) = descriptor.get("limit") {
            let limit = limit.as_object()?;
            parsed.limit = Some(RateLimitOverride {
                requests_per_unit: field(limit, "requestsPerUnit", "requests_per_unit")
                    .map_or(Some(0), |v| uint(&v).and_then(|n| u32::try_from(n).ok()))?,
                unit: field(limit, "unit", "unit").map_or(Some(0), |v| unit_of(&v))?,
            });
        }
        if let Some(hits) = field(descriptor, "hitsAddend", "hits_addend") {
            parsed.hits_addend = Some(UInt64Value {
                value: uint(&hits)?,
            });
        }
        request.descriptors.push(parsed);
    }
    Some(request)
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// The response in protobuf's JSON form: default values left out, as protojson does.
pub fn response_json(response: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|status| {
            let mut out = Map::new();
            out.insert("code".into(), json!(code_name(status.code)));
            if let Some(limit) = &status.current_limit {
                let mut current = Map::new();
                if !limit.name.is_empty() {
                    current.insert("name".into(), json!(limit.name));
                }
                if limit.requests_per_unit != 0 {
                    current.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                }
                let unit = Unit::try_from(limit.unit).map_or("UNKNOWN", |u| u.as_str_name());
                current.insert("unit".into(), json!(unit));
                out.insert("currentLimit".into(), Value::Object(current));
            }
            if status.limit_remaining != 0 {
                out.insert("limitRemaining".into(), json!(status.limit_remaining));
            }
            if let Some(reset) = &status.duration_until_reset {
                out.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", reset.seconds)),
                );
            }
            Value::Object(out)
        })
        .collect();
    let mut out = Map::new();
    out.insert(
        "overallCode".into(),
        json!(code_name(response.overall_code)),
    );
    out.insert("statuses".into(), Value::Array(statuses));
    if !response.response_headers_to_add.is_empty() {
        let headers: Vec<Value> = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out)
}
