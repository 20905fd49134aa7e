//! Who is calling the gateway: the bearer token read, a TokenReview's answer turned into a
//! [`Caller`], and the cache of answers. Pure; `token_review.rs` asks the API server.
//!
//! - **The token is never kept.** The cache is keyed by its SHA-256; logs, errors and audit lines
//!   name the caller, never the token.
//! - **Bounded cache.** [`CACHE_ENTRIES`] answers at most. An accepted token is reused for
//!   [`ACCEPTED_TTL`], never past its own `exp` (read from the JWT's payload without verifying
//!   it: it can only shorten the time, the API server verified the token). A refused one is
//!   reused for [`REFUSED_TTL`], so one bad token sent in a loop costs one review per 5 s. When
//!   full, expired answers go first, then the oldest.
//! - **Audience.** The review asks for the gateway's audience; an answer that does not name it
//!   is a refusal even when authenticated (a token for the API server is not one for the gateway).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::policy::binding::Caller;

/// Answers the cache keeps at most.
pub const CACHE_ENTRIES: usize = 10_000;
/// How long an accepted token is reused (a deleted ServiceAccount's token stops working within it).
pub const ACCEPTED_TTL: Duration = Duration::from_secs(60);
/// How long a refused token is reused.
pub const REFUSED_TTL: Duration = Duration::from_secs(5);
/// Longest token read; a projected service-account token is about 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a request gets 401.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    #[error(
        "no bearer token: send Authorization: Bearer <token> (a projected ServiceAccount token with the gateway's audience)"
    )]
    Missing,
    #[error("the Authorization header is not a bearer token")]
    Malformed,
    #[error("the token is not valid for this gateway: {0}")]
    Refused(String),
}

impl Unauthenticated {
    /// RFC 6750's `error` value of the challenge, when the client sent something.
    pub fn error_code(&self) -> Option<&'static str> {
        match self {
            Unauthenticated::Missing => None,
            Unauthenticated::Malformed => Some("invalid_request"),
            Unauthenticated::Refused(_) => Some("invalid_token"),
        }
    }
}

/// The token of an `Authorization` header: `Bearer <token>` with RFC 6750's token characters
/// (`A-Z a-z 0-9 - . _ ~ + /`, then `=` padding), at most [`MAX_TOKEN_BYTES`].
pub fn bearer(authorization: Option<&[u8]>) -> Result<&str, Unauthenticated> {
    let value = authorization.ok_or(Unauthenticated::Missing)?;
    let token = crate::api::api_key::bearer_token(value).ok_or(Unauthenticated::Malformed)?;
    let body_len = token.iter().rposition(|b| *b != b'=').map_or(0, |i| i + 1);
    let (body, padding) = token.split_at(body_len);
    let token_char = |b: &u8| b.is_ascii_alphanumeric() || b"-._~+/".contains(b);
    if body.is_empty() || token.len() > MAX_TOKEN_BYTES || !body.iter().all(token_char) || padding.len() > 2 {
        return Err(Unauthenticated::Malformed);
    }
    std::str::from_utf8(token).map_err(|_| Unauthenticated::Malformed)
}

/// The `exp` claim of a JWT, unverified (seconds since the epoch); `None` for anything else.
pub fn unverified_expiry(token: &str) -> Option<u64> {
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || payload.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_u64()
}

/// A TokenReview's answer, as the API server gave it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Review {
    pub authenticated: bool,
    pub username: Option<String>,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    /// The audiences the token is valid for among those asked.
    pub audiences: Vec<String>,
    /// The authenticator's error, when it gave one.
    pub error: Option<String>,
}

/// The caller a review admits for `audience`, or why not. The authenticator's own error text is
/// not passed on (it may quote the token's claims); the log has it.
pub fn admit(review: Review, audience: &str) -> Result<Caller, Unauthenticated> {
    if !review.authenticated {
        return Err(Unauthenticated::Refused(
            "the API server did not authenticate it (expired, revoked, or not a token it issued)".into(),
        ));
    }
    if !review.audiences.iter().any(|a| a == audience) {
        return Err(Unauthenticated::Refused(format!(
            "its audience is not {audience:?}: request a token with that audience"
        )));
    }
    match review.username.filter(|u| !u.is_empty()) {
        Some(username) => Ok(Caller { username, uid: review.uid, groups: review.groups }),
        None => Err(Unauthenticated::Refused("the API server named no user".into())),
    }
}

/// The cache key of a token.
pub type TokenKey = [u8; 32];

/// The key of `token`: its SHA-256.
pub fn token_key(token: &str) -> TokenKey {
    Sha256::digest(token.as_bytes()).into()
}

#[derive(Debug)]
struct Cached {
    answer: Result<Caller, Unauthenticated>,
    until: Instant,
    stored: Instant,
}

/// Recent answers, by token key.
#[derive(Debug, Default)]
pub struct AnswerCache {
    entries: HashMap<TokenKey, Cached>,
}

impl AnswerCache {
    /// The answer for `key` still valid at `now`.
    pub fn get(&self, key: &TokenKey, now: Instant) -> Option<Result<Caller, Unauthenticated>> {
        self.entries.get(key).filter(|c| c.until > now).map(|c| c.answer.clone())
    }

