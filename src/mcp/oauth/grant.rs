//! The grant a person's consent produced (`spearlet auth login`), as it is stored and read back:
//! the client it was issued to, the issuer it came from, the MCP server URL it is for, the
//! refresh token and the last access token. Pure; reading and writing the file or Secret is
//! `mcp::grant_store`.
//!
//! - **One JSON document** per server, written whole: a reader never sees half a rotation.
//! - **Bound to where it came from.** A grant is used only for the server URL and the issuer it
//!   was obtained for ([`StoredGrant::mismatch`]): an McpServer whose `http.url` or
//!   `auth.issuer` changed after the login must log in again, so editing an McpServer cannot
//!   send someone's refresh token to a new authorization server or their access token to a new
//!   MCP server.
//! - **Untrusted bytes.** Whoever may write where it is stored may write anything there: the
//!   document is size-bounded, unknown fields are ignored, and errors name the field, never a
//!   value. `Debug` shows no token or secret.

use serde::{Deserialize, Serialize};

use super::same_url;

/// The format this build writes and reads.
pub(crate) const GRANT_FORMAT: u32 = 1;
/// Bytes of a stored grant read at most (tokens are a few KiB).
pub(crate) const MAX_GRANT_BYTES: usize = 64 * 1024;

/// How the client authenticates at the token endpoint.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ClientAuthMethod {
    /// A public client: `client_id` in the form, no secret (PKCE is the proof).
    None,
    ClientSecretBasic,
    ClientSecretPost,
}

impl ClientAuthMethod {
    /// The method to use with a client that has a secret (`has_secret`), given the authorization
    /// server's `token_endpoint_auth_methods_supported` (`None`: absent, which RFC 8414 says
    /// means `client_secret_basic`) and, for a registered client, the method its registration
    /// names.
    pub(crate) fn choose(has_secret: bool, supported: Option<&[String]>, registered: Option<&str>) -> Self {
        if !has_secret {
            return ClientAuthMethod::None;
        }
        match registered {
            Some("client_secret_post") => return ClientAuthMethod::ClientSecretPost,
            Some("client_secret_basic") => return ClientAuthMethod::ClientSecretBasic,
            _ => {}
        }
        match supported {
            Some(methods) if methods.iter().any(|m| m == "client_secret_basic") => ClientAuthMethod::ClientSecretBasic,
            Some(methods) if methods.iter().any(|m| m == "client_secret_post") => ClientAuthMethod::ClientSecretPost,
            _ => ClientAuthMethod::ClientSecretBasic,
        }
    }
}

/// The OAuth client the grant was issued to.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
pub(crate) struct GrantClient {
    pub(crate) client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_secret: Option<String>,
    pub(crate) auth_method: ClientAuthMethod,
    /// How it was registered: `preRegistered`, `metadataDocument` (CIMD) or `dynamic` (RFC 7591).
    pub(crate) registration: String,
}

/// A stored grant (see the module header).
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
pub(crate) struct StoredGrant {
    pub(crate) format: u32,
    /// The McpServer it was obtained for (its name).
    pub(crate) server: String,
    /// The McpServer's `spec.http.url` at login: the only server its tokens are sent to.
    pub(crate) server_url: String,
    /// The RFC 8707 resource indicator of every token request (the protected-resource
    /// metadata's `resource`, which may be a prefix of `server_url`).
    pub(crate) resource: String,
    /// The authorization server's issuer identifier.
    pub(crate) issuer: String,
    pub(crate) client: GrantClient,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) refresh_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) access_token: Option<String>,
    /// When `access_token` expires (Unix seconds); absent: unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) access_token_expires_at: Option<u64>,
    /// The scopes granted (space-separated), as the token response said or as requested.
    #[serde(default)]
    pub(crate) scope: String,
    /// When the person consented (Unix seconds).
    pub(crate) obtained_at: u64,
    /// When the refresh token was last replaced (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) refreshed_at: Option<u64>,
    /// Scopes the server demanded for a call (`403 insufficient_scope`) that the grant lacks:
    /// the next `spearlet auth login` asks for them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) step_up_scopes: Vec<String>,
}

impl std::fmt::Debug for StoredGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredGrant")
            .field("server", &self.server)
            .field("server_url", &self.server_url)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client.client_id)
            .field("refresh_token", &self.refresh_token.is_some())
            .field("access_token_expires_at", &self.access_token_expires_at)
            .finish_non_exhaustive()
    }
}

