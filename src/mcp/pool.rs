//! The client pool: one long-lived session per server, shared by every caller. I/O wiring over
//! the pure pieces (config, health, output cap, error codes).
//!
//! ```text
//! call_tool(server, tool, args, budgets)
//!   ├─ global call permit ─ server permit (maxConcurrency: the N+1st call waits)
//!   ├─ session(): reuse the live session | join the start in progress | begin one: a task of
//!   │    its own (spawn/connect, initialize, first tools/list within startupTimeoutMs), so no
//!   │    caller's timeout or disconnect cuts a start short (killing `npx` mid-install breaks
//!   │    its cache); removing the server aborts it and stops the child's process group
//!   ├─ timeout(toolTimeoutMs) ─ rmcp tools/call
//!   └─ outcome ─▶ health (Connected / Degraded / Down) ─▶ restart session on crash, frame
//!                 overflow or N timeouts in a row ─▶ cap output (maxToolOutputBytes) ─▶ result
//! list_tools(server): per-server cache (TTL, short failure TTL, list_changed, single flight);
//!   a listing waits at most `startup_wait` for a start, then reports the server as starting;
//!   the start's end (either way) counts as a list change, so the agent lists again
//! apply(snapshot): unchanged servers keep their sessions; changed ones restart; removed close
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ClientCapabilities, ClientRequest, CompleteRequestParams, CompletionInfo, ErrorCode as RpcCode, GetPromptRequest,
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, InputRequest, InputRequiredResult,
    PaginatedRequestParams, Prompt, ProtocolVersion, ReadResourceRequestParams, ReadResourceResult, RequestMetaObject,
    Resource, ResourceTemplate, ServerCapabilities, ServerResult, Tool,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::{Map, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::config::{ConfigError, Mode, ServerConfig};
use super::connect::{self, Connection, ListChanged};
use super::error::{ErrorCode, McpError};
use super::health::{Action, Health};
use super::limits::{self, ListCut, ListLimits};
use super::output::{self, Truncation};
use super::relay::{InFlight, Relay};
use super::token_source::TokenSource;
use crate::api::ServerInfo;
use crate::policy::{ServerTools, Starting, ToolInfo, ToolList};
use crate::registry::snapshot::Snapshot;
use crate::telemetry::PoolMetrics;
use crate::telemetry::otel;

/// Pages of a resources/prompts listing read from one server; a server paging on forever stops
/// here.
const MAX_ITEM_PAGES: usize = 16;
/// Resources, templates or prompts kept from one server's listing.
const MAX_ITEMS: usize = 1000;

/// Every page of a paginated listing, following `nextCursor`, up to [`MAX_ITEM_PAGES`] pages and
/// [`MAX_ITEMS`] items: a server paging on forever stops there.
async fn all_pages<T>(
    page: impl AsyncFn(PaginatedRequestParams) -> Result<(Vec<T>, Option<String>), ServiceError>,
) -> Result<Vec<T>, ServiceError> {
    let mut all = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_ITEM_PAGES {
        let (items, next) = page(PaginatedRequestParams::default().with_cursor(cursor)).await?;
        all.extend(items);
        cursor = next;
        if cursor.is_none() || all.len() >= MAX_ITEMS {
            break;
        }
    }
    all.truncate(MAX_ITEMS);
    Ok(all)
}

/// A resource read or prompt get as the pool returns it.
#[derive(Clone, Debug)]
pub struct ItemRead<T> {
    /// The result, its parts cut to the output budget.
    pub result: T,
    /// The parts' size before the cap (`output::parts_size`).
    pub bytes: usize,
    /// Set when parts were cut.
    pub truncated: Option<Truncation>,
    /// The server's request for input (2026-07-28 `InputRequiredResult`), for a caller that can
    /// answer it (`result` is then empty); a caller that cannot gets `mcp_approval_required`.
    pub input_required: Option<Arc<InputRequiredResult>>,
}

impl<T: serde::de::DeserializeOwned> ItemRead<T> {
    /// Cuts the array `key` of `json` (a result as JSON) to `limit` bytes and reads it back.
    fn capped(
        mut json: Value,
        key: &str,
        text_pointer: &str,
        limit: usize,
        marker: impl FnOnce(&Truncation) -> Value,
    ) -> Result<Self, McpError> {
        let (bytes, truncated) = match json.get_mut(key).and_then(Value::as_array_mut) {
            Some(parts) => {
                let truncated = output::cap_parts(parts, limit, text_pointer, marker);
                (truncated.map_or_else(|| output::parts_size(parts, text_pointer), |t| t.original_bytes), truncated)
            }
            None => (0, None),
        };
        Ok(ItemRead {
            result: serde_json::from_value(json).map_err(unreadable)?,
            bytes,
            truncated,
            input_required: None,
        })
    }
}

fn unreadable(error: serde_json::Error) -> McpError {
    McpError::new(ErrorCode::McpUnavailable, format!("unreadable server answer: {error}"))
}

/// Tuning of the pool. Defaults suit an agent serving one pod.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Where stdio servers run.
    pub mode: Mode,
    /// How long a tools/list waits for a server's start before reporting it as starting (the
    /// start goes on, within the server's `budgets.startupTimeoutMs`).
    pub startup_wait: Duration,
    /// Ceiling of the message size accepted from a server (rmcp's own default line limit,
    /// 16 MiB); each server's own limit follows its output budget (`limits::frame_limit`).
    pub frame_limit: usize,
    /// Caps on each server's tool list.
    pub list_limits: ListLimits,
    /// Timeouts in a row after which a session (and its child) is killed and restarted.
    pub timeouts_before_restart: u32,
    /// How long a tools/list answer is reused.
    pub tools_ttl: Duration,
    /// How long a failed tools/list is remembered before trying again.
    pub failure_ttl: Duration,
    /// Tool calls in flight over all servers; more wait.
    pub max_concurrent_calls: usize,
    /// Child processes at once (local mode).
    pub max_children: usize,
    /// Sessions idle this long are closed (children reaped); `None` keeps them.
    pub idle_timeout: Option<Duration>,
    /// Where calls and connects are counted (register them on the process registry).
    pub metrics: PoolMetrics,
    /// Env vars no `${ENV:...}` template may read besides the reserved ones (the variable
    /// `--upstream-api-key-env` names).
    pub hidden_env: Vec<String>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            mode: Mode::Local,
            // 10 s: long enough for a server whose package is cached to start and list, so the
            // agent's first round (and readiness) usually sees every list; short enough that a
            // download does not hold the others back.
            startup_wait: Duration::from_secs(10),
            frame_limit: rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH,
            // 3: one slow call is not a frozen server; three in a row is.
            timeouts_before_restart: 3,
            tools_ttl: Duration::from_secs(60),
            failure_ttl: Duration::from_secs(2),
            // 256 calls and 64 children: far above one pod's needs, low enough to stop a runaway.
            max_concurrent_calls: 256,
            max_children: 64,
            idle_timeout: Some(Duration::from_secs(600)),
            metrics: PoolMetrics::default(),
            hidden_env: Vec::new(),
            list_limits: ListLimits::default(),
        }
    }
}

/// A tool call's result, capped.
#[derive(Clone, Debug)]
pub struct ToolOutput {
    /// The result as the server sent it (after the cap).
    pub result: CallToolResult,
    /// Set when the output was cut (`mcp_output_too_large`).
    pub truncated: Option<Truncation>,
    /// Size of the result before the cap, as `output::result_size` counts it.
    pub(crate) bytes: usize,
    /// How long the call took, waiting for permits and the session included.
    pub latency: Duration,
    /// The server asked for input instead of answering (2026-07-28 `InputRequiredResult`); only
    /// from [`Pool::call_tool_continuing`], for a door that relays it to its client. `result`
    /// then holds the `mcp_approval_required` error for everyone else.
    pub input_required: Option<Arc<InputRequiredResult>>,
}

/// What a client sends back to continue a call whose server asked for input (2026-07-28):
/// the answers and the server's opaque state, passed to the server unchanged (the server
/// checks its state's integrity; the agent neither reads nor trusts it).
#[derive(Clone, Debug, Default)]
pub struct Continuation {
    pub input_responses: Option<rmcp::model::InputResponses>,
    pub request_state: Option<String>,
    /// What the caller can answer when a server asks for input: of its declared capabilities,
    /// the kinds the agent relays (`elicitation`, `sampling`, `roots`). A 2026-07-28 server gets
    /// them as the request's `clientCapabilities`, in place of the pool's own (none), so it asks
    /// only for input this caller can give.
    pub client_capabilities: Option<ClientCapabilities>,
}

