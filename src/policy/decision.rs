//! The words every file of `policy` shares: a tool as listed ([`ToolInfo`]) and as exposed
//! ([`EffectiveTool`]), the policy's [`Layer`]s, why something is excluded ([`Reason`],
//! [`Decision`]), why no set can be computed ([`PolicyError`]), a server's start in progress
//! ([`Starting`]), and one layer's compiled tool patterns (`LayerPatterns`).
//!
//! ```text
//! decision ◀── items, rank, select, effective, explain      (decision imports none of them)
//! ```
//!
//! Plain data and small pure functions; the decisions themselves are made in [`super::effective`]
//! (tools) and [`super::items`] (resources and prompts).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::pattern::{PatternError, PatternSet};
use crate::api::ApprovalMode;
use crate::registry::snapshot::Revision;

/// A tool as a server lists it: what the policy needs, shared cheaply.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// The tool's name on its server.
    pub(crate) name: Arc<str>,
    /// Its description, passed through to the model.
    pub description: Option<Arc<str>>,
    /// Its JSON Schema for arguments, passed through to the model.
    pub(crate) input_schema: Arc<serde_json::Value>,
    /// What else the server lists for the tool and `/mcp` passes on under the namespaced name
    /// (`title`, `annotations`, `outputSchema`, `icons`, as MCP spells them); `None` when it lists
    /// none of them. The server's claims, never read by the policy: a `readOnlyHint` allows
    /// nothing.
    pub(crate) metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
}

impl ToolInfo {
    /// A tool with a name only (tests, benches, explain).
    pub fn named(name: &str) -> Self {
        ToolInfo {
            name: name.into(),
            description: None,
            input_schema: Arc::new(serde_json::json!({"type": "object"})),
            metadata: None,
        }
    }
}

/// A server's start in progress: what runs, since when, within which budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Starting {
    /// What runs or is reached: the stdio command's file name (`npx`), `sidecar` or `http`.
    pub what: String,
    /// When the start began.
    pub since: SystemTime,
    /// The server's `budgets.startupTimeoutMs`.
    pub budget: Duration,
}

impl Starting {
    /// "starting (npx), 14 s of 120 s" as of `now`.
    pub fn describe(&self, now: SystemTime) -> String {
        let elapsed = now.duration_since(self.since).unwrap_or_default();
        format!("starting ({}), {} s of {} s", self.what, elapsed.as_secs(), self.budget.as_secs())
    }
}

/// A layer of the policy, as named in decision reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// The McpServer's allowedTools / deniedTools.
    Server,
    /// The McpProfile's toolAllowlist / toolDenylist.
    Profile,
    /// The McpProfile's defaultServers (a request that names no server).
    ProfileDefaults,
    /// The request's scope.
    Request,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Server => "server",
            Layer::Profile => "profile",
            Layer::ProfileDefaults => "profile_defaults",
            Layer::Request => "request",
        })
    }
}

/// Why a server or tool is not exposed: the reasons `spearlet explain` and `/debug/effective`
/// print.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The profile names a server the registry does not have.
    UnknownServer,
    /// The registry has the server, the profile does not allow it.
    NotInProfile,
    /// The profile allows the server, its `spec.enabled` is false.
    Disabled,
    /// The server's allowedTools is empty: nothing is exposed.
    DenyAllServer,
    /// The layer's allowlist does not match.
    NotAllowedBy(Layer),
    /// The layer's denylist matches.
    DeniedBy(Layer),
    /// A variable the server needs is not set.
    EnvMissing,
    /// Listing the server's tools failed.
    ListFailed,
    /// The server is still starting (its package may be downloading).
    Starting,
    /// A resource URI spelled so that a server resolving paths could read something other than
    /// what the patterns matched (`..`, `//`, `%2e`, ...): refused before matching.
    UnsafeUri,
    /// The server lists the tool with a definition other than its pin (`spec.pinning`).
    PinMismatch,
    /// The server lists a tool `spec.pinning` has no pin for.
    NotPinned,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::UnknownServer => f.write_str("unknown_server"),
            Reason::NotInProfile => f.write_str("not_in_profile"),
            Reason::Disabled => f.write_str("disabled"),
            Reason::DenyAllServer => f.write_str("deny_all_server"),
            Reason::NotAllowedBy(layer) => write!(f, "not_allowed_by:{layer}"),
            Reason::DeniedBy(layer) => write!(f, "denied_by:{layer}"),
            Reason::EnvMissing => f.write_str("env_missing"),
            Reason::ListFailed => f.write_str("list_failed"),
            Reason::Starting => f.write_str("starting"),
            Reason::UnsafeUri => f.write_str("unsafe_uri"),
            Reason::PinMismatch => f.write_str("pin_mismatch"),
            Reason::NotPinned => f.write_str("not_pinned"),
        }
    }
}

