//! Wiring of `spearlet serve`: bind the three ports, run the agent core and its doors, and shut
//! down in order.
//!
//! ```text
//! bind http (4040, loopback) · grpc (4041, loopback) · admin (4042)   ── errors name the flag
//! spawn Agent::run (registry → pool → catalog)
//! serve: http = /v1/chat/completions + /mcp   grpc = McpSessions + McpRegistry   admin
//! cancel ─▶ stop accepting, close /mcp streams ─▶ in-flight requests finish (≤ grace)
//!        ─▶ agent stops: sessions closed, children reaped
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::Response;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::admin;
use super::core::Agent;
use super::mcp_endpoint::McpEndpoint;

/// The response header naming the registry revision an answer used (DESIGN.md).
pub use crate::api::keys::HEADER_REGISTRY_REVISION as REVISION_HEADER;

/// Where the agent listens and how it stops.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Chat completions and `/mcp`.
    pub http_addr: SocketAddr,
    /// gRPC.
    pub grpc_addr: SocketAddr,
    /// Health, readiness, metrics.
    pub admin_addr: SocketAddr,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// `Host` header values `/mcp` accepts (DNS-rebinding protection).
    pub allowed_hosts: Vec<String>,
}

/// The three bound listeners (bound first, so a taken port fails fast and names its flag).
#[derive(Debug)]
pub struct Listeners {
    /// Chat completions and `/mcp`.
    pub http: TcpListener,
    /// gRPC.
    pub grpc: TcpListener,
    /// Admin.
    pub admin: TcpListener,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A port could not be bound.
    #[error("{flag} {addr}: cannot listen: {source}")]
    Bind {
        /// The flag that set the address.
        flag: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A server stopped with an error.
    #[error("{door} server: {message}")]
    Server {
        /// Which one.
        door: &'static str,
        /// What happened.
        message: String,
    },
}

impl Listeners {
    /// Binds the three addresses of `config`.
    pub async fn bind(config: &ServeConfig) -> Result<Self, ServeError> {
        async fn one(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, ServeError> {
            TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { flag, addr, source })
        }
        Ok(Listeners {
            http: one("--http-addr", config.http_addr).await?,
            grpc: one("--grpc-addr", config.grpc_addr).await?,
            admin: one("--admin-addr", config.admin_addr).await?,
        })
    }
}

/// A door served next to the HTTP ones (the gRPC server): given its listener and the token that
/// stops it, a future that serves until stopped.
pub type ExtraDoor =
    Box<dyn FnOnce(TcpListener, CancellationToken) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send>;

/// The HTTP router of port 4040: `/mcp` plus `chat` (the chat completions routes), every
/// response stamped with the registry revision unless the handler set it itself.
pub fn http_router(agent: Agent, chat: Router, shutdown: CancellationToken, allowed_hosts: Vec<String>) -> Router {
    let mcp = McpEndpoint::router(agent.clone(), shutdown, allowed_hosts);
    chat.nest_service("/mcp", mcp).layer(middleware::from_fn_with_state(agent, stamp_revision))
}

async fn stamp_revision(State(agent): State<Agent>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if !response.headers().contains_key(REVISION_HEADER)
        && let Ok(value) = HeaderValue::from_str(agent.state().snapshot.revision().as_str())
    {
        response.headers_mut().insert(REVISION_HEADER, value);
    }
    response
}

/// Serves every door until `cancel`, then shuts down in order (see the module doc). The agent's
/// refresh task is spawned here and stopped last.
pub async fn serve(
    config: &ServeConfig,
    agent: Agent,
    listeners: Listeners,
    metrics: Arc<Registry>,
    chat: Router,
    grpc: ExtraDoor,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let agent_stop = CancellationToken::new();
    let agent_task = tokio::spawn(agent.clone().run(agent_stop.clone()));
    // Doors stop accepting on `cancel`; their in-flight work gets the grace period.
    let doors_stop = cancel.child_token();

    let http = http_router(agent.clone(), chat, doors_stop.clone(), config.allowed_hosts.clone());
    let http_server = axum::serve(listeners.http, http.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(doors_stop.clone().cancelled_owned());
    let admin = admin::router(agent.clone(), metrics);
    // The admin port keeps answering (readiness, metrics) until the other doors are done.
    let admin_stop = CancellationToken::new();
    let admin_server = axum::serve(listeners.admin, admin.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(admin_stop.clone().cancelled_owned());
    let admin_task = tokio::spawn(async move { admin_server.await });
    let grpc_server = grpc(listeners.grpc, doors_stop.clone());

    tracing::info!(
        http = %config.http_addr, grpc = %config.grpc_addr, admin = %config.admin_addr,
        profile = agent.profile(), "spearlet serving"
    );
    let doors = async {
        let (http, grpc) = tokio::join!(http_server, grpc_server);
        http.map_err(|e| ServeError::Server { door: "http", message: e.to_string() })?;
        grpc.map_err(|message| ServeError::Server { door: "grpc", message })
    };
    tokio::pin!(doors);
    let result = tokio::select! {
        result = &mut doors => result,
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