impl Continuation {
    /// A caller's answers and state, with the relayed part of what it `declared`.
    pub fn new(
        input_responses: Option<rmcp::model::InputResponses>,
        request_state: Option<String>,
        declared: Option<ClientCapabilities>,
    ) -> Self {
        let client_capabilities = declared.map(|declared| {
            let mut relayed = ClientCapabilities::default();
            relayed.elicitation = declared.elicitation;
            relayed.sampling = declared.sampling;
            relayed.roots = declared.roots;
            relayed
        });
        Continuation { input_responses, request_state, client_capabilities }
    }

    /// The capabilities to send `server`'s session, when it takes them per request.
    fn capabilities_for(&self, protocol: &ProtocolVersion) -> Option<&ClientCapabilities> {
        self.client_capabilities.as_ref().filter(|_| is_modern(protocol))
    }
}

/// Resource updates held for a slow reader before the oldest are dropped (it then misses some,
/// and a client re-reads what it watches anyway).
const RESOURCE_UPDATES_BUFFER: usize = 256;

/// A server's state as the pool sees it (for health endpoints, status and explain).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerStatus {
    /// Health and figures.
    pub health: Health,
    /// The `initialize` answer of the current session.
    pub info: Option<ServerInfo>,
    /// The current session's child pid (local mode).
    pub pid: Option<u32>,
    /// A required variable that is not set, if that is why the server is unavailable.
    pub(crate) env_missing: Option<String>,
    /// Why its last start failed for good (authorization refused, no sidecar in this pod), until
    /// a start succeeds: calls are refused at once rather than waiting for a retry.
    pub(crate) refused: Option<String>,
    /// Lines of the current session's stdout that were not JSON-RPC (skipped and warned about).
    pub garbage_lines: u64,
    /// What the caps cut from the last tool list (`None`: nothing, or not listed yet).
    pub list_cut: Option<ListCut>,
    /// The start in progress, if any.
    pub starting: Option<Starting>,
    /// The protocol revision of the current session (`2025-11-25`, `2026-07-28`, ...).
    pub protocol_version: Option<String>,
}

/// A live session and what it holds.
struct Live {
    conn: Connection,
    /// A slot under the child-process cap, released with the session.
    _child_permit: Option<OwnedSemaphorePermit>,
    last_used: Mutex<Instant>,
    /// The list fetched as part of the start, for the first listing to take.
    first_list: Mutex<Option<Listed>>,
}

/// One tools/list as fetched: the tools kept, what the caps cut and the server's `ttlMs`, or
/// why it failed.
type Listed = Result<(Vec<Tool>, ListCut, Option<u64>), ServiceError>;

/// What a start yields to everyone waiting on it.
type StartResult = Result<Arc<Live>, McpError>;

/// A start in progress. Its task runs whoever waits; `done` is how callers wait.
#[derive(Clone)]
struct Startup {
    facts: Starting,
    done: Shared<BoxFuture<'static, StartResult>>,
    task: tokio::task::AbortHandle,
}

/// A tools/list answer (or failure) as cached.
type ListResult = Result<Arc<Vec<Tool>>, McpError>;

/// The last tools/list: when, at which list_changed generation, what came back, and for how
/// long it is fresh.
#[derive(Default)]
struct ToolsCache {
    entry: Option<(Instant, u64, ListResult, Duration)>,
}

/// Bounds on a server's own `ttlMs`. At least 2 s: rmcp fills `ttlMs: 0` into every 2026-07-28
/// list a server does not give hints for, and honouring 0 would re-list it on every round; a
/// change still arrives at once by list_changed. At most an hour: a server's word does not keep
/// a list forever.
const MIN_SERVER_LIST_TTL: Duration = Duration::from_secs(2);
const MAX_SERVER_LIST_TTL: Duration = Duration::from_secs(3600);

/// How long a list is fresh: the server's `ttlMs` within bounds, else the pool's TTL. The scope
/// (`cacheScope`) needs no case: the agent is its pod's only client, so `private` and `public`
/// both allow it to cache; what it serves on `/mcp` it marks `private` itself.
fn list_ttl(server_ttl_ms: Option<u64>, default: Duration) -> Duration {
    server_ttl_ms.map_or(default, |ms| Duration::from_millis(ms).clamp(MIN_SERVER_LIST_TTL, MAX_SERVER_LIST_TTL))
}

struct Slot {
    config: ServerConfig,
    concurrency: Arc<Semaphore>,
    // The session, the start in progress and health are shared with the slot that replaces
    // this one when only budgets change (`with_session_of`), so a start in progress records
    // into both.
    session: Arc<tokio::sync::Mutex<Option<Arc<Live>>>>,
    /// The start in progress (set and cleared under the `session` lock).
    startup: Arc<Mutex<Option<Startup>>>,
    /// Why the last start failed, until a listing reports it (that listing is cached for the
    /// failure TTL, so a server that cannot start is not restarted in a tight loop).
    start_failure: Arc<Mutex<Option<McpError>>>,
    /// The revision the server spoke at its last start, and when: the next start speaks it
    /// directly instead of probing, until [`REVISION_TTL`] passes or a start fails.
    revision: Arc<Mutex<Option<(Instant, rmcp::model::ProtocolVersion)>>>,
    /// Counts the starts that ended, either way (not a tool list change: the cache keys on
    /// `list_changed` alone).
    start_ended: Arc<ListChanged>,
    health: Arc<Mutex<Health>>,
    env_missing: Mutex<Option<String>>,
    refused: Mutex<Option<String>>,
    list_cut: Mutex<Option<ListCut>>,
    list_changed: Arc<ListChanged>,
    tools: tokio::sync::Mutex<ToolsCache>,
    /// Compiled outputSchemas by tool, with the listed schema they were compiled from.
    validators: Mutex<HashMap<String, OutputValidator>>,
    /// The server's access tokens (`http.auth`), kept across its sessions while the resolved
    /// auth config is the same.
    tokens: Arc<Mutex<Option<Arc<TokenSource>>>>,
}

/// A listed outputSchema and its validator (or why it cannot be used).
type OutputValidator = (Arc<rmcp::model::JsonObject>, Arc<Result<jsonschema::Validator, String>>);

type EnvLookup = dyn Fn(&str) -> Option<String> + Send + Sync;

struct Inner {
    options: PoolOptions,
    env: Arc<EnvLookup>,
    slots: RwLock<HashMap<Arc<str>, Arc<Slot>>>,
    calls: Arc<Semaphore>,
    children: Arc<Semaphore>,
    shutdown: CancellationToken,
    /// Counts resources/prompts list_changed from every server.
    items_changed: Arc<ListChanged>,
    /// `notifications/resources/updated` from every server: (server id, the server's URI).
    resource_updates: tokio::sync::broadcast::Sender<(Arc<str>, String)>,
}

/// The client pool. Cheap to clone; clones share sessions.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("servers", &self.server_ids()).finish()
    }
}

impl Pool {
    /// A pool reading `${ENV:...}` values from the process environment, except `hidden_env`.
    pub fn new(options: PoolOptions) -> Self {
        let hidden = options.hidden_env.clone();
        Pool::with_env(
            options,
            Arc::new(move |name: &str| if hidden.iter().any(|h| h == name) { None } else { std::env::var(name).ok() }),
        )
    }

    /// A pool reading `${ENV:...}` values through `env` (tests pass their own).
    pub fn with_env(options: PoolOptions, env: Arc<EnvLookup>) -> Self {
        crate::install_crypto_provider();
        let inner = Arc::new(Inner {
            calls: Arc::new(Semaphore::new(options.max_concurrent_calls.max(1))),
            children: Arc::new(Semaphore::new(options.max_children.max(1))),
            options,
            env,
            slots: RwLock::new(HashMap::new()),
            shutdown: CancellationToken::new(),
            items_changed: Arc::new(ListChanged::default()),
            resource_updates: tokio::sync::broadcast::Sender::new(RESOURCE_UPDATES_BUFFER),
        });
        if let Some(idle) = inner.options.idle_timeout {
            let weak = Arc::downgrade(&inner);
            let token = inner.shutdown.clone();
            tokio::spawn(
                async move {
                    // Check four times per idle period: a session lives at most 1.25x the idle time.
                    let mut tick = tokio::time::interval((idle / 4).max(Duration::from_millis(10)));
                    loop {
                        tokio::select! {
                            _ = token.cancelled() => break,
                            _ = tick.tick() => {}
                        }
                        let Some(inner) = weak.upgrade() else { break };
                        reap_idle(&inner, idle).await;
                    }
                }
                .instrument(tracing::debug_span!("pool_reaper")),
            );
        }
        Pool { inner }
    }

