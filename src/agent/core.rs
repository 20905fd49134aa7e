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

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::approvers::{Approved, Approvers};
use super::audit::{self, ApprovalRecord, AuditLine, AuditSink, Door};
use crate::api::ApprovalMode;
use crate::approval::Subject;
use crate::mcp::health::{Health, HealthState};
use crate::mcp::{ErrorCode, McpError, Pool, ToolOutput};
use crate::policy::effective::{Listing, ProfileCatalog, Unlisted};
use crate::policy::name::Route;
use crate::policy::{CompiledProfile, EffectiveSet, PolicyError, Reason, RequestScope, ServerTools};
use crate::registry::snapshot::{Revision, Snapshot};
use crate::registry::view::RegistryView;
use crate::telemetry::otel;
use crate::telemetry::{PoolMetrics, RegistryMetrics};

/// Shortest time between two re-lists caused by `notifications/tools/list_changed`: a storm
/// of them costs at most one tools/list per server per second, and a real change shows within
/// a second.
pub(crate) const LIST_CHANGED_MIN_INTERVAL: Duration = Duration::from_secs(1);

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
    /// The pool's metrics, for calls refused before they reach the pool (and approvals).
    pub(crate) pool_metrics: PoolMetrics,
    /// Who and where the agent is, for approval webhooks (the pod's namespace and name).
    pub(crate) origin: crate::approval::webhook::Origin,
    /// The Kubernetes API in cluster mode (the kubernetes approver's McpApprovals).
    pub(crate) kube: Option<super::approvers::KubeClient>,
    /// Addresses the agent's own requests never go to (`--egress-deny-cidrs`): approval webhooks
    /// and the upstream model here; the pool has its copy for servers and OAuth.
    pub(crate) egress: crate::egress::AddressDenyList,
}

impl AgentOptions {
    /// In cluster mode: the pod's namespace and name, and the client its McpApprovals go through.
    pub fn in_cluster(mut self, client: kube::Client, namespace: String, pod: Option<String>) -> Self {
        self.origin = crate::approval::webhook::Origin { namespace: Some(namespace), pod };
        self.kube = Some(super::approvers::KubeClient(client));
        self
    }

    /// Defaults for `profile`: audit to stderr without arguments, refresh every 60 s.
    pub fn new(profile: impl Into<String>) -> Self {
        AgentOptions {
            profile: profile.into(),
            audit: AuditSink::stderr(false),
            refresh_interval: Duration::from_secs(60),
            retry_interval: Duration::from_secs(1),
            registry_metrics: RegistryMetrics::default(),
            pool_metrics: PoolMetrics::default(),
            origin: crate::approval::webhook::Origin::default(),
            kube: None,
            egress: crate::egress::AddressDenyList::none(),
        }
    }
}

impl AgentState {
    /// Past starting: the profile is compiled and its servers had their first lists, or the
    /// profile is found missing or invalid ([`Agent::settled`]).
    pub(crate) fn is_settled(&self) -> bool {
        self.generation > 0 && (self.catalog.is_none() || self.first_lists_done)
    }
}

/// What the agent serves right now: one snapshot, the profile compiled against it, and the
/// catalog built from the servers' tool lists. Swapped atomically.
#[derive(Debug)]
pub struct AgentState {
    pub snapshot: Arc<Snapshot>,
    /// The profile's catalog; `None` when the profile cannot be compiled (it does not exist).
    pub(crate) catalog: Option<Arc<ProfileCatalog>>,
    /// Why the profile cannot be compiled, when it cannot.
    pub(crate) profile_error: Option<String>,
    /// Every server of the profile has had its first listing attempt (listed, or failed): the
    /// readiness condition besides the profile itself.
    pub(crate) first_lists_done: bool,
    /// Counts published states (0 before the first): readiness and metrics.
    pub(crate) generation: u64,
    /// A hash of the default tool set (names, descriptions, schemas): it changes exactly when
    /// an MCP client must be told `tools/list_changed`.
    pub(crate) tools_fingerprint: u64,
    /// Of why unlisted servers are not listed (`ProfileCatalog::listings`).
    pub(crate) listings_fingerprint: u64,
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
    /// Wall time, policy checks (and any wait for a tool list) included.
    pub latency: Duration,
    /// The output, or why there is none.
    pub result: Result<ToolOutput, McpError>,
    /// The approver's decision, when the call needed approval and one decided.
    pub(crate) approval: Option<ApprovalRecord>,
}

