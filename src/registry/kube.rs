//! Kubernetes mode's registry source: kube-runtime reflectors over the pod's McpProfile and the
//! McpServers of its namespace, turned into snapshots.
//!
//! ```text
//! McpProfile (metadata.name=<profile>, all: gateway) ─watcher─▶ Reflector ─Writer─▶ Store ─┐
//! McpServer  (every one in the namespace)            ─watcher─▶ Reflector ─Writer─▶ Store ─┤
//!   error ─▶ problem on that kind (not for 410 Gone) ─▶ backoff ─▶ fresh watcher (relist)    │
//!   every 30-120 s (jittered) after a list ─▶ fresh watcher (relist)                          │
//!   InitDone (a complete list stored) ─▶ that kind's problem cleared                         ▼
//!        KubeSource::snapshot (pure): read + validate each object ─▶ Snapshot::build ─▶ Publisher
//! ```
//!
//! Decisions (the reasons are in this module's `README.md`):
//! - every McpServer of the namespace is watched (a profile's servers are only known once it is
//!   read); `policy` narrows the set afterwards;
//! - after an error, a fresh watcher relists: its `InitDone` proves the store is in sync again,
//!   which clears the problem; the backoff is kube-runtime's [`DefaultBackoff`]; 410 Gone is not
//!   an outage;
//! - a periodic relist besides the watch ([`Relist`], 30-120 s, jittered so agents started
//!   together do not list together): an event the watch missed (a bug in any layer between etcd
//!   and the store) heals within two minutes instead of lasting until the next error. The list
//!   is served from the API server's watch cache (kube-runtime's default `resourceVersion=0`
//!   semantics); the store swaps to it at `InitDone`, so readers never see a half list;
//! - objects are read one by one and validated as in local mode ([`Validate`]): one unreadable
//!   object is left out with a problem naming the field, never the whole list;
//! - degraded until the first sync: a reader that does not wait for [`KubeWatch::ready`] cannot
//!   mistake "not loaded" for "nothing allowed".

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::store::{Store, Writer};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::snapshot::{Entry, Snapshot, SourceProblem};
use super::view::{Publisher, RegistryView, WatchTask};
use crate::api::keys::{AGENT_ROLE, GROUP, INJECTION_ENABLED, KIND_PROFILE, KIND_SERVER, LABEL_INJECTION};
use crate::api::manifest::Object;
use crate::api::validate::{is_dns1123_label, is_dns1123_subdomain};
use crate::api::{McpProfile, McpServer, Validate};

/// Retry delay used if a backoff ever runs out (kube-runtime's default never does); its maximum.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How often a reflector lists afresh besides its watch: a delay drawn uniformly from
/// `min..=max` after each complete list. `None` in [`WatchOptions`]: only after errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relist {
    /// Shortest delay after a list.
    pub min: Duration,
    /// Longest delay after a list.
    pub max: Duration,
}

impl Relist {
    /// The design's period: 30-120 s.
    pub const DEFAULT: Relist = Relist { min: Duration::from_secs(30), max: Duration::from_secs(120) };

    /// A delay in `min..=max` (`min` when randomness is unavailable or the bounds are crossed).
    fn next_delay(self) -> Duration {
        let span = self.max.saturating_sub(self.min).as_millis() as u64;
        let jitter = if span == 0 { 0 } else { getrandom::u64().map_or(0, |r| r % (span + 1)) };
        self.min + Duration::from_millis(jitter)
    }
}

/// How a [`KubeSource`] watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchOptions {
    /// The periodic relist; `None` turns it off (the bench's baseline).
    pub relist: Option<Relist>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions { relist: Some(Relist::DEFAULT) }
    }
}

/// Errors of the Kubernetes registry source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The namespace is not a namespace name.
    #[error("'{namespace}' is not a valid namespace name (a DNS-1123 label): pass the pod's namespace")]
    InvalidNamespace {
        /// The value given.
        namespace: String,
    },
    /// The profile is not an McpProfile name.
    #[error(
        "'{profile}' is not a valid McpProfile name (a DNS-1123 subdomain): check the pod's mcp.spear.dev/profile annotation"
    )]
    InvalidProfile {
        /// The value given.
        profile: String,
    },
    /// Watching needs a Tokio runtime to run its task on.
    #[error("watching the Kubernetes registry needs a Tokio runtime: call KubeSource::watch from async code")]
    NoRuntime,
    /// The watch task ended before the first complete snapshot (shutdown, or a panic).
    #[error("the registry watch of namespace {namespace} stopped before its first complete list")]
    Stopped {
        /// The watched namespace.
        namespace: String,
    },
    /// The task watching the API panicked.
    #[error(
        "the task watching the registry of namespace {namespace} stopped unexpectedly: the registry is no longer updated"
    )]
    TaskFailed {
        namespace: String,
        #[source]
        source: tokio::task::JoinError,
    },
}

// === Kind ===

