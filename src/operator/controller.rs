//! The controllers of `spear-operator`: McpServer and McpProfile status, and the agent's
//! RoleBinding in every injection-enabled namespace. Thin I/O: what to write is decided by
//! [`status`](super::status), [`probe`] and [`rbac`](super::rbac).
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
//!      └─▶ labelled: agent ClusterRole (once per term) + RoleBinding when not current (SSA)
//!          not labelled: delete the RoleBinding we manage there
//! ```
//!
//! Why it is shaped this way:
//! - **One field manager, status only.** Every write is a server-side apply of the status
//!   subresource (or an RBAC object) under `spear-operator`, forced, and made only when the
//!   computed status differs from the stored one. `status.rs` returns an identical status when
//!   nothing changed, so a settled object sees no writes at all; spec is never sent.
//! - **Profiles read a cache that has seen the change.** A profile's status depends on every
//!   McpServer of its namespace. The profile controller is triggered (`reconcile_on`) by the
//!   same reflector whose store it reads, after the store applied the event, so a reconcile
//!   never computes from a cache older than its trigger. Deletions trigger too (a shared
//!   stream would drop them), and a re-list triggers every profile.
//! - **Scope.** [`Scope::Namespace`] limits every watch to one namespace, so tests (and a
//!   namespaced install) run their own controllers side by side without interfering.
//! - **Probes inside the reconcile.** The controller never runs two reconciles of one object
//!   at once, so a probe cannot race with itself; `concurrency` bounds probes in flight.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::{Selector, SelectorExt as _};
use kube::runtime::controller::{Action, Config as RunConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::leader::{Elector, LeaderConfig, LeaderError};
use super::probe::{self, ProbeConfig, Schedule};
use super::rbac::{agent_role_binding, binding_is_current};
use super::scope::{Scope, profile_servers_in};
use super::status::{ProbeOutcome, ProbeResult, fold_secret_refusals, known_tools, profile_status, server_status};
use crate::api::conditions::{reasons, types};
use crate::api::keys::{AGENT_ROLE, LABEL_MANAGED_BY};
use crate::api::keys::{API_VERSION, FIELD_MANAGER, INJECTION_ENABLED, KIND_PROFILE, KIND_SERVER, LABEL_INJECTION};
use crate::api::secret_grant::{SecretGrants, profile_secret_ref, server_secret_refs};
use crate::api::{McpProfile, McpServer, Validate};
use crate::telemetry::error_chain;

/// Reconciles of one kind running at once (and so probes in flight): enough to probe many
/// slow servers in parallel, few enough not to flood the API server after a re-list.
pub(crate) const DEFAULT_CONCURRENCY: u16 = 16;
/// How often an object that references Secrets re-reads their grants (metadata GETs).
const SECRET_RECHECK: Duration = Duration::from_secs(60);
/// Retry delay after a failed reconcile (an API error). Fixed: the API server's own
/// priority-and-fairness throttles a flood, and a status write is cheap to retry.
const ERROR_REQUEUE: Duration = Duration::from_secs(5);
/// Pending triggers from a reflector to a controller; a full buffer makes the reflector wait
/// (back-pressure), so nothing is dropped.
const TRIGGER_BUFFER: usize = 1024;
/// Longest note of an Event (the events.k8s.io limit is 1 kB).
const MAX_EVENT_NOTE_BYTES: usize = 1024;
/// Kind label of the namespace controller in metrics and logs.
const KIND_NAMESPACE: &str = "Namespace";

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
        }
    }
}

// === errors ===

/// Why a reconcile or the controller failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading a referenced Secret's metadata failed (RBAC: get on secrets).
    #[error("reading the metadata of Secret {namespace}/{name} failed")]
    ReadSecret {
        namespace: String,
        name: String,
        /// The API error (boxed: it is large, and errors are the rare path).
        #[source]
        source: Box<kube::Error>,
    },
    /// Writing a status failed (RBAC: patch on `<kind>s/status`).
    #[error("writing the status of {kind} {namespace}/{name} failed")]
    WriteStatus {
        kind: &'static str,
        namespace: String,
        name: String,
        /// The API error (boxed: it is large, and errors are the rare path).
        #[source]
        source: Box<kube::Error>,
    },
    /// Applying the agent's RoleBinding failed (RBAC: patch on rolebindings, bind on the role).
    #[error("applying RoleBinding {name} in namespace {namespace} failed")]
    ApplyRoleBinding {
        name: &'static str,
        namespace: String,
        /// The API error (boxed: it is large, and errors are the rare path).
        #[source]
        source: Box<kube::Error>,
    },
    /// Removing the agent's RoleBinding from a namespace that left injection failed.
    #[error("deleting RoleBinding {name} from namespace {namespace} failed")]
    DeleteRoleBinding {
        name: &'static str,
        namespace: String,
        /// The API error (boxed: it is large, and errors are the rare path).
        #[source]
        source: Box<kube::Error>,
    },
    /// An object from a watch lacks a name or namespace (the API server always sets both).
    #[error("a {kind} from the watch has no {field}")]
    MissingMetadata {
        kind: &'static str,
        /// `metadata.name` or `metadata.namespace`.
        field: &'static str,
    },
    /// A cache a reconcile reads stopped before its first list completed (only at shutdown).
    #[error("the {kind} cache stopped before its first list completed")]
    CacheStopped {
        /// Kind of the cache.
        kind: &'static str,
    },
    /// Leader election failed; this replica cannot know whether it may write.
    #[error(transparent)]
    Leader(#[from] LeaderError),
}

// === metrics ===

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    result: String,
}

