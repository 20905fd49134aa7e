//! What `spearlet auth login` and the agent make of what an authorization server, an MCP server
//! or a browser sends during the authorization-code flow (`src/mcp/oauth/authorization_code.rs`,
//! `src/mcp/oauth/grant.rs`, `src/mcp/login.rs`): the redirect's query, a stored grant, the
//! protected-resource metadata's `resource`, the authorization-server metadata's endpoints.
//!
//! Properties:
//! - a redirect gives a code only with exactly the expected `state` (once) and an `iss` that is
//!   the issuer byte for byte when present, and present when the metadata says it is sent;
//!   without the state it is stray; a refusal is bounded and has no control characters;
//! - a stored grant never panics the parser, and neither its `Debug` text nor an error names its
//!   refresh token;
//! - a resource that covers the server URL has the server's origin;
//! - accepted metadata names endpoints that may receive credentials for the server: https, or
//!   loopback http for a loopback server.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spear::fuzzing::{authorization_server, parse_grant, read_redirect, resource_covers};

#[derive(Arbitrary, Debug)]
struct Input {
    query: String,
    state: String,
    issuer: String,
    iss_supported: bool,
    grant: Vec<u8>,
    resource: String,
    server: String,
    metadata: Vec<u8>,
}

fn decoded(query: &str, key: &str) -> Vec<String> {
    url::form_urlencoded::parse(query.as_bytes()).filter(|(k, _)| k == key).map(|(_, v)| v.into_owned()).collect()
}

fn loopback(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

fuzz_target!(|input: Input| {
    let (kind, said) = read_redirect(&input.query, &input.state, &input.issuer, input.iss_supported);
    match kind {
        "code" => {
            assert_eq!(decoded(&input.query, "state"), [input.state.clone()], "a code without its state");
            let iss = decoded(&input.query, "iss");
            assert!(iss.len() <= 1, "a repeated iss was taken");
            assert!(iss.iter().all(|i| *i == input.issuer), "a code with a foreign iss");
            assert!(!input.iss_supported || iss.len() == 1, "a code without the promised iss");
            assert!(decoded(&input.query, "error").is_empty(), "an error taken as a code");
            assert!(!said.is_empty());
        }
        "stray" => {}
        _ => {
            assert!(said.len() <= 4 * 2 * 300 + 600, "{} bytes", said.len());
            assert!(!said.chars().any(char::is_control), "control characters in {said:?}");
        }
    }

    match parse_grant(&input.grant) {
        Ok((debug, Some(refresh))) if refresh.len() >= 8 => {
            assert!(!debug.contains(&refresh), "Debug shows the refresh token");
        }
        Err(message) => {
            let refresh = serde_json::from_slice::<serde_json::Value>(&input.grant)
                .ok()
                .and_then(|v| v.get("refresh_token").and_then(|t| t.as_str()).map(str::to_string));
            if let Some(refresh) = refresh.filter(|t| t.len() >= 8) {
                assert!(!message.contains(&refresh), "the error echoes the refresh token: {message}");
            }
        }
        _ => {}
    }

    if resource_covers(&input.resource, &input.server) == Some(true) {
        let (r, s) = (
            url::Url::parse(&input.resource).expect("a covering resource is a URL"),
            url::Url::parse(&input.server).expect("url"),
        );
        assert_eq!(r.origin(), s.origin(), "{} covers {}", input.resource, input.server);
    }

    if let Some(Ok((authorize, token, register))) = authorization_server(&input.metadata, &input.server) {
        let server = url::Url::parse(&input.server).expect("url");
        for endpoint in [Some(authorize), Some(token), register].into_iter().flatten() {
            let u = url::Url::parse(&endpoint).expect("an accepted endpoint is a URL");
            assert!(
                u.scheme() == "https" || (u.scheme() == "http" && loopback(&u) && loopback(&server)),
                "{endpoint} may not receive credentials for {server}"
            );
        }
    }
});
