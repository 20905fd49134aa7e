use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::json;

use super::*;

fn secret(value: &str, origin: &str, granted_to: Option<&str>) -> Secret {
    Secret { value: value.into(), origin: origin.into(), granted_to: granted_to.map(Into::into) }
}

fn one(value: &str) -> Redactor {
    Redactor::new([secret(value, "secret gh/token", Some("github"))])
}

/// A deterministic byte stream for surrounding bytes.
fn noise(seed: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (*seed >> 56) as u8
        })
        .collect()
}

#[test]
fn every_spelling_is_replaced_and_the_origin_named() {
    let value = "p@ss w/rd+é<1>\"x\n";
    let redactor = one(value);
    let all: Vec<String> = spellings_of(value).collect();
    assert!(all.len() > 12, "{all:?}");
    for spelling in &all {
        let text = format!("before {spelling} after");
        let out = redactor.redact(&text);
        assert_eq!(out, "before [redacted: secret gh/token] after", "{spelling}");
    }
    // The families by name, computed independently of `spell`.
    let json = serde_json::to_string(value).expect("a str serializes");
    let form: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
    let hex_lower: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    for text in [&json[1..json.len() - 1], &form, &hex_lower, &hex_lower.to_uppercase(), &STANDARD.encode(value)] {
        assert!(redactor.redact(text).contains("[redacted: secret gh/token]"), "{text}");
    }
}

#[test]
fn a_value_inside_a_longer_base64_blob_is_found_at_every_alignment() {
    let value = "ghp_n0t-a-real-t0ken-but-long-enough";
    let redactor = one(value);
    let mut seed = 1;
    for before in 0..9 {
        for after in 0..4 {
            let mut blob = noise(&mut seed, before);
            blob.extend_from_slice(value.as_bytes());
            blob.extend(noise(&mut seed, after));
            for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
                let encoded = engine.encode(&blob);
                let out = redactor.redact(&encoded);
                assert_eq!(
                    out.matches("[redacted: secret gh/token]").count(),
                    1,
                    "offset {before}, {after} after: {encoded}"
                );
                // What is left is the surrounding bytes' characters and at most two mixed ones a side.
                assert!(
                    out.len() <= "[redacted: secret gh/token]".len() + encoded.len() - 4 * value.len() / 3 + 4,
                    "{out}"
                );
            }
        }
    }
}

#[test]
fn text_without_a_value_is_borrowed() {
    let redactor = one("correct-horse-battery");
    let text = "an ordinary tool output with correct horse battery staple in it";
    assert!(matches!(redactor.redact(text), Cow::Borrowed(_)));
    assert!(matches!(redactor.redact_cut(text), Cow::Borrowed(_)));
    assert!(matches!(Redactor::empty().redact(text), Cow::Borrowed(_)));
    assert!(matches!(Redactor::default().redact_cut(text), Cow::Borrowed(_)));
    assert!(matches!(redactor.redact(""), Cow::Borrowed(_)));
}

#[test]
fn values_shorter_than_eight_bytes_are_ignored() {
    let redactor = Redactor::new([secret("admin12", "short", None)]);
    assert!(redactor.is_empty());
    assert_eq!(redactor.redact("user admin12"), "user admin12");
    assert_eq!(redactor.foreign_in("admin12", "github"), None);
    let redactor = Redactor::new([secret("admin123", "eight", None)]);
    assert!(!redactor.is_empty());
    assert_eq!(redactor.redact("user admin123"), "user [redacted: eight]");
}

#[test]
fn overlapping_values_redact_the_longer_and_leave_no_tail() {
    let redactor = Redactor::new([secret("abcdefgh12", "short", None), secret("abcdefgh1234", "long", None)]);
    assert_eq!(redactor.redact("x abcdefgh1234 y"), "x [redacted: long] y");
    assert_eq!(redactor.redact("x abcdefgh12 y"), "x [redacted: short] y");
    // Neither a prefix of the other: the union is redacted, named after the one that starts first.
    let redactor = Redactor::new([secret("xxxxSECRETA", "first", None), secret("SECRETAyyyyyyy", "second", None)]);
    assert_eq!(redactor.redact("<xxxxSECRETAyyyyyyy>"), "<[redacted: first]>");
    // Touching occurrences stay two markers.
    assert_eq!(redactor.redact("xxxxSECRETASECRETAyyyyyyy"), "[redacted: first][redacted: second]");
}

