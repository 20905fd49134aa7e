//! Establishing one MCP client session (rmcp) over one transport. Thin I/O.
//!
//! ```text
//! Endpoint::Stdio  ── spawn argv (no shell), env as configured ──▶ child stdout ─FrameGuard─┐
//!                     child stderr ──lines──▶ tracing (server_id)      child stdin ─────────┤
//! Endpoint::Socket ── UnixStream (the bridge sidecar) ── read half ─FrameGuard, write half ─┤
//! Endpoint::Http   ── rmcp Streamable HTTP client (reqwest), headers, session re-init ──────┤
//!                                                                                          ▼
//!                     rmcp client service (lifecycle: server/discover probe, initialize
//!                     fallback; or the revision the pool remembers) ──▶ Connection
//! ```
//!
//! Revisions: rmcp's probe waits 10 s for `server/discover` and then sends `initialize` on the
//! same stream. A server still starting (`npx` downloading) answers the probe late and the start
//! fails with a response-id conflict; that server speaks 2026-07-28, so it is started again
//! speaking it (`late_discover`).
//!
//! The frame guard exists because rmcp drops an over-long line and keeps waiting, which would
//! leave the call pending until its timeout and report the wrong error. The guard ends the
//! stream instead, flags it, and the pool answers that call with `mcp_output_too_large` and
//! starts a fresh session for the next one.

#![allow(deprecated)] // sampling and logging are deprecated by SEP-2577, yet live in 2025-11-25.

use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
    ElicitResult, Implementation, LoggingMessageNotificationParam, ProgressNotificationParam, ProtocolVersion,
    ServerNotification, SubscriptionFilter,
};
use rmcp::service::{InboundStreamOrigin, NotificationContext, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::Command;
use tokio::sync::Notify;
use tracing::Instrument;

use super::config::Endpoint;
use super::error::{ErrorCode, McpError};
use super::limits::{ListCut, ListLimits};
use super::oauth;
use super::relay::{self, InFlight, Origin};
use super::token_source::TokenSource;
use crate::api::ServerInfo;
use crate::child::GroupGuard;
use crate::telemetry::otel;

/// Longest stderr line forwarded to the log; the rest is cut (a server dumping a huge line
/// must not flood the log pipeline).
const MAX_STDERR_LINE: usize = 4096;

// === FrameGuard ===

/// An `AsyncRead` that fails once a line (one JSON-RPC message) grows past `limit` bytes, and
/// records that it did.
pub(crate) struct FrameGuard<R> {
    inner: R,
    limit: usize,
    line: usize,
    tripped: Arc<AtomicBool>,
    /// Whether the current line's first non-blank byte was seen yet.
    classified: bool,
    /// Lines that did not start like JSON (`{` or `[`): a server printing to stdout.
    garbage: Arc<AtomicU64>,
    server_id: Arc<str>,
}

impl<R> FrameGuard<R> {
    /// Guards `inner`; `tripped` is set when a frame is too large.
    pub(crate) fn new(inner: R, limit: usize, tripped: Arc<AtomicBool>) -> Self {
        FrameGuard {
            inner,
            limit,
            line: 0,
            tripped,
            classified: false,
            garbage: Arc::new(AtomicU64::new(0)),
            server_id: Arc::from(""),
        }
    }

    /// Names the server in the warning about non-JSON lines, counted in `garbage`.
    pub(crate) fn reporting(mut self, server_id: Arc<str>, garbage: Arc<AtomicU64>) -> Self {
        self.server_id = server_id;
        self.garbage = garbage;
        self
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for FrameGuard<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.tripped.load(Ordering::Relaxed) {
            return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "frame too large")));
        }
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll {
            let mut line = self.line;
            let mut classified = self.classified;
            let mut garbage = 0;
            for &byte in &buf.filled()[before..] {
                if byte == b'\n' {
                    classified = false;
                } else if !classified && !byte.is_ascii_whitespace() {
                    classified = true;
                    garbage += u64::from(byte != b'{' && byte != b'[');
                }
                line = if byte == b'\n' { 0 } else { line + 1 };
                if line > self.limit {
                    self.tripped.store(true, Ordering::Relaxed);
                    // An error must come with no bytes read (AsyncRead's contract); the stream
                    // is over anyway, so this read's bytes are dropped with it.
                    buf.set_filled(before);
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("a message exceeded the {}-byte frame limit", self.limit),
                    )));
                }
            }
            self.line = line;
            self.classified = classified;
            if garbage > 0 {
                self.garbage.fetch_add(garbage, Ordering::Relaxed);
                // The content is not logged: it is the server's, and may be anything.
                tracing::warn!(
                    server_id = %self.server_id,
                    lines = garbage,
                    "server wrote output that is not JSON-RPC to stdout (ignored); MCP stdio servers must log to stderr"
                );
            }
        }
        poll
    }
}

