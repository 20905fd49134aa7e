//! One server in the pool: its config, permits, session, the start in progress, the tools cache
//! and health.
//!
//! ```text
//! Slot::session ─▶ live session | join the start in progress | begin_startup
//! begin_startup ─▶ task: connect::connect + first tools/list (startupTimeoutMs) ─▶ finish_startup
//! finish_startup ─▶ session + health + revision remembered | failure kept for one listing
//! ```
//!
//! A start runs in a task of its own, so a caller that gives up never cuts it short. A slot
//! replaced for new budgets shares its session, start, health and tokens with its successor
//! ([`Slot::with_session_of`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use parking_lot::Mutex;
use rmcp::model::{ErrorCode as RpcCode, Tool};
use rmcp::service::ServiceError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use super::Inner;
use crate::mcp::config::{Endpoint, ServerConfig};
use crate::mcp::connect::{self, Connection, ListChanged};
use crate::mcp::error::{ErrorCode, McpError, ServerRefusal};
use crate::mcp::health::Health;
use crate::mcp::limits::{self, ListCut};
use crate::mcp::token_source::TokenSource;
use crate::mcp::tool_schema;
use crate::policy::Starting;

/// A live session and what it holds.
pub(super) struct Live {
    pub(super) conn: Connection,
    /// A slot under the child-process cap, released with the session.
    _child_permit: Option<OwnedSemaphorePermit>,
    pub(super) last_used: Mutex<Instant>,
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
pub(super) struct ToolsCache {
    pub(super) entry: Option<(Instant, u64, ListResult, Duration)>,
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
pub(super) fn list_ttl(server_ttl_ms: Option<u64>, default: Duration) -> Duration {
    server_ttl_ms.map_or(default, |ms| Duration::from_millis(ms).clamp(MIN_SERVER_LIST_TTL, MAX_SERVER_LIST_TTL))
}

pub(super) struct Slot {
    pub(super) config: ServerConfig,
    pub(super) concurrency: Arc<Semaphore>,
    // The session, the start in progress and health are shared with the slot that replaces
    // this one when only budgets change (`with_session_of`), so a start in progress records
    // into both.
    pub(super) session: Arc<tokio::sync::Mutex<Option<Arc<Live>>>>,
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
    pub(super) start_ended: Arc<ListChanged>,
    pub(super) health: Arc<Mutex<Health>>,
    pub(super) env_missing: Mutex<Option<String>>,
    pub(super) refused: Mutex<Option<String>>,
    pub(super) list_cut: Mutex<Option<ListCut>>,
    pub(super) list_changed: Arc<ListChanged>,
    pub(super) tools: tokio::sync::Mutex<ToolsCache>,
    /// Compiled inputSchemas and outputSchemas by tool, with the listed schema they were
    /// compiled from.
    validators: tokio::sync::Mutex<HashMap<(String, SchemaOf), ListedValidator>>,
    /// The server's access tokens (`http.auth`), kept across its sessions while the resolved
    /// auth config is the same.
    tokens: Arc<Mutex<Option<Arc<TokenSource>>>>,
}

/// A listed schema and its validator (or why it cannot be used).
type ListedValidator = (Arc<rmcp::model::JsonObject>, Arc<Result<jsonschema::Validator, String>>);

/// Which of a tool's schemas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum SchemaOf {
    Input,
    Output,
}

pub(super) async fn reap_idle(inner: &Inner, idle: Duration) {
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
    /// The validator of the schema (`of`) the server's last tool list gives `tool`, if it gives
    /// one (without waiting for the list: a list being fetched right now counts as none). Each
    /// listed schema is compiled once, off the runtime's threads and one at a time per server;
    /// a schema that does not compile or is over a cap is `Err` (logged once), and that tool's
    /// calls pass unchecked (`tool_schema.rs`).
    pub(super) async fn validator(
        &self,
        tool: &str,
        of: SchemaOf,
    ) -> Option<Arc<Result<jsonschema::Validator, String>>> {
        let schema = {
            let cache = self.tools.try_lock().ok()?;
            let Some((_, _, Ok(tools), _)) = cache.entry.as_ref() else { return None };
            let listed = tools.iter().find(|t| t.name == tool)?;
            match of {
                SchemaOf::Input => listed.input_schema.clone(),
                SchemaOf::Output => listed.output_schema.clone()?,
            }
        };
        let key = (tool.to_string(), of);
        let mut validators = self.validators.lock().await;
        if let Some((listed, validator)) = validators.get(&key)
            && Arc::ptr_eq(listed, &schema)
        {
            return Some(validator.clone());
        }
        let compiling = schema.clone();
        let compiled = tokio::task::spawn_blocking(move || tool_schema::compile(&compiling))
            .await
            .unwrap_or_else(|e| Err(format!("compiling it failed: {e}")));
        let validator = Arc::new(compiled);
        if let Err(why) = validator.as_ref() {
            tracing::warn!(server_id = %self.config.id, tool, schema = ?of, error = %why, "the schema cannot be checked");
        }
        // One entry per schema of the list: a tool that left the list leaves with the next list.
        validators.retain(|_, (listed, _)| Arc::strong_count(listed) > 1);
        validators.insert(key, (schema, validator.clone()));
        Some(validator)
    }

    pub(super) fn new(config: ServerConfig) -> Self {
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
            validators: tokio::sync::Mutex::new(HashMap::new()),
            startup: Arc::new(Mutex::new(None)),
            start_failure: Arc::new(Mutex::new(None)),
            revision: Arc::new(Mutex::new(None)),
            start_ended: Arc::new(ListChanged::default()),
            tokens: Arc::new(Mutex::new(None)),
        }
    }

