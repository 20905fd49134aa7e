//! The agent's shared core: the registry, the client pool and the profile's catalog, kept in
//! step, and the one tool-call path every door uses (policy, approval, budgets, audit).
//!
//! ```text
//! RegistryView ─snapshot─▶ refresh task ─pool.apply, compile profile, list tools─▶ AgentState
//!        ▲ list_changed of any server, timer ──┘                     │ watch (atomic swap)
//!                                                                    ▼
//! chat / /mcp / gRPC ──effective(scope)──▶ EffectiveSet ──call_tool(name)──▶ route ─ approval
//!                                                        ─ budgets ─ pool ─ audit line ─▶ ToolCall
//! ```

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::audit::{self, AuditLine, AuditSink, Door};
use crate::api::ApprovalMode;
use crate::mcp::{ErrorCode, McpError, Pool, ToolOutput};
use crate::policy::effective::ProfileCatalog;
use crate::policy::{CompiledProfile, EffectiveSet, PolicyError, RequestScope, ServerTools};
use crate::registry::snapshot::Snapshot;
use crate::registry::view::RegistryView;
use crate::telemetry::{PoolMetrics, RegistryMetrics};

/// Tuning of the agent core.
#[derive(Debug)]
pub struct AgentOptions {
    /// The McpProfile this agent serves.
    pub(crate) profile: String,
    /// Where audit lines go.
    pub audit: AuditSink,
    /// How often tool lists are refreshed when nothing else triggers it (the pool's cache TTL
    /// decides whether that asks the servers again).
    pub(crate) refresh_interval: Duration,
    /// First retry delay after a server's tools could not be listed (doubles up to
    /// `refresh_interval`).
    pub(crate) retry_interval: Duration,
    /// Registry metrics (revision, degraded).
    pub registry_metrics: RegistryMetrics,
    /// The pool's metrics, for calls refused before they reach the pool.
    pub(crate) pool_metrics: PoolMetrics,
}

impl AgentOptions {
    /// Defaults for `profile`: audit to stderr without arguments, refresh every 60 s.
    pub fn new(profile: impl Into<String>) -> Self {
        AgentOptions {
            profile: profile.into(),
            audit: AuditSink::stderr(false),
            refresh_interval: Duration::from_secs(60),
            retry_interval: Duration::from_secs(1),
            registry_metrics: RegistryMetrics::default(),
            pool_metrics: PoolMetrics::default(),
        }
    }
}

/// What the agent serves right now: one snapshot, the profile compiled against it, and the
/// catalog built from the servers' tool lists. Swapped atomically.
#[derive(Debug)]
pub struct AgentState {
    pub snapshot: Arc<Snapshot>,
    /// The profile's catalog; `None` when the profile cannot be compiled (it does not exist).
    pub(crate) catalog: Option<Arc<ProfileCatalog>>,
    /// Counts published states (0 before the first): readiness and metrics.
    pub(crate) generation: u64,
    /// A hash of the default tool set (names, descriptions, schemas): it changes exactly when
    /// an MCP client must be told `tools/list_changed`.
    pub(crate) tools_fingerprint: u64,
    /// The effective set of a request that narrows nothing, computed once per state (the hot
    /// path of `/mcp`).
    pub(crate) default_set: Option<Arc<EffectiveSet>>,
}

/// One tool call as a door reports it.
#[derive(Clone, Debug)]
pub struct ToolCall {
    /// The name the caller used.
    pub(crate) name: String,
    /// The server it routed to.
    pub server_id: Option<Arc<str>>,
    /// The tool's name on that server.
    pub(crate) tool: Option<Arc<str>>,
    /// Wall time, policy checks included.
    pub(crate) latency: Duration,
    /// The output, or why there is none.
    pub result: Result<ToolOutput, McpError>,
}

