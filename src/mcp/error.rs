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
    /// The call needs approval and no approver could be asked.
    McpApprovalRequired,
    /// An approver did not approve the call (said no, did not answer in time, or could not be
    /// asked properly).
    McpApprovalDenied,
    /// A loop or call budget is used up.
    McpBudgetExceeded,
    /// A rate limit is used up for now; `retry_after_ms` says when a call would pass.
    McpRateLimited,
    /// The caller cancelled the call before its answer; the server was told to stop.
    McpCancelled,
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
            ErrorCode::McpApprovalDenied => "mcp_approval_denied",
            ErrorCode::McpBudgetExceeded => "mcp_budget_exceeded",
            ErrorCode::McpRateLimited => "mcp_rate_limited",
            ErrorCode::McpCancelled => "mcp_cancelled",
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
    /// The server itself refused the request for what its caller sent (bad arguments, a
    /// tampered `requestState`, a capability the caller did not declare). `/mcp` relays that as
    /// the same JSON-RPC error, since its caller wrote the request; the other doors keep the
    /// structured tool error.
    pub(crate) refused_by_server: Option<Box<ServerRefusal>>,
    /// Why governance refused the call (`not_in_profile`, `denied_by:profile`, `rate_limited`,
    /// ...): the audit line's `reason` and the `reason` label of `mcp_denied_total`. One of a
    /// fixed set, never the caller's text. `None` for failures that are not refusals.
    pub(crate) reason: Option<&'static str>,
    /// For `mcp_rate_limited`: milliseconds until the same call would pass.
    pub(crate) retry_after_ms: Option<u64>,
}

/// A server's JSON-RPC refusal of a caller's request, as `/mcp` relays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerRefusal {
    /// -32602 (invalid params) or -32021 (missing required client capability).
    pub(crate) code: i32,
    /// The server's `data` for -32021 (`requiredCapabilities`), when small; `None` otherwise
    /// (a server's data is not passed on for the rest).
    pub(crate) data: Option<serde_json::Value>,
}

/// JSON-RPC codes of a server's refusal that `/mcp` relays as errors: -32602 invalid params,
/// -32021 missing required client capability (2026-07-28).
pub(crate) const RELAYED_REFUSALS: [i32; 2] = [-32602, -32021];

/// The largest `data` of a relayed -32021 (`{"requiredCapabilities": {...}}` is tens of bytes).
const MAX_REFUSAL_DATA_BYTES: usize = 4096;

impl ServerRefusal {
    /// The refusal of a server's JSON-RPC error, if it is one `/mcp` relays.
    pub(crate) fn of(code: i32, data: Option<&serde_json::Value>) -> Option<Box<Self>> {
        if !RELAYED_REFUSALS.contains(&code) {
            return None;
        }
        let small = |d: &&serde_json::Value| d.to_string().len() <= MAX_REFUSAL_DATA_BYTES;
        let data = if code == -32021 { data.filter(small).cloned() } else { None };
        Some(Box::new(ServerRefusal { code, data }))
    }
}

impl McpError {
    /// An error with `retryable` set as the code implies (unavailable and timeout are worth a
    /// retry; the others are not until something changes).
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let retryable = matches!(code, ErrorCode::McpUnavailable | ErrorCode::McpTimeout);
        McpError {
            code,
            message: message.into(),
            retryable,
            refused_by_server: None,
            reason: None,
            retry_after_ms: None,
        }
    }

    /// A refusal by governance, with its reason (see [`McpError::reason`]).
    pub(crate) fn denied(code: ErrorCode, reason: &'static str, message: impl Into<String>) -> Self {
        McpError { reason: Some(reason), ..McpError::new(code, message) }
    }

    /// `mcp_rate_limited`: retryable after `retry_after` (rounded up to whole milliseconds).
    pub(crate) fn rate_limited(message: impl Into<String>, retry_after: std::time::Duration) -> Self {
        let ms = retry_after.as_micros().div_ceil(1000);
        McpError {
            retryable: true,
            retry_after_ms: Some(u64::try_from(ms).unwrap_or(u64::MAX)),
            ..McpError::denied(ErrorCode::McpRateLimited, "rate_limited", message)
        }
    }

    /// `{"error": {"code", "message", "retryable"}}`, the tool output a model sees.
    pub(crate) fn to_tool_output(&self) -> serde_json::Value {
        let mut error = serde_json::json!({"code": self.code, "message": self.message, "retryable": self.retryable});
        if let Some(ms) = self.retry_after_ms {
            error["retry_after_ms"] = ms.into();
        }
        if let Some(reason) = self.reason {
            error["reason"] = reason.into();
        }
        serde_json::json!({ "error": error })
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
    fn only_a_callers_own_mistakes_are_relayed_and_a_servers_data_only_when_small() {
        assert_eq!(ServerRefusal::of(-32603, None), None, "the server's own failure stays a tool error");
        assert_eq!(ServerRefusal::of(-32001, None), None);
        let data = serde_json::json!({"requiredCapabilities": {"sampling": {}}});
        assert_eq!(ServerRefusal::of(-32021, Some(&data)).and_then(|r| r.data), Some(data.clone()));
        assert_eq!(ServerRefusal::of(-32602, Some(&data)).map(|r| (r.code, r.data)), Some((-32602, None)));
        let huge = serde_json::json!({"requiredCapabilities": {"x": "y".repeat(10_000)}});
        assert_eq!(ServerRefusal::of(-32021, Some(&huge)).map(|r| r.data), Some(None));
    }

    #[test]
    fn retryable_follows_the_code() {
        assert!(McpError::new(ErrorCode::McpTimeout, "x").retryable);
        assert!(McpError::new(ErrorCode::McpUnavailable, "x").retryable);
        assert!(!McpError::new(ErrorCode::McpInvalidArguments, "x").retryable);
        assert!(!McpError::new(ErrorCode::McpOutputTooLarge, "x").retryable);
        assert!(McpError::rate_limited("x", std::time::Duration::from_micros(1)).retryable);
    }

    #[test]
    fn a_rate_limited_call_says_when_to_come_back_rounded_up() {
        let e = McpError::rate_limited("over", std::time::Duration::from_micros(1_500));
        assert_eq!(
            e.to_tool_output(),
            serde_json::json!({"error": {"code": "mcp_rate_limited", "message": "over", "retryable": true,
                "retry_after_ms": 2, "reason": "rate_limited"}})
        );
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
