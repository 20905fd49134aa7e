//! The YAML/JSON manifest reader (`src/api/manifest.rs`) on arbitrary text.
//!
//! Properties:
//! - it returns normally for every input: no panic, no stack overflow, no runaway memory or time
//!   (the caps on bytes, depth, nodes and aliases; libFuzzer's `-rss_limit_mb` and `-timeout`
//!   catch what they miss);
//! - every problem points at a line of the text (1 ..= lines + 1, a line past the end for an
//!   error at the end);
//! - every valid object is stable: written back as JSON and read again, it is one valid object,
//!   the same one (what the parser accepts, the registry and the operator can write back).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let read = spear::fuzzing::parse_manifest(text);
    // YAML breaks lines at `\n`, `\r\n` and a lone `\r`.
    let breaks = text.matches('\n').count() + text.matches('\r').count() - text.matches("\r\n").count();
    let lines = breaks + 2;
    for (line, field, _) in &read.problems {
        assert!((1..=lines).contains(line), "problem on {field} at line {line} of {lines}");
    }
    for object in &read.documents {
        let json = serde_json::to_string(object).expect("an object serializes");
        let again = spear::fuzzing::parse_manifest(&json);
        assert_eq!(again.problems, vec![], "a valid object written back is invalid: {json}");
        assert_eq!(again.documents, vec![object.clone()], "a valid object changes when read again");
    }
});
