//! Serving the agent: bind the three ports, build the three doors over one core, and shut down
//! in order. `spearlet serve` (local mode) and `spearlet run` (in a pod) differ only in where
//! the registry comes from ([`super::run`]); everything here is shared.
//!
//! ```text
//! bind http (4040, loopback) · grpc (4041, loopback) · admin (4042)   ── errors name the flag
//! spawn Agent::run (registry → pool → catalog)
//! serve: http = /v1/chat/completions + /mcp   grpc = McpSessions + McpRegistry   admin
//! cancel ─▶ stop accepting, close /mcp streams ─▶ in-flight requests finish (≤ grace)
//!        ─▶ agent stops: sessions closed, children reaped ─▶ audit flushed ─▶ admin stops
//! ```
//!
//! The admin port stops last so that probes and scrapers see the drain, not a refused connection.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::middleware;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::admin;
use super::core::Agent;
use super::doors::chat::ChatService;
use super::doors::grpc;
use super::doors::mcp::McpEndpoint;
use super::http_guard::{self, Allowed};
use super::key_guard;
use super::revision::revision_layer;
use crate::api::api_key::ApiKey;
use crate::chat::{UpstreamOverride, UpstreamTimeouts};
use crate::http_server::{self, ConnectionLimits};

/// Where audit lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditTarget {
    /// stderr, beside the logs.
    Stderr,
    Off,
    /// Appended to a file.
    File(PathBuf),
}

impl std::str::FromStr for AuditTarget {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "stderr" | "-" => AuditTarget::Stderr,
            "off" | "none" => AuditTarget::Off,
            path => AuditTarget::File(PathBuf::from(path)),
        })
    }
}

/// Everything the doors need, whatever the registry source: the plain form of the shared flags.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Chat completions and `/mcp`.
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    /// Health, readiness, metrics, `/debug/effective`.
    pub admin_addr: SocketAddr,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// `Host` header values chat completions, `/mcp` and the admin port accept (DNS-rebinding
    /// protection); the admin port also accepts IP addresses and `localhost`.
    pub allowed_hosts: Vec<String>,
    /// Web page origins allowed on chat completions, `/mcp` and the admin port; any other
    /// `Origin` is refused.
    pub allowed_origins: Vec<String>,
    /// The flags' upstream settings, over the profile's.
    pub upstream: UpstreamOverride,
    pub audit: AuditTarget,
    /// Include tool-call arguments in audit lines (they may hold secrets).
    pub audit_arguments: bool,
    /// Header-read timeout and connection cap of the HTTP door, the gRPC door and the admin port,
    /// each.
    pub connection_limits: ConnectionLimits,
    /// How long a `/mcp` session may go unused before it is closed (its id then gets 404).
    pub mcp_session_idle: Duration,
    /// The key chat completions, `/mcp` and gRPC require as a bearer (`api::api_key`); `None`
    /// admits every caller that reaches them.
    pub api_key: Option<ApiKey>,
    /// `--egress-deny-cidrs`; `None`: the mode's default (`AddressDenyList::AGENT_LOCAL`, or
    /// `AGENT_POD` in a pod).
    pub egress: Option<crate::egress::AddressDenyList>,
    /// The pool's limits.
    pub pool: PoolLimits,
}

/// The pool limits the flags set (`crate::mcp::PoolOptions` holds them with the rest).
#[derive(Clone, Debug)]
pub struct PoolLimits {
    /// How long a tools/list answer is reused.
    pub tools_ttl: Duration,
    /// Tool calls in flight over all servers.
    pub max_concurrent_calls: usize,
    /// stdio child processes at once (local mode).
    pub max_children: usize,
    /// How long a server's session may go unused before it is closed; `None` keeps it.
    pub server_idle: Option<Duration>,
    /// Refuse arguments that break the tool's `inputSchema` before the call leaves.
    pub check_arguments: bool,
}

/// `spearlet run`'s defaults.
impl Default for PoolLimits {
    fn default() -> Self {
        let pool = crate::mcp::PoolOptions::default();
        PoolLimits {
            tools_ttl: pool.tools_ttl,
            max_concurrent_calls: pool.max_concurrent_calls,
            max_children: pool.max_children,
            server_idle: None,
            check_arguments: pool.check_arguments,
        }
    }
}

/// The three bound listeners (bound first, so a taken port fails fast and names its flag).
#[derive(Debug)]
pub(crate) struct Listeners {
    pub(crate) http: TcpListener,
    pub(crate) grpc: TcpListener,
    pub(crate) admin: TcpListener,
    /// The admin port's answers while the agent starts ([`Listeners::answer_while_starting`]).
    starting: Option<StartingAdmin>,
}

