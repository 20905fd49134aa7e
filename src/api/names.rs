//! Names that two parts derive the same way: the webhook writes them into a pod, the agent
//! reads them back. [`keys`](super::keys) holds the fixed names; this file the derived ones.
//!
//! ```text
//! server + field ──secret_env_var──▶ SPEAR_SECRET_<SERVER>_<FIELD>  (env var on the agent)
//! secret + key ───approval_key_env_var──▶ SPEAR_APPROVAL_KEY_<SECRET>_<KEY> (env var on the agent)
//! server + field ──secret_ref_id───▶ <server>/<field>               (an entry of SPEAR_SECRET_REFS)
//! server ──────────────────────────▶ <RUN_DIR>/<server>/SOCKET_FILE (the bridge's socket)
//! bytes ─────────short_hash────────▶ 16 hex characters of sha256    (revisions, versions, markers)
//! http spec ───http_destination────▶ <hash>                         (an entry of SPEAR_GRANTED_DESTINATIONS)
//! ```

use std::fmt;

use sha2::{Digest, Sha256};

use super::{HttpAuth, HttpSpec};

/// The bridge socket's file name in its server's directory.
pub(crate) const SOCKET_FILE: &str = "mcp.sock";

/// The env var that carries a secret-backed value of `server`'s `field` (an env or header name):
/// `SPEAR_SECRET_<SERVER>_<FIELD>`, upper-cased, other characters as `_`.
pub(crate) fn secret_env_var(server: &str, field: &str) -> String {
    format!("SPEAR_SECRET_{}_{}", env_part(server), env_part(field))
}

/// The env var that carries the signing key of a webhook approver, from the Secret `name`'s
/// `key`: `SPEAR_APPROVAL_KEY_<NAME>_<KEY>`, upper-cased, other characters as `_`.
pub(crate) fn approval_key_env_var(name: &str, key: &str) -> String {
    format!("SPEAR_APPROVAL_KEY_{}_{}", env_part(name), env_part(key))
}

fn env_part(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

/// How the webhook's `SPEAR_SECRET_REFS` names one delivered header value: `<server>/<header>`
/// (neither part can contain `/` or `,`).
pub(crate) fn secret_ref_id(server: &str, header: &str) -> String {
    format!("{server}/{header}")
}

/// Where `http`'s delivered credentials go: its URL, the authorization server it trusts and how
/// the pod's identity is presented (mode and audience). The webhook records it for each server
/// it delivers a Secret value or a token to; the agent sends them only while the live McpServer
/// still hashes the same (an edit of any of these moves them elsewhere). Scopes, client ids and
/// lifetimes are left out: they change no destination.
pub(crate) fn http_destination(http: &HttpSpec) -> String {
    let auth = http.auth.as_ref();
    let mode = auth.map(|a| {
        if a.client_credentials.is_some() {
            "clientCredentials"
        } else if a.service_account_token.is_some() {
            "serviceAccountToken"
        } else if a.token_exchange.is_some() {
            "tokenExchange"
        } else if a.authorization_code.is_some() {
            "authorizationCode"
        } else {
            "none"
        }
    });
    let audience = auth.and_then(HttpAuth::service_account_token).map(|(audience, _)| audience);
    let issuer = auth.and_then(HttpAuth::pinned_issuer);
    let fields = serde_json::json!([http.url, issuer, mode, audience]);
    short_hash(fields.to_string().as_bytes())
}

/// Hex characters kept from a sha256 digest: 64 bits, far beyond any registry's size.
const HASH_HEX_LEN: usize = 16;

/// The first [`HASH_HEX_LEN`] hex characters of the sha256 of `bytes`.
pub(crate) fn short_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(HASH_HEX_LEN);
    for byte in digest.iter().take(HASH_HEX_LEN / 2) {
        // Writing to a String cannot fail.
        let _ = fmt::Write::write_fmt(&mut hex, format_args!("{byte:02x}"));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{McpServer, ServiceAccountTokenAuth, TokenExchangeAuth};

    #[test]
    fn a_destination_moves_with_url_issuer_mode_and_audience_only() {
        let sa = |audience: &str| HttpAuth {
            service_account_token: Some(ServiceAccountTokenAuth {
                audience: audience.into(),
                expiration_seconds: None,
            }),
            ..HttpAuth::default()
        };
        let of = |server: McpServer| http_destination(server.spec.http.as_ref().expect("an http server"));
        let base = McpServer::test("s").http("https://mcp.example.com/mcp").auth(sa("https://mcp.example.com"));
        let same = of(base.clone());
        assert_eq!(of(base.clone().header("x-team", "a").allowing(["*"])), same, "headers and allowlists move nothing");
        let mut longer = base.clone();
        if let Some(auth) = longer.spec.http.as_mut().and_then(|h| h.auth.as_mut()) {
            auth.scopes = vec!["read".into()];
            if let Some(token) = auth.service_account_token.as_mut() {
                token.expiration_seconds = Some(7200);
            }
        }
        assert_eq!(of(longer), same, "scopes and lifetimes move nothing");

        let moved = [
            base.clone().http("https://attacker.example/mcp"),
            base.clone().auth(sa("sts.amazonaws.com")),
            base.clone()
                .auth(HttpAuth { issuer: Some("https://auth.example.com".into()), ..sa("https://mcp.example.com") }),
            base.clone().auth(HttpAuth {
                token_exchange: Some(TokenExchangeAuth {
                    audience: "https://mcp.example.com".into(),
                    ..Default::default()
                }),
                ..HttpAuth::default()
            }),
            McpServer::test("s").http("https://mcp.example.com/mcp"),
        ];
        for server in moved {
            assert_ne!(of(server.clone()), same, "{:?}", server.spec.http);
        }
    }

    #[test]
    fn secret_env_vars_are_upper_case_with_underscores() {
        assert_eq!(secret_env_var("my-server", "token"), "SPEAR_SECRET_MY_SERVER_TOKEN");
        assert_eq!(secret_env_var("remote", "auth:clientSecret"), "SPEAR_SECRET_REMOTE_AUTH_CLIENTSECRET");
        // Not injective: the agent reads only what SPEAR_SECRET_REFS lists for the server.
        assert_eq!(secret_env_var("my-server", "token"), secret_env_var("my", "server-token"));
    }

    #[test]
    fn secret_ref_ids_keep_server_and_field_apart() {
        assert_eq!(secret_ref_id("my-server", "token"), "my-server/token");
        assert_ne!(secret_ref_id("my-server", "token"), secret_ref_id("my", "server-token"));
    }

    #[test]
    fn short_hashes_are_stable() {
        // Stable across builds and machines: a fixed input has a fixed hash.
        assert_eq!(short_hash(b"abc"), "ba7816bf8f01cfea");
        assert_eq!(short_hash(b"").len(), HASH_HEX_LEN);
    }
}
