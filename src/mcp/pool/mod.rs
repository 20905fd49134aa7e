//! The client pool: one long-lived session per server, shared by every caller. I/O wiring over
//! the pure pieces (config, health, output cap, error codes).
//!
//! ```text
//! call_tool(server, tool, args, budgets)                                          call.rs
//!   ├─ global call permit ─ server permit (maxConcurrency: the N+1st call waits)
//!   ├─ session(): reuse the live session | join the start in progress | begin one: a task of
//!   │    its own (spawn/connect, initialize, first tools/list within startupTimeoutMs), so no
//!   │    caller's timeout or disconnect cuts a start short (killing `npx` mid-install breaks
//!   │    its cache); removing the server aborts it and stops the child's process group  slot.rs
//!   ├─ timeout(toolTimeoutMs) ─ rmcp tools/call
//!   └─ outcome ─▶ health (Connected / Degraded / Down) ─▶ restart session on crash, frame
//!                 overflow or N timeouts in a row ─▶ cap output (maxToolOutputBytes) ─▶ result
//! list_tools(server): per-server cache (TTL, short failure TTL, list_changed, single flight);
//!   a listing waits at most `startup_wait` for a start, then reports the server as starting;
//!   the start's end (either way) counts as a list change, so the agent lists again
//! apply(snapshot): unchanged servers keep their sessions; changed ones restart; removed close
//! resources, prompts, completion, log level, subscriptions                   resources.rs
//! ```
//!
//! `slot.rs` is the leaf: it knows one server and imports neither `call.rs` nor `resources.rs`;
//! `resources.rs` borrows `call.rs`'s request helpers, never the other way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use rmcp::model::{ServerCapabilities, Tool};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::config::{ConfigError, Mode, ServerConfig};
use super::connect::ListChanged;
use super::error::{ErrorCode, McpError};
use super::health::Health;
use super::limits::{ListCut, ListLimits};
use crate::api::ServerInfo;
use crate::policy::{ServerTools, Starting, ToolInfo, ToolList};
use crate::registry::snapshot::Snapshot;
use crate::telemetry::PoolMetrics;

mod call;
mod resources;
mod slot;

#[cfg(feature = "fuzzing")]
pub(crate) use call::cap_result;
pub(crate) use call::input_required;
pub use call::{Continuation, ToolOutput};
pub use resources::ItemRead;
use slot::{Slot, list_ttl, reap_idle};

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
    /// Addresses remote servers and their OAuth requests are never sent to (`--egress-deny-cidrs`).
    pub egress: crate::egress::AddressDenyList,
    /// The secret values the agent holds: the pool adds each server's as it resolves its
    /// configuration and gets its tokens; the agent redacts them from what leaves.
    pub secrets: Arc<crate::secrets::HeldSecrets>,
    /// Refuse a call whose arguments break the tool's listed `inputSchema` before it leaves
    /// (`--check-arguments`). Off by default: an MCP client sends what its caller asks and the
    /// server validates (the conformance suite's SEP-2243 scenarios expect exactly that).
    pub check_arguments: bool,
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
            egress: crate::egress::AddressDenyList::AGENT_LOCAL
                .parse()
                .unwrap_or_else(|_| crate::egress::AddressDenyList::none()),
            secrets: Arc::default(),
            check_arguments: false,
        }
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
    /// Cluster mode: the Secrets of persons' grants (`authorizationCode.tokenSecretRef`), set
    /// once before the first server starts.
    grant_secrets: std::sync::OnceLock<crate::mcp::grant_store::secret::GrantSecrets>,
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
    /// The secret values the agent holds (see [`PoolOptions::secrets`]).
    pub(crate) fn secrets(&self) -> &Arc<crate::secrets::HeldSecrets> {
        &self.inner.options.secrets
    }

    /// A pool reading `${ENV:...}` values from the process environment, except `hidden_env`.
    pub fn new(options: PoolOptions) -> Self {
        let hidden = options.hidden_env.clone();
        Pool::with_env(
            options,
            Arc::new(move |name: &str| if hidden.iter().any(|h| h == name) { None } else { std::env::var(name).ok() }),
        )
    }

    /// In a pod: where the grants of `authorizationCode` servers are read and renewed. Set before
    /// the first server starts; a second call changes nothing.
    pub(crate) fn use_grant_secrets(&self, secrets: crate::mcp::grant_store::secret::GrantSecrets) {
        let _ = self.inner.grant_secrets.set(secrets);
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
            grant_secrets: std::sync::OnceLock::new(),
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
    /// servers whose connection fields changed get a fresh session and tool cache, removed and
    /// disabled servers' sessions are closed. Returns the servers that could not be configured.
    pub async fn apply(&self, snapshot: &Snapshot) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut wanted: HashMap<Arc<str>, ServerConfig> = HashMap::new();
        for versioned in snapshot.servers().values().filter(|v| v.object.spec.is_enabled()) {
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

    /// Starts `server` afresh (`POST /admin/reconnect`): its session is closed, a stdio child
    /// stopped, and the next listing (at once) starts it again. Calls in flight on the old
    /// session end with `mcp_unavailable`.
    pub async fn reconnect(&self, server: &str) -> Result<(), McpError> {
        let slot = self.slot(server)?;
        tracing::info!(server_id = %server, "reconnect asked for: closing its session");
        slot.restart().await;
        Ok(())
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
                let infos = tools.iter().map(tool_info).collect();
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

    /// Whether `server` can only be used after a pod restart: a stdio server this pod has no
    /// sidecar for (it joined the profile after the pod started), or a Streamable HTTP server
    /// whose destination moved since the pod's credentials were granted.
    pub(crate) fn needs_pod_restart(&self, server: &str) -> bool {
        use super::config::TransportConfig;
        self.slot(server).is_ok_and(|slot| {
            matches!(slot.config.transport, TransportConfig::MissingSidecar | TransportConfig::DestinationMoved)
        })
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

    /// The capabilities `server` declared, when its session is up (without waiting for it).
    pub fn server_capabilities(&self, server: &str) -> Option<ServerCapabilities> {
        let slot = self.slot(server).ok()?;
        let live = slot.session.try_lock().ok().and_then(|s| s.clone())?;
        live.conn.service.peer().peer_info().map(|info| info.capabilities.clone())
    }

    /// Closes every session and reaps every child. The pool refuses calls afterwards.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.calls.close();
        let slots: Vec<Arc<Slot>> = self.inner.slots.write().drain().map(|(_, s)| s).collect();
        futures::future::join_all(slots.iter().map(|s| s.close())).await;
    }
}

/// The listed tool's fields beyond name, description and input schema that `/mcp` passes on
/// ([`ToolInfo::metadata`]); the tool's own `_meta` stays here (it is the server's business with
/// its direct clients, not the agent's callers').
/// A listed tool as the policy sees it (and `policy::pin` digests it).
pub(crate) fn tool_info(t: &Tool) -> ToolInfo {
    ToolInfo {
        name: t.name.as_ref().into(),
        description: t.description.as_deref().map(Into::into),
        input_schema: Arc::new(Value::Object((*t.input_schema).clone())),
        metadata: tool_metadata(t),
    }
}

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
    use super::*;

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
}