/// Why a stored grant cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum GrantError {
    #[error("the stored grant is larger than {MAX_GRANT_BYTES} bytes")]
    TooLarge,
    #[error("the stored grant is not a grant document ({0})")]
    Malformed(String),
    #[error("the stored grant has format {0}; this spearlet reads format {GRANT_FORMAT} (log in again)")]
    Format(u32),
}

impl StoredGrant {
    /// Reads a stored grant.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, GrantError> {
        if bytes.len() > MAX_GRANT_BYTES {
            return Err(GrantError::TooLarge);
        }
        // The message of serde_json names the position and the expected type, never the input.
        let grant: StoredGrant = serde_json::from_slice(bytes).map_err(|e| {
            let at = e.to_string();
            let field = at.split(" at line").next().unwrap_or("").to_string();
            GrantError::Malformed(field)
        })?;
        if grant.format != GRANT_FORMAT {
            return Err(GrantError::Format(grant.format));
        }
        if grant.client.client_id.is_empty() {
            return Err(GrantError::Malformed("client.client_id is empty".to_string()));
        }
        Ok(grant)
    }

    /// The document to store.
    pub(crate) fn to_json(&self) -> Vec<u8> {
        // A struct of strings and numbers always serializes.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Why this grant may not be used for the server at `url` pinned to `issuer` (see the module
    /// header).
    pub(crate) fn mismatch(&self, url: &str, issuer: &str) -> Option<String> {
        if !same_url(&self.server_url, url) {
            return Some(format!(
                "the stored grant was obtained for {}, not the server's spec.http.url {url}",
                super::origin_of(&self.server_url)
            ));
        }
        if !same_url(&self.issuer, issuer) {
            return Some(format!(
                "the stored grant was issued by {}, not spec.http.auth.issuer {issuer}",
                super::origin_of(&self.issuer)
            ));
        }
        None
    }

    /// The stored access token while it has at least `margin_secs` left at `now` (Unix seconds);
    /// one of unknown lifetime is used until the server rejects it.
    pub(crate) fn usable_access_token(&self, now: u64, margin_secs: u64) -> Option<&str> {
        let token = self.access_token.as_deref().filter(|t| !t.is_empty())?;
        match self.access_token_expires_at {
            Some(at) if at <= now.saturating_add(margin_secs) => None,
            _ => Some(token),
        }
    }
}

impl StoredGrant {
    /// The stored access token while it is not yet due for renewal at `now`, timed from its
    /// lifetime as `oauth::renew_after` times a token the agent got itself: the login's, or one
    /// another agent renewed. One of unknown lifetime is used until the server rejects it.
    pub(crate) fn fresh_access_token(&self, now: u64) -> Option<&str> {
        let token = self.access_token.as_deref().filter(|t| !t.is_empty())?;
        let Some(expires_at) = self.access_token_expires_at else { return Some(token) };
        let issued_at = self.refreshed_at.unwrap_or(self.obtained_at).min(expires_at);
        let lifetime = std::time::Duration::from_secs(expires_at - issued_at);
        let due = issued_at + super::renew_after(Some(lifetime)).map_or(0, |d| d.as_secs());
        (now < due).then_some(token)
    }
}

/// What a server's `insufficient_scope` demand means for a grant holding `granted` (its
/// space-separated scopes), with the McpServer allowing `allowed` (empty: anything).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StepUp {
    /// A person must consent to these scopes too (`spearlet auth login`).
    Login(Vec<String>),
    /// Another consent would not help: the message says why.
    Futile(String),
}

/// See [`StepUp`]: the demanded scopes the grant lacks, unless the McpServer does not allow them
/// or the grant already has them all (a server that refuses even then would make every login
/// futile, so none is asked for: the retry limit of the MCP spec's step-up).
pub(crate) fn step_up(granted: &str, demanded: &[String], allowed: &[String]) -> StepUp {
    let shown = |s: &[String]| s.iter().take(8).map(|x| super::quote(x)).collect::<Vec<_>>().join(" ");
    if demanded.is_empty() {
        return StepUp::Futile("the server refused the call for insufficient scope without naming one".to_string());
    }
    let refused: Vec<String> =
        demanded.iter().filter(|s| !allowed.is_empty() && !allowed.contains(s)).cloned().collect();
    if !refused.is_empty() {
        return StepUp::Futile(format!(
            "the server asks for scope(s) {} for this call, which spec.http.auth.scopes does not allow",
            shown(&refused)
        ));
    }
    let held: Vec<&str> = granted.split_whitespace().collect();
    let missing: Vec<String> = demanded.iter().filter(|s| !held.contains(&s.as_str())).cloned().collect();
    if missing.is_empty() {
        return StepUp::Futile(format!(
            "the server refuses the call for insufficient scope, though the grant has the scope(s) it asks for ({}); \
             another consent would not change that",
            shown(demanded)
        ));
    }
    StepUp::Login(missing)
}

