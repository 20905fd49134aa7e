//! Approval policy lookup: which mode (`never` / `always`) applies to a tool.
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use ApprovalMode::{Always, Never};

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
