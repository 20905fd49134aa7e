//! The gRPC door (`proto/spear/v1/agent.proto`, 127.0.0.1:4041 in a pod): explicit tool sessions
//! (`McpSessions`), a read-only view of the registry (`McpRegistry`), and server reflection.
//!
//! ```text
//! Open(server, narrowing) ──agent.effective(scope)──▶ allowed? ──▶ Sessions table (pinned scope)
//! ListTools / CallTool(session) ──▶ scope ──agent.effective (at call time)──▶ EffectiveSet
//!                                     └─ CallTool ──Agent::call_tool (policy, budgets, audit)──▶ reply
//!
//! agent.watch() ──feed task──view_of(state, profile)──▶ watch::Sender<Feed{current, history}>
//!                                                          ├─ List: current
//!                                                          └─ Watch(since): diff(base, current), then
//!                                                             one event per change (coalesced)
//! ```
//!
//! - Policy is computed again at every call from the session's pinned scope, so a registry
//!   change applies to open sessions at once.
//! - A tool call that fails for any reason, policy included, is a normal reply with `error` set.
//!   gRPC statuses are for the request itself (an unknown session, a server the profile does not
//!   allow, a full session table, a stale Watch revision); [`Refusal::into_status`] maps them.
//! - The registry view is the profile's: servers it does not allow are never shown. The feed
//!   keeps the last [`GrpcOptions::history`] views, so a Watch resumes from a recent revision.
//! - Sessions are in memory, capped, and expire after an idle timeout; expired ones are dropped
//!   lazily (on lookup, and all at once on each Open), so no sweeper task is needed.
//! - Served by [`crate::http_server`] as every other port is (connection cap, per-source share,
//!   idle connections closed, h2 pings); an open Watch stream is a request in flight.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::serve::ListenerExt as _;
use futures::Stream;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;
use tonic::service::Routes;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::agent::audit::Door;
use crate::agent::core::{Agent, AgentState, CallContext, ToolCall};
use crate::api::api_key::ApiKey;
use crate::http_server::ConnectionLimits;
use crate::mcp::arguments::arguments_from_json;
use crate::mcp::pool::ItemRead;
use crate::mcp::{ErrorCode, McpError};
use crate::policy::effective::Listing;
use crate::policy::items;
use crate::policy::{CompiledProfile, EffectiveSet, PolicyError, Reason, RequestScope};
use crate::telemetry::otel;

/// Generated protobuf types, clients and servers of `spear.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)] // generated code
pub mod pb {
    tonic::include_proto!("spear.v1");

    /// The encoded descriptor set of `proto/`, served by reflection.
    pub(crate) const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/spear_descriptor.bin"));
}

use pb::mcp_registry_server::{McpRegistry, McpRegistryServer};
use pb::mcp_sessions_server::{McpSessions, McpSessionsServer};

/// Metadata key of the error code (`mcp_policy_denied`, ...) on an error status.
pub const ERROR_CODE_METADATA: &str = "x-spear-error-code";
/// Metadata key of the registry revision on an error status.
pub const REVISION_METADATA: &str = crate::api::keys::HEADER_REGISTRY_REVISION;
/// Metadata key a client may set to correlate its calls with audit lines.
pub(crate) const REQUEST_ID_METADATA: &str = "x-request-id";

/// Tuning of the gRPC door.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GrpcOptions {
    /// A session unused for this long is gone (NOT_FOUND).
    pub(crate) session_idle_timeout: Duration,
    /// Open sessions at most; one more is RESOURCE_EXHAUSTED.
    pub(crate) max_sessions: usize,
    /// Registry views kept for Watch to resume from.
    pub(crate) history: usize,
    /// The bearer every call must carry (`agent::key_guard`); `None` admits every caller.
    pub(crate) api_key: Option<ApiKey>,
}

impl Default for GrpcOptions {
    fn default() -> Self {
        GrpcOptions {
            // 10 min: long enough for a workload that thinks between calls (a model turn), short
            // enough that a crashed client's sessions do not hold slots for long.
            session_idle_timeout: Duration::from_secs(600),
            // 1024: far above what one pod's workload keeps open; bounds memory if a client
            // leaks sessions.
            max_sessions: 1024,
            // 32 revisions: a client that reconnects after a short blip resumes with a diff;
            // one that was gone longer lists again.
            history: 32,
            api_key: None,
        }
    }
}

/// Why the gRPC door cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// The services spawn the registry feed task and need a Tokio runtime for it.
    #[error("the gRPC services need a Tokio runtime: build them from async code")]
    NoRuntime,
    /// The reflection service rejected the descriptor set (a build problem).
    #[error("cannot build the gRPC reflection service from the compiled protos")]
    Reflection {
        #[source]
        source: tonic_reflection::server::Error,
    },
    /// The listener's address cannot be read.
    #[error("cannot read the gRPC listener's address")]
    Listener {
        #[source]
        source: std::io::Error,
    },
}