impl ToolCall {
    /// `ok` or the error code (truncation counts as `mcp_output_too_large`).
    pub fn status(&self) -> &'static str {
        match &self.result {
            Ok(output) if output.input_required.is_some() => "input_required",
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

/// Rounds of input a server may ask of a 2025 caller within one call (the bridge in
/// `call_routed`): a loop that never completes is a server's fault, not a reason to hang.
const MAX_INPUT_ROUNDS: usize = 8;

/// Where a call comes from, for the audit line.
#[derive(Clone, Copy, Debug)]
pub struct CallContext<'a> {
    pub door: Door,
    /// The request (chat completion id, JSON-RPC request, gRPC call).
    pub request_id: &'a str,
    /// The session, if the door has sessions.
    pub session_id: Option<&'a str>,
    /// Set by a door that relays a server's input requests to its client (`/mcp` for
    /// 2026-07-28 clients), with the client's answers to an earlier round, if any; `None`: a
    /// server asking for input ends the call with `mcp_approval_required`.
    pub input: Option<&'a crate::mcp::Continuation>,
    /// Set by a door that passes on what a 2025 server sends during the call (progress, log
    /// messages, sampling and elicitation requests); `None`: progress and logs stay with the
    /// agent, elicitation is declined and sampling refused.
    pub relay: Option<&'a crate::mcp::Relay>,
    /// Cancelled when the caller cancels the call (`/mcp`'s `notifications/cancelled`): the call
    /// ends with `mcp_cancelled`, is audited, and the server is told to stop (the pool's call,
    /// dropped, sends it `notifications/cancelled`).
    pub cancelled: Option<&'a tokio_util::sync::CancellationToken>,
    /// Who is calling, when the door knows (the gateway's authenticated caller); audited.
    pub caller: Option<&'a str>,
}

impl<'a> CallContext<'a> {
    /// A call from a door that relays nothing (gRPC, the chat loop).
    pub fn new(door: Door, request_id: &'a str, session_id: Option<&'a str>) -> Self {
        CallContext { door, request_id, session_id, input: None, relay: None, cancelled: None, caller: None }
    }
}

/// The authenticated caller of a request, put in its extensions by the gateway; the `/mcp` door
/// audits it with each call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallerName(pub std::sync::Arc<str>);

/// How far a routed call got, for its metrics and audit line.
#[derive(Debug, Default)]
struct Progress {
    /// The call reached the pool (which counts it from there).
    reached_pool: bool,
    /// An approver decided on it.
    approval: Option<ApprovalRecord>,
}

/// A call's arguments as a door read them: an object (or none), or why they are not one.
type CallArguments = Result<Option<Map<String, Value>>, String>;

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
    approvers: Approvers,
    /// The pod's rate-limit buckets.
    limiter: crate::policy::rate_limit::Limiter,
    /// Which set each session was last served, for the `effective_set` audit lines.
    sets: super::effective_log::SetLog,
}

impl Agent {
    /// An agent over `registry` and `pool`. Nothing is served until [`Agent::run`] publishes
    /// the first state.
    pub fn new(options: AgentOptions, registry: Arc<dyn RegistryView>, pool: Pool) -> Self {
        let initial = AgentState {
            snapshot: registry.snapshot(),
            catalog: None,
            profile_error: None,
            first_lists_done: false,
            generation: 0,
            tools_fingerprint: 0,
            listings_fingerprint: 0,
            default_set: None,
        };
        let (state, _) = watch::channel(Arc::new(initial));
        let approvers = Approvers::new(
            options.origin.clone(),
            options.kube.clone(),
            options.egress.clone(),
            pool.secrets().clone(),
        );
        let mut options = options;
        options.audit.redact_with(pool.secrets().clone());
        let limiter = crate::policy::rate_limit::Limiter::default();
        let sets = super::effective_log::SetLog::default();
        Agent { inner: Arc::new(Inner { options, registry, pool, state, approvers, limiter, sets }) }
    }