    /// The servers the pool knows.
    pub(crate) fn server_ids(&self) -> Vec<Arc<str>> {
        let slots = self.inner.slots.read();
        let mut ids: Vec<Arc<str>> = slots.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Brings the pool in line with `snapshot`: new servers are added (connected lazily),
    /// servers whose connection fields changed get a fresh session and tool cache, removed
    /// servers' sessions are closed. Returns the servers that could not be configured.
    pub async fn apply(&self, snapshot: &Snapshot) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut wanted: HashMap<Arc<str>, ServerConfig> = HashMap::new();
        for versioned in snapshot.servers().values() {
            match ServerConfig::new(&versioned.object, &self.inner.options.mode) {
                Ok(config) => {
                    wanted.insert(config.id.clone(), config);
                }
                Err(e) => errors.push(e),
            }
        }
        let mut closing = Vec::new();
        {
            let mut slots = self.inner.slots.write();
            slots.retain(|id, slot| {
                let keep = wanted.get(id).is_some_and(|c| c.fingerprint == slot.config.fingerprint);
                if !keep {
                    closing.push(slot.clone());
                }
                keep
            });
            for (id, config) in wanted {
                match slots.get(&id) {
                    // Same connection; budgets may differ: a new slot shares the session.
                    Some(slot) if slot.config == config => {}
                    Some(slot) => {
                        let updated = Arc::new(Slot::with_session_of(config, slot));
                        slots.insert(id, updated);
                    }
                    None => {
                        slots.insert(id, Arc::new(Slot::new(config)));
                    }
                }
            }
        }
        for slot in closing {
            tracing::info!(server_id = %slot.config.id, "server changed or removed: closing its session");
            slot.close().await;
        }
        errors
    }

    fn slot(&self, server: &str) -> Result<Arc<Slot>, McpError> {
        let slots = self.inner.slots.read();
        slots.get(server).cloned().ok_or_else(|| {
            McpError::new(ErrorCode::McpUnavailable, format!("server '{server}' is not in the registry"))
        })
    }

    /// Establishes the sessions of every server now (eager mode); failures are recorded in
    /// health and retried on the next call.
    pub async fn connect_all(&self) {
        let slots: Vec<Arc<Slot>> = self.inner.slots.read().values().cloned().collect();
        let connects = slots.iter().map(|slot| Slot::session(slot, &self.inner));
        for result in futures::future::join_all(connects).await {
            if let Err(e) = result {
                tracing::warn!(error = %e, "eager connect failed");
            }
        }
    }

    /// Calls `tool` on `server` with the server's budgets (or tighter ones). A server asking for
    /// input ends the call with `mcp_approval_required` naming what it asked.
    pub async fn call_tool(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<Map<String, Value>>,
        timeout: Duration,
        max_output_bytes: usize,
    ) -> Result<ToolOutput, McpError> {
        let output = self.call_tool_continuing(server, tool, arguments, None, None, timeout, max_output_bytes).await?;
        match &output.input_required {
            Some(asked) => Err(input_required(server, tool, asked)),
            None => Ok(output),
        }
    }

    /// [`Self::call_tool`] for a door that relays: `continuation` carries a 2026-07-28 client's
    /// answers to an earlier round, and a server asking for input comes back as `Ok` with
    /// [`ToolOutput::input_required`] set; `relay` takes what a 2025 server sends during the call
    /// (progress, log messages, sampling and elicitation requests).
    #[allow(clippy::too_many_arguments)]
    pub async fn call_tool_continuing(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<Map<String, Value>>,
        continuation: Option<&Continuation>,
        relay: Option<&Relay>,
        timeout: Duration,
        max_output_bytes: usize,
    ) -> Result<ToolOutput, McpError> {
        let slot = match self.slot(server) {
            Ok(slot) => slot,
            Err(error) => {
                self.inner.options.metrics.call(server, tool, Duration::ZERO, None, Some(error.code.as_str()));
                return Err(error);
            }
        };
        let started = Instant::now();
        // The call to the server, as the trace sees it; its context goes out in the request's
        // `_meta` (and as headers to a Streamable HTTP server, see `connect.rs`).
        let span = tracing::info_span!(
            target: otel::TARGET,
            "pool.call",
            otel.kind = "client",
            server_id = server,
            tool = tool,
            code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        // One timer for the whole call: waiting for permits and the session counts against the
        // budget too (the caller's budget is wall time), and a single timer keeps the hot path
        // cheap. `reached` records the session the call went out on, if it got that far.
        let reached: Mutex<Option<Arc<Live>>> = Mutex::new(None);
        let work = async {
            let _call = self
                .inner
                .calls
                .acquire()
                .await
                .map_err(|_| McpError::new(ErrorCode::McpUnavailable, "the pool is shutting down"))?;
            let _permit = slot
                .concurrency
                .acquire()
                .await
                .map_err(|_| McpError::new(ErrorCode::McpUnavailable, "the server was removed"))?;
            let live = Slot::session(&slot, &self.inner).await?;
            *reached.lock() = Some(live.clone());
            let mut params = CallToolRequestParams::new(tool.to_string());
            params.arguments = arguments;
            otel::inject_meta(&span, &mut params.meta);
            if let Some(continuation) = continuation {
                params.input_responses = continuation.input_responses.clone();
                params.request_state = continuation.request_state.clone();
            }
            // One round: the agent fulfils no `input_required` round itself (it has no human and
            // no model of the server's choosing to offer), see `input_required`.
            let peer = live.conn.service.peer();
            let caller = continuation.and_then(|c| c.capabilities_for(&live.conn.protocol));
            let mut meta = caller.map(caller_meta);
            // A 2026-07-28 server sends log messages only to a request that asks for them.
            if let Some(level) = relay.and_then(Relay::log_level).filter(|_| is_modern(&live.conn.protocol)) {
                meta.get_or_insert_with(RequestMetaObject::new).set_log_level(level);
            }
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let in_flight = Some((&live.conn.calls, relay));
            Ok(send_call(peer, request, meta, in_flight).await.and_then(|result| match result {
                ServerResult::CallToolResult(result) => Ok(CallToolResponse::Complete(result)),
                ServerResult::InputRequiredResult(asked) => Ok(CallToolResponse::InputRequired(asked)),
                ServerResult::CreateTaskResult(task) => Ok(CallToolResponse::Task(task)),
                _ => Err(ServiceError::UnexpectedResponse),
            }))
        };
        let outcome = tokio::time::timeout(timeout, work).instrument(span.clone()).await;
        let latency = started.elapsed();
        let live = reached.lock().take();
        let result = match (outcome, live) {
            // The budget ran out waiting for the server's start, which goes on: say so.
            (Err(_), None) if let Some(starting) = slot.starting() => Err(McpError::new(
                ErrorCode::McpTimeout,
                format!(
                    "'{tool}' on '{server}' did not run within {} ms: the server is {}; retry shortly",
                    timeout.as_millis(),
                    starting.describe(std::time::SystemTime::now())
                ),
            )),
            (Err(_), live) => {
                let error = McpError::new(
                    ErrorCode::McpTimeout,
                    format!("'{tool}' on '{server}' did not finish within {} ms", timeout.as_millis()),
                );
                // Only a call that went out counts against the session's health.
                if let Some(live) = live {
                    let action = slot.health.lock().call_timed_out(
                        latency,
                        self.inner.options.timeouts_before_restart,
                        &error.message,
                    );
                    if action == Action::Restart {
                        tracing::warn!(server_id = %slot.config.id, "calls keep timing out: restarting the session");
                        slot.discard(&live).await;
                    }
                }
                Err(error)
            }
            (Ok(Err(error)), _) => Err(error),
            (Ok(Ok(Err(e))), Some(live)) => Err(slot.failed(&live, e).await),
            (Ok(Ok(Ok(CallToolResponse::InputRequired(asked)))), Some(live)) => {
                slot.health.lock().call_ok(latency);
                *live.last_used.lock() = Instant::now();
                let result = input_required(server, tool, &asked).to_call_tool_result();
                Ok(ToolOutput { result, truncated: None, bytes: 0, latency, input_required: Some(Arc::new(asked)) })
            }
            (Ok(Ok(Ok(CallToolResponse::Complete(result)))), Some(live)) => {
                slot.health.lock().call_ok(latency);
                *live.last_used.lock() = Instant::now();
                let structured = result.structured_content.is_some();
                let output = cap_result(result, max_output_bytes, latency)?;
                // A tool with an outputSchema must answer structuredContent that conforms; one
                // the cap had to drop cannot be passed on as a valid result.
                let validator = slot.output_validator(tool);
                if structured && output.result.structured_content.is_none() && validator.is_some() {
                    return Err(McpError::new(
                        ErrorCode::McpOutputTooLarge,
                        format!(
                            "'{tool}' on '{server}' answered {} bytes, over its {max_output_bytes}-byte \
                             maxToolOutputBytes, and its structuredContent (which its outputSchema requires) \
                             does not fit",
                            output.bytes
                        ),
                    ));
                }
                if let Some(Ok(validator)) = validator.as_deref()
                    && let Err(violation) = super::output_schema::check(validator, &output.result)
                {
                    return Err(McpError::new(
                        ErrorCode::McpUnavailable,
                        format!("'{tool}' on '{server}' broke its own outputSchema: {violation}"),
                    ));
                }
                Ok(output)
            }
            // A task handle (SEP-2663), or a kind rmcp adds later.
            (Ok(Ok(Ok(_))), Some(live)) => {
                slot.health.lock().call_ok(latency);
                *live.last_used.lock() = Instant::now();
                Err(McpError::new(
                    ErrorCode::McpUnavailable,
                    format!("'{tool}' on '{server}' answered with a task handle; the agent does not poll tasks"),
                ))
            }
            (Ok(Ok(_)), None) => Err(McpError::new(ErrorCode::McpUnavailable, "the call had no session")),
        };
        let (bytes, error) = match &result {
            Ok(output) if output.input_required.is_some() => (None, Some(ErrorCode::McpApprovalRequired.as_str())),
            Ok(output) => (Some(output.bytes), output.truncated.map(|_| ErrorCode::McpOutputTooLarge.as_str())),
            Err(error) => (None, Some(error.code.as_str())),
        };
        self.inner.options.metrics.call(server, tool, latency, bytes, error);
        span.record("code", error.unwrap_or("ok"));
        if error.is_some() {
            span.record("otel.status_code", "ERROR");
        }
        result
    }

    /// The server's tools, from the cache while fresh (TTL, list_changed), else fetched once
    /// however many callers wait.
    pub async fn list_tools(&self, server: &str) -> Result<Arc<Vec<Tool>>, McpError> {
        let slot = self.slot(server)?;
        let options = &self.inner.options;
        let mut cache = slot.tools.lock().await;
        let generation = slot.list_changed.generation();
        if let Some((at, seen, result, ttl)) = &cache.entry
            && *seen == generation
            && at.elapsed() < *ttl
        {
            return result.clone();
        }
        let fetched = Slot::fetch_tools(&slot, &self.inner).await;
        let (result, ttl) = match fetched {
            Ok((tools, server_ttl)) => (Ok(tools), list_ttl(server_ttl, options.tools_ttl)),
            Err(e) => (Err(e), options.failure_ttl),
        };
        // A server still starting is asked again when its start ends (a list change), not
        // after the failure TTL.
        if slot.starting().is_none() {
            cache.entry = Some((Instant::now(), generation, result.clone(), ttl));
        }
        result
    }

    /// How long until the first listed server's list goes stale (its TTL: the server's `ttlMs`
    /// or the pool's), so the agent lists again then; `None` when nothing is listed.
    pub(crate) fn next_list_expiry(&self) -> Option<Duration> {
        let slots: Vec<Arc<Slot>> = self.inner.slots.read().values().cloned().collect();
        slots
            .iter()
            .filter_map(|slot| {
                let cache = slot.tools.try_lock().ok()?;
                let (at, _, result, ttl) = cache.entry.as_ref()?;
                result.is_ok().then(|| ttl.saturating_sub(at.elapsed()))
            })
            .min()
    }

    /// The server's tools for the policy: named with `server_part`, or why they are unknown.
    pub async fn server_tools(&self, server: &str, server_part: &str) -> ServerTools {
        match self.list_tools(server).await {
            Ok(tools) => {
                let infos = tools
                    .iter()
                    .map(|t| ToolInfo {
                        name: t.name.as_ref().into(),
                        description: t.description.as_deref().map(Into::into),
                        input_schema: Arc::new(Value::Object((*t.input_schema).clone())),
                        metadata: tool_metadata(t),
                    })
                    .collect();
                ServerTools::Listed(Arc::new(ToolList::new(server_part, infos)))
            }
            Err(e) => match self.status(server) {
                Some(ServerStatus { env_missing: Some(variable), .. }) => ServerTools::EnvMissing { variable },
                // Before `starting`: the retry in progress cannot succeed either.
                Some(ServerStatus { refused: Some(message), .. }) => ServerTools::ListFailed { message, lasting: true },
                Some(ServerStatus { starting: Some(starting), .. }) => ServerTools::Starting(starting),
                _ => ServerTools::ListFailed { message: e.message, lasting: false },
            },
        }
    }

    /// A future that resolves when `server` sends `notifications/tools/list_changed` or a start
    /// of it ends (listed or failed) after this call (one arriving before the future is first
    /// polled still counts).
    pub fn list_changed(&self, server: &str) -> Result<impl Future<Output = ()> + Send + 'static, McpError> {
        let slot = self.slot(server)?;
        let (since, starts) = (slot.list_changed.generation(), slot.start_ended.generation());
        Ok(async move {
            tokio::select! {
                () = slot.list_changed.changed_since(since) => {}
                () = slot.start_ended.changed_since(starts) => {}
            }
        })
    }

