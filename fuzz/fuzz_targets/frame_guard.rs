//! The stdio/socket frame guard (`src/mcp/connect/frame.rs` `FrameGuard`) and the tool output cap
//! (`src/mcp/output.rs` `cap`, and the pool's `cap_result` with its shortcut for small text
//! results, `src/mcp/pool/call.rs`).
//!
//! Input: byte 0 the frame limit, byte 1 the reader's buffer size, bytes 2-5 the sizes of the
//! chunks the inner reader hands out (0: pending once), the rest the stream. When the stream is
//! a JSON value it is also a tool result, capped at `byte0 * (1 + byte1 % 16)` bytes.
//!
//! Properties:
//! - the guard trips exactly when a line (without its `\n`) is longer than the limit; untripped,
//!   it passes the stream through unchanged; tripped, what it let through is a prefix of the
//!   stream with no over-long line, the error comes with no bytes, and every later read fails;
//! - it counts as not JSON exactly the lines whose first non-blank byte is not `{` or `[`;
//! - the cap leaves a result within the limit alone; over it, the result's size without the marker
//!   block is at most the limit, the marker block comes last, kept blocks are the original ones
//!   in order (text cut to a prefix, so on a character boundary), nothing was cut that fitted
//!   (a cut text leaves under 4 bytes unused), and `structuredContent` is kept whole or dropped;
//! - the pool's cap agrees with it, and its result is still a `CallToolResult`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use spear::fuzzing::{cap_output, cap_tool_result, frame_guard, result_size};

const MARKER: &str = "mcp_output_too_large";

fn check_guard(stream: &[u8], chunks: &[usize], buffer: usize, limit: usize) {
    let framed = frame_guard(stream, chunks, buffer, limit);
    let lines: Vec<&[u8]> = stream.split(|&b| b == b'\n').collect();
    let too_long = lines.iter().any(|l| l.len() > limit);
    assert_eq!(
        framed.failed,
        too_long,
        "limit {limit}: failed {} for lines {:?}",
        framed.failed,
        lines.iter().map(|l| l.len()).collect::<Vec<_>>()
    );
    assert_eq!(framed.tripped, too_long);
    if too_long {
        assert!(stream.starts_with(&framed.output), "not a prefix");
        assert!(framed.output.split(|&b| b == b'\n').all(|l| l.len() <= limit), "an over-long line got through");
        assert!(framed.failed_after, "a read after the trip succeeded");
    } else {
        assert_eq!(framed.output, stream, "the guard changed the stream");
        let garbage = lines
            .iter()
            .filter_map(|l| l.iter().find(|b| !b.is_ascii_whitespace()))
            .filter(|&&b| b != b'{' && b != b'[')
            .count();
        assert_eq!(framed.garbage, garbage as u64, "non-JSON lines miscounted");
    }
}

fn blocks(v: &Value) -> Vec<Value> {
    v.get("content").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn check_cap(result: &Value, limit: usize) {
    let original = result_size(result);
    let mut capped = result.clone();
    let Some((reported, reported_limit)) = cap_output(&mut capped, limit) else {
        assert!(original <= limit, "{original} bytes over {limit} were not cut");
        assert_eq!(&capped, result, "a result within the limit changed");
        check_pool(result, limit);
        return;
    };
    assert!(original > limit, "{original} bytes within {limit} were cut");
    assert_eq!((reported, reported_limit), (original, limit));
    let kept = blocks(&capped);
    let marker = kept.last().expect("the marker block");
    let marker_text = marker["text"].as_str().expect("the marker is text");
    assert!(marker["type"] == "text" && marker_text.contains(MARKER), "no marker last: {marker}");
    let used = result_size(&capped) - marker_text.len();
    assert!(used <= limit, "{used} bytes kept under a {limit}-byte limit");
    if let Some(s) = capped.get("structuredContent") {
        assert_eq!(Some(s), result.get("structuredContent"), "structuredContent changed");
    }
    // Kept blocks: the original ones in order, text cut to a prefix.
    let mut originals = blocks(result).into_iter();
    let mut cut = false;
    for block in &kept[..kept.len() - 1] {
        let found = originals.by_ref().any(|o| {
            if o == *block {
                return true;
            }
            let (Some(text), Some(kept_text)) = (o["text"].as_str(), block["text"].as_str()) else { return false };
            o["type"] == "text" && text.starts_with(kept_text) && {
                cut |= kept_text.len() < text.len();
                true
            }
        });
        assert!(found, "kept block {block} is not an original one, in order");
    }
    if cut {
        assert!(used + 4 > limit, "a text was cut with {} bytes left", limit - used);
    }
    check_pool(result, limit);
}

fn check_pool(result: &Value, limit: usize) {
    let Some(out) = cap_tool_result(result, limit) else { return };
    let (before, after, cut) = out.expect("the capped result is still a CallToolResult");
    assert_eq!(cut, result_size(&before) > limit, "the pool and the cap disagree on {before}");
    if !cut {
        assert_eq!(after, before, "the pool changed a result within the limit");
        return;
    }
    let marker = blocks(&after).last().and_then(|b| b["text"].as_str().map(str::len)).unwrap_or(0);
    assert!(result_size(&after) - marker <= limit, "the pool's result is over the limit");
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let limit = usize::from(data[0]);
    let buffer = usize::from(data[1]).max(1);
    let chunks: Vec<usize> = data[2..6].iter().map(|&b| usize::from(b)).collect();
    let stream = &data[6..];
    check_guard(stream, &chunks, buffer, limit);
    if let Ok(result) = serde_json::from_slice::<Value>(stream) {
        check_cap(&result, limit * (1 + usize::from(data[1]) % 16));
    }
});
