//! Why a chat completion request fails, and the one mapping to the wire: HTTP status and an
//! OpenAI-style body `{"error": {"message", "type", "code", "param"}}` that OpenAI SDKs parse.
//! Tool failures never come here: they are `role=tool` output, so the model can react to them.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::policy::PolicyError;

/// A request the agent cannot complete.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The body is not declared as JSON. Browsers may post `text/plain` cross-origin without a
    /// preflight; requiring `application/json` forces one, which the door never grants.
    #[error("the request must be sent with Content-Type: application/json (got '{content_type}')")]
    NotJson {
        /// The Content-Type sent (empty when absent).
        content_type: String,
    },
    /// The body is not a chat completion request.
    #[error("the request body is not a valid chat completion request: {message}")]
    InvalidBody {
        /// The parser's message, naming the field.
        message: String,
    },
    /// The `mcp` extension object is malformed or has an unknown key.
    #[error("invalid `mcp` object: {message}")]
    InvalidMcp {
        /// What is wrong, naming the key.
        message: String,
    },
    /// `tool_choice` forces a function the model is not offered.
    #[error(
        "tool_choice forces the function '{name}', which is neither one of the request's tools nor an MCP tool available to this workload"
    )]
    UnknownForcedTool {
        /// The function named.
        name: String,
    },
    /// No effective tool set for this request (a server outside the profile, a bad pattern, no profile).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A resource the request's `mcp.resources` names could not be attached.
    #[error("mcp.resources: '{uri}' could not be read: {source}")]
    Resource {
        /// The resource as named (capped for the message).
        uri: String,
        #[source]
        source: crate::mcp::McpError,
    },
    /// Neither the profile nor the agent's flags name an upstream.
    #[error(
        "no upstream model API is configured: set spec.chat.upstream.url in McpProfile '{profile}', or start spearlet with --upstream-url"
    )]
    NoUpstream {
        /// The profile served.
        profile: String,
    },
    /// The upstream could not be asked, or its answer was not a completion.
    #[error(transparent)]
    Upstream(#[from] super::upstream::UpstreamError),
}

impl ChatError {
    /// HTTP status, OpenAI error `type` and `code`: the one mapping of this boundary.
    fn wire(&self) -> (StatusCode, &'static str, &'static str) {
        use super::upstream::UpstreamError as U;
        match self {
            ChatError::NotJson { .. } => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request_error", "unsupported_media_type")
            }
            ChatError::InvalidBody { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_request"),
            ChatError::InvalidMcp { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error", "mcp_invalid_arguments"),
            ChatError::UnknownForcedTool { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_tool_choice")
            }
            ChatError::Policy(e) => match e.code() {
                "mcp_invalid_arguments" => (StatusCode::BAD_REQUEST, "invalid_request_error", "mcp_invalid_arguments"),
                _ => (StatusCode::FORBIDDEN, "permission_error", "mcp_policy_denied"),
            },
            ChatError::NoUpstream { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "upstream_error", "upstream_not_configured")
            }
            ChatError::Resource { source, .. } => {
                use crate::mcp::ErrorCode as C;
                match source.code {
                    C::McpPolicyDenied => (StatusCode::FORBIDDEN, "permission_error", "mcp_policy_denied"),
                    C::McpInvalidArguments => {
                        (StatusCode::BAD_REQUEST, "invalid_request_error", "mcp_invalid_arguments")
                    }
                    C::McpTimeout => (StatusCode::GATEWAY_TIMEOUT, "server_error", "mcp_timeout"),
                    _ => (StatusCode::BAD_GATEWAY, "server_error", "mcp_unavailable"),
                }
            }
            ChatError::Upstream(U::Unreachable { .. }) => {
                (StatusCode::BAD_GATEWAY, "upstream_error", "upstream_unreachable")
            }
            ChatError::Upstream(U::Denied { .. }) => (StatusCode::BAD_GATEWAY, "upstream_error", "upstream_denied"),
            ChatError::Upstream(U::InvalidResponse { .. }) => {
                (StatusCode::BAD_GATEWAY, "upstream_error", "upstream_invalid_response")
            }
            ChatError::Upstream(U::Status { .. }) => (StatusCode::BAD_GATEWAY, "upstream_error", "upstream_error"),
            ChatError::Upstream(U::Client { .. }) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "server_error", "upstream_client")
            }
        }
    }

    /// The request parameter at fault, for the error body's `param`.
    fn param(&self) -> Option<&'static str> {
        match self {
            ChatError::InvalidMcp { .. } | ChatError::Policy(_) => Some("mcp"),
            ChatError::Resource { .. } => Some("mcp.resources"),
            ChatError::UnknownForcedTool { .. } => Some("tool_choice"),
            _ => None,
        }
    }

    /// The `code` of the error body (also the log label).
    pub(crate) fn code(&self) -> &'static str {
        self.wire().2
    }
}

impl IntoResponse for ChatError {
    fn into_response(self) -> Response {
        // An upstream's own error answer goes back as it came: same status, same body, so an
        // OpenAI SDK raises the error it would have raised talking to the upstream directly.
        if let ChatError::Upstream(super::upstream::UpstreamError::Status { status, body, content_type }) = self {
            let mut response = (status, body).into_response();
            let content_type = content_type.unwrap_or_else(|| HeaderValue::from_static("application/json"));
            response.headers_mut().insert(header::CONTENT_TYPE, content_type);
            return response;
        }
        let (status, kind, code) = self.wire();
        let body = json!({"error": {"message": self.to_string(), "type": kind, "code": code, "param": self.param()}});
        (status, axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Layer;

    #[test]
    fn policy_errors_map_to_403_and_request_patterns_to_400() {
        let denied = ChatError::from(PolicyError::ServerNotInProfile { server: "x".into(), profile: "p".into() });
        assert_eq!(denied.wire().0, StatusCode::FORBIDDEN);
        assert_eq!(denied.code(), "mcp_policy_denied");
        let pattern = crate::policy::pattern::PatternError { pattern: "x".into(), message: "bad".into() };
        let bad = ChatError::from(PolicyError::InvalidPattern { layer: Layer::Request, source: pattern });
        assert_eq!(bad.wire().0, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn no_upstream_says_how_to_configure_one() {
        let e = ChatError::NoUpstream { profile: "p".into() };
        assert_eq!(e.wire().0, StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.to_string().contains("spec.chat.upstream.url") && e.to_string().contains("--upstream-url"));
    }
}
