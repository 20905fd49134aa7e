//! The agent's RoleBinding in every injection-enabled namespace, and none elsewhere; the same
//! for the operator's own Secret reader binding (`rbac::secret_reader_binding`): it reads the
//! grant annotations of Secrets only where pods can use them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding, Subject};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as RunConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::context::{Context, Error, Feed, TRIGGER_BUFFER, cache, error_policy, log_outcome, stopped};
use super::metrics::{ControllerMetrics, KIND_NAMESPACE};
use crate::api::keys::{
    AGENT_ROLE, FIELD_MANAGER, INJECTION_ENABLED, LABEL_INJECTION, LABEL_MANAGED_BY, SECRET_READER_ROLE,
};
use crate::operator::rbac::{agent_role_binding, binding_is_current, secret_reader_binding, subject_of_user};
use crate::operator::scope::Scope;
use crate::telemetry::error_chain;

/// The agent RoleBinding of each injection-enabled namespace, re-reconciled from the cache of
/// the bindings we manage (someone deleting one gets it back). Returns that cache and the
/// controller.
pub(super) fn namespace_controller(
    client: &Client,
    scope: &Scope,
    run_config: RunConfig,
    ctx: &Arc<Context>,
    (binding_writer, binding_cache_ready): Feed<RoleBinding>,
    token: &CancellationToken,
) -> (impl Future<Output = ()> + use<>, impl Future<Output = ()> + use<>) {
    let namespace_controller =
        Controller::new(Api::<Namespace>::all(client.clone()), scope.namespaces()).with_config(run_config);
    let namespaces = namespace_controller.store();
    let (namespace_tx, namespace_rx) = mpsc::channel(TRIGGER_BUFFER);
    let managed = watcher::Config::default()
        .labels(&format!("{LABEL_MANAGED_BY}={FIELD_MANAGER}"))
        .fields(&format!("metadata.name={AGENT_ROLE}"));
    let binding_cache = cache(
        binding_writer,
        scope.api(client.clone()),
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
                delete_binding(&api, AGENT_ROLE, &name, &ctx.metrics).await?;
                apply_binding(&api, &name, &desired, &ctx.metrics).await?;
            }
            _ => apply_binding(&api, &name, &desired, &ctx.metrics).await?,
        }
        // Not cached (the reflector watches one name): applied on every reconcile, a no-op
        // write when unchanged, and again after SECRET_READER_RECHECK in case it was deleted.
        if let Some(subject) = &ctx.operator_subject {
            apply_binding(&api, &name, &secret_reader_binding(&name, subject.clone()), &ctx.metrics).await?;
            return Ok(Action::requeue(SECRET_READER_RECHECK));
        }
    } else if current.is_some() {
        delete_binding(&api, AGENT_ROLE, &name, &ctx.metrics).await?;
        delete_binding(&api, SECRET_READER_ROLE, &name, &ctx.metrics).await?;
        tracing::info!(namespace = %name, "injection disabled: removed the agent and Secret reader RoleBindings");
    }
    Ok(Action::await_change())
}

/// How often an enabled namespace's Secret reader binding is applied again.
const SECRET_READER_RECHECK: std::time::Duration = std::time::Duration::from_secs(300);

/// The operator's own RBAC subject, from a SelfSubjectReview (every authenticated user may ask,
/// through `system:basic-user`); `None`, logged, when it cannot be learned: the operator then
/// reads no Secret, so references are not granted (the webhook answers with an error).
pub(super) async fn own_subject(client: &Client) -> Option<Subject> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), &SelfSubjectReview::default()).await {
        Ok(review) => {
            let user = review.status.and_then(|s| s.user_info).and_then(|u| u.username).filter(|u| !u.is_empty());
            let subject = user.as_deref().map(subject_of_user);
            if subject.is_none() {
                tracing::warn!("the SelfSubjectReview named no user: no Secret reader RoleBindings");
            }
            subject
        }
        Err(error) => {
            tracing::warn!(error = %error_chain(&error), "cannot learn the operator's own user (SelfSubjectReview): no Secret reader RoleBindings, so Secret grants cannot be checked");
            None
        }
    }
}

/// Whether a namespace's labels opt it into injection (`mcp.spear.dev/injection=enabled`).
pub(super) fn injection_enabled(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(LABEL_INJECTION)).is_some_and(|v| v == INJECTION_ENABLED)
}

async fn apply_binding(
    api: &Api<RoleBinding>,
    namespace: &str,
    desired: &RoleBinding,
    metrics: &ControllerMetrics,
) -> Result<(), Error> {
    let name =
        if desired.metadata.name.as_deref() == Some(SECRET_READER_ROLE) { SECRET_READER_ROLE } else { AGENT_ROLE };
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(desired)).await.map_err(|source| {
        Error::ApplyRoleBinding { name, namespace: namespace.to_string(), source: Box::new(source) }
    })?;
    ControllerMetrics::count(&metrics.rbac_writes, "RoleBinding");
    if name == AGENT_ROLE {
        tracing::info!(%namespace, "applied the agent RoleBinding");
    } else {
        tracing::debug!(%namespace, binding = name, "applied the RoleBinding");
    }
    Ok(())
}

async fn delete_binding(
    api: &Api<RoleBinding>,
    name: &'static str,
    namespace: &str,
    metrics: &ControllerMetrics,
) -> Result<(), Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_not_found() => {}
        Err(source) => {
            return Err(Error::DeleteRoleBinding { name, namespace: namespace.to_string(), source: Box::new(source) });
        }
    }
    ControllerMetrics::count(&metrics.rbac_writes, "RoleBinding");
    Ok(())
}

// === impl Context ===

impl Context {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_event_triggers_its_namespace() {
        let binding = agent_role_binding("team-a");
        let refs = namespaces_to_trigger(&watcher::Event::Delete(binding), &[]);
        assert_eq!(refs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["team-a"]);
    }

    #[test]
    fn only_the_enabled_label_value_enables_injection() {
        let labels = |v: &str| BTreeMap::from([(LABEL_INJECTION.to_string(), v.to_string())]);
        assert!(injection_enabled(Some(&labels("enabled"))));
        assert!(!injection_enabled(Some(&labels("disabled"))));
        assert!(!injection_enabled(Some(&BTreeMap::new())));
        assert!(!injection_enabled(None));
    }
}