// === client handler ===

/// Counts `notifications/tools/list_changed` from one server and wakes whoever waits.
#[derive(Debug, Default)]
pub(crate) struct ListChanged {
    generation: AtomicU64,
    notify: Notify,
}

impl ListChanged {
    /// Notifications received so far.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Waits until a notification arrives after `generation` was read (none is missed, even
    /// one that arrives before this is first polled).
    pub(crate) async fn changed_since(&self, generation: u64) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.generation() > generation {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.notify.notify_waiters();
    }
}

/// Where a session's list-change notifications are counted: its tools' (per server, so the
/// pool re-lists that server), and resources' and prompts' (one count for the whole pool, which
/// `/mcp` relays to its clients).
#[derive(Clone, Debug)]
pub(crate) struct Watchers {
    pub(crate) tools: Arc<ListChanged>,
    pub(crate) items: Arc<ListChanged>,
    /// `notifications/resources/updated`, pool-wide: (server id, the server's URI).
    pub(crate) resource_updates: tokio::sync::broadcast::Sender<(Arc<str>, String)>,
}

impl Default for Watchers {
    /// Watchers nobody reads (the operator's probe): a one-slot update channel.
    fn default() -> Self {
        Watchers {
            tools: Arc::default(),
            items: Arc::default(),
            resource_updates: tokio::sync::broadcast::Sender::new(1),
        }
    }
}

/// The pool's rmcp client handler: identifies the agent, records list_changed, and passes what
/// the server sends during a call to that call's relay (`relay.rs`).
#[derive(Clone, Debug)]
pub(crate) struct PoolHandler {
    server_id: Arc<str>,
    watchers: Watchers,
    calls: Arc<InFlight>,
}

/// Where a server's request came from: the call whose response stream carried it, if any.
fn origin(extensions: &rmcp::model::Extensions) -> Origin<'_> {
    match extensions.get::<InboundStreamOrigin>() {
        Some(InboundStreamOrigin::OutboundRequest(id)) => Origin::Request(id),
        _ => Origin::Unknown,
    }
}