    /// `--egress-deny-cidrs`.
    pub(crate) fn egress(&self) -> &crate::egress::AddressDenyList {
        &self.inner.options.egress
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

    /// Whether the agent is ready: the profile compiles against the registry and each of its
    /// servers has had a first listing attempt.
    pub fn is_ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// `Ok` when ready, else why not; either way with one line per server of the profile
    /// saying where its tools stand (for `/readyz`'s body).
    pub fn readiness(&self) -> Result<String, String> {
        let state = self.state();
        if state.generation == 0 {
            return Err("starting: the registry is being read".to_string());
        }
        if let Some(error) = &state.profile_error {
            return Err(format!("{error}; the agent serves no tools until it exists and is valid"));
        }
        let now = std::time::SystemTime::now();
        let servers: String = state
            .catalog
            .iter()
            .flat_map(|catalog| catalog.listings())
            .map(|(id, listing, tools)| format!("{id}: {}\n", listing.describe(tools, now)))
            .collect();
        if !state.first_lists_done {
            return Err(format!("listing the profile's servers' tools for the first time\n{servers}"));
        }
        Ok(servers)
    }

    /// Waits until the agent is past starting: ready, or its profile found missing or invalid
    /// (which only a registry change mends, so nobody should wait for it).
    pub async fn settled(&self) {
        let mut rx = self.watch();
        let _ = rx.wait_for(|s| s.is_settled()).await;
    }

    /// Waits until the agent is ready.
    pub async fn ready(&self) {
        let mut rx = self.watch();
        // The sender lives as long as `self`, so this cannot fail while we hold it.
        let _ = rx.wait_for(|s| s.generation > 0 && s.catalog.is_some() && s.first_lists_done).await;
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

    /// The audit sink.
    /// Records `set` as served in `context`'s scope: the `effective_set` audit line when it is
    /// new to the scope (with a warning logged when it offers no tool); with `offered` (a chat
    /// request's tools, a session's listing) also `mcp_injection_total` per server.
    pub(crate) fn served_set(&self, set: &EffectiveSet, context: CallContext<'_>, offered: bool) {
        if offered {
            let metrics = &self.inner.options.pool_metrics;
            for (server, status) in set.injections() {
                metrics.injection(server, status);
            }
        }
        let Some(digest) = self.inner.sets.is_new(context.door, context.session_id, set) else { return };
        if set.tools().next().is_none() {
            // Servers still starting (a first `npx` download) are no misconfiguration.
            let starting = set.injections().filter(|(_, status)| *status == "not_listed").count();
            if starting > 0 {
                tracing::info!(
                    profile = %set.profile, door = ?context.door, starting,
                    "the effective set offers no tool yet: servers are still starting"
                );
            } else {
                tracing::warn!(
                    profile = %set.profile, door = ?context.door,
                    "the effective set offers no tool: check the McpProfile's servers and defaultServers, \
                     and `spearlet explain` for why each tool is left out"
                );
            }
        }
        let audit = &self.inner.options.audit;
        super::effective_log::record(audit, set, digest, context.door, context.request_id, context.session_id);
    }

    /// `result` with the held secrets and the profile's output filters applied (see
    /// `agent::redaction`): a `block` finding turns an output into its refusal.
    fn guard_output(&self, set: &EffectiveSet, result: &mut Result<ToolOutput, McpError>) {
        let held = self.inner.pool.secrets().redactor();
        let guard = super::redaction::OutputGuard { held: &held, filters: set.output_filters() };
        if guard.is_off() {
            return;
        }
        match result {
            Ok(output) => {
                if let Err(refusal) = guard.tool_output(output) {
                    *result = Err(refusal);
                }
            }
            Err(error) => guard.error(error),
        }
    }

    /// A chat completion's tool loop ended: its iterations, tool calls and the budget it used up.
    pub(crate) fn chat_loop_done(&self, iterations: u32, tool_calls: u32, budget: Option<&'static str>) {
        self.inner.options.pool_metrics.chat_loop(iterations, tool_calls, budget);
    }

    /// Counts a refusal in `mcp_denied_total`.
    pub(crate) fn denied_metric(&self, server: &str, reason: &'static str) {
        self.inner.options.pool_metrics.denied(server, reason);
    }

    pub(crate) fn audit(&self) -> &AuditSink {
        &self.inner.options.audit
    }

    /// Writes out every audit line queued so far (call before the process exits).
    pub fn flush_audit(&self) {
        self.inner.options.audit.flush();
    }

    /// Calls the tool `name` (a model-facing or dotted name) of `set`. `arguments` is `Err`
    /// with a reason when the caller's arguments were not a JSON object. Never fails: every
    /// failure is a structured [`McpError`] in the result. One audit line per call; every
    /// refusal is counted in `mcp_tool_call_error_total`.
    ///
    /// A name of an allowed server whose tools are not listed yet (the agent or the server is
    /// starting, its listing failed) waits for the list within the server's call budget, then
    /// routes or, still unknown, is `mcp_unavailable` and retryable: a client must not give up
    /// on a tool it is entitled to because it asked early. Only a name the policy excludes once
    /// the lists are known is `mcp_policy_denied`.
    pub async fn call_tool(
        &self,
        set: &EffectiveSet,
        name: &str,
        arguments: Result<Option<Map<String, Value>>, String>,
        context: CallContext<'_>,
    ) -> ToolCall {
        // The trace's view of the call: what was called, by whom (a gateway caller), and how it
        // ended; never its arguments.
        let span = tracing::info_span!(
            target: otel::TARGET,
            "tool.call",
            server_id = tracing::field::Empty,
            tool = tracing::field::Empty,
            registry_revision = set.revision.as_str(),
            code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            caller = tracing::field::Empty,
        );
        if let Some(caller) = context.caller {
            span.record("caller", caller);
        }
        let call = self.call_tool_untraced(set, name, arguments, context).instrument(span.clone()).await;
        if !span.is_disabled() {
            if let Some(server) = &call.server_id {
                span.record("server_id", &**server);
            }
            if let Some(tool) = &call.tool {
                span.record("tool", &**tool);
            }
            span.record("code", call.status());
            if call.result.is_err() {
                span.record("otel.status_code", "ERROR");
            }
        }
        call
    }

    /// [`Self::call_tool`] without its span.
    async fn call_tool_untraced(
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
            approval: None,
        };
        let audit_arguments = self.inner.options.audit.arguments(arguments.as_ref().ok().and_then(Option::as_ref));
        // A chat completion records its set once, for the request (the chat door).
        if context.door != Door::Chat {
            self.served_set(set, context, false);
        }
        let (used, resolved) = self.resolve(set, name, started).await;
        let mut progress = Progress::default();
        call.result = match resolved {
            Ok(route) => {
                call.server_id = Some(route.server.clone());
                call.tool = Some(route.tool.clone());
                let routed = self.call_routed(&used, &route, name, arguments, &context, started, &mut progress);
                match context.cancelled {
                    Some(cancelled) => tokio::select! {
                        result = routed => result,
                        () = cancelled.cancelled() => Err(McpError::new(
                            ErrorCode::McpCancelled,
                            format!("the caller cancelled '{name}'; the server was told to stop"),
                        )),
                    },
                    None => routed.await,
                }
            }
            Err((error, server)) => {
                call.server_id = server;
                Err(error)
            }
        };
        self.guard_output(&used, &mut call.result);
        call.latency = started.elapsed();
        call.approval = progress.approval;
        if let Err(McpError { reason: Some(reason), .. }) = &call.result {
            let server = call.server_id.clone().or_else(|| used.named_server(name));
            self.inner.options.pool_metrics.denied(server.as_deref().unwrap_or_default(), reason);
        }
        if let Err(error) = &call.result
            && !progress.reached_pool
        {
            let metrics = &self.inner.options.pool_metrics;
            match (&call.server_id, &call.tool) {
                (Some(server), Some(tool)) => metrics.call(server, tool, call.latency, None, Some(error.code.as_str())),
                // The caller's name is not a label value (unbounded): the tool stays empty, the
                // server is the profile's server the name designates, if any.
                (server, _) => {
                    let server = server.clone().or_else(|| used.named_server(name));
                    metrics.refused(server.as_deref().unwrap_or_default(), error.code.as_str());
                }
            }
        }
        self.record(&call, context, &used.profile, used.revision.as_str(), audit_arguments);
        call
    }

    /// A call the agent answers itself (the `find_tools` built-in of `chat.toolSelection`):
    /// `run` gets the arguments object and returns the tool output; audited like every call,
    /// with no server.
    pub(crate) fn call_builtin(
        &self,
        set: &EffectiveSet,
        name: &str,
        arguments: CallArguments,
        context: CallContext<'_>,
        run: impl FnOnce(Option<&Map<String, Value>>) -> Result<Value, McpError>,
    ) -> ToolCall {
        let started = Instant::now();
        let audit_arguments = self.inner.options.audit.arguments(arguments.as_ref().ok().and_then(Option::as_ref));
        let result = match &arguments {
            Ok(object) => run(object.as_ref()),
            Err(message) => Err(McpError::new(ErrorCode::McpInvalidArguments, message.clone())),
        }
        .map(|output| {
            let text = output.to_string();
            ToolOutput {
                bytes: text.len(),
                result: rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text(text)]),
                ..empty_output()
            }
        });
        let call = ToolCall {
            name: name.to_string(),
            server_id: None,
            tool: None,
            latency: started.elapsed(),
            result,
            approval: None,
        };
        self.record(&call, context, &set.profile, set.revision.as_str(), audit_arguments);
        call
    }

    /// The audit line of `call`.
    fn record(&self, call: &ToolCall, context: CallContext<'_>, profile: &str, revision: &str, arguments: Value) {
        // The caller's name is the caller's text: a value it holds is cut before the cap, so no
        // prefix of it is left either.
        let held = self.inner.pool.secrets().redactor();
        let called_as = held.redact(&call.name);
        self.inner.options.audit.record(&AuditLine {
            ts: audit::now(),
            request_id: context.request_id,
            session_id: context.session_id,
            caller: context.caller,
            door: context.door,
            profile,
            registry_revision: revision,
            server_id: call.server_id.as_deref(),
            kind: None,
            tool_name: audit::capped(call.tool.as_deref().unwrap_or(&called_as)),
            called_as: audit::capped(&called_as),
            status: call.status(),
            latency_ms: audit::millis(call.latency),
            output_bytes: call.result.as_ref().ok().map(|o| o.bytes),
            arguments,
            approval: call.approval.as_ref(),
            reason: call.result.as_ref().err().and_then(|e| e.reason),
        });
    }

    /// Refuses a call without routing its name (a call the policy must not run whatever it names,
    /// such as a chat `custom` call): `mcp_policy_denied` with `reason`, audited and counted.
    pub(crate) fn deny_call(
        &self,
        set: &EffectiveSet,
        name: &str,
        reason: String,
        context: CallContext<'_>,
    ) -> ToolCall {
        let refusal = McpError::denied(ErrorCode::McpPolicyDenied, "not_a_function_call", reason);
        self.policy_denied(name, refusal, context, &set.profile, set.revision.as_str())
    }

    /// Refuses a call a door could not even compute a tool set for (the profile does not exist
    /// or is invalid): audited and counted like every other refusal.
    pub(crate) fn refuse_call(&self, error: &PolicyError, name: &str, context: CallContext<'_>) -> McpError {
        let revision = self.state().snapshot.revision().clone();
        let refusal = McpError::denied(ErrorCode::McpPolicyDenied, error.label(), error.to_string());
        let call = self.policy_denied(name, refusal.clone(), context, self.profile(), revision.as_str());
        call.result.err().unwrap_or(refusal)
    }

    /// The `mcp_policy_denied` call of `name`, never routed: counted and audited.
    fn policy_denied(
        &self,
        name: &str,
        refusal: McpError,
        context: CallContext<'_>,
        profile: &str,
        revision: &str,
    ) -> ToolCall {
        let metrics = &self.inner.options.pool_metrics;
        metrics.refused("", refusal.code.as_str());
        metrics.denied("", refusal.reason.unwrap_or("policy"));
        let call = ToolCall {
            name: name.to_string(),
            server_id: None,
            tool: None,
            latency: Duration::ZERO,
            result: Err(refusal),
            approval: None,
        };
        self.record(&call, context, profile, revision, self.inner.options.audit.arguments(None));
        call
    }

    /// The route of `name`, waiting (within the call budget of the server it names) for that
    /// server's tool list when it is not known yet. Returns the set the decision used (a newer
    /// one when a new state was published meanwhile), and the refusal with the server it
    /// concerns otherwise.
    async fn resolve<'s>(
        &self,
        set: &'s EffectiveSet,
        name: &str,
        started: Instant,
    ) -> (Cow<'s, EffectiveSet>, Result<Route, (McpError, Option<Arc<str>>)>) {
        let mut current = Cow::Borrowed(set);
        let mut states: Option<watch::Receiver<Arc<AgentState>>> = None;
        loop {
            if let Some(route) = current.route(name) {
                let route = route.clone();
                return (current, Ok(route));
            }
            let Some(unlisted) = current.unlisted(name) else {
                let error = McpError::denied(
                    ErrorCode::McpPolicyDenied,
                    current.refusal_reason(name),
                    format!("tool '{name}' is not available to this workload (McpProfile '{}')", current.profile),
                );
                return (current, Err((error, None)));
            };
            // Refusals only a configuration change ends: at once, not after the tool timeout.
            let refusal = match &unlisted.listing {
                Listing::EnvMissing(variable) => Some((
                    Some("env_missing"),
                    format!(
                        "server '{}' needs the variable {variable}, which is not set in the agent's environment",
                        unlisted.server
                    ),
                )),
                Listing::Failed { message, lasting: true } => {
                    Some((None, format!("server '{}' cannot be used: {message}", unlisted.server)))
                }
                _ => None,
            };
            if let Some((reason, message)) = refusal {
                let error = McpError { retryable: false, reason, ..McpError::new(ErrorCode::McpUnavailable, message) };
                return (current, Err((error, Some(unlisted.server))));
            }
            // The first time, look at the state published since the door computed `set`;
            // then wait for the next one.
            let first = states.is_none();
            let rx = states.get_or_insert_with(|| self.watch());
            if !first {
                let budget = Duration::from_millis(u64::from(unlisted.budgets.tool_timeout_ms));
                let left = budget.saturating_sub(started.elapsed());
                let woke = !left.is_zero() && matches!(tokio::time::timeout(left, rx.changed()).await, Ok(Ok(())));
                if !woke {
                    let health = self.pool().status(&unlisted.server).map(|s| s.health);
                    let error = unlisted_error(name, &unlisted, health.as_ref(), started.elapsed());
                    return (current, Err((error, Some(unlisted.server))));
                }
            }
            let state = rx.borrow_and_update().clone();
            match &state.catalog {
                Some(catalog) if !current.is_from(catalog) => match current.recompute(catalog) {
                    Ok(newer) => current = Cow::Owned(newer),
                    Err(e) => {
                        let error = McpError::denied(ErrorCode::McpPolicyDenied, e.label(), e.to_string());
                        return (current, Err((error, None)));
                    }
                },
                None if state.generation > 0 => {
                    let message = state.profile_error.clone().unwrap_or_else(|| "the profile is not served".into());
                    let error = McpError::denied(ErrorCode::McpPolicyDenied, "profile_unavailable", message);
                    return (current, Err((error, None)));
                }
                // The same catalog, or the first state is not published yet: wait on.
                _ => {}
            }
        }
    }

    /// A routed call: arguments, approval, then the pool with what is left of the budget.
    #[allow(clippy::too_many_arguments)] // one call's parts, passed once
    async fn call_routed(
        &self,
        set: &EffectiveSet,
        route: &Route,
        name: &str,
        arguments: CallArguments,
        context: &CallContext<'_>,
        started: Instant,
        progress: &mut Progress,
    ) -> Result<ToolOutput, McpError> {
        let server = set.servers.iter().find(|s| s.id == route.server).ok_or_else(|| {
            McpError::new(ErrorCode::McpPolicyDenied, format!("server '{}' is not in use", route.server))
        })?;
        let arguments = arguments.map_err(|reason| {
            McpError::new(
                ErrorCode::McpInvalidArguments,
                format!("arguments of '{name}' are not a JSON object: {reason}"),
            )
        })?;
        let tool = server.tools.as_ref().and_then(|tools| tools.iter().find(|t| t.tool.name == route.tool));
        let budgets = server.budgets;
        let budget = Duration::from_millis(u64::from(budgets.tool_timeout_ms));
        let subject = Subject {
            profile: &set.profile,
            server: &route.server,
            tool: &route.tool,
            name,
            annotations: tool.and_then(|t| t.tool.metadata.as_ref()).and_then(|m| m.get("annotations")),
            arguments: arguments.as_ref(),
            revision: set.revision.as_str(),
        };
        if let Some(origin) = self.foreign_secret(arguments.as_ref(), &route.server) {
            return Err(McpError::denied(
                ErrorCode::McpPolicyDenied,
                "secret_in_arguments",
                format!(
                    "the arguments of '{name}' hold a secret the agent holds ([redacted: {origin}]) that server '{}' \
                     was not given; the call was not sent",
                    route.server
                ),
            ));
        }
        let rates = set.rate_rules();
        if !rates.is_empty() {
            let model_name = tool.map_or(name, |t| &*t.name);
            let buckets = rates.buckets(&route.server, &route.tool, model_name, context.caller);
            if let Err(limited) = self.inner.limiter.take(&buckets, Instant::now()) {
                let message = format!(
                    "'{name}' is over its rate limit, {}: retry in {} ms",
                    limited.bucket.describe(&set.profile),
                    limited.retry_after.as_millis().max(1)
                );
                return Err(McpError::rate_limited(message, limited.retry_after));
            }
        }
        let mode = tool.map_or(ApprovalMode::Never, |t| t.approval);
        let approved = if crate::policy::approval::needs_approval(mode, subject.annotations) {
            // Time spent waiting for the tool list counts against the call's budget, and so
            // does the wait for a decision.
            let wait = budget.saturating_sub(started.elapsed());
            let asking = self.inner.approvers.approve(set.approval(), &subject, mode, context, wait);
            let (outcome, record) = asking.await;
            if let Some(record) = &record {
                let metrics = &self.inner.options.pool_metrics;
                metrics.approval(&route.server, record.approver, record.decision, record.latency_ms);
            }
            progress.approval = record;
            match outcome? {
                Ok(approved) => approved,
                Err(question) => return Ok(question),
            }
        } else {
            Approved::AsSent
        };
        let timeout = budget.saturating_sub(started.elapsed());
        progress.reached_pool = true;
        let max_output = budgets.max_tool_output_bytes as usize;
        match approved {
            Approved::AsSent => {
                let doors = (context.input, context.relay);
                self.send(route, arguments, doors, timeout, max_output).await
            }
            Approved::InRound(continuation) => {
                let digest = crate::approval::argument_digest(arguments.as_ref());
                let doors = (Some(&continuation), context.relay);
                let mut output = self.send(route, arguments, doors, timeout, max_output).await?;
                if let Some(asked) = &output.input_required {
                    let sealed = self.inner.approvers.seal_server_round(name, &digest, asked, budget);
                    output.input_required = Some(Arc::new(sealed));
                }
                Ok(output)
            }
        }
    }

    /// Where a held value in `arguments` (any key or string, any spelling) came from, when it
    /// was not given to `server`: such a call would carry it to a server not meant to have it.
    fn foreign_secret(&self, arguments: Option<&Map<String, Value>>, server: &str) -> Option<String> {
        let arguments = arguments?;
        let held = self.inner.pool.secrets().redactor();
        if held.is_empty() || !held.holds_foreign_to(server) {
            return None;
        }
        arguments.iter().find_map(|(key, value)| {
            held.foreign_in(key, server).or_else(|| held.foreign_in_json(value, server)).map(str::to_string)
        })
    }

    /// Sends an approved call to the pool, relaying what the server asks of the caller as its
    /// door can (`input` for a 2026-07-28 caller, `relay` for a 2025 session).
    async fn send(
        &self,
        route: &Route,
        arguments: Option<Map<String, Value>>,
        (input, relay): (Option<&crate::mcp::Continuation>, Option<&crate::mcp::Relay>),
        timeout: Duration,
        max_output: usize,
    ) -> Result<ToolOutput, McpError> {
        let pool = &self.inner.pool;
        match (input, relay) {
            (None, None) => pool.call_tool(&route.server, &route.tool, arguments, timeout, max_output).await,
            (Some(_), _) => {
                pool.call_tool_continuing(&route.server, &route.tool, arguments, input, relay, timeout, max_output)
                    .await
            }
            // A 2025 caller, which a 2026-07-28 server's rounds of input requests are bridged to:
            // each request is put to it as a 2025 server would, and the call is sent again with
            // its answers, within the call's one budget.
            // A caller that can answer no input request: one round, as for a 2026-07-28 caller
            // (its arguments are moved, not copied for a retry that cannot come).
            (None, Some(relay)) if !relay.answers_requests() => {
                let output = pool.call_tool_continuing(
                    &route.server,
                    &route.tool,
                    arguments,
                    None,
                    Some(relay),
                    timeout,
                    max_output,
                );
                let output = output.await?;
                match &output.input_required {
                    Some(asked) => Err(crate::mcp::pool::input_required(&route.server, &route.tool, asked)),
                    None => Ok(output),
                }
            }
            (None, Some(relay)) => {
                let deadline = Instant::now() + timeout;
                let mut continuation = crate::mcp::Continuation::new(None, None, Some(relay.capabilities()));
                for _ in 0..MAX_INPUT_ROUNDS {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let output = pool.call_tool_continuing(
                        &route.server,
                        &route.tool,
                        arguments.clone(),
                        Some(&continuation),
                        Some(relay),
                        left,
                        max_output,
                    );
                    let output = output.await?;
                    let Some(asked) = &output.input_required else { return Ok(output) };
                    let refused = || crate::mcp::pool::input_required(&route.server, &route.tool, asked);
                    let answered = tokio::time::timeout_at(deadline.into(), relay.answer_round(asked)).await;
                    continuation.input_responses = Some(answered.ok().flatten().ok_or_else(refused)?);
                    continuation.request_state = asked.request_state.clone();
                }
                Err(McpError::new(
                    ErrorCode::McpUnavailable,
                    format!(
                        "'{}' on '{}' asked for input {MAX_INPUT_ROUNDS} times over; the call was ended",
                        route.tool, route.server
                    ),
                ))
            }
        }
    }

    /// Keeps the state in step with the registry and the servers' tool lists until `cancel`;
    /// then closes every session. Spawn it once.
    pub async fn run(self, cancel: CancellationToken) {
        let inner = &self.inner;
        let mut registry_rx = inner.registry.watch();
        let mut refresh = Refresh::new(inner.options.retry_interval);
        loop {
            let snapshot = registry_rx.borrow_and_update().clone();
            if refresh.applied.as_ref() != Some(snapshot.revision()) {
                self.apply_snapshot(&snapshot, &mut refresh).await;
            }
            let (catalog, changes, failed) = self.list_tools(&snapshot, &mut refresh).await;
            if let Some(catalog) = &catalog {
                self.report_pins(catalog, &mut refresh);
            }
            self.publish(snapshot, catalog, refresh.profile_error.clone(), refresh.first_lists_done);
            let wait = self.next_wait(failed, &mut refresh.retry);
            let next = wait_for_change(&cancel, &mut registry_rx, changes, wait, &mut refresh.relisted_for_change);
            if next.await.is_break() {
                break;
            }
        }
        inner.pool.shutdown().await;
    }

    /// A new registry revision: the pool's servers, the profile compiled against it, and the
    /// stdio servers that need a pod restart.
    async fn apply_snapshot(&self, snapshot: &Snapshot, refresh: &mut Refresh) {
        let inner = &self.inner;
        for problem in inner.pool.apply(snapshot).await {
            tracing::warn!(error = %problem, "server configuration not usable");
        }
        (refresh.compiled, refresh.profile_error) = match CompiledProfile::compile(snapshot, &inner.options.profile) {
            Ok(c) => (Some(c), None),
            Err(e) => {
                tracing::warn!(error = %e, "profile not served");
                (None, Some(profile_problem(snapshot, &e)))
            }
        };
        if refresh.compiled.is_none() {
            // A profile that comes back is listed afresh before it counts as ready.
            refresh.first_lists_done = false;
        }
        refresh.applied = Some(snapshot.revision().clone());
        let now: BTreeSet<String> = refresh
            .compiled
            .iter()
            .flat_map(|c| c.servers())
            .filter(|(id, _)| inner.pool.needs_pod_restart(id))
            .map(|(id, _)| id.to_string())
            .collect();
        if now != refresh.restart_required {
            for id in now.difference(&refresh.restart_required) {
                tracing::warn!(
                    server_id = %id,
                    "server needs a pod restart: a stdio server that joined the profile after this pod started \
                     (no sidecar here), or an http server whose URL, issuer or token mode moved since the pod's \
                     credentials were granted; its tools stay unavailable until the pod is recreated"
                );
            }
            inner.options.registry_metrics.restart_required(now.iter().map(String::as_str));
            refresh.restart_required = now;
        }
    }

    /// Logs each tool that newly stops matching its pin, and each that matches again (once per
    /// change, not per round), and sets the gauge.
    fn report_pins(&self, catalog: &ProfileCatalog, refresh: &mut Refresh) {
        let now = catalog.pin_findings();
        if now == refresh.pin_findings {
            return;
        }
        for (server_id, tool, reason, served) in now.difference(&refresh.pin_findings) {
            tracing::warn!(
                server_id = %server_id, tool = %tool, reason = %reason, served,
                "tool does not match its pin: the server changed or added it since it was pinned; \
                 review it, then run spearlet pin (withheld under pinning.mode enforce)"
            );
        }
        let still = |server: &Arc<str>, tool: &Arc<str>| now.iter().any(|(s, t, _, _)| s == server && t == tool);
        for (server_id, tool, _, _) in refresh.pin_findings.iter().filter(|(s, t, _, _)| !still(s, t)) {
            tracing::info!(server_id = %server_id, tool = %tool, "tool matches its pin again (or is no longer listed)");
        }
        let findings = now.iter().map(|(server, _, reason, _)| (&**server, reason.to_string()));
        self.inner.options.registry_metrics.pin_findings(findings);
        refresh.pin_findings = now;
    }

    /// Lists the profile's servers' tools (concurrently, publishing each newly listed server at
    /// once) into the catalog; also the servers' `list_changed` signals, subscribed before
    /// listing so a change during the listing is not missed, and whether a listing failed.
    async fn list_tools(
        &self,
        snapshot: &Arc<Snapshot>,
        refresh: &mut Refresh,
    ) -> (Option<Arc<ProfileCatalog>>, Vec<BoxFuture<'static, ()>>, bool) {
        let inner = &self.inner;
        let Some(compiled) = &refresh.compiled else { return (None, Vec::new(), false) };
        let known = &mut refresh.known;
        let mut changes = Vec::new();
        let servers: Vec<(String, String)> =
            compiled.servers().map(|(id, part)| (id.to_string(), part.to_string())).collect();
        known.retain(|id, _| servers.iter().any(|(s, _)| s == id));
        for (id, _) in &servers {
            if let Ok(changed) = inner.pool.list_changed(id) {
                changes.push(changed.boxed());
            }
        }
        let catalog_of = |known: &HashMap<String, ServerTools>| {
            compiled.catalog(|id| known.get(id).cloned().unwrap_or(ServerTools::Unknown))
        };
        if !refresh.first_lists_done {
            // Before the first lists: the profile is served (its tools unknown), so readiness and
            // calls can say what they wait for.
            self.publish(snapshot.clone(), Some(catalog_of(known)), None, false);
        }
        let mut listings: futures::stream::FuturesUnordered<_> = servers
            .iter()
            .map(|(id, part)| async move { (id.clone(), inner.pool.server_tools(id, part).await) })
            .collect();
        while let Some((id, tools)) = futures::StreamExt::next(&mut listings).await {
            let newly_listed =
                matches!(tools, ServerTools::Listed(_)) && !matches!(known.get(&id), Some(ServerTools::Listed(_)));
            known.insert(id, tools);
            // A server listed for the first time is served at once; calls waiting for it need
            // not wait for slower servers.
            if newly_listed && !listings.is_empty() {
                self.publish(snapshot.clone(), Some(catalog_of(known)), None, refresh.first_lists_done);
            }
        }
        let failed = known.values().any(|t| matches!(t, ServerTools::ListFailed { .. }));
        if !refresh.first_lists_done {
            tracing::info!(servers = known.len(), "each server of the profile had its first tool list: ready");
        }
        refresh.first_lists_done = true;
        (Some(catalog_of(known)), changes, failed)
    }

    /// How long until the next round when nothing changes: the retry backoff after a failed
    /// listing (doubling up to the refresh interval), else the sooner of the refresh interval and
    /// the next tool list's expiry.
    fn next_wait(&self, failed: bool, retry: &mut Duration) -> Duration {
        let options = &self.inner.options;
        if failed {
            let wait = *retry;
            *retry = (*retry * 2).min(options.refresh_interval);
            wait
        } else {
            *retry = options.retry_interval;
            // A server's own ttlMs may be shorter than the refresh interval.
            let stale = self.inner.pool.next_list_expiry().map(|d| d.max(LIST_CHANGED_MIN_INTERVAL));
            stale.map_or(options.refresh_interval, |d| d.min(options.refresh_interval))
        }
    }

    /// Swaps a new state in when anything a door can see changed.
    fn publish(
        &self,
        snapshot: Arc<Snapshot>,
        catalog: Option<Arc<ProfileCatalog>>,
        profile_error: Option<String>,
        first_lists_done: bool,
    ) {
        let default_set = catalog.as_ref().and_then(|c| c.effective(None, &[]).ok()).map(Arc::new);
        let fingerprint = default_set.as_deref().map_or(0, fingerprint);
        // What a call to an unlisted server is told (a refusal's message) is a change too, but
        // not one of the tools MCP clients are told about.
        let listings = {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            for (id, listing, _) in catalog.iter().flat_map(|c| c.listings()) {
                id.hash(&mut hasher);
                if !matches!(listing, Listing::Listed) {
                    format!("{listing:?}").hash(&mut hasher);
                }
            }
            hasher.finish()
        };
        let metrics = &self.inner.options.registry_metrics;
        self.inner.state.send_if_modified(|current| {
            let same = current.generation > 0
                && current.snapshot.revision() == snapshot.revision()
                && current.snapshot.problems() == snapshot.problems()
                && current.tools_fingerprint == fingerprint
                && current.listings_fingerprint == listings
                && current.catalog.is_some() == catalog.is_some()
                && current.profile_error == profile_error
                && current.first_lists_done == first_lists_done;
            if same {
                return false;
            }
            let generation = current.generation + 1;
            let new_revision = current.generation == 0 || current.snapshot.revision() != snapshot.revision();
            metrics.served(new_revision, snapshot.is_degraded());
            tracing::debug!(revision = %snapshot.revision(), generation, "agent state published");
            *current = Arc::new(AgentState {
                snapshot,
                catalog,
                profile_error,
                first_lists_done,
                generation,
                tools_fingerprint: fingerprint,
                listings_fingerprint: listings,
                default_set,
            });
            true
        });
    }
}