/// The controllers' metrics. Cheap to clone; clones share the series. `Default` gives metrics
/// registered nowhere (tests read them through the getters).
#[derive(Clone, Debug, Default)]
pub struct ControllerMetrics {
    reconciles: Family<KindLabels, Counter>,
    errors: Family<KindLabels, Counter>,
    status_writes: Family<KindLabels, Counter>,
    rbac_writes: Family<KindLabels, Counter>,
    probes: Family<ProbeLabels, Counter>,
    leader: Gauge,
    ready: Gauge,
}

impl ControllerMetrics {
    /// Metrics registered on `registry` (give it a `spear_operator` prefix; counters get
    /// `_total` on the wire).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = ControllerMetrics::default();
        registry.register("reconcile", "Reconciles run, by kind", metrics.reconciles.clone());
        registry.register("reconcile_error", "Reconciles that failed, by kind", metrics.errors.clone());
        registry.register("status_write", "Status writes (server-side apply), by kind", metrics.status_writes.clone());
        registry.register("rbac_write", "RBAC objects applied or deleted, by kind", metrics.rbac_writes.clone());
        registry.register("probe", "Probes of http McpServers, by result", metrics.probes.clone());
        registry.register("leader", "1 while this replica holds the leader Lease", metrics.leader.clone());
        registry.register("ready", "1 while this replica is ready (leader or standby)", metrics.ready.clone());
        // Every known series from 0: a first failure then shows in rate() and increase() (a series
        // born at 1 does not), and dashboards read 0 rather than no data.
        for kind in [KIND_SERVER, KIND_PROFILE, KIND_NAMESPACE] {
            metrics.reconciles.get_or_create_owned(&KindLabels { kind: kind.to_string() });
            metrics.errors.get_or_create_owned(&KindLabels { kind: kind.to_string() });
        }
        metrics.rbac_writes.get_or_create_owned(&KindLabels { kind: "RoleBinding".to_string() });
        for result in ["succeeded", "failed", "skipped"] {
            metrics.probes.get_or_create_owned(&ProbeLabels { result: result.to_string() });
        }
        metrics
    }

    /// Reconciles of `kind` (`McpServer`, `McpProfile`, `Namespace`) so far.
    pub fn reconciles(&self, kind: &str) -> u64 {
        self.reconciles.get_or_create(&KindLabels { kind: kind.to_string() }).get()
    }

    /// Status writes for objects of `kind` so far.
    pub fn status_writes(&self, kind: &str) -> u64 {
        self.status_writes.get_or_create(&KindLabels { kind: kind.to_string() }).get()
    }

    /// Probes with `result` (`succeeded`, `failed`) so far.
    pub fn probes(&self, result: &str) -> u64 {
        self.probes.get_or_create(&ProbeLabels { result: result.to_string() }).get()
    }

    /// Whether this replica leads now (always, without leader election).
    pub fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// Whether this replica is ready: its election runs (as leader or standby).
    pub fn is_ready(&self) -> bool {
        self.ready.get() == 1
    }

    fn count(family: &Family<KindLabels, Counter>, kind: &str) {
        family.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    fn probed(&self, outcome: &ProbeOutcome) {
        let result = match outcome.result {
            ProbeResult::Succeeded { .. } => "succeeded",
            ProbeResult::Failed { .. } => "failed",
            ProbeResult::AuthRequired { .. } => "auth_required",
            ProbeResult::Skipped { .. } => "skipped",
        };
        self.probes.get_or_create(&ProbeLabels { result: result.to_string() }).inc();
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
    let (ctx, feeds) = Context::new(&client, config);
    let (namespace_cache, server_controller) = server_controller(&client, config, &ctx, feeds.namespaces, &token);
    let (server_cache, profile_coalescer, profile_controller) =
        profile_controller(&client, config, &ctx, feeds.servers, &token);
    let (binding_cache, namespace_controller) = namespace_controller(&client, config, &ctx, feeds.bindings, &token);
    tokio::join!(
        server_controller,
        server_cache,
        profile_coalescer,
        namespace_cache,
        profile_controller,
        binding_cache,
        namespace_controller
    );
}

/// The writing end of a cache, and the sender [`cache`] sets once it has listed.
type Feed<K> = (reflector::store::Writer<K>, tokio::sync::watch::Sender<bool>);

/// The writing ends of the caches a term's [`Context`] reads.
struct Feeds {
    servers: Feed<McpServer>,
    bindings: Feed<RoleBinding>,
    namespaces: Feed<Namespace>,
}

/// Resolves when `token` is cancelled (every controller and cache needs one of its own).
fn stopped(token: &CancellationToken) -> impl Future<Output = ()> + Send + Sync + use<> {
    let token = token.clone();
    async move { token.cancelled().await }
}

fn run_config(config: &ControllerConfig) -> RunConfig {
    RunConfig::default().concurrency(config.concurrency)
}

/// McpServer status, re-reconciled from the namespace cache: a namespace that turns
/// injection-enabled gets its servers probed now, not at their next requeue
/// (`--probe-namespaces=injection-enabled`). Returns the namespace cache and the controller.
fn server_controller(
    client: &Client,
    config: &ControllerConfig,
    ctx: &Arc<Context>,
    (namespace_writer, namespace_cache_ready): Feed<Namespace>,
    token: &CancellationToken,
) -> (impl Future<Output = ()> + use<>, impl Future<Output = ()> + use<>) {
    let server_api: Api<McpServer> = config.scope.api(client.clone());
    let server_controller = Controller::new(server_api, watcher::Config::default());
    let (server_tx, server_rx) = mpsc::channel(TRIGGER_BUFFER);
    let servers = server_controller.store();
    let namespace_cache = cache(
        namespace_writer,
        Api::<Namespace>::all(client.clone()),
        config.scope.namespaces(),
        namespace_cache_ready,
        stopped(token),
        move |event| servers_to_trigger(event, &servers.state()),
        server_tx,
    )
    .instrument(tracing::info_span!("reflector", kind = KIND_NAMESPACE));
    let server_controller = server_controller
        .reconcile_on(ReceiverStream::new(server_rx))
        .with_config(run_config(config))
        .graceful_shutdown_on(stopped(token))
        .run(reconcile_server, error_policy, ctx.clone())
        .for_each(log_outcome)
        .instrument(tracing::info_span!("controller", kind = KIND_SERVER));
    (namespace_cache, server_controller)
}

/// McpProfile status, re-reconciled (coalesced) from the server cache it reads. Returns the
/// server cache, the coalescer and the controller.
fn profile_controller(
    client: &Client,
    config: &ControllerConfig,
    ctx: &Arc<Context>,
    (server_writer, server_cache_ready): Feed<McpServer>,
    token: &CancellationToken,
) -> (impl Future<Output = ()> + use<>, impl Future<Output = ()> + use<>, impl Future<Output = ()> + use<>) {
    let profile_controller =
        Controller::new(config.scope.api::<McpProfile>(client.clone()), watcher::Config::default())
            .with_config(run_config(config));
    let profiles = profile_controller.store();
    let (profile_tx, profile_rx) = mpsc::channel(TRIGGER_BUFFER);
    let mut triggers = ProfileTriggers::default();
    let server_cache = cache(
        server_writer,
        config.scope.api::<McpServer>(client.clone()),
        watcher::Config::default(),
        server_cache_ready,
        stopped(token),
        move |event| triggers.on_event(event, &profiles.state()),
        profile_tx,
    )
    .instrument(tracing::info_span!("reflector", kind = KIND_SERVER));
    let (coalesced_tx, coalesced_rx) = mpsc::channel(TRIGGER_BUFFER);
    let profile_coalescer = coalesce(profile_rx, coalesced_tx, PROFILE_TRIGGER_WINDOW);
    let profile_controller = profile_controller
        .reconcile_on(ReceiverStream::new(coalesced_rx))
        .graceful_shutdown_on(stopped(token))
        .run(reconcile_profile, error_policy, ctx.clone())
        .for_each(log_outcome)
        .instrument(tracing::info_span!("controller", kind = KIND_PROFILE));
    (server_cache, profile_coalescer, profile_controller)
}

/// The agent RoleBinding of each injection-enabled namespace, re-reconciled from the cache of
/// the bindings we manage (someone deleting one gets it back). Returns that cache and the
/// controller.
fn namespace_controller(
    client: &Client,
    config: &ControllerConfig,
    ctx: &Arc<Context>,
    (binding_writer, binding_cache_ready): Feed<RoleBinding>,
    token: &CancellationToken,
) -> (impl Future<Output = ()> + use<>, impl Future<Output = ()> + use<>) {
    let namespace_controller = Controller::new(Api::<Namespace>::all(client.clone()), config.scope.namespaces())
        .with_config(run_config(config));
    let namespaces = namespace_controller.store();
    let (namespace_tx, namespace_rx) = mpsc::channel(TRIGGER_BUFFER);
    let managed = watcher::Config::default()
        .labels(&format!("{LABEL_MANAGED_BY}={FIELD_MANAGER}"))
        .fields(&format!("metadata.name={AGENT_ROLE}"));
    let binding_cache = cache(
        binding_writer,
        config.scope.api(client.clone()),
        managed,
        binding_cache_ready,
        stopped(token),
        move |event| namespaces_to_trigger(event, &namespaces.state()),
        namespace_tx,
    )
    .instrument(tracing::info_span!("reflector", kind = "RoleBinding"));
    let namespace_controller = namespace_controller
        .reconcile_on(ReceiverStream::new(namespace_rx))
        .graceful_shutdown_on(stopped(token))
        .run(reconcile_namespace, error_policy, ctx.clone())
        .for_each(log_outcome)
        .instrument(tracing::info_span!("controller", kind = KIND_NAMESPACE));
    (binding_cache, namespace_controller)
}

/// Runs a reflector into `writer` until `stop`, sending `trigger(event)`'s references after
/// each event reached the store.
async fn cache<K, R, F>(
    writer: reflector::store::Writer<K>,
    api: Api<K>,
    config: watcher::Config,
    ready: tokio::sync::watch::Sender<bool>,
    stop: impl std::future::Future<Output = ()>,
    mut trigger: F,
    tx: mpsc::Sender<ObjectRef<R>>,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    R: Resource<DynamicType = ()> + Clone + 'static,
    F: FnMut(&watcher::Event<K>) -> Vec<ObjectRef<R>>,
{
    let events = reflector::reflector(writer, watcher(api, config).default_backoff()).take_until(stop);
    tokio::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if matches!(event, watcher::Event::InitDone) {
                    ready.send_replace(true);
                }
                for obj_ref in trigger(&event) {
                    if tx.send(obj_ref).await.is_err() {
                        // The controller is gone: the term is ending.
                        return;
                    }
                }
            }
            // The watcher retries with backoff by itself; the store keeps its last state.
            Err(error) => tracing::warn!(%error, "watch failed; retrying"),
        }
    }
}

