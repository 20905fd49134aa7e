//! The webhook's reads from memory: reflector stores of Namespaces, McpProfiles and McpServers,
//! so a review costs no API round trip in the common case.
//!
//! ```text
//! watch Namespaces ─┐
//! watch McpProfiles ┼─▶ stores (this replica's own) ──▶ CachedLookup::fetch ──▶ Inputs
//! watch McpServers ─┘         miss ─▶ KubeLookup (bounded GET, read-through) ─┘
//!                 not yet listed ─▶ KubeLookup for the whole review
//! ```
//!
//! A miss is read through, never trusted: a store can be a moment behind the pod that needs it
//! (`kubectl apply -f profile.yaml -f pod.yaml`). Why, what a cache can still miss, and why
//! Secrets stay direct reads: `src/operator/README.md`, "Webhook caches".

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, info, warn};

use super::lookup::{Inputs, KubeLookup, Lookup, LookupError};
use super::metrics::WebhookMetrics;
use crate::api::{McpProfile, McpServer};
use crate::operator::scope::{Scope, profile_servers_in};

/// [`Lookup`] from reflector stores, reading through [`KubeLookup`] on a miss (see the module
/// header for the semantics).
#[derive(Clone)]
pub struct CachedLookup {
    namespaces: Store<Namespace>,
    profiles: Store<McpProfile>,
    servers: Store<McpServer>,
    synced: Arc<AtomicBool>,
    direct: KubeLookup,
    metrics: WebhookMetrics,
}

impl CachedLookup {
    /// Starts the three reflectors in `scope` (they stop on `stop`) and answers from them once
    /// all three have listed; `direct` serves misses and everything before that.
    pub(crate) fn start(
        client: Client,
        scope: &Scope,
        direct: KubeLookup,
        metrics: WebhookMetrics,
        stop: CancellationToken,
    ) -> Self {
        let namespaces = spawn_reflector(Api::<Namespace>::all(client.clone()), scope.namespaces(), "Namespace", &stop);
        let profiles =
            spawn_reflector(scope.api::<McpProfile>(client.clone()), watcher::Config::default(), "McpProfile", &stop);
        let servers = spawn_reflector(scope.api::<McpServer>(client), watcher::Config::default(), "McpServer", &stop);
        CachedLookup::from_stores(namespaces, profiles, servers, direct, metrics)
    }

    /// A lookup over stores the caller fills (tests force misses this way). Spawns the task that
    /// marks it synced once all three stores have listed.
    pub fn from_stores(
        namespaces: Store<Namespace>,
        profiles: Store<McpProfile>,
        servers: Store<McpServer>,
        direct: KubeLookup,
        metrics: WebhookMetrics,
    ) -> Self {
        let lookup = CachedLookup { namespaces, profiles, servers, synced: Arc::default(), direct, metrics };
        let listed = |store: Option<Result<(), _>>| matches!(store, Some(Ok(())));
        if listed(lookup.namespaces.wait_until_ready().now_or_never())
            && listed(lookup.profiles.wait_until_ready().now_or_never())
            && listed(lookup.servers.wait_until_ready().now_or_never())
        {
            lookup.synced.store(true, Ordering::Release);
            lookup.metrics.caches_synced_now();
            return lookup;
        }
        let waiting = lookup.clone();
        tokio::spawn(async move {
            let listed = tokio::try_join!(
                waiting.namespaces.wait_until_ready(),
                waiting.profiles.wait_until_ready(),
                waiting.servers.wait_until_ready(),
            );
            // Err: a reflector ended (shutdown) before listing; reviews keep reading directly.
            if listed.is_ok() {
                info!("webhook caches listed; answering reviews from memory");
                waiting.synced.store(true, Ordering::Release);
                waiting.metrics.caches_synced_now();
            }
        });
        lookup
    }
}

impl Lookup for CachedLookup {
    async fn fetch(&self, namespace: &str, profile: Option<&str>) -> Result<Inputs, LookupError> {
        if !self.synced.load(Ordering::Acquire) {
            return self.direct.fetch(namespace, profile).await;
        }
        let namespace_labels = match self.namespaces.get(&ObjectRef::new(namespace)) {
            Some(cached) => cached.labels().clone(),
            None => {
                self.metrics.read_through("Namespace");
                self.direct.namespace_labels(namespace).await?
            }
        };
        let Some(name) = profile else {
            return Ok(Inputs { namespace_labels, ..Inputs::default() });
        };
        let Some(profile) = self.profiles.get(&ObjectRef::new(name).within(namespace)) else {
            self.metrics.read_through("McpProfile");
            let Some(profile) = self.direct.profile(namespace, name).await? else {
                return Ok(Inputs { namespace_labels, ..Inputs::default() });
            };
            // Just created: the stores are behind for this namespace, so read the rest too.
            let servers = self.direct.servers(namespace, &profile).await?;
            let secrets = self.direct.secrets(namespace, &profile, &servers).await?;
            return Ok(Inputs { namespace_labels, profile: Some(profile), servers, secrets });
        };
        let profile = McpProfile::clone(&profile);
        let mut servers = profile_servers_in(&self.servers, namespace, &profile);
        let missing: Vec<&str> =
            profile.spec.servers.iter().map(String::as_str).filter(|name| !servers.contains_key(*name)).collect();
        if !missing.is_empty() {
            for _ in &missing {
                self.metrics.read_through("McpServer");
            }
            for server in self.direct.servers_named(namespace, &missing).await? {
                servers.insert(server.name_any(), server);
            }
        }
        let servers: Vec<McpServer> = servers.into_values().collect();
        let secrets = self.direct.secrets(namespace, &profile, &servers).await?;
        Ok(Inputs { namespace_labels, profile: Some(profile), servers, secrets })
    }
}

/// Runs a reflector of `api` until `stop` (retrying with backoff; the store keeps its last state
/// meanwhile) and returns its store.
fn spawn_reflector<K>(api: Api<K>, config: watcher::Config, kind: &'static str, stop: &CancellationToken) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let span = tracing::info_span!("webhook_cache", kind);
    spawn_stripped_reflector(api, config, span, stop, |event| {
        if let Err(error) = event {
            warn!(%error, "webhook cache watch failed; retrying");
        }
    })
}

/// Runs a reflector of `api` in `span` until `stop` (retrying with backoff; the store keeps its
/// last state meanwhile), with `managedFields` dropped (the largest part of most objects, read by
/// no one here), calling `on_event` with each watch step, and returns its store. Shared by the
/// webhook's caches and the admin view (`admin_view`), which records the steps for its page.
pub(crate) fn spawn_stripped_reflector<K, F>(
    api: Api<K>,
    config: watcher::Config,
    span: tracing::Span,
    stop: &CancellationToken,
    mut on_event: F,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    F: FnMut(&Result<watcher::Event<K>, watcher::Error>) + Send + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let events = watcher(api, config)
        .default_backoff()
        .modify(|object: &mut K| object.meta_mut().managed_fields = None)
        .reflect(writer)
        .take_until(stop.clone().cancelled_owned());
    let task = async move {
        tokio::pin!(events);
        while let Some(event) = events.next().await {
            on_event(&event);
        }
    };
    tokio::spawn(task.instrument(span));
    store
}