/// The gRPC services (sessions, registry, reflection v1) over `agent`, to mount on a tonic
/// server. Must be called within a Tokio runtime: it spawns the registry feed task, which ends
/// with `shutdown` (which also ends every Watch stream, so a graceful shutdown can finish).
pub(crate) fn services(agent: Agent, options: GrpcOptions, shutdown: CancellationToken) -> Result<Routes, GrpcError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| GrpcError::NoRuntime)?;
    let feed = Arc::new(spawn_feed(&runtime, &agent, options.history, shutdown.clone()));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|source| GrpcError::Reflection { source })?;
    let sessions = SessionsDoor { agent: agent.clone(), sessions: Arc::new(Mutex::new(Sessions::new(&options))) };
    let registry = RegistryDoor { agent, feed, shutdown };
    let mut routes = Routes::builder();
    routes
        .add_service(McpSessionsServer::new(sessions))
        .add_service(McpRegistryServer::new(registry))
        .add_service(reflection);
    Ok(routes.routes())
}

/// Serves the gRPC door on `listener` with default options and `limits` until `shutdown`; then
/// stops accepting connections and returns once in-flight calls have finished.
pub async fn serve(
    agent: Agent,
    listener: tokio::net::TcpListener,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> Result<(), GrpcError> {
    serve_with(agent, GrpcOptions::default(), listener, limits, shutdown).await
}

/// [`serve`] with explicit options.
pub(crate) async fn serve_with(
    agent: Agent,
    options: GrpcOptions,
    listener: tokio::net::TcpListener,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> Result<(), GrpcError> {
    let addr = listener.local_addr().map_err(|source| GrpcError::Listener { source })?;
    let key = options.api_key.clone();
    let router = services(agent, options, shutdown.clone())?.prepare().into_axum_router();
    let router = crate::agent::key_guard::guarded(router, key);
    tracing::info!(%addr, "gRPC door listening");
    // The server loop of every other port (connection cap, per-source share, idle connections
    // closed, h2 pings); a Watch stream is a request in flight for as long as it lasts. Small
    // request/response messages: Nagle's delay would only add latency.
    let listener = listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::trace!(%error, "TCP_NODELAY not set on a gRPC connection");
        }
    });
    crate::http_server::serve(listener, router, limits, shutdown).await;
    tracing::debug!(%addr, "gRPC door stopped");
    Ok(())
}

// === refusals (the one mapping to gRPC statuses) ===

/// A request the door refuses as a whole (tool failures are replies, not refusals).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("session '{0}' does not exist (closed, expired after being idle, or never opened): Open a new one")]
    UnknownSession(String),
    #[error("{0}")]
    Policy(#[source] PolicyError),
    #[error("server '{server}' is allowed by McpProfile '{profile}' but is not in the registry")]
    UnknownServer { server: String, profile: String },
    #[error("{0} sessions are open, the most this agent keeps: Close sessions you no longer use")]
    TooManySessions(usize),
    #[error("{0}")]
    BadRequest(String),
    #[error(
        "registry revision '{0}' is not known to this agent (too old, or from another agent): call List and Watch from its registry_revision"
    )]
    StaleRevision(String),
}

impl Refusal {
    /// The `mcp_*` error code, when there is one.
    fn code(&self) -> Option<&'static str> {
        match self {
            Refusal::Policy(e) => Some(e.code()),
            Refusal::UnknownServer { .. } => Some("mcp_policy_denied"),
            _ => None,
        }
    }

    /// The status sent, with the error code and the registry revision as metadata.
    fn into_status(self, revision: &str) -> Status {
        let code = match &self {
            Refusal::UnknownSession(_) => tonic::Code::NotFound,
            Refusal::Policy(e) if e.code() == "mcp_invalid_arguments" => tonic::Code::InvalidArgument,
            Refusal::Policy(_) | Refusal::UnknownServer { .. } => tonic::Code::PermissionDenied,
            Refusal::TooManySessions(_) => tonic::Code::ResourceExhausted,
            Refusal::BadRequest(_) => tonic::Code::InvalidArgument,
            Refusal::StaleRevision(_) => tonic::Code::FailedPrecondition,
        };
        let error_code = self.code();
        // The message starts with the error code, as the HTTP doors' error objects do.
        let message = match error_code {
            Some(c) => format!("{c}: {self}"),
            None => self.to_string(),
        };
        let mut status = Status::new(code, message);
        if let Some(c) = error_code {
            status.metadata_mut().insert(ERROR_CODE_METADATA, MetadataValue::from_static(c));
        }
        if let Ok(value) = revision.parse() {
            status.metadata_mut().insert(REVISION_METADATA, value);
        }
        status
    }
}

// === impl Sessions ===

/// What a session pins: its server and the narrowing asked for at Open.
#[derive(Clone, Debug)]
struct Pinned {
    server_id: Arc<str>,
    scope: Arc<RequestScope>,
}

#[derive(Debug)]
struct Session {
    pinned: Pinned,
    last_used: Instant,
}

/// The open sessions (pure: the clock comes in as `now`).
#[derive(Debug)]
struct Sessions {
    map: HashMap<String, Session>,
    idle_timeout: Duration,
    max: usize,
}

impl Sessions {
    fn new(options: &GrpcOptions) -> Self {
        Sessions { map: HashMap::new(), idle_timeout: options.session_idle_timeout, max: options.max_sessions }
    }