/// Profile triggers are coalesced over this window. A burst of server events (servers created,
/// or their first statuses written, by the thousand) re-reconciled each selecting profile once per
/// event it matched: each such reconcile scans the namespace's servers, and that scan was most of
/// the controller's CPU at 10,000 servers (benches/reconcile.rs, profiled). The first trigger
/// after a quiet window passes at once; the window's others, deduplicated, at its end. Unlike
/// kube-runtime's debounce, which keeps delaying an object while triggers keep coming (a profile
/// selecting thousands of probed servers might never be reconciled), a profile's status lags
/// a change by at most one window.
const PROFILE_TRIGGER_WINDOW: Duration = Duration::from_secs(1);

/// Forwards `rx` to `tx`: the first reference at once, then the distinct references received in
/// the following `window` at its end; again for the next. Ends when either side closes.
async fn coalesce<R>(mut rx: mpsc::Receiver<ObjectRef<R>>, tx: mpsc::Sender<ObjectRef<R>>, window: Duration)
where
    R: Resource<DynamicType = ()>,
{
    while let Some(first) = rx.recv().await {
        if tx.send(first).await.is_err() {
            return;
        }
        let until = tokio::time::Instant::now() + window;
        let mut pending = std::collections::HashSet::new();
        let mut open = true;
        while open {
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                next = rx.recv() => match next {
                    Some(obj_ref) => {
                        pending.insert(obj_ref);
                    }
                    None => open = false,
                },
            }
        }
        for obj_ref in pending {
            if tx.send(obj_ref).await.is_err() {
                return;
            }
        }
        if !open {
            return;
        }
    }
}