/// What the refresh loop ([`Agent::run`]) carries from one round to the next.
struct Refresh {
    /// The registry revision last applied.
    applied: Option<Revision>,
    compiled: Option<CompiledProfile>,
    profile_error: Option<String>,
    /// The last known tool list of each server, kept across rounds so that a round publishes
    /// newly listed servers at once without hiding the others' tools while it runs.
    known: HashMap<String, ServerTools>,
    first_lists_done: bool,
    /// The next retry delay after a failed listing.
    retry: Duration,
    /// Stdio servers of the profile without a sidecar in this pod.
    restart_required: BTreeSet<String>,
    /// When the last re-list for a `list_changed` began.
    relisted_for_change: Option<Instant>,
    /// Listed tools not matching their pins, as last reported.
    pin_findings: BTreeSet<(Arc<str>, Arc<str>, Reason, bool)>,
}

impl Refresh {
    fn new(retry: Duration) -> Self {
        Refresh {
            applied: None,
            compiled: None,
            profile_error: None,
            known: HashMap::new(),
            first_lists_done: false,
            retry,
            restart_required: BTreeSet::new(),
            relisted_for_change: None,
            pin_findings: BTreeSet::new(),
        }
    }
}

/// Waits for the next reason to refresh (a registry change, a server's `list_changed`, or
/// `wait`); `Break` on `cancel`.
async fn wait_for_change(
    cancel: &CancellationToken,
    registry_rx: &mut watch::Receiver<Arc<Snapshot>>,
    changes: Vec<BoxFuture<'static, ()>>,
    wait: Duration,
    relisted_for_change: &mut Option<Instant>,
) -> ControlFlow<()> {
    let any_change = async {
        if changes.is_empty() {
            std::future::pending::<()>().await;
        } else {
            futures::future::select_all(changes).await;
        }
    };
    tokio::select! {
        () = cancel.cancelled() => return ControlFlow::Break(()),
        changed = registry_rx.changed() => {
            if changed.is_err() {
                // The source ended (its own shutdown): keep serving the last state.
                cancel.cancelled().await;
                return ControlFlow::Break(());
            }
        }
        () = any_change => {
            // A server may send list_changed in a storm (a bug, or on purpose): each would
            // cost a tools/list and a list_changed to every /mcp client. At most one re-list
            // per LIST_CHANGED_MIN_INTERVAL; notifications arriving meanwhile fold into it
            // (the pool compares their count, so none is lost).
            if let Some(at) = *relisted_for_change {
                let quiet = LIST_CHANGED_MIN_INTERVAL.saturating_sub(at.elapsed());
                tokio::select! {
                    () = cancel.cancelled() => return ControlFlow::Break(()),
                    () = tokio::time::sleep(quiet) => {}
                }
            }
            *relisted_for_change = Some(Instant::now());
        }
        () = tokio::time::sleep(wait) => {}
    }
    ControlFlow::Continue(())
}

