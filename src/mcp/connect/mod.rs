//! Establishing one MCP client session (rmcp) over one transport. Thin I/O.
//!
//! ```text
//! Endpoint::Stdio  ── spawn argv (no shell), env as configured ──▶ child stdout ─FrameGuard─┐
//!   (stdio.rs)        child stderr ──lines──▶ tracing (server_id)      child stdin ─────────┤
//! Endpoint::Socket ── UnixStream (the bridge sidecar) ── read half ─FrameGuard, write half ─┤
//!   (socket.rs)                                                                            │
//! Endpoint::Http   ── rmcp Streamable HTTP client (reqwest), headers, session re-init ──────┤
//!   (http.rs: PoolHttp adds trace headers and the server's bearer token)                   ▼
//!                     rmcp client service (lifecycle: server/discover probe, initialize
//!                     fallback; or the revision the pool remembers) ──▶ Connection
//! ```
//!
//! `frame.rs` guards the read side of byte streams; `handler.rs` is the rmcp client handler
//! (list_changed, what a server sends during a call). The transports import only this file.
//!
//! Revisions: rmcp's probe waits 10 s for `server/discover` and then sends `initialize` on the
//! same stream. A server still starting (`npx` downloading) answers the probe late: a late error
//! (a 2025 server) is dropped (`late_probe.rs`) and the start goes on; a late result fails it with
//! a response-id conflict, and as that server speaks 2026-07-28 it is started again speaking it
//! (`Start::late_discover`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::ProtocolVersion;
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::IntoTransport;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};

use super::config::Endpoint;
use super::error::{ErrorCode, McpError};
use super::limits::{ListCut, ListLimits};
use super::relay::InFlight;
use crate::api::ServerInfo;
use crate::child::GroupGuard;

mod frame;
mod handler;
mod http;
mod late_probe;
mod socket;
mod stdio;

pub(crate) use frame::FrameGuard;
use handler::PoolHandler;
pub(crate) use handler::{ListChanged, Watchers};
use http::RefusalSlot;
pub(crate) use http::{ChallengeSlot, HttpParts};

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

/// The lifecycle that speaks whichever revision a server speaks: a `server/discover` probe at
/// 2026-07-28, falling back to the `initialize` handshake, offering 2025-11-25, when it answers
/// as a legacy server (or not at all within rmcp's 10 s).
pub(crate) fn probe_lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    }
}

/// Establishes a session with the server at `endpoint`, within `timeout` (spawn, connect and
/// the lifecycle's handshake together: `server/discover` for 2026-07-28 and later, `initialize`
/// before, or a discover probe falling back to `initialize`). `http` holds what a Streamable
/// HTTP endpoint needs: the agent's (tokens, deny list) or the prober's own client.
pub(crate) async fn connect(
    server_id: &Arc<str>,
    endpoint: &Endpoint,
    watchers: Watchers,
    frame_limit: usize,
    timeout: Duration,
    lifecycle: ClientLifecycleMode,
    http: HttpParts,
) -> Result<Connection, McpError> {
    let calls = Arc::new(InFlight::default());
    let handler = PoolHandler { server_id: server_id.clone(), watchers: watchers.clone(), calls: calls.clone() };
    let start = Start {
        server_id,
        handler,
        frame_limit,
        oversized: Arc::new(AtomicBool::new(false)),
        garbage: Arc::new(AtomicU64::new(0)),
        late_discover: AtomicBool::new(false),
        odd_discover: AtomicBool::new(false),
        http,
        refusal: RefusalSlot::default(),
    };
    let (service, child) = start.establish(endpoint, timeout, lifecycle).await?;
    let info = server_info(&service);
    handler::subscribe_to_list_changes(server_id, &service, &watchers);
    let pid = child.as_ref().and_then(GroupGuard::id);
    let protocol = service.peer_info().map(|p| p.protocol_version.clone()).unwrap_or_default();
    Ok(Connection {
        service,
        info,
        protocol,
        oversized: start.oversized,
        garbage_lines: start.garbage,
        calls,
        resource_listens: parking_lot::Mutex::default(),
        child: parking_lot::Mutex::new(child),
        pid,
    })
}

/// The rmcp client service of one session.
type Service = RunningService<RoleClient, PoolHandler>;

