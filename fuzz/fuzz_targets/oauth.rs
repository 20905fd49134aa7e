//! What the agent's OAuth client makes of an authorization server's answers
//! (`src/mcp/oauth.rs`): token responses, advertised grants, requested scopes, quoted text.
//!
//! Properties:
//! - a token response never panics the parser; an accepted one has a non-empty token and its
//!   `token_type`, when given, is Bearer; a refused one's message never contains the response's
//!   `access_token` (an error text reaches logs and status);
//! - the requested scopes are drawn from what the server asked and what the McpServer allows:
//!   within `allowed` when it is not empty, never `offline_access`, no duplicates;
//! - a grant refusal names a grant the server offered, never the one asked for as offered;
//! - quoted server text is bounded and free of control characters;
//! - a `WWW-Authenticate` challenge's summary (written to status by the operator) holds only its
//!   fixed words, scope tokens of the safe alphabet and a known error code: no server prose.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spear::fuzzing::{challenge_summary, grant_refusal, parse_token_response, quote, request_scopes};

#[derive(Arbitrary, Debug)]
struct Input {
    status: u16,
    body: Vec<u8>,
    asked: Vec<String>,
    allowed: Vec<String>,
    grants: String,
    grant: String,
    text: String,
}

fuzz_target!(|input: Input| {
    match parse_token_response(input.status, &input.body) {
        Ok((token, _)) => {
            assert!(!token.is_empty());
            let parsed: serde_json::Value = serde_json::from_slice(&input.body).expect("accepted JSON");
            if let Some(kind) = parsed.get("token_type").and_then(|t| t.as_str()) {
                assert!(kind.eq_ignore_ascii_case("bearer"), "{kind}");
            }
        }
        Err(message) => {
            let token = serde_json::from_slice::<serde_json::Value>(&input.body)
                .ok()
                .and_then(|v| v.get("access_token").and_then(|t| t.as_str()).map(str::to_string));
            if let Some(token) = token.filter(|t| t.len() >= 8) {
                assert!(!message.contains(&token), "the error echoes the token: {message}");
            }
        }
    }

    let scopes = request_scopes(&input.asked, &input.allowed);
    let mut seen = std::collections::BTreeSet::new();
    for scope in &scopes {
        assert_ne!(scope, "offline_access");
        assert!(seen.insert(scope.clone()), "duplicate {scope}");
        assert!(input.asked.contains(scope) || input.allowed.contains(scope));
        if !input.allowed.is_empty() {
            assert!(input.allowed.contains(scope), "{scope} is not allowed");
        }
    }

    if let Some(Some(why)) = grant_refusal(&input.grants, &input.grant) {
        assert!(!why.is_empty());
    }

    let summary = challenge_summary(&input.text);
    assert!(summary.len() <= 8 * 65 + 120, "{} bytes", summary.len());
    assert!(
        summary.bytes().all(|b| b.is_ascii_alphanumeric() || b" ,:._/-".contains(&b)),
        "outside the safe alphabet: {summary}"
    );
    let words = summary.split(", ").all(|part| {
        part.starts_with("scopes ")
            || part == "protected-resource metadata advertised"
            || part == "no protected-resource metadata in the challenge"
            || ["error invalid_token", "error insufficient_scope", "error invalid_request"].contains(&part)
    });
    assert!(words, "unexpected summary: {summary}");

    let quoted = quote(&input.text);
    assert!(quoted.len() <= 2 * 300 * 4 + 8, "{} bytes", quoted.len());
    assert!(!quoted.chars().any(|c| c == '\n' || c == '\r'));
});