    fn is_expired(&self, session: &Session, now: Instant) -> bool {
        now.saturating_duration_since(session.last_used) > self.idle_timeout
    }

    /// Drops expired sessions, then adds one unless the table is full.
    fn open(&mut self, id: String, pinned: Pinned, now: Instant) -> Result<(), Refusal> {
        let idle = self.idle_timeout;
        self.map.retain(|_, s| now.saturating_duration_since(s.last_used) <= idle);
        if self.map.len() >= self.max {
            return Err(Refusal::TooManySessions(self.map.len()));
        }
        self.map.insert(id, Session { pinned, last_used: now });
        Ok(())
    }

    /// The session's pins, marking it used; an expired session is dropped.
    fn touch(&mut self, id: &str, now: Instant) -> Result<Pinned, Refusal> {
        let expired = match self.map.get(id) {
            None => return Err(Refusal::UnknownSession(id.to_string())),
            Some(session) => self.is_expired(session, now),
        };
        if expired {
            self.map.remove(id);
            return Err(Refusal::UnknownSession(id.to_string()));
        }
        match self.map.get_mut(id) {
            Some(session) => {
                session.last_used = now;
                Ok(session.pinned.clone())
            }
            None => Err(Refusal::UnknownSession(id.to_string())),
        }
    }

    /// Removes a session; an unknown or expired one is an error.
    fn close(&mut self, id: &str, now: Instant) -> Result<(), Refusal> {
        match self.map.remove(id) {
            Some(session) if !self.is_expired(&session, now) => Ok(()),
            _ => Err(Refusal::UnknownSession(id.to_string())),
        }
    }
}

// === impl SessionsDoor ===

/// `spear.v1.McpSessions` over the agent core.
#[derive(Clone, Debug)]
struct SessionsDoor {
    agent: Agent,
    sessions: Arc<Mutex<Sessions>>,
}

impl SessionsDoor {
    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        self.sessions.lock()
    }

    fn revision(&self) -> String {
        self.agent.state().snapshot.revision().to_string()
    }

    fn refuse(&self, refusal: Refusal) -> Status {
        refusal.into_status(&self.revision())
    }

    fn touch(&self, id: &str) -> Result<Pinned, Status> {
        let touched = self.sessions().touch(id, Instant::now());
        touched.map_err(|r| self.refuse(r))
    }
}

/// The scope a session pins: its one server and the narrowing asked for.
fn session_scope(server_id: &str, allowlist: Vec<String>, denylist: Vec<String>) -> RequestScope {
    RequestScope {
        servers: Some(vec![server_id.to_string()]),
        // An empty allowlist on the wire means "no narrowing", not "nothing".
        tool_allowlist: (!allowlist.is_empty()).then_some(allowlist),
        tool_denylist: denylist,
        budgets: Default::default(),
    }
}

/// The name to route: a model-facing (or dotted) name as is, else the model-facing name of
/// the session's server's tool called `tool`. A server tool name not in the set (yet) becomes
/// the dotted `mcp.<server>.<tool>`, so the core can tell a server whose tools are not listed
/// yet (it waits) from a tool the policy excludes (it refuses, with its own audit line).
fn resolve<'a>(set: &'a EffectiveSet, server_id: &str, tool: &'a str) -> Cow<'a, str> {
    if set.route(tool).is_some() {
        return Cow::Borrowed(tool);
    }
    match set.tools().find(|(s, t)| *s.id == *server_id && *t.tool.name == *tool) {
        Some((_, t)) => Cow::Owned(t.name.to_string()),
        None if crate::policy::name::target(tool).is_some() => Cow::Borrowed(tool),
        None => Cow::Owned(format!("mcp.{server_id}.{tool}")),
    }
}

/// `ok`, or `mcp_output_too_large` when a read or get was cut.
fn item_status(cut: bool) -> String {
    if cut { ErrorCode::McpOutputTooLarge.as_str() } else { "ok" }.to_string()
}

fn tool_error(error: &McpError) -> pb::ToolError {
    pb::ToolError {
        code: error.code.as_str().to_string(),
        message: error.message.clone(),
        retryable: error.retryable,
        retry_after_ms: error.retry_after_ms,
        reason: error.reason.unwrap_or_default().to_string(),
    }
}

fn call_reply(call: &ToolCall, revision: &str) -> pb::CallToolReply {
    let millis = u64::try_from(call.latency.as_millis()).unwrap_or(u64::MAX);
    let mut reply = pb::CallToolReply {
        registry_revision: revision.to_string(),
        status: call.status().to_string(),
        text: call.model_text(),
        latency_ms: millis,
        server_id: call.server_id.as_deref().unwrap_or_default().to_string(),
        server_tool: call.tool.as_deref().unwrap_or_default().to_string(),
        content_json: "[]".to_string(),
        ..Default::default()
    };
    match &call.result {
        Ok(output) => {
            reply.is_error = output.result.is_error == Some(true);
            reply.truncated = output.truncated.is_some();
            // Content blocks always serialize; "[]" keeps the field valid JSON if one did not.
            reply.content_json = serde_json::to_string(&output.result.content).unwrap_or_else(|_| "[]".into());
            reply.structured_content_json = output.result.structured_content.as_ref().map(Value::to_string);
        }
        Err(error) => {
            reply.is_error = true;
            reply.error = Some(tool_error(error));
        }
    }
    reply
}