    /// Whether `server` is a stdio server this pod has no sidecar for (it joined the profile
    /// after the pod started; only a pod restart brings its sidecar).
    pub(crate) fn needs_pod_restart(&self, server: &str) -> bool {
        self.slot(server).is_ok_and(|slot| slot.config.transport == super::config::TransportConfig::MissingSidecar)
    }

    /// Health and session facts of `server`.
    pub fn status(&self, server: &str) -> Option<ServerStatus> {
        let slot = self.slot(server).ok()?;
        let live = slot.session.try_lock().ok().and_then(|s| s.clone());
        Some(ServerStatus {
            health: slot.health.lock().clone(),
            info: live.as_ref().map(|l| l.conn.info.clone()),
            pid: live.as_ref().and_then(|l| l.conn.pid()),
            env_missing: slot.env_missing.lock().clone(),
            refused: slot.refused.lock().clone(),
            garbage_lines: live.as_ref().map_or(0, |l| l.conn.garbage_lines.load(std::sync::atomic::Ordering::Relaxed)),
            list_cut: slot.list_cut.lock().clone(),
            starting: slot.starting(),
            protocol_version: live.as_ref().map(|l| l.conn.protocol.to_string()),
        })
    }

    /// Runs one request other than `tools/call` (resources, prompts) on `server`'s session
    /// within `timeout`. `offered` says from the server's capabilities whether it has the
    /// feature at all; without it the answer is `default`, not a request the server would refuse.
    async fn request<T, Fut>(
        &self,
        server: &str,
        what: &str,
        timeout: Duration,
        offered: impl FnOnce(&ServerCapabilities) -> bool,
        default: impl FnOnce() -> T,
        run: impl FnOnce(rmcp::service::Peer<rmcp::RoleClient>) -> Fut,
    ) -> Result<T, McpError>
    where
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        let slot = self.slot(server)?;
        let work = async {
            let live = Slot::session(&slot, &self.inner).await?;
            let peer = live.conn.service.peer().clone();
            let has = peer.peer_info().is_some_and(|info| offered(&info.capabilities));
            let result = if has { Some(run(peer).await) } else { None };
            Ok::<_, McpError>((live, result))
        };
        match tokio::time::timeout(timeout, work).await {
            Err(_) => Err(McpError::new(
                ErrorCode::McpTimeout,
                format!("{what} on '{server}' did not finish within {} ms", timeout.as_millis()),
            )),
            Ok(Err(error)) => Err(error),
            Ok(Ok((_, None))) => Ok(default()),
            Ok(Ok((live, Some(Ok(value))))) => {
                *live.last_used.lock() = Instant::now();
                Ok(value)
            }
            Ok(Ok((live, Some(Err(error))))) => Err(slot.failed(&live, error).await),
        }
    }

    /// Resolves once any server sends `resources/list_changed` or `prompts/list_changed` after
    /// [`Self::items_generation`] was `generation`.
    pub(crate) async fn items_changed_since(&self, generation: u64) {
        self.inner.items_changed.changed_since(generation).await;
    }

    /// Resources/prompts list_changed notifications received so far, from every server.
    pub(crate) fn items_generation(&self) -> u64 {
        self.inner.items_changed.generation()
    }

    /// The server's resources (every page, up to [`MAX_ITEM_PAGES`] and
    /// [`MAX_ITEMS`]); empty when it offers none.
    pub async fn list_resources(&self, server: &str, timeout: Duration) -> Result<Vec<Resource>, McpError> {
        let offered = |c: &ServerCapabilities| c.resources.is_some();
        self.request(server, "resources/list", timeout, offered, Vec::new, |peer| {
            all_pages(async move |params| {
                peer.list_resources(Some(params)).await.map(|page| (page.resources, page.next_cursor))
            })
        })
        .await
    }

    /// The server's resource templates (bounded as [`Self::list_resources`]).
    pub async fn list_resource_templates(
        &self,
        server: &str,
        timeout: Duration,
    ) -> Result<Vec<ResourceTemplate>, McpError> {
        let offered = |c: &ServerCapabilities| c.resources.is_some();
        self.request(server, "resources/templates/list", timeout, offered, Vec::new, |peer| {
            all_pages(async move |params| {
                peer.list_resource_templates(Some(params)).await.map(|page| (page.resource_templates, page.next_cursor))
            })
        })
        .await
    }

    /// `completion/complete` on `server`, `params` naming the server's own prompt or resource
    /// template; no values when the server offers no completions. At most the spec's 100 values
    /// are passed on, whatever the server sends.
    pub async fn complete(
        &self,
        server: &str,
        params: CompleteRequestParams,
        timeout: Duration,
    ) -> Result<CompletionInfo, McpError> {
        let offered = |c: &ServerCapabilities| c.completions.is_some();
        let mut completion = self
            .request(server, "completion/complete", timeout, offered, CompletionInfo::default, |peer| async move {
                peer.complete(params).await.map(|result| result.completion)
            })
            .await?;
        cap_completion(&mut completion);
        Ok(completion)
    }

    /// Sets `server`'s log level (`logging/setLevel`) when it offers logging; else nothing.
    #[allow(deprecated)] // logging is deprecated by SEP-2577, yet lives in 2025-11-25.
    pub async fn set_log_level(
        &self,
        server: &str,
        level: rmcp::model::LoggingLevel,
        timeout: Duration,
    ) -> Result<(), McpError> {
        let offered = |c: &ServerCapabilities| c.logging.is_some();
        self.request(
            server,
            "logging/setLevel",
            timeout,
            offered,
            || (),
            |peer| async move {
                // A 2026-07-28 server has no setLevel: each call asks for its own level.
                match peer.peer_info().is_some_and(|info| is_modern(&info.protocol_version)) {
                    true => Ok(()),
                    false => peer.set_level(rmcp::model::SetLevelRequestParams::new(level)).await,
                }
            },
        )
        .await
    }

    /// Subscribes to (or unsubscribes from) `server`'s resource `uri`; an error when the server
    /// offers no subscriptions.
    #[allow(deprecated)] // resources/subscribe is the 2025 revisions' (2026-07-28 listens).
    pub async fn subscribe_resource(
        &self,
        server: &str,
        uri: &str,
        subscribe: bool,
        timeout: Duration,
    ) -> Result<(), McpError> {
        let offered = |c: &ServerCapabilities| c.resources.as_ref().is_some_and(|r| r.subscribe == Some(true));
        let what = if subscribe { "resources/subscribe" } else { "resources/unsubscribe" };
        let slot = self.slot(server)?;
        let live = tokio::time::timeout(timeout, Slot::session(&slot, &self.inner)).await.map_err(|_| {
            McpError::new(ErrorCode::McpTimeout, format!("{what} on '{server}': the server did not start"))
        })??;
        if is_modern(&live.conn.protocol) {
            return self.listen_to_resource(&live, server, uri, subscribe, timeout).await;
        }
        let uri = uri.to_string();
        let done = self
            .request(
                server,
                what,
                timeout,
                offered,
                || false,
                |peer| async move {
                    if subscribe {
                        peer.subscribe(rmcp::model::SubscribeRequestParams::new(uri)).await
                    } else {
                        peer.unsubscribe(rmcp::model::UnsubscribeRequestParams::new(uri)).await
                    }
                    .map(|()| true)
                },
            )
            .await?;
        if done {
            Ok(())
        } else {
            Err(McpError::new(ErrorCode::McpInvalidArguments, format!("'{server}' offers no resource subscriptions")))
        }
    }

    /// [`Self::subscribe_resource`] on a 2026-07-28 session, which has no `resources/subscribe`:
    /// a `subscriptions/listen` for the one URI, held until unsubscribed or the session ends,
    /// whose updates join every other server's.
    async fn listen_to_resource(
        &self,
        live: &Live,
        server: &str,
        uri: &str,
        subscribe: bool,
        timeout: Duration,
    ) -> Result<(), McpError> {
        if !subscribe {
            live.conn.resource_listens.lock().remove(uri);
            return Ok(());
        }
        let mut filter = rmcp::model::SubscriptionFilter::new();
        filter.resource_subscriptions = Some(vec![uri.to_string()]);
        let peer = live.conn.service.peer();
        let listened = tokio::time::timeout(timeout, peer.listen(filter)).await.map_err(|_| {
            McpError::new(ErrorCode::McpTimeout, format!("subscriptions/listen on '{server}' was not acknowledged"))
        })?;
        let mut subscription = listened.map_err(|e| {
            McpError::new(ErrorCode::McpUnavailable, format!("'{server}' refused to listen to '{uri}': {e}"))
        })?;
        let (ended, updates, server_id) =
            (CancellationToken::new(), self.inner.resource_updates.clone(), Arc::<str>::from(server));
        let until = ended.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = until.cancelled() => return,
                    next = subscription.next() => next,
                };
                match next {
                    Ok(Some(rmcp::model::ServerNotification::ResourceUpdatedNotification(updated))) => {
                        let _ = updates.send((server_id.clone(), updated.params.uri));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return,
                }
            }
        });
        live.conn.resource_listens.lock().insert(uri.to_string(), ended.drop_guard());
        Ok(())
    }

    /// `notifications/resources/updated` from every server, as (server id, the server's URI).
    pub(crate) fn resource_updates(&self) -> tokio::sync::broadcast::Receiver<(Arc<str>, String)> {
        self.inner.resource_updates.subscribe()
    }

    /// The capabilities `server` declared, when its session is up (without waiting for it).
    pub fn server_capabilities(&self, server: &str) -> Option<ServerCapabilities> {
        let slot = self.slot(server).ok()?;
        let live = slot.session.try_lock().ok().and_then(|s| s.clone())?;
        live.conn.service.peer().peer_info().map(|info| info.capabilities.clone())
    }

    /// The server's prompts (bounded as [`Self::list_resources`]).
    pub async fn list_prompts(&self, server: &str, timeout: Duration) -> Result<Vec<Prompt>, McpError> {
        let offered = |c: &ServerCapabilities| c.prompts.is_some();
        self.request(server, "prompts/list", timeout, offered, Vec::new, |peer| {
            all_pages(async move |params| {
                peer.list_prompts(Some(params)).await.map(|page| (page.prompts, page.next_cursor))
            })
        })
        .await
    }

    /// Reads `uri` on `server` within `timeout`, its contents cut to `max_output_bytes` (with
    /// a marker content saying so).
    pub async fn read_resource(
        &self,
        server: &str,
        uri: &str,
        timeout: Duration,
        max_output_bytes: usize,
    ) -> Result<ItemRead<ReadResourceResult>, McpError> {
        let offered = |c: &ServerCapabilities| c.resources.is_some();
        let none = || ReadResourceResult::new(Vec::new());
        let params = ReadResourceRequestParams::new(uri.to_string());
        let result = self.request(server, "resources/read", timeout, offered, none, |peer| async move {
            peer.read_resource(params).await
        });
        let json = serde_json::to_value(result.await?).map_err(unreadable)?;
        let uri = uri.to_string();
        let marker = |t: &Truncation| serde_json::json!({"uri": uri, "mimeType": "text/plain", "text": t.marker()});
        ItemRead::capped(json, "contents", "/text", max_output_bytes, marker)
    }

    /// Gets prompt `name` with `arguments` on `server` within `timeout`, its messages cut to
    /// `max_output_bytes` (with a marker message saying so).
    pub async fn get_prompt(
        &self,
        server: &str,
        name: &str,
        arguments: Option<Map<String, Value>>,
        limits: (Duration, usize),
        input: Option<&Continuation>,
    ) -> Result<ItemRead<GetPromptResult>, McpError> {
        let (timeout, max_output_bytes) = limits;
        let offered = |c: &ServerCapabilities| c.prompts.is_some();
        let none = || GetPromptResponse::Complete(GetPromptResult::new(Vec::new()));
        let mut params = GetPromptRequestParams::new(name.to_string());
        params.arguments = arguments;
        if let Some(continuation) = input {
            params.input_responses = continuation.input_responses.clone();
            params.request_state = continuation.request_state.clone();
        }
        // One round, as for calls: the server's request for input goes to a caller that can
        // answer it, or ends the get.
        let caller = input.and_then(|c| c.client_capabilities.clone());
        let result = self.request(server, "prompts/get", timeout, offered, none, |peer| async move {
            let per_request = peer
                .peer_info()
                .is_some_and(|info| info.protocol_version.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
            match caller.filter(|_| per_request) {
                Some(capabilities) => {
                    let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
                    match send_as_caller(&peer, request, &capabilities).await? {
                        ServerResult::GetPromptResult(result) => Ok(GetPromptResponse::Complete(result)),
                        ServerResult::InputRequiredResult(asked) => Ok(GetPromptResponse::InputRequired(asked)),
                        _ => Err(ServiceError::UnexpectedResponse),
                    }
                }
                None => peer.get_prompt_once(params).await,
            }
        });
        let result = match result.await? {
            GetPromptResponse::InputRequired(asked) if input.is_some() => {
                let result = GetPromptResult::new(Vec::new());
                return Ok(ItemRead { result, bytes: 0, truncated: None, input_required: Some(Arc::new(asked)) });
            }
            GetPromptResponse::InputRequired(asked) => return Err(input_required(server, name, &asked)),
            GetPromptResponse::Complete(result) => result,
            _ => {
                let what = "an answer to prompts/get that is neither a prompt nor a request for input";
                return Err(McpError::new(ErrorCode::McpUnavailable, format!("unreadable server answer: {what}")));
            }
        };
        let json = serde_json::to_value(result).map_err(unreadable)?;
        let marker =
            |t: &Truncation| serde_json::json!({"role": "user", "content": {"type": "text", "text": t.marker()}});
        ItemRead::capped(json, "messages", "/content/text", max_output_bytes, marker)
    }

    /// Closes every session and reaps every child. The pool refuses calls afterwards.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.calls.close();
        let slots: Vec<Arc<Slot>> = self.inner.slots.write().drain().map(|(_, s)| s).collect();
        futures::future::join_all(slots.iter().map(|s| s.close())).await;
    }
}

