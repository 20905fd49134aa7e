//! Secret redaction and credential detection (`src/secrets/`): what tools return and models send
//! is untrusted text, and the values the agent holds must not get through in any spelling.
//!
//! Input (arbitrary): held values with origins and grants, and a text assembled from plain
//! pieces, spellings of the held values (whole or cut short) and fake credential samples; capped
//! at 1 MiB.
//!
//! Properties:
//! - after `redact`, no searched spelling of a held value remains anywhere in the output except
//!   inside a marker (spellings with `[` or `]` aside: those can straddle a marker's edge);
//! - after `redact_cut`, in addition no suffix of four bytes or more is a proper prefix of a
//!   spelling;
//! - markers name origins with no `]`, no control character, at most 128 characters;
//! - `foreign_in` names only origins of values not granted to the server, and names one whenever
//!   a held value granted to another server or to none is in the text and nothing is granted to
//!   this server;
//! - after the detectors' `redact`, `first_in` finds nothing;
//! - no panic, in time on every input.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spear::fuzzing::{
    HeldSecret, SecretRedactor, detectors_first_in, detectors_redact, secret_origin, secret_spellings,
};

const MAX_TEXT: usize = 1 << 20;
const MAX_VALUE: usize = 256;

/// Fake credentials in their published shapes.
const SAMPLES: &[&str] = &[
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEfake\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----\nMC4C",
    "AKIAIOSFODNN7EXAMPLE",
    "AIzaSyFAKE-key_0123456789abcdefghijklmn",
    "ghp_0123456789abcdefghijklmnopqrstuvwxyz",
    "github_pat_11ABCDEFG0123456789abc_xxxxxxxxxx",
    "glpat-abcdefghij0123456789",
    "xoxb-1234567890-abcdefghij",
    "sk_live_0123456789abcdefFAKE",
    "sk-proj-abcDEF123_ghiJKL456-mnoPQR789",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlMTIz",
];

#[derive(Arbitrary, Debug)]
enum Piece {
    Text(String),
    /// Spelling `spelling` (modulo their count) of held value `secret`.
    Spelling {
        secret: u8,
        spelling: u8,
    },
    /// The first `len` bytes of that spelling (at a character boundary).
    Prefix {
        secret: u8,
        spelling: u8,
        len: u8,
    },
    Sample(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    secrets: Vec<HeldSecret>,
    pieces: Vec<Piece>,
    server: String,
}

fn has_bracket(s: &str) -> bool {
    s.contains(['[', ']'])
}

/// No bracket-free spelling in `out` outside a marker: split on brackets, every piece that is not
/// exactly a marker's inside must not contain one.
fn no_spelling_left(out: &str, spellings: &[String], markers: &[String]) {
    for piece in out.split(['[', ']']) {
        if markers.iter().any(|m| m == piece) {
            continue;
        }
        for s in spellings.iter().filter(|s| !has_bracket(s)) {
            assert!(!piece.contains(s.as_str()), "{s:?} left in {piece:?}");
        }
    }
}

fuzz_target!(|input: Input| {
    let mut secrets = input.secrets;
    for (value, _, _) in &mut secrets {
        let mut end = value.len().min(MAX_VALUE);
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        value.truncate(end);
    }
    let spellings: Vec<Vec<String>> = secrets.iter().map(|(value, _, _)| secret_spellings(value)).collect();
    let mut text = String::new();
    for piece in &input.pieces {
        match piece {
            Piece::Text(t) => text.push_str(t),
            Piece::Spelling { secret, spelling } | Piece::Prefix { secret, spelling, .. } => {
                let Some(all) = spellings.get(usize::from(*secret) % spellings.len().max(1)) else { continue };
                let Some(s) = all.get(usize::from(*spelling) % all.len().max(1)) else { continue };
                let mut len = match piece {
                    Piece::Prefix { len, .. } => usize::from(*len).min(s.len()),
                    _ => s.len(),
                };
                while !s.is_char_boundary(len) {
                    len -= 1;
                }
                text.push_str(&s[..len]);
            }
            Piece::Sample(i) => text.push_str(SAMPLES[usize::from(*i) % SAMPLES.len()]),
        }
        if text.len() > MAX_TEXT {
            break;
        }
    }
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);

    let origins: Vec<String> = secrets.iter().map(|(_, origin, _)| secret_origin(origin)).collect();
    for origin in &origins {
        assert!(origin.chars().count() <= 128 && !origin.contains(']'), "{origin:?}");
        assert!(!origin.chars().any(char::is_control), "{origin:?}");
    }
    let markers: Vec<String> = origins.iter().map(|o| format!("redacted: {o}")).collect();
    let every: Vec<String> = spellings.iter().flatten().cloned().collect();

    let redactor = SecretRedactor::new(&secrets);
    let out = redactor.redact(&text, false);
    no_spelling_left(&out, &every, &markers);

    let cut = redactor.redact(&text, true);
    no_spelling_left(&cut, &every, &markers);
    for s in &every {
        for len in 4..s.len() {
            let prefix = &s.as_bytes()[..len];
            if prefix.contains(&b'[') || prefix.contains(&b']') {
                break;
            }
            assert!(!cut.as_bytes().ends_with(prefix), "a prefix of {s:?} ends {cut:?}");
        }
    }

    let foreign = redactor.foreign_in(&text, &input.server);
    let not_granted = |(_, _, granted): &&HeldSecret| granted.as_deref() != Some(input.server.as_str());
    if let Some(origin) = &foreign {
        let ok = secrets.iter().zip(&origins).any(|(s, o)| o == origin && not_granted(&s) && s.0.len() >= 8);
        assert!(ok, "{origin:?} is granted to {:?}", input.server);
    }
    let granted_here = secrets.iter().any(|s| !not_granted(&s) && s.0.len() >= 8);
    let foreign_present = secrets.iter().filter(not_granted).any(|s| s.0.len() >= 8 && text.contains(s.0.as_str()));
    if foreign_present && !granted_here {
        assert!(foreign.is_some(), "a foreign value was not found");
    }

    let detected = detectors_redact(&text);
    assert_eq!(detectors_first_in(&detected), None, "{detected:?}");
});
