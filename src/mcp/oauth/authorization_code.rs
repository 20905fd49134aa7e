//! The authorization-code flow's decisions (OAuth 2.1 with PKCE, as the MCP authorization spec
//! requires): the authorization request a person's browser is sent to, and the redirect that
//! comes back to the loopback listener of `spearlet auth login`. Pure; the I/O is
//! `cli::spearlet::auth`.
//!
//! - **PKCE S256 only.** The verifier is 32 random bytes (43 characters, RFC 7636 section 4.1);
//!   an authorization server that advertises `code_challenge_methods_supported` without `S256`
//!   is refused, as the MCP spec says a client must. One that advertises nothing is tried (the
//!   2025-03-26 revision's servers often do not say).
//! - **The redirect is untrusted.** Anything on the machine can reach the loopback port, and the
//!   browser follows whatever the authorization server (or a page that raced it) sends. A
//!   redirect counts only with the request's `state` (compared in constant time); then an
//!   `error` is the authorization server's refusal, and a `code` must come with the right
//!   `iss` (RFC 9207): present, it must be the issuer the request went to (simple string
//!   comparison, section 2.4); absent, it is refused when the metadata says the server sends it
//!   (`authorization_response_iss_parameter_supported`), since a mix-up attack strips it.
//! - **Bounded.** A query longer than [`MAX_REDIRECT_QUERY_BYTES`] is refused before parsing;
//!   what the authorization server wrote in `error_description` is quoted, shortened, without
//!   control characters.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::Digest as _;

use super::quote;

/// Bytes of a redirect's query read at most (codes and states are short; a browser's URL limit
/// is larger, but nothing legitimate comes near this).
pub(crate) const MAX_REDIRECT_QUERY_BYTES: usize = 8 * 1024;

/// A PKCE pair (RFC 7636): the verifier stays with the client, the S256 challenge goes in the
/// authorization request. `Debug` shows neither.
pub(crate) struct Pkce {
    pub(crate) verifier: String,
    pub(crate) challenge: String,
}

impl std::fmt::Debug for Pkce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pkce(..)")
    }
}

impl Pkce {
    /// A fresh pair from the operating system's randomness.
    pub(crate) fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        Ok(Self::from_verifier(URL_SAFE_NO_PAD.encode(bytes)))
    }

    /// The pair for `verifier` (RFC 7636 section 4.2: `BASE64URL(SHA256(verifier))`).
    pub(crate) fn from_verifier(verifier: String) -> Self {
        let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()));
        Pkce { verifier, challenge }
    }
}

/// A `state` value: 32 random bytes, URL-safe.
pub(crate) fn random_state() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// Why the authorization server cannot be used for the flow, from its metadata's
/// `code_challenge_methods_supported` (`None`: absent).
pub(crate) fn pkce_refusal(methods: Option<&[String]>) -> Option<String> {
    let methods = methods?;
    if methods.iter().any(|m| m == "S256") {
        return None;
    }
    let shown: Vec<String> = methods.iter().take(5).map(|m| quote(m)).collect();
    Some(format!(
        "the authorization server does not support PKCE with S256 (its code_challenge_methods_supported: [{}]); \
         the MCP authorization spec requires it, and spearlet does not authorize without it",
        shown.join(", ")
    ))
}

/// What goes in the authorization request.
#[derive(Clone, Debug)]
pub(crate) struct AuthorizationRequest<'a> {
    pub(crate) client_id: &'a str,
    pub(crate) redirect_uri: &'a str,
    pub(crate) code_challenge: &'a str,
    pub(crate) state: &'a str,
    /// Space-joined scopes; empty: the parameter is left out.
    pub(crate) scope: &'a str,
    /// The MCP server's URL (RFC 8707 resource indicator).
    pub(crate) resource: &'a str,
}

