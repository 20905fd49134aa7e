//! McpProfile status, from the servers it allows in the server cache; that cache's events say
//! which profiles to reconcile again (coalesced).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as RunConfig, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::context::{
    Context, Error, Feed, SECRET_RECHECK, TRIGGER_BUFFER, apply_status, cache, error_policy, identity, log_outcome,
    now, stopped,
};
use super::metrics::ControllerMetrics;
use super::profile_index::ProfileIndex;
use crate::api::identity::server_identity_uses;
use crate::api::keys::{KIND_PROFILE, KIND_SERVER};
use crate::api::secret_grant::profile_secret_refs;
use crate::api::{McpProfile, McpServer};
use crate::operator::scope::{Scope, profile_servers_among};
use crate::operator::status::{fold_secret_refusals, known_tools, profile_status};

/// McpProfile status, re-reconciled (coalesced) from the server cache it reads. Returns the
/// server cache, the coalescer and the controller.
pub(super) fn profile_controller(
    client: &Client,
    scope: &Scope,
    run_config: RunConfig,
    ctx: &Arc<Context>,
    (server_writer, server_cache_ready): Feed<McpServer>,
    token: &CancellationToken,
) -> (impl Future<Output = ()> + use<>, impl Future<Output = ()> + use<>, impl Future<Output = ()> + use<>) {
    let profile_controller =
        Controller::new(scope.api::<McpProfile>(client.clone()), watcher::Config::default()).with_config(run_config);
    let profiles = profile_controller.store();
    let (profile_tx, profile_rx) = mpsc::channel(TRIGGER_BUFFER);
    let index_ctx = ctx.clone();
    let server_cache = cache(
        server_writer,
        scope.api::<McpServer>(client.clone()),
        watcher::Config::default(),
        server_cache_ready,
        stopped(token),
        move |event| profiles_to_trigger(&mut index_ctx.profile_index.lock(), event, &profiles),
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

/// Profile triggers are coalesced over this window. Without it, a burst of server events
/// (servers created, or their first statuses written, by the thousand) would reconcile each
/// selecting profile once per event it matched: each such reconcile scans the namespace's
/// servers, and at 10,000 servers that scan is most of the controller's CPU
/// (benches/reconcile.rs). The first trigger after a quiet window passes at once; the window's
/// others, deduplicated, at its end. Unlike kube-runtime's debounce, which keeps delaying an
/// object while triggers keep coming (a profile selecting thousands of probed servers might never
/// be reconciled), a profile's status lags a change by at most one window.
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

/// The profiles to reconcile again after a server cache event (the index's), and after a
/// complete re-list every profile; profiles gone from the store leave the index.
fn profiles_to_trigger(
    index: &mut ProfileIndex,
    event: &watcher::Event<McpServer>,
    profiles: &Store<McpProfile>,
) -> Vec<ObjectRef<McpProfile>> {
    let mut affected = index.on_server_event(event);
    let relisted = matches!(event, watcher::Event::InitDone);
    if relisted {
        affected = profiles.state().iter().map(|p| ObjectRef::from_obj(&**p)).collect();
    }
    if relisted || affected.iter().any(|p| profiles.get(p).is_none()) {
        index.retain_profiles(|p| profiles.get(p).is_some());
        affected.retain(|p| profiles.get(p).is_some());
    }
    affected
}

#[tracing::instrument(target = "spear_trace", name = "operator.reconcile", skip_all, fields(kind = KIND_PROFILE, profile = profile.metadata.name.as_deref().unwrap_or_default()))]
async fn reconcile_profile(profile: Arc<McpProfile>, ctx: Arc<Context>) -> Result<Action, Error> {
    ControllerMetrics::count(&ctx.metrics.reconciles, KIND_PROFILE);
    let (namespace, name) = identity(&*profile)?;
    // Before the first list, "missing" would be a lie written to the status.
    ctx.servers_ready.wait(KIND_SERVER).await?;
    // Indexed before the servers are read: a server event from now on triggers this profile again.
    let selected = ctx.profile_index.lock().set_profile(&profile);
    let servers = profile_servers_among(&ctx.servers, &namespace, &profile, &selected);
    let now = now();
    let mut status = profile_status(&profile, &servers, &known_tools(&servers), now.clone());
    let references = profile_secret_refs(&profile);
    let grants = ctx.secret_grants(&namespace, references.iter().map(|r| r.secret.as_str())).await?;
    let old = profile.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    // Unreadable Secrets (a namespace without injection, so no pod can use them): not checked.
    let secret_refusals = grants.as_ref().map(|g| g.profile_refusals(&profile)).unwrap_or_default();
    let mut refusals: Vec<String> = secret_refusals.iter().map(ToString::to_string).collect();
    // The pod's identity, as the webhook grants it: a server it would leave out shows here.
    let asks_identity = servers.iter().any(|s| !server_identity_uses(s).is_empty());
    let identity_refusals = servers.iter().flat_map(|s| profile.identity_refusals(s, &ctx.forbidden_audiences));
    refusals.extend(identity_refusals.map(|r| r.to_string()));
    let needs_grants = (!references.is_empty() && grants.is_some()) || asks_identity;
    fold_secret_refusals(&mut status.conditions, old, needs_grants, &refusals, profile.metadata.generation, now);
    if profile.status.as_ref() != Some(&status) {
        let api: Api<McpProfile> = Api::namespaced(ctx.client.clone(), &namespace);
        apply_status(&api, &namespace, &name, &status, &ctx.metrics).await?;
        let old = profile.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        ctx.report_rejection(&*profile, old, &status.conditions).await;
    }
    Ok(if !references.is_empty() { Action::requeue(SECRET_RECHECK) } else { Action::await_change() })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