/// The reply for a call refused before it could be routed (the session's scope no longer
/// passes the policy): the same shape a routed refusal has.
fn refused_reply(error: &PolicyError, revision: &str) -> pb::CallToolReply {
    let tool_error = pb::ToolError {
        code: error.code().to_string(),
        message: error.to_string(),
        retryable: false,
        retry_after_ms: None,
        reason: error.label().to_string(),
    };
    let text =
        serde_json::json!({"error": {"code": tool_error.code, "message": tool_error.message, "retryable": false}});
    pb::CallToolReply {
        registry_revision: revision.to_string(),
        status: tool_error.code.clone(),
        is_error: true,
        content_json: "[]".to_string(),
        text: text.to_string(),
        error: Some(tool_error),
        ..Default::default()
    }
}

fn request_id<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get(REQUEST_ID_METADATA)
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string)
}

#[tonic::async_trait]
impl McpSessions for SessionsDoor {
    async fn open(&self, request: Request<pb::OpenRequest>) -> Result<Response<pb::OpenReply>, Status> {
        let pb::OpenRequest { server_id, tool_allowlist, tool_denylist } = request.into_inner();
        if server_id.is_empty() {
            return Err(self.refuse(Refusal::BadRequest("server_id is required".into())));
        }
        let scope = session_scope(&server_id, tool_allowlist, tool_denylist);
        let set = self.agent.effective(Some(&scope), &[]).map_err(|e| self.refuse(Refusal::Policy(e)))?;
        let revision = set.revision.to_string();
        // The profile may name a server the registry does not have: allowed, yet nothing to open.
        if set
            .decisions()
            .iter()
            .any(|d| d.server == server_id && d.tool.is_none() && d.reason == Reason::UnknownServer)
        {
            let refusal = Refusal::UnknownServer { server: server_id, profile: set.profile.clone() };
            return Err(refusal.into_status(&revision));
        }
        let session_id = uuid::Uuid::new_v4().to_string();
        let pinned = Pinned { server_id: server_id.as_str().into(), scope: Arc::new(scope) };
        let opened = self.sessions().open(session_id.clone(), pinned, Instant::now());
        opened.map_err(|r| r.into_status(&revision))?;
        tracing::debug!(%session_id, %server_id, "gRPC session opened");
        Ok(Response::new(pb::OpenReply { session_id, registry_revision: revision, server_id }))
    }

    async fn list_tools(&self, request: Request<pb::ListToolsRequest>) -> Result<Response<pb::ListToolsReply>, Status> {
        let pinned = self.touch(&request.get_ref().session_id)?;
        // The session's server may have left the profile since Open: the request is refused as
        // Open would refuse it now; the session stays open and works again if it comes back.
        let set = self.agent.effective(Some(&pinned.scope), &[]).map_err(|e| self.refuse(Refusal::Policy(e)))?;
        let request_id = request_id(&request);
        let session = &request.get_ref().session_id;
        self.agent.served_set(&set, CallContext::new(Door::Grpc, &request_id, Some(session)), true);
        let tools = set
            .tools()
            .filter(|(server, _)| server.id == pinned.server_id)
            .map(|(_, tool)| pb::Tool {
                name: tool.name.to_string(),
                server_tool: tool.tool.name.to_string(),
                description: tool.tool.description.as_deref().unwrap_or_default().to_string(),
                input_schema_json: tool.tool.input_schema.to_string(),
            })
            .collect();
        Ok(Response::new(pb::ListToolsReply { registry_revision: set.revision.to_string(), tools }))
    }

    async fn call_tool(&self, request: Request<pb::CallToolRequest>) -> Result<Response<pb::CallToolReply>, Status> {
        let request_id = request_id(&request);
        let span = tracing::info_span!(target: otel::TARGET, "grpc.CallTool", otel.kind = "server");
        otel::continue_trace(&span, |key| request.metadata().get(key).and_then(|v| v.to_str().ok()));
        let pb::CallToolRequest { session_id, tool, args_json } = request.into_inner();
        let pinned = self.touch(&session_id)?;
        let set = match self.agent.effective(Some(&pinned.scope), &[]) {
            Ok(set) => set,
            // A policy refusal of a call is tool output, like a refused tool: the session stays usable.
            Err(e) => {
                self.agent.refuse_call(&e, &tool, CallContext::new(Door::Grpc, &request_id, Some(&session_id)));
                return Ok(Response::new(refused_reply(&e, &self.revision())));
            }
        };
        let name = resolve(&set, &pinned.server_id, &tool).into_owned();
        // A caller that cancels (a reset stream, a passed `grpc-timeout`) drops this handler: the
        // guard then cancels the call, which runs on its own task so that it still ends as
        // `mcp_cancelled`, is audited, and tells the server to stop.
        let cancel = CancellationToken::new();
        let cancel_on_drop = cancel.clone().drop_guard();
        let (agent, session) = (self.agent.clone(), session_id.clone());
        let call = tokio::spawn(
            async move {
                let context = CallContext {
                    cancelled: Some(&cancel),
                    ..CallContext::new(Door::Grpc, &request_id, Some(&session))
                };
                let call = agent.call_tool(&set, &name, arguments_from_json(&args_json), context).await;
                (call, set.revision)
            }
            .instrument(span),
        );
        let (call, revision) = call.await.map_err(|e| Status::internal(format!("the call's task failed: {e}")))?;
        cancel_on_drop.disarm();
        // A long call counts as use: the session's idle time starts when the call ends. (A
        // session closed meanwhile stays closed.)
        let _ = self.sessions().touch(&session_id, Instant::now());
        Ok(Response::new(call_reply(&call, revision.as_str())))
    }