pub(crate) fn cap_result(
    result: CallToolResult,
    max_output_bytes: usize,
    latency: Duration,
) -> Result<ToolOutput, McpError> {
    // The common case (text only, well under the cap) is decided without serializing anything.
    let text_only: Option<usize> = result
        .content
        .iter()
        .map(|c| c.as_text().map(|t| t.text.len()))
        .sum::<Option<usize>>()
        .filter(|_| result.structured_content.is_none());
    if let Some(bytes) = text_only.filter(|size| *size <= max_output_bytes) {
        return Ok(ToolOutput { result, truncated: None, bytes, latency, input_required: None });
    }
    let mut json = serde_json::to_value(&result)
        .map_err(|e| McpError::new(ErrorCode::McpUnavailable, format!("unreadable tool result: {e}")))?;
    let bytes = output::result_size(&json);
    let Some(truncated) = output::cap(&mut json, max_output_bytes) else {
        return Ok(ToolOutput { result, truncated: None, bytes, latency, input_required: None });
    };
    let result = serde_json::from_value(json)
        .map_err(|e| McpError::new(ErrorCode::McpUnavailable, format!("unreadable tool result: {e}")))?;
    Ok(ToolOutput { result, truncated: Some(truncated), bytes, latency, input_required: None })
}

/// Longest piece of a server's elicitation message quoted in an error (it is the server's text,
/// reaching a model as tool output: bounded, and marked as the server's).
const MAX_ASKED_QUOTE: usize = 200;