/// The URL the person's browser opens: `endpoint` (the metadata's `authorization_endpoint`)
/// with the request's parameters added to any it already has.
pub(crate) fn authorization_url(endpoint: &url::Url, request: &AuthorizationRequest<'_>) -> url::Url {
    let mut url = endpoint.clone();
    url.set_fragment(None);
    {
        let mut query = url.query_pairs_mut();
        query
            .append_pair("response_type", "code")
            .append_pair("client_id", request.client_id)
            .append_pair("redirect_uri", request.redirect_uri)
            .append_pair("code_challenge", request.code_challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("state", request.state)
            .append_pair("resource", request.resource);
        if !request.scope.is_empty() {
            query.append_pair("scope", request.scope);
        }
    }
    url
}

/// What the login expects of the redirect.
#[derive(Clone, Debug)]
pub(crate) struct ExpectedRedirect<'a> {
    pub(crate) state: &'a str,
    /// The issuer the request went to.
    pub(crate) issuer: &'a str,
    /// The metadata's `authorization_response_iss_parameter_supported`.
    pub(crate) iss_supported: bool,
}

/// How a redirect to the loopback listener ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// The authorization code (to exchange at the token endpoint).
    Code(String),
    /// Not this flow's redirect (no or another `state`): ignored, the listener keeps waiting.
    Stray,
    /// This flow's redirect, refused: the login ends with this message.
    Refused(String),
}