#[test]
fn a_cut_text_loses_a_trailing_prefix_of_four_bytes_or_more() {
    let redactor = one("supersecretvalue");
    assert_eq!(redactor.redact_cut("output: supe"), "output: [redacted: secret gh/token]");
    assert_eq!(redactor.redact_cut("output: supersecretvalu"), "output: [redacted: secret gh/token]");
    assert_eq!(redactor.redact_cut("output: sup"), "output: sup");
    assert!(matches!(redactor.redact_cut("output: sup"), Cow::Borrowed(_)));
    // A prefix of another spelling (hex) too, and a full value before the cut as well.
    assert_eq!(redactor.redact_cut("hex: 7375706572"), "hex: [redacted: secret gh/token]");
    assert_eq!(
        redactor.redact_cut("supersecretvalue and supersecr"),
        "[redacted: secret gh/token] and [redacted: secret gh/token]"
    );
    // `redact` alone leaves a prefix: it was not told the text was cut.
    assert_eq!(redactor.redact("output: supe"), "output: supe");
}

#[test]
fn a_cut_tail_is_found_whatever_the_value_repeats() {
    let redactor = one("aaaaaaaaaaaaaaab");
    // Only the last 15 bytes can be a proper prefix of the 16-byte value.
    let cut = redactor.redact_cut(&format!("x{}", "a".repeat(100))).into_owned();
    assert_eq!(cut, format!("x{}[redacted: secret gh/token]", "a".repeat(85)));
    let mut failure = Vec::new();
    let mut seed = 9;
    for _ in 0..2000 {
        let pattern: Vec<u8> = noise(&mut seed, 12).iter().map(|b| b"ab"[usize::from(b & 1)]).collect();
        let text: Vec<u8> = noise(&mut seed, 20).iter().map(|b| b"ab"[usize::from(b & 1)]).collect();
        let naive = (1..pattern.len()).rev().find(|&l| text.ends_with(&pattern[..l])).unwrap_or(0);
        let naive = if naive >= MIN_CUT_TAIL_BYTES { naive } else { 0 };
        let found = overlap(&text, &pattern, &mut failure);
        let found = if found >= MIN_CUT_TAIL_BYTES { found } else { 0 };
        assert_eq!(found, naive, "{:?} {:?}", String::from_utf8_lossy(&text), String::from_utf8_lossy(&pattern));
    }
}

#[test]
fn foreign_in_names_values_not_granted_to_the_server() {
    let redactor = Redactor::new([
        secret("github-value-1234", "secret gh/token", Some("github")),
        secret("slack-value-12345", "secret slack/token", Some("slack")),
        secret("upstream-key-9876", "upstream api key", None),
    ]);
    assert_eq!(redactor.foreign_in("use github-value-1234 please", "github"), None);
    assert_eq!(redactor.foreign_in("use github-value-1234 please", "slack"), Some("secret gh/token"));
    assert_eq!(redactor.foreign_in("slack-value-12345", "github"), Some("secret slack/token"));
    assert_eq!(redactor.foreign_in("upstream-key-9876", "github"), Some("upstream api key"));
    assert_eq!(redactor.foreign_in(&STANDARD.encode("xx upstream-key-9876"), "github"), Some("upstream api key"));
    assert_eq!(redactor.foreign_in("nothing held here", "github"), None);
    // A granted value next to a foreign one does not hide it.
    assert_eq!(redactor.foreign_in("github-value-1234upstream-key-9876", "github"), Some("upstream api key"));
}