/// One start: what its attempts share (the handler, the read side's flags, the HTTP parts) and
/// what a failed handshake said about the server's revision.
struct Start<'a> {
    server_id: &'a Arc<str>,
    handler: PoolHandler,
    frame_limit: usize,
    oversized: Arc<AtomicBool>,
    garbage: Arc<AtomicU64>,
    /// Set when rmcp's probe gave up on `server/discover` and the answer came after all (a server
    /// slow to start, such as `npx` downloading): the server speaks 2026-07-28.
    late_discover: AtomicBool,
    /// Set when the server answered `server/discover` with a result that is not a discover
    /// result (some 2025 servers answer any method they do not know with `{}`): rmcp's probe
    /// takes that as fatal, but the server may well know `initialize`.
    odd_discover: AtomicBool,
    http: HttpParts,
    refusal: RefusalSlot,
}

impl Start<'_> {
    /// Attempts within `timeout`, and once more when a failed probe said which revision the
    /// server speaks.
    async fn establish(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
        lifecycle: ClientLifecycleMode,
    ) -> Result<(Service, Option<GroupGuard>), McpError> {
        let server_id = self.server_id;
        let deadline = tokio::time::Instant::now() + timeout;
        let no_session = || unavailable(format!("no session within {} ms", timeout.as_millis()));
        let probing = matches!(lifecycle, ClientLifecycleMode::Auto { .. });
        let attempt = |lifecycle| tokio::time::timeout_at(deadline, self.attempt(endpoint, lifecycle));
        let mut established = attempt(lifecycle).await.map_err(|_| no_session())?;
        if established.is_err() && probing && self.late_discover.load(Ordering::Relaxed) {
            // rmcp's probe waits 10 s for `server/discover`, then sends `initialize` on the same
            // stream; a server that answers the probe late has chosen 2026-07-28 and the start
            // fails. Start it again speaking that revision (the first child's group is stopped).
            tracing::info!(server_id = %server_id, "the server answered server/discover late: starting it again as 2026-07-28");
            let modern = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
            established = attempt(modern).await.map_err(|_| no_session())?;
        } else if established.is_err() && probing && self.odd_discover.load(Ordering::Relaxed) {
            tracing::info!(server_id = %server_id, "the server answered server/discover with another result: starting it again with initialize");
            established = attempt(ClientLifecycleMode::Initialize).await.map_err(|_| no_session())?;
        }
        // An authorization refused for good is the start's error, not retryable: only a change to
        // the McpServer (or to the server's authorization server) helps, so calls are refused at
        // once.
        established.map_err(|e| match self.refusal.lock().take() {
            Some(why) => McpError {
                code: ErrorCode::McpUnavailable,
                message: format!("initialize failed: {why}"),
                retryable: false,
                ..McpError::new(ErrorCode::McpUnavailable, "")
            },
            None => e,
        })
    }

    /// One attempt at `endpoint`, speaking `lifecycle`: the session, and the child's process
    /// group for a local stdio server.
    async fn attempt(
        &self,
        endpoint: &Endpoint,
        lifecycle: ClientLifecycleMode,
    ) -> Result<(Service, Option<GroupGuard>), McpError> {
        match endpoint {
            Endpoint::Stdio { command, args, env, working_dir } => {
                let (service, child) = stdio::open(self, command, args, env, working_dir.as_deref(), lifecycle).await?;
                Ok((service, Some(child)))
            }
            Endpoint::Socket { path, peer_uid } => Ok((socket::open(self, path, *peer_uid, lifecycle).await?, None)),
            Endpoint::MissingSidecar => Err(McpError {
                code: ErrorCode::McpUnavailable,
                message: format!(
                    "stdio server '{}' has no sidecar in this pod: it joined the McpProfile after the pod \
                     started; restart the pod (for example `kubectl rollout restart`) to get its sidecar",
                    self.server_id
                ),
                retryable: false,
                ..McpError::new(ErrorCode::McpUnavailable, "")
            }),
            Endpoint::DestinationMoved => Err(McpError {
                code: ErrorCode::McpUnavailable,
                message: format!(
                    "McpServer '{}' was edited after this pod started (http.url, http.auth.issuer or the token \
                     mode): the credentials the pod holds for it were granted for the old destination and are \
                     not sent to the new one; recreate the pod (for example `kubectl rollout restart`) to have \
                     the new destination granted",
                    self.server_id
                ),
                retryable: false,
                ..McpError::new(ErrorCode::McpUnavailable, "")
            }),
            Endpoint::Http { url, headers, auth: _ } => Ok((http::open(self, url, headers, lifecycle).await?, None)),
        }
    }

    /// The handshake over `transport`, speaking `lifecycle`; a failure that says which revision
    /// the server speaks is noted for [`Self::establish`].
    async fn handshake<T, E, A>(&self, transport: T, lifecycle: ClientLifecycleMode) -> Result<Service, McpError>
    where
        T: IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let transport = late_probe::LateProbeAnswers::new(transport.into_transport());
        self.handler.clone().serve_with_lifecycle(transport, lifecycle).await.map_err(|e| {
            match &e {
                ClientInitializeError::ConflictInitResponseId(..) => self.late_discover.store(true, Ordering::Relaxed),
                ClientInitializeError::ExpectedInitResult(Some(_)) => self.odd_discover.store(true, Ordering::Relaxed),
                _ => {}
            }
            match &e {
                ClientInitializeError::TransportError { error, .. } => {
                    let message = format!("initialize failed: {}", super::plain_error::plain(error));
                    // Only a configuration change (the URL, the deny list) ends a denial.
                    let denied = message.contains(crate::egress::DENIED);
                    McpError { retryable: !denied, ..unavailable(message) }
                }
                _ => unavailable(format!("initialize failed: {e}")),
            }
        })
    }

    /// `read` behind the frame limit, counting the lines that are not JSON-RPC.
    fn guard<R>(&self, read: R) -> FrameGuard<R> {
        FrameGuard::new(read, self.frame_limit, self.oversized.clone())
            .reporting(self.server_id.clone(), self.garbage.clone())
    }
}

