//! Tool-call arguments as `tools/call` takes them, from what each door receives (a JSON value
//! from `/mcp` and chat, JSON text from gRPC and model output). Pure; one parser for every door.

use serde_json::{Map, Value};

/// Tool arguments as `tools/call` takes them: `null` means none, an object is used as is, anything
/// else is an error with the reason (the core turns it into `mcp_invalid_arguments`).
pub(crate) fn arguments_from_value(value: Value) -> Result<Option<Map<String, Value>>, String> {
    match value {
        Value::Object(map) => Ok(Some(map)),
        Value::Null => Ok(None),
        other => Err(format!("expected a JSON object, got {}", json_kind(&other))),
    }
}

/// [`arguments_from_value`] over JSON text; empty text means none (models send `""` for
/// argument-less tools).
pub(crate) fn arguments_from_json(text: &str) -> Result<Option<Map<String, Value>>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str::<Value>(text).map_err(|e| e.to_string()).and_then(arguments_from_value)
}

/// The JSON type of `value`, for error messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_must_be_a_json_object_or_nothing() {
        assert_eq!(arguments_from_json(""), Ok(None));
        assert_eq!(arguments_from_json("null"), Ok(None));
        assert!(arguments_from_json(r#"{"text": "hi"}"#).is_ok_and(|m| m.is_some_and(|m| m.contains_key("text"))));
        assert_eq!(arguments_from_json("[1]"), Err("expected a JSON object, got an array".into()));
        assert!(arguments_from_json("{not json").is_err());
    }
}
