//! The spellings a held value is searched in: how a value can appear in text a tool returns or a
//! model sends once some layer has encoded it. Each family is closed over the encoders in common
//! use (JSON escaping as serde_json/JavaScript, Python and Go write it; base64 in both alphabets at
//! every alignment; hex in both cases; percent-encoding with the escape sets of RFC 3986, HTML
//! forms, Go/Python query escaping, JavaScript and Python path quoting), not over one example.
//!
//! Not covered, on purpose: encodings of encodings (base64 of hex, JSON escaping twice), base64
//! wrapped onto lines (MIME, PEM bodies), hex with separators, and mixed-case hex or percent
//! escapes; each would multiply the spellings for little real output.

use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};

/// Every distinct spelling of `value`, verbatim first; short ones included (the caller drops
/// those under its minimum).
pub(super) fn spellings(value: &str) -> Vec<String> {
    let mut out = vec![value.to_string()];
    for style in [Json::Minimal, Json::Ascii, Json::Html] {
        out.push(json_escaped(value, style));
    }
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        for offset in 0..3 {
            out.push(base64_at(engine, value.as_bytes(), offset));
        }
    }
    out.push(hex(value.as_bytes(), b"0123456789abcdef"));
    out.push(hex(value.as_bytes(), b"0123456789ABCDEF"));
    for style in PERCENT {
        out.push(percent(value.as_bytes(), style));
    }
    let mut seen = std::collections::HashSet::with_capacity(out.len());
    out.retain(|s| seen.insert(s.clone()));
    out
}

/// How a JSON encoder escapes a string's characters beyond the required `"`, `\` and controls.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Json {
    /// Nothing more: serde_json, JavaScript's `JSON.stringify`, Python with `ensure_ascii=False`.
    Minimal,
    /// Every non-ASCII character as `\uXXXX` (surrogate pairs above U+FFFF): Python's default.
    Ascii,
    /// `<`, `>`, `&`, U+2028 and U+2029 as `\u....`: Go's `encoding/json`.
    Html,
}

/// `value` as the inside of a JSON string (no quotes). Short escapes for `\b \f \n \r \t`, as all
/// three encoders write them, and lowercase hex in `\u` escapes, as all three do.
pub(super) fn json_escaped(value: &str, style: Json) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    let unicode = |out: &mut String, unit: u16| {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.push_str("\\u");
        for shift in [12, 8, 4, 0] {
            out.push(char::from(HEX[usize::from((unit >> shift) & 0xf)]));
        }
    };
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => unicode(&mut out, u32::from(c) as u16),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' if style == Json::Html => {
                unicode(&mut out, u32::from(c) as u16);
            }
            c if !c.is_ascii() && style == Json::Ascii => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    unicode(&mut out, *unit);
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// The base64 characters that depend only on `value` when it sits at byte `offset` (mod 3) of a
/// longer encoded blob. Encoding `[0; offset] ++ value`, character `i` covers bits `6i..6i+6`;
/// the value's bits are `8·offset..8·(offset+len)`, so the characters wholly inside are
/// `ceil(4·offset/3) .. floor(4·(offset+len)/3)`: the leading ones mix in the bytes before the
/// value and the trailing one the bytes after it (or padding), and both are dropped.
pub(super) fn base64_at(engine: &impl base64::Engine, value: &[u8], offset: usize) -> String {
    let mut input = vec![0u8; offset];
    input.extend_from_slice(value);
    let encoded = engine.encode(&input);
    let start = (4 * offset).div_ceil(3);
    let end = (4 * (offset + value.len()) / 3).min(encoded.len());
    encoded.get(start..end).unwrap_or_default().to_string()
}

fn hex(value: &[u8], digits: &[u8; 16]) -> String {
    let mut out = String::with_capacity(value.len() * 2);
    for b in value {
        out.push(char::from(digits[usize::from(b >> 4)]));
        out.push(char::from(digits[usize::from(b & 0xf)]));
    }
    out
}

/// A percent-encoder: the bytes besides ASCII letters and digits it leaves alone, whether a space
/// becomes `+`, and the case of its hex digits.
#[derive(Clone, Copy, Debug)]
pub(super) struct Percent {
    pub(super) keep: &'static [u8],
    pub(super) space_plus: bool,
    pub(super) lower: bool,
}