impl ClientHandler for PoolHandler {
    fn get_info(&self) -> ClientConfig {
        // The version offered by `initialize`, the handshake of the revisions before 2026-07-28
        // (rmcp's default, its latest, has no handshake: a 2025 server would be offered a
        // revision it cannot know). `server/discover` offers its own `preferred_versions`.
        ClientConfig::new(relayed_capabilities(), Implementation::new("spear-mcp", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        if let Some(relay) = self.calls.by_progress_token(&params.progress_token) {
            relay.progress(params);
        }
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        match self.calls.attribute(origin(&context.extensions)) {
            Some(relay) => relay.log(params),
            // Not a call's (or not one that can be named): the agent's own log keeps it.
            None => tracing::debug!(server_id = %self.server_id, level = ?params.level, "server log message"),
        }
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        match self.calls.attribute(origin(&context.extensions)) {
            Some(relay) => relay.sample(params).await,
            None => Err(relay::sampling_refused(
                "no single call of this session can be named as the one asking, and the agent has no model of \
                 the server's choosing to offer",
            )),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        match self.calls.attribute(origin(&context.extensions)) {
            Some(relay) => relay.elicit(params).await,
            None => Ok(relay::declined()),
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "tools/list_changed");
        self.watchers.tools.bump();
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "resources/list_changed");
        self.watchers.items.bump();
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // No receiver (no /mcp session subscribed yet) is no error.
        let _ = self.watchers.resource_updates.send((self.server_id.clone(), params.uri));
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "prompts/list_changed");
        self.watchers.items.bump();
    }
}

/// The capabilities the pool declares to a 2025 server: sampling and (form) elicitation, which
/// it relays to the caller of the call that asks when that caller can answer (a `/mcp` client
/// that declared them), and declines otherwise (see `relay.rs`).
fn relayed_capabilities() -> ClientCapabilities {
    relay::answering(true, true)
}

// === Connection ===

/// One established session.
pub(crate) struct Connection {
    /// The rmcp client.
    pub(crate) service: RunningService<RoleClient, PoolHandler>,
    /// What the server said in `initialize` (or `server/discover`).
    pub(crate) info: ServerInfo,
    /// The protocol revision the session speaks.
    pub(crate) protocol: ProtocolVersion,
    /// Set when the server sent a message over the frame limit (the session is then over).
    pub(crate) oversized: Arc<AtomicBool>,
    /// Lines on the server's stdout that were not JSON-RPC (skipped, logged as warnings).
    pub(crate) garbage_lines: Arc<AtomicU64>,
    /// The calls in flight, to which the server's progress, logs and requests are relayed.
    pub(crate) calls: Arc<InFlight>,
    /// A 2026-07-28 server's resource subscriptions (`subscriptions/listen`), by URI; removing
    /// one ends its listen.
    pub(crate) resource_listens: parking_lot::Mutex<HashMap<String, tokio_util::sync::DropGuard>>,
    /// The child's process group (stdio in local mode); dropping the connection stops it.
    child: parking_lot::Mutex<Option<GroupGuard>>,
    pid: Option<u32>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("info", &self.info).field("pid", &self.pid()).finish()
    }
}

impl Connection {
    /// The child's pid (stdio in local mode).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Whether the session is over (transport closed, child gone).
    pub(crate) fn is_closed(&self) -> bool {
        self.service.is_closed()
    }

    /// Ends the session: stops the service (its stdin closes), then stops the child's process
    /// group, SIGTERM first and SIGKILL after [`crate::child::TERM_GRACE`], and reaps it. Calls
    /// in flight on it fail with a closed transport.
    pub(crate) async fn close(&self) {
        self.service.cancellation_token().cancel();
        let child = self.child.lock().take();
        if let Some(child) = child {
            child.terminate().await;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The child's guard stops its group in the background.
        self.service.cancellation_token().cancel();
    }
}

fn unavailable(message: impl Into<String>) -> McpError {
    McpError::new(ErrorCode::McpUnavailable, message)
}

/// Establishes a session with the server at `endpoint`, within `timeout` (spawn, connect and
/// the lifecycle's handshake together: `server/discover` for 2026-07-28 and later, `initialize`
/// before, or a discover probe falling back to `initialize`).
pub(crate) async fn connect(
    server_id: &Arc<str>,
    endpoint: &Endpoint,
    watchers: Watchers,
    frame_limit: usize,
    timeout: Duration,
    lifecycle: ClientLifecycleMode,
    auth: Option<&Arc<TokenSource>>,
) -> Result<Connection, McpError> {
    let http = HttpParts { client: None, auth: auth.cloned(), challenge: None };
    connect_with(server_id, endpoint, watchers, frame_limit, timeout, lifecycle, http).await
}

/// The lifecycle that speaks whichever revision a server speaks: a `server/discover` probe at
/// 2026-07-28, falling back to the `initialize` handshake, offering 2025-11-25, when it answers
/// as a legacy server (or not at all within rmcp's 10 s).
pub(crate) fn probe_lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    }
}

/// What a Streamable HTTP session uses besides its endpoint.
#[derive(Default)]
pub(crate) struct HttpParts {
    /// The client; `None`: rmcp's default one.
    pub(crate) client: Option<reqwest::Client>,
    /// The server's tokens (`http.auth`).
    pub(crate) auth: Option<Arc<TokenSource>>,
    /// Where to note the server's `WWW-Authenticate` challenge when it answers 401 and there is
    /// no `auth` (the operator's probe reports it).
    pub(crate) challenge: Option<ChallengeSlot>,
}

/// The last 401 challenge a server sent.
pub(crate) type ChallengeSlot = Arc<parking_lot::Mutex<Option<String>>>;