/// Which of the two watched kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Server,
    Profile,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Server => KIND_SERVER,
            Kind::Profile => KIND_PROFILE,
        }
    }

    fn resource(self) -> ApiResource {
        match self {
            Kind::Server => ApiResource::erase::<McpServer>(&()),
            Kind::Profile => ApiResource::erase::<McpProfile>(&()),
        }
    }

    fn plural(self) -> String {
        self.resource().plural
    }
}

/// `namespaces/<ns>/<plural>`: where problems about a whole kind are reported (the API path).
fn collection_path(namespace: &str, kind: Kind) -> PathBuf {
    PathBuf::from(format!("namespaces/{namespace}/{}", kind.plural()))
}

/// `namespaces/<ns>/<plural>/<name>`: the "file" of one object, for problems and duplicates.
fn object_path(namespace: &str, kind: Kind, name: &str) -> PathBuf {
    collection_path(namespace, kind).join(name)
}

// === Reflector ===

/// Events of one watcher, boxed so tests can script them.
type EventStream = BoxStream<'static, watcher::Result<Event<DynamicObject>>>;
/// Starts a fresh watcher (it lists first).
type Connect = Box<dyn FnMut() -> EventStream + Send>;

/// What a reflector's next step did.
#[derive(Debug)]
enum Update {
    /// A complete list is in the store (the first sync, or a relist).
    Listed,
    /// One object was added, changed or deleted.
    Changed,
    /// The watch failed; a fresh watcher starts after `retry_in`.
    Failed { error: watcher::Error, retry_in: Duration },
}

/// One kind's reflector: a kube-runtime watcher feeding a store, replaced after an error.
struct Reflector {
    connect: Connect,
    stream: Option<EventStream>,
    writer: Writer<DynamicObject>,
    backoff: Box<dyn Backoff>,
    retry_at: Option<Instant>,
    relist: Option<Relist>,
    relist_at: Option<Instant>,
}

impl Reflector {
    fn new(kind: Kind, connect: Connect, backoff: Box<dyn Backoff>, relist: Option<Relist>) -> Self {
        let writer = Writer::new(kind.resource());
        Reflector { connect, stream: None, writer, backoff, retry_at: None, relist, relist_at: None }
    }

    fn store(&self) -> Store<DynamicObject> {
        self.writer.as_reader()
    }

    /// Waits for the next update of the store, or a failure. Cancel-safe (it is raced in a
    /// `select!`): the stream and the retry deadline live in `self`, and an event is applied to
    /// the store before anything awaits again.
    async fn next(&mut self) -> Update {
        loop {
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at).await;
                self.retry_at = None;
            }
            let connect = &mut self.connect;
            let stream = self.stream.get_or_insert_with(|| connect());
            let next = match self.relist_at {
                Some(at) => tokio::select! {
                    next = stream.next() => Some(next),
                    () = tokio::time::sleep_until(at) => None,
                },
                None => Some(stream.next().await),
            };
            let Some(next) = next else {
                // Time for the periodic relist: a fresh watcher lists; the store keeps serving
                // the old list until the new one is complete.
                tracing::debug!("periodic relist");
                self.relist_at = None;
                self.stream = None;
                continue;
            };
            match next {
                Some(Ok(event)) => {
                    self.writer.apply_watcher_event(&event);
                    match event {
                        // Buffered by the writer until InitDone: nothing a reader sees changed yet.
                        Event::Init | Event::InitApply(_) => {}
                        Event::InitDone => {
                            self.backoff.reset();
                            self.relist_at = self.relist.map(|r| Instant::now() + r.next_delay());
                            return Update::Listed;
                        }
                        Event::Apply(_) | Event::Delete(_) => return Update::Changed,
                    }
                }
                Some(Err(error)) => {
                    let retry_in = self.retry_later();
                    return Update::Failed { error, retry_in };
                }
                // A kube-runtime watcher never ends; if one does, start another after a backoff
                // (without one, a stream that keeps ending at once would spin).
                None => {
                    self.retry_later();
                }
            }
        }
    }

    /// Drops the current watcher and schedules a fresh one; returns the delay.
    fn retry_later(&mut self) -> Duration {
        self.stream = None;
        self.relist_at = None;
        let delay = self.backoff.next().unwrap_or(MAX_BACKOFF);
        self.retry_at = Some(Instant::now() + delay);
        delay
    }
}

// === impl KubeSource ===

/// What one kind contributes: its store, whether it was ever listed, and why it is failing.
#[derive(Debug)]
struct KindState {
    store: Store<DynamicObject>,
    listed: bool,
    problem: Option<SourceProblem>,
}

/// The Kubernetes registry of one pod: its McpProfile and its namespace's McpServers, as the
/// reflectors last stored them. [`KubeSource::watch`] starts it.
#[derive(Debug)]
pub struct KubeSource {
    namespace: String,
    servers: KindState,
    profiles: KindState,
}