/// The error of a call whose server asked for input (2026-07-28 `InputRequiredResult`): the agent
/// has no human to ask and offers no sampling, so the call ends here, naming what was asked,
/// instead of hanging or retrying.
pub(crate) fn input_required(server: &str, tool: &str, asked: &InputRequiredResult) -> McpError {
    let mut what: Vec<String> = Vec::new();
    for request in asked.input_requests.iter().flat_map(|requests| requests.values()) {
        what.push(match request {
            InputRequest::Elicitation(elicit) => {
                let message = serde_json::to_value(&elicit.params)
                    .ok()
                    .and_then(|p| p.get("message").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_default();
                let quoted: String = message.chars().take(MAX_ASKED_QUOTE).collect();
                format!("user input (elicitation; the server says: {quoted:?})")
            }
            InputRequest::CreateMessage(_) => "a model completion (sampling)".to_string(),
            InputRequest::ListRoots(_) => "the client's roots".to_string(),
            _ => "input of a kind this agent does not know".to_string(),
        });
    }
    if what.is_empty() {
        what.push("another round with its request state".to_string());
    }
    McpError::new(
        ErrorCode::McpApprovalRequired,
        format!(
            "'{tool}' on '{server}' asks for {}, which this agent cannot provide without a person; \
             the call was not completed",
            what.join(", ")
        ),
    )
}

async fn reap_idle(inner: &Inner, idle: Duration) {
    let slots: Vec<Arc<Slot>> = inner.slots.read().values().cloned().collect();
    for slot in slots {
        let Ok(mut session) = slot.session.try_lock() else { continue };
        let idle_for = session.as_ref().map(|live| live.last_used.lock().elapsed());
        // Only sessions nobody is using: every concurrency permit is free.
        let unused = slot.concurrency.available_permits() == slot.config.budgets.max_concurrency() as usize;
        if idle_for.is_some_and(|d| d >= idle)
            && unused
            && let Some(live) = session.take()
        {
            tracing::info!(server_id = %slot.config.id, "closing idle session");
            live.conn.close().await;
        }
    }
}

/// How long a server's detected protocol revision is trusted: a server redeployed with another
/// revision is re-detected at its next start after this (or at once if a start fails).
const REVISION_TTL: Duration = Duration::from_secs(600);

/// The lifecycle of a start: speak the revision last seen directly, else probe (`server/discover`,
/// falling back to `initialize`).
fn lifecycle_for(known: Option<&(Instant, rmcp::model::ProtocolVersion)>) -> rmcp::ClientLifecycleMode {
    match known {
        Some((_, version)) if version.as_str() >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str() => {
            rmcp::ClientLifecycleMode::Discover { preferred_versions: vec![version.clone()] }
        }
        Some(_) => rmcp::ClientLifecycleMode::Initialize,
        None => connect::probe_lifecycle(),
    }
}

// === impl Slot ===

impl Slot {
    /// The validator of the outputSchema the server's last tool list gives `tool`, if it gives
    /// one (without waiting for the list: a list being fetched right now counts as none). Each
    /// listed schema is compiled once; a schema that does not compile is `Err` (logged once),
    /// and results of that tool pass unchecked (`output_schema.rs`).
    fn output_validator(&self, tool: &str) -> Option<Arc<Result<jsonschema::Validator, String>>> {
        let schema = {
            let cache = self.tools.try_lock().ok()?;
            let Some((_, _, Ok(tools), _)) = cache.entry.as_ref() else { return None };
            tools.iter().find(|t| t.name == tool)?.output_schema.clone()?
        };
        let mut validators = self.validators.lock();
        if let Some((listed, validator)) = validators.get(tool)
            && Arc::ptr_eq(listed, &schema)
        {
            return Some(validator.clone());
        }
        let validator = Arc::new(super::output_schema::compile(&schema));
        if let Err(why) = validator.as_ref() {
            tracing::warn!(server_id = %self.config.id, tool, error = %why, "outputSchema cannot be checked");
        }
        // One entry per tool of the list: a tool that left the list leaves with the next list.
        validators.retain(|_, (listed, _)| Arc::strong_count(listed) > 1);
        validators.insert(tool.to_string(), (schema, validator.clone()));
        Some(validator)
    }

    fn new(config: ServerConfig) -> Self {
        let permits = config.budgets.max_concurrency().max(1) as usize;
        Slot {
            concurrency: Arc::new(Semaphore::new(permits)),
            config,
            session: Arc::new(tokio::sync::Mutex::new(None)),
            health: Arc::new(Mutex::new(Health::default())),
            env_missing: Mutex::new(None),
            refused: Mutex::new(None),
            list_cut: Mutex::new(None),
            list_changed: Arc::new(ListChanged::default()),
            tools: tokio::sync::Mutex::new(ToolsCache::default()),
            validators: Mutex::new(HashMap::new()),
            startup: Arc::new(Mutex::new(None)),
            start_failure: Arc::new(Mutex::new(None)),
            revision: Arc::new(Mutex::new(None)),
            start_ended: Arc::new(ListChanged::default()),
            tokens: Arc::new(Mutex::new(None)),
        }
    }

    /// The token source for `endpoint`'s auth, reused while its config is unchanged.
    fn token_source(&self, endpoint: &super::config::Endpoint, metrics: &PoolMetrics) -> Option<Arc<TokenSource>> {
        let super::config::Endpoint::Http { url, auth: Some(auth), .. } = endpoint else { return None };
        let mut tokens = self.tokens.lock();
        if let Some(source) = tokens.as_ref().filter(|s| s.auth() == auth) {
            return Some(source.clone());
        }
        let source = Arc::new(TokenSource::new(self.config.id.clone(), url.clone(), auth.clone(), metrics.clone()));
        *tokens = Some(source.clone());
        Some(source)
    }

    /// Same connection, new budgets: the session, a start in progress, health and list
    /// notifications carry over (shared).
    fn with_session_of(config: ServerConfig, old: &Slot) -> Self {
        let mut slot = Slot::new(config);
        slot.session = old.session.clone();
        slot.startup = old.startup.clone();
        slot.start_failure = old.start_failure.clone();
        slot.revision = old.revision.clone();
        slot.health = old.health.clone();
        slot.list_changed = old.list_changed.clone();
        slot.start_ended = old.start_ended.clone();
        slot.tokens = old.tokens.clone();
        slot
    }

    /// The live session; else the start in progress, joined; else a new start. Waiting is
    /// bounded by the caller (its own timeout); the start goes on without it.
    async fn session(slot: &Arc<Slot>, inner: &Arc<Inner>) -> Result<Arc<Live>, McpError> {
        let done = {
            let mut current = slot.session.lock().await;
            if let Some(live) = current.as_ref() {
                if !live.conn.is_closed() {
                    return Ok(live.clone());
                }
                slot.health.lock().down("the session ended (server exited or closed the connection)");
                if let Some(old) = current.take() {
                    old.conn.close().await;
                }
            }
            let running = slot.startup.lock().as_ref().map(|s| s.done.clone());
            match running {
                Some(done) => done,
                None => Slot::begin_startup(slot, inner)?,
            }
        };
        done.await
    }

    /// Starts the server in a task of its own (call with the `session` lock held and no start
    /// in progress): resolve its environment, take a child slot, then spawn or connect,
    /// `initialize` and list within `budgets.startupTimeoutMs`.
    fn begin_startup(
        slot: &Arc<Slot>,
        inner: &Arc<Inner>,
    ) -> Result<Shared<BoxFuture<'static, StartResult>>, McpError> {
        let endpoint = match slot.config.resolve(|name| (inner.env)(name)) {
            Ok(endpoint) => {
                *slot.env_missing.lock() = None;
                endpoint
            }
            Err(missing) => {
                let message = missing.to_string();
                *slot.env_missing.lock() = Some(missing.name);
                slot.health.lock().down(&message);
                return Err(McpError { retryable: false, ..McpError::new(ErrorCode::McpUnavailable, message) });
            }
        };
        let child_permit = match &endpoint {
            super::config::Endpoint::Stdio { .. } => {
                Some(inner.children.clone().try_acquire_owned().map_err(|_| {
                    McpError::new(
                        ErrorCode::McpUnavailable,
                        format!("the agent already runs {} stdio servers (its cap)", inner.options.max_children),
                    )
                })?)
            }
            _ => None,
        };
        let budget = Duration::from_millis(u64::from(slot.config.budgets.startup_timeout_ms()));
        let facts = Starting { what: endpoint.kind(), since: std::time::SystemTime::now(), budget };
        let frame_limit = limits::frame_limit(slot.config.budgets.max_tool_output_bytes(), inner.options.frame_limit);
        let lifecycle = lifecycle_for(slot.revision.lock().as_ref().filter(|(at, _)| at.elapsed() < REVISION_TTL));
        let tokens = slot.token_source(&endpoint, &inner.options.metrics);
        let (owner, pool) = (slot.clone(), inner.clone());
        let task = tokio::spawn(
            async move {
                let started = Instant::now();
                let list_limits = pool.options.list_limits;
                let start = async {
                    let watchers = connect::Watchers {
                        tools: owner.list_changed.clone(),
                        items: pool.items_changed.clone(),
                        resource_updates: pool.resource_updates.clone(),
                    };
                    let conn = connect::connect(
                        &owner.config.id,
                        &endpoint,
                        watchers,
                        frame_limit,
                        budget,
                        lifecycle,
                        tokens.as_ref(),
                    )
                    .await?;
                    let left = budget.saturating_sub(started.elapsed());
                    let first =
                        tokio::time::timeout(left, conn.list_tools_capped(&list_limits)).await.map_err(|_| {
                            McpError::new(
                                ErrorCode::McpTimeout,
                                format!("no tool list within the startup budget of {} ms", budget.as_millis()),
                            )
                        })?;
                    Ok(Arc::new(Live {
                        conn,
                        _child_permit: child_permit,
                        last_used: Mutex::new(Instant::now()),
                        first_list: Mutex::new(Some(first)),
                    }))
                };
                let result: StartResult = start.await;
                owner.finish_startup(&pool, result).await
            }
            .instrument(tracing::info_span!("mcp_startup", server_id = %slot.config.id)),
        );
        let abort = task.abort_handle();
        let done = async move {
            task.await
                .unwrap_or_else(|_| Err(McpError::new(ErrorCode::McpUnavailable, "the server's start was cancelled")))
        }
        .boxed()
        .shared();
        *slot.startup.lock() = Some(Startup { facts, done: done.clone(), task: abort });
        slot.start_failure.lock().take();
        Ok(done)
    }

    /// Records how a start ended, and tells listeners: the agent lists a server again when its
    /// start ends, either way.
    async fn finish_startup(&self, inner: &Inner, result: StartResult) -> StartResult {
        let mut current = self.session.lock().await;
        self.startup.lock().take();
        match &result {
            Ok(live) => {
                tracing::info!(server_id = %self.config.id, pid = ?live.conn.pid(), server = ?live.conn.info.name, protocol = %live.conn.protocol, "session established");
                *self.revision.lock() = Some((Instant::now(), live.conn.protocol.clone()));
                self.health.lock().connected();
                self.refused.lock().take();
                inner.options.metrics.connected(&self.config.id);
                *current = Some(live.clone());
            }
            Err(e) => {
                tracing::warn!(server_id = %self.config.id, error = %e, "session failed");
                self.health.lock().down(&e.message);
                // Every start error is retryable but the ones only a configuration change ends.
                *self.refused.lock() = (!e.retryable).then(|| e.message.clone());
                *self.start_failure.lock() = Some(e.clone());
                // Perhaps the server was redeployed speaking another revision: probe next time.
                self.revision.lock().take();
            }
        }
        drop(current);
        self.start_ended.bump();
        result
    }

    /// The start in progress, if any.
    fn starting(&self) -> Option<Starting> {
        self.startup.lock().as_ref().map(|s| s.facts.clone())
    }

    /// Closes `live` if it is still the current session.
    async fn discard(&self, live: &Arc<Live>) {
        let mut current = self.session.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, live)) {
            current.take();
        }
        drop(current);
        live.conn.close().await;
    }

    /// Maps a failed call, restarting the session when it is broken.
    async fn failed(&self, live: &Arc<Live>, error: ServiceError) -> McpError {
        use std::sync::atomic::Ordering;
        match error {
            ServiceError::McpError(data) => {
                // The server answered with a JSON-RPC error: the session is fine.
                self.health.lock().call_ok(Duration::ZERO);
                let code = if data.code == RpcCode::INVALID_PARAMS || data.code == RpcCode::METHOD_NOT_FOUND {
                    ErrorCode::McpInvalidArguments
                } else {
                    ErrorCode::McpUnavailable
                };
                let refused_by_server = super::error::ServerRefusal::of(data.code.0, data.data.as_ref());
                McpError { code, message: data.message.to_string(), retryable: false, refused_by_server }
            }
            ServiceError::Timeout { timeout } => {
                McpError::new(ErrorCode::McpTimeout, format!("no answer within {} ms", timeout.as_millis()))
            }
            other => {
                let oversized = live.conn.oversized.load(Ordering::Relaxed);
                self.discard(live).await;
                if oversized {
                    self.health.lock().down("a reply exceeded the frame limit");
                    McpError::new(
                        ErrorCode::McpOutputTooLarge,
                        "the reply exceeded the transport's frame limit and was dropped; the session was restarted",
                    )
                } else {
                    let message = format!("the session broke: {other}");
                    self.health.lock().down(&message);
                    McpError::new(ErrorCode::McpUnavailable, message)
                }
            }
        }
    }

    /// One tools/list: the start's own list when this is the first after it, else a fresh one
    /// within the server's `toolTimeoutMs`. Waits at most `startup_wait` for a start.
    async fn fetch_tools(slot: &Arc<Slot>, inner: &Arc<Inner>) -> Result<(Arc<Vec<Tool>>, Option<u64>), McpError> {
        if let Some(failure) = slot.start_failure.lock().take() {
            return Err(failure);
        }
        let live = match tokio::time::timeout(inner.options.startup_wait, Slot::session(slot, inner)).await {
            Ok(live) => {
                // This listing reports the start's outcome itself.
                slot.start_failure.lock().take();
                live?
            }
            Err(_) => {
                let state = slot
                    .starting()
                    .map_or_else(|| "starting".to_string(), |s| s.describe(std::time::SystemTime::now()));
                return Err(McpError::new(ErrorCode::McpUnavailable, state));
            }
        };
        let first = live.first_list.lock().take();
        let listed = match first {
            Some(listed) => Ok(listed),
            None => {
                let timeout = Duration::from_millis(u64::from(slot.config.budgets.tool_timeout_ms()));
                tokio::time::timeout(timeout, live.conn.list_tools_capped(&inner.options.list_limits)).await
            }
        };
        match listed {
            Ok(Ok((tools, cut, ttl_ms))) => {
                if !cut.is_empty() {
                    tracing::warn!(server_id = %slot.config.id, cut = %cut, "the tool list was cut to the agent's caps");
                }
                *slot.list_cut.lock() = (!cut.is_empty()).then_some(cut);
                Ok((Arc::new(tools), ttl_ms))
            }
            Ok(Err(e)) => Err(slot.failed(&live, e).await),
            Err(_) => Err(McpError::new(ErrorCode::McpTimeout, "tools/list did not answer in time")),
        }
    }

    async fn close(&self) {
        let startup = self.startup.lock().take();
        if let Some(startup) = startup {
            // Dropping the start stops the child's process group (connect's guard).
            startup.task.abort();
        }
        let live = self.session.lock().await.take();
        if let Some(live) = live {
            live.conn.close().await;
        }
        self.concurrency.close();
    }
}

