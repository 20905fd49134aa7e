//! Budget composition: every layer (server, profile, request) can only tighten, never loosen.

use serde::{Deserialize, Serialize};

use crate::api::{ProfileBudgets, ServerBudgets};

/// Limits of one tool call, after composition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CallBudgets {
    /// Time limit of one call in milliseconds.
    pub(crate) tool_timeout_ms: u32,
    /// Largest tool result in bytes.
    pub(crate) max_tool_output_bytes: u32,
    /// Calls to the server at once (a server property; profiles and requests do not change it).
    pub(crate) max_concurrency: u32,
}

/// Limits of one chat completion's tool loop, after composition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LoopBudgets {
    /// Model round trips.
    pub(crate) max_iterations: u32,
    /// Tool calls over all iterations.
    pub(crate) max_total_tool_calls: u32,
}

/// Budgets a request asks for; each applies only where lower than what is in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestBudgets {
    /// Per-call timeout in milliseconds.
    pub(crate) tool_timeout_ms: Option<u32>,
    /// Per-call output cap in bytes.
    pub(crate) max_tool_output_bytes: Option<u32>,
    /// Model round trips.
    pub(crate) max_iterations: Option<u32>,
    /// Tool calls over all iterations.
    pub(crate) max_total_tool_calls: Option<u32>,
}

/// `current` lowered to `tighter` when that is set and lower. Zero is not a budget (validation
/// refuses it), so it never wins.
fn tighten(current: u32, tighter: Option<u32>) -> u32 {
    match tighter {
        Some(t) if t > 0 && t < current => t,
        _ => current,
    }
}

/// A server's call budgets narrowed by its profile and the request.
pub(crate) fn call_budgets(
    server: &ServerBudgets,
    profile: Option<&ProfileBudgets>,
    request: &RequestBudgets,
) -> CallBudgets {
    let mut timeout = server.tool_timeout_ms();
    let mut output = server.max_tool_output_bytes();
    if let Some(p) = profile {
        timeout = tighten(timeout, p.tool_timeout_ms);
        output = tighten(output, p.max_tool_output_bytes);
    }
    CallBudgets {
        tool_timeout_ms: tighten(timeout, request.tool_timeout_ms),
        max_tool_output_bytes: tighten(output, request.max_tool_output_bytes),
        max_concurrency: server.max_concurrency(),
    }
}

/// A profile's loop budgets narrowed by the request.
pub(crate) fn loop_budgets(profile: Option<&ProfileBudgets>, request: &RequestBudgets) -> LoopBudgets {
    let p = profile.cloned().unwrap_or_default();
    LoopBudgets {
        max_iterations: tighten(p.max_iterations(), request.max_iterations),
        max_total_tool_calls: tighten(p.max_total_tool_calls(), request.max_total_tool_calls),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_only_tighten() {
        let server = ServerBudgets {
            tool_timeout_ms: Some(10_000),
            max_concurrency: Some(2),
            max_tool_output_bytes: None,
            ..Default::default()
        };
        let profile =
            ProfileBudgets { tool_timeout_ms: Some(60_000), max_tool_output_bytes: Some(1024), ..Default::default() };
        let request =
            RequestBudgets { tool_timeout_ms: Some(500), max_tool_output_bytes: Some(1_000_000), ..Default::default() };
        let b = call_budgets(&server, Some(&profile), &request);
        assert_eq!(b, CallBudgets { tool_timeout_ms: 500, max_tool_output_bytes: 1024, max_concurrency: 2 });
    }

    #[test]
    fn defaults_apply_without_layers() {
        let b = call_budgets(&ServerBudgets::default(), None, &RequestBudgets::default());
        assert_eq!(b, CallBudgets { tool_timeout_ms: 30_000, max_tool_output_bytes: 65_536, max_concurrency: 8 });
        let l = loop_budgets(
            None,
            &RequestBudgets { max_iterations: Some(100), max_total_tool_calls: Some(3), ..Default::default() },
        );
        assert_eq!(l, LoopBudgets { max_iterations: 8, max_total_tool_calls: 3 });
    }

    #[test]
    fn zero_never_wins() {
        assert_eq!(tighten(5, Some(0)), 5);
    }
}