/// What the server said about itself, cut to size (the server chooses it).
fn server_info(service: &Service) -> ServerInfo {
    service
        .peer_info()
        .map(|peer| ServerInfo {
            name: peer.server_info.as_ref().map(|i| cut(&i.name, MAX_INFO_NAME_BYTES)),
            version: peer.server_info.as_ref().map(|i| cut(&i.version, MAX_INFO_NAME_BYTES)),
            title: peer.server_info.as_ref().and_then(|i| i.title.as_deref()).map(|t| cut(t, MAX_INFO_NAME_BYTES)),
            description: peer
                .server_info
                .as_ref()
                .and_then(|i| i.description.as_deref())
                .map(|d| cut(d, MAX_INFO_DESCRIPTION_BYTES)),
            instructions: peer.instructions.as_deref().map(|i| cut(i, MAX_INSTRUCTIONS_BYTES)),
        })
        .unwrap_or_default()
}

/// Bytes kept of a server's name and version: the server chooses them, and they reach status,
/// logs and `/debug/effective`.
const MAX_INFO_NAME_BYTES: usize = 256;
/// Bytes kept of a server's description (status, and its tool group, which cuts it further).
const MAX_INFO_DESCRIPTION_BYTES: usize = 2048;
/// Bytes kept of a server's `instructions` (they reach the model's system prompt).
const MAX_INSTRUCTIONS_BYTES: usize = 8192;

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> String {
    s[..s.floor_char_boundary(max)].to_string()
}

impl Connection {
    /// `tools/list`, page by page, within `limits` (see `limits`): each page admitted as it
    /// arrives, and no page asked for once the list is full; the tools kept, what was cut, and
    /// the shortest `ttlMs` a page gave (2026-07-28 servers give one).
    pub(crate) async fn list_tools_capped(
        &self,
        limits: &ListLimits,
    ) -> Result<(Vec<rmcp::model::Tool>, ListCut, Option<u64>), rmcp::ServiceError> {
        let mut admission = super::limits::ListAdmission::new(limits);
        let (mut cursor, mut ttl_ms) = (None, None::<u64>);
        for _ in 0..limits.max_pages {
            let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor);
            let page = self.service.peer().list_tools(Some(params)).await?;
            if let Some(ttl) = page.ttl_ms {
                ttl_ms = Some(ttl_ms.map_or(ttl, |t| t.min(ttl)));
            }
            cursor = page.next_cursor;
            // What the page held beyond the caps is dropped here, before the next is fetched.
            let open = admission.page(page.tools);
            if cursor.is_none() || !open {
                break;
            }
        }
        let (tools, cut) = admission.finish(cursor.is_some());
        Ok((tools, cut, ttl_ms))
    }
}
