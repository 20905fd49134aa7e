//! What every reconcile of a term shares: the [`Context`] (client, caches, metrics), the caches'
//! feeds, the error policy, and the status write and Event every kind makes the same way.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{RoleBinding, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::metrics::{ControllerMetrics, KIND_NAMESPACE};
use super::profile_index::ProfileIndex;
use crate::api::conditions::{reasons, types};
use crate::api::identity::ForbiddenAudiences;
use crate::api::keys::{API_VERSION, FIELD_MANAGER, KIND_PROFILE, KIND_SERVER};
use crate::api::secret_grant::SecretGrants;
use crate::api::{McpProfile, McpServer};
use crate::operator::leader::LeaderError;
use crate::operator::probe::ProbeConfig;
use crate::telemetry::error_chain;

/// How often an object that references Secrets re-reads their grants (metadata GETs).
pub(super) const SECRET_RECHECK: Duration = Duration::from_secs(60);
/// Retry delay after a failed reconcile (an API error). Fixed: the API server's own
/// priority-and-fairness throttles a flood, and a status write is cheap to retry.
const ERROR_REQUEUE: Duration = Duration::from_secs(5);
/// Pending triggers from a reflector to a controller; a full buffer makes the reflector wait
/// (back-pressure), so nothing is dropped.
pub(super) const TRIGGER_BUFFER: usize = 1024;
/// Longest note of an Event (the events.k8s.io limit is 1 kB).
const MAX_EVENT_NOTE_BYTES: usize = 1024;

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
    CacheStopped { kind: &'static str },
    /// Leader election failed; this replica cannot know whether it may write.
    #[error(transparent)]
    Leader(#[from] LeaderError),
}

// === impl Context ===

/// What every reconcile of a term shares.
pub(super) struct Context {
    pub(super) client: Client,
    pub(super) recorder: Recorder,
    /// Every McpServer in scope (for profiles).
    pub(super) servers: Store<McpServer>,
    pub(super) servers_ready: CacheReady,
    /// The agent RoleBindings we manage, in scope.
    pub(super) bindings: Store<RoleBinding>,
    pub(super) bindings_ready: CacheReady,
    /// Namespaces in scope (which are injection-enabled, for `--probe-namespaces`).
    pub(super) namespaces: Store<Namespace>,
    pub(super) namespaces_ready: CacheReady,
    pub(super) probe: ProbeConfig,
    pub(super) metrics: ControllerMetrics,
    pub(super) forbidden_audiences: ForbiddenAudiences,
    /// The operator as an RBAC subject; `None`: unknown, so no Secret reader bindings.
    pub(super) operator_subject: Option<Subject>,
    /// Set once the agent ClusterRole was checked in this term.
    pub(super) agent_role_checked: AtomicBool,
    /// What each profile selects, kept from the server cache's events.
    pub(super) profile_index: parking_lot::Mutex<ProfileIndex>,
}

/// Kinds the controllers reconcile, for logs, metrics and the shared error policy.
pub(super) trait Kind {
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

pub(super) fn error_policy<K: Resource + Kind>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
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
pub(super) async fn log_outcome<K: Resource, E: std::error::Error>(
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
pub(super) fn identity<K: Resource + Kind>(obj: &K) -> Result<(String, String), Error> {
    let meta = obj.meta();
    let namespace = meta.namespace.clone().ok_or(Error::MissingMetadata { kind: K::KIND, field: "namespace" })?;
    let name = meta.name.clone().ok_or(Error::MissingMetadata { kind: K::KIND, field: "name" })?;
    Ok((namespace, name))
}

pub(super) fn now() -> Time {
    Time(Timestamp::now())
}

impl Context {
    /// The annotations of the named Secrets of `namespace` (metadata GETs; never the data);
    /// `None` when the operator may not read Secrets there: it holds `get secrets` only in
    /// injection-enabled namespaces (`rbac::secret_reader_binding`), where pods can use them.
    pub(super) async fn secret_grants(
        &self,
        namespace: &str,
        names: impl Iterator<Item = &str>,
    ) -> Result<Option<SecretGrants>, Error> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let mut grants = SecretGrants::default();
        for name in names.collect::<BTreeSet<_>>() {
            let meta = match api.get_metadata_opt(name).await {
                Ok(meta) => meta,
                Err(kube::Error::Api(status)) if status.code == 403 => return Ok(None),
                Err(source) => {
                    return Err(Error::ReadSecret {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        source: Box::new(source),
                    });
                }
            };
            grants.insert(name, meta.map(|m| m.metadata.annotations.unwrap_or_default()));
        }
        Ok(Some(grants))
    }

    /// Publishes a Warning Event on `obj` when its `Accepted` turned False (or its problems
    /// changed). A failure is logged, not returned: the status already says it.
    pub(super) async fn report_rejection<K: Resource<DynamicType = ()> + Kind>(
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
}

/// Server-side applies `status` to the status subresource under `spear-operator`. An object
/// deleted meanwhile is not an error.
pub(super) async fn apply_status<K>(
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

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> String {
    s[..s.floor_char_boundary(max)].to_string()
}

// === caches ===

/// The writing end of a cache, and the sender [`cache`] sets once it has listed.
pub(super) type Feed<K> = (reflector::store::Writer<K>, tokio::sync::watch::Sender<bool>);

/// The writing ends of the caches a term's [`Context`] reads.
pub(super) struct Feeds {
    pub(super) servers: Feed<McpServer>,
    /// The server cache's objects as it applies them, for the server controller: one watch of
    /// McpServers and one store serve both controllers.
    pub(super) server_events: reflector::ReflectHandle<McpServer>,
    pub(super) bindings: Feed<RoleBinding>,
    pub(super) namespaces: Feed<Namespace>,
}

/// Resolves when `token` is cancelled (every controller and cache needs one of its own).
pub(super) fn stopped(token: &CancellationToken) -> impl Future<Output = ()> + Send + Sync + use<> {
    let token = token.clone();
    async move { token.cancelled().await }
}

/// Runs a reflector into `writer` until `stop`, sending `trigger(event)`'s references after
/// each event reached the store.
pub(super) async fn cache<K, R, F>(
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
                // The trigger first: it may keep state (the profile index) that readers waiting
                // for `ready` must find up to date with the list.
                let refs = trigger(&event);
                if matches!(event, watcher::Event::InitDone) {
                    ready.send_replace(true);
                }
                for obj_ref in refs {
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

/// Whether a cache has finished its first list. kube's `Store::wait_until_ready` wakes only one
/// of several tasks waiting at once (a oneshot receiver keeps one waker), so reconciles that run
/// side by side, and the controller holding its runner, would leave the others asleep for good;
/// a watch channel wakes every waiter.
#[derive(Clone)]
pub(super) struct CacheReady(tokio::sync::watch::Receiver<bool>);

impl CacheReady {
    /// The readiness handle and the sender [`cache`] sets after the first `InitDone`.
    pub(super) fn new() -> (CacheReady, tokio::sync::watch::Sender<bool>) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (CacheReady(rx), tx)
    }

    pub(super) async fn wait(&self, kind: &'static str) -> Result<(), Error> {
        let mut ready = self.0.clone();
        ready.wait_for(|ready| *ready).await.map(|_| ()).map_err(|_| Error::CacheStopped { kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