impl KubeSource {
    /// Watches `profile` and the McpServers of `namespace` through `client` until the returned
    /// handle is dropped or `shutdown` is cancelled. Returns at once; [`KubeWatch::ready`] waits
    /// for the first complete snapshot. Needs a Tokio runtime.
    pub fn watch(
        client: Client,
        namespace: &str,
        profile: &str,
        shutdown: &CancellationToken,
    ) -> Result<KubeWatch, Error> {
        KubeSource::watch_with(client, namespace, profile, shutdown, WatchOptions::default())
    }

    /// [`KubeSource::watch`] with `options`.
    pub fn watch_with(
        client: Client,
        namespace: &str,
        profile: &str,
        shutdown: &CancellationToken,
        options: WatchOptions,
    ) -> Result<KubeWatch, Error> {
        if !is_dns1123_label(namespace) {
            return Err(Error::InvalidNamespace { namespace: namespace.to_string() });
        }
        // Checked before it goes into a field selector, where a ',' would add a clause.
        if !is_dns1123_subdomain(profile) {
            return Err(Error::InvalidProfile { profile: profile.to_string() });
        }
        KubeSource::watch_selected(client, namespace, Some(profile), shutdown, options)
    }

    /// Watches every McpProfile and McpServer of `namespace` (the gateway's registry: one set of
    /// watches for all the profiles it serves). As [`KubeSource::watch`] otherwise.
    pub fn watch_namespace(
        client: Client,
        namespace: &str,
        shutdown: &CancellationToken,
        options: WatchOptions,
    ) -> Result<KubeWatch, Error> {
        if !is_dns1123_label(namespace) {
            return Err(Error::InvalidNamespace { namespace: namespace.to_string() });
        }
        KubeSource::watch_selected(client, namespace, None, shutdown, options)
    }

    /// The watch of `profile` (all profiles when `None`) and the McpServers of `namespace`; both
    /// names already checked.
    fn watch_selected(
        client: Client,
        namespace: &str,
        profile: Option<&str>,
        shutdown: &CancellationToken,
        options: WatchOptions,
    ) -> Result<KubeWatch, Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let connect = |kind: Kind, config: watcher::Config| -> Connect {
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &kind.resource());
            Box::new(move || watcher::watcher(api.clone(), config.clone()).map_ok(drop_managed_fields).boxed())
        };
        let servers = connect(Kind::Server, watcher::Config::default());
        let profiles = match profile {
            Some(profile) => watcher::Config::default().fields(&format!("metadata.name={profile}")),
            None => watcher::Config::default(),
        };
        let profiles = connect(Kind::Profile, profiles);
        let profile = profile.unwrap_or("*");
        Ok(KubeSource::spawn(&runtime, namespace, profile, [servers, profiles], &default_backoff, options, shutdown))
    }

    /// Starts the watch task over `[servers, profiles]` watchers.
    fn spawn(
        runtime: &tokio::runtime::Handle,
        namespace: &str,
        profile: &str,
        [servers, profiles]: [Connect; 2],
        backoff: &dyn Fn() -> Box<dyn Backoff>,
        options: WatchOptions,
        shutdown: &CancellationToken,
    ) -> KubeWatch {
        let servers = Reflector::new(Kind::Server, servers, backoff(), options.relist);
        let profiles = Reflector::new(Kind::Profile, profiles, backoff(), options.relist);
        let state = |store| KindState { store, listed: false, problem: None };
        let source = KubeSource {
            namespace: namespace.to_string(),
            servers: state(servers.store()),
            profiles: state(profiles.store()),
        };
        let initial = source.snapshot();
        let (synced_tx, synced) = watch::channel(false);
        let span = tracing::info_span!("registry_kube", namespace, profile);
        let task = WatchTask::spawn(runtime, initial, shutdown, span, |publisher, stop| {
            Loop { source, servers, profiles, publisher, synced: synced_tx, stop }.run()
        });
        KubeWatch { namespace: namespace.to_string(), synced, task }
    }

    /// Whether both kinds have been listed completely at least once.
    pub(crate) fn is_listed(&self) -> bool {
        self.servers.listed && self.profiles.listed
    }

    /// The snapshot of what the stores hold now, with the problems of both watches.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut problems = Vec::new();
        for (kind, state) in [(Kind::Server, &self.servers), (Kind::Profile, &self.profiles)] {
            problems.extend(state.problem.clone());
            if !state.listed {
                problems.push(not_listed_problem(&self.namespace, kind));
            }
        }
        build(&self.namespace, &self.servers.store.state(), &self.profiles.store.state(), problems)
    }

    fn state_mut(&mut self, kind: Kind) -> &mut KindState {
        match kind {
            Kind::Server => &mut self.servers,
            Kind::Profile => &mut self.profiles,
        }
    }

    /// Records what a reflector's step did to its kind's problem and sync state.
    fn apply(&mut self, kind: Kind, update: &Update) {
        let namespace = self.namespace.clone();
        let state = self.state_mut(kind);
        match update {
            Update::Listed => {
                if state.problem.take().is_some() {
                    tracing::info!(kind = kind.name(), "watch recovered: complete list stored");
                }
                state.listed = true;
            }
            Update::Changed => {}
            Update::Failed { error, retry_in } => match watch_problem(&namespace, kind, error) {
                Some(problem) => {
                    tracing::debug!(kind = kind.name(), %error, ?retry_in, "watch failed; retrying with a fresh list");
                    state.problem = Some(problem);
                }
                None => tracing::debug!(kind = kind.name(), %error, ?retry_in, "watch expired (410 Gone); relisting"),
            },
        }
    }
}

