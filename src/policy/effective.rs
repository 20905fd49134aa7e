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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::approval::CompiledApproval;
use super::budget::{self, CallBudgets, LoopBudgets, RequestBudgets};
use super::decision::{Decision, EffectiveTool, Layer, LayerPatterns, PolicyError, Reason, Starting, ToolInfo};
use super::items::{CompiledItems, ItemKind};
use super::name::{self, Route, RouteTable};
use super::pattern::PatternSet;
use super::pin::CompiledPins;
use super::rank::CatalogRank;
use super::rate_limit::RateRules;
use crate::api::{McpProfile, McpServer, PinMode};
use crate::registry::snapshot::{Revision, Snapshot};

// === inputs ===

/// One server's tool list with model-facing base names computed once, when the list is cached.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolList {
    server_part: String,
    tools: Vec<(ToolInfo, Arc<str>)>,
}

impl ToolList {
    /// Names `tools` for the server whose name part is `server_part` (its `toolNamespace` or id).
    /// A name the server lists twice is kept once, the first: two functions of one name would
    /// make the model API refuse the whole request, and routing could only reach one of them.
    pub fn new(server_part: &str, tools: Vec<ToolInfo>) -> Self {
        let mut seen = HashSet::with_capacity(tools.len());
        let tools = tools
            .into_iter()
            .filter(|t| seen.insert(t.name.clone()))
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
        /// The server's start failed for a reason only a configuration change ends (its
        /// authorization is refused, it has no sidecar here): calls are refused at once.
        lasting: bool,
    },
    /// Being started (spawned or connected, initialized, listed), within its startup budget.
    Starting(Starting),
}

impl Listing {
    /// One line for people: "listed, 12 tools", "starting (npx), 14 s of 120 s", the failure.
    pub(crate) fn describe(&self, tools: Option<usize>, now: SystemTime) -> String {
        match self {
            Listing::Listed => format!("listed, {} tools", tools.unwrap_or(0)),
            Listing::NotYet => "not listed yet".to_string(),
            Listing::Failed { message, .. } => format!("tools/list failed: {message}"),
            Listing::EnvMissing(variable) => format!("needs the variable {variable}, which is not set"),
            Listing::DenyAll => "allowedTools is empty: nothing is exposed".to_string(),
            Listing::Starting(starting) => starting.describe(now),
        }
    }

    /// The state's name, as `spearlet tools list` and the gRPC `Server.state` give it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Listing::Listed => "listed",
            Listing::NotYet => "not_listed",
            Listing::Failed { .. } => "list_failed",
            Listing::EnvMissing(_) => "env_missing",
            Listing::DenyAll => "deny_all",
            Listing::Starting(_) => "starting",
        }
    }
}

/// Where a server's tool list stands: what a call naming one of its tools before the list is
/// known is told (wait and retry, or a refusal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Listing {
    /// Listed: its tools are in the route table.
    Listed,
    /// Not listed yet (the agent is starting, or the server is being connected and listed).
    NotYet,
    /// The last `tools/list` failed; the agent retries with backoff. `lasting`: the start failed
    /// for a reason only a configuration change ends, and calls are refused meanwhile.
    Failed { message: String, lasting: bool },
    /// Being started; its tools are listed when the start ends.
    Starting(Starting),
    /// A variable the server's configuration needs is not set: only a configuration change helps.
    EnvMissing(String),
    /// Its allowedTools is empty: nothing of it is ever exposed.
    DenyAll,
}

/// A name that routes nowhere yet belongs to an allowed server whose list is not known: the call
/// may wait for the list (within `budgets`) instead of being refused by policy.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Unlisted {
    /// The server the name belongs to.
    pub(crate) server: Arc<str>,
    /// Why its tools are not known.
    pub(crate) listing: Listing,
    /// The call budgets that server's calls get in this set.
    pub(crate) budgets: CallBudgets,
}

