//! Where an MCP server's authorization server is, read from what the server and the
//! authorization server publish: protected-resource metadata (RFC 9728) and authorization-server
//! metadata (RFC 8414, OpenID Connect discovery). Shared by the agent's token source and
//! `spearlet auth login`; what to accept is theirs to decide (`oauth`), this module only reads.
//!
//! - One [`OutboundHttp`] for every request (its address policy; no redirects).
//! - A 5xx is transient (the caller may try again); a 404 or a body that is not a JSON object
//!   moves on to the next well-known location.

use super::oauth::{self, TokenError};
use super::outbound_http::OutboundHttp;

/// A JSON metadata document.
pub(crate) type Document = serde_json::Map<String, serde_json::Value>;

/// The server's protected-resource metadata: at the challenge's `resource_metadata`, else the
/// well-known locations for `resource`; the first document `accept` takes, with where it was
/// read. `None`: the server publishes none (that `accept` takes).
pub(crate) async fn resource_metadata(
    http: &OutboundHttp,
    resource: &url::Url,
    challenge: Option<&str>,
    accept: impl Fn(&Document) -> bool,
) -> Result<Option<(url::Url, Document)>, TokenError> {
    let mut candidates = Vec::new();
    if let Some(url) =
        challenge.and_then(|c| rmcp::transport::auth::WWWAuthenticateParams::parse(c, resource).resource_metadata_url)
    {
        candidates.push(url);
    }
    candidates.extend(oauth::protected_resource_metadata_urls(resource));
    for url in candidates {
        let answer = http.get(&url).await?;
        if answer.status >= 500 {
            return Err(TokenError::transient(format!(
                "the protected-resource metadata at {url} answered HTTP {}",
                answer.status
            )));
        }
        if answer.status != 200 {
            continue;
        }
        let Ok(serde_json::Value::Object(document)) = serde_json::from_slice(&answer.body) else { continue };
        if accept(&document) {
            return Ok(Some((url, document)));
        }
    }
    Ok(None)
}

/// The authorization-server metadata at `issuer`'s well-known locations; `None`: none of them
/// has any.
pub(crate) async fn server_metadata(http: &OutboundHttp, issuer: &url::Url) -> Result<Option<Document>, TokenError> {
    for url in oauth::authorization_server_metadata_urls(issuer) {
        let answer = http.get(&url).await?;
        if answer.status >= 500 {
            return Err(TokenError::transient(format!(
                "the authorization-server metadata at {url} answered HTTP {}",
                answer.status
            )));
        }
        if answer.status != 200 {
            continue;
        }
        return match serde_json::from_slice(&answer.body) {
            Ok(serde_json::Value::Object(document)) => Ok(Some(document)),
            _ => Err(TokenError::transient(format!("the authorization-server metadata at {url} is not a JSON object"))),
        };
    }
    Ok(None)
}

/// The error for an issuer that publishes no metadata.
pub(crate) fn no_server_metadata(issuer: &url::Url) -> TokenError {
    TokenError::transient(format!(
        "no authorization-server metadata at {issuer} (RFC 8414 or OpenID Connect discovery); check \
         spec.http.auth.issuer"
    ))
}
