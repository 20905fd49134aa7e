//! `${ENV:...}` templates (`src/api/env_ref.rs`) and their rewriting for the kubelet's `$(VAR)`
//! expansion (`src/operator/inject.rs`, `kubelet_value` and `escape_dollars`).
//!
//! The input is a server sidecar's `stdio.env` list and one argv entry, built from tokens that
//! mix plain text with `$`, `$$`, `$(`, `)`, `${`, `$${`, `}` and `${ENV:NAME[:-default]}`.
//! The sidecar's env is what the webhook writes: `HOME` and `TMPDIR` first (unless the list sets
//! them), then the list in order, each `value` rewritten with the variables defined before it.
//!
//! Properties, with [`kubelet_expand`] a reference of the kubelet's expansion:
//! - round trip: for every valid template, what the kubelet expands the rewritten value to equals
//!   what the agent would expand the template to (`Template::expand`) in the same environment
//!   (the variables defined before it, as the module header's rule says);
//! - a reference that is unset before it and has no default stays `$(NAME)` (the kubelet leaves
//!   an unknown `$(NAME)` as is) and the webhook warns;
//! - an invalid template is passed on literally (the kubelet turns it back into the exact text),
//!   with a warning;
//! - an argv entry reaches the process exactly (`escape_dollars`);
//! - the rewritten text uses only `$$` and `$(NAME)`: never a `$` the kubelet would read any
//!   other way.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spear::fuzzing::{TemplatePart, escape_dollars, expand_template, kubelet_value, parse_template};

/// A few names, so references hit defined and undefined variables; `HOME` and `TMPDIR` are set by
/// the webhook itself.
const NAMES: &[&str] = &["TOKEN", "A", "HOME", "TMPDIR", "_b2", "UNSET"];

#[derive(Arbitrary, Debug)]
enum Token {
    Text(String),
    Dollar,
    DollarDollar,
    Paren(u8),
    CloseParen,
    OpenBrace,
    EscapedBrace,
    CloseBrace,
    Ref(u8),
    RefDefault(u8, String),
    BadRef(String),
}

fn name(i: u8) -> &'static str {
    NAMES[usize::from(i) % NAMES.len()]
}

fn render(tokens: &[Token]) -> String {
    let mut out = String::new();
    for token in tokens {
        match token {
            Token::Text(t) => out.push_str(t),
            Token::Dollar => out.push('$'),
            Token::DollarDollar => out.push_str("$$"),
            Token::Paren(i) => {
                out.push_str("$(");
                out.push_str(name(*i));
            }
            Token::CloseParen => out.push(')'),
            Token::OpenBrace => out.push_str("${"),
            Token::EscapedBrace => out.push_str("$${"),
            Token::CloseBrace => out.push('}'),
            Token::Ref(i) => out.push_str(&format!("${{ENV:{}}}", name(*i))),
            Token::RefDefault(i, d) => out.push_str(&format!("${{ENV:{}:-{d}}}", name(*i))),
            Token::BadRef(t) => out.push_str(&format!("${{{t}}}")),
        }
    }
    out
}

#[derive(Arbitrary, Debug)]
struct Var {
    name: u8,
    /// `Some`: a `value`; `None`: a `valueFrom` (a Secret), whose value the kubelet does not expand.
    value: Option<Vec<Token>>,
    secret: String,
}

#[derive(Arbitrary, Debug)]
struct Input {
    env: Vec<Var>,
    arg: Vec<Token>,
    raw: String,
}

/// The kubelet's `$(VAR)` expansion (k8s.io/kubernetes third_party/forked/golang/expansion),
/// byte by byte: `$$` is `$`; `$(NAME)` is NAME's value if `env` has it, else left as
/// `$(NAME)`; a `$(` without `)` is kept; `$` before anything else is kept with that character;
/// a final `$` is kept. Returns the text and whether a `$` was read as neither `$$` nor `$(`.
fn kubelet_expand(input: &str, env: &BTreeMap<String, String>) -> (String, bool) {
    let bytes = input.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut other = false;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            match bytes[i + 1] {
                b'$' => {
                    out.push(b'$');
                    i += 2;
                }
                b'(' => match bytes[i + 2..].iter().position(|&b| b == b')') {
                    Some(close) => {
                        let name = &input[i + 2..i + 2 + close];
                        match env.get(name) {
                            Some(value) => out.extend_from_slice(value.as_bytes()),
                            None => out.extend_from_slice(format!("$({name})").as_bytes()),
                        }
                        i += 2 + close + 1;
                    }
                    None => {
                        // Go keeps "$(" and goes on after the "$".
                        out.extend_from_slice(b"$(");
                        i += 2;
                        other = true;
                    }
                },
                next => {
                    // Go writes "$" and the byte (as a rune: bytes >= 0x80 come out re-encoded).
                    out.push(b'$');
                    out.push(next);
                    i += 2;
                    other = true;
                }
            }
        } else {
            if bytes[i] == b'$' {
                other = true;
            }
            out.push(bytes[i]);
            i += 1;
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), other)
}

fuzz_target!(|input: Input| {
    // The argv entry: literal, whatever it holds.
    for arg in [render(&input.arg), input.raw.clone()] {
        let written = escape_dollars(&arg);
        let (seen, other) = kubelet_expand(&written, &BTreeMap::new());
        assert!(!other, "escaped argv {written:?} has a lone $");
        assert_eq!(seen, arg, "argv entry changed by the kubelet");
    }

    // The sidecar's env as the webhook writes it, expanded as the kubelet does.
    let mut defined: Vec<&str> = Vec::new();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for preset in ["HOME", "TMPDIR"] {
        if !input.env.iter().any(|v| name(v.name) == preset) {
            defined.push(preset);
            env.insert(preset.to_string(), "/tmp".to_string());
        }
    }
    let values: Vec<Option<String>> = input
        .env
        .iter()
        .enumerate()
        .map(|(i, v)| v.value.as_ref().map(|t| if i == 0 { format!("{}{}", render(t), input.raw) } else { render(t) }))
        .collect();
    for (var, value) in input.env.iter().zip(values) {
        let var_name = name(var.name);
        let Some(value) = value else {
            defined.push(var_name);
            env.insert(var_name.to_string(), var.secret.clone());
            continue;
        };
        let (written, warnings) = kubelet_value(&value, &defined);
        let (kubelet, other) = kubelet_expand(&written, &env);
        assert!(!other, "{value:?} was written as {written:?}, which has a lone $");
        let lookup = |n: &str| env.get(n).cloned();
        match expand_template(&value, lookup) {
            None => {
                assert!(parse_template(&value).is_err());
                assert!(!warnings.is_empty(), "an invalid template {value:?} without a warning");
                assert_eq!(kubelet, value, "an invalid template is not passed on literally");
            }
            Some(Ok(agent)) => {
                assert_eq!(kubelet, agent, "{value:?}: kubelet sees {written:?} as {kubelet:?}, the agent {agent:?}");
            }
            Some(Err(missing)) => {
                assert!(!env.contains_key(&missing));
                assert!(warnings.iter().any(|w| w.contains(&missing)), "no warning for {missing}");
                assert!(written.contains(&format!("$({missing})")), "{written:?} lost $({missing})");
            }
        }
        // Every reference with a default expands in any environment.
        if let Ok(parts) = parse_template(&value) {
            let all_defaults = parts.iter().all(|p| !matches!(p, TemplatePart::Env { default: None, .. }));
            if all_defaults {
                assert!(matches!(expand_template(&value, |_| None), Some(Ok(_))));
            }
        }
        defined.push(var_name);
        env.insert(var_name.to_string(), kubelet);
    }
});
