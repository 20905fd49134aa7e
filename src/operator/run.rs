//! `spear-operator run` as a library call: the controllers (leader only), the webhook (every
//! replica) and the admin server, until `shutdown` or until one of them stops.
//!
//! ```text
//! kube::Client ─┬─ admin server (/healthz, /readyz, /metrics)            every replica
//!               ├─ webhook (certificate: self-signed + rotated, or files)  every replica
//!               ├─ admin view (read-only page, --admin-view-addr; off by default) every replica
//!               └─ controllers (status, probes, agent RoleBindings)        the Lease holder
//! shutdown or any of the three ending ─▶ cancel all ─▶ each gets SHUTDOWN_GRACE
//! ```
//!
//! The webhook serves on every replica, not only the leader: admission must not wait for an
//! election.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::admin_view::{self, AdminViewConfig, AdminViewError};
use super::controller::{self, ControllerConfig, ControllerMetrics};
use super::inject::InjectConfig;
use super::leader::{self, LeaderConfig};
use super::probe::ProbeConfig;
use super::scope::Scope;
use super::webhook::certs::{CertSource, Files, SelfSigned};
use super::webhook::client_auth::ClientAuth;
use super::webhook::rate_limit::RateLimit;
use super::webhook::{self, NativeSidecars, WebhookConfig, WebhookError, WebhookMetrics};
use crate::api::identity::ForbiddenAudiences;

/// Time the controllers get to finish running reconciles and release the Lease after SIGTERM
/// (Kubernetes' default termination grace period is 30 s).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// Where the webhook's serving certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CertMode {
    /// The operator's own CA and certificate, kept in a Secret and rotated; the operator keeps
    /// the named MutatingWebhookConfiguration's `caBundle` current.
    SelfSigned { webhook_config_name: String },
    /// `tls.crt` and `tls.key` from a directory (for example a cert-manager Secret volume).
    Files { dir: PathBuf },
}

/// The plain form of `spear-operator run`'s flags.
#[derive(Clone, Debug)]
pub(crate) struct OperatorConfig {
    /// The operator's own namespace (its Lease and webhook Secret); `None`: the client's.
    pub(crate) namespace: Option<String>,
    /// Watch this namespace only (a namespaced install); `None`: the whole cluster.
    pub(crate) watch_namespace: Option<String>,
    pub(crate) metrics_addr: SocketAddr,
    pub(crate) leader_election: bool,
    pub(crate) lease_name: String,
    /// When, where and how http McpServers are probed.
    pub(crate) probe: ProbeConfig,
    pub(crate) webhook_addr: SocketAddr,
    /// The webhook's Service; the certificate is issued for `<service>.<namespace>.svc`.
    pub(crate) webhook_service_name: String,
    pub(crate) cert: CertMode,
    pub(crate) agent_image: String,
    pub(crate) spearlet_image: String,
    pub(crate) native_sidecars: NativeSidecars,
    /// `--webhook-client-ca-file` and `--webhook-client-names`.
    pub(crate) webhook_client_auth: Option<ClientAuth>,
    /// `--webhook-rate-limit-per-second` and `--webhook-rate-limit-burst`.
    pub(crate) webhook_rate_limit: RateLimit,
    /// `--admin-view-addr` and `--admin-view-allowed-hosts`; `None`: no admin view.
    pub(crate) admin_view: Option<AdminViewSettings>,
    /// `--forbidden-token-audiences`; [`run`] adds the cluster's issuer when it can read it.
    pub(crate) forbidden_audiences: ForbiddenAudiences,
    /// `--agent-egress-deny-cidrs`, given to every injected agent.
    pub(crate) agent_egress: crate::egress::AddressDenyList,
    /// The injected agents' pool limits, as their environment.
    pub(crate) agent_pool: Vec<(String, String)>,
}

/// Where the admin view listens and which `Host` names it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AdminViewSettings {
    pub(crate) addr: SocketAddr,
    pub(crate) allowed_hosts: Vec<String>,
}

impl OperatorConfig {
    /// Where the controllers, the webhook's caches and the admin view watch.
    fn scope(&self) -> Scope {
        self.watch_namespace.clone().map_or(Scope::Cluster, Scope::Namespace)
    }

