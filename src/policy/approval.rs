//! Approval policy lookup: which mode (`never` / `always` / `destructiveHint`) applies to a tool,
//! and whether a call of it needs approval ([`needs_approval`]).
//!
//! `destructiveHint` reads the tool's MCP annotations, which are the server's claims: they can
//! only spare a call the approval this mode asks for, never allow a tool the policy does not
//! expose, and never loosen `always`. A tool that makes no claim is treated as MCP's defaults
//! describe it (not read-only, destructive), so it needs approval.
//!
//! Most specific wins: an exact tool name beats every pattern; among matching patterns, the one
//! with more literal (non-wildcard) characters wins, then the longer one, then the one that
//! sorts first, so the choice never depends on map order. No match: the policy's `default`.

use globset::{GlobBuilder, GlobMatcher};

use super::pattern::PatternError;
use crate::api::validate::check_tool_pattern;
use crate::api::{ApprovalMode, ApprovalPolicy};

/// An approval policy compiled for lookups.
#[derive(Clone, Debug)]
pub(crate) struct CompiledApproval {
    default: ApprovalMode,
    /// Patterns in the order they are tried: most specific first.
    rules: Vec<(Option<GlobMatcher>, String, ApprovalMode)>,
}

fn specificity(pattern: &str) -> (usize, usize) {
    (pattern.chars().filter(|c| !matches!(c, '*' | '?')).count(), pattern.len())
}

impl CompiledApproval {
    /// Compiles `policy` (absent means every tool is `never`).
    pub(crate) fn new(policy: Option<&ApprovalPolicy>) -> Result<Self, PatternError> {
        let Some(policy) = policy else {
            return Ok(CompiledApproval { default: ApprovalMode::Never, rules: Vec::new() });
        };
        let mut rules = Vec::with_capacity(policy.tools.len());
        for (pattern, mode) in &policy.tools {
            check_tool_pattern(pattern).map_err(|(message, _)| PatternError { pattern: pattern.clone(), message })?;
            let is_literal = !pattern.contains(['*', '?']);
            let matcher = if is_literal {
                None
            } else {
                let glob = GlobBuilder::new(pattern)
                    .literal_separator(false)
                    .backslash_escape(false)
                    .build()
                    .map_err(|e| PatternError { pattern: pattern.clone(), message: e.to_string() })?;
                Some(glob.compile_matcher())
            };
            rules.push((matcher, pattern.clone(), *mode));
        }
        // Exact names first, then by specificity (descending), then by pattern text.
        rules.sort_by(|a, b| {
            (a.0.is_some(), std::cmp::Reverse(specificity(&a.1)), &a.1).cmp(&(
                b.0.is_some(),
                std::cmp::Reverse(specificity(&b.1)),
                &b.1,
            ))
        });
        Ok(CompiledApproval { default: policy.default, rules })
    }

    /// The mode for `tool`.
    pub(crate) fn mode_for(&self, tool: &str) -> ApprovalMode {
        self.rules
            .iter()
            .find(|(matcher, pattern, _)| match matcher {
                None => pattern == tool,
                Some(m) => m.is_match(tool),
            })
            .map_or(self.default, |(_, _, mode)| *mode)
    }
}

/// Whether a call of a tool under `mode` needs approval, given the tool's `annotations` (the
/// `annotations` object its server listed, if any).
pub(crate) fn needs_approval(mode: ApprovalMode, annotations: Option<&serde_json::Value>) -> bool {
    match mode {
        ApprovalMode::Never => false,
        ApprovalMode::Always => true,
        ApprovalMode::DestructiveHint => {
            let hint = |name: &str| annotations.and_then(|a| a.get(name)).and_then(serde_json::Value::as_bool);
            !(hint("readOnlyHint") == Some(true) || hint("destructiveHint") == Some(false))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use ApprovalMode::{Always, DestructiveHint, Never};

    #[test]
    fn destructive_hint_spares_only_tools_that_claim_to_be_harmless() {
        let annotated = |json: serde_json::Value| needs_approval(DestructiveHint, Some(&json));
        assert!(!annotated(serde_json::json!({"readOnlyHint": true})), "read-only");
        assert!(!annotated(serde_json::json!({"destructiveHint": false})), "additive only");
        assert!(annotated(serde_json::json!({"destructiveHint": true})));
        assert!(annotated(serde_json::json!({"readOnlyHint": false})), "MCP's default: destructive");
        assert!(annotated(serde_json::json!({"readOnlyHint": "true", "destructiveHint": 0})), "not booleans: no claim");
        assert!(needs_approval(DestructiveHint, None), "no annotations: no claim");
        // The other modes ignore the claims.
        assert!(needs_approval(Always, Some(&serde_json::json!({"readOnlyHint": true}))));
        assert!(!needs_approval(Never, Some(&serde_json::json!({"destructiveHint": true}))));
    }

    fn policy(default: ApprovalMode, tools: &[(&str, ApprovalMode)]) -> CompiledApproval {
        let tools: BTreeMap<String, ApprovalMode> = tools.iter().map(|(p, m)| (p.to_string(), *m)).collect();
        CompiledApproval::new(Some(&ApprovalPolicy { default, tools })).expect("valid policy")
    }

    #[test]
    fn exact_name_beats_any_pattern() {
        let p = policy(Never, &[("write_*", Always), ("write_log", Never), ("*", Always)]);
        assert_eq!(p.mode_for("write_log"), Never);
        assert_eq!(p.mode_for("write_file"), Always);
    }

    #[test]
    fn more_literal_characters_win() {
        let p = policy(Always, &[("*", Never), ("read_*", Always), ("read_secret_*", Never)]);
        assert_eq!(p.mode_for("read_secret_key"), Never);
        assert_eq!(p.mode_for("read_file"), Always);
        assert_eq!(p.mode_for("list"), Never);
    }

    #[test]
    fn default_applies_when_nothing_matches() {
        assert_eq!(policy(Always, &[("read_*", Never)]).mode_for("write"), Always);
        assert_eq!(CompiledApproval::new(None).expect("no policy").mode_for("x"), Never);
    }
}
