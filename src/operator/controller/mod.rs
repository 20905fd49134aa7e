//! The controllers of `spear-operator`: McpServer and McpProfile status, and the agent's
//! RoleBinding in every injection-enabled namespace. Thin I/O: what to write is decided by
//! [`status`](super::status), [`probe`](super::probe) and [`rbac`](super::rbac).
//!
//! ```text
//! Elector (leader.rs) ── only the Lease holder runs what follows; a lost Lease drains it ──┐
//! McpServer watch ─▶ Controller ─▶ reconcile_server: probe when due (probe.rs) ─▶ server_status
//! McpServer reflector (store) ─each event─▶ the profiles it may affect ─┐        │
//! McpProfile watch ─▶ Controller ◀─reconcile_on─────────────────────────┘        │
//!                       └─▶ reconcile_profile: profile_status over the store ────┤
//!                                       status differs from the stored one? ─────┴─▶ SSA /status
//!                                       Accepted turned False? ─▶ Warning Event (events.k8s.io)
//! managed RoleBinding reflector (store) ─each event─▶ its namespace ─┐
//! Namespace watch ─▶ Controller ◀─reconcile_on────────────────────────┘
//!      └─▶ labelled: agent ClusterRole (once per term) + RoleBinding when not current (SSA),
//!                    and the operator's own Secret reader RoleBinding (SSA)
//!          not labelled: delete the RoleBindings we manage there
//! ```
//!
//! `server.rs`, `profile.rs` and `namespace.rs` hold one controller each; `context.rs` what their
//! reconciles share. One field manager, status only, written only when it changed; a profile
//! reads a cache that has already seen its trigger. Why: `src/operator/README.md`, "Controllers".

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{RoleBinding, Subject};
use kube::Client;
use kube::runtime::controller::Config as RunConfig;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use tokio_util::sync::CancellationToken;

use self::context::{CacheReady, Context, Feeds};
use self::namespace::namespace_controller;
use self::profile::profile_controller;
use self::server::server_controller;
use super::leader::{Elector, LeaderConfig};
use super::probe::ProbeConfig;
use super::scope::Scope;
use crate::api::McpServer;
use crate::api::identity::ForbiddenAudiences;
use crate::api::keys::FIELD_MANAGER;

mod approvals;
mod context;
mod metrics;
mod namespace;
mod profile;
mod profile_index;
mod server;

pub use context::Error;
pub use metrics::ControllerMetrics;

/// Objects the server cache may run ahead of the server controller before it waits for it.
const SHARED_SERVER_BUFFER: usize = 1024;

/// Reconciles of one kind running at once (and so probes in flight): enough to probe many
/// slow servers in parallel, few enough not to flood the API server after a re-list.
pub(crate) const DEFAULT_CONCURRENCY: u16 = 16;

// === config ===

/// Everything [`run`] needs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Which namespaces to watch.
    pub(crate) scope: Scope,
    /// When and how http servers are probed.
    pub probe: ProbeConfig,
    /// Leader election; `None` runs the controllers at once (a single replica, or tests).
    pub leader: Option<LeaderConfig>,
    /// `reportingInstance` of Events (the pod name, or the leader identity).
    pub instance: String,
    /// Reconciles of one kind at once.
    pub(crate) concurrency: u16,
    /// Counters and the leader/ready gauges; clones share them.
    pub metrics: ControllerMetrics,
    /// Token audiences an identity grant's `*` does not cover: a profile's `ResolvedRefs` reports
    /// the servers asking for them as the webhook does.
    pub forbidden_audiences: ForbiddenAudiences,
    /// Who the operator is, as an RBAC subject, for the Secret reader RoleBinding it keeps in
    /// each injection-enabled namespace; `None`: asked of the API server (a SelfSubjectReview)
    /// at the start of each term.
    pub operator_subject: Option<Subject>,
}

impl ControllerConfig {
    /// A config for `scope` with default probing, no leader election and unregistered metrics.
    pub fn new(scope: Scope) -> Self {
        ControllerConfig {
            scope,
            probe: ProbeConfig::default(),
            leader: None,
            instance: FIELD_MANAGER.to_string(),
            concurrency: DEFAULT_CONCURRENCY,
            metrics: ControllerMetrics::default(),
            forbidden_audiences: ForbiddenAudiences::default(),
            operator_subject: None,
        }
    }
}

// === run ===