impl ToolCall {
    /// `ok` or the error code (truncation counts as `mcp_output_too_large`).
    pub fn status(&self) -> &'static str {
        match &self.result {
            Ok(output) if output.truncated.is_some() => ErrorCode::McpOutputTooLarge.as_str(),
            Ok(output) if output.result.is_error == Some(true) => "tool_error",
            Ok(_) => "ok",
            Err(e) => e.code.as_str(),
        }
    }

    /// The text a model sees as the `role=tool` message: the tool's text blocks (other blocks
    /// and structured content as JSON), or the `{"error": {code, message, retryable}}` object.
    pub fn model_text(&self) -> String {
        match &self.result {
            Err(e) => e.to_tool_output().to_string(),
            Ok(output) => {
                let mut parts: Vec<String> = Vec::with_capacity(output.result.content.len());
                for block in &output.result.content {
                    match block.as_text() {
                        Some(text) => parts.push(text.text.clone()),
                        None => parts.push(serde_json::to_string(block).unwrap_or_default()),
                    }
                }
                if parts.is_empty()
                    && let Some(structured) = &output.result.structured_content
                {
                    parts.push(structured.to_string());
                }
                parts.join("\n")
            }
        }
    }
}

/// Where a call comes from, for the audit line.
#[derive(Clone, Copy, Debug)]
pub struct CallContext<'a> {
    pub door: Door,
    /// The request (chat completion id, JSON-RPC request, gRPC call).
    pub request_id: &'a str,
    /// The session, if the door has sessions.
    pub session_id: Option<&'a str>,
}

/// The agent core, cheap to clone; every door holds one.
#[derive(Clone, Debug)]
pub struct Agent {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    options: AgentOptions,
    registry: Arc<dyn RegistryView>,
    pool: Pool,
    state: watch::Sender<Arc<AgentState>>,
}

impl std::fmt::Debug for dyn RegistryView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegistryView(revision {})", self.snapshot().revision())
    }
}

impl Agent {
    /// An agent over `registry` and `pool`. Nothing is served until [`Agent::run`] publishes
    /// the first state.
    pub fn new(options: AgentOptions, registry: Arc<dyn RegistryView>, pool: Pool) -> Self {
        let initial = AgentState {
            snapshot: registry.snapshot(),
            catalog: None,
            generation: 0,
            tools_fingerprint: 0,
            default_set: None,
        };
        let (state, _) = watch::channel(Arc::new(initial));
        Agent { inner: Arc::new(Inner { options, registry, pool, state }) }
    }

