//! McpServer status: probe when due, compute, write when it changed.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as RunConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::ReflectHandle;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::context::{
    Context, Error, Feed, SECRET_RECHECK, TRIGGER_BUFFER, apply_status, cache, error_policy, identity, log_outcome,
    now, stopped,
};
use super::metrics::{ControllerMetrics, KIND_NAMESPACE};
use super::namespace::injection_enabled;
use crate::api::keys::KIND_SERVER;
use crate::api::secret_grant::{grant_secret_ref, server_secret_refs};
use crate::api::{McpServer, Validate};
use crate::mcp::oauth::grant_secret;
use crate::operator::probe::{self, Schedule};
use crate::operator::scope::Scope;
use crate::operator::status::{ProbeOutcome, ProbeResult, fold_grant, fold_secret_refusals, server_status};

/// McpServer status, re-reconciled from the namespace cache: a namespace that turns
/// injection-enabled gets its servers probed now, not at their next requeue
/// (`--probe-namespaces=injection-enabled`). Returns the namespace cache and the controller.
pub(super) fn server_controller(
    client: &Client,
    scope: &Scope,
    run_config: RunConfig,
    ctx: &Arc<Context>,
    server_events: ReflectHandle<McpServer>,
    (namespace_writer, namespace_cache_ready): Feed<Namespace>,
    token: &CancellationToken,
) -> (impl Future<Output = ()> + use<>, impl Future<Output = ()> + use<>) {
    // Fed by the server cache the profile controller reads (`profile.rs`), not a watch of its own.
    let server_controller = Controller::for_shared_stream(server_events, ctx.servers.clone());
    let (server_tx, server_rx) = mpsc::channel(TRIGGER_BUFFER);
    let servers = ctx.servers.clone();
    let namespace_cache = cache(
        namespace_writer,
        Api::<Namespace>::all(client.clone()),
        scope.namespaces(),
        namespace_cache_ready,
        stopped(token),
        move |event| servers_to_trigger(event, &servers.state()),
        server_tx,
    )
    .instrument(tracing::info_span!("reflector", kind = KIND_NAMESPACE));
    let server_controller = server_controller
        .reconcile_on(ReceiverStream::new(server_rx))
        .with_config(run_config)
        .graceful_shutdown_on(stopped(token))
        .run(reconcile_server, error_policy, ctx.clone())
        .for_each(log_outcome)
        .instrument(tracing::info_span!("controller", kind = KIND_SERVER));
    (namespace_cache, server_controller)
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
    // Unreadable Secrets (a namespace without injection, so no pod can use them): not checked.
    if let Some(grants) = grants {
        let refusals = grants.server_refusals(&server);
        fold_secret_refusals(
            &mut status.conditions,
            old,
            !references.is_empty(),
            &refusals,
            server.metadata.generation,
            now.clone(),
        );
        if let Some(reference) = grant_secret_ref(&server) {
            let presence = grant_secret::presence(grants.annotations(&reference.secret));
            fold_grant(&mut status.conditions, old, &server, presence, now.clone());
        }
    }
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

// === impl Context ===

impl Context {
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
}