/// Request-level narrowing: the `mcp` object of a chat request, a gRPC call's scope.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestScope {
    /// Servers to use (`server_ids`); each must be allowed by the profile. Absent: the
    /// profile's defaults.
    #[serde(rename = "server_ids", alias = "servers")]
    pub servers: Option<Vec<String>>,
    /// Only tools matching one of these (tool name or `server/tool`). Absent: no narrowing.
    pub tool_allowlist: Option<Vec<String>>,
    /// Never tools matching these.
    pub tool_denylist: Vec<String>,
    /// Budgets that apply where lower than the profile's and servers'.
    pub budgets: RequestBudgets,
}

// === outputs ===

/// A server the workload may use, with its tools and budgets.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveServer {
    /// The McpServer's `metadata.name`.
    pub(crate) id: Arc<str>,
    /// The server part of its tool names.
    pub(crate) server_part: Arc<str>,
    /// Call budgets after every layer.
    pub(crate) budgets: CallBudgets,
    /// Exposed tools; `None` when the server's tools are not known (decided on patterns alone).
    pub(crate) tools: Option<Arc<[EffectiveTool]>>,
}

// === compile ===

#[derive(Clone, Debug)]
struct CompiledServer {
    id: Arc<str>,
    server_part: Arc<str>,
    allowed: PatternSet,
    denied: PatternSet,
    approval: CompiledApproval,
    /// `spec.pinning`, when set.
    pins: Option<CompiledPins>,
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
    /// Resource and prompt patterns of the profile and its servers.
    items: Arc<CompiledItems>,
    /// Rate limits of the profile and its servers.
    rates: Arc<RateRules>,
    /// The profile's `outputFilters`.
    filters: Arc<crate::secrets::OutputFilters>,
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

        // Named servers stay in `allowed` even when missing (reported as unknown_server below).
        let mut allowed: BTreeSet<String> = p.servers.iter().cloned().collect();
        allowed.extend(snapshot.servers().iter().filter(|(_, s)| spec.selects(&s.object)).map(|(id, _)| id.clone()));

        let mut static_decisions = Vec::new();
        let mut servers = BTreeMap::new();
        for (id, server) in snapshot.servers() {
            if !allowed.contains(id) {
                static_decisions.push(decision(id, None, Reason::NotInProfile, None));
                continue;
            }
            let s = &server.object.spec;
            if !s.is_enabled() {
                static_decisions.push(decision(id, None, Reason::Disabled, None));
                continue;
            }
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
                    pins: s.pinning.as_ref().map(CompiledPins::new),
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
        let items = CompiledItems::compile(&spec, servers.iter().map(|(id, s)| (id.as_str(), &*s.spec)))?;
        let rates = RateRules::compile(&spec, servers.iter().map(|(id, s)| (id.as_str(), &*s.spec)))?;
        let filters = Arc::new(crate::secrets::OutputFilters::new(&p.output_filters));
        Ok(CompiledProfile {
            revision: snapshot.revision().clone(),
            profile: profile.to_string(),
            spec,
            servers,
            static_decisions,
            allowed,
            allow,
            deny,
            items: Arc::new(items),
            rates: Arc::new(rates),
            filters,
        })
    }