/// The escape sets in common use.
const PERCENT: [Percent; 7] = [
    // RFC 3986 section 2.3 unreserved, uppercase as section 2.1 recommends, and lowercase.
    Percent { keep: b"-._~", space_plus: false, lower: false },
    Percent { keep: b"-._~", space_plus: false, lower: true },
    // application/x-www-form-urlencoded (WHATWG URL; the `url` crate's `byte_serialize`).
    Percent { keep: b"*-._", space_plus: true, lower: false },
    // Go's `url.QueryEscape`, Python's `quote_plus`.
    Percent { keep: b"-._~", space_plus: true, lower: false },
    // JavaScript's `encodeURIComponent`.
    Percent { keep: b"-_.!~*'()", space_plus: false, lower: false },
    // Python's `quote` (safe `/`).
    Percent { keep: b"-._~/", space_plus: false, lower: false },
    // JavaScript's `encodeURI` (reserved characters kept).
    Percent { keep: b"-_.!~*'();/?:@&=+$,#", space_plus: false, lower: false },
];

pub(super) fn percent(value: &[u8], style: Percent) -> String {
    let digits: &[u8; 16] = if style.lower { b"0123456789abcdef" } else { b"0123456789ABCDEF" };
    let mut out = String::with_capacity(value.len() * 3);
    for &b in value {
        if b.is_ascii_alphanumeric() || style.keep.contains(&b) {
            out.push(char::from(b));
        } else if b == b' ' && style.space_plus {
            out.push('+');
        } else {
            out.push('%');
            out.push(char::from(digits[usize::from(b >> 4)]));
            out.push(char::from(digits[usize::from(b & 0xf)]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

    #[test]
    fn minimal_json_is_what_serde_json_writes() {
        for value in ["plain", "quote\" back\\slash", "ctl\u{1}\u{1f}\u{7f}\n\r\t\u{8}\u{c}", "é ✓ 😀 <&>", ""] {
            let json = serde_json::to_string(value).expect("a str serializes");
            assert_eq!(json_escaped(value, Json::Minimal), json[1..json.len() - 1], "{value:?}");
        }
    }

    #[test]
    fn ascii_and_html_json_escape_as_python_and_go_do() {
        // Python: json.dumps("é😀") == '"\\u00e9\\ud83d\\ude00"'
        assert_eq!(json_escaped("é😀", Json::Ascii), "\\u00e9\\ud83d\\ude00");
        // Go: json.Marshal("<a&b>\u2028") == `"\u003ca\u0026b\u003e\u2028"`
        assert_eq!(json_escaped("<a&b>\u{2028}", Json::Html), "\\u003ca\\u0026b\\u003e\\u2028");
    }

    #[test]
    fn form_style_is_the_url_crates_byte_serialize() {
        let value = "a b*c-d.e_f~g/h+i=j%kü";
        let form: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        assert_eq!(percent(value.as_bytes(), PERCENT[2]), form);
        assert_eq!(percent(b"a/b c", PERCENT[0]), "a%2Fb%20c");
        assert_eq!(percent(b"a/b c", PERCENT[1]), "a%2fb%20c");
    }

    #[test]
    fn base64_spellings_are_found_at_every_alignment_inside_a_blob() {
        let value = b"s3cr3t-v4lue!";
        let mut seed = 7u32;
        let mut random = || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (seed >> 16) as u8
        };
        for before in 0..7 {
            for after in 0..4 {
                let mut blob: Vec<u8> = (0..before).map(|_| random()).collect();
                blob.extend_from_slice(value);
                blob.extend((0..after).map(|_| random()));
                let (std_at, url_at) =
                    (base64_at(&STANDARD_NO_PAD, value, before % 3), base64_at(&URL_SAFE_NO_PAD, value, before % 3));
                for encoded in [STANDARD.encode(&blob), STANDARD_NO_PAD.encode(&blob)] {
                    assert!(encoded.contains(&std_at), "{before} {after}: {std_at} in {encoded}");
                }
                for encoded in [URL_SAFE.encode(&blob), URL_SAFE_NO_PAD.encode(&blob)] {
                    assert!(encoded.contains(&url_at), "{before} {after}: {url_at} in {encoded}");
                }
            }
        }
    }

    #[test]
    fn spellings_are_distinct_and_cover_every_family() {
        let all = spellings("tok/en+ü");
        let unique: std::collections::HashSet<&String> = all.iter().collect();
        assert_eq!(unique.len(), all.len());
        for expected in
            ["tok/en+ü", "746f6b2f656e2bc3bc", "746F6B2F656E2BC3BC", "tok%2Fen%2B%C3%BC", "tok%2fen%2b%c3%bc"]
        {
            assert!(all.iter().any(|s| s == expected), "{expected} in {all:?}");
        }
        // An alphanumeric value is its own percent and JSON spelling; this one's base64 has no
        // `+` or `/` (one spelling per alignment for both alphabets) and its hex no letter (one
        // case): verbatim, three base64, one hex.
        assert_eq!(spellings("abcdefgh12").len(), 1 + 3 + 1);
    }
}