/// Which profiles a server cache event affects (issue 18: with 10,000 servers, triggering every
/// selecting profile on every server event re-reconciled each of them thousands of times).
/// It remembers each server's labels as of its previous event, in event order, so a label
/// change that drops a server from a selector is seen without the profile's status.
#[derive(Default)]
struct ProfileTriggers {
    labels: std::collections::HashMap<ObjectRef<McpServer>, BTreeMap<String, String>>,
}

impl ProfileTriggers {
    /// The profiles to re-reconcile after `event`: those a changed or deleted server is named
    /// by, or selected by before or after, and all of them after a re-list (a deletion may
    /// have been missed).
    fn on_event(
        &mut self,
        event: &watcher::Event<McpServer>,
        profiles: &[Arc<McpProfile>],
    ) -> Vec<ObjectRef<McpProfile>> {
        match event {
            watcher::Event::Apply(server) => {
                let labels = server.metadata.labels.clone().unwrap_or_default();
                let before = self.labels.insert(ObjectRef::from_obj(server), labels);
                affected_profiles(server, before.as_ref(), profiles)
            }
            watcher::Event::Delete(server) => {
                let before = self.labels.remove(&ObjectRef::from_obj(server));
                affected_profiles(server, before.as_ref(), profiles)
            }
            watcher::Event::Init => {
                self.labels.clear();
                Vec::new()
            }
            watcher::Event::InitApply(server) => {
                self.labels.insert(ObjectRef::from_obj(server), server.metadata.labels.clone().unwrap_or_default());
                Vec::new()
            }
            watcher::Event::InitDone => profiles.iter().map(|p| ObjectRef::from_obj(&**p)).collect(),
        }
    }
}

/// The profiles whose status may depend on `server`: in its namespace, and naming it in
/// `spec.servers` or selecting it with its labels now or with `labels_before`.
fn affected_profiles(
    server: &McpServer,
    labels_before: Option<&BTreeMap<String, String>>,
    profiles: &[Arc<McpProfile>],
) -> Vec<ObjectRef<McpProfile>> {
    let (namespace, name) = (server.metadata.namespace.as_deref(), server.metadata.name.as_deref());
    let empty = BTreeMap::new();
    let now = server.metadata.labels.as_ref().unwrap_or(&empty);
    profiles
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == namespace)
        .filter(|p| {
            name.is_some_and(|n| p.spec.servers.iter().any(|s| s == n))
                || p.spec.server_selector.as_ref().is_some_and(|selector| {
                    // A selector that does not parse selects nothing (Accepted says why).
                    Selector::try_from(selector.clone()).is_ok_and(|selector| {
                        selector.matches(now) || labels_before.is_some_and(|before| selector.matches(before))
                    })
                })
        })
        .map(|p| ObjectRef::from_obj(&**p))
        .collect()
}

/// The McpServers to re-reconcile after a namespace cache event: those of the namespace (its
/// labels may have changed), none after a re-list (each server's own watch covers its start).
fn servers_to_trigger(event: &watcher::Event<Namespace>, servers: &[Arc<McpServer>]) -> Vec<ObjectRef<McpServer>> {
    match event {
        watcher::Event::Apply(namespace) => servers
            .iter()
            .filter(|s| s.metadata.namespace.is_some() && s.metadata.namespace == namespace.metadata.name)
            .map(|s| ObjectRef::from_obj(&**s))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether a cache has finished its first list. kube's `Store::wait_until_ready` wakes only one
/// of several tasks waiting at once (a oneshot receiver keeps one waker), so reconciles that run
/// side by side, and the controller holding its runner, would leave the others asleep for good;
/// a watch channel wakes every waiter.
#[derive(Clone)]
struct CacheReady(tokio::sync::watch::Receiver<bool>);

impl CacheReady {
    /// The readiness handle and the sender [`cache`] sets after the first `InitDone`.
    fn new() -> (CacheReady, tokio::sync::watch::Sender<bool>) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (CacheReady(rx), tx)
    }

    async fn wait(&self, kind: &'static str) -> Result<(), Error> {
        let mut ready = self.0.clone();
        ready.wait_for(|ready| *ready).await.map(|_| ()).map_err(|_| Error::CacheStopped { kind })
    }
}

/// The namespaces to re-reconcile after a RoleBinding cache event: the binding's, and all
/// after a re-list (a deletion may have been missed).
fn namespaces_to_trigger(
    event: &watcher::Event<RoleBinding>,
    namespaces: &[Arc<Namespace>],
) -> Vec<ObjectRef<Namespace>> {
    match event {
        watcher::Event::Apply(binding) | watcher::Event::Delete(binding) => {
            binding.metadata.namespace.iter().map(|ns| ObjectRef::new(ns)).collect()
        }
        watcher::Event::InitDone => namespaces.iter().map(|n| ObjectRef::from_obj(&**n)).collect(),
        watcher::Event::Init | watcher::Event::InitApply(_) => Vec::new(),
    }
}

// === reconcile ===

/// What every reconcile of a term shares.
struct Context {
    client: Client,
    recorder: Recorder,
    /// Every McpServer in scope (for profiles).
    servers: Store<McpServer>,
    servers_ready: CacheReady,
    /// The agent RoleBindings we manage, in scope.
    bindings: Store<RoleBinding>,
    bindings_ready: CacheReady,
    /// Namespaces in scope (which are injection-enabled, for `--probe-namespaces`).
    namespaces: Store<Namespace>,
    namespaces_ready: CacheReady,
    probe: ProbeConfig,
    metrics: ControllerMetrics,
    /// Set once the agent ClusterRole was checked in this term.
    agent_role_checked: AtomicBool,
}

/// Kinds the controllers reconcile, for logs, metrics and the shared error policy.
trait Kind {
    const KIND: &'static str;
}

impl Kind for McpServer {
    const KIND: &'static str = KIND_SERVER;
}

impl Kind for McpProfile {
    const KIND: &'static str = KIND_PROFILE;
}

impl Kind for Namespace {
    const KIND: &'static str = KIND_NAMESPACE;
}

fn error_policy<K: Resource + Kind>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    ControllerMetrics::count(&ctx.metrics.errors, K::KIND);
    tracing::warn!(
        kind = K::KIND,
        namespace = obj.meta().namespace.as_deref().unwrap_or_default(),
        name = obj.meta().name.as_deref().unwrap_or_default(),
        error = %error_chain(error),
        "reconcile failed; retrying in {} s",
        ERROR_REQUEUE.as_secs()
    );
    Action::requeue(ERROR_REQUEUE)
}

