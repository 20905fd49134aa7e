//! The effective set: which servers and tools one request may use, and why the rest may not.
//!
//! ```text
//! Snapshot + profile name ──compile (once per snapshot revision)──▶ CompiledProfile
//!      allowed servers = profile.servers ∪ selector matches; patterns compiled; budgets; names
//!
//! CompiledProfile + tool lists + request scope + caller tool names ──effective()──▶ EffectiveSet
//!      servers = allowed ∩ registry ∩ (requested | defaults)
//!      tools   = server allowedTools ∩ profile allowlist ∩ request allowlist − every denylist
//!      + model-facing names, route table, budgets, and a decision for everything excluded
//! ```
//!
//! Each layer can only narrow: a request naming a server outside the profile is an error
//! (`mcp_policy_denied`), never a silent drop. Deny always wins over allow. Pure: tool lists
//! come in as data (from the client pool's cache, or nothing when deciding on patterns alone).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use super::approval::CompiledApproval;
use super::budget::{self, CallBudgets, LoopBudgets, RequestBudgets};
use super::name::{self, Route, RouteTable};
use super::pattern::{PatternError, PatternSet};
use crate::api::{ApprovalMode, McpProfile, McpServer};
use crate::registry::snapshot::{Revision, Snapshot};

// === inputs ===

/// A tool as a server lists it: what the policy needs, shared cheaply.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// The tool's name on its server.
    pub name: Arc<str>,
    /// Its description, passed through to the model.
    pub description: Option<Arc<str>>,
    /// Its JSON Schema for arguments, passed through to the model.
    pub input_schema: Arc<serde_json::Value>,
}

impl ToolInfo {
    /// A tool with a name only (tests, benches, explain).
    pub fn named(name: &str) -> Self {
        ToolInfo { name: name.into(), description: None, input_schema: Arc::new(serde_json::json!({"type": "object"})) }
    }
}

/// One server's tool list with model-facing base names computed once, when the list is cached.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolList {
    server_part: String,
    tools: Vec<(ToolInfo, Arc<str>)>,
}

impl ToolList {
    /// Names `tools` for the server whose name part is `server_part` (its `toolNamespace` or id).
    pub fn new(server_part: &str, tools: Vec<ToolInfo>) -> Self {
        let tools = tools
            .into_iter()
            .map(|t| {
                let base: Arc<str> = name::base_name(server_part, &t.name).into();
                (t, base)
            })
            .collect();
        ToolList { server_part: server_part.to_string(), tools }
    }

    /// The tools with their base names.
    pub fn tools(&self) -> &[(ToolInfo, Arc<str>)] {
        &self.tools
    }
}

/// What the agent knows about a server's tools.
#[derive(Clone, Debug, PartialEq)]
pub enum ServerTools {
    /// Listed (from the pool's cache).
    Listed(Arc<ToolList>),
    /// Not listed (yet): decide on servers and patterns alone.
    Unknown,
    /// A variable the server's config references is not set.
    EnvMissing {
        /// The variable's name.
        variable: String,
    },
    /// `tools/list` failed.
    ListFailed {
        /// Why (no secret values).
        message: String,
    },
}

/// Request-level narrowing: the `mcp` object of a chat request, a gRPC call's scope.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestScope {
    /// Servers to use; each must be allowed by the profile. Absent: the profile's defaults.
    #[serde(alias = "server_ids")]
    pub servers: Option<Vec<String>>,
    /// Only tools matching one of these (tool name or `server/tool`). Absent: no narrowing.
    pub tool_allowlist: Option<Vec<String>>,
    /// Never tools matching these.
    pub tool_denylist: Vec<String>,
    /// Budgets that apply where lower than the profile's and servers'.
    pub budgets: RequestBudgets,
}

// === outputs ===

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

/// Why a server or tool is not exposed (DESIGN.md "Revision and explanation").
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The profile names a server the registry does not have.
    UnknownServer,
    /// The registry has the server, the profile does not allow it.
    NotInProfile,
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
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::UnknownServer => f.write_str("unknown_server"),
            Reason::NotInProfile => f.write_str("not_in_profile"),
            Reason::DenyAllServer => f.write_str("deny_all_server"),
            Reason::NotAllowedBy(layer) => write!(f, "not_allowed_by:{layer}"),
            Reason::DeniedBy(layer) => write!(f, "denied_by:{layer}"),
            Reason::EnvMissing => f.write_str("env_missing"),
            Reason::ListFailed => f.write_str("list_failed"),
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
    pub server: String,
    /// The tool, for a tool-level decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Why it is excluded.
    pub reason: Reason,
    /// Details (the missing variable, the list error, the pattern layer); never a secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A tool exposed to the workload.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveTool {
    /// The model-facing name.
    pub name: Arc<str>,
    /// The tool as the server lists it.
    pub tool: ToolInfo,
    /// Whether a call needs approval.
    pub approval: ApprovalMode,
}