#[test]
fn a_value_inside_a_granted_one_is_not_foreign_but_overlapping_one_is() {
    let redactor = Redactor::new([
        secret("{\"token\":\"tok-1234567890\"}", "secret gh/credentials", Some("github")),
        secret("tok-1234567890", "upstream api key", None),
        secret("shared-value-99", "secret shared/a", Some("a")),
        secret("shared-value-99", "secret shared/b", Some("b")),
    ]);
    assert_eq!(redactor.foreign_in("{\"token\":\"tok-1234567890\"}", "github"), None);
    assert_eq!(
        redactor.foreign_in("{\"token\":\"tok-1234567890\"} tok-1234567890", "github"),
        Some("upstream api key")
    );
    assert_eq!(redactor.foreign_in("shared-value-99", "a"), None);
    assert_eq!(redactor.foreign_in("shared-value-99", "b"), None);
    assert_eq!(redactor.foreign_in("shared-value-99", "c"), Some("secret shared/a"));
    // Overlapping but not inside: the foreign tail is not the server's.
    let redactor =
        Redactor::new([secret("xxxxSECRETA", "granted", Some("s")), secret("SECRETAyyyyyyy", "foreign", None)]);
    assert_eq!(redactor.foreign_in("xxxxSECRETAyyyyyyy", "s"), Some("foreign"));
}

#[test]
fn json_keys_and_nested_values_are_redacted_and_searched() {
    let redactor = Redactor::new([
        secret("github-value-1234", "secret gh/token", Some("github")),
        secret("upstream-key-9876", "upstream api key", None),
    ]);
    let mut value = json!({
        "github-value-1234": {"deep": ["ok", {"k": "Bearer upstream-key-9876 and github-value-1234"}]},
        "n": 1,
    });
    assert_eq!(redactor.redact_json(&mut value), 3);
    assert_eq!(
        value,
        json!({
            "[redacted: secret gh/token]": {"deep": ["ok", {"k": "Bearer [redacted: upstream api key] and [redacted: secret gh/token]"}]},
            "n": 1,
        })
    );
    assert_eq!(redactor.redact_json(&mut value), 0);
    let args = json!({"query": {"nested": ["x", "upstream-key-9876"]}});
    assert_eq!(redactor.foreign_in_json(&args, "github"), Some("upstream api key"));
    assert_eq!(redactor.foreign_in_json(&json!({"github-value-1234": 1}), "slack"), Some("secret gh/token"));
    assert_eq!(redactor.foreign_in_json(&json!({"github-value-1234": 1}), "github"), None);
}

#[test]
fn debug_never_prints_a_value() {
    let value = "github-value-1234";
    let s = secret(value, "secret gh/token", Some("github"));
    let redactor = Redactor::new([s.clone()]);
    for printed in [format!("{s:?}"), format!("{s:#?}"), format!("{redactor:?}"), format!("{redactor:#?}")] {
        assert!(!printed.contains(value) && !printed.contains("1234"), "{printed}");
        assert!(printed.contains("secret gh/token"), "{printed}");
    }
}

#[test]
fn origins_are_one_bracketed_line_of_at_most_128_characters() {
    let redactor = Redactor::new([
        secret("value-number-one", "evil]\n[redacted: x", None),
        secret("value-number-two", &"é".repeat(300), None),
    ]);
    assert_eq!(redactor.redact("value-number-one"), "[redacted: evil__[redacted: x]");
    assert_eq!(redactor.redact("value-number-two"), format!("[redacted: {}]", "é".repeat(128)));
}

#[test]
fn multibyte_values_are_cut_on_character_boundaries() {
    let redactor = one("ключ-секрет-значение");
    assert_eq!(redactor.redact("«ключ-секрет-значение»"), "«[redacted: secret gh/token]»");
    // A cut inside the value (on a character boundary, as a &str must be).
    assert_eq!(redactor.redact_cut("«ключ-се"), "«[redacted: secret gh/token]");
}

#[test]
fn large_spelling_sets_still_build_and_search() {
    // A PEM-sized value: thousands of automaton states.
    let mut seed = 3;
    let value: String = noise(&mut seed, 3000).iter().map(|b| char::from(b'A' + b % 26)).collect();
    let redactor = Redactor::new([secret(&value, "secret app/key.pem", Some("app"))]);
    let text = format!("key: {value}\n");
    assert_eq!(redactor.redact(&text), "key: [redacted: secret app/key.pem]\n");
    assert_eq!(redactor.redact_cut(&text[..text.len() - 10]), "key: [redacted: secret app/key.pem]");
}