/// Reconciler failures are logged by [`error_policy`]; the rest (watch errors) here.
async fn log_outcome<K: Resource, E: std::error::Error>(
    outcome: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, watcher::Error>>,
) where
    K::DynamicType: Debug,
{
    use kube::runtime::controller::Error as RunError;
    match outcome {
        Ok(_) | Err(RunError::ReconcilerFailed(..)) => {}
        // An object deleted between trigger and reconcile: nothing to do.
        Err(RunError::ObjectNotFound(obj_ref)) => tracing::debug!(%obj_ref, "gone before its reconcile"),
        Err(error) => tracing::warn!(error = %error_chain(&error), "controller"),
    }
}

/// The namespace and name of an object from a watch.
fn identity<K: Resource + Kind>(obj: &K) -> Result<(String, String), Error> {
    let meta = obj.meta();
    let namespace = meta.namespace.clone().ok_or(Error::MissingMetadata { kind: K::KIND, field: "namespace" })?;
    let name = meta.name.clone().ok_or(Error::MissingMetadata { kind: K::KIND, field: "name" })?;
    Ok((namespace, name))
}

fn now() -> Time {
    Time(Timestamp::now())
}

// Trace spans (`telemetry::otel`): what was reconciled, never its spec.
#[tracing::instrument(target = "spear_trace", name = "operator.reconcile", skip_all, fields(kind = KIND_SERVER, server_id = server.metadata.name.as_deref().unwrap_or_default()))]
async fn reconcile_server(server: Arc<McpServer>, ctx: Arc<Context>) -> Result<Action, Error> {
    ControllerMetrics::count(&ctx.metrics.reconciles, KIND_SERVER);
    let (namespace, name) = identity(&*server)?;
    let now = now();
    let valid = server.validate().is_empty();
    let mut outcome = None;
    let in_scope = ctx.probes_namespace(&namespace).await?;
    if !in_scope && probe::target(&server).is_some() && valid {
        let message = probe::skipped_message(&namespace, ctx.probe.namespaces);
        outcome = Some(ProbeOutcome { time: now.clone(), result: ProbeResult::Skipped { message } });
    } else if probe::schedule(&server, server.status.as_ref(), valid, &now, &ctx.probe) == Schedule::Now
        && let Some(target) = probe::target(&server)
    {
        let probed = probe::probe(&name, &target, &ctx.probe.deny, ctx.probe.timeout, now.clone()).await;
        tracing::debug!(%namespace, server_id = %name, result = ?probed.result, "probed");
        ctx.metrics.probed(&probed);
        outcome = Some(probed);
    }
    let mut status = server_status(&server, outcome.as_ref(), now.clone());
    let references = server_secret_refs(&server);
    let grants = ctx.secret_grants(&namespace, references.iter().map(|r| r.secret.as_str())).await?;
    let old = server.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let refusals = grants.server_refusals(&server);
    fold_secret_refusals(
        &mut status.conditions,
        old,
        !references.is_empty(),
        &refusals,
        server.metadata.generation,
        now.clone(),
    );
    if server.status.as_ref() != Some(&status) {
        let api: Api<McpServer> = Api::namespaced(ctx.client.clone(), &namespace);
        apply_status(&api, &namespace, &name, &status, &ctx.metrics).await?;
        let old = server.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        ctx.report_rejection(&*server, old, &status.conditions).await;
    }
    // Secrets are not watched (that would take list/watch on every Secret): a grant added or
    // withdrawn shows on the status within SECRET_RECHECK.
    let recheck = (!references.is_empty()).then_some(SECRET_RECHECK);
    if !in_scope {
        // A namespace label change triggers this reconcile (the namespace watch above).
        return Ok(recheck.map_or_else(Action::await_change, Action::requeue));
    }
    Ok(match (probe::schedule(&server, Some(&status), valid, &now, &ctx.probe), recheck) {
        (Schedule::After(delay), recheck) => Action::requeue(recheck.map_or(delay, |r| r.min(delay))),
        // Only when the write above did not take (the object went away meanwhile).
        (Schedule::Now, _) => Action::requeue(ctx.probe.min_retry),
        (Schedule::Never, Some(recheck)) => Action::requeue(recheck),
        (Schedule::Never, None) => Action::await_change(),
    })
}