    /// The allowed servers present in the registry, as (id, name part): whose tools to list.
    pub(crate) fn servers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.servers.values().map(|s| (&*s.id, &*s.server_part))
    }

    /// Applies the server and profile layers to what is known of each server's tools and names
    /// every tool. Rebuild it when the snapshot or a tool list changes; reuse it per request.
    pub fn catalog(&self, tools: impl Fn(&str) -> ServerTools) -> Arc<ProfileCatalog> {
        let mut routes = RouteTable::default();
        // Names that might collide (shortened, shared server part): checked as a set.
        let mut checked: HashSet<Arc<str>> = HashSet::new();
        let mut buffer = String::new();
        let mut servers = Vec::with_capacity(self.servers.len());
        for (id, server) in &self.servers {
            let mut decisions = Vec::new();
            let mut entry = CatalogServer {
                id: server.id.clone(),
                server_part: server.server_part.clone(),
                spec: server.spec.clone(),
                tools: None,
                usable: true,
                listing: Listing::NotYet,
                decisions: Arc::from([]),
            };
            if server.allowed.is_empty() {
                decisions.push(decision(id, None, Reason::DenyAllServer, None));
                entry.usable = false;
                entry.listing = Listing::DenyAll;
            } else {
                match tools(id) {
                    ServerTools::Unknown => {}
                    ServerTools::EnvMissing { variable } => {
                        decisions.push(decision(id, None, Reason::EnvMissing, Some(variable.clone())));
                        entry.usable = false;
                        entry.listing = Listing::EnvMissing(variable);
                    }
                    ServerTools::Starting(starting) => {
                        // The detail stays the same while the start lasts (it is published
                        // once); readers compute the elapsed time from `since`.
                        let since = jiff::Timestamp::try_from(starting.since)
                            .and_then(|t| t.round(jiff::Unit::Second))
                            .map_or_else(|_| "?".to_string(), |t| t.to_string());
                        let detail =
                            format!("{}, since {since}, startup budget {} s", starting.what, starting.budget.as_secs());
                        decisions.push(decision(id, None, Reason::Starting, Some(detail)));
                        entry.usable = false;
                        entry.listing = Listing::Starting(starting);
                    }
                    ServerTools::ListFailed { message, lasting } => {
                        decisions.push(decision(id, None, Reason::ListFailed, Some(message.clone())));
                        entry.usable = false;
                        entry.listing = Listing::Failed { message, lasting };
                    }
                    ServerTools::Listed(list) => {
                        let exposed =
                            self.expose(server, &list, &mut decisions, &mut routes, &mut checked, &mut buffer);
                        entry.tools = Some(exposed.into());
                        entry.listing = Listing::Listed;
                    }
                }
            }
            entry.decisions = decisions.into();
            servers.push(entry);
        }
        Arc::new(ProfileCatalog {
            revision: self.revision.clone(),
            profile: self.profile.clone(),
            spec: self.spec.clone(),
            allowed: self.allowed.clone(),
            static_decisions: self.static_decisions.clone().into(),
            servers,
            routes,
            rank: OnceLock::new(),
            items: self.items.clone(),
            rates: self.rates.clone(),
            filters: self.filters.clone(),
            id: CATALOG_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// The server and profile layers over one listed server: exposed tools with their names.
    fn expose(
        &self,
        server: &CompiledServer,
        list: &ToolList,
        decisions: &mut Vec<Decision>,
        routes: &mut RouteTable,
        checked: &mut HashSet<Arc<str>>,
        buffer: &mut String,
    ) -> Vec<EffectiveTool> {
        // A list cached under an older toolNamespace is renamed here (rare: config changes
        // invalidate the cache).
        let renamed;
        let list: &ToolList = if list.server_part == *server.server_part {
            list
        } else {
            renamed = ToolList::new(&server.server_part, list.tools.iter().map(|(t, _)| t.clone()).collect());
            &renamed
        };
        let id: &str = &server.id;
        let mut exposed = Vec::with_capacity(list.tools.len());
        for (tool, base) in &list.tools {
            let t: &str = &tool.name;
            let reason = if !server.allowed.is_match(t) {
                Some(Reason::NotAllowedBy(Layer::Server))
            } else if server.denied.is_match(t) {
                Some(Reason::DeniedBy(Layer::Server))
            } else if self.allow.as_ref().is_some_and(|a| !a.is_match(id, t, buffer)) {
                Some(Reason::NotAllowedBy(Layer::Profile))
            } else if self.deny.is_match(id, t, buffer) {
                Some(Reason::DeniedBy(Layer::Profile))
            } else {
                None
            };
            if let Some(reason) = reason {
                decisions.push(decision(id, Some(t), reason, None));
                continue;
            }
            let pin_problem = server.pins.as_ref().and_then(|pins| Some((pins.mode, pins.check(tool)?)));
            let pin_warning = match pin_problem {
                Some((PinMode::Enforce, problem)) => {
                    decisions.push(decision(id, Some(t), problem.reason.clone(), Some(problem.detail())));
                    continue;
                }
                Some((PinMode::Warn, problem)) => Some(problem.reason),
                None => None,
            };
            let model_name = if server.shares_part || name::may_collide(base) {
                // Of servers sharing a name part, the one whose id is the part keeps the plain
                // names; the others always get names keyed by their own id, so adding a server
                // never renames another's tools.
                let keep_base = !server.shares_part || *server.id == *server.server_part;
                let free: Arc<str> =
                    name::free_name(base, &server.server_part, id, t, keep_base, |n| checked.contains(n)).into();
                checked.insert(free.clone());
                free
            } else {
                base.clone()
            };
            routes.insert(model_name.clone(), Route { server: server.id.clone(), tool: tool.name.clone() });
            let approval = server.approval.mode_for(t);
            exposed.push(EffectiveTool { name: model_name, tool: tool.clone(), approval, pin_warning });
        }
        exposed
    }

    /// The effective set for one request, in one go (catalog, then [`ProfileCatalog::effective`]).
    pub(crate) fn effective(
        &self,
        tools: impl Fn(&str) -> ServerTools,
        request: Option<&RequestScope>,
        caller_tools: &[&str],
    ) -> Result<EffectiveSet, PolicyError> {
        self.catalog(tools).effective(request, caller_tools)
    }
}

// === impl ProfileCatalog ===

#[derive(Debug)]
struct CatalogServer {
    id: Arc<str>,
    server_part: Arc<str>,
    spec: Arc<McpServer>,
    /// Tools past the server and profile layers; `None` when the list is not known.
    tools: Option<Arc<[EffectiveTool]>>,
    /// False when nothing of it can be used (deny-all, env missing, list failed).
    usable: bool,
    /// Where its tool list stands.
    listing: Listing,
    /// Why tools (or the whole server) are excluded by the server and profile layers.
    decisions: Arc<[Decision]>,
}

/// A profile's tools after the server and profile layers, named: the part of the effective set
/// that does not depend on the request. Built when the snapshot or a tool list changes.
#[derive(Debug)]
pub struct ProfileCatalog {
    revision: Revision,
    profile: String,
    spec: Arc<McpProfile>,
    allowed: BTreeSet<String>,
    static_decisions: Arc<[Decision]>,
    servers: Vec<CatalogServer>,
    routes: RouteTable,
    /// The relevance index over the tools, built by the first request that ranks them.
    rank: OnceLock<CatalogRank>,
    /// Resource and prompt patterns.
    items: Arc<CompiledItems>,
    /// Rate limits.
    rates: Arc<RateRules>,
    /// Output filters.
    filters: Arc<crate::secrets::OutputFilters>,
    /// Distinct for every catalog built in this process: a set's identity without hashing it.
    id: u64,
}

/// The next [`ProfileCatalog::id`].
static CATALOG_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ProfileCatalog {
    /// Every listed tool that does not match its pin (`spec.pinning`): withheld under `enforce`
    /// (a decision), served and flagged under `warn`. (server, tool, reason, served), sorted.
    pub(crate) fn pin_findings(&self) -> BTreeSet<(Arc<str>, Arc<str>, Reason, bool)> {
        let pinned = |r: &Reason| matches!(r, Reason::PinMismatch | Reason::NotPinned);
        let mut found = BTreeSet::new();
        for s in &self.servers {
            for d in s.decisions.iter().filter(|d| pinned(&d.reason)) {
                found.insert((s.id.clone(), d.tool.as_deref().unwrap_or_default().into(), d.reason.clone(), false));
            }
            for t in s.tools.iter().flat_map(|t| t.iter()) {
                if let Some(reason) = &t.pin_warning {
                    found.insert((s.id.clone(), t.tool.name.clone(), reason.clone(), true));
                }
            }
        }
        found
    }

    /// Each of the profile's servers with where its tool list stands and how many tools it
    /// exposes (`None` while not listed), for readiness and status views.
    pub(crate) fn listings(&self) -> impl Iterator<Item = (&str, &Listing, Option<usize>)> {
        self.servers.iter().map(|s| (&*s.id, &s.listing, s.tools.as_ref().map(|t| t.len())))
    }

    /// The effective set for one request. Without request patterns or colliding caller tools it
    /// shares the catalog's tool lists and routes (no per-tool work); otherwise it filters and
    /// renames what it must.
    pub fn effective(
        self: &Arc<Self>,
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
        let narrows_tools = request_allow.is_some() || !request_deny.is_empty();
        let caller: HashSet<&str> = caller_tools.iter().copied().collect();

        let mut set = EffectiveSet {
            revision: self.revision.clone(),
            profile: self.profile.clone(),
            servers: Vec::with_capacity(self.servers.len()),
            loop_budgets: budget::loop_budgets(p.budgets.as_ref(), &scope.budgets),
            catalog: self.clone(),
            request: request.map(|r| Arc::new(r.clone())),
            caller_tools: caller_tools.iter().map(|t| (*t).into()).collect(),
            not_wanted: Vec::new(),
            request_decisions: Vec::new(),
            filtered: HashSet::new(),
            renamed: HashMap::new(),
        };
        let mut buffer = String::new();
        for server in &self.servers {
            if wanted.as_ref().is_some_and(|w| !w.contains(&*server.id)) {
                set.not_wanted.push((server.id.clone(), narrowing_layer));
                continue;
            }
            if !server.usable {
                continue;
            }
            let budgets = self.call_budgets(server, &scope.budgets);
            let tools = match &server.tools {
                Some(tools) if narrows_tools || tools.iter().any(|t| caller.contains(&*t.name)) => {
                    Some(set.narrow(server, tools, request_allow.as_ref(), &request_deny, &caller, &mut buffer))
                }
                other => other.clone(),
            };
            set.servers.push(EffectiveServer {
                id: server.id.clone(),
                server_part: server.server_part.clone(),
                budgets,
                tools,
            });
        }
        Ok(set)
    }
}

impl ProfileCatalog {
    /// The relevance index over the catalog's tools: built once per catalog, on first use.
    pub(super) fn rank(&self) -> &CatalogRank {
        self.rank.get_or_init(|| {
            CatalogRank::build(self.servers.iter().filter_map(|s| {
                let tools = s.tools.as_deref()?;
                let spec = &s.spec.spec;
                let text =
                    [Some(&*s.id), (s.server_part != s.id).then_some(&*s.server_part), spec.display_name.as_deref()]
                        .into_iter()
                        .flatten()
                        .collect::<Vec<_>>()
                        .join(" ");
                Some((&s.id, text, tools))
            }))
        })
    }

    /// A server's call budgets after the profile and request layers.
    fn call_budgets(&self, server: &CatalogServer, request: &RequestBudgets) -> CallBudgets {
        budget::call_budgets(
            &server.spec.spec.budgets.clone().unwrap_or_default(),
            self.spec.spec.budgets.as_ref(),
            request,
        )
    }
}

// === impl EffectiveSet ===

/// The result: what one request may use, the routes back, and why everything else is excluded.
#[derive(Clone, Debug)]
pub struct EffectiveSet {
    /// The snapshot revision the decision used.
    pub(crate) revision: Revision,
    pub(crate) profile: String,
    /// Servers in use, by id.
    pub(crate) servers: Vec<EffectiveServer>,
    /// Loop budgets after every layer.
    pub(crate) loop_budgets: LoopBudgets,
    catalog: Arc<ProfileCatalog>,
    /// Servers the request (or the profile's defaults) left out.
    not_wanted: Vec<(Arc<str>, Layer)>,
    /// Tools the request's patterns excluded.
    request_decisions: Vec<Decision>,
    /// Catalog names not exposed in this set (excluded by the request).
    filtered: HashSet<Arc<str>>,
    /// Catalog name → new name, for tools renamed because a caller's tool has their name.
    renamed: HashMap<Arc<str>, (Arc<str>, Route)>,
    /// The request scope and caller tool names this set was computed for, to compute the same
    /// request again over a newer catalog ([`EffectiveSet::recompute`]).
    request: Option<Arc<RequestScope>>,
    caller_tools: Vec<Box<str>>,
}

impl PartialEq for EffectiveSet {
    fn eq(&self, other: &Self) -> bool {
        self.revision == other.revision
            && self.profile == other.profile
            && self.servers == other.servers
            && self.loop_budgets == other.loop_budgets
            && self.decisions() == other.decisions()
    }
}

impl EffectiveSet {
    /// Who approves this profile's calls that need approval (`spec.approval`).
    pub(crate) fn approval(&self) -> Option<&crate::api::ProfileApproval> {
        self.catalog.spec.spec.approval.as_ref()
    }

    /// The rate limits of the profile and its servers.
    pub(crate) fn rate_rules(&self) -> &RateRules {
        &self.catalog.rates
    }

    /// The profile's `outputFilters`.
    pub(crate) fn output_filters(&self) -> &crate::secrets::OutputFilters {
        &self.catalog.filters
    }

    /// Whether `item` of `server` (its URI, or its prompt name) may be read or got through this
    /// set; the exclusion otherwise, for the caller's error and the audit.
    pub(crate) fn item_decision(&self, server: &str, kind: ItemKind, item: &str) -> Result<(), Decision> {
        if !self.servers.iter().any(|s| &*s.id == server) {
            let reason = match self.not_wanted.iter().find(|(id, _)| &**id == server) {
                Some((_, layer)) => Reason::NotAllowedBy(*layer),
                None => Reason::NotInProfile,
            };
            return Err(decision(server, Some(item), reason, None));
        }
        self.catalog.items.decide(server, kind, item)
    }

    /// Whether the policy could let any item of `kind` of `server` through (a server of this set
    /// whose McpServer and profile allowlists of that kind are not empty).
    pub(crate) fn exposes_items(&self, server: &str, kind: ItemKind) -> bool {
        self.servers.iter().any(|s| &*s.id == server) && self.catalog.items.exposes(server, kind)
    }

    /// Whether the profile's `defaultServers` is the empty list and this request named no
    /// server: it gets no server at all.
    pub(crate) fn default_servers_empty(&self) -> bool {
        let asked = self.request.as_ref().is_some_and(|r| r.servers.is_some());
        !asked && self.catalog.spec.spec.default_servers.as_ref().is_some_and(Vec::is_empty)
    }

    /// Each server of the profile and what this set does with it: `offered` (tools exposed), or
    /// why not (`none_allowed`, `not_listed`, `not_wanted`, `env_missing`, `list_failed`,
    /// `deny_all_server`, `unknown_server`). Bounded labels for `mcp_injection_total`.
    pub(crate) fn injections(&self) -> impl Iterator<Item = (&str, &'static str)> {
        let listed = self.catalog.servers.iter().map(move |server| {
            let status = match self.servers.iter().find(|s| s.id == server.id) {
                Some(used) => match &used.tools {
                    Some(tools) if !tools.is_empty() => "offered",
                    Some(_) => "none_allowed",
                    None => "not_listed",
                },
                None if self.not_wanted.iter().any(|(id, _)| *id == server.id) => "not_wanted",
                None => match server.listing {
                    Listing::EnvMissing(_) => "env_missing",
                    Listing::Failed { .. } => "list_failed",
                    Listing::DenyAll => "deny_all_server",
                    _ => "not_listed",
                },
            };
            (&*server.id, status)
        });
        let unknown = self.catalog.static_decisions.iter().filter(|d| d.reason == Reason::UnknownServer);
        listed.chain(unknown.map(|d| (d.server.as_str(), "unknown_server")))
    }

    /// Which catalog this set was computed from: equal ids, the same servers' tools.
    pub(crate) fn catalog_id(&self) -> usize {
        self.catalog.id as usize
    }

    /// The catalog this set was computed from.
    pub(super) fn catalog(&self) -> &ProfileCatalog {
        &self.catalog
    }

    /// The `spec.displayName` of a server of the profile, if it has one.
    pub(crate) fn display_name(&self, server: &str) -> Option<&str> {
        let catalog = self.catalog.servers.iter().find(|s| &*s.id == server)?;
        catalog.spec.spec.display_name.as_deref()
    }

    /// Every exposed tool, in server order then list order.
    pub fn tools(&self) -> impl Iterator<Item = (&EffectiveServer, &EffectiveTool)> {
        self.servers.iter().flat_map(|s| s.tools.iter().flat_map(|t| t.iter()).map(move |t| (s, t)))
    }

    /// The route of a name as a model or client writes it (a model-facing name, or the dotted
    /// form `mcp.<server>.<tool>`), if that tool is exposed in this set.
    pub fn route(&self, name: &str) -> Option<&Route> {
        if let Some((_, route)) = self.renamed.values().find(|(new, _)| **new == *name) {
            return Some(route);
        }
        let (catalog_name, route) = self.catalog.routes.lookup(name)?;
        // A renamed tool's old name now belongs to the caller's own tool.
        if **catalog_name == *name && self.renamed.contains_key(catalog_name) {
            return None;
        }
        let in_use = self.servers.iter().any(|s| s.id == route.server);
        (in_use && !self.filtered.contains(catalog_name)).then_some(route)
    }

    /// For a name that does not [`route`](Self::route): the allowed, wanted server it names
    /// whose tool list is not known (not listed yet, listing failed, a variable missing), if
    /// any. `None` means no list to come can make the name route: a policy refusal. Servers
    /// sharing a name part: the first one whose list is unknown.
    pub(crate) fn unlisted(&self, name: &str) -> Option<Unlisted> {
        let target = name::target(name)?;
        let no_budgets = RequestBudgets::default();
        let request_budgets = self.request.as_deref().map_or(&no_budgets, |r| &r.budgets);
        self.catalog.servers.iter().find_map(|server| {
            let named = target.names(&server.id, &server.server_part);
            let wanted = !self.not_wanted.iter().any(|(id, _)| *id == server.id);
            let unknown = !matches!(server.listing, Listing::Listed | Listing::DenyAll);
            (named && wanted && unknown).then(|| Unlisted {
                server: server.id.clone(),
                listing: server.listing.clone(),
                budgets: self.catalog.call_budgets(server, request_budgets),
            })
        })
    }

    /// The profile's server a name belongs to by its shape, whether or not the name routes: a
    /// bounded label for refusals (the name itself is the caller's and unbounded).
    pub(crate) fn named_server(&self, name: &str) -> Option<Arc<str>> {
        let target = name::target(name)?;
        self.catalog.servers.iter().find(|s| target.names(&s.id, &s.server_part)).map(|s| s.id.clone())
    }

    /// Why `name`, which routes nowhere in this set, is refused: the decision of the tool it
    /// names when the decision log has one (`denied_by:profile`, `pin_mismatch`, ...), else
    /// `not_in_profile` or `not_allowed_by:<layer>` for its server, else `unknown_tool`.
    /// One of a fixed set of strings (a label value), whatever the caller wrote.
    pub(crate) fn refusal_reason(&self, name: &str) -> &'static str {
        const UNKNOWN: &str = "unknown_tool";
        let Some(target) = name::target(name) else { return UNKNOWN };
        let Some(server) = self.catalog.servers.iter().find(|s| target.names(&s.id, &s.server_part)) else {
            let outside =
                self.catalog.static_decisions.iter().find(|d| d.tool.is_none() && target.names(&d.server, &d.server));
            return outside.map_or(UNKNOWN, |d| d.reason.label());
        };
        if let Some((_, layer)) = self.not_wanted.iter().find(|(id, _)| *id == server.id) {
            return Reason::NotAllowedBy(*layer).label();
        }
        let names_tool = |tool: &str| {
            name::base_name(&server.server_part, tool) == name
                || name.strip_prefix("mcp.").and_then(|r| r.strip_prefix(&*server.id)).and_then(|r| r.strip_prefix('.'))
                    == Some(tool)
        };
        let decisions =
            server.decisions.iter().chain(self.request_decisions.iter().filter(|d| *d.server == *server.id));
        decisions
            .filter(|d| d.tool.as_deref().is_some_and(names_tool))
            .map(|d| d.reason.label())
            .next()
            .unwrap_or(UNKNOWN)
    }

    /// Whether this set was computed from `catalog`.
    pub(crate) fn is_from(&self, catalog: &Arc<ProfileCatalog>) -> bool {
        Arc::ptr_eq(&self.catalog, catalog)
    }

    /// The same request (scope and caller tools) over `catalog`: the set a caller gets once a
    /// newer catalog is published.
    pub(crate) fn recompute(&self, catalog: &Arc<ProfileCatalog>) -> Result<EffectiveSet, PolicyError> {
        let caller: Vec<&str> = self.caller_tools.iter().map(|t| &**t).collect();
        catalog.effective(self.request.as_deref(), &caller)
    }

    /// Every exclusion with its reason, sorted: servers outside the profile or missing, servers
    /// the request or defaults left out, and, for servers in use, each excluded tool.
    pub(crate) fn decisions(&self) -> Vec<Decision> {
        let mut out: Vec<Decision> = self.catalog.static_decisions.to_vec();
        for (id, layer) in &self.not_wanted {
            out.push(decision(id, None, Reason::NotAllowedBy(*layer), None));
        }
        for server in &self.catalog.servers {
            if !self.not_wanted.iter().any(|(id, _)| *id == server.id) {
                out.extend(server.decisions.iter().cloned());
            }
        }
        out.extend(self.request_decisions.iter().cloned());
        out.sort();
        out
    }

    /// Request-level filtering and renaming for one server (the slow path).
    fn narrow(
        &mut self,
        server: &CatalogServer,
        tools: &Arc<[EffectiveTool]>,
        allow: Option<&LayerPatterns>,
        deny: &LayerPatterns,
        caller: &HashSet<&str>,
        buffer: &mut String,
    ) -> Arc<[EffectiveTool]> {
        let id: &str = &server.id;
        let mut kept = Vec::with_capacity(tools.len());
        for tool in tools.iter() {
            let t: &str = &tool.tool.name;
            let reason = if allow.is_some_and(|a| !a.is_match(id, t, buffer)) {
                Some(Reason::NotAllowedBy(Layer::Request))
            } else if deny.is_match(id, t, buffer) {
                Some(Reason::DeniedBy(Layer::Request))
            } else {
                None
            };
            if let Some(reason) = reason {
                self.request_decisions.push(decision(id, Some(t), reason, None));
                self.filtered.insert(tool.name.clone());
                continue;
            }
            if !caller.contains(&*tool.name) {
                kept.push(tool.clone());
                continue;
            }
            // The caller's own tool wins; this one gets a deterministic new name that is free
            // among the caller's tools, the catalog's names and earlier renames.
            let base = name::base_name(&server.server_part, t);
            let renamed: Vec<&Arc<str>> = self.renamed.values().map(|(n, _)| n).collect();
            let taken =
                |n: &str| caller.contains(n) || self.catalog.routes.contains(n) || renamed.iter().any(|r| ***r == *n);
            let new_name: Arc<str> = name::free_name(&base, &server.server_part, id, t, false, taken).into();
            let route = Route { server: server.id.clone(), tool: tool.tool.name.clone() };
            self.renamed.insert(tool.name.clone(), (new_name.clone(), route));
            kept.push(EffectiveTool { name: new_name, ..tool.clone() });
        }
        kept.into()
    }
}

#[cfg(test)]
mod tests;