/// Why a session's authorization failed for good (an [`oauth::TokenError`] that is `lasting`,
/// or a 401 with no `http.auth`): a start that failed for it is not retryable.
type RefusalSlot = Arc<parking_lot::Mutex<Option<String>>>;

/// [`connect`], with `http_client` for a Streamable HTTP endpoint instead of rmcp's default one
/// (same-origin redirects, system proxy); the operator's prober brings its own.
pub(crate) async fn connect_with(
    server_id: &Arc<str>,
    endpoint: &Endpoint,
    watchers: Watchers,
    frame_limit: usize,
    timeout: Duration,
    lifecycle: ClientLifecycleMode,
    http: HttpParts,
) -> Result<Connection, McpError> {
    let HttpParts { client: http_client, auth, challenge } = http;
    let refusal = RefusalSlot::default();
    let handler_watchers = watchers.clone();
    let calls = Arc::new(InFlight::default());
    let handler = PoolHandler { server_id: server_id.clone(), watchers, calls: calls.clone() };
    let oversized = Arc::new(AtomicBool::new(false));
    let garbage = Arc::new(AtomicU64::new(0));
    // Set when rmcp's probe gave up on `server/discover` and the answer came after all (a server
    // slow to start, such as `npx` downloading): the server speaks 2026-07-28.
    let late_discover = AtomicBool::new(false);
    // Set when the server answered `server/discover` with a result that is not a discover
    // result (some 2025 servers answer any method they do not know with `{}`): rmcp's probe
    // takes that as fatal, but the server may well know `initialize`.
    let odd_discover = AtomicBool::new(false);
    let init_failed = |e: rmcp::service::ClientInitializeError| {
        use rmcp::service::ClientInitializeError as Failed;
        match &e {
            Failed::ConflictInitResponseId(..) => late_discover.store(true, Ordering::Relaxed),
            Failed::ExpectedInitResult(Some(_)) => odd_discover.store(true, Ordering::Relaxed),
            _ => {}
        }
        unavailable(format!("initialize failed: {e}"))
    };
    let attempt = async |lifecycle: ClientLifecycleMode| {
        let handler = handler.clone();
        match endpoint {
            Endpoint::Stdio { command, args, env, working_dir } => {
                let mut cmd = Command::new(command);
                cmd.args(args)
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true)
                    // Its own process group (id = its pid), so a stop reaches its children too.
                    .process_group(0);
                if let Some(dir) = working_dir {
                    cmd.current_dir(dir);
                }
                let child = cmd.spawn().map_err(|e| unavailable(format!("cannot start '{command}': {e}")))?;
                // From here on, giving up (an error, the budget running out, the start being
                // cancelled) stops the whole group.
                let mut child = GroupGuard::new(child);
                let pipes = child.child_mut().map(|c| (c.stdin.take(), c.stdout.take(), c.stderr.take()));
                let Some((Some(stdin), Some(stdout), stderr)) = pipes else {
                    return Err(unavailable("the child's stdio pipes are missing"));
                };
                if let Some(stderr) = stderr {
                    forward_stderr(server_id.clone(), stderr);
                }
                let reader = FrameGuard::new(stdout, frame_limit, oversized.clone())
                    .reporting(server_id.clone(), garbage.clone());
                let service = handler.serve_with_lifecycle((reader, stdin), lifecycle).await.map_err(init_failed)?;
                Ok((service, Some(child)))
            }
            Endpoint::Socket { path, peer_uid } => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| unavailable(format!("cannot connect to the bridge at {}: {e}", display(path))))?;
                // Only the server's own sidecar (its uid) may answer for it.
                if let Some(expected) = peer_uid {
                    let uid = stream.peer_cred().map(|c| c.uid()).map_err(|e| {
                        unavailable(format!("cannot read the credentials of the bridge at {}: {e}", display(path)))
                    })?;
                    if uid != *expected {
                        return Err(unavailable(format!(
                            "the socket at {} is served by uid {uid}, not by the server's sidecar (uid {expected}); refusing to talk to it",
                            display(path)
                        )));
                    }
                }
                let (read, write) = stream.into_split();
                let reader =
                    FrameGuard::new(read, frame_limit, oversized.clone()).reporting(server_id.clone(), garbage.clone());
                let service = handler.serve_with_lifecycle((reader, write), lifecycle).await.map_err(init_failed)?;
                Ok((service, None))
            }
            Endpoint::MissingSidecar => Err(McpError {
                code: ErrorCode::McpUnavailable,
                message: format!(
                    "stdio server '{server_id}' has no sidecar in this pod: it joined the McpProfile after the pod \
                     started; restart the pod (for example `kubectl rollout restart`) to get its sidecar"
                ),
                retryable: false,
                refused_by_server: None,
            }),
            Endpoint::Http { url, headers, auth: _ } => {
                let http_client = http_client.clone();
                let mut custom = std::collections::HashMap::new();
                for (name, value) in headers {
                    let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|e| unavailable(format!("header name '{name}': {e}")))?;
                    // The value may be a secret: the error names the header, never the value.
                    let value = reqwest::header::HeaderValue::from_str(value)
                        .map_err(|_| unavailable(format!("header '{name}' has a value that is not valid in HTTP")))?;
                    custom.insert(name, value);
                }
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.custom_headers = custom;
                config.max_sse_event_size = frame_limit;
                config.reinit_on_expired_session = true;
                let client = match http_client {
                    Some(client) => client,
                    None => rmcp_default_client().map_err(|e| {
                        unavailable(format!("building the HTTP client: {}", crate::telemetry::error_chain(&e)))
                    })?,
                };
                let client = PoolHttp {
                    client,
                    trace: otel::active(),
                    auth: auth.clone(),
                    challenge: challenge.clone(),
                    refusal: refusal.clone(),
                };
                let transport = StreamableHttpClientTransport::with_client(client, config);
                let service = handler.serve_with_lifecycle(transport, lifecycle).await.map_err(init_failed)?;
                Ok((service, None))
            }
        }
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let no_session = || unavailable(format!("no session within {} ms", timeout.as_millis()));
    let probing = matches!(lifecycle, ClientLifecycleMode::Auto { .. });
    let mut established = tokio::time::timeout_at(deadline, attempt(lifecycle)).await.map_err(|_| no_session())?;
    if established.is_err() && probing && late_discover.load(Ordering::Relaxed) {
        // rmcp's probe waits 10 s for `server/discover`, then sends `initialize` on the same
        // stream; a server that answers the probe late has chosen 2026-07-28 and the start
        // fails. Start it again speaking that revision (the first child's group is stopped).
        tracing::info!(server_id = %server_id, "the server answered server/discover late: starting it again as 2026-07-28");
        let modern = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
        established = tokio::time::timeout_at(deadline, attempt(modern)).await.map_err(|_| no_session())?;
    } else if established.is_err() && probing && odd_discover.load(Ordering::Relaxed) {
        tracing::info!(server_id = %server_id, "the server answered server/discover with another result: starting it again with initialize");
        established = tokio::time::timeout_at(deadline, attempt(ClientLifecycleMode::Initialize))
            .await
            .map_err(|_| no_session())?;
    }
    // An authorization refused for good is the start's error, not retryable: only a change to the
    // McpServer (or to the server's authorization server) helps, so calls are refused at once.
    let (service, child) = established.map_err(|e| match refusal.lock().take() {
        Some(why) => McpError {
            code: ErrorCode::McpUnavailable,
            message: format!("initialize failed: {why}"),
            retryable: false,
            refused_by_server: None,
        },
        None => e,
    })?;
    let info = service
        .peer_info()
        .map(|peer| ServerInfo {
            name: peer.server_info.as_ref().map(|i| cut(&i.name, MAX_INFO_NAME_BYTES)),
            version: peer.server_info.as_ref().map(|i| cut(&i.version, MAX_INFO_NAME_BYTES)),
            instructions: peer.instructions.as_deref().map(|i| cut(i, MAX_INSTRUCTIONS_BYTES)),
        })
        .unwrap_or_default();
    subscribe_to_list_changes(server_id, &service, &handler_watchers);
    let pid = child.as_ref().and_then(GroupGuard::id);
    let protocol = service.peer_info().map(|p| p.protocol_version.clone()).unwrap_or_default();
    Ok(Connection {
        service,
        info,
        protocol,
        oversized,
        garbage_lines: garbage,
        calls,
        resource_listens: parking_lot::Mutex::default(),
        child: parking_lot::Mutex::new(child),
        pid,
    })
}