#[tracing::instrument(target = "spear_trace", name = "operator.reconcile", skip_all, fields(kind = KIND_PROFILE, profile = profile.metadata.name.as_deref().unwrap_or_default()))]
async fn reconcile_profile(profile: Arc<McpProfile>, ctx: Arc<Context>) -> Result<Action, Error> {
    ControllerMetrics::count(&ctx.metrics.reconciles, KIND_PROFILE);
    let (namespace, name) = identity(&*profile)?;
    // Before the first list, "missing" would be a lie written to the status.
    ctx.servers_ready.wait(KIND_SERVER).await?;
    let servers: Vec<McpServer> = profile_servers_in(&ctx.servers, &namespace, &profile).into_values().collect();
    let now = now();
    let mut status = profile_status(&profile, &servers, &known_tools(&servers), now.clone());
    let reference = profile_secret_ref(&profile);
    let grants = ctx.secret_grants(&namespace, reference.iter().map(|r| r.secret.as_str())).await?;
    let old = profile.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let refusals: Vec<_> = grants.profile_refusal(&profile).into_iter().collect();
    fold_secret_refusals(&mut status.conditions, old, reference.is_some(), &refusals, profile.metadata.generation, now);
    if profile.status.as_ref() != Some(&status) {
        let api: Api<McpProfile> = Api::namespaced(ctx.client.clone(), &namespace);
        apply_status(&api, &namespace, &name, &status, &ctx.metrics).await?;
        let old = profile.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        ctx.report_rejection(&*profile, old, &status.conditions).await;
    }
    Ok(if reference.is_some() { Action::requeue(SECRET_RECHECK) } else { Action::await_change() })
}

async fn reconcile_namespace(namespace: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, Error> {
    ControllerMetrics::count(&ctx.metrics.reconciles, KIND_NAMESPACE);
    let name = namespace.metadata.name.clone().ok_or(Error::MissingMetadata { kind: KIND_NAMESPACE, field: "name" })?;
    if namespace.metadata.deletion_timestamp.is_some() {
        // Terminating: its bindings go with it, and nothing new may be created there.
        return Ok(Action::await_change());
    }
    ctx.bindings_ready.wait("RoleBinding").await?;
    let current = ctx.bindings.get(&ObjectRef::new(AGENT_ROLE).within(&name));
    let api: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), &name);
    if injection_enabled(namespace.metadata.labels.as_ref()) {
        ctx.check_agent_role().await;
        let desired = agent_role_binding(&name);
        match current {
            Some(current) if binding_is_current(&current, &desired) => {}
            Some(current) if current.role_ref != desired.role_ref => {
                // `roleRef` is immutable: replace the binding.
                delete_binding(&api, &name, &ctx.metrics).await?;
                apply_binding(&api, &name, &desired, &ctx.metrics).await?;
            }
            _ => apply_binding(&api, &name, &desired, &ctx.metrics).await?,
        }
    } else if current.is_some() {
        delete_binding(&api, &name, &ctx.metrics).await?;
        tracing::info!(namespace = %name, "injection disabled: removed the agent RoleBinding");
    }
    Ok(Action::await_change())
}

/// Whether a namespace's labels opt it into injection (`mcp.spear.dev/injection=enabled`).
fn injection_enabled(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(LABEL_INJECTION)).is_some_and(|v| v == INJECTION_ENABLED)
}

async fn apply_binding(
    api: &Api<RoleBinding>,
    namespace: &str,
    desired: &RoleBinding,
    metrics: &ControllerMetrics,
) -> Result<(), Error> {
    api.patch(AGENT_ROLE, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(desired)).await.map_err(
        |source| Error::ApplyRoleBinding {
            name: AGENT_ROLE,
            namespace: namespace.to_string(),
            source: Box::new(source),
        },
    )?;
    ControllerMetrics::count(&metrics.rbac_writes, "RoleBinding");
    tracing::info!(%namespace, "applied the agent RoleBinding");
    Ok(())
}

async fn delete_binding(api: &Api<RoleBinding>, namespace: &str, metrics: &ControllerMetrics) -> Result<(), Error> {
    match api.delete(AGENT_ROLE, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_not_found() => {}
        Err(source) => {
            return Err(Error::DeleteRoleBinding {
                name: AGENT_ROLE,
                namespace: namespace.to_string(),
                source: Box::new(source),
            });
        }
    }
    ControllerMetrics::count(&metrics.rbac_writes, "RoleBinding");
    Ok(())
}

/// Server-side applies `status` to the status subresource under `spear-operator`. An object
/// deleted meanwhile is not an error.
async fn apply_status<K>(
    api: &Api<K>,
    namespace: &str,
    name: &str,
    status: &impl Serialize,
    metrics: &ControllerMetrics,
) -> Result<(), Error>
where
    K: Resource + Kind + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!({ "apiVersion": API_VERSION, "kind": K::KIND, "status": status });
    // Forced: status is ours alone; a stale manager (an older operator) must not block it.
    match api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await {
        Ok(_) => {
            ControllerMetrics::count(&metrics.status_writes, K::KIND);
            tracing::debug!(kind = K::KIND, %namespace, %name, "status written");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(source) => Err(Error::WriteStatus {
            kind: K::KIND,
            namespace: namespace.to_string(),
            name: name.to_string(),
            source: Box::new(source),
        }),
    }
}

