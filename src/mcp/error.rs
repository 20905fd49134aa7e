//! The error model: every failure of a tool call is a code, a message and whether retrying can
//! help. Tool failures become structured tool output, never a failed request.

use std::fmt;

use serde::Serialize;

/// The error codes callers see; the wire names (`mcp_*`) are a contract with clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The server cannot be reached, crashed, or its session broke.
    McpUnavailable,
    /// The call did not finish within the timeout.
    McpTimeout,
    /// The arguments are not what the tool takes (or not JSON).
    McpInvalidArguments,
    /// The policy does not allow this call.
    McpPolicyDenied,
    /// The result was larger than the budget; it was truncated (or, past the transport's frame
    /// limit, dropped).
    McpOutputTooLarge,
    /// The call needs human approval and no approver is configured.
    McpApprovalRequired,
    /// A loop or call budget is used up.
    McpBudgetExceeded,
}

impl ErrorCode {
    /// The wire spelling (`mcp_timeout`, ...), also the metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorCode::McpUnavailable => "mcp_unavailable",
            ErrorCode::McpTimeout => "mcp_timeout",
            ErrorCode::McpInvalidArguments => "mcp_invalid_arguments",
            ErrorCode::McpPolicyDenied => "mcp_policy_denied",
            ErrorCode::McpOutputTooLarge => "mcp_output_too_large",
            ErrorCode::McpApprovalRequired => "mcp_approval_required",
            ErrorCode::McpBudgetExceeded => "mcp_budget_exceeded",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed tool call or listing, as the pool reports it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct McpError {
    pub code: ErrorCode,
    /// What happened, for people and models (never a secret value).
    pub message: String,
    /// Whether the same call may succeed if retried.
    pub retryable: bool,
    /// The server itself refused the request as invalid (a JSON-RPC -32602 from it: bad
    /// arguments, a tampered `requestState`, malformed `inputResponses`). `/mcp` relays that as
    /// the same JSON-RPC error, since its caller wrote the request; the other doors keep the
    /// structured tool error.
    pub(crate) refused_by_server: bool,
}

impl McpError {
    /// An error with `retryable` set as the code implies (unavailable and timeout are worth a
    /// retry; the others are not until something changes).
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let retryable = matches!(code, ErrorCode::McpUnavailable | ErrorCode::McpTimeout);
        McpError { code, message: message.into(), retryable, refused_by_server: false }
    }

    /// `{"error": {"code", "message", "retryable"}}`, the tool output a model sees.
    pub(crate) fn to_tool_output(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code, "message": self.message, "retryable": self.retryable}})
    }

    /// A tool result carrying this error: `isError`, the error object as text for clients that
    /// only read text, and as structured content for those that read that.
    pub(crate) fn to_call_tool_result(&self) -> rmcp::model::CallToolResult {
        let object = self.to_tool_output();
        let mut result = rmcp::model::CallToolResult::error(vec![rmcp::model::ContentBlock::text(object.to_string())]);
        result.structured_content = Some(object);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_follows_the_code() {
        assert!(McpError::new(ErrorCode::McpTimeout, "x").retryable);
        assert!(McpError::new(ErrorCode::McpUnavailable, "x").retryable);
        assert!(!McpError::new(ErrorCode::McpInvalidArguments, "x").retryable);
        assert!(!McpError::new(ErrorCode::McpOutputTooLarge, "x").retryable);
    }

    #[test]
    fn tool_output_has_the_design_shape() {
        let out = McpError::new(ErrorCode::McpTimeout, "after 5000 ms").to_tool_output();
        assert_eq!(
            out,
            serde_json::json!({"error": {"code": "mcp_timeout", "message": "after 5000 ms", "retryable": true}})
        );
    }
}
