//! Checking a call against the schemas its server listed for the tool: the arguments against the
//! `inputSchema` before the call leaves, the `structuredContent` against the `outputSchema` when
//! it comes back (MCP 2025-06-18 on: a server MUST answer conforming structured content, a client
//! SHOULD validate). Arguments that break the schema (often a model's mistake) are refused with
//! the first violation when the agent is asked to (`--check-arguments`: a server validates its
//! inputs itself, and the MCP conformance suite expects a client to send what it is asked); a server's
//! broken or lying answer never reaches a caller (or a model) as if it conformed.
//!
//! Decisions:
//! - no arguments are checked as `{}` (what the server would see);
//! - a result with `isError: true` is not checked (the schema describes successful output);
//! - no `structuredContent` from a tool that declares an `outputSchema` violates it;
//! - the schema is the server's, so untrusted: its size is capped when it is listed
//!   (`limits`), at most [`MAX_PATTERNS`] regular expressions are compiled per schema, each
//!   with the `regex` crate (linear time, no backtracking) within a compiled-size limit, and
//!   nothing is fetched (no remote or file `$ref`). A schema over a cap, like one that does not
//!   compile, cannot be checked: the result passes unchecked and the reason is logged once per
//!   tool list (the call is not the caller's fault);
//! - validators are compiled once per listed schema, off the runtime's threads
//!   (`spawn_blocking`, so a costly schema never stalls other requests), and kept with it
//!   (`Pool`'s slot).

use jsonschema::{PatternOptions, Validator};
use rmcp::model::{CallToolResult, JsonObject};
use serde_json::Value;

/// Compiled size limit of one pattern of a server's schema (the `regex` crate's unit: bytes of
/// its program), and of its lazy DFA's cache. 256 KiB admits any reasonable pattern and bounds
/// what a hostile one costs.
const MAX_PATTERN_SIZE: usize = 256 << 10;
/// Regular expressions (`pattern` values, `patternProperties` keys) compiled for one schema:
/// with [`MAX_PATTERN_SIZE`], a schema costs at most some tens of MiB. Real schemas have a
/// handful.
pub(crate) const MAX_PATTERNS: usize = 64;
/// Longest violation quoted in an error (instance paths and messages quote the server's data).
const MAX_VIOLATION_BYTES: usize = 300;

/// Compiles a server's `inputSchema` or `outputSchema`; the error says why it cannot be used.
/// Costly (run it off the runtime's threads).
pub(crate) fn compile(schema: &JsonObject) -> Result<Validator, String> {
    let count = patterns_in(schema);
    if count > MAX_PATTERNS {
        return Err(format!(
            "it has {count} regular expressions (pattern, patternProperties), over the agent's cap of {MAX_PATTERNS}"
        ));
    }
    let patterns = PatternOptions::regex().size_limit(MAX_PATTERN_SIZE).dfa_size_limit(MAX_PATTERN_SIZE);
    jsonschema::options()
        .with_pattern_options(patterns)
        .build(&Value::Object(schema.clone()))
        .map_err(|e| cut(&e.to_string()))
}

/// `Ok` when `arguments` conform to the tool's `inputSchema`; else the first violation, as a
/// sentence for an error message.
pub(crate) fn check_arguments(validator: &Validator, arguments: Option<&JsonObject>) -> Result<(), String> {
    let empty = JsonObject::new();
    let instance = Value::Object(arguments.unwrap_or(&empty).clone());
    first_violation(validator, &instance).map_or(Ok(()), |(at, error)| {
        Err(cut(&format!("the arguments do not conform to its inputSchema at {at}: {error}")))
    })
}

/// Where and what the first violation of `instance` is, if any.
fn first_violation(validator: &Validator, instance: &Value) -> Option<(String, String)> {
    let error = validator.iter_errors(instance).next()?;
    let path = error.instance_path().to_string();
    let at = if path.is_empty() { "the root".to_string() } else { format!("'{path}'") };
    Some((at, error.to_string()))
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
    first_violation(validator, structured).map_or(Ok(()), |(at, error)| {
        Err(cut(&format!("its structuredContent does not conform to its outputSchema at {at}: {error}")))
    })
}

/// Regular expressions in `schema`: every string `pattern` and every key of a
/// `patternProperties`, anywhere (counting too many is safe).
fn patterns_in(schema: &JsonObject) -> usize {
    let mut count = 0usize;
    let mut stack: Vec<&JsonObject> = vec![schema];
    let mut values: Vec<&Value> = Vec::new();
    while let Some(object) = stack.pop() {
        for (key, value) in object {
            match (key.as_str(), value) {
                ("pattern", Value::String(_)) => count += 1,
                ("patternProperties", Value::Object(map)) => count += map.len(),
                _ => {}
            }
            values.push(value);
        }
        while let Some(value) = values.pop() {
            match value {
                Value::Object(map) => stack.push(map),
                Value::Array(items) => values.extend(items),
                _ => {}
            }
        }
    }
    count
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
    fn arguments_are_checked_and_none_count_as_an_empty_object() {
        let validator = compile(&schema(serde_json::json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "depth": {"type": "integer", "minimum": 0}},
            "required": ["path"]
        })))
        .expect("compiles");
        let args = |v: Value| v.as_object().cloned();
        assert_eq!(check_arguments(&validator, args(serde_json::json!({"path": "/srv"})).as_ref()), Ok(()));
        let wrong = check_arguments(&validator, args(serde_json::json!({"path": "/srv", "depth": -1})).as_ref());
        assert!(wrong.as_ref().is_err_and(|e| e.contains("'/depth'") && e.contains("inputSchema")), "{wrong:?}");
        let missing = check_arguments(&validator, None).expect_err("path is required");
        assert!(missing.contains("the root") && missing.contains("path"), "{missing}");
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
        // Many patterns: not compiled at all (cannot be checked), at once.
        let many = serde_json::json!({"type": "object", "properties": {"s": {"type": "string",
            "allOf": vec![serde_json::json!({"pattern": "\\w{200}|zI"}); 2000]}}});
        let started = std::time::Instant::now();
        let Err(refused) = compile(&schema(many)) else { panic!("over the pattern cap") };
        assert!(refused.contains("2000 regular expressions"), "{refused}");
        assert!(started.elapsed() < std::time::Duration::from_millis(500));
        let mut properties = serde_json::Map::new();
        for i in 0..100 {
            properties.insert(format!("^p{i}$"), serde_json::json!({}));
        }
        let keyed = compile(&schema(serde_json::json!({"patternProperties": properties})));
        assert!(keyed.is_err_and(|e| e.contains("100 regular expressions")));
        let few = serde_json::json!({"allOf": vec![serde_json::json!({"pattern": "^a"}); MAX_PATTERNS]});
        assert!(compile(&schema(few)).is_ok());
        // Violations quoting huge data are cut.
        let strict = compile(&schema(serde_json::json!({"type": "object", "properties": {"n": {"type": "number"}}})))
            .expect("compiles");
        let long = check(&strict, &structured(serde_json::json!({"n": "x".repeat(10_000)}))).expect_err("not a number");
        assert!(long.len() <= MAX_VIOLATION_BYTES + 4, "{}", long.len());
    }
}