    pub(crate) fn profile(&self) -> &str {
        &self.inner.options.profile
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The state served now.
    pub fn state(&self) -> Arc<AgentState> {
        self.inner.state.borrow().clone()
    }

    /// A receiver woken whenever a new state is published.
    pub(crate) fn watch(&self) -> watch::Receiver<Arc<AgentState>> {
        self.inner.state.subscribe()
    }

    /// Whether the first state (snapshot loaded, tools listed or failed) is published.
    pub fn is_ready(&self) -> bool {
        self.inner.state.borrow().generation > 0
    }

    /// Waits until the agent is ready.
    pub async fn ready(&self) {
        let mut rx = self.watch();
        // The sender lives as long as `self`, so this cannot fail while we hold it.
        let _ = rx.wait_for(|s| s.generation > 0).await;
    }

    /// The effective set for one request: the profile's catalog narrowed by `scope`, with the
    /// caller's own tool names kept free.
    pub fn effective(&self, scope: Option<&RequestScope>, caller_tools: &[&str]) -> Result<EffectiveSet, PolicyError> {
        let state = self.state();
        match &state.catalog {
            Some(catalog) => catalog.effective(scope, caller_tools),
            // No catalog: compiling again yields the error to report (the profile is missing).
            None => CompiledProfile::compile(&state.snapshot, self.profile())
                .and_then(|compiled| compiled.effective(|_| ServerTools::Unknown, scope, caller_tools)),
        }
    }

    /// The effective set of a request that narrows nothing and registers no tools of its own,
    /// shared (computed once per published state).
    pub(crate) fn default_set(&self) -> Result<Arc<EffectiveSet>, PolicyError> {
        if let Some(set) = &self.state().default_set {
            return Ok(set.clone());
        }
        self.effective(None, &[]).map(Arc::new)
    }

    /// Writes out every audit line queued so far (call before the process exits).
    pub(crate) fn flush_audit(&self) {
        self.inner.options.audit.flush();
    }

    /// Calls the tool `name` (a model-facing or dotted name) of `set`. `arguments` is `Err`
    /// with a reason when the caller's arguments were not a JSON object. Never fails: every
    /// failure is a structured [`McpError`] in the result. One audit line per call.
    pub async fn call_tool(
        &self,
        set: &EffectiveSet,
        name: &str,
        arguments: Result<Option<Map<String, Value>>, String>,
        context: CallContext<'_>,
    ) -> ToolCall {
        let started = Instant::now();
        let mut call = ToolCall {
            name: name.to_string(),
            server_id: None,
            tool: None,
            latency: Duration::ZERO,
            result: Ok(empty_output()),
        };
        let audit_arguments = self.inner.options.audit.arguments(arguments.as_ref().ok().and_then(Option::as_ref));
        call.result = self.route_and_call(set, name, arguments, &mut call).await;
        call.latency = started.elapsed();
        if let (Err(error), Some(server), Some(tool)) = (&call.result, &call.server_id, &call.tool)
            && refused_before_pool(error.code)
        {
            self.inner.options.pool_metrics.call(server, tool, call.latency, None, Some(error.code.as_str()));
        }
        let output_bytes = call.result.as_ref().ok().map(|o| o.bytes);
        self.inner.options.audit.record(&AuditLine {
            ts: audit::now(),
            request_id: context.request_id,
            session_id: context.session_id,
            door: context.door,
            profile: &set.profile,
            registry_revision: set.revision.as_str(),
            server_id: call.server_id.as_deref(),
            tool_name: call.tool.as_deref().unwrap_or(name),
            called_as: name,
            status: call.status(),
            latency_ms: audit::millis(call.latency),
            output_bytes,
            arguments: audit_arguments,
        });
        call
    }

    async fn route_and_call(
        &self,
        set: &EffectiveSet,
        name: &str,
        arguments: Result<Option<Map<String, Value>>, String>,
        call: &mut ToolCall,
    ) -> Result<ToolOutput, McpError> {
        let Some(route) = set.route(name) else {
            return Err(McpError::new(
                ErrorCode::McpPolicyDenied,
                format!("tool '{name}' is not available to this workload (McpProfile '{}')", set.profile),
            ));
        };
        call.server_id = Some(route.server.clone());
        call.tool = Some(route.tool.clone());
        let server = set.servers.iter().find(|s| s.id == route.server).ok_or_else(|| {
            McpError::new(ErrorCode::McpPolicyDenied, format!("server '{}' is not in use", route.server))
        })?;
        let approval = server
            .tools
            .as_ref()
            .and_then(|tools| tools.iter().find(|t| t.tool.name == route.tool))
            .map_or(ApprovalMode::Never, |t| t.approval);
        if approval == ApprovalMode::Always {
            return Err(McpError::new(
                ErrorCode::McpApprovalRequired,
                format!(
                    "'{}' on '{}' needs approval (approvalPolicy) and no approver is configured",
                    route.tool, route.server
                ),
            ));
        }
        let arguments = arguments.map_err(|reason| {
            McpError::new(
                ErrorCode::McpInvalidArguments,
                format!("arguments of '{name}' are not a JSON object: {reason}"),
            )
        })?;
        let budgets = server.budgets;
        self.inner
            .pool
            .call_tool(
                &route.server,
                &route.tool,
                arguments,
                Duration::from_millis(u64::from(budgets.tool_timeout_ms)),
                budgets.max_tool_output_bytes as usize,
            )
            .await
    }

    /// Keeps the state in step with the registry and the servers' tool lists until `cancel`;
    /// then closes every session. Spawn it once.
    pub async fn run(self, cancel: CancellationToken) {
        let inner = &self.inner;
        let mut registry_rx = inner.registry.watch();
        let mut applied: Option<crate::registry::snapshot::Revision> = None;
        let mut compiled: Option<CompiledProfile> = None;
        let mut retry = inner.options.retry_interval;
        let mut restart_required: BTreeSet<String> = BTreeSet::new();
        loop {
            let snapshot = registry_rx.borrow_and_update().clone();
            if applied.as_ref() != Some(snapshot.revision()) {
                for problem in inner.pool.apply(&snapshot).await {
                    tracing::warn!(error = %problem, "server configuration not usable");
                }
                compiled = match CompiledProfile::compile(&snapshot, &inner.options.profile) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::warn!(error = %e, "profile not served");
                        None
                    }
                };
                applied = Some(snapshot.revision().clone());
                let now: BTreeSet<String> = compiled
                    .iter()
                    .flat_map(|c| c.servers())
                    .filter(|(id, _)| inner.pool.needs_pod_restart(id))
                    .map(|(id, _)| id.to_string())
                    .collect();
                if now != restart_required {
                    for id in now.difference(&restart_required) {
                        tracing::warn!(
                            server_id = %id,
                            "stdio server joined the profile after this pod started: it has no sidecar here, \
                             so its tools stay unavailable until the pod is restarted"
                        );
                    }
                    inner.options.registry_metrics.restart_required(now.iter().map(String::as_str));
                    restart_required = now;
                }
            }
            // Subscribe before listing, so a change during the listing is not missed.
            let mut changes = Vec::new();
            let mut failed = false;
            let catalog = match &compiled {
                Some(compiled) => {
                    let servers: Vec<(String, String)> =
                        compiled.servers().map(|(id, part)| (id.to_string(), part.to_string())).collect();
                    for (id, _) in &servers {
                        if let Ok(changed) = inner.pool.list_changed(id) {
                            changes.push(changed.boxed());
                        }
                    }
                    let listed = futures::future::join_all(
                        servers
                            .iter()
                            .map(|(id, part)| async move { (id.clone(), inner.pool.server_tools(id, part).await) }),
                    )
                    .await;
                    let tools: HashMap<String, ServerTools> = listed.into_iter().collect();
                    failed = tools.values().any(|t| matches!(t, ServerTools::ListFailed { .. }));
                    Some(compiled.catalog(|id| tools.get(id).cloned().unwrap_or(ServerTools::Unknown)))
                }
                None => None,
            };
            self.publish(snapshot, catalog);

            let wait = if failed {
                let wait = retry;
                retry = (retry * 2).min(inner.options.refresh_interval);
                wait
            } else {
                retry = inner.options.retry_interval;
                inner.options.refresh_interval
            };
            let any_change = async {
                if changes.is_empty() {
                    std::future::pending::<()>().await;
                } else {
                    futures::future::select_all(changes).await;
                }
            };
            tokio::select! {
                () = cancel.cancelled() => break,
                changed = registry_rx.changed() => {
                    if changed.is_err() {
                        // The source ended (its own shutdown): keep serving the last state.
                        cancel.cancelled().await;
                        break;
                    }
                }
                () = any_change => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        inner.pool.shutdown().await;
    }

    /// Swaps a new state in when anything a door can see changed.
    fn publish(&self, snapshot: Arc<Snapshot>, catalog: Option<Arc<ProfileCatalog>>) {
        let default_set = catalog.as_ref().and_then(|c| c.effective(None, &[]).ok()).map(Arc::new);
        let fingerprint = default_set.as_deref().map_or(0, fingerprint);
        let metrics = &self.inner.options.registry_metrics;
        self.inner.state.send_if_modified(|current| {
            let same = current.generation > 0
                && current.snapshot.revision() == snapshot.revision()
                && current.snapshot.problems() == snapshot.problems()
                && current.tools_fingerprint == fingerprint
                && current.catalog.is_some() == catalog.is_some();
            if same {
                return false;
            }
            let generation = current.generation + 1;
            metrics.served(generation, snapshot.is_degraded());
            tracing::debug!(revision = %snapshot.revision(), generation, "agent state published");
            *current =
                Arc::new(AgentState { snapshot, catalog, generation, tools_fingerprint: fingerprint, default_set });
            true
        });
    }
}

/// Refusals decided by the agent itself (the pool counts the calls it makes).
fn refused_before_pool(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::McpApprovalRequired | ErrorCode::McpInvalidArguments | ErrorCode::McpPolicyDenied)
}

fn empty_output() -> ToolOutput {
    ToolOutput {
        result: rmcp::model::CallToolResult::success(Vec::new()),
        truncated: None,
        bytes: 0,
        latency: Duration::ZERO,
    }
}

/// Hash of the default tool set as an MCP client sees it.
fn fingerprint(set: &EffectiveSet) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for (server, tool) in set.tools() {
        server.id.hash(&mut hasher);
        tool.name.hash(&mut hasher);
        tool.tool.description.hash(&mut hasher);
        tool.tool.input_schema.to_string().hash(&mut hasher);
    }
    for server in &set.servers {
        // A server whose tools become known (or unknown) changes what is listed.
        server.tools.is_some().hash(&mut hasher);
    }
    hasher.finish()
}