// === PoolHttp ===

/// The pool's Streamable HTTP client: rmcp's reqwest client, plus
/// - with tracing on, a call's W3C trace context (the `traceparent` and `tracestate` of its
///   `_meta`, set by the pool) as headers, so a server whose HTTP stack is instrumented
///   continues the trace without reading `_meta`;
/// - with `http.auth`, the bearer token of the server's [`TokenSource`]: on a 401 the source
///   renews it (following the server's challenge) and the request is sent again, once;
/// - without `http.auth`, a 401 becomes an error that says how to configure auth.
#[derive(Clone)]
struct PoolHttp {
    client: reqwest::Client,
    trace: bool,
    auth: Option<Arc<TokenSource>>,
    challenge: Option<ChallengeSlot>,
    refusal: RefusalSlot,
}

type HeaderMapOf = std::collections::HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>;
/// rmcp's SSE event cap for the calls that name none (its constant is crate-private).
const RMCP_DEFAULT_MAX_SSE_EVENT_SIZE: usize = 16 * 1024 * 1024;
type HttpResult<T> = Result<T, StreamableHttpError<reqwest::Error>>;

/// Adds the trace-context entries of `message`'s `_meta` (a `tools/call` only) to `headers`.
fn add_trace_headers(message: &rmcp::model::ClientJsonRpcMessage, headers: &mut HeaderMapOf) {
    let rmcp::model::JsonRpcMessage::Request(request) = message else { return };
    let rmcp::model::ClientRequest::CallToolRequest(call) = &request.request else { return };
    for (name, value) in otel::meta_headers(call.params.meta.as_ref()) {
        if let Ok(value) = reqwest::header::HeaderValue::from_str(value) {
            headers.insert(reqwest::header::HeaderName::from_static(name), value);
        }
    }
}

