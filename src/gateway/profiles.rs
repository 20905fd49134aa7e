//! One agent per McpProfile the gateway serves, made the first time a caller bound to it
//! arrives: the per-pod agent's core and `/mcp` door, unchanged, over the gateway's one registry
//! watch. So a caller and a pod with the same profile get the same effective set from the same
//! code (`policy::effective`), with the same budgets, approvals and audit.
//!
//! - Each agent has its own pool (its own connections to the servers): the pool follows its
//!   profile's servers, and two profiles' sessions with one server stay apart.
//! - The gateway reads no `SPEAR_SECRET_*` variable and has no sidecar: a profile's stdio servers
//!   and servers whose headers come from Secrets are reported unavailable, never served with
//!   something else (`docs/gateway.md`).
//! - Profiles are only made for a bound caller, so their number is bounded by the bindings the
//!   platform team wrote; a profile no binding names any more has its agent stopped
//!   ([`ProfileDoors::retain`], on every change of the bindings).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::agent::audit::AuditSink;
use crate::agent::core::{Agent, AgentOptions};
use crate::agent::doors::chat::ChatService;
use crate::agent::serve::{AgentConfig, doors_router};
use crate::chat::UpstreamTimeouts;
use crate::mcp::config::Mode;
use crate::mcp::{Pool, PoolOptions};
use crate::registry::view::RegistryView;
use crate::telemetry::{PoolMetrics, RegistryMetrics};

/// How long a request waits for a new profile's agent to list its servers' tools the first time.
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// One profile's agent and its doors.
#[derive(Clone, Debug)]
pub struct ProfileDoor {
    pub agent: Agent,
    pub router: Router,
    /// Stops this profile's agent and door (its sessions end).
    stop: CancellationToken,
}

/// What every profile's agent shares.
#[derive(Debug)]
pub struct Shared {
    pub config: AgentConfig,
    pub registry: Arc<dyn RegistryView>,
    pub audit: AuditSink,
    pub pool_metrics: PoolMetrics,
    pub registry_metrics: RegistryMetrics,
    pub egress: crate::egress::AddressDenyList,
    pub kube: crate::agent::approvers::KubeClient,
    pub namespace: String,
    /// Stops every agent and door.
    pub stop: CancellationToken,
}

/// The profiles' agents, by profile name.
#[derive(Debug)]
pub struct ProfileDoors {
    shared: Shared,
    /// `mcp_gateway_profiles_served`.
    served: prometheus_client::metrics::gauge::Gauge,
    doors: Mutex<HashMap<String, ProfileDoor>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl ProfileDoors {
    pub fn new(shared: Shared, served: prometheus_client::metrics::gauge::Gauge) -> Self {
        ProfileDoors { shared, served, doors: Mutex::default(), tasks: Mutex::default() }
    }

    /// The doors of `profile`, made (and its agent started) on first use; waits up to
    /// [`FIRST_LIST_WAIT`] for a new agent's first tool lists.
    pub async fn get(&self, profile: &str) -> ProfileDoor {
        let (door, new) = {
            let mut doors = self.doors.lock();
            match doors.get(profile) {
                Some(door) => (door.clone(), false),
                None => {
                    let door = self.make(profile);
                    doors.insert(profile.to_string(), door.clone());
                    self.served.set(doors.len() as i64);
                    (door, true)
                }
            }
        };
        if new {
            tracing::info!(profile, "gateway: serving a profile for its first caller");
        }
        // Every request checks, not only the first (the first caller's wait may have timed out),
        // but only a request to an agent still starting waits (and sets a timer).
        if !door.agent.state().is_settled() {
            let _ = tokio::time::timeout(FIRST_LIST_WAIT, door.agent.settled()).await;
        }
        door
    }

    fn make(&self, profile: &str) -> ProfileDoor {
        let shared = &self.shared;
        let config = &shared.config;
        let pool = Pool::new(PoolOptions {
            mode: Mode::Sidecar {
                socket_dir: std::path::PathBuf::from(crate::api::keys::RUN_DIR),
                sidecars: Some(Default::default()),
                secret_refs: Some(Default::default()),
                peer_uids: Default::default(),
                destinations: None,
            },
            egress: shared.egress.clone(),
            tools_ttl: config.pool.tools_ttl,
            max_concurrent_calls: config.pool.max_concurrent_calls,
            max_children: config.pool.max_children,
            idle_timeout: config.pool.server_idle,
            check_arguments: config.pool.check_arguments,
            metrics: shared.pool_metrics.clone(),
            ..PoolOptions::default()
        });
        let mut options = AgentOptions::new(profile).in_cluster(shared.kube.0.clone(), shared.namespace.clone(), None);
        options.audit = shared.audit.handle();
        options.registry_metrics = shared.registry_metrics.clone();
        options.pool_metrics = shared.pool_metrics.clone();
        options.egress = shared.egress.clone();
        let agent = Agent::new(options, shared.registry.clone(), pool);
        let stop = shared.stop.child_token();
        self.tasks.lock().push(tokio::spawn(agent.clone().run(stop.clone())));
        let chat = ChatService::new(agent.clone(), config.upstream.clone(), UpstreamTimeouts::default());
        let router = match chat {
            Ok(chat) => doors_router(agent.clone(), chat, stop.clone(), config),
            // The chat door is not served by the gateway (the front routes only /mcp); a chat
            // client that cannot be built only costs that door.
            Err(e) => {
                tracing::warn!(profile, error = %e, "gateway: no chat client for this profile");
                Router::new()
            }
        };
        ProfileDoor { agent, router, stop }
    }

    /// Stops the agents of the profiles no binding names any more (`bound`): their server
    /// sessions and their callers' sessions end. A caller bound again later gets a fresh agent.
    pub fn retain(&self, bound: &std::collections::BTreeSet<String>) {
        let mut doors = self.doors.lock();
        doors.retain(|profile, door| {
            let keep = bound.contains(profile);
            if !keep {
                tracing::info!(profile, "gateway: no binding names this profile any more; its agent stops");
                door.stop.cancel();
            }
            keep
        });
        self.served.set(doors.len() as i64);
    }

    /// Stops every agent (sessions closed) and waits for them; then drops them, so the audit
    /// writer's other handles are gone before the gateway's own sink is dropped.
    pub async fn shutdown(&self) {
        self.shared.stop.cancel();
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for task in tasks {
            let _ = task.await;
        }
        for door in self.doors.lock().values() {
            door.agent.flush_audit();
        }
        self.doors.lock().clear();
    }

    /// The shared audit sink (flushed last).
    pub fn audit(&self) -> &AuditSink {
        &self.shared.audit
    }
}