    async fn list_resources(
        &self,
        request: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesReply>, Status> {
        let pinned = self.touch(&request.get_ref().session_id)?;
        let set = self.agent.effective(Some(&pinned.scope), &[]).map_err(|e| self.refuse(Refusal::Policy(e)))?;
        let server_uri = |uri: &str| items::parse_resource_id(uri).map(|(_, u)| u.to_string()).unwrap_or_default();
        let resources = self
            .agent
            .list_resources(&set)
            .await
            .into_iter()
            .map(|r| pb::Resource {
                server_uri: server_uri(&r.uri),
                name: r.name.clone(),
                description: r.description.clone().unwrap_or_default(),
                mime_type: r.mime_type.clone().unwrap_or_default(),
                uri: r.uri.clone(),
            })
            .collect();
        let templates = self
            .agent
            .list_resource_templates(&set)
            .await
            .into_iter()
            .map(|t| pb::ResourceTemplate {
                server_uri_template: server_uri(&t.uri_template),
                name: t.name.clone(),
                description: t.description.clone().unwrap_or_default(),
                mime_type: t.mime_type.clone().unwrap_or_default(),
                uri_template: t.uri_template.clone(),
            })
            .collect();
        Ok(Response::new(pb::ListResourcesReply { registry_revision: set.revision.to_string(), resources, templates }))
    }

    async fn read_resource(
        &self,
        request: Request<pb::ReadResourceRequest>,
    ) -> Result<Response<pb::ReadResourceReply>, Status> {
        let request_id = request_id(&request);
        let pb::ReadResourceRequest { session_id, uri } = request.into_inner();
        let pinned = self.touch(&session_id)?;
        let context = CallContext::new(Door::Grpc, &request_id, Some(&session_id));
        let set = self.agent.effective(Some(&pinned.scope), &[]).map_err(|e| self.refuse(Refusal::Policy(e)))?;
        // The server's own URI names a resource of the session's server.
        let uri =
            if uri.starts_with(items::RESOURCE_SCHEME) { uri } else { items::resource_id(&pinned.server_id, &uri) };
        let read = self.agent.read_resource(&set, &uri, context).await;
        let _ = self.sessions().touch(&session_id, Instant::now());
        let mut reply = pb::ReadResourceReply { registry_revision: set.revision.to_string(), ..Default::default() };
        (reply.status, reply.contents_json, reply.error) = match read {
            Ok(ItemRead { result, truncated, .. }) => (
                item_status(truncated.is_some()),
                serde_json::to_string(&result.contents).unwrap_or_else(|_| "[]".into()),
                None,
            ),
            Err(error) => (error.code.as_str().to_string(), "[]".into(), Some(tool_error(&error))),
        };
        Ok(Response::new(reply))
    }

    async fn list_prompts(
        &self,
        request: Request<pb::ListPromptsRequest>,
    ) -> Result<Response<pb::ListPromptsReply>, Status> {
        let pinned = self.touch(&request.get_ref().session_id)?;
        let set = self.agent.effective(Some(&pinned.scope), &[]).map_err(|e| self.refuse(Refusal::Policy(e)))?;
        let prompts = self.agent.list_prompts_named(&set).await;
        let prompts = prompts
            .into_iter()
            .map(|(server_prompt, p)| pb::Prompt {
                name: p.name.clone(),
                server_prompt,
                description: p.description.clone().unwrap_or_default(),
                arguments_json: serde_json::to_string(&p.arguments.clone().unwrap_or_default())
                    .unwrap_or_else(|_| "[]".into()),
            })
            .collect();
        Ok(Response::new(pb::ListPromptsReply { registry_revision: set.revision.to_string(), prompts }))
    }

    async fn get_prompt(&self, request: Request<pb::GetPromptRequest>) -> Result<Response<pb::GetPromptReply>, Status> {
        let request_id = request_id(&request);
        let pb::GetPromptRequest { session_id, prompt, args_json } = request.into_inner();
        let pinned = self.touch(&session_id)?;
        let context = CallContext::new(Door::Grpc, &request_id, Some(&session_id));
        let set = self.agent.effective(Some(&pinned.scope), &[]).map_err(|e| self.refuse(Refusal::Policy(e)))?;
        let mut reply = pb::GetPromptReply { registry_revision: set.revision.to_string(), ..Default::default() };
        let arguments = match arguments_from_json(&args_json) {
            Ok(arguments) => arguments,
            Err(message) => {
                let error = McpError::new(ErrorCode::McpInvalidArguments, message);
                (reply.status, reply.messages_json, reply.error) =
                    (error.code.as_str().to_string(), "[]".into(), Some(tool_error(&error)));
                return Ok(Response::new(reply));
            }
        };
        // The server's own prompt name names a prompt of the session's server.
        let name = match (crate::policy::name::target(&prompt), set.servers.iter().find(|s| s.id == pinned.server_id)) {
            (None, Some(server)) => items::prompt_name(&server.server_part, &prompt),
            _ => prompt,
        };
        let got = self.agent.get_prompt(&set, &name, arguments, context).await;
        let _ = self.sessions().touch(&session_id, Instant::now());
        (reply.status, reply.messages_json, reply.error) = match got {
            Ok(ItemRead { result, truncated, .. }) => {
                reply.description = result.description.clone().unwrap_or_default();
                (
                    item_status(truncated.is_some()),
                    serde_json::to_string(&result.messages).unwrap_or_else(|_| "[]".into()),
                    None,
                )
            }
            Err(error) => (error.code.as_str().to_string(), "[]".into(), Some(tool_error(&error))),
        };
        Ok(Response::new(reply))
    }

    async fn close(&self, request: Request<pb::CloseRequest>) -> Result<Response<pb::CloseReply>, Status> {
        let session_id = &request.get_ref().session_id;
        let closed = self.sessions().close(session_id, Instant::now());
        closed.map_err(|r| self.refuse(r))?;
        tracing::debug!(%session_id, "gRPC session closed");
        Ok(Response::new(pb::CloseReply {}))
    }
}

// === registry view and feed ===

/// The profile's view of one registry revision: the servers it allows, by id.
#[derive(Clone, Debug, Default, PartialEq)]
struct View {
    revision: String,
    servers: BTreeMap<String, pb::Server>,
}

/// The view of `state` for `profile`: every server the profile allows that the registry has,
/// with the tools the profile exposes from it. No profile: no servers (deny by default).
fn view_of(state: &AgentState, profile: &str) -> View {
    let snapshot = &state.snapshot;
    let mut view = View { revision: snapshot.revision().to_string(), servers: BTreeMap::new() };
    let Ok(compiled) = CompiledProfile::compile(snapshot, profile) else { return view };
    let ids: Vec<String> = compiled.servers().map(|(id, _)| id.to_string()).collect();
    // Every allowed server at once, so the profile's defaults do not hide any.
    let scope = RequestScope { servers: Some(ids.clone()), ..Default::default() };
    let set = state.catalog.as_ref().and_then(|catalog| catalog.effective(Some(&scope), &[]).ok());
    let mut tools: HashMap<&str, Vec<String>> = HashMap::new();
    let mut listings: HashMap<&str, &Listing> = HashMap::new();
    for (id, listing, _) in state.catalog.iter().flat_map(|c| c.listings()) {
        listings.insert(id, listing);
    }
    if let Some(set) = &set {
        for (server, tool) in set.tools() {
            tools.entry(&server.id).or_default().push(tool.name.to_string());
        }
    }
    for id in ids {
        let Some(server) = snapshot.server(&id) else { continue };
        let spec = &server.object.spec;
        let entry = pb::Server {
            id: id.clone(),
            display_name: spec.display_name.clone().unwrap_or_default(),
            transport: spec.transport.as_str().to_string(),
            resource_version: server.resource_version.clone(),
            tool_namespace: spec.tool_namespace.clone().unwrap_or_default(),
            tools: tools.remove(id.as_str()).unwrap_or_default(),
            ..listing_fields(listings.get(id.as_str()).copied())
        };
        view.servers.insert(id, entry);
    }
    view
}

/// The `state` fields of a server whose tool list stands at `listing` (`None`: no catalog yet).
fn listing_fields(listing: Option<&Listing>) -> pb::Server {
    let Some(listing) = listing else {
        return pb::Server { state: "not_listed".to_string(), ..Default::default() };
    };
    let mut fields = pb::Server { state: listing.name().to_string(), ..Default::default() };
    match listing {
        Listing::Failed { message: detail, .. } | Listing::EnvMissing(detail) => fields.state_detail = detail.clone(),
        Listing::Starting(starting) => {
            fields.state_detail = starting.what.clone();
            fields.starting_since_unix_ms = starting
                .since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            fields.startup_budget_ms = u32::try_from(starting.budget.as_millis()).unwrap_or(u32::MAX);
        }
        Listing::Listed | Listing::NotYet | Listing::DenyAll => {}
    }
    fields
}

/// What changed from `old` to `new`: servers added or different, and ids removed.
fn diff(old: &View, new: &View) -> pb::WatchEvent {
    let upserts =
        new.servers.iter().filter(|(id, s)| old.servers.get(*id) != Some(*s)).map(|(_, s)| s.clone()).collect();
    let deletes = old.servers.keys().filter(|id| !new.servers.contains_key(*id)).cloned().collect();
    pb::WatchEvent { registry_revision: new.revision.clone(), upserts, deletes }
}

/// What the feed publishes: the current view and the recent ones, oldest first.
#[derive(Debug, Default)]
struct Feed {
    current: Arc<View>,
    history: VecDeque<Arc<View>>,
}

impl Feed {
    /// The feed after `view` is served. Each revision keeps the first view served at it: a
    /// client resuming from it then gets at worst a server it already has again (upserts are
    /// idempotent), never a missed change.
    fn advance(&self, view: View, keep: usize) -> Feed {
        let view = Arc::new(view);
        let mut history = self.history.clone();
        if !history.iter().any(|v| v.revision == view.revision) {
            history.push_back(view.clone());
        }
        while history.len() > keep.max(1) {
            history.pop_front();
        }
        Feed { current: view, history }
    }