/// At most the spec's 100 completion values, whatever a server sends; more is said by `hasMore`.
fn cap_completion(completion: &mut CompletionInfo) {
    if completion.values.len() > CompletionInfo::MAX_VALUES {
        completion.values.truncate(CompletionInfo::MAX_VALUES);
        completion.has_more = Some(true);
    }
}

/// Sends `request` with `capabilities` as its `clientCapabilities` (2026-07-28 per-request
/// `_meta`; rmcp would send the pool's own), and tells the server when the answer is no longer
/// awaited (the caller went away, the budget ran out), as rmcp's own `*_once` calls do.
async fn send_as_caller(
    peer: &rmcp::service::Peer<rmcp::RoleClient>,
    request: ClientRequest,
    capabilities: &ClientCapabilities,
) -> Result<ServerResult, ServiceError> {
    send_call(peer, request, Some(caller_meta(capabilities)), None).await
}

/// The `_meta` that declares a caller's `capabilities` to a 2026-07-28 server.
fn caller_meta(capabilities: &ClientCapabilities) -> RequestMetaObject {
    let mut meta = RequestMetaObject::new();
    meta.set_client_capabilities(capabilities.clone());
    meta
}

/// Whether a session speaks 2026-07-28 or later (per-request capabilities and log levels).
fn is_modern(protocol: &ProtocolVersion) -> bool {
    protocol.as_str() >= ProtocolVersion::V_2026_07_28.as_str()
}