impl Reason {
    /// The reason as a fixed string: its [`Display`](fmt::Display) spelling, without allocating,
    /// for bounded label values and audit fields.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Reason::UnknownServer => "unknown_server",
            Reason::NotInProfile => "not_in_profile",
            Reason::Disabled => "disabled",
            Reason::DenyAllServer => "deny_all_server",
            Reason::NotAllowedBy(Layer::Server) => "not_allowed_by:server",
            Reason::NotAllowedBy(Layer::Profile) => "not_allowed_by:profile",
            Reason::NotAllowedBy(Layer::ProfileDefaults) => "not_allowed_by:profile_defaults",
            Reason::NotAllowedBy(Layer::Request) => "not_allowed_by:request",
            Reason::DeniedBy(Layer::Server) => "denied_by:server",
            Reason::DeniedBy(Layer::Profile) => "denied_by:profile",
            Reason::DeniedBy(Layer::ProfileDefaults) => "denied_by:profile_defaults",
            Reason::DeniedBy(Layer::Request) => "denied_by:request",
            Reason::EnvMissing => "env_missing",
            Reason::ListFailed => "list_failed",
            Reason::Starting => "starting",
            Reason::UnsafeUri => "unsafe_uri",
            Reason::PinMismatch => "pin_mismatch",
            Reason::NotPinned => "not_pinned",
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One exclusion in the decision log.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Decision {
    /// The server concerned.
    pub(crate) server: String,
    /// The tool, for a tool-level decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tool: Option<String>,
    /// Why it is excluded.
    pub(crate) reason: Reason,
    /// Details (the missing variable, the list error, the pattern layer); never a secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<String>,
}

/// A tool exposed to the workload.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveTool {
    /// The model-facing name.
    pub name: Arc<str>,
    /// The tool as the server lists it.
    pub tool: ToolInfo,
    /// Whether a call needs approval.
    pub(crate) approval: ApprovalMode,
    /// Served under `pinning.mode: warn` although it does not match its pin: why
    /// ([`Reason::PinMismatch`] or [`Reason::NotPinned`]).
    pub(crate) pin_warning: Option<Reason>,
}

/// Why no effective set can be computed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The profile does not exist in the snapshot.
    #[error("McpProfile '{profile}' does not exist (registry revision {revision})")]
    UnknownProfile {
        /// The profile asked for.
        profile: String,
        /// The revision looked at.
        revision: Revision,
    },
    /// The request names a server the profile does not allow.
    #[error("server '{server}' is not allowed by McpProfile '{profile}'")]
    ServerNotInProfile {
        /// The server asked for.
        server: String,
        profile: String,
    },
    /// A pattern does not compile.
    #[error("{layer} pattern: {source}")]
    InvalidPattern {
        /// Where the pattern is.
        layer: Layer,
        #[source]
        source: PatternError,
    },
}

impl PolicyError {
    /// The error code a caller sees (`mcp_policy_denied` or `mcp_invalid_arguments`).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            PolicyError::UnknownProfile { .. } | PolicyError::ServerNotInProfile { .. } => "mcp_policy_denied",
            PolicyError::InvalidPattern { layer: Layer::Request, .. } => "mcp_invalid_arguments",
            PolicyError::InvalidPattern { .. } => "mcp_policy_denied",
        }
    }

    /// Why a call is refused over this error, as a fixed string (the audit's and metrics' reason).
    pub(crate) fn label(&self) -> &'static str {
        match self {
            PolicyError::UnknownProfile { .. } => "profile_unavailable",
            PolicyError::ServerNotInProfile { .. } => "not_in_profile",
            PolicyError::InvalidPattern { .. } => "invalid_pattern",
        }
    }
}

/// Tool-name patterns of one layer, split by what they match against: patterns with a `/` match
/// `server/tool`, the others the bare tool name.
#[derive(Clone, Debug)]
pub(super) struct LayerPatterns {
    bare: PatternSet,
    qualified: PatternSet,
}

impl LayerPatterns {
    pub(super) fn new(patterns: &[String], layer: Layer) -> Result<Self, PolicyError> {
        let (q, b): (Vec<&String>, Vec<&String>) = patterns.iter().partition(|p| p.contains('/'));
        let compile =
            |p: &[&String]| PatternSet::new(p).map_err(|source| PolicyError::InvalidPattern { layer, source });
        Ok(LayerPatterns { bare: compile(&b)?, qualified: compile(&q)? })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bare.is_empty() && self.qualified.is_empty()
    }

    /// `qualified_name` is filled lazily (`server/tool`) into a reused buffer.
    pub(super) fn is_match(&self, server: &str, tool: &str, buffer: &mut String) -> bool {
        if self.bare.is_match(tool) {
            return true;
        }
        if self.qualified.is_empty() {
            return false;
        }
        buffer.clear();
        buffer.push_str(server);
        buffer.push('/');
        buffer.push_str(tool);
        self.qualified.is_match(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::{Layer, Reason};

    #[test]
    fn a_label_is_the_display_spelling() {
        let layers = [Layer::Server, Layer::Profile, Layer::ProfileDefaults, Layer::Request];
        let mut reasons = vec![
            Reason::UnknownServer,
            Reason::NotInProfile,
            Reason::Disabled,
            Reason::DenyAllServer,
            Reason::EnvMissing,
            Reason::ListFailed,
            Reason::Starting,
            Reason::UnsafeUri,
            Reason::PinMismatch,
            Reason::NotPinned,
        ];
        reasons.extend(layers.iter().flat_map(|l| [Reason::NotAllowedBy(*l), Reason::DeniedBy(*l)]));
        for reason in reasons {
            assert_eq!(reason.label(), reason.to_string());
        }
    }
}
