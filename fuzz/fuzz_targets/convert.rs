//! `spearlet convert` (`src/convert/`) on arbitrary configs: the design's records, the MCP
//! Registry's server.json and client configs, any of which may come from someone else (a
//! server.json is a publisher's metadata).
//!
//! The input is one byte of choices (bits 0-1 the format: design TOML, design JSON, server.json,
//! client config; bit 2 `--secret`; bit 3 `--prefer package`), then the file name up to the first
//! line break, then the text: the seeds are the fixtures of `tests/fixtures/convert/` behind such
//! a header.
//!
//! Properties:
//! - it returns normally for every input: no panic;
//! - every server it converts is printed as YAML that reads back as exactly that one object,
//!   valid: nothing in the notes or the file name (both carry input text, printed as comments)
//!   can end a comment and add keys, and nothing it writes is refused by `validate`;
//! - a refusal has a message.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&choices, rest)) = data.split_first() else { return };
    let Ok(rest) = std::str::from_utf8(rest) else { return };
    let (origin, text) = rest.split_once('\n').unwrap_or((rest, ""));
    let converted = spear::fuzzing::convert_config(text, choices, origin, choices & 4 != 0, choices & 8 != 0);
    match converted {
        Err(message) => assert!(!message.trim().is_empty(), "a refusal without a message"),
        Ok(servers) => {
            for (yaml, object) in servers {
                let read = spear::fuzzing::parse_manifest(&yaml);
                assert_eq!(read.problems, vec![], "converted output is refused:\n{yaml}");
                assert_eq!(read.documents, vec![object], "the YAML is not the object it was made from:\n{yaml}");
            }
        }
    }
});