/// Sends `request` (with `meta` added to its `_meta`: a caller's capabilities, a log level) and
/// waits for its answer; a request abandoned before it (the caller's budget ran out) is
/// cancelled at the server. With `in_flight`, the request is one of the session's calls for as
/// long as it runs, so what the server sends meanwhile reaches the call's relay (see `relay`).
async fn send_call(
    peer: &rmcp::service::Peer<rmcp::RoleClient>,
    request: ClientRequest,
    meta: Option<RequestMetaObject>,
    in_flight: Option<(&Arc<InFlight>, Option<&Relay>)>,
) -> Result<ServerResult, ServiceError> {
    let mut options = PeerRequestOptions::no_options();
    options.meta = meta;
    let handle = peer.send_request_with_option(request, options).await?;
    let _call = in_flight.map(|(calls, relay)| match relay {
        Some(relay) => calls.enter(handle.id.clone(), handle.progress_token.clone(), relay.clone()),
        None => calls.enter_unrelayed(),
    });
    let relays = in_flight.is_some_and(|(_, relay)| relay.is_some());
    let mut abandoned = CancelWhenAbandoned { peer: peer.clone(), id: Some(handle.id.clone()) };
    let result = handle.await_response().await;
    abandoned.id = None;
    if relays {
        // rmcp handles each notification in a task of its own: give those the server sent just
        // before its answer a turn to reach the relay before the call leaves the session.
        tokio::task::yield_now().await;
    }
    result
}

/// Sends `notifications/cancelled` for the request `id` when dropped while still set.
struct CancelWhenAbandoned {
    peer: rmcp::service::Peer<rmcp::RoleClient>,
    id: Option<rmcp::model::RequestId>,
}

impl Drop for CancelWhenAbandoned {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let reason = Some("request abandoned by the caller".to_string());
            // The session may be gone already; nothing is waiting for this either way.
            let _ = peer.notify_cancelled(CancelledNotificationParam::new(Some(id), reason)).await;
        });
    }
}

/// The listed tool's fields beyond name, description and input schema that `/mcp` passes on
/// ([`ToolInfo::metadata`]); the tool's own `_meta` stays here (it is the server's business with
/// its direct clients, not the agent's callers').
fn tool_metadata(tool: &rmcp::model::Tool) -> Option<Arc<serde_json::Map<String, Value>>> {
    let mut metadata = serde_json::Map::new();
    if let Some(title) = &tool.title {
        metadata.insert("title".into(), title.clone().into());
    }
    if let Some(schema) = &tool.output_schema {
        metadata.insert("outputSchema".into(), Value::Object((**schema).clone()));
    }
    if let Some(annotations) = tool.annotations.as_ref().and_then(|a| serde_json::to_value(a).ok()) {
        metadata.insert("annotations".into(), annotations);
    }
    if let Some(icons) = tool.icons.as_ref().and_then(|i| serde_json::to_value(i).ok()) {
        metadata.insert("icons".into(), icons);
    }
    (!metadata.is_empty()).then(|| Arc::new(metadata))
}

#[cfg(test)]
mod tests {
    use rmcp::ClientLifecycleMode;
    use rmcp::model::ProtocolVersion;

    use super::*;

    /// A server answering ten thousand completions gets the spec's hundred through.
    #[test]
    fn a_flood_of_completion_values_is_cut_to_the_specs_limit() {
        let mut completion = CompletionInfo::default();
        completion.values = (0..10_000).map(|i| i.to_string()).collect();
        cap_completion(&mut completion);
        assert_eq!((completion.values.len(), completion.has_more), (CompletionInfo::MAX_VALUES, Some(true)));
    }

    /// What `/mcp` passes on of a listed tool: title, annotations, outputSchema and icons, never
    /// the tool's own `_meta` (the server's business with its direct clients).
    #[test]
    fn a_tools_metadata_is_passed_on_without_its_meta() {
        let tool: Tool = serde_json::from_value(serde_json::json!({
            "name": "t", "inputSchema": {"type": "object"}, "title": "T",
            "annotations": {"readOnlyHint": true}, "outputSchema": {"type": "object"},
            "_meta": {"internal": "do not relay"}
        }))
        .expect("a tool");
        let metadata = tool_metadata(&tool).expect("metadata");
        let keys: Vec<&str> = metadata.keys().map(String::as_str).collect();
        assert_eq!(keys, ["annotations", "outputSchema", "title"], "{metadata:?}");
        let plain: Tool = serde_json::from_value(serde_json::json!({"name": "p", "inputSchema": {"type": "object"}}))
            .expect("a tool");
        assert_eq!(tool_metadata(&plain), None);
    }

    #[test]
    fn a_start_speaks_the_revision_last_seen_and_probes_when_it_does_not_know() {
        let now = Instant::now();
        assert!(matches!(lifecycle_for(None), ClientLifecycleMode::Auto { .. }));
        assert_eq!(lifecycle_for(Some(&(now, ProtocolVersion::V_2025_11_25))), ClientLifecycleMode::Initialize);
        assert_eq!(
            lifecycle_for(Some(&(now, ProtocolVersion::V_2026_07_28))),
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] }
        );
    }

    #[test]
    fn a_servers_list_ttl_is_honoured_within_bounds() {
        let default = Duration::from_secs(60);
        assert_eq!(list_ttl(None, default), default, "no ttlMs (a 2025-era server): the pool's TTL");
        assert_eq!(list_ttl(Some(30_000), default), Duration::from_secs(30));
        assert_eq!(list_ttl(Some(0), default), MIN_SERVER_LIST_TTL, "0 is not a re-list on every round");
        assert_eq!(list_ttl(Some(u64::MAX), default), MAX_SERVER_LIST_TTL);
    }

    /// The attack: a server that pages forever, or sends pages of thousands of items.
    #[tokio::test]
    async fn listings_stop_at_the_page_and_item_caps() {
        let pages = std::sync::atomic::AtomicUsize::new(0);
        let endless = all_pages(async |_params| {
            pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok((vec![0u8; 3], Some("more".to_string())))
        });
        assert_eq!(endless.await.expect("pages").len(), 3 * MAX_ITEM_PAGES);
        assert_eq!(pages.load(std::sync::atomic::Ordering::Relaxed), MAX_ITEM_PAGES);
        let huge = all_pages(async |_params| Ok((vec![0u8; MAX_ITEMS + 5], Some("more".to_string()))));
        assert_eq!(huge.await.expect("pages").len(), MAX_ITEMS, "one page past the cap is cut to it");
        let cursors = Mutex::new(Vec::new());
        let two = all_pages(async |params: PaginatedRequestParams| {
            let mut seen = cursors.lock();
            seen.push(params.cursor.clone());
            Ok((vec![1u8], (seen.len() < 2).then(|| "page-2".to_string())))
        });
        assert_eq!(two.await.expect("pages"), [1, 1]);
        assert_eq!(*cursors.lock(), [None, Some("page-2".to_string())], "the next cursor is passed on");
    }
}