    /// The controllers' config; `namespace` holds the Lease, `identity` names this replica.
    fn controller_config(&self, namespace: &str, identity: String, metrics: ControllerMetrics) -> ControllerConfig {
        ControllerConfig {
            scope: self.scope(),
            probe: self.probe.clone(),
            leader: self
                .leader_election
                .then(|| LeaderConfig::new(self.lease_name.clone(), namespace, identity.as_str())),
            instance: identity,
            concurrency: controller::DEFAULT_CONCURRENCY,
            metrics,
            forbidden_audiences: self.forbidden_audiences.clone(),
            operator_subject: None,
        }
    }

    /// The webhook's config: its certificate (issued for the Service in `namespace`, or from
    /// files), what it injects, who may call it and how often.
    fn webhook_config(&self, namespace: &str, metrics: WebhookMetrics) -> WebhookConfig {
        let cert = match &self.cert {
            CertMode::SelfSigned { webhook_config_name } => {
                let mut self_signed = SelfSigned::new(namespace, self.webhook_service_name.as_str());
                self_signed.webhook_config_name = Some(webhook_config_name.clone());
                CertSource::SelfSigned(self_signed)
            }
            CertMode::Files { dir } => CertSource::Files(Files::new(dir.clone())),
        };
        // Injected agents export traces where the operator does (its OTEL_* settings).
        let mut agent_env = crate::telemetry::otel::agent_env(std::env::vars());
        agent_env.push((crate::api::keys::ENV_EGRESS_DENY_CIDRS.to_string(), self.agent_egress.to_string()));
        agent_env.extend(self.agent_pool.iter().cloned());
        let inject_config = InjectConfig {
            agent_env,
            forbidden_audiences: self.forbidden_audiences.clone(),
            extra_ca_pem: crate::trust::pem(),
            ..InjectConfig::new(self.agent_image.clone(), self.spearlet_image.clone())
        };
        let mut webhook_config = WebhookConfig::new(self.webhook_addr, inject_config, self.native_sidecars, cert);
        webhook_config.metrics = metrics;
        webhook_config.client_auth = self.webhook_client_auth.clone();
        webhook_config.rate_limit = self.webhook_rate_limit;
        webhook_config.cache_scope = self.scope();
        webhook_config
    }
}

/// Runs the operator until `shutdown`; an error when a part stops on its own.
pub(crate) async fn run(mut config: OperatorConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    crate::install_crypto_provider();
    let client = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)
        .and_then(crate::kube_client::client)
        .context("connecting to the Kubernetes API (in-cluster service account, or KUBECONFIG)")?;
    let namespace = config.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    // The issuer is the API server's default audience (`--api-audiences`): a token for it is an
    // API credential. An empty --forbidden-token-audiences means none is forbidden, not even it.
    if !config.forbidden_audiences.patterns().is_empty() {
        match cluster_issuer(&client).await {
            Some(issuer) => {
                tracing::info!(%issuer, "the cluster's service-account issuer is a forbidden token audience");
                config.forbidden_audiences = config.forbidden_audiences.clone().with(issuer);
            }
            None => tracing::info!(
                "could not read the cluster's service-account issuer (/.well-known/openid-configuration); forbidden token audiences are --forbidden-token-audiences alone"
            ),
        }
    }

    let mut registry = Registry::default();
    crate::telemetry::register_log_drops(&mut registry);
    let metrics = ControllerMetrics::register(registry.sub_registry_with_prefix("spear_operator"));
    let webhook_metrics = WebhookMetrics::register(registry.sub_registry_with_prefix("spear_operator_webhook"));
    let identity = leader::default_identity();
    let admin_view_config = config.admin_view.clone().map(|view| AdminViewConfig {
        addr: view.addr,
        allowed_hosts: view.allowed_hosts,
        scope: config.scope(),
        identity: identity.clone(),
        leader: metrics.clone(),
    });
    let controller_config = config.controller_config(&namespace, identity, metrics.clone());
    tracing::info!(%namespace, scope = ?controller_config.scope, leader_election = config.leader_election, "spear-operator starting");

    let admin = spawn_admin(config.metrics_addr, registry, metrics, shutdown.clone()).await?;
    let webhook_config = config.webhook_config(&namespace, webhook_metrics);
    let webhook = tokio::spawn(webhook::serve(client.clone(), webhook_config, shutdown.clone()));
    let view = admin_view_config.map(|view| tokio::spawn(admin_view::serve(client.clone(), view, shutdown.clone())));
    let controllers = tokio::spawn(controller::run(client, controller_config, shutdown.clone()));
    let mut tasks = Tasks { admin, webhook, view, controllers };
    let outcome = tasks.first_to_stop(&shutdown).await;
    shutdown.cancel();
    tasks.drain().await;
    if let Err(e) = &outcome {
        tracing::error!(error = format!("{e:#}"), "spear-operator stopped");
    }
    outcome
}