/// Why the profile is not served, for `/readyz` and refusals: the compile error, and a pointer
/// to the registry's problems when it has some (an invalid profile is left out and reported there).
fn profile_problem(snapshot: &Snapshot, error: &PolicyError) -> String {
    match snapshot.problems().len() {
        0 => error.to_string(),
        n => format!(
            "{error}; the registry reports {n} problem(s), perhaps with it (`spearlet validate` or the agent's log names them)"
        ),
    }
}

/// The answer to a call whose server's tools are still not known when its budget ran out:
/// retryable, naming the server and its state, so a client retries instead of giving up.
fn unlisted_error(name: &str, unlisted: &Unlisted, health: Option<&Health>, waited: Duration) -> McpError {
    let listing = match &unlisted.listing {
        Listing::Failed { message, .. } => format!("its last tools/list failed ({message})"),
        _ => "its tools are not listed yet".to_string(),
    };
    let server_state = match health {
        None => "not started".to_string(),
        Some(h) if h.sessions == 0 && h.last_error.is_none() => "starting".to_string(),
        Some(h) => {
            let state = match h.state {
                HealthState::Connected => "connected",
                HealthState::Degraded => "degraded",
                HealthState::Down => "down",
            };
            match &h.last_error {
                Some(error) if h.state != HealthState::Connected => format!("{state}: {error}"),
                _ => state.to_string(),
            }
        }
    };
    McpError {
        code: ErrorCode::McpUnavailable,
        message: format!(
            "'{name}' names a tool of server '{}', but {listing}; the server is {server_state}; waited {} ms, retry later",
            unlisted.server,
            waited.as_millis()
        ),
        ..McpError::new(ErrorCode::McpUnavailable, "")
    }
}

fn empty_output() -> ToolOutput {
    ToolOutput {
        result: rmcp::model::CallToolResult::success(Vec::new()),
        truncated: None,
        bytes: 0,
        latency: Duration::ZERO,
        input_required: None,
    }
}

/// Hash of a tool set as an MCP client sees it.
pub(crate) fn fingerprint(set: &EffectiveSet) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for (server, tool) in set.tools() {
        server.id.hash(&mut hasher);
        tool.name.hash(&mut hasher);
        tool.tool.description.hash(&mut hasher);
        tool.tool.input_schema.to_string().hash(&mut hasher);
        // A new title or annotation is a change clients hear of, too.
        tool.tool.metadata.as_ref().and_then(|m| serde_json::to_string(&**m).ok()).hash(&mut hasher);
    }
    for server in &set.servers {
        // A server whose tools become known (or unknown) changes what is listed.
        server.tools.is_some().hash(&mut hasher);
    }
    hasher.finish()
}
