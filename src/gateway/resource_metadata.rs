//! The gateway as an OAuth 2.0 protected resource (RFC 9728), as the MCP authorization
//! specification asks: a 401 names its metadata document in `WWW-Authenticate`, and the document
//! names the authorization servers whose tokens the gateway takes. For ServiceAccount tokens
//! that is the cluster's service-account issuer (discovered from the API server unless
//! `--authorization-server` names others); the caller's token comes from its projected volume,
//! not from an OAuth flow, and the metadata lets any MCP client learn where to look.
//!
//! The resource is the URL the client called: `--public-url` when set, else `http://<Host>` of
//! the request (the `Host` the HTTP guard accepted), with the path `/mcp` for the MCP door.

use serde::Serialize;

/// Where the metadata document is served, for a resource at the root (RFC 9728 section 3).
pub const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The protected-resource metadata document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResourceMetadata {
    pub resource: String,
    pub authorization_servers: Vec<String>,
    pub bearer_methods_supported: Vec<&'static str>,
    pub resource_name: &'static str,
    /// Not in RFC 9728's registry: tells a person which audience a projected token needs.
    #[serde(rename = "spear_token_audience")]
    pub audience: String,
}

/// The base URL of the gateway for a request: `public_url`, else `http://<host>`.
pub fn base_url(public_url: Option<&str>, host: Option<&str>) -> String {
    match public_url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => format!("http://{}", host.unwrap_or("localhost")),
    }
}

/// The resource a request's path belongs to: `/mcp` (and below) is the MCP door's, anything else
/// the gateway's root.
pub fn resource_path(path: &str) -> &'static str {
    if path == "/mcp" || path.starts_with("/mcp/") { "/mcp" } else { "" }
}

/// The metadata URL for the resource at `base` + `path` (RFC 9728 section 3.1: the well-known
/// segment goes between the host and the resource's path).
pub fn metadata_url(base: &str, path: &str) -> String {
    format!("{base}{WELL_KNOWN}{path}")
}

/// The `WWW-Authenticate` value of a 401: the metadata URL, and RFC 6750's error when the
/// client sent a token (none when it sent nothing, as RFC 6750 section 3.1 asks).
pub fn challenge(metadata_url: &str, error: Option<&str>, description: Option<&str>) -> String {
    // Quoted-string: `"` and `\` escaped, controls dropped.
    let quoted = |s: &str| -> String {
        s.chars()
            .filter(|c| !c.is_control())
            .flat_map(|c| if c == '"' || c == '\\' { vec!['\\', c] } else { vec![c] })
            .collect()
    };
    let mut value = format!("Bearer resource_metadata=\"{}\"", quoted(metadata_url));
    if let Some(error) = error {
        value.push_str(&format!(", error=\"{error}\""));
    }
    if let Some(description) = description {
        value.push_str(&format!(", error_description=\"{}\"", quoted(description)));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_url_puts_the_well_known_segment_before_the_path() {
        let base = base_url(None, Some("gw.team.svc:4040"));
        assert_eq!(
            metadata_url(&base, resource_path("/mcp")),
            "http://gw.team.svc:4040/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url(&base, resource_path("/v1/chat/completions")),
            "http://gw.team.svc:4040/.well-known/oauth-protected-resource"
        );
        assert_eq!(resource_path("/mcpx"), "");
        assert_eq!(base_url(Some("https://mcp.example.com/"), Some("ignored")), "https://mcp.example.com");
    }

    #[test]
    fn the_challenge_quotes_what_it_carries() {
        assert_eq!(
            challenge("http://h/.well-known/oauth-protected-resource/mcp", None, None),
            r#"Bearer resource_metadata="http://h/.well-known/oauth-protected-resource/mcp""#
        );
        let value = challenge("http://h/x", Some("invalid_token"), Some("say \"hi\"\r\nX-Evil: 1\\"));
        assert_eq!(
            value,
            r#"Bearer resource_metadata="http://h/x", error="invalid_token", error_description="say \"hi\"X-Evil: 1\\""#
        );
        assert!(axum::http::HeaderValue::from_str(&value).is_ok());
    }
}
