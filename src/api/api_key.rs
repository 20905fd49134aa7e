//! The pod's API key: the bearer an app container sends to the agent's doors (chat completions,
//! `/mcp`, gRPC) so that nothing else in the pod can call them. The doors listen on loopback,
//! which keeps other pods out but not the pod's own MCP server sidecars: they share its network
//! namespace, and a hostile server image could otherwise call every tool of the profile and
//! spend the upstream model key.
//!
//! - The webhook draws one key per pod (256 bits from the OS, base64url) and sets it as
//!   `SPEAR_API_KEY` on the agent and on the pod's own containers, never on a sidecar. It is
//!   first in their env, so the pod spec can pass it on: `OPENAI_API_KEY: $(SPEAR_API_KEY)`.
//! - The agent admits a request when its `Authorization` is `Bearer <key>` (scheme in any case,
//!   RFC 7235), compared in constant time. Local mode has no key unless one is set: the doors
//!   then take any caller that reaches loopback, as before.
//!
//! Pure; the agent's middleware is `agent::key_guard`.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use subtle::ConstantTimeEq as _;

/// Shortest key the agent accepts: a guessable key would be no key.
const MIN_LEN: usize = 16;
/// Longest: a header value, not a document.
const MAX_LEN: usize = 512;

/// The key. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Arc<str>);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Why a key was not accepted as one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidApiKey {
    #[error("is {0} characters: use at least {MIN_LEN} (for example `openssl rand -base64 32`)")]
    TooShort(usize),
    #[error("is {0} characters: use at most {MAX_LEN}")]
    TooLong(usize),
    #[error("holds a character outside A-Z a-z 0-9 - . _ ~ + / = (a bearer token's alphabet, RFC 6750)")]
    Alphabet,
}

/// Why a request was not admitted (the doors answer 401, or gRPC `UNAUTHENTICATED`).
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum Unauthenticated {
    #[error(
        "this agent requires its API key: send `Authorization: Bearer $SPEAR_API_KEY` (the webhook sets SPEAR_API_KEY in the pod's containers)"
    )]
    Missing,
    #[error("the Authorization header is not `Bearer <key>`: send `Authorization: Bearer $SPEAR_API_KEY`")]
    NotBearer,
    #[error("the bearer token is not this agent's API key: send this pod's $SPEAR_API_KEY")]
    WrongKey,
}

impl ApiKey {
    /// A fresh key: 32 bytes from the OS, base64url without padding (43 characters).
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        Ok(ApiKey(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes).into()))
    }

    /// A key given by a person (`SPEAR_API_KEY`): long enough to be unguessable, and sendable as a
    /// bearer token as it is.
    pub fn parse(value: &str) -> Result<Self, InvalidApiKey> {
        let len = value.chars().count();
        if len < MIN_LEN {
            return Err(InvalidApiKey::TooShort(len));
        }
        if len > MAX_LEN {
            return Err(InvalidApiKey::TooLong(len));
        }
        if !value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b)) {
            return Err(InvalidApiKey::Alphabet);
        }
        Ok(ApiKey(value.into()))
    }

    /// The key itself, for the env var that delivers it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `authorization` (the request's `Authorization` header, as bytes) carries this key.
    pub fn admits(&self, authorization: Option<&[u8]>) -> Result<(), Unauthenticated> {
        let value = authorization.ok_or(Unauthenticated::Missing)?;
        let token = bearer_token(value).ok_or(Unauthenticated::NotBearer)?;
        // Constant time over the key's length; a length mismatch says only that it is wrong.
        if bool::from(token.ct_eq(self.0.as_bytes())) { Ok(()) } else { Err(Unauthenticated::WrongKey) }
    }
}

/// The token of `Bearer <token>`: scheme in any case, one or more spaces, no trailing text.
pub(crate) fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii_start();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ApiKey {
        ApiKey::parse("k3y-of-the-pod_0123456789").expect("a valid key")
    }

    #[test]
    fn the_key_in_a_bearer_header_is_admitted_in_any_scheme_case() {
        for header in [
            "Bearer k3y-of-the-pod_0123456789",
            "bearer k3y-of-the-pod_0123456789",
            "BEARER  k3y-of-the-pod_0123456789",
        ] {
            assert_eq!(key().admits(Some(header.as_bytes())), Ok(()), "{header}");
        }
    }

    #[test]
    fn anything_but_the_exact_key_is_refused() {
        let cases: &[(Option<&str>, Unauthenticated)] = &[
            (None, Unauthenticated::Missing),
            (Some(""), Unauthenticated::NotBearer),
            (Some("k3y-of-the-pod_0123456789"), Unauthenticated::NotBearer),
            (Some("Basic k3y-of-the-pod_0123456789"), Unauthenticated::NotBearer),
            (Some("Bearerk3y-of-the-pod_0123456789"), Unauthenticated::NotBearer),
            (Some("Bearer "), Unauthenticated::NotBearer),
            (Some("Bearer k3y-of-the-pod_012345678"), Unauthenticated::WrongKey),
            (Some("Bearer k3y-of-the-pod_01234567890"), Unauthenticated::WrongKey),
            (Some("Bearer k3y-of-the-pod_0123456789 "), Unauthenticated::WrongKey),
            (Some("Bearer K3Y-OF-THE-POD_0123456789"), Unauthenticated::WrongKey),
            (Some("Bearer k3y-of-the-pod_0123456789,Bearer x"), Unauthenticated::WrongKey),
        ];
        for (header, expected) in cases {
            assert_eq!(key().admits(header.map(str::as_bytes)), Err(*expected), "{header:?}");
        }
    }

    #[test]
    fn random_keys_are_valid_distinct_and_never_printed() {
        let (a, b) = (ApiKey::random().expect("the OS has randomness"), ApiKey::random().expect("again"));
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 43);
        assert_eq!(ApiKey::parse(a.expose()), Ok(a.clone()));
        assert!(!format!("{a:?}").contains(a.expose()));
    }

    #[test]
    fn keys_given_by_a_person_are_checked() {
        assert_eq!(ApiKey::parse("short"), Err(InvalidApiKey::TooShort(5)));
        assert_eq!(ApiKey::parse(&"a".repeat(513)), Err(InvalidApiKey::TooLong(513)));
        assert_eq!(ApiKey::parse("sixteen chars ok"), Err(InvalidApiKey::Alphabet));
        assert_eq!(ApiKey::parse("sixteen-chars-ok\n"), Err(InvalidApiKey::Alphabet));
        assert!(ApiKey::parse("c2l4dGVlbi1jaGFycw==").is_ok());
    }
}
