//! A whole `chat.completion` as the SSE `chat.completion.chunk` events OpenAI would have sent.
//!
//! ```text
//! chat.completion ──chunks──▶ per choice: role ─ content pieces ─ refusal ─ tool_calls (name,
//!                             then arguments, by index) ─ finish_reason
//!                             [usage chunk with choices: [] when stream_options.include_usage]
//!                 ──sse_body──▶ "data: {chunk}\n\n" ... "data: [DONE]\n\n"
//! ```
//!
//! The loop asks the upstream without streaming (it needs each answer whole to find the tool
//! calls), so the caller's stream starts when the final answer is known. Content is still cut
//! into several deltas, so clients exercise the code they were written for.

use serde_json::{Map, Value, json};

use super::types::ChatCompletion;

/// Characters per content delta. The answer is known already, so this only shapes the wire;
/// small enough that a typical answer takes several deltas, large enough to stay cheap.
const CONTENT_PIECE_CHARS: usize = 64;

/// The chunks of `completion`. `extension` (the `spear` object) rides on the last chunk;
/// `include_usage` adds OpenAI's trailing usage chunk (and `usage: null` on the others).
pub(crate) fn chunks(completion: &ChatCompletion, include_usage: bool, extension: Option<Value>) -> Vec<Value> {
    let mut base = Map::new();
    if let Some(id) = &completion.id {
        base.insert("id".into(), Value::from(id.as_str()));
    }
    base.insert("object".into(), Value::from("chat.completion.chunk"));
    for key in ["created", "model", "service_tier", "system_fingerprint"] {
        if let Some(value) = completion.extra.get(key) {
            base.insert(key.into(), value.clone());
        }
    }
    if include_usage {
        base.insert("usage".into(), Value::Null);
    }
    let chunk = |index: u32, delta: Value, finish_reason: Option<&str>| {
        let mut chunk = base.clone();
        chunk.insert(
            "choices".into(),
            json!([{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]),
        );
        Value::Object(chunk)
    };

    let mut out = Vec::new();
    for choice in &completion.choices {
        let message = &choice.message;
        let content = message.content();
        let first_content = if content.is_some() { Value::from("") } else { Value::Null };
        out.push(chunk(choice.index, json!({"role": message.role, "content": first_content}), None));
        for piece in pieces(content.unwrap_or_default(), CONTENT_PIECE_CHARS) {
            out.push(chunk(choice.index, json!({"content": piece}), None));
        }
        if let Some(refusal) = message.extra.get("refusal").and_then(Value::as_str) {
            out.push(chunk(choice.index, json!({"refusal": refusal}), None));
        }
        for (index, call) in message.calls().iter().enumerate() {
            let head = match &call.function {
                Some(f) => json!({
                    "index": index, "id": call.id, "type": call.kind,
                    "function": {"name": f.name, "arguments": ""},
                }),
                // Not a function call: sent whole in one delta.
                None => {
                    let mut whole = serde_json::to_value(call).unwrap_or(Value::Null);
                    if let Some(o) = whole.as_object_mut() {
                        o.insert("index".into(), Value::from(index));
                    }
                    whole
                }
            };
            out.push(chunk(choice.index, json!({"tool_calls": [head]}), None));
            if call.function.is_some() {
                let arguments = call.arguments_string();
                out.push(chunk(
                    choice.index,
                    json!({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}),
                    None,
                ));
            }
        }
        out.push(chunk(choice.index, json!({}), Some(choice.finish_reason.as_deref().unwrap_or("stop"))));
    }
    if include_usage {
        let mut last = base.clone();
        last.insert("choices".into(), json!([]));
        last.insert("usage".into(), completion.extra.get("usage").cloned().unwrap_or(Value::Null));
        out.push(Value::Object(last));
    }
    if let (Some(extension), Some(Value::Object(last))) = (extension, out.last_mut()) {
        last.insert("spear".into(), extension);
    }
    out
}

/// `s` cut into pieces of at most `size` characters (never inside a character).
fn pieces(s: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = s;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.char_indices().nth(size).map_or(rest.len(), |(i, _)| i);
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// The SSE body: one `data:` event per chunk, then `data: [DONE]`.
pub(crate) fn sse_body(chunks: &[Value]) -> String {
    let mut body = String::new();
    for chunk in chunks {
        body.push_str("data: ");
        body.push_str(&chunk.to_string());
        body.push_str("\n\n");
    }
    body.push_str("data: [DONE]\n\n");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(message: Value, finish: &str) -> ChatCompletion {
        serde_json::from_value(json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "m",
            "system_fingerprint": "fp", "usage": {"total_tokens": 3},
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
        }))
        .expect("completion")
    }

    fn deltas(chunks: &[Value]) -> Vec<Value> {
        chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
            .map(|c| c["delta"].clone())
            .collect()
    }

    #[test]
    fn content_is_a_role_chunk_content_deltas_and_a_finish_chunk() {
        let text = "é".repeat(150);
        let chunks = chunks(&completion(json!({"role": "assistant", "content": text}), "stop"), false, None);
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["id"], "chatcmpl-1");
            assert_eq!(c["created"], 7);
            assert_eq!(c["system_fingerprint"], "fp");
            assert!(c.get("usage").is_none());
        }
        let d = deltas(&chunks);
        assert_eq!(d[0], json!({"role": "assistant", "content": ""}));
        let joined: String = d[1..d.len() - 1].iter().map(|d| d["content"].as_str().expect("content")).collect();
        assert_eq!(joined, text);
        assert_eq!(d.len(), 1 + 3 + 1, "150 characters in pieces of 64");
        assert_eq!(d[d.len() - 1], json!({}));
        assert_eq!(chunks[chunks.len() - 1]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[0]["choices"][0]["finish_reason"], Value::Null);
    }

    #[test]
    fn tool_calls_are_deltas_by_index_name_first_then_arguments() {
        let message = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "a", "arguments": "{\"x\":1}"}},
            {"id": "c1", "type": "function", "function": {"name": "b", "arguments": "{}"}},
        ]});
        let d = deltas(&chunks(&completion(message, "tool_calls"), false, None));
        assert_eq!(d[0], json!({"role": "assistant", "content": null}));
        assert_eq!(
            d[1],
            json!({"tool_calls": [{"index": 0, "id": "c0", "type": "function", "function": {"name": "a", "arguments": ""}}]})
        );
        assert_eq!(d[2], json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\":1}"}}]}));
        assert_eq!(d[3]["tool_calls"][0]["index"], 1);
        assert_eq!(d[4]["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(d.len(), 6);
    }

    #[test]
    fn usage_comes_last_with_no_choices_and_carries_the_extension() {
        let chunks = chunks(
            &completion(json!({"role": "assistant", "content": "hi"}), "stop"),
            true,
            Some(json!({"iterations": 1})),
        );
        let last = chunks.last().expect("chunks");
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"], json!({"total_tokens": 3}));
        assert_eq!(last["spear"], json!({"iterations": 1}));
        assert_eq!(chunks[0]["usage"], Value::Null);
        assert!(chunks[0].get("spear").is_none());
    }

    #[test]
    fn the_body_is_data_events_ending_in_done() {
        let body = sse_body(&[json!({"a": 1}), json!({"b": 2})]);
        assert_eq!(body, "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n");
    }
}
