//! `spearlet gateway`: one shared agent for callers without an injected one.
//!
//! ```text
//! kube::Client ─▶ registry watch of the namespace (every McpProfile, every McpServer)
//!             └─▶ McpProfileBinding watch
//! wait for both first lists (the admin port answers /healthz meanwhile, /readyz 503)
//! authorization servers: --authorization-server, else the API server's service-account issuer
//! serve: 4040 = front (metadata + /mcp) ─▶ per-profile agents   4042 = admin
//! cancel ─▶ stop accepting ─▶ in-flight requests finish (≤ grace) ─▶ agents stopped ─▶ audit
//!        flushed ─▶ admin stops
//! ```

use std::ffi::OsString;
use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::bindings;
use super::front::{Front, FrontParts};
use super::profiles::{ProfileDoors, Shared};
use super::session_seal::SessionSeal;
use super::token_review::TokenReviewer;
use crate::agent::http_guard::{self, Allowed};
use crate::agent::run::{client_config, open_audit};
use crate::agent::{AgentConfig, RunError};
use crate::egress::AddressDenyList;
use crate::registry::kube::{KubeSource, WatchOptions};
use crate::telemetry::{PoolMetrics, RegistryMetrics};

/// The audience a caller's token must carry by default.
pub const DEFAULT_AUDIENCE: &str = "spear-mcp-gateway";

/// `spearlet gateway`'s configuration.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// The namespace whose registry and bindings are served; `None`: the client configuration's.
    pub namespace: Option<String>,
    pub kubeconfig: Option<OsString>,
    /// The audience callers' tokens must have.
    pub audience: String,
    /// The authorization servers the metadata names; empty: the API server's issuer.
    pub authorization_servers: Vec<String>,
    /// The URL callers reach the gateway at; `None`: `http://<Host>`.
    pub public_url: Option<String>,
    /// The doors' settings (`http_addr` is the gateway's port, `admin_addr` its admin port).
    pub agent: AgentConfig,
}

/// Runs the gateway until `cancel`, or until the registry watch dies.
pub async fn run_gateway(config: GatewayConfig, cancel: CancellationToken) -> Result<(), RunError> {
    crate::install_crypto_provider();
    let agent = &config.agent;
    let bind = |flag: &'static str, addr: SocketAddr| async move {
        TcpListener::bind(addr).await.map_err(|source| crate::agent::serve::ServeError::Bind { flag, addr, source })
    };
    let http = bind("--http-addr", agent.http_addr).await?;
    let admin = bind("--admin-addr", agent.admin_addr).await?;
    let client_config = client_config(config.kubeconfig.clone()).await.map_err(RunError::Config)?;
    let namespace =
        config.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| client_config.default_namespace.clone());
    let client = crate::kube_client::client(client_config)
        .map_err(|e| RunError::Config(format!("cannot build a Kubernetes client from the configuration: {e}")))?;
    let stop = CancellationToken::new();
    let mut registry = KubeSource::watch_namespace(client.clone(), &namespace, &stop, WatchOptions::default())
        .map_err(|e| RunError::Config(format!("--namespace: {e}")))?;
    let bindings = bindings::watch(client.clone(), &namespace, stop.clone());

    // Ready once both first lists are in (the doors serve from then on), and while they last.
    let serving = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ready = {
        let (serving, bindings) = (serving.clone(), bindings.clone());
        move || -> Result<String, String> {
            if !serving.load(std::sync::atomic::Ordering::Relaxed) {
                return Err("waiting for the first lists of the registry and the McpProfileBindings".into());
            }
            Ok(format!("{} valid McpProfileBindings\n", bindings.borrow().valid.len()))
        }
    };
    let audit = open_audit(agent)?;
    let GatewayMetrics { registry: metrics, pool_metrics, registry_metrics, served, outcomes } =
        GatewayMetrics::register(&audit);
    let (admin_stop, admin_task) = serve_admin(agent, admin, ready, Arc::new(metrics));

    tracing::info!(%namespace, "gateway: waiting for the first lists of the registry and the McpProfileBindings");
    let first_lists = async {
        registry.ready().await?;
        let mut bindings = bindings.clone();
        let _ = bindings.wait_for(|b| b.listed).await;
        Ok::<(), crate::registry::kube::Error>(())
    };
    tokio::select! {
        () = cancel.cancelled() => {
            admin_stop.cancel();
            let _ = admin_task.await;
            return Ok(());
        }
        listed = first_lists => listed?,
    }
    let authorization_servers = match config.authorization_servers.as_slice() {
        [] => vec![issuer(&client).await?],
        given => given.to_vec(),
    };
    let egress = match &agent.egress {
        Some(egress) => egress.clone(),
        None => {
            AddressDenyList::AGENT_POD.parse().map_err(|e| RunError::Config(format!("--egress-deny-cidrs: {e}")))?
        }
    };
    let profiles = Arc::new(ProfileDoors::new(
        Shared {
            config: agent.clone(),
            registry: registry.view(),
            audit,
            pool_metrics,
            registry_metrics,
            egress,
            kube: crate::agent::approvers::KubeClient(client.clone()),
            namespace: namespace.clone(),
            stop: stop.child_token(),
        },
        served,
    ));
    tokio::spawn(retain_bound_profiles(bindings.clone(), profiles.clone(), stop.clone()));
    let seal = SessionSeal::random().map_err(|e| RunError::Config(format!("no randomness for session ids: {e}")))?;
    let front = Front::new(FrontParts {
        reviewer: TokenReviewer::new(client, &config.audience),
        bindings,
        profiles: profiles.clone(),
        seal,
        namespace: namespace.clone(),
        public_url: config.public_url.clone(),
        authorization_servers,
        outcomes,
    });
    let router = front.router(Allowed::new(agent.allowed_hosts.clone(), agent.allowed_origins.clone()));
    serving.store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(http = %agent.http_addr, admin = %agent.admin_addr, %namespace, audience = %config.audience, "spearlet gateway serving");
    let result = serve(agent, http, router, &mut registry, &cancel).await;
    profiles.shutdown().await;
    stop.cancel();
    profiles.audit().flush();
    drop(profiles);
    admin_stop.cancel();
    let _ = admin_task.await;
    tracing::info!("spearlet gateway stopped");
    result
}