/// The `Accepted=False` message to report as an Event: when the condition is False now and
/// was not False with the same message before (one Event per rejection, not per reconcile).
fn new_rejection<'a>(old: &[Condition], new: &'a [Condition]) -> Option<&'a str> {
    let accepted = |conditions: &[Condition]| conditions.iter().find(|c| c.type_ == types::ACCEPTED).cloned();
    let now = new.iter().find(|c| c.type_ == types::ACCEPTED).filter(|c| c.status == "False")?;
    match accepted(old) {
        Some(before) if before.status == "False" && before.message == now.message => None,
        _ => Some(now.message.as_str()),
    }
}

impl Context {
    /// The context of one term, and the writing ends of the caches it reads.
    fn new(client: &Client, config: &ControllerConfig) -> (Arc<Context>, Feeds) {
        let reporter = Reporter { controller: FIELD_MANAGER.to_string(), instance: Some(config.instance.clone()) };
        let (servers, server_writer) = reflector::store::<McpServer>();
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
            agent_role_checked: AtomicBool::new(false),
        });
        let feeds = Feeds {
            servers: (server_writer, server_cache_ready),
            bindings: (binding_writer, binding_cache_ready),
            namespaces: (namespace_writer, namespace_cache_ready),
        };
        (ctx, feeds)
    }

    /// Whether McpServers of `namespace` are probed (`--probe-namespaces`); waits for the
    /// namespace cache only when the answer depends on it.
    async fn probes_namespace(&self, namespace: &str) -> Result<bool, Error> {
        if self.probe.namespaces != probe::ProbeNamespaces::InjectionEnabled {
            return Ok(probe::probes_namespace(self.probe.namespaces, false));
        }
        self.namespaces_ready.wait(KIND_NAMESPACE).await?;
        let enabled = self
            .namespaces
            .get(&ObjectRef::new(namespace))
            .is_some_and(|ns| injection_enabled(ns.metadata.labels.as_ref()));
        Ok(probe::probes_namespace(self.probe.namespaces, enabled))
    }

    /// The annotations of the named Secrets of `namespace` (metadata GETs; never the data).
    async fn secret_grants(&self, namespace: &str, names: impl Iterator<Item = &str>) -> Result<SecretGrants, Error> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let mut grants = SecretGrants::default();
        for name in names.collect::<BTreeSet<_>>() {
            let meta = api.get_metadata_opt(name).await.map_err(|source| Error::ReadSecret {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source: Box::new(source),
            })?;
            grants.insert(name, meta.map(|m| m.metadata.annotations.unwrap_or_default()));
        }
        Ok(grants)
    }

    /// Publishes a Warning Event on `obj` when its `Accepted` turned False (or its problems
    /// changed). A failure is logged, not returned: the status already says it.
    async fn report_rejection<K: Resource<DynamicType = ()> + Kind>(
        &self,
        obj: &K,
        old: &[Condition],
        new: &[Condition],
    ) {
        let Some(message) = new_rejection(old, new) else { return };
        let event = Event {
            type_: EventType::Warning,
            reason: reasons::INVALID.to_string(),
            note: Some(cut(message, MAX_EVENT_NOTE_BYTES)),
            action: "Validate".to_string(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::warn!(kind = K::KIND, name = obj.meta().name.as_deref().unwrap_or_default(), %error, "publishing an Event failed");
        }
    }

    /// Applies the agent ClusterRole once per term (the RoleBindings refer to it).
    /// Checks once per term that the agent's ClusterRole exists (the chart installs it; the
    /// operator has no right to create it). A missing one is logged, not fatal: the binding may
    /// name it before it exists, and agents read the registry as soon as it does.
    async fn check_agent_role(&self) {
        if self.agent_role_checked.swap(true, Ordering::AcqRel) {
            return;
        }
        match Api::<ClusterRole>::all(self.client.clone()).get_opt(AGENT_ROLE).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::warn!(
                cluster_role = AGENT_ROLE,
                "the agents' ClusterRole is missing, so injected agents cannot read McpServers or McpProfiles; \
                 install it with the chart (templates/agent-rbac.yaml) or manifests/install.yaml"
            ),
            Err(error) => {
                tracing::warn!(cluster_role = AGENT_ROLE, error = %error_chain(&error), "cannot check the agents' ClusterRole");
                self.agent_role_checked.store(false, Ordering::Release);
            }
        }
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> String {
    s[..s.floor_char_boundary(max)].to_string()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    fn server(namespace: &str, name: &str) -> McpServer {
        McpServer::test(name).in_namespace(namespace)
    }

    /// A profile naming `servers`, and with `selector` one whose (empty) selector may match any server.
    fn profile(namespace: &str, name: &str, servers: &[&str], selector: bool) -> Arc<McpProfile> {
        let p = McpProfile::test(name).in_namespace(namespace).servers(servers);
        Arc::new(if selector { p.server_selector(LabelSelector::default()) } else { p })
    }

    fn accepted(status: &str, message: &str) -> Condition {
        Condition {
            type_: types::ACCEPTED.into(),
            status: status.into(),
            message: message.into(),
            reason: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn a_server_change_triggers_the_profiles_that_name_or_may_select_it_in_its_namespace() {
        let profiles = [
            profile("a", "names-it", &["fs"], false),
            profile("a", "names-another", &["git"], false),
            profile("a", "selects", &[], true),
            profile("b", "other-namespace", &["fs"], true),
        ];
        let names: Vec<String> =
            affected_profiles(&server("a", "fs"), None, &profiles).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["names-it", "selects"]);
    }

    fn labelled(namespace: &str, name: &str, team: &str) -> McpServer {
        let mut server = server(namespace, name);
        server.metadata.labels = Some(BTreeMap::from([("team".to_string(), team.to_string())]));
        server
    }

    fn selecting(namespace: &str, name: &str, team: &str) -> Arc<McpProfile> {
        Arc::new(McpProfile::test(name).in_namespace(namespace).selecting("team", team))
    }

    #[test]
    fn a_label_change_triggers_the_profiles_that_selected_it_before_and_after_only() {
        let profiles = [selecting("a", "team-x", "x"), selecting("a", "team-y", "y"), selecting("a", "team-z", "z")];
        let mut triggers = ProfileTriggers::default();
        let names = |refs: Vec<ObjectRef<McpProfile>>| refs.into_iter().map(|r| r.name).collect::<Vec<_>>();
        assert!(triggers.on_event(&watcher::Event::InitApply(labelled("a", "fs", "x")), &profiles).is_empty());
        assert_eq!(triggers.on_event(&watcher::Event::InitDone, &profiles).len(), 3, "a re-list triggers all");
        // x → y: team-x must drop it, team-y gains it, team-z is untouched.
        let moved = triggers.on_event(&watcher::Event::Apply(labelled("a", "fs", "y")), &profiles);
        assert_eq!(names(moved), ["team-x", "team-y"]);
        // A status-only change (labels unchanged) triggers the selecting profile only.
        assert_eq!(names(triggers.on_event(&watcher::Event::Apply(labelled("a", "fs", "y")), &profiles)), ["team-y"]);
        // Deleted: the profile that selected it as last seen.
        let mut gone = labelled("a", "fs", "y");
        gone.metadata.labels = None;
        assert_eq!(names(triggers.on_event(&watcher::Event::Delete(gone), &profiles)), ["team-y"]);
        // A server never seen before selects by its labels now.
        assert_eq!(names(triggers.on_event(&watcher::Event::Apply(labelled("a", "new", "z")), &profiles)), ["team-z"]);
    }

    #[tokio::test]
    async fn triggers_in_a_window_pass_once_each_after_the_first_passed_at_once() {
        let (tx, rx) = mpsc::channel(16);
        let (out_tx, mut out) = mpsc::channel(16);
        let coalescer = tokio::spawn(coalesce::<McpProfile>(rx, out_tx, Duration::from_millis(50)));
        let (a, b) = (ObjectRef::new("a").within("ns"), ObjectRef::new("b").within("ns"));
        for obj_ref in [&a, &a, &b, &a, &b] {
            tx.send(obj_ref.clone()).await.expect("the coalescer runs");
        }
        assert_eq!(out.recv().await.as_ref(), Some(&a), "the first passes at once");
        let mut rest = vec![out.recv().await.expect("a").name, out.recv().await.expect("b").name];
        rest.sort();
        assert_eq!(rest, ["a", "b"], "the window's triggers, each once");
        drop(tx);
        assert!(out.recv().await.is_none(), "nothing more, and the coalescer ends with its input");
        coalescer.await.expect("the coalescer does not panic");
    }

    #[test]
    fn a_relist_triggers_every_profile_and_a_deletion_its_own() {
        let profiles = [profile("a", "p", &["fs"], false), profile("a", "q", &[], true)];
        let mut triggers = ProfileTriggers::default();
        assert_eq!(triggers.on_event(&watcher::Event::InitDone, &profiles).len(), 2);
        assert_eq!(triggers.on_event(&watcher::Event::Delete(server("a", "fs")), &profiles).len(), 2);
        assert!(triggers.on_event(&watcher::Event::InitApply(server("a", "fs")), &profiles).is_empty());
    }

    #[test]
    fn a_binding_event_triggers_its_namespace() {
        let binding = agent_role_binding("team-a");
        let refs = namespaces_to_trigger(&watcher::Event::Delete(binding), &[]);
        assert_eq!(refs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["team-a"]);
    }

    #[test]
    fn a_rejection_is_reported_once_until_its_problems_change() {
        let bad = accepted("False", "spec.stdio.command: has spaces");
        assert_eq!(new_rejection(&[], std::slice::from_ref(&bad)), Some("spec.stdio.command: has spaces"));
        assert_eq!(
            new_rejection(&[accepted("True", "ok")], std::slice::from_ref(&bad)),
            Some("spec.stdio.command: has spaces")
        );
        assert_eq!(new_rejection(std::slice::from_ref(&bad), std::slice::from_ref(&bad)), None);
        let worse = accepted("False", "spec.http.url: not http");
        assert_eq!(new_rejection(&[bad], std::slice::from_ref(&worse)), Some("spec.http.url: not http"));
        assert_eq!(new_rejection(&[], &[accepted("True", "ok")]), None);
    }

    #[test]
    fn only_the_enabled_label_value_enables_injection() {
        let labels = |v: &str| BTreeMap::from([(LABEL_INJECTION.to_string(), v.to_string())]);
        assert!(injection_enabled(Some(&labels("enabled"))));
        assert!(!injection_enabled(Some(&labels("disabled"))));
        assert!(!injection_enabled(Some(&BTreeMap::new())));
        assert!(!injection_enabled(None));
    }

    #[test]
    fn event_notes_are_cut_on_a_character_boundary() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("hello", 10), "hello");
    }

    #[tokio::test]
    async fn every_reconcile_waiting_for_a_cache_wakes_when_it_is_ready() {
        // kube's Store::wait_until_ready would leave all but one of these asleep.
        let (ready, tx) = CacheReady::new();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let ready = ready.clone();
                tokio::spawn(async move { ready.wait("McpServer").await })
            })
            .collect();
        tokio::task::yield_now().await;
        tx.send_replace(true);
        for waiter in waiters {
            let woke = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
            assert!(matches!(woke, Ok(Ok(Ok(())))), "a waiter stayed asleep: {woke:?}");
        }
        drop(tx);
        assert!(ready.wait("McpServer").await.is_ok(), "ready stays ready after the cache stops");
    }
}
