//! The per-file YAML budget (`src/api/manifest.rs`, `Budget`) on one document repeated in a file:
//! the attack where a document under every cap, copied many times into one file, multiplied what
//! the reader held.
//!
//! Input: one byte choosing `k` (2 ..= 64), then a text `D`. One copy is `D` ended by `...` on a
//! line of its own (so directives and block scalars end with it); alone it parses within the
//! real budget, spending `S` (nodes, scalar bytes, field-path bytes). The file is `k` copies.
//! Properties:
//! - spending is per file and additive: the file spends exactly `k × S`, and with every budget at
//!   `k × S` it is not refused for the budget;
//! - one budget at `k × S − 1` (each dimension `D` spends on in turn) refuses the file: no object
//!   comes back, and the one problem names that dimension.
//!
//! A file whose copies do not parse together (a YAML quirk: a byte order mark mid-stream) is still
//! never accepted over its budget; the exact figures are checked where it parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spear::fuzzing::{MANIFEST_FILE_BUDGET, MAX_MANIFEST_BYTES, ManifestCost, parse_manifest_within};

fn is_syntax_error(message: &str) -> bool {
    message.starts_with("YAML syntax error")
}

/// The problem a parse stops with past its budget (`Builder::within_budget`).
fn is_over_budget(message: &str) -> bool {
    ["the file has more than", "the file's values exceed", "the file's field paths exceed"]
        .iter()
        .any(|words| message.starts_with(words))
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else { return };
    let Ok(document) = std::str::from_utf8(rest) else { return };
    let k = 2 + usize::from(first) % 63;
    // One copy as it stands in the file: the line break before `...` can be part of a value.
    let copy = format!("{document}\n...\n");
    let (alone, once) = parse_manifest_within(&copy, MANIFEST_FILE_BUDGET);
    let refused_alone = alone.problems.iter().any(|(_, _, m)| {
        is_syntax_error(m) || is_over_budget(m) || m.contains("nest deeper") || m.contains("bytes; at most")
    });
    if refused_alone {
        return;
    }
    let file = copy.repeat(k);
    if file.len() > MAX_MANIFEST_BYTES {
        return;
    }
    let times = |n: usize| n * k;
    let exact = ManifestCost {
        nodes: times(once.nodes),
        scalar_bytes: times(once.scalar_bytes),
        path_bytes: times(once.path_bytes),
    };

    let (read, spent) = parse_manifest_within(&file, exact);
    let parses_together = !read.problems.iter().any(|(_, _, m)| is_syntax_error(m));
    if parses_together {
        assert_eq!(spent, exact, "{k} copies spend {k} times one copy");
        for (_, _, message) in &read.problems {
            assert!(!is_over_budget(message), "refused within its budget: {message}");
        }
    }

    let dimensions: [(&str, usize, fn(&mut ManifestCost) -> &mut usize); 3] = [
        ("nodes", once.nodes, |c| &mut c.nodes),
        ("values exceed", once.scalar_bytes, |c| &mut c.scalar_bytes),
        ("field paths exceed", once.path_bytes, |c| &mut c.path_bytes),
    ];
    for (words, spent_once, dimension) in dimensions {
        if spent_once == 0 {
            continue;
        }
        let mut budget = exact;
        *dimension(&mut budget) -= 1;
        let (read, _) = parse_manifest_within(&file, budget);
        assert!(read.documents.is_empty(), "{k} copies over the {words} budget returned objects");
        assert!(!read.problems.is_empty(), "{k} copies over the {words} budget were accepted");
        if parses_together {
            assert_eq!(read.problems.len(), 1, "{:?}", read.problems);
            let message = &read.problems[0].2;
            assert!(is_over_budget(message) && message.contains(words), "over the {words} budget: {message}");
        }
    }
});