fn auth_failed(message: String) -> StreamableHttpError<reqwest::Error> {
    StreamableHttpError::Auth(rmcp::transport::auth::AuthError::AuthorizationFailed(message))
}

impl PoolHttp {
    /// A 401 to a request sent without auth: noted, and the error that says to configure it.
    fn unauthorized(&self, challenge: &str) -> StreamableHttpError<reqwest::Error> {
        if let Some(slot) = &self.challenge {
            *slot.lock() = Some(challenge.to_string());
        }
        self.refused(oauth::unconfigured_auth_message(challenge))
    }

    /// An authorization failure that repeats until the configuration changes: noted for the
    /// start's error (see [`RefusalSlot`]).
    fn refused(&self, message: String) -> StreamableHttpError<reqwest::Error> {
        *self.refusal.lock() = Some(message.clone());
        auth_failed(message)
    }

    fn token_failed(&self, error: oauth::TokenError) -> StreamableHttpError<reqwest::Error> {
        if error.lasting { self.refused(error.message) } else { auth_failed(error.message) }
    }

    /// Runs `call` with the server's token, renewing it and calling again once on a 401.
    async fn authorized<T, F, Fut>(&self, call: F) -> HttpResult<T>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = HttpResult<T>>,
    {
        let Some(source) = &self.auth else {
            return match call(None).await {
                Err(StreamableHttpError::AuthRequired(c)) => Err(self.unauthorized(&c.www_authenticate_header)),
                other => other,
            };
        };
        let token = source.current().await.map_err(|e| self.token_failed(e))?;
        match call(token.clone()).await {
            Err(StreamableHttpError::AuthRequired(c)) => {
                let fresh = source
                    .renew(token.as_deref(), &c.www_authenticate_header)
                    .await
                    .map_err(|e| self.token_failed(e))?;
                match call(Some(fresh)).await {
                    Err(StreamableHttpError::AuthRequired(c)) => Err(self.refused(format!(
                        "the server rejected a freshly issued access token too (WWW-Authenticate: {}); check the \
                         scopes and audience the authorization server grants this client",
                        oauth::quote(&c.www_authenticate_header)
                    ))),
                    other => other,
                }
            }
            other => other,
        }
    }
}