/// kube-runtime's watcher backoff (client-go's parameters), one per reflector.
fn default_backoff() -> Box<dyn Backoff> {
    Box::new(DefaultBackoff::default())
}

/// Managed fields are half of a typical object's metadata and nothing here reads them.
fn drop_managed_fields(event: Event<DynamicObject>) -> Event<DynamicObject> {
    event.modify(|object| object.metadata.managed_fields = None)
}

/// The problem a kind has until its first complete list.
fn not_listed_problem(namespace: &str, kind: Kind) -> SourceProblem {
    SourceProblem {
        file: collection_path(namespace, kind),
        line: 0,
        field: "sync".into(),
        message: format!("{} objects not listed from the Kubernetes API yet", kind.name()),
        fix: "wait for the first list; if it does not come, the watch problem beside this one says why".into(),
    }
}

/// The API status inside a watcher error, if the API server answered.
fn status_of(error: &watcher::Error) -> Option<&kube::core::Status> {
    match error {
        watcher::Error::WatchError(status) => Some(status.as_ref()),
        watcher::Error::InitialListFailed(e) | watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            match e {
                kube::Error::Api(status) => Some(status.as_ref()),
                _ => None,
            }
        }
        watcher::Error::NoResourceVersion => None,
    }
}

/// A watcher error as one line: the API's answer, or the transport error and its causes.
fn describe(error: &watcher::Error) -> String {
    if let Some(status) = status_of(error) {
        return format!("{} {}: {}", status.code, status.reason, status.message);
    }
    crate::telemetry::error_chain(error)
}

/// The problem a failed watch means for its kind; `None` for 410 Gone, which is a relist, not an
/// outage.
fn watch_problem(namespace: &str, kind: Kind, error: &watcher::Error) -> Option<SourceProblem> {
    let plural = kind.plural();
    let detail = describe(error);
    let (message, fix) = match status_of(error).map(|s| s.code) {
        Some(410) => return None,
        Some(401) => (
            format!("the Kubernetes API refused the agent's credentials: {detail}"),
            "check the pod's service account token (automountServiceAccountToken) or the kubeconfig".to_string(),
        ),
        Some(403) => (
            format!("the agent may not list and watch {plural} in namespace {namespace}: {detail}"),
            format!(
                "grant get, list and watch on mcpservers and mcpprofiles.{GROUP} in the namespace: the operator binds \
                 the {AGENT_ROLE} ClusterRole in namespaces labelled {LABEL_INJECTION}={INJECTION_ENABLED}"
            ),
        ),
        Some(404) => (
            format!("the Kubernetes API does not serve {plural}.{GROUP}: {detail}"),
            "install the spear-mcp CRDs (crds/ or the Helm chart) in a version this agent knows".to_string(),
        ),
        _ => (
            format!("kubernetes API unreachable: {detail}"),
            "the last good registry keeps serving while the watch retries with backoff; check the API server and \
             the pod's network"
                .to_string(),
        ),
    };
    Some(SourceProblem { file: collection_path(namespace, kind), line: 0, field: "watch".into(), message, fix })
}

/// The snapshot a pod's agent in `namespace` builds from these objects (pure): each is read
/// and validated as the agent's watch does, one that fails is left out and reported, and the
/// revision is the agent's when the objects are the same. `profiles` should hold only the
/// profile of interest (the agent watches its own alone; another profile would change the
/// revision). For listings made outside the agent: `spearlet explain` in cluster mode, and
/// anything else that shows a profile's decision log from the API (list, then
/// [`Snapshot::build`] through this, then `policy::CompiledProfile` and `policy::explain`).
pub fn snapshot_of_listed(
    namespace: &str,
    servers: &[Arc<DynamicObject>],
    profiles: &[Arc<DynamicObject>],
) -> Snapshot {
    build(namespace, servers, profiles, Vec::new())
}

/// The snapshot of the stored objects (pure): each object is read into its Rust type and
/// validated; one that fails is left out and reported.
fn build(
    namespace: &str,
    servers: &[Arc<DynamicObject>],
    profiles: &[Arc<DynamicObject>],
    mut problems: Vec<SourceProblem>,
) -> Snapshot {
    let mut entries = Vec::with_capacity(servers.len() + profiles.len());
    for object in servers {
        match read::<McpServer>(namespace, Kind::Server, object) {
            Ok((file, version, server)) => entries.push(Entry::new(file, 0, version, Object::Server(server))),
            Err(found) => problems.extend(found),
        }
    }
    for object in profiles {
        match read::<McpProfile>(namespace, Kind::Profile, object) {
            Ok((file, version, profile)) => entries.push(Entry::new(file, 0, version, Object::Profile(profile))),
            Err(found) => problems.extend(found),
        }
    }
    Snapshot::build(entries, problems)
}