/// A server on a second handle of the admin socket, answering until the real one takes over.
#[derive(Debug)]
struct StartingAdmin {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{flag} {addr}: cannot listen: {source}")]
    Bind {
        /// The flag that set the address.
        flag: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("chat upstream client: {0}")]
    Upstream(#[from] crate::chat::UpstreamError),
    /// A door's server stopped with an error.
    #[error("{door} server: {message}")]
    Server { door: &'static str, message: String },
}

impl Listeners {
    /// Binds the three addresses of `config`.
    pub(crate) async fn bind(config: &AgentConfig) -> Result<Self, ServeError> {
        async fn one(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
            TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { flag, addr, source })
        }
        Ok(Listeners {
            http: one("--http-addr", config.http_addr).await?,
            grpc: one("--grpc-addr", config.grpc_addr).await?,
            admin: one("--admin-addr", config.admin_addr).await?,
            starting: None,
        })
    }

    /// Answers the admin port from now until [`serve`] takes it over: `/healthz` ok, anything
    /// else 503 "starting". In a pod the agent waits for its first registry list before it
    /// serves, and the kubelet's liveness probe runs from the container's start (the postStart
    /// hook, not a startup probe, holds the app back), so the process must look alive meanwhile.
    /// The server runs on a duplicate of the socket's descriptor; both accept from one queue, so
    /// the handover refuses nothing.
    pub(crate) fn answer_while_starting(mut self, config: &AgentConfig) -> Result<Self, ServeError> {
        let bind_error = |source| ServeError::Bind { flag: "--admin-addr", addr: config.admin_addr, source };
        let socket = self.admin.into_std().map_err(bind_error)?;
        let duplicate = socket.try_clone().map_err(bind_error)?;
        self.admin = TcpListener::from_std(socket).map_err(bind_error)?;
        let duplicate = TcpListener::from_std(duplicate).map_err(bind_error)?;
        let router = admin::starting_router().layer(middleware::from_fn_with_state(
            Allowed::admin(config.allowed_hosts.clone(), config.allowed_origins.clone()),
            http_guard::guard,
        ));
        let stop = CancellationToken::new();
        let task = tokio::spawn(http_server::serve(duplicate, router, config.connection_limits, stop.clone()));
        self.starting = Some(StartingAdmin { stop, task });
        Ok(self)
    }

    /// Stops the server of [`Listeners::answer_while_starting`], if any, and waits for it.
    async fn stop_answering_while_starting(&mut self) {
        if let Some(StartingAdmin { stop, task }) = self.starting.take() {
            stop.cancel();
            let _ = task.await;
        }
    }
}

/// The HTTP router of port 4040: chat completions and `/mcp` behind the browser guard, then the
/// key check, every answer stamped with the registry revision.
pub(crate) fn http_router(
    agent: Agent,
    chat: ChatService,
    shutdown: CancellationToken,
    config: &AgentConfig,
) -> Router {
    let allowed = Allowed::new(config.allowed_hosts.clone(), config.allowed_origins.clone());
    let doors = doors_router(agent, chat, shutdown, config);
    key_guard::guarded(doors, config.api_key.clone()).layer(middleware::from_fn_with_state(allowed, http_guard::guard))
}

/// Chat completions and `/mcp` over `agent`, every answer stamped with the registry revision; no
/// guard (the gateway puts its own in front of one of these per profile).
pub(crate) fn doors_router(
    agent: Agent,
    chat: ChatService,
    shutdown: CancellationToken,
    config: &AgentConfig,
) -> Router {
    let mcp = McpEndpoint::router(agent.clone(), shutdown, config.allowed_hosts.clone(), config.mcp_session_idle);
    super::doors::chat::router(chat)
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(agent, revision_layer))
}

/// Serves every door until `cancel`, then shuts down in order (see the module doc). The agent's
/// refresh task is spawned here and stopped last.
pub(crate) async fn serve(
    config: &AgentConfig,
    agent: Agent,
    mut listeners: Listeners,
    metrics: Arc<Registry>,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    listeners.stop_answering_while_starting().await;
    let chat = ChatService::new(agent.clone(), config.upstream.clone(), UpstreamTimeouts::default())?;
    let agent_stop = CancellationToken::new();
    let agent_task = tokio::spawn(agent.clone().run(agent_stop.clone()));
    // Doors stop accepting on `cancel`; their in-flight work gets the grace period.
    let doors_stop = cancel.child_token();

    let http = http_router(agent.clone(), chat, doors_stop.clone(), config);
    let limits = config.connection_limits;
    let http_server = http_server::serve(listeners.http, http, limits, doors_stop.clone());
    let grpc_options = grpc::GrpcOptions { api_key: config.api_key.clone(), ..grpc::GrpcOptions::default() };
    let grpc_server = grpc::serve_with(agent.clone(), grpc_options, listeners.grpc, limits, doors_stop.clone());
    // No web page, rebound or not: a page has no business reading the tool set or metrics. Probes
    // and scrapers use the pod's IP, which the admin guard accepts with the listed names.
    let admin = admin::router(agent.clone(), metrics).layer(middleware::from_fn_with_state(
        Allowed::admin(config.allowed_hosts.clone(), config.allowed_origins.clone()),
        http_guard::guard,
    ));
    let admin_stop = CancellationToken::new();
    let admin_task = tokio::spawn(http_server::serve(listeners.admin, admin, limits, admin_stop.clone()));

    tracing::info!(
        http = %config.http_addr, grpc = %config.grpc_addr, admin = %config.admin_addr,
        profile = agent.profile(), "spearlet serving"
    );
    let doors = async {
        let ((), grpc) = tokio::join!(http_server, grpc_server);
        grpc.map_err(|e| ServeError::Server { door: "grpc", message: e.to_string() })
    };
    tokio::pin!(doors);
    // `biased`: the doors also stop on `cancel`, so after a SIGTERM both branches can be ready in
    // the same poll; unbiased, the doors' branch could win and the shutdown would go unlogged
    // ("spearlet stopped" without "shutting down").
    let result = tokio::select! {
        biased;
        () = cancel.cancelled() => {
            tracing::info!(grace = ?config.shutdown_grace, "shutting down: finishing in-flight requests");
            match tokio::time::timeout(config.shutdown_grace, &mut doors).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!("in-flight requests did not finish within the grace period; closing");
                    Ok(())
                }
            }
        }
        result = &mut doors => result,
    };
    // Sessions closed and children reaped before the process exits.
    agent_stop.cancel();
    if let Err(e) = agent_task.await {
        tracing::warn!(error = %e, "agent task ended abnormally");
    }
    agent.flush_audit();
    admin_stop.cancel();
    let _ = admin_task.await;
    tracing::info!("spearlet stopped");
    result
}
