//! What an agent makes of a grant Secret (`src/mcp/oauth/grant_secret.rs`), which anyone who may
//! write Secrets of the namespace shapes: its `mcp.spear.dev/allowed-servers` annotation, its
//! renewal claim, its refusal note and its `grant.json`.
//!
//! Properties:
//! - the grant is handed over only when the annotation lists the server (or `*`) as one of its
//!   comma-separated, trimmed items, and the data parses as a grant;
//! - another agent's claim holds only when it reads `<holder> <unix seconds>`, names someone other
//!   than this agent, and is less than 30 s old;
//! - a refusal note is what the condition shows, as written.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spear::fuzzing::{grant_secret, parse_grant};

#[derive(Arbitrary, Debug)]
struct Input {
    allowed: Option<String>,
    claim: Option<String>,
    refused: Option<String>,
    data: Vec<u8>,
    server: String,
    holder: String,
    now: u64,
}

fuzz_target!(|input: Input| {
    let (given, claimed_by, refused) = grant_secret(
        input.allowed.as_deref(),
        input.claim.as_deref(),
        input.refused.as_deref(),
        &input.data,
        (&input.server, &input.holder, input.now),
    );
    if given {
        let listed = input
            .allowed
            .as_deref()
            .is_some_and(|list| list.split(',').map(str::trim).any(|item| item == "*" || item == input.server));
        assert!(listed, "handed to {:?} by {:?}", input.server, input.allowed);
        assert!(parse_grant(&input.data).is_ok(), "a grant that does not parse was handed over");
    }
    if let Some(by) = claimed_by {
        let claim = input.claim.as_deref().expect("a claim without the annotation");
        let (named, at) = claim.rsplit_once(' ').expect("a claim without its time");
        let at: u64 = at.parse().expect("a claim whose time is not a number");
        assert_eq!(named, by);
        assert_ne!(by, input.holder, "this agent's own claim held it off");
        assert!(input.now < at.saturating_add(30), "a stale claim held: {claim:?} at {}", input.now);
    }
    assert_eq!(refused, input.refused, "the refusal note");
});
