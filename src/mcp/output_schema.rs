//! Checking a tool's `structuredContent` against the `outputSchema` its server listed (MCP
//! 2025-06-18 on: a server MUST answer conforming structured content, a client SHOULD validate).
//! The agent validates so that a server's broken or lying answer never reaches a caller (or a
//! model) as if it conformed: it becomes an error naming the first violation.
//!
//! Decisions:
//! - a result with `isError: true` is not checked (the schema describes successful output);
//! - no `structuredContent` from a tool that declares an `outputSchema` violates it;
//! - the schema is the server's, so untrusted: patterns use the `regex` crate (linear time, no
//!   backtracking) within a compiled-size limit, and nothing is fetched (no remote or file
//!   `$ref`). A schema that does not compile cannot be checked: the result passes unchecked and
//!   the reason is logged once per tool list (the call is not the caller's fault);
//! - validators are compiled once per listed schema and kept with it (`Pool`'s slot).

use jsonschema::{PatternOptions, Validator};
use rmcp::model::{CallToolResult, JsonObject};
use serde_json::Value;

/// Compiled size limit of one pattern of a server's schema (the `regex` crate's unit: bytes of
/// its program). 1 MiB admits any reasonable pattern and bounds what a hostile one costs.
const MAX_PATTERN_SIZE: usize = 1 << 20;
/// Longest violation quoted in an error (instance paths and messages quote the server's data).
const MAX_VIOLATION_BYTES: usize = 300;

/// Compiles a server's `outputSchema`; the error says why it cannot be used.
pub(crate) fn compile(schema: &JsonObject) -> Result<Validator, String> {
    let patterns = PatternOptions::regex().size_limit(MAX_PATTERN_SIZE).dfa_size_limit(MAX_PATTERN_SIZE);
    jsonschema::options()
        .with_pattern_options(patterns)
        .build(&Value::Object(schema.clone()))
        .map_err(|e| cut(&e.to_string()))
}

/// `Ok` when `result` conforms (or is a tool error, which is not checked); else the first
/// violation, as a sentence for an error message.
pub(crate) fn check(validator: &Validator, result: &CallToolResult) -> Result<(), String> {
    if result.is_error == Some(true) {
        return Ok(());
    }
    let Some(structured) = &result.structured_content else {
        return Err("it answered no structuredContent, which its outputSchema requires".to_string());
    };
    match validator.iter_errors(structured).next() {
        None => Ok(()),
        Some(error) => {
            let path = error.instance_path().to_string();
            let at = if path.is_empty() { "the root".to_string() } else { format!("'{path}'") };
            Err(cut(&format!("its structuredContent does not conform to its outputSchema at {at}: {error}")))
        }
    }
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_VIOLATION_BYTES {
        return text.to_string();
    }
    format!("{}…", &text[..text.floor_char_boundary(MAX_VIOLATION_BYTES)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(json: Value) -> JsonObject {
        json.as_object().cloned().expect("an object")
    }

    fn structured(json: Value) -> CallToolResult {
        CallToolResult::structured(json)
    }

    #[test]
    fn conforming_output_passes_and_a_violation_is_named() {
        let validator = compile(&schema(serde_json::json!({
            "type": "object",
            "properties": {"temperature": {"type": "number"}, "city": {"type": "string", "pattern": "^[A-Z]"}},
            "required": ["temperature"]
        })))
        .expect("compiles");
        assert_eq!(check(&validator, &structured(serde_json::json!({"temperature": 21.5, "city": "Oslo"}))), Ok(()));
        let wrong = check(&validator, &structured(serde_json::json!({"temperature": "warm"}))).expect_err("a string");
        assert!(wrong.contains("/temperature") && wrong.contains("number"), "{wrong}");
        let missing = check(&validator, &structured(serde_json::json!({"city": "Oslo"}))).expect_err("required");
        assert!(missing.contains("temperature"), "{missing}");
        let none = check(&validator, &CallToolResult::success(vec![])).expect_err("no structuredContent");
        assert!(none.contains("no structuredContent"), "{none}");
        let tool_error = CallToolResult::error(vec![]);
        assert_eq!(check(&validator, &tool_error), Ok(()), "tool errors are not checked");
    }

    #[test]
    fn a_hostile_schema_is_refused_or_bounded_never_fetched() {
        // A remote $ref is never fetched: the schema does not compile, and the result passes
        // unchecked (the caller is told nothing false).
        let remote = compile(&schema(serde_json::json!({"$ref": "http://127.0.0.1:9/schema.json"})));
        assert!(remote.is_err());
        // A pattern that backtracks exponentially elsewhere runs in linear time here.
        let validator = compile(&schema(
            serde_json::json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}),
        ))
        .expect("compiles");
        let evil = format!("{}!", "a".repeat(50_000));
        assert!(check(&validator, &structured(serde_json::json!({"s": evil}))).is_err());
        // A pattern too big to compile within the limit is refused.
        let huge = compile(&schema(serde_json::json!({"type": "string", "pattern": "(\\w{1000}){1000}"})));
        assert!(huge.is_err(), "{huge:?}");
        // Violations quoting huge data are cut.
        let strict = compile(&schema(serde_json::json!({"type": "object", "properties": {"n": {"type": "number"}}})))
            .expect("compiles");
        let long = check(&strict, &structured(serde_json::json!({"n": "x".repeat(10_000)}))).expect_err("not a number");
        assert!(long.len() <= MAX_VIOLATION_BYTES + 4, "{}", long.len());
    }
}