/// The gateway's metrics: the agents' (pool, registry, audit, log drops) and its own.
struct GatewayMetrics {
    registry: Registry,
    pool_metrics: PoolMetrics,
    registry_metrics: RegistryMetrics,
    served: prometheus_client::metrics::gauge::Gauge,
    outcomes: prometheus_client::metrics::family::Family<
        super::front::OutcomeLabel,
        prometheus_client::metrics::counter::Counter,
    >,
}

impl GatewayMetrics {
    fn register(audit: &crate::agent::audit::AuditSink) -> Self {
        let mut registry = Registry::default();
        let pool_metrics = PoolMetrics::register(&mut registry);
        let registry_metrics = RegistryMetrics::register(&mut registry);
        audit.register(&mut registry);
        crate::telemetry::register_log_drops(&mut registry);
        let served = prometheus_client::metrics::gauge::Gauge::default();
        registry.register("mcp_gateway_profiles_served", "McpProfiles the gateway runs an agent for", served.clone());
        let outcomes = prometheus_client::metrics::family::Family::default();
        registry.register(
            "mcp_gateway_requests",
            "Gateway /mcp requests by how the front answered (admitted, unauthenticated, forbidden, \
             unknown_session, bad_request, unavailable)",
            outcomes.clone(),
        );
        GatewayMetrics { registry, pool_metrics, registry_metrics, served, outcomes }
    }
}

/// On every change of the bindings, stops the agents of profiles no binding names any more.
async fn retain_bound_profiles(
    mut bindings: tokio::sync::watch::Receiver<bindings::Bindings>,
    profiles: Arc<ProfileDoors>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            changed = bindings.changed() => if changed.is_err() { return },
        }
        let bound = bindings.borrow().valid.iter().map(|b| b.spec.profile_ref.name.clone()).collect();
        profiles.retain(&bound);
    }
}

/// The admin port (`/healthz`, `/readyz`, `/metrics`) until the returned token is cancelled.
fn serve_admin<R>(
    agent: &AgentConfig,
    listener: TcpListener,
    ready: R,
    metrics: Arc<Registry>,
) -> (CancellationToken, tokio::task::JoinHandle<()>)
where
    R: Fn() -> Result<String, String> + Clone + Send + Sync + 'static,
{
    let guard = Allowed::admin(agent.allowed_hosts.clone(), agent.allowed_origins.clone());
    let router = crate::telemetry::admin_router(ready, metrics)
        .layer(axum::middleware::from_fn_with_state(guard, http_guard::guard));
    let stop = CancellationToken::new();
    let task = tokio::spawn(crate::http_server::serve(listener, router, agent.connection_limits, stop.clone()));
    (stop, task)
}

/// Serves `router` until `cancel` (then in-flight requests get the grace period), or until the
/// registry watch dies (an error: never serve a registry nobody updates).
async fn serve(
    agent: &AgentConfig,
    http: TcpListener,
    router: axum::Router,
    registry: &mut crate::registry::kube::KubeWatch,
    cancel: &CancellationToken,
) -> Result<(), RunError> {
    let serving = crate::http_server::serve(http, router, agent.connection_limits, cancel.child_token());
    tokio::pin!(serving);
    tokio::select! {
        biased;
        () = cancel.cancelled() => {
            tracing::info!(grace = ?agent.shutdown_grace, "shutting down: finishing in-flight requests");
            if tokio::time::timeout(agent.shutdown_grace, &mut serving).await.is_err() {
                tracing::warn!("in-flight requests did not finish within the grace period; closing");
            }
            Ok(())
        }
        () = &mut serving => Ok(()),
        watch = registry.finished() => {
            let reason = match watch { Ok(()) => "the registry watch stopped".to_string(), Err(e) => e.to_string() };
            tracing::error!(%reason, "a critical task ended; shutting down");
            Err(RunError::Critical(reason))
        }
    }
}

/// The service-account issuer of the API server (`/.well-known/openid-configuration`), the
/// authorization server of the tokens the gateway takes by default.
async fn issuer(client: &kube::Client) -> Result<String, RunError> {
    let request = axum::http::Request::get("/.well-known/openid-configuration")
        .body(Vec::new())
        .map_err(|e| RunError::Config(e.to_string()))?;
    let document: serde_json::Value = client.request(request).await.map_err(|e| {
        RunError::Config(format!(
            "--authorization-server is not set and the API server's issuer could not be read \
             (/.well-known/openid-configuration: {e}); set the flag to the issuer of your callers' tokens"
        ))
    })?;
    document.get("issuer").and_then(serde_json::Value::as_str).map(str::to_string).ok_or_else(|| {
        RunError::Config("the API server's openid-configuration names no issuer; set --authorization-server".into())
    })
}