/// What `explain` says of a server's stored grant (`read`: what reading it gave, `None` when
/// there is none), for the server at `url` pinned to `issuer`, at `now`: whether someone must
/// log in, and how fresh the grant is. Never a token.
pub(crate) fn grant_state(
    read: Result<Option<&StoredGrant>, String>,
    server: &str,
    url: &str,
    issuer: &str,
    now: u64,
) -> String {
    let login = format!("run `spearlet auth login --server {server}`");
    let grant = match read {
        Ok(Some(grant)) => grant,
        Ok(None) => return format!("no grant stored: {login}"),
        Err(why) => return format!("{why}: {login}"),
    };
    if let Some(why) = grant.mismatch(url, issuer) {
        return format!("{why}: {login}");
    }
    let access = match (grant.access_token.as_deref(), grant.access_token_expires_at) {
        (None, _) => "no access token yet".to_string(),
        (Some(_), Some(at)) if at <= now => "access token expired".to_string(),
        (Some(_), Some(at)) => format!("access token fresh for {} s", at - now),
        (Some(_), None) => "access token of unknown lifetime".to_string(),
    };
    let renewal = if grant.refresh_token.is_some() {
        "renewed with its refresh token".to_string()
    } else {
        format!("no refresh token: when the access token expires, {login}")
    };
    format!("grant stored (consented {} s ago), {access}, {renewal}", now.saturating_sub(grant.obtained_at))
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A grant of every field, for the tests here and the grant store's.
    pub(crate) fn sample() -> StoredGrant {
        StoredGrant {
            format: GRANT_FORMAT,
            server: "github".into(),
            server_url: "https://mcp.example.com/mcp".into(),
            resource: "https://mcp.example.com/mcp".into(),
            issuer: "https://as.example.com".into(),
            client: GrantClient {
                client_id: "c-1".into(),
                client_secret: Some("client-secret-value".into()),
                auth_method: ClientAuthMethod::ClientSecretBasic,
                registration: "dynamic".into(),
            },
            refresh_token: Some("refresh-token-value".into()),
            access_token: Some("access-token-value".into()),
            access_token_expires_at: Some(2_000),
            scope: "repo:read".into(),
            obtained_at: 1_000,
            refreshed_at: None,
            step_up_scopes: Vec::new(),
        }
    }

    #[test]
    fn a_stored_access_token_is_fresh_until_it_is_due_for_renewal() {
        // Obtained at 1 000, expiring at 2 000: due a minute before, at 1 940.
        let grant = sample();
        assert_eq!(grant.fresh_access_token(1_000), Some("access-token-value"));
        assert_eq!(grant.fresh_access_token(1_939), Some("access-token-value"));
        assert_eq!(grant.fresh_access_token(1_940), None);
        // Renewed since: timed from the renewal. A short token (4 s) is still taken by another
        // agent within its first 3 s, which a fixed one-minute margin would never do.
        let renewed = StoredGrant { refreshed_at: Some(5_000), access_token_expires_at: Some(5_004), ..sample() };
        assert_eq!(renewed.fresh_access_token(5_002), Some("access-token-value"));
        assert_eq!(renewed.fresh_access_token(5_003), None);
        let unknown = StoredGrant { access_token_expires_at: None, ..sample() };
        assert_eq!(unknown.fresh_access_token(u64::MAX), Some("access-token-value"));
        let none = StoredGrant { access_token: Some(String::new()), ..sample() };
        assert_eq!(none.fresh_access_token(1_000), None);
    }

    #[test]
    fn a_step_up_asks_for_the_missing_scopes_once_and_never_what_is_not_allowed() {
        let v = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(step_up("mcp:basic", &v(&["mcp:write"]), &[]), StepUp::Login(v(&["mcp:write"])));
        assert_eq!(step_up("mcp:basic", &v(&["mcp:basic", "mcp:write"]), &[]), StepUp::Login(v(&["mcp:write"])));
        assert!(matches!(step_up("mcp:admin", &v(&["mcp:admin"]), &[]), StepUp::Futile(_)));
        assert!(matches!(step_up("a", &[], &[]), StepUp::Futile(_)));
        match step_up("a", &v(&["admin"]), &v(&["a", "b"])) {
            StepUp::Futile(why) => assert!(why.contains("spec.http.auth.scopes"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_grant_round_trips_and_debug_shows_no_secret() {
        let grant = sample();
        let back = StoredGrant::parse(&grant.to_json()).expect("parse");
        assert_eq!(back, grant);
        let shown = format!("{grant:?}");
        for secret in ["client-secret-value", "refresh-token-value", "access-token-value"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }

    #[test]
    fn bad_documents_are_refused_without_echoing_them() {
        assert_eq!(StoredGrant::parse(&vec![b' '; MAX_GRANT_BYTES + 1]), Err(GrantError::TooLarge));
        let err = StoredGrant::parse(br#"{"format": 1, "refresh_token": "leaked-value"}"#).expect_err("incomplete");
        assert!(!err.to_string().contains("leaked-value"), "{err}");
        let mut future = sample();
        future.format = 2;
        assert_eq!(StoredGrant::parse(&future.to_json()), Err(GrantError::Format(2)));
        let mut nameless = sample();
        nameless.client.client_id.clear();
        assert!(StoredGrant::parse(&nameless.to_json()).is_err());
        // Unknown fields (a later minor version's) are ignored.
        let mut value: serde_json::Value = serde_json::from_slice(&sample().to_json()).expect("json");
        value["later"] = serde_json::json!(true);
        assert!(StoredGrant::parse(value.to_string().as_bytes()).is_ok());
    }

    #[test]
    fn a_grant_serves_only_its_server_url_and_issuer() {
        let grant = sample();
        assert_eq!(grant.mismatch("https://mcp.example.com/mcp/", "https://as.example.com/"), None);
        let moved = grant.mismatch("https://other.example.com/mcp", "https://as.example.com").expect("refused");
        assert!(moved.contains("spec.http.url"), "{moved}");
        let repinned = grant.mismatch("https://mcp.example.com/mcp", "https://evil.example.com").expect("refused");
        assert!(repinned.contains("spec.http.auth.issuer"), "{repinned}");
    }

    #[test]
    fn the_stored_access_token_is_used_only_while_fresh() {
        let grant = sample();
        assert_eq!(grant.usable_access_token(1_000, 60), Some("access-token-value"));
        assert_eq!(grant.usable_access_token(1_941, 60), None);
        let mut unknown = sample();
        unknown.access_token_expires_at = None;
        assert!(unknown.usable_access_token(u64::MAX, 60).is_some());
    }

    #[test]
    fn explain_says_whether_someone_must_log_in_and_never_shows_a_token() {
        let grant = sample();
        let (url, issuer) = ("https://mcp.example.com/mcp", "https://as.example.com");
        let state = |read: Result<Option<&StoredGrant>, String>, now| grant_state(read, "github", url, issuer, now);
        let fresh = state(Ok(Some(&grant)), 1_500);
        assert!(fresh.contains("fresh for 500 s") && fresh.contains("refresh token"), "{fresh}");
        assert!(state(Ok(Some(&grant)), 3_000).contains("expired"));
        assert!(state(Ok(None), 0).contains("spearlet auth login --server github"));
        assert!(state(Err("unreadable".into()), 0).starts_with("unreadable: run"));
        let moved = grant_state(Ok(Some(&grant)), "github", "https://other.example.com/mcp", issuer, 0);
        assert!(moved.contains("spec.http.url") && moved.contains("auth login"), "{moved}");
        let mut once = sample();
        once.refresh_token = None;
        assert!(state(Ok(Some(&once)), 1_500).contains("no refresh token"));
        for text in [fresh, state(Ok(Some(&once)), 3_000)] {
            assert!(!text.contains("token-value"), "{text}");
        }
    }

    #[test]
    fn client_authentication_follows_the_registration_then_the_metadata() {
        let v = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(ClientAuthMethod::choose(false, Some(&v(&["client_secret_basic"])), None), ClientAuthMethod::None);
        assert_eq!(ClientAuthMethod::choose(true, None, None), ClientAuthMethod::ClientSecretBasic);
        assert_eq!(
            ClientAuthMethod::choose(true, Some(&v(&["client_secret_post"])), None),
            ClientAuthMethod::ClientSecretPost
        );
        assert_eq!(
            ClientAuthMethod::choose(true, Some(&v(&["client_secret_basic"])), Some("client_secret_post")),
            ClientAuthMethod::ClientSecretPost
        );
    }
}
