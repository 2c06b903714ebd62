//! A rule's `metadata`, as the protobuf `Struct` of an answer's `dynamic_metadata`.

use envoy_types::pb::google::protobuf::value::Kind as ValueKind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

/// A JSON object as a protobuf `Struct` (numbers as doubles, as protobuf holds them).
pub fn struct_of(map: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(key, value)| (key.clone(), value_of(value)))
            .collect(),
    }
}

fn value_of(value: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match value {
        J::Null => ValueKind::NullValue(0),
        J::Bool(b) => ValueKind::BoolValue(*b),
        J::Number(n) => ValueKind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => ValueKind::StringValue(s.clone()),
        J::Array(items) => ValueKind::ListValue(ListValue {
            values: items.iter().map(value_of).collect(),
        }),
        J::Object(map) => ValueKind::StructValue(struct_of(map)),
    };
    Value { kind: Some(kind) }
}