/// A server the workload may use, with its tools and budgets.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveServer {
    /// The McpServer's `metadata.name`.
    pub id: Arc<str>,
    /// The server part of its tool names.
    pub server_part: Arc<str>,
    /// Call budgets after every layer.
    pub budgets: CallBudgets,
    /// Exposed tools; `None` when the server's tools are not known (decided on patterns alone).
    pub tools: Option<Vec<EffectiveTool>>,
}

/// The result: what one request may use, the routes back, and why everything else is excluded.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveSet {
    /// The snapshot revision the decision used.
    pub revision: Revision,
    /// The profile.
    pub profile: String,
    /// Servers in use, by id.
    pub servers: Vec<EffectiveServer>,
    /// Model-facing name → (server, tool).
    pub routes: RouteTable,
    /// Every exclusion, sorted.
    pub decisions: Vec<Decision>,
    /// Loop budgets after every layer.
    pub loop_budgets: LoopBudgets,
}

impl EffectiveSet {
    /// Every exposed tool, in server order then list order.
    pub fn tools(&self) -> impl Iterator<Item = (&EffectiveServer, &EffectiveTool)> {
        self.servers.iter().flat_map(|s| s.tools.iter().flatten().map(move |t| (s, t)))
    }
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
        /// The profile.
        profile: String,
    },
    /// A pattern does not compile.
    #[error("{layer} pattern: {source}")]
    InvalidPattern {
        /// Where the pattern is.
        layer: Layer,
        /// The pattern error.
        #[source]
        source: PatternError,
    },
}

impl PolicyError {
    /// The DESIGN.md error code.
    pub fn code(&self) -> &'static str {
        match self {
            PolicyError::UnknownProfile { .. } | PolicyError::ServerNotInProfile { .. } => "mcp_policy_denied",
            PolicyError::InvalidPattern { layer: Layer::Request, .. } => "mcp_invalid_arguments",
            PolicyError::InvalidPattern { .. } => "mcp_policy_denied",
        }
    }
}

// === compile ===

/// Tool-name patterns of one layer, split by what they match against: patterns with a `/` match
/// `server/tool`, the others the bare tool name.
#[derive(Clone, Debug)]
struct LayerPatterns {
    bare: PatternSet,
    qualified: PatternSet,
}

impl LayerPatterns {
    fn new(patterns: &[String], layer: Layer) -> Result<Self, PolicyError> {
        let (q, b): (Vec<&String>, Vec<&String>) = patterns.iter().partition(|p| p.contains('/'));
        let compile =
            |p: &[&String]| PatternSet::new(p).map_err(|source| PolicyError::InvalidPattern { layer, source });
        Ok(LayerPatterns { bare: compile(&b)?, qualified: compile(&q)? })
    }