    /// Keeps `answer` for `token`: an acceptance for [`ACCEPTED_TTL`] or until the token's `exp`
    /// (`now_unix`: seconds since the epoch at `now`), a refusal for [`REFUSED_TTL`].
    pub fn put(&mut self, token: &str, answer: Result<Caller, Unauthenticated>, now: Instant, now_unix: u64) {
        let ttl = match &answer {
            Ok(_) => match unverified_expiry(token) {
                Some(exp) if exp <= now_unix => return,
                Some(exp) => ACCEPTED_TTL.min(Duration::from_secs(exp - now_unix)),
                None => ACCEPTED_TTL,
            },
            Err(_) => REFUSED_TTL,
        };
        if self.entries.len() >= CACHE_ENTRIES {
            self.entries.retain(|_, c| c.until > now);
        }
        if self.entries.len() >= CACHE_ENTRIES
            && let Some(oldest) = self.entries.iter().min_by_key(|(_, c)| c.stored).map(|(k, _)| *k)
        {
            self.entries.remove(&oldest);
        }
        self.entries.insert(token_key(token), Cached { answer, until: now + ttl, stored: now });
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &serde_json::Value) -> String {
        let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!("{}.{}.{}", b64(br#"{"alg":"RS256"}"#), b64(claims.to_string().as_bytes()), b64(b"sig"))
    }

    fn caller(name: &str) -> Caller {
        Caller { username: name.into(), uid: None, groups: vec![] }
    }

    #[test]
    fn bearer_takes_rfc_6750_tokens_only() {
        assert_eq!(bearer(Some(b"Bearer abc.DEF-_~+/==")), Ok("abc.DEF-_~+/=="));
        assert_eq!(bearer(Some(b"bearer  abc")), Ok("abc"));
        assert_eq!(bearer(None), Err(Unauthenticated::Missing));
        for bad in [
            &b"Basic abc"[..],
            b"Bearer",
            b"Bearer ",
            b"Bearer a b",
            b"Bearer ===",
            b"Bearer a===",
            b"Bearer a=b",
            b"Bearer a\"b",
            b"Bearer \xff\xfe",
            b"Bearer a,b",
        ] {
            assert_eq!(bearer(Some(bad)), Err(Unauthenticated::Malformed), "{:?}", String::from_utf8_lossy(bad));
        }
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(bearer(Some(long.as_bytes())), Err(Unauthenticated::Malformed));
    }

    #[test]
    fn expiry_is_read_from_a_jwt_and_nothing_else() {
        assert_eq!(unverified_expiry(&jwt(&serde_json::json!({"exp": 1_900_000_000u64}))), Some(1_900_000_000));
        assert_eq!(unverified_expiry(&jwt(&serde_json::json!({"exp": "soon"}))), None);
        assert_eq!(unverified_expiry("opaque-token"), None);
        assert_eq!(unverified_expiry("a.b.c.d"), None);
        assert_eq!(unverified_expiry("a.!!!.c"), None);
    }

    #[test]
    fn a_review_admits_only_an_authenticated_user_of_the_gateways_audience() {
        let ok = Review {
            authenticated: true,
            username: Some("system:serviceaccount:team:app".into()),
            audiences: vec!["spear-gateway".into()],
            ..Review::default()
        };
        assert_eq!(admit(ok.clone(), "spear-gateway").expect("admitted").username, "system:serviceaccount:team:app");
        assert!(
            admit(Review { audiences: vec!["https://kubernetes.default.svc".into()], ..ok.clone() }, "spear-gateway")
                .is_err()
        );
        assert!(admit(Review { authenticated: false, ..ok.clone() }, "spear-gateway").is_err());
        assert!(admit(Review { username: Some(String::new()), ..ok.clone() }, "spear-gateway").is_err());
        let with_error = Review { authenticated: false, error: Some("token claims: secret-ish".into()), ..ok };
        let refusal = admit(with_error, "spear-gateway").expect_err("refused").to_string();
        assert!(!refusal.contains("secret-ish"), "{refusal}");
    }

    #[test]
    fn the_cache_keeps_answers_for_their_time_and_never_past_the_tokens_exp() {
        let now = Instant::now();
        let unix = 1_800_000_000;
        let mut cache = AnswerCache::default();
        let long_lived = jwt(&serde_json::json!({"exp": unix + 3600}));
        let short_lived = jwt(&serde_json::json!({"exp": unix + 10}));
        let expired = jwt(&serde_json::json!({"exp": unix - 1}));
        cache.put(&long_lived, Ok(caller("a")), now, unix);
        cache.put(&short_lived, Ok(caller("b")), now, unix);
        cache.put(&expired, Ok(caller("c")), now, unix);
        cache.put("bad", Err(Unauthenticated::Refused("no".into())), now, unix);
        let later = |s| now + Duration::from_secs(s);
        assert!(cache.get(&token_key(&long_lived), later(59)).is_some());
        assert!(cache.get(&token_key(&long_lived), later(60)).is_none());
        assert!(cache.get(&token_key(&short_lived), later(9)).is_some());
        assert!(cache.get(&token_key(&short_lived), later(10)).is_none());
        assert!(cache.get(&token_key(&expired), now).is_none());
        assert!(cache.get(&token_key("bad"), later(4)).is_some_and(|a| a.is_err()));
        assert!(cache.get(&token_key("bad"), later(5)).is_none());
    }

    #[test]
    fn the_cache_stays_bounded_under_many_distinct_tokens() {
        let now = Instant::now();
        let mut cache = AnswerCache::default();
        for i in 0..CACHE_ENTRIES + 500 {
            cache.put(&format!("token-{i}"), Ok(caller("a")), now + Duration::from_micros(i as u64), 0);
        }
        assert_eq!(cache.len(), CACHE_ENTRIES);
        // The oldest went first; the newest is there.
        assert!(cache.get(&token_key("token-0"), now).is_none());
        assert!(cache.get(&token_key(&format!("token-{}", CACHE_ENTRIES + 499)), now).is_some());
    }
}
