//! Capping a tool result at `maxToolOutputBytes`. Pure, over the result's JSON form, so it does
//! not depend on which content block types the SDK knows.
//!
//! Size counts text bytes of `text` blocks and the serialized size of every other block and of
//! `structuredContent`. Over the cap, text is cut on a character boundary, blocks that no longer
//! fit are dropped, and an explicit marker block says what happened: a model must never take a
//! cut result for the whole one.

use serde_json::{Value, json};

/// What was cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// Size of the result before the cap.
    pub original_bytes: usize,
    pub(crate) limit_bytes: usize,
}

impl Truncation {
    /// The text of the marker block appended to a cut result.
    pub(crate) fn marker(&self) -> String {
        format!(
            "[spear-mcp: output truncated (mcp_output_too_large): the tool returned {} bytes, the limit is {} bytes]",
            self.original_bytes, self.limit_bytes
        )
    }
}

fn block_size(block: &Value) -> usize {
    match (block.get("type").and_then(Value::as_str), block.get("text").and_then(Value::as_str)) {
        (Some("text"), Some(text)) => text.len(),
        _ => serde_json::to_vec(block).map_or(0, |v| v.len()),
    }
}

/// The size of a `CallToolResult` as JSON, by the rule above.
pub(crate) fn result_size(result: &Value) -> usize {
    let content: usize = result.get("content").and_then(Value::as_array).map_or(0, |c| c.iter().map(block_size).sum());
    let structured = result.get("structuredContent").map_or(0, |s| serde_json::to_vec(s).map_or(0, |v| v.len()));
    content + structured
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn prefix(text: &str, max: usize) -> &str {
    &text[..text.floor_char_boundary(max)]
}

/// Cuts `result` (a `CallToolResult` as JSON) to `limit` bytes; `None` when it fits.
pub(crate) fn cap(result: &mut Value, limit: usize) -> Option<Truncation> {
    let original = result_size(result);
    if original <= limit {
        return None;
    }
    let truncation = Truncation { original_bytes: original, limit_bytes: limit };
    let mut remaining = limit;
    if let Some(structured) = result.get("structuredContent") {
        let size = serde_json::to_vec(structured).map_or(0, |v| v.len());
        if size <= remaining {
            remaining -= size;
        } else if let Some(obj) = result.as_object_mut() {
            obj.remove("structuredContent");
        }
    }
    let blocks = result.get_mut("content").and_then(Value::as_array_mut).map(std::mem::take).unwrap_or_default();
    let mut kept = Vec::with_capacity(blocks.len() + 1);
    for block in blocks {
        if remaining == 0 {
            break;
        }
        let is_text = block.get("type").and_then(Value::as_str) == Some("text");
        match block.get("text").and_then(Value::as_str) {
            Some(text) if is_text => {
                let cut = prefix(text, remaining);
                remaining -= cut.len();
                kept.push(json!({"type": "text", "text": cut}));
            }
            _ => {
                let size = block_size(&block);
                if size <= remaining {
                    remaining -= size;
                    kept.push(block);
                }
            }
        }
    }
    kept.push(json!({"type": "text", "text": truncation.marker()}));
    if let Some(obj) = result.as_object_mut() {
        obj.insert("content".into(), Value::Array(kept));
    }
    Some(truncation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_within_the_cap_are_untouched() {
        let mut r = json!({"content": [{"type": "text", "text": "hello"}]});
        let before = r.clone();
        assert_eq!(cap(&mut r, 5), None);
        assert_eq!(r, before);
    }

    #[test]
    fn text_is_cut_on_a_char_boundary_with_a_marker() {
        let mut r = json!({"content": [{"type": "text", "text": "héllo wörld"}, {"type": "text", "text": "more"}]});
        let t = cap(&mut r, 2).expect("cut");
        assert_eq!(t, Truncation { original_bytes: 17, limit_bytes: 2 });
        let content = r["content"].as_array().expect("content");
        assert_eq!(content[0]["text"], "h", "'é' is two bytes and does not fit");
        assert_eq!(content[1]["text"], "m", "the byte left goes to the next block");
        assert_eq!(content.len(), 3);
        assert!(content[2]["text"].as_str().expect("marker").contains("mcp_output_too_large"));
    }

    #[test]
    fn blocks_that_do_not_fit_are_dropped_and_structured_content_too() {
        let mut r = json!({
            "content": [{"type": "text", "text": "abc"}, {"type": "image", "data": "A".repeat(100), "mimeType": "image/png"}],
            "structuredContent": {"big": "x".repeat(100)},
            "isError": false
        });
        cap(&mut r, 10).expect("cut");
        assert!(r.get("structuredContent").is_none());
        assert_eq!(r["content"].as_array().expect("content").len(), 2, "text kept, image dropped, marker added");
        assert_eq!(r["isError"], false);
    }
}

fn part_size(part: &Value, text_pointer: &str) -> usize {
    match part.pointer(text_pointer).and_then(Value::as_str) {
        Some(text) => text.len(),
        None => serde_json::to_vec(part).map_or(0, |v| v.len()),
    }
}

/// The size of a sequence of parts by [`cap_parts`]' rule (what the audit's `output_bytes` says).
pub(crate) fn parts_size(parts: &[Value], text_pointer: &str) -> usize {
    parts.iter().map(|part| part_size(part, text_pointer)).sum()
}

/// Cuts a sequence of parts (a resource's `contents`, a prompt's `messages`) to `limit` bytes.
/// A part's size is the length of its text at `text_pointer` (`/text`, `/content/text`), or its
/// serialized size; a text part is cut on a character boundary, other parts that do not fit are
/// dropped, and `marker` (given the truncation) is appended. `None` when everything fits.
pub(crate) fn cap_parts(
    parts: &mut Vec<Value>,
    limit: usize,
    text_pointer: &str,
    marker: impl FnOnce(&Truncation) -> Value,
) -> Option<Truncation> {
    let size = |part: &Value| part_size(part, text_pointer);
    let original = parts_size(parts, text_pointer);
    if original <= limit {
        return None;
    }
    let truncation = Truncation { original_bytes: original, limit_bytes: limit };
    let mut remaining = limit;
    let mut kept = Vec::with_capacity(parts.len() + 1);
    for mut part in parts.drain(..) {
        let part_size = size(&part);
        if part_size <= remaining {
            remaining -= part_size;
            kept.push(part);
        } else if remaining > 0
            && let Some(Value::String(text)) = part.pointer_mut(text_pointer)
        {
            let cut = prefix(text, remaining).to_string();
            *text = cut;
            remaining = 0;
            kept.push(part);
        }
    }
    kept.push(marker(&truncation));
    *parts = kept;
    Some(truncation)
}

#[cfg(test)]
mod parts_tests {
    use super::*;

    #[test]
    fn parts_over_the_cap_are_cut_dropped_and_marked() {
        let mut parts = vec![
            json!({"uri": "a", "text": "0123456789"}),
            json!({"uri": "b", "blob": "QUJDREVGR0g="}),
            json!({"uri": "c", "text": "héllo wörld"}),
        ];
        let marker = |t: &Truncation| json!({"uri": "a", "text": t.marker()});
        assert!(cap_parts(&mut parts.clone(), 1000, "/text", marker).is_none(), "fits: untouched");
        let truncation = cap_parts(&mut parts, 13, "/text", marker).expect("cut");
        assert_eq!(truncation.original_bytes, 10 + 33 + 13);
        // The first fits (10), the blob (33 serialized) does not and is dropped, the third is
        // cut to the 3 bytes left, on a character boundary ("hé" is 3 bytes).
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[1]["text"], "hé");
        assert!(parts[2]["text"].as_str().is_some_and(|m| m.contains("mcp_output_too_large")));
    }
}
