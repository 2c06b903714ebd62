//! A rule's `metadata`, kept by the policy as the JSON object it was configured as, merged
//! into the protobuf `Struct` of an answer's `dynamic_metadata`.
//!
//! Converted per answer rather than once per policy: the merge copies each field it takes
//! into the answer either way, and converting a JSON value allocates what cloning the same
//! protobuf value does (a string per string, a list per array, a map per object).

use envoy_types::pb::google::protobuf::value::Kind as ValueKind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

/// A rule's `metadata`, as configured.
type Metadata = serde_json::Map<String, serde_json::Value>;

/// Adds `from`'s fields to `into`: a key already there keeps its value, two objects merge.
pub fn merge(into: &mut Struct, from: &Metadata) {
    for (key, value) in from {
        match (into.fields.get_mut(key), value) {
            (
                Some(Value {
                    kind: Some(ValueKind::StructValue(mine)),
                }),
                serde_json::Value::Object(theirs),
            ) => merge(mine, theirs),
            (Some(_), _) => {}
            (None, _) => {
                into.fields.insert(key.clone(), value_of(value));
            }
        }
    }
}

/// A JSON object as a protobuf `Struct`.
fn struct_of(map: &Metadata) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(key, value)| (key.clone(), value_of(value)))
            .collect(),
    }
}

/// A JSON value as a protobuf `Value` (numbers as doubles, as protobuf holds them).
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