/// Reads the query of a request to the redirect URI (see the module header).
pub(crate) fn read_redirect(query: &str, expected: &ExpectedRedirect<'_>) -> Redirect {
    if query.len() > MAX_REDIRECT_QUERY_BYTES {
        return Redirect::Stray;
    }
    let mut state = None;
    let mut code = None;
    let mut iss = None;
    let mut error = None;
    let mut description = None;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let slot = match key.as_ref() {
            "state" => &mut state,
            "code" => &mut code,
            "iss" => &mut iss,
            "error" => &mut error,
            "error_description" => &mut description,
            _ => continue,
        };
        // A repeated parameter is ambiguous (RFC 6749 section 3.1): the redirect is not used.
        if slot.replace(value.into_owned()).is_some() {
            return if key == "state" {
                Redirect::Stray
            } else {
                Redirect::Refused(format!("the redirect repeats the {key} parameter"))
            };
        }
    }
    let Some(state) = state else { return Redirect::Stray };
    if !bool::from(subtle::ConstantTimeEq::ct_eq(state.as_bytes(), expected.state.as_bytes())) {
        return Redirect::Stray;
    }
    match iss.as_deref() {
        Some(got) if got != expected.issuer => {
            return Redirect::Refused(format!(
                "the redirect's iss {} is not the issuer the request went to ({}): an authorization response \
                 from another authorization server (RFC 9207 mix-up) is not used",
                quote(got),
                quote(expected.issuer)
            ));
        }
        None if expected.iss_supported && error.is_none() => {
            return Redirect::Refused(format!(
                "the redirect has no iss parameter, though {}'s metadata says it sends one \
                 (authorization_response_iss_parameter_supported): the response is not used (RFC 9207)",
                quote(expected.issuer)
            ));
        }
        _ => {}
    }
    if let Some(error) = error {
        let description = description.map(|d| format!(": {}", quote(&d))).unwrap_or_default();
        return Redirect::Refused(format!("the authorization server refused: {}{description}", quote(&error)));
    }
    match code {
        Some(code) if !code.is_empty() => Redirect::Code(code),
        _ => Redirect::Refused("the redirect has neither a code nor an error".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected(iss_supported: bool) -> ExpectedRedirect<'static> {
        ExpectedRedirect { state: "s-123", issuer: "https://as.example.com", iss_supported }
    }

    #[test]
    fn pkce_matches_the_rfc_7636_example() {
        // RFC 7636 appendix B.
        let pair = Pkce::from_verifier("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".to_string());
        assert_eq!(pair.challenge, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        let fresh = Pkce::random().expect("randomness");
        assert_eq!(fresh.verifier.len(), 43);
        assert_ne!(fresh.verifier, Pkce::random().expect("randomness").verifier);
        assert_eq!(format!("{fresh:?}"), "Pkce(..)");
    }

    #[test]
    fn servers_without_s256_are_refused_and_silent_ones_tried() {
        assert!(pkce_refusal(None).is_none());
        assert!(pkce_refusal(Some(&["plain".into(), "S256".into()])).is_none());
        let why = pkce_refusal(Some(&["plain".into()])).expect("refused");
        assert!(why.contains("S256") && why.contains("\"plain\""), "{why}");
        assert!(pkce_refusal(Some(&[])).is_some());
    }

    #[test]
    fn the_authorization_url_keeps_the_endpoints_query_and_adds_the_request() {
        let endpoint = url::Url::parse("https://as.example.com/authorize?tenant=a#frag").expect("url");
        let request = AuthorizationRequest {
            client_id: "client 1",
            redirect_uri: "http://127.0.0.1:4100/callback",
            code_challenge: "ch",
            state: "st",
            scope: "",
            resource: "https://mcp.example.com/mcp",
        };
        let url = authorization_url(&endpoint, &request);
        let pairs: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.into(), v.into())).collect();
        let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("tenant"), Some("a"));
        assert_eq!(get("response_type"), Some("code"));
        assert_eq!(get("client_id"), Some("client 1"));
        assert_eq!(get("code_challenge_method"), Some("S256"));
        assert_eq!(get("resource"), Some("https://mcp.example.com/mcp"));
        assert_eq!(get("scope"), None, "no scope parameter when none is asked");
        assert_eq!(url.fragment(), None);
        let with_scope = authorization_url(&endpoint, &AuthorizationRequest { scope: "a b", ..request });
        assert!(with_scope.as_str().contains("scope=a+b"), "{with_scope}");
    }

    #[test]
    fn only_this_flows_redirect_counts_and_its_iss_must_be_the_issuer() {
        let e = expected(false);
        assert_eq!(read_redirect("code=c1&state=s-123", &e), Redirect::Code("c1".into()));
        assert_eq!(
            read_redirect("code=c1&state=s-123&iss=https%3A%2F%2Fas.example.com", &e),
            Redirect::Code("c1".into())
        );
        // Someone else's (or no) state: not this flow's, the listener keeps waiting.
        assert_eq!(read_redirect("code=c1&state=other", &e), Redirect::Stray);
        assert_eq!(read_redirect("code=c1", &e), Redirect::Stray);
        assert_eq!(read_redirect("code=c1&state=s-123&state=s-123", &e), Redirect::Stray);
        assert_eq!(
            read_redirect(&format!("state=s-123&code={}", "c".repeat(MAX_REDIRECT_QUERY_BYTES)), &e),
            Redirect::Stray
        );
        // A wrong iss is refused whether or not the server advertises it; no normalisation.
        for iss in ["https://evil.example.com", "https://as.example.com/", "HTTPS://as.example.com"] {
            let query = format!(
                "code=c1&state=s-123&iss={}",
                url::form_urlencoded::byte_serialize(iss.as_bytes()).collect::<String>()
            );
            for supported in [false, true] {
                match read_redirect(&query, &expected(supported)) {
                    Redirect::Refused(why) => assert!(why.contains("RFC 9207"), "{why}"),
                    other => panic!("{iss}: {other:?}"),
                }
            }
        }
        // Missing iss: refused only where the metadata promised it.
        assert!(matches!(read_redirect("code=c1&state=s-123", &expected(true)), Redirect::Refused(_)));
    }

    #[test]
    fn refusals_quote_the_server_briefly_and_repeats_are_refused() {
        let e = expected(false);
        match read_redirect("state=s-123&error=access_denied&error_description=no%0Away", &e) {
            Redirect::Refused(why) => {
                assert!(why.contains("access_denied") && !why.contains('\n'), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_redirect("state=s-123&code=a&code=b", &e), Redirect::Refused(_)));
        assert!(matches!(read_redirect("state=s-123&code=", &e), Redirect::Refused(_)));
        assert!(matches!(read_redirect("state=s-123", &e), Redirect::Refused(_)));
    }
}