impl StreamableHttpClient for PoolHttp {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: rmcp::model::ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HeaderMapOf,
    ) -> impl Future<Output = HttpResult<StreamableHttpPostResponse>> + Send + '_ {
        self.post_message_with_max_sse_event_size(
            uri,
            message,
            session_id,
            None,
            custom_headers,
            RMCP_DEFAULT_MAX_SSE_EVENT_SIZE,
        )
    }

    fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: rmcp::model::ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        mut custom_headers: HeaderMapOf,
        max_sse_event_size: usize,
    ) -> impl Future<Output = HttpResult<StreamableHttpPostResponse>> + Send + '_ {
        if self.trace {
            add_trace_headers(&message, &mut custom_headers);
        }
        async move {
            if self.auth.is_none() {
                // No token, no retry: the message is moved, not copied.
                let sent = self.client.post_message_with_max_sse_event_size(
                    uri,
                    message,
                    session_id,
                    None,
                    custom_headers,
                    max_sse_event_size,
                );
                return match sent.await {
                    Err(StreamableHttpError::AuthRequired(c)) => Err(self.unauthorized(&c.www_authenticate_header)),
                    other => other,
                };
            }
            self.authorized(|token| {
                self.client.post_message_with_max_sse_event_size(
                    uri.clone(),
                    message.clone(),
                    session_id.clone(),
                    token,
                    custom_headers.clone(),
                    max_sse_event_size,
                )
            })
            .await
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HeaderMapOf,
    ) -> HttpResult<()> {
        self.authorized(|token| {
            self.client.delete_session(uri.clone(), session_id.clone(), token, custom_headers.clone())
        })
        .await
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HeaderMapOf,
    ) -> impl Future<Output = HttpResult<SseStream>> + Send + '_ {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            None,
            custom_headers,
            RMCP_DEFAULT_MAX_SSE_EVENT_SIZE,
        )
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HeaderMapOf,
        max_sse_event_size: usize,
    ) -> HttpResult<SseStream> {
        self.authorized(|token| {
            self.client.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }
}

/// What `StreamableHttpClientTransport::from_config` builds (rmcp keeps it private): no idle
/// pooling (rmcp's fix for delayed-ACK stalls), and only same-origin 307/308 redirects, up to 10,
/// since another status loses the POST body and another origin would get the session id and
/// the configured headers.
fn rmcp_default_client() -> Result<reqwest::Client, reqwest::Error> {
    const MAX_REDIRECTS: usize = 10;
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt.previous().first().is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("exceeded {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder().pool_max_idle_per_host(0).redirect(policy).build()
}

type SseStream = futures::stream::BoxStream<'static, Result<sse_stream::Sse, SseError>>;

/// Bytes kept of a server's name and version: the server chooses them, and they reach status,
/// logs and `/debug/effective`.
const MAX_INFO_NAME_BYTES: usize = 256;
/// Bytes kept of a server's `instructions` (they reach the model's system prompt).
const MAX_INSTRUCTIONS_BYTES: usize = 8192;

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> String {
    s[..s.floor_char_boundary(max)].to_string()
}

impl Connection {
    /// `tools/list`, page by page, within `limits` (see `limits`): the tools kept, what was cut,
    /// and the shortest `ttlMs` a page gave (2026-07-28 servers give one).
    pub(crate) async fn list_tools_capped(
        &self,
        limits: &ListLimits,
    ) -> Result<(Vec<rmcp::model::Tool>, ListCut, Option<u64>), rmcp::ServiceError> {
        let (mut tools, mut cursor, mut ttl_ms) = (Vec::new(), None, None::<u64>);
        for _ in 0..limits.max_pages {
            let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor);
            let page = self.service.peer().list_tools(Some(params)).await?;
            if let Some(ttl) = page.ttl_ms {
                ttl_ms = Some(ttl_ms.map_or(ttl, |t| t.min(ttl)));
            }
            tools.extend(page.tools);
            cursor = page.next_cursor;
            // Past the tool cap nothing more is kept, so nothing more is fetched.
            if cursor.is_none() || tools.len() > limits.max_tools {
                break;
            }
        }
        let (tools, cut) = super::limits::admit(tools, cursor.is_some(), limits);
        Ok((tools, cut, ttl_ms))
    }
}

/// Protocol versions from this one on deliver list_changed only to a `subscriptions/listen`
/// subscription; older ones send it unscoped to the handler callback. Dates compare as strings.
const SUBSCRIPTIONS_SINCE: &str = "2026-07-28";

/// Opens a list_changed subscription when the server speaks a protocol that needs one and
/// advertises `listChanged` for tools, resources or prompts; the task ends with the session.
fn subscribe_to_list_changes(
    server_id: &Arc<str>,
    service: &RunningService<RoleClient, PoolHandler>,
    watchers: &Watchers,
) {
    let Some(peer_info) = service.peer_info() else { return };
    let capabilities = &peer_info.capabilities;
    let tools = capabilities.tools.as_ref().and_then(|t| t.list_changed).unwrap_or(false);
    let resources = capabilities.resources.as_ref().and_then(|r| r.list_changed).unwrap_or(false);
    let prompts = capabilities.prompts.as_ref().and_then(|p| p.list_changed).unwrap_or(false);
    if !(tools || resources || prompts) || peer_info.protocol_version.as_str() < SUBSCRIPTIONS_SINCE {
        return;
    }
    let peer = service.peer().clone();
    let watchers = watchers.clone();
    let span = tracing::debug_span!("mcp_list_changed", server_id = %server_id);
    tokio::spawn(
        async move {
            let mut filter = SubscriptionFilter::new();
            filter.tools_list_changed = tools.then_some(true);
            filter.resources_list_changed = resources.then_some(true);
            filter.prompts_list_changed = prompts.then_some(true);
            let mut subscription = match peer.listen(filter).await {
                Ok(subscription) => subscription,
                Err(e) => {
                    tracing::debug!(error = %e, "no list_changed subscription; relying on TTL");
                    return;
                }
            };
            while let Ok(Some(notification)) = subscription.next().await {
                match notification {
                    ServerNotification::ToolListChangedNotification(_) => watchers.tools.bump(),
                    ServerNotification::ResourceListChangedNotification(_)
                    | ServerNotification::PromptListChangedNotification(_) => watchers.items.bump(),
                    _ => {}
                }
            }
        }
        .instrument(span),
    );
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// Copies a child's stderr into the log, one line per event, tagged with the server id; a line
/// past [`MAX_STDERR_LINE`] comes in pieces, invalid UTF-8 is replaced and does not stop the
/// reader.
fn forward_stderr(server_id: Arc<str>, stderr: tokio::process::ChildStderr) {
    let span = tracing::info_span!("mcp_stderr", server_id = %server_id);
    tokio::spawn(
        crate::child::for_each_line(stderr, MAX_STDERR_LINE, |line| {
            tracing::info!(target: "spear::mcp::stderr", "{line}");
        })
        .instrument(span),
    );
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn frame_guard_passes_lines_within_the_limit_and_trips_past_it() {
        let tripped = Arc::new(AtomicBool::new(false));
        let data = b"1234\n12345\n".to_vec();
        let mut guard = FrameGuard::new(&data[..], 5, tripped.clone());
        let mut out = Vec::new();
        guard.read_to_end(&mut out).await.expect("within the limit");
        assert_eq!(out, data);
        assert!(!tripped.load(Ordering::Relaxed));

        let data = b"ok\n123456".to_vec();
        let mut guard = FrameGuard::new(&data[..], 5, tripped.clone());
        let err = guard.read_to_end(&mut Vec::new()).await.expect_err("too long");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(tripped.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn lines_that_are_not_json_are_counted_and_still_passed_on() {
        let garbage = Arc::new(AtomicU64::new(0));
        let data = b"starting server...\n{\"jsonrpc\":\"2.0\"}\n  [1]\n\nnot json\n".to_vec();
        let guard = FrameGuard::new(&data[..], 1024, Arc::new(AtomicBool::new(false)));
        let mut guard = guard.reporting("fx".into(), garbage.clone());
        let mut out = Vec::new();
        guard.read_to_end(&mut out).await.expect("read");
        assert_eq!(out, data, "rmcp decides what to do with the lines; the guard only counts");
        assert_eq!(garbage.load(Ordering::Relaxed), 2);
    }
}