/// Runs the controllers until `shutdown` is cancelled. With leader election, they run only
/// while this replica holds the Lease (and drain when it is lost); the Lease is released at
/// shutdown so a standby takes it at its next check. Errors only when leader election fails.
pub async fn run(client: Client, config: ControllerConfig, shutdown: CancellationToken) -> Result<(), Error> {
    let Some(leader) = config.leader.clone() else {
        config.metrics.ready.set(1);
        config.metrics.leader.set(1);
        run_term(client, &config, shutdown).await;
        config.metrics.leader.set(0);
        config.metrics.ready.set(0);
        return Ok(());
    };
    let mut elector = tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        elector = Elector::start(client.clone(), leader) => elector?,
    };
    config.metrics.ready.set(1);
    let result = lead_while_elected(&client, &config, &mut elector, &shutdown).await;
    config.metrics.ready.set(0);
    elector.release().await;
    result
}

/// Waits for the Lease, runs a term, and again, until shutdown or an election error.
async fn lead_while_elected(
    client: &Client,
    config: &ControllerConfig,
    elector: &mut Elector,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            acquired = elector.acquired() => acquired?,
        }
        tracing::info!(identity = %elector.identity(), "leading: starting the controllers");
        config.metrics.leader.set(1);
        let term = shutdown.child_token();
        let controllers = run_term(client.clone(), config, term.clone());
        tokio::pin!(controllers);
        // `None`: the controllers ended by themselves, which only a shutdown makes them do.
        let lost = tokio::select! {
            () = &mut controllers => None,
            lost = elector.lost() => {
                term.cancel();
                controllers.await;
                Some(lost)
            }
        };
        config.metrics.leader.set(0);
        if shutdown.is_cancelled() {
            return Ok(());
        }
        match lost {
            Some(lost) => {
                lost?;
                tracing::warn!(identity = %elector.identity(), "lost the leader Lease: controllers stopped, waiting to lead again");
            }
            None => tracing::warn!("the controllers stopped without a shutdown; starting them again"),
        }
    }
}

/// The controllers of one term of leadership, until `token` is cancelled; they drain (finish
/// running reconciles) before this returns.
async fn run_term(client: Client, config: &ControllerConfig, token: CancellationToken) {
    let run_config = RunConfig::default().concurrency(config.concurrency);
    let subject = match &config.operator_subject {
        Some(subject) => Some(subject.clone()),
        None => namespace::own_subject(&client).await,
    };
    let (ctx, feeds) = Context::new(&client, config, subject);
    let scope = &config.scope;
    let (namespace_cache, server_controller) =
        server_controller(&client, scope, run_config.clone(), &ctx, feeds.server_events, feeds.namespaces, &token);
    let (server_cache, profile_coalescer, profile_controller) =
        profile_controller(&client, scope, run_config.clone(), &ctx, feeds.servers, &token);
    let (binding_cache, namespace_controller) =
        namespace_controller(&client, scope, run_config, &ctx, feeds.bindings, &token);
    let approvals = approvals::sweep_approvals(client.clone(), scope.clone(), token.clone());
    tokio::join!(
        approvals,
        server_controller,
        server_cache,
        profile_coalescer,
        namespace_cache,
        profile_controller,
        binding_cache,
        namespace_controller
    );
}

// === impl Context ===

impl Context {
    /// The context of one term, and the writing ends of the caches it reads.
    fn new(client: &Client, config: &ControllerConfig, operator_subject: Option<Subject>) -> (Arc<Context>, Feeds) {
        let reporter = Reporter { controller: FIELD_MANAGER.to_string(), instance: Some(config.instance.clone()) };
        let (servers, server_writer) = reflector::store_shared::<McpServer>(SHARED_SERVER_BUFFER);
        #[allow(clippy::expect_used, reason = "a shared store's writer always subscribes")]
        let server_events = server_writer.subscribe().expect("a shared store's writer subscribes");
        let (bindings, binding_writer) = reflector::store::<RoleBinding>();
        let (namespaces, namespace_writer) = reflector::store::<Namespace>();
        let (servers_ready, server_cache_ready) = CacheReady::new();
        let (bindings_ready, binding_cache_ready) = CacheReady::new();
        let (namespaces_ready, namespace_cache_ready) = CacheReady::new();
        let ctx = Arc::new(Context {
            client: client.clone(),
            recorder: Recorder::new(client.clone(), reporter),
            servers,
            servers_ready,
            bindings,
            bindings_ready,
            namespaces,
            namespaces_ready,
            probe: config.probe.clone(),
            metrics: config.metrics.clone(),
            forbidden_audiences: config.forbidden_audiences.clone(),
            operator_subject,
            agent_role_checked: AtomicBool::new(false),
            profile_index: parking_lot::Mutex::default(),
        });
        let feeds = Feeds {
            servers: (server_writer, server_cache_ready),
            server_events,
            bindings: (binding_writer, binding_cache_ready),
            namespaces: (namespace_writer, namespace_cache_ready),
        };
        (ctx, feeds)
    }
}