    /// Where a Watch from `since` starts: `Ok(None)` to wait for the next change, `Ok(base)` to
    /// send the diff from `base` first.
    fn start(&self, since: &str) -> Result<Option<Arc<View>>, Refusal> {
        if since.is_empty() {
            return Ok(Some(Arc::new(View::default())));
        }
        if since == self.current.revision {
            return Ok(None);
        }
        match self.history.iter().find(|v| v.revision == since) {
            Some(base) => Ok(Some(base.clone())),
            None => Err(Refusal::StaleRevision(since.to_string())),
        }
    }
}

/// Starts the task that turns agent states into the profile's views.
fn spawn_feed(
    runtime: &tokio::runtime::Handle,
    agent: &Agent,
    keep: usize,
    shutdown: CancellationToken,
) -> watch::Receiver<Arc<Feed>> {
    let mut states = agent.watch();
    let profile = agent.profile().to_string();
    let first = Feed::default().advance(view_of(&states.borrow_and_update(), &profile), keep);
    let (tx, rx) = watch::channel(Arc::new(first));
    let task = async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                changed = states.changed() => {
                    // The agent is gone: nothing will change any more.
                    if changed.is_err() {
                        break;
                    }
                }
            }
            let view = view_of(&states.borrow_and_update(), &profile);
            tx.send_if_modified(|feed| {
                if *feed.current == view {
                    return false;
                }
                *feed = Arc::new(feed.advance(view, keep));
                true
            });
        }
        tracing::debug!("gRPC registry feed stopped");
    };
    runtime.spawn(task.instrument(tracing::info_span!("grpc_registry_feed")));
    rx
}

