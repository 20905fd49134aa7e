//! The pin digest of a tool (`src/api/pinning.rs`, `src/policy/pin.rs`) on any JSON a server
//! could list as a tool.
//!
//! Properties, for any JSON object rmcp accepts as a `Tool`:
//! - stable under spelling: the same tool written pretty-printed, or with its integers written
//!   as floats (`1` as `1.0`), has the same digest;
//! - any change to a covered field (name, title, description, inputSchema, outputSchema,
//!   annotations) changes the digest;
//! - a change to a field the pin does not cover (`icons`, `_meta`) leaves it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Number, Value, json};
use spear::fuzzing::tool_digest;

/// `value` with every integer that a float holds exactly written as a float.
fn floats(value: &Value) -> Value {
    match value {
        Value::Number(n) if n.is_i64() || n.is_u64() => {
            let as_float = n.as_f64().filter(|f| f.abs() < 9_007_199_254_740_992.0);
            as_float.and_then(Number::from_f64).map_or_else(|| value.clone(), Value::Number)
        }
        Value::Array(items) => Value::Array(items.iter().map(floats).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), floats(v))).collect()),
        other => other.clone(),
    }
}

fn with(tool: &Map<String, Value>, key: &str, value: Value) -> Value {
    let mut changed = tool.clone();
    changed.insert(key.into(), value);
    Value::Object(changed)
}

/// An object field with one more property (or a fresh object when it is absent).
fn extended(field: Option<&Value>) -> Value {
    let mut object = field.and_then(Value::as_object).cloned().unwrap_or_default();
    let key = (0..).map(|i| format!("x-pin-{i}")).find(|k| !object.contains_key(k)).unwrap_or_default();
    object.insert(key, json!(true));
    Value::Object(object)
}

fuzz_target!(|data: &[u8]| {
    let Ok(Value::Object(tool)) = serde_json::from_slice::<Value>(data) else { return };
    let value = Value::Object(tool.clone());
    let Some(digest) = tool_digest(&value) else { return };

    let pretty = serde_json::to_string_pretty(&value).expect("serializes");
    let reparsed: Value = serde_json::from_str(&pretty).expect("parses");
    assert_eq!(tool_digest(&reparsed).as_ref(), Some(&digest), "pretty-printed");
    if let Some(respelled) = tool_digest(&floats(&value)) {
        assert_eq!(respelled, digest, "integers written as floats");
    }

    let text = |key: &str| tool.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let read_only = tool.get("annotations").and_then(|a| a.get("readOnlyHint")).and_then(Value::as_bool);
    let mut annotations = tool.get("annotations").and_then(Value::as_object).cloned().unwrap_or_default();
    annotations.insert("readOnlyHint".into(), json!(!read_only.unwrap_or(false)));
    let covered = [
        ("name", with(&tool, "name", json!(format!("{}x", text("name"))))),
        ("title", with(&tool, "title", json!(format!("{}x", text("title"))))),
        ("description", with(&tool, "description", json!(format!("{}x", text("description"))))),
        ("inputSchema", with(&tool, "inputSchema", extended(tool.get("inputSchema")))),
        ("outputSchema", with(&tool, "outputSchema", extended(tool.get("outputSchema")))),
        ("annotations", with(&tool, "annotations", Value::Object(annotations))),
    ];
    for (field, changed) in covered {
        if let Some(other) = tool_digest(&changed) {
            assert_ne!(other, digest, "a change to {field} kept the digest");
        }
    }

    let uncovered = [
        with(&tool, "icons", json!([{"src": format!("https://example.com/{}.png", text("name"))}])),
        with(&tool, "_meta", extended(tool.get("_meta"))),
    ];
    for changed in uncovered {
        if let Some(other) = tool_digest(&changed) {
            assert_eq!(other, digest, "a field the pin does not cover changed the digest");
        }
    }
});