/// One stored object as `K` with its path and resourceVersion, or why it cannot be served.
fn read<K>(namespace: &str, kind: Kind, object: &DynamicObject) -> Result<(PathBuf, String, K), Vec<SourceProblem>>
where
    K: DeserializeOwned + Validate,
{
    let file = object_path(namespace, kind, object.metadata.name.as_deref().unwrap_or_default());
    let problem = |field: String, message: String, fix: &str| SourceProblem {
        file: file.clone(),
        line: 0,
        field,
        message,
        fix: fix.to_string(),
    };
    let unreadable = "upgrade this agent to the version of the installed CRDs, or fix the object";
    let value = serde_json::to_value(object)
        .map_err(|e| vec![problem("document".into(), format!("the object cannot be re-encoded: {e}"), unreadable)])?;
    let mut unknown = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| unknown.push(crate::api::manifest::ignored_field(&path));
    let typed: K =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(value, &mut record)).map_err(|e| {
            let field = match e.path().to_string() {
                path if path == "." => "document".to_string(),
                path => path,
            };
            vec![problem(field, format!("this agent cannot read the object: {}", e.inner()), unreadable)]
        })?;
    // A spec field this agent does not know (CRDs newer than the agent) may narrow what the
    // object allows (`enabled: false` did): ignoring it could serve more than the platform team
    // wrote, so the object is left out. Status and metadata are not policy.
    unknown.retain(|p| p.starts_with("spec"));
    if !unknown.is_empty() {
        return Err(unknown
            .into_iter()
            .map(|field| {
                let message = "a field this agent does not know (the installed CRDs are newer): the object is left \
                               out rather than served without it"
                    .to_string();
                problem(field, message, "restart the pod so the webhook injects the agent of the installed version")
            })
            .collect());
    }
    let invalid = typed.validate();
    if !invalid.is_empty() {
        return Err(invalid.into_iter().map(|e| problem(e.field, e.message, &e.fix)).collect());
    }
    // The API server sets a resourceVersion on every object it returns; an empty one would still
    // hash stably.
    let version = object.metadata.resource_version.clone().unwrap_or_default();
    Ok((file, version, typed))
}

// === impl KubeWatch ===

/// A running Kubernetes registry watch; serves its snapshots, and stops when dropped.
#[derive(Debug)]
pub struct KubeWatch {
    namespace: String,
    synced: watch::Receiver<bool>,
    task: WatchTask,
}

impl KubeWatch {
    /// Waits until the first complete snapshot (both kinds listed) is published; at once after
    /// that. Fails if the watch stopped first. Does not time out: while the API cannot be
    /// listed, the snapshot's problems say why.
    pub async fn ready(&self) -> Result<(), Error> {
        let mut synced = self.synced.clone();
        match synced.wait_for(|synced| *synced).await {
            Ok(_) => Ok(()),
            Err(_) => Err(Error::Stopped { namespace: self.namespace.clone() }),
        }
    }

    /// Whether the first complete snapshot has been published.
    pub fn is_ready(&self) -> bool {
        *self.synced.borrow()
    }

    /// A shareable view of the snapshots, for the agent's doors; it keeps the last snapshot (and
    /// stops changing) once this watch is dropped.
    pub fn view(&self) -> Arc<dyn RegistryView> {
        self.task.view()
    }

    /// Completes when the watch task ends (shutdown, or a panic, reported as an error), for a
    /// `select!` over critical tasks. Completes at once if called again after it ended.
    pub(crate) async fn finished(&mut self) -> Result<(), Error> {
        self.task.finished().await.map_err(|source| Error::TaskFailed { namespace: self.namespace.clone(), source })
    }
}

impl RegistryView for KubeWatch {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.task.snapshot()
    }

    fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.task.watch()
    }
}

/// The watch task: step whichever reflector has news, then publish the rebuilt snapshot.
struct Loop {
    source: KubeSource,
    servers: Reflector,
    profiles: Reflector,
    publisher: Arc<Publisher>,
    synced: watch::Sender<bool>,
    stop: CancellationToken,
}

impl Loop {
    async fn run(self) {
        let Loop { mut source, mut servers, mut profiles, publisher, synced, stop } = self;
        loop {
            let (kind, update) = tokio::select! {
                () = stop.cancelled() => break,
                update = servers.next() => (Kind::Server, update),
                update = profiles.next() => (Kind::Profile, update),
            };
            source.apply(kind, &update);
            // Publisher skips a snapshot with the same revision and problems (a 410, a relist
            // that found what was already there).
            publisher.publish(source.snapshot());
            if source.is_listed() && !*synced.borrow() {
                synced.send_replace(true);
            }
        }
        tracing::debug!("registry watch stopped");
    }
}