    /// The token source for `endpoint`'s auth, reused while its config is unchanged.
    fn token_source(&self, endpoint: &Endpoint, inner: &Inner) -> Option<Arc<TokenSource>> {
        let options = &inner.options;
        let Endpoint::Http { url, auth: Some(auth), .. } = endpoint else { return None };
        let mut tokens = self.tokens.lock();
        if let Some(source) = tokens.as_ref().filter(|s| s.auth() == auth && s.url() == url) {
            return Some(source.clone());
        }
        let (metrics, egress, secrets) = (options.metrics.clone(), &options.egress, options.secrets.clone());
        let source = Arc::new(TokenSource::new(
            self.config.id.clone(),
            url.clone(),
            auth.clone(),
            metrics,
            egress,
            secrets,
            inner.grant_secrets.get().cloned(),
        ));
        *tokens = Some(source.clone());
        Some(source)
    }

    /// Same connection, new budgets: the session, a start in progress, health and list
    /// notifications carry over (shared).
    pub(super) fn with_session_of(config: ServerConfig, old: &Slot) -> Self {
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
    pub(super) async fn session(slot: &Arc<Slot>, inner: &Arc<Inner>) -> Result<Arc<Live>, McpError> {
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
                // Before any byte reaches the server: what it is given is what it may not echo
                // to others, nor others send it.
                let held = slot.config.held_secrets(|name| (inner.env)(name));
                inner.options.secrets.hold_all(held, Some(&slot.config.id));
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
            Endpoint::Stdio { .. } => Some(inner.children.clone().try_acquire_owned().map_err(|_| {
                McpError::new(
                    ErrorCode::McpUnavailable,
                    format!(
                        "the agent already runs {} stdio servers (its cap: --max-stdio-children)",
                        inner.options.max_children
                    ),
                )
            })?),
            _ => None,
        };
        let budget = Duration::from_millis(u64::from(slot.config.budgets.startup_timeout_ms()));
        let facts = Starting { what: endpoint.kind(), since: std::time::SystemTime::now(), budget };
        let frame_limit = limits::frame_limit(slot.config.budgets.max_tool_output_bytes(), inner.options.frame_limit);
        let lifecycle = lifecycle_for(slot.revision.lock().as_ref().filter(|(at, _)| at.elapsed() < REVISION_TTL));
        let tokens = slot.token_source(&endpoint, inner);
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
                        connect::HttpParts::agent(tokens.as_ref(), &pool.options.egress),
                    )
                    .await?;
                    let left = budget.saturating_sub(started.elapsed());
                    let asked = Instant::now();
                    let first =
                        tokio::time::timeout(left, conn.list_tools_capped(&list_limits)).await.map_err(|_| {
                            McpError::new(
                                ErrorCode::McpTimeout,
                                format!("no tool list within the startup budget of {} ms", budget.as_millis()),
                            )
                        })?;
                    if first.is_ok() {
                        pool.options.metrics.listed(&owner.config.id, asked.elapsed());
                    }
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
    pub(super) fn starting(&self) -> Option<Starting> {
        self.startup.lock().as_ref().map(|s| s.facts.clone())
    }

    /// Closes `live` if it is still the current session.
    pub(super) async fn discard(&self, live: &Arc<Live>) {
        let mut current = self.session.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, live)) {
            current.take();
        }
        drop(current);
        live.conn.close().await;
    }

    /// Maps a failed call, restarting the session when it is broken.
    pub(super) async fn failed(&self, live: &Arc<Live>, error: ServiceError) -> McpError {
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
                let refused_by_server = ServerRefusal::of(data.code.0, data.data.as_ref());
                McpError { retryable: false, refused_by_server, ..McpError::new(code, data.message.to_string()) }
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
                    let cause = match &other {
                        ServiceError::TransportSend(error) => crate::mcp::plain_error::plain(error),
                        _ => other.to_string(),
                    };
                    let message = format!("the session broke: {cause}");
                    self.health.lock().down(&message);
                    McpError::new(ErrorCode::McpUnavailable, message)
                }
            }
        }
    }

    /// One tools/list: the start's own list when this is the first after it, else a fresh one
    /// within the server's `toolTimeoutMs`. Waits at most `startup_wait` for a start.
    pub(super) async fn fetch_tools(
        slot: &Arc<Slot>,
        inner: &Arc<Inner>,
    ) -> Result<(Arc<Vec<Tool>>, Option<u64>), McpError> {
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
                let asked = Instant::now();
                let listed =
                    tokio::time::timeout(timeout, live.conn.list_tools_capped(&inner.options.list_limits)).await;
                if matches!(listed, Ok(Ok(_))) {
                    inner.options.metrics.listed(&slot.config.id, asked.elapsed());
                }
                listed
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

    /// A manual reconnect: closes the session and abandons a start in progress (a stdio child is
    /// stopped), forgets the last start's failure, and marks the tool list changed, so the
    /// agent lists again at once, which starts the server afresh.
    pub(super) async fn restart(&self) {
        self.stop().await;
        self.start_failure.lock().take();
        self.list_changed.bump();
    }

    pub(super) async fn close(&self) {
        self.stop().await;
        self.concurrency.close();
    }

    /// Abandons a start in progress and closes the session.
    async fn stop(&self) {
        let startup = self.startup.lock().take();
        if let Some(startup) = startup {
            // Dropping the start stops the child's process group (connect's guard).
            startup.task.abort();
        }
        let live = self.session.lock().await.take();
        if let Some(live) = live {
            live.conn.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use rmcp::ClientLifecycleMode;
    use rmcp::model::ProtocolVersion;

    use super::*;

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
}