    /// `qualified_name` is filled lazily (`server/tool`) into a reused buffer.
    fn is_match(&self, server: &str, tool: &str, buffer: &mut String) -> bool {
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

#[derive(Clone, Debug)]
struct CompiledServer {
    id: Arc<str>,
    server_part: Arc<str>,
    allowed: PatternSet,
    denied: PatternSet,
    approval: CompiledApproval,
    spec: Arc<McpServer>,
    /// Another server in the profile has the same name part: names are checked for collisions.
    shares_part: bool,
}

/// A profile compiled against one snapshot: reuse it for every request until the revision moves.
#[derive(Clone, Debug)]
pub struct CompiledProfile {
    revision: Revision,
    profile: String,
    spec: Arc<McpProfile>,
    /// Allowed servers present in the registry, by id (sorted).
    servers: BTreeMap<String, CompiledServer>,
    /// Exclusions that hold for every request (not_in_profile, unknown_server, deny_all_server).
    static_decisions: Vec<Decision>,
    /// Allowed server ids, including the ones missing from the registry.
    allowed: BTreeSet<String>,
    allow: Option<LayerPatterns>,
    deny: LayerPatterns,
}

/// Whether `selector` matches `labels` (matchLabels and matchExpressions, as Kubernetes does).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => labels.get(&req.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&req.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&req.key),
            "DoesNotExist" => !labels.contains_key(&req.key),
            // Validation refuses other operators; an unknown one matches nothing (deny by default).
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

fn decision(server: &str, tool: Option<&str>, reason: Reason, detail: Option<String>) -> Decision {
    Decision { server: server.to_string(), tool: tool.map(str::to_string), reason, detail }
}

impl CompiledProfile {
    /// Compiles `profile` against `snapshot`.
    pub fn compile(snapshot: &Snapshot, profile: &str) -> Result<Self, PolicyError> {
        let spec = snapshot
            .profile(profile)
            .ok_or_else(|| PolicyError::UnknownProfile {
                profile: profile.to_string(),
                revision: snapshot.revision().clone(),
            })?
            .object
            .clone();
        let p = &spec.spec;

        let mut allowed: BTreeSet<String> = p.servers.iter().cloned().collect();
        if let Some(selector) = &p.server_selector {
            for (id, server) in snapshot.servers() {
                if selector_matches(selector, server.object.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())) {
                    allowed.insert(id.clone());
                }
            }
        }

        let mut static_decisions = Vec::new();
        let mut servers = BTreeMap::new();
        for (id, server) in snapshot.servers() {
            if !allowed.contains(id) {
                static_decisions.push(decision(id, None, Reason::NotInProfile, None));
                continue;
            }
            let s = &server.object.spec;
            let server_part: Arc<str> = s.tool_namespace.as_deref().unwrap_or(id).into();
            let compile = |patterns: &[String]| {
                PatternSet::new(patterns).map_err(|source| PolicyError::InvalidPattern { layer: Layer::Server, source })
            };
            let approval = CompiledApproval::new(s.approval_policy.as_ref())
                .map_err(|source| PolicyError::InvalidPattern { layer: Layer::Server, source })?;
            servers.insert(
                id.clone(),
                CompiledServer {
                    id: id.as_str().into(),
                    server_part,
                    allowed: compile(&s.allowed_tools)?,
                    denied: compile(&s.denied_tools)?,
                    approval,
                    spec: server.object.clone(),
                    shares_part: false,
                },
            );
        }
        for id in &allowed {
            if !snapshot.servers().contains_key(id) {
                static_decisions.push(decision(id, None, Reason::UnknownServer, None));
            }
        }
        // Servers sharing a name part (a toolNamespace equal to another's) get checked names.
        let mut parts: BTreeMap<Arc<str>, usize> = BTreeMap::new();
        for s in servers.values() {
            *parts.entry(s.server_part.clone()).or_default() += 1;
        }
        for s in servers.values_mut() {
            s.shares_part = parts.get(&s.server_part).copied().unwrap_or(0) > 1;
        }

        let allow = p.tool_allowlist.as_deref().map(|a| LayerPatterns::new(a, Layer::Profile)).transpose()?;
        let deny = LayerPatterns::new(&p.tool_denylist, Layer::Profile)?;
        Ok(CompiledProfile {
            revision: snapshot.revision().clone(),
            profile: profile.to_string(),
            spec,
            servers,
            static_decisions,
            allowed,
            allow,
            deny,
        })
    }

    /// The revision this was compiled against.
    pub fn revision(&self) -> &Revision {
        &self.revision
    }

    /// The effective set for one request. `tools` says what is known of each server's tools;
    /// `caller_tools` are the names of the request's own tools, which MCP names never shadow.
    pub fn effective(
        &self,
        tools: impl Fn(&str) -> ServerTools,
        request: Option<&RequestScope>,
        caller_tools: &[&str],
    ) -> Result<EffectiveSet, PolicyError> {
        let default_scope = RequestScope::default();
        let scope = request.unwrap_or(&default_scope);
        let p = &self.spec.spec;

        // Which servers: requested (each must be allowed) or the profile's defaults.
        let (wanted, narrowing_layer): (Option<BTreeSet<&str>>, Layer) = match &scope.servers {
            Some(requested) => {
                if let Some(bad) = requested.iter().find(|s| !self.allowed.contains(*s)) {
                    return Err(PolicyError::ServerNotInProfile { server: bad.clone(), profile: self.profile.clone() });
                }
                (Some(requested.iter().map(String::as_str).collect()), Layer::Request)
            }
            None => {
                (p.default_servers.as_ref().map(|d| d.iter().map(String::as_str).collect()), Layer::ProfileDefaults)
            }
        };
        let request_allow =
            scope.tool_allowlist.as_deref().map(|a| LayerPatterns::new(a, Layer::Request)).transpose()?;
        let request_deny = LayerPatterns::new(&scope.tool_denylist, Layer::Request)?;

        let mut decisions = self.static_decisions.clone();
        let mut servers = Vec::with_capacity(self.servers.len());
        let mut routes = RouteTable::default();
        let caller: HashSet<&str> = caller_tools.iter().copied().collect();
        // Names that might collide (shortened, shared server part, renamed): checked as a set.
        let mut checked: HashSet<Arc<str>> = HashSet::new();
        let mut buffer = String::new();

        for (id, server) in &self.servers {
            if wanted.as_ref().is_some_and(|w| !w.contains(id.as_str())) {
                decisions.push(decision(id, None, Reason::NotAllowedBy(narrowing_layer), None));
                continue;
            }
            if server.allowed.is_empty() {
                decisions.push(decision(id, None, Reason::DenyAllServer, None));
                continue;
            }
            let budgets = budget::call_budgets(
                &server.spec.spec.budgets.clone().unwrap_or_default(),
                p.budgets.as_ref(),
                &scope.budgets,
            );
            let list = match tools(id) {
                ServerTools::Listed(list) => list,
                ServerTools::Unknown => {
                    servers.push(EffectiveServer {
                        id: server.id.clone(),
                        server_part: server.server_part.clone(),
                        budgets,
                        tools: None,
                    });
                    continue;
                }
                ServerTools::EnvMissing { variable } => {
                    decisions.push(decision(id, None, Reason::EnvMissing, Some(variable)));
                    continue;
                }
                ServerTools::ListFailed { message } => {
                    decisions.push(decision(id, None, Reason::ListFailed, Some(message)));
                    continue;
                }
            };
            // A list cached under an older toolNamespace is renamed here (rare: config changes
            // invalidate the cache).
            let renamed;
            let list: &ToolList = if list.server_part == *server.server_part {
                &list
            } else {
                let infos = list.tools.iter().map(|(t, _)| t.clone()).collect();
                renamed = ToolList::new(&server.server_part, infos);
                &renamed
            };

            let mut exposed = Vec::with_capacity(list.tools.len());
            for (tool, base) in &list.tools {
                let t: &str = &tool.name;
                let reason = if !server.allowed.is_match(t) {
                    Some(Reason::NotAllowedBy(Layer::Server))
                } else if server.denied.is_match(t) {
                    Some(Reason::DeniedBy(Layer::Server))
                } else if self.allow.as_ref().is_some_and(|a| !a.is_match(id, t, &mut buffer)) {
                    Some(Reason::NotAllowedBy(Layer::Profile))
                } else if self.deny.is_match(id, t, &mut buffer) {
                    Some(Reason::DeniedBy(Layer::Profile))
                } else if request_allow.as_ref().is_some_and(|a| !a.is_match(id, t, &mut buffer)) {
                    Some(Reason::NotAllowedBy(Layer::Request))
                } else if request_deny.is_match(id, t, &mut buffer) {
                    Some(Reason::DeniedBy(Layer::Request))
                } else {
                    None
                };
                if let Some(reason) = reason {
                    decisions.push(decision(id, Some(t), reason, None));
                    continue;
                }
                let needs_check = server.shares_part || name::may_collide(base) || caller.contains(&**base);
                let model_name = if needs_check {
                    // Of servers sharing a name part, the one whose id is the part keeps the
                    // plain names; the others always get names keyed by their own id, so adding
                    // a server never renames another's tools.
                    let keep_base = !server.shares_part || *server.id == *server.server_part;
                    let taken = |n: &str| caller.contains(n) || checked.contains(n);
                    let free = name::free_name(base, &server.server_part, &server.id, t, keep_base, taken);
                    let free: Arc<str> = free.into();
                    checked.insert(free.clone());
                    free
                } else {
                    base.clone()
                };
                routes.insert(model_name.clone(), Route { server: server.id.clone(), tool: tool.name.clone() });
                exposed.push(EffectiveTool {
                    name: model_name,
                    tool: tool.clone(),
                    approval: server.approval.mode_for(t),
                });
            }
            servers.push(EffectiveServer {
                id: server.id.clone(),
                server_part: server.server_part.clone(),
                budgets,
                tools: Some(exposed),
            });
        }
        decisions.sort();
        Ok(EffectiveSet {
            revision: self.revision.clone(),
            profile: self.profile.clone(),
            servers,
            routes,
            decisions,
            loop_budgets: budget::loop_budgets(p.budgets.as_ref(), &scope.budgets),
        })
    }
}

#[cfg(test)]
#[path = "effective_tests.rs"]
mod tests;