// === impl RegistryDoor ===

/// `spear.v1.McpRegistry` over the feed.
#[derive(Clone, Debug)]
struct RegistryDoor {
    agent: Agent,
    feed: Arc<watch::Receiver<Arc<Feed>>>,
    shutdown: CancellationToken,
}

/// A Watch in progress: what the client has seen, and what it is sent next.
struct Cursor {
    rx: watch::Receiver<Arc<Feed>>,
    seen: Arc<View>,
    first: Option<pb::WatchEvent>,
    shutdown: CancellationToken,
}

impl Cursor {
    /// The next event, or `None` when the stream ends (shutdown, or the feed stopped).
    async fn next(&mut self) -> Option<pb::WatchEvent> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        loop {
            tokio::select! {
                // Shutdown first: a graceful stop must not wait for a busy registry.
                biased;
                () = self.shutdown.cancelled() => return None,
                changed = self.rx.changed() => changed.ok()?,
            }
            let current = self.rx.borrow_and_update().current.clone();
            if *current == *self.seen {
                continue;
            }
            let event = diff(&self.seen, &current);
            self.seen = current;
            return Some(event);
        }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl McpRegistry for RegistryDoor {
    async fn list(&self, _request: Request<pb::ListRequest>) -> Result<Response<pb::ListReply>, Status> {
        let current = self.feed.borrow().current.clone();
        let servers = current.servers.values().cloned().collect();
        Ok(Response::new(pb::ListReply { registry_revision: current.revision.clone(), servers }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let since = &request.get_ref().since_revision;
        let mut rx = (*self.feed).clone();
        let feed = rx.borrow_and_update().clone();
        let current = feed.current.clone();
        let first = match feed.start(since) {
            Ok(Some(base)) => Some(diff(&base, &current)),
            Ok(None) => None,
            Err(refusal) => return Err(refusal.into_status(&current.revision)),
        };
        tracing::debug!(since = %since, revision = %current.revision, profile = %self.agent.profile(), "registry watch");
        let cursor = Cursor { rx, seen: current, first, shutdown: self.shutdown.clone() };
        let stream = futures::stream::unfold(cursor, |mut cursor| async move {
            let event = cursor.next().await?;
            Some((Ok(event), cursor))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(id: &str, version: &str) -> pb::Server {
        pb::Server { id: id.into(), resource_version: version.into(), ..Default::default() }
    }

    fn view(revision: &str, servers: &[(&str, &str)]) -> View {
        View {
            revision: revision.into(),
            servers: servers.iter().map(|(id, v)| (id.to_string(), server(id, v))).collect(),
        }
    }

    fn pinned() -> Pinned {
        Pinned { server_id: "fx".into(), scope: Arc::new(session_scope("fx", vec![], vec![])) }
    }

    fn options(max: usize) -> GrpcOptions {
        GrpcOptions { session_idle_timeout: Duration::from_secs(60), max_sessions: max, history: 4, api_key: None }
    }

    #[test]
    fn sessions_expire_after_the_idle_timeout_and_use_resets_it() {
        let mut sessions = Sessions::new(&options(8));
        let t0 = Instant::now();
        sessions.open("a".into(), pinned(), t0).expect("room");
        assert!(sessions.touch("a", t0 + Duration::from_secs(50)).is_ok());
        assert!(sessions.touch("a", t0 + Duration::from_secs(100)).is_ok(), "use resets the idle time");
        assert!(matches!(sessions.touch("a", t0 + Duration::from_secs(161)), Err(Refusal::UnknownSession(_))));
        assert!(sessions.map.is_empty(), "an expired session is dropped");
    }

    #[test]
    fn the_session_table_is_capped_but_expired_sessions_make_room() {
        let mut sessions = Sessions::new(&options(2));
        let t0 = Instant::now();
        sessions.open("a".into(), pinned(), t0).expect("room");
        sessions.open("b".into(), pinned(), t0 + Duration::from_secs(30)).expect("room");
        let full = sessions.open("c".into(), pinned(), t0 + Duration::from_secs(40));
        assert!(matches!(full, Err(Refusal::TooManySessions(2))));
        assert_eq!(full.err().map(|r| r.into_status("r").code()), Some(tonic::Code::ResourceExhausted));
        // "a" has been idle for 61 s: it expires and leaves room.
        sessions.open("c".into(), pinned(), t0 + Duration::from_secs(61)).expect("room after expiry");
        assert!(sessions.touch("a", t0 + Duration::from_secs(61)).is_err());
    }

    #[test]
    fn close_forgets_a_session_and_a_second_close_is_not_found() {
        let mut sessions = Sessions::new(&options(8));
        let t0 = Instant::now();
        sessions.open("a".into(), pinned(), t0).expect("room");
        assert!(sessions.close("a", t0).is_ok());
        let again = sessions.close("a", t0).err().map(|r| r.into_status("rev"));
        assert_eq!(again.as_ref().map(Status::code), Some(tonic::Code::NotFound));
        let revision = again.as_ref().and_then(|s| s.metadata().get(REVISION_METADATA)).and_then(|v| v.to_str().ok());
        assert_eq!(revision, Some("rev"));
    }

    #[test]
    fn diff_lists_added_changed_and_removed_servers() {
        let old = view("r1", &[("keep", "1"), ("edit", "1"), ("gone", "1")]);
        let new = view("r2", &[("keep", "1"), ("edit", "2"), ("new", "1")]);
        let event = diff(&old, &new);
        assert_eq!(event.registry_revision, "r2");
        let upserts: Vec<&str> = event.upserts.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(upserts, ["edit", "new"]);
        assert_eq!(event.deletes, ["gone"]);
        let full = diff(&View::default(), &new);
        assert_eq!(full.upserts.len(), 3);
        assert!(full.deletes.is_empty());
    }

    #[test]
    fn watch_starts_from_nothing_the_current_or_a_kept_revision_and_refuses_others() {
        let mut feed = Feed::default();
        for (i, revision) in ["r1", "r2", "r3", "r4", "r5"].iter().enumerate() {
            feed = feed.advance(view(revision, &[("s", &i.to_string())]), 4);
        }
        assert!(feed.start("").is_ok_and(|base| base.is_some_and(|b| b.servers.is_empty())));
        assert!(feed.start("r5").is_ok_and(|base| base.is_none()));
        assert!(feed.start("r2").is_ok_and(|base| base.is_some_and(|b| b.revision == "r2")));
        // Only 4 views are kept: r1 fell out.
        let stale = feed.start("r1").err().map(|r| r.into_status("r5"));
        assert_eq!(stale.as_ref().map(Status::code), Some(tonic::Code::FailedPrecondition));
        assert!(stale.is_some_and(|s| s.message().contains("List")));
    }

    #[test]
    fn a_revision_keeps_the_first_view_served_at_it() {
        let feed = Feed::default().advance(view("r1", &[("s", "1")]), 4);
        let mut later = view("r1", &[("s", "1")]);
        if let Some(s) = later.servers.get_mut("s") {
            s.tools = vec!["mcp__s__echo".into()];
        }
        let feed = feed.advance(later, 4);
        assert_eq!(feed.history.len(), 1);
        assert!(feed.history[0].servers["s"].tools.is_empty());
        assert_eq!(feed.current.servers["s"].tools, ["mcp__s__echo"]);
    }

    #[test]
    fn policy_refusals_map_to_permission_denied_with_the_error_code() {
        let refusal = Refusal::Policy(PolicyError::ServerNotInProfile { server: "x".into(), profile: "p".into() });
        let status = refusal.into_status("rev");
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(status.message().starts_with("mcp_policy_denied: "), "{}", status.message());
        let code = status.metadata().get(ERROR_CODE_METADATA).and_then(|v| v.to_str().ok());
        assert_eq!(code, Some("mcp_policy_denied"));
    }
}