#[cfg(test)]
mod tests {
    use futures::stream;
    use kube::core::Status;
    use serde_json::json;

    use super::*;

    fn object(kind: Kind, name: &str, version: &str, spec: serde_json::Value) -> DynamicObject {
        let resource = kind.resource();
        serde_json::from_value(json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version,
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": spec,
        }))
        .expect("a fixture must be a DynamicObject")
    }

    fn server(name: &str, version: &str) -> DynamicObject {
        object(Kind::Server, name, version, json!({"transport": "stdio", "stdio": {"command": "node"}}))
    }

    fn profile(name: &str, version: &str) -> DynamicObject {
        object(Kind::Profile, name, version, json!({"servers": ["fs"]}))
    }

    fn arcs(objects: Vec<DynamicObject>) -> Vec<Arc<DynamicObject>> {
        objects.into_iter().map(Arc::new).collect()
    }

    fn refused() -> watcher::Error {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        watcher::Error::WatchStartFailed(kube::Error::Service(Box::new(io)))
    }

    fn api_error(code: u16, reason: &str) -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Status::failure("denied", reason).with_code(code).boxed()))
    }

    fn gone() -> watcher::Error {
        watcher::Error::WatchError(Status::failure("too old resource version: 1 (5)", "Expired").with_code(410).boxed())
    }

    #[test]
    fn objects_keep_their_resource_version_and_path() {
        let snap = build("ns", &arcs(vec![server("fs", "11")]), &arcs(vec![profile("p", "12")]), Vec::new());
        assert!(!snap.is_degraded(), "{:?}", snap.problems());
        assert_eq!(snap.server("fs").map(|s| s.resource_version.as_str()), Some("11"));
        assert_eq!(snap.profile("p").map(|p| p.resource_version.as_str()), Some("12"));
        let newer = build("ns", &arcs(vec![server("fs", "13")]), &arcs(vec![profile("p", "12")]), Vec::new());
        assert_ne!(snap.revision(), newer.revision(), "a new resourceVersion is a new revision");
        let same = build("ns", &arcs(vec![server("fs", "11")]), &arcs(vec![profile("p", "12")]), Vec::new());
        assert_eq!(snap.revision(), same.revision());
    }

    #[test]
    fn an_invalid_object_is_left_out_and_reported_by_field() {
        // The API server admits this (no CEL rule checks glob syntax); local validation does not.
        let bad = object(
            Kind::Server,
            "bad",
            "3",
            json!({"transport": "stdio", "stdio": {"command": "node"}, "allowedTools": ["read_[a-z]"]}),
        );
        let snap = build("ns", &arcs(vec![server("fs", "1"), bad]), &[], Vec::new());
        assert!(snap.server("bad").is_none() && snap.server("fs").is_some());
        let problem = &snap.problems()[0];
        assert_eq!(problem.file, PathBuf::from("namespaces/ns/mcpservers/bad"));
        assert!(problem.field.starts_with("spec.allowedTools"), "{problem}");
    }

    #[test]
    fn an_object_this_agent_cannot_read_is_left_out_naming_the_field() {
        let newer = object(Kind::Server, "ws", "4", json!({"transport": "websocket"}));
        let snap = build("ns", &arcs(vec![newer, server("fs", "1")]), &[], Vec::new());
        assert!(snap.server("ws").is_none() && snap.server("fs").is_some());
        assert_eq!(snap.problems()[0].field, "spec.transport");
        assert!(snap.problems()[0].message.contains("websocket"), "{}", snap.problems()[0]);
    }

    /// Version skew: an agent older than the CRDs meets a spec field it does not know. It may
    /// narrow the object, so the object is left out (fail closed), naming the field; new status
    /// fields are the operator's and change nothing.
    #[test]
    fn a_spec_field_this_agent_does_not_know_leaves_the_object_out_and_status_fields_do_not() {
        let stdio = json!({"command": "node"});
        let newer = object(Kind::Server, "new", "4", json!({"transport": "stdio", "stdio": stdio, "futureLimit": 1}));
        let nested = object(
            Kind::Server,
            "nested",
            "4",
            json!({"transport": "stdio", "stdio": {"command": "node", "sandbox": true}}),
        );
        let mut with_status = server("fs", "1");
        with_status.data["status"] = json!({"futureCondition": "x", "toolCount": 2});
        let snap = build("ns", &arcs(vec![newer, nested, with_status]), &[], Vec::new());
        assert!(snap.server("new").is_none() && snap.server("nested").is_none());
        assert!(snap.server("fs").is_some(), "an unknown status field is no reason: {:?}", snap.problems());
        let fields: Vec<&str> = snap.problems().iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["spec.stdio.sandbox", "spec.futureLimit"], "{:?}", snap.problems());
        assert!(snap.problems().iter().all(|p| p.fix.contains("restart the pod")), "{:?}", snap.problems());
    }

    #[test]
    fn watch_errors_become_problems_except_410_gone() {
        assert_eq!(watch_problem("ns", Kind::Server, &gone()), None);
        let unreachable = watch_problem("ns", Kind::Server, &refused()).expect("a problem");
        assert!(unreachable.message.starts_with("kubernetes API unreachable: "), "{unreachable}");
        assert!(unreachable.message.contains("connection refused"), "{unreachable}");
        assert_eq!(unreachable.file, PathBuf::from("namespaces/ns/mcpservers"));
        let forbidden = watch_problem("ns", Kind::Profile, &api_error(403, "Forbidden")).expect("a problem");
        assert!(forbidden.message.contains("may not list and watch mcpprofiles in namespace ns"), "{forbidden}");
        assert!(forbidden.fix.contains(AGENT_ROLE), "{forbidden}");
        let missing = watch_problem("ns", Kind::Server, &api_error(404, "NotFound")).expect("a problem");
        assert!(missing.fix.contains("CRDs"), "{missing}");
    }

    #[test]
    fn managed_fields_are_dropped_before_the_store() {
        let Event::Apply(object) = drop_managed_fields(Event::Apply(server("fs", "1"))) else { panic!("apply") };
        assert_eq!(object.metadata.managed_fields, None);
    }

    // --- the watch task, over scripted watchers ---

    /// A backoff that never waits, so scripted failures replay at once.
    struct NoWait;
    impl Iterator for NoWait {
        type Item = Duration;
        fn next(&mut self) -> Option<Duration> {
            Some(Duration::ZERO)
        }
    }
    impl Backoff for NoWait {
        fn reset(&mut self) {}
    }

    fn no_wait() -> Box<dyn Backoff> {
        Box::new(NoWait)
    }

    type Script = Vec<watcher::Result<Event<DynamicObject>>>;

    /// Watchers whose event lists the test sends one per (re)connect; a watcher idles after its
    /// script, as a quiet watch does.
    fn scripted() -> (tokio::sync::mpsc::UnboundedSender<Script>, Connect) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Script>();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let connect = move || -> EventStream {
            let rx = Arc::clone(&rx);
            stream::once(async move { rx.lock().await.recv().await.unwrap_or_default() })
                .flat_map(stream::iter)
                .chain(stream::pending())
                .boxed()
        };
        (tx, Box::new(connect))
    }

    fn listed(objects: Vec<DynamicObject>) -> Script {
        let mut script = vec![Ok(Event::Init)];
        script.extend(objects.into_iter().map(|o| Ok(Event::InitApply(o))));
        script.push(Ok(Event::InitDone));
        script
    }

    struct Scripted {
        servers: tokio::sync::mpsc::UnboundedSender<Script>,
        profiles: tokio::sync::mpsc::UnboundedSender<Script>,
        watch: KubeWatch,
    }

    fn start() -> Scripted {
        start_with(WatchOptions { relist: None })
    }

    fn start_with(options: WatchOptions) -> Scripted {
        let (servers, server_connect) = scripted();
        let (profiles, profile_connect) = scripted();
        let watch = KubeSource::spawn(
            &tokio::runtime::Handle::current(),
            "ns",
            "p",
            [server_connect, profile_connect],
            &no_wait,
            options,
            &CancellationToken::new(),
        );
        Scripted { servers, profiles, watch }
    }

    async fn until(watch: &KubeWatch, what: &str, condition: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
        let mut rx = watch.watch();
        let waited = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| condition(s))).await;
        match waited {
            Ok(Ok(snapshot)) => snapshot.clone(),
            _ => panic!("timed out waiting for {what}; last snapshot: {:?}", watch.snapshot()),
        }
    }

    #[tokio::test]
    async fn the_source_is_degraded_and_not_ready_until_both_kinds_are_listed() {
        let s = start();
        assert!(s.watch.snapshot().is_degraded() && !s.watch.is_ready());
        s.servers.send(listed(vec![server("fs", "1")])).expect("script");
        let half = until(&s.watch, "the servers", |snap| snap.server("fs").is_some()).await;
        assert!(half.is_degraded() && !s.watch.is_ready(), "the profile is not listed yet: {half:?}");
        s.profiles.send(listed(vec![profile("p", "2")])).expect("script");
        tokio::time::timeout(Duration::from_secs(5), s.watch.ready()).await.expect("ready in time").expect("ready");
        let snap = s.watch.snapshot();
        assert!(!snap.is_degraded(), "{:?}", snap.problems());
        assert!(snap.server("fs").is_some() && snap.profile("p").is_some());
    }

    #[tokio::test]
    async fn a_failed_watch_keeps_the_last_objects_degraded_until_a_fresh_list() {
        let s = start();
        s.profiles.send(listed(vec![profile("p", "2")])).expect("script");
        let mut first = listed(vec![server("fs", "1"), server("gone", "1")]);
        first.push(Ok(Event::Apply(server("fs", "3"))));
        first.push(Err(refused()));
        s.servers.send(first).expect("script");
        let degraded = until(&s.watch, "the outage", |snap| snap.is_degraded() && snap.server("fs").is_some()).await;
        assert_eq!(degraded.server("fs").map(|v| v.resource_version.as_str()), Some("3"), "the last good objects");
        assert!(degraded.problems().iter().any(|p| p.message.contains("unreachable")), "{:?}", degraded.problems());
        assert!(s.watch.is_ready(), "ready stays true: it means the first sync happened");
        // The fresh watcher relists: what changed meanwhile is picked up, and the problem clears.
        s.servers.send(listed(vec![server("fs", "5"), server("new", "5")])).expect("script");
        let healed = until(&s.watch, "the relist", |snap| !snap.is_degraded()).await;
        let names: Vec<&String> = healed.servers().keys().collect();
        assert_eq!(names, ["fs", "new"]);
    }

    #[tokio::test]
    async fn a_410_gone_relists_without_marking_the_source_degraded() {
        let s = start();
        s.profiles.send(listed(vec![profile("p", "2")])).expect("script");
        let mut first = listed(vec![server("fs", "1")]);
        first.push(Err(gone()));
        s.servers.send(first).expect("script");
        s.watch.ready().await.expect("ready");
        let mut source_rx = s.watch.watch();
        s.servers.send(listed(vec![server("other", "7")])).expect("script");
        let snap = until(&s.watch, "the relist", |snap| snap.server("other").is_some()).await;
        assert!(!snap.is_degraded(), "{:?}", snap.problems());
        assert!(snap.server("fs").is_none());
        assert!(!source_rx.borrow_and_update().is_degraded());
    }

    /// A watch that silently missed an event (the server `new` was created, `fs` deleted, and
    /// no event came) heals at the next periodic relist, with no error in between.
    #[tokio::test]
    async fn a_missed_event_heals_at_the_periodic_relist() {
        let relist = Relist { min: Duration::from_millis(50), max: Duration::from_millis(150) };
        let s = start_with(WatchOptions { relist: Some(relist) });
        s.profiles.send(listed(vec![profile("p", "2")])).expect("script");
        s.servers.send(listed(vec![server("fs", "1")])).expect("script");
        s.watch.ready().await.expect("ready");
        let mut rx = s.watch.watch();
        s.servers.send(listed(vec![server("new", "9")])).expect("the relist's script");
        let healed = until(&s.watch, "the relist", |snap| snap.server("new").is_some()).await;
        assert!(healed.server("fs").is_none() && !healed.is_degraded(), "{:?}", healed.problems());
        assert!(!rx.borrow_and_update().is_degraded(), "a relist is no outage");
        // The profile relists too, on its own schedule.
        s.profiles.send(listed(vec![profile("p", "3")])).expect("the profile's relist");
        until(&s.watch, "the profile's relist", |snap| snap.profile("p").is_some_and(|p| p.resource_version == "3"))
            .await;
    }

    #[test]
    fn relist_delays_stay_within_their_bounds_and_spread() {
        let delays: Vec<Duration> = (0..200).map(|_| Relist::DEFAULT.next_delay()).collect();
        assert!(delays.iter().all(|d| (Relist::DEFAULT.min..=Relist::DEFAULT.max).contains(d)), "{delays:?}");
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "jittered, not one period: {} distinct", distinct.len());
        let fixed = Relist { min: Duration::from_secs(5), max: Duration::from_secs(5) };
        assert_eq!(fixed.next_delay(), Duration::from_secs(5));
        let crossed = Relist { min: Duration::from_secs(9), max: Duration::from_secs(1) };
        assert_eq!(crossed.next_delay(), Duration::from_secs(9));
    }

    #[tokio::test]
    async fn cancelling_shutdown_stops_the_task_and_ready_fails() {
        let (_servers, server_connect) = scripted();
        let (_profiles, profile_connect) = scripted();
        let shutdown = CancellationToken::new();
        let mut watch = KubeSource::spawn(
            &tokio::runtime::Handle::current(),
            "ns",
            "p",
            [server_connect, profile_connect],
            &no_wait,
            WatchOptions::default(),
            &shutdown,
        );
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), watch.finished()).await.expect("stops in time").expect("clean");
        assert!(matches!(watch.ready().await, Err(Error::Stopped { .. })));
    }

    #[test]
    fn names_are_checked_before_they_reach_a_selector() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let _guard = runtime.enter();
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("uri"));
        let client = Client::try_from(config).expect("client");
        let token = CancellationToken::new();
        let bad_profile = KubeSource::watch(client.clone(), "ns", "p,metadata.namespace=x", &token);
        assert!(matches!(bad_profile, Err(Error::InvalidProfile { .. })));
        let bad_namespace = KubeSource::watch(client, "Not_A_Namespace", "p", &token);
        assert!(matches!(bad_namespace, Err(Error::InvalidNamespace { .. })));
    }
}