/// How long the issuer discovery at start may take: it only adds to a deny list.
const ISSUER_TIMEOUT: Duration = Duration::from_secs(5);

/// The `issuer` of the API server's OIDC discovery document (readable by every ServiceAccount
/// through the default `system:service-account-issuer-discovery` binding); `None` when it
/// cannot be read.
async fn cluster_issuer(client: &kube::Client) -> Option<String> {
    let request =
        kube::core::Request::new("/.well-known").get("openid-configuration", &kube::api::GetParams::default()).ok()?;
    let document: serde_json::Value = tokio::time::timeout(ISSUER_TIMEOUT, client.request(request)).await.ok()?.ok()?;
    document.get("issuer")?.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// Binds the admin server on `addr` (`/healthz`; `/readyz`, ready once leader election runs;
/// `/metrics` from `registry`) and serves it until `shutdown`.
async fn spawn_admin(
    addr: SocketAddr,
    registry: Registry,
    ready: ControllerMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the admin server on {addr} (is --metrics-addr free?)"))?;
    let admin_router = crate::telemetry::admin_router(
        move || if ready.is_ready() { Ok(String::new()) } else { Err("leader election has not started".to_string()) },
        Arc::new(registry),
    );
    let limits = crate::http_server::ConnectionLimits::default();
    Ok(tokio::spawn(crate::http_server::serve(listener, admin_router, limits, shutdown)))
}

/// The parts of a running operator; each ends on the shutdown signal.
struct Tasks {
    admin: JoinHandle<()>,
    webhook: JoinHandle<Result<(), WebhookError>>,
    view: Option<JoinHandle<Result<(), AdminViewError>>>,
    controllers: JoinHandle<Result<(), controller::Error>>,
}

impl Tasks {
    /// Waits for the shutdown signal or for a part to stop on its own (an error).
    async fn first_to_stop(&mut self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let view = self.view.as_mut();
        let view_ended = async move {
            match view {
                Some(task) => task.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // Shutdown first: every task ends on it too, and a task that ended because of the signal
            // must not be reported as a task that stopped on its own (exit 1 on a clean SIGTERM).
            biased;
            () = shutdown.cancelled() => {
                tracing::info!("shutdown signal: draining");
                Ok(())
            }
            result = &mut self.controllers => Err(match result {
                Ok(Ok(())) => anyhow::anyhow!("the controllers stopped unexpectedly"),
                Ok(Err(e)) => anyhow::Error::new(e).context("the controllers stopped"),
                Err(e) => anyhow::Error::new(e).context("the controller task panicked"),
            }),
            result = &mut self.webhook => Err(match result {
                Ok(Ok(())) => anyhow::anyhow!("the webhook server stopped unexpectedly"),
                Ok(Err(e)) => anyhow::Error::new(e).context("the webhook server failed"),
                Err(e) => anyhow::Error::new(e).context("the webhook task panicked"),
            }),
            result = view_ended => Err(match result {
                Ok(Ok(())) => anyhow::anyhow!("the admin view stopped unexpectedly"),
                Ok(Err(e)) => anyhow::Error::new(e).context("the admin view failed"),
                Err(e) => anyhow::Error::new(e).context("the admin view task panicked"),
            }),
            result = &mut self.admin => Err(match result {
                Ok(()) => anyhow::anyhow!("the admin server stopped unexpectedly"),
                Err(e) => anyhow::Error::new(e).context("the admin server task panicked"),
            }),
        }
    }

    /// After shutdown: gives each part still running SHUTDOWN_GRACE to finish.
    async fn drain(self) {
        let Tasks { admin, webhook, view, mut controllers } = self;
        // Bounded: the controllers finish running reconciles and release the Lease, so a standby
        // takes it at its next check.
        if !controllers.is_finished() && tokio::time::timeout(SHUTDOWN_GRACE, &mut controllers).await.is_err() {
            tracing::warn!("the controllers did not stop within {} s", SHUTDOWN_GRACE.as_secs());
        }
        if !webhook.is_finished() {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, webhook).await;
        }
        if let Some(task) = view.filter(|task| !task.is_finished()) {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, task).await;
        }
        if !admin.is_finished() {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, admin).await;
        }
    }
}
