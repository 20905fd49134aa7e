//! McpProfile status, from the servers it allows in the server cache; that cache's events say
//! which profiles to reconcile again (coalesced).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::Resource;
use kube::api::Api;
use kube::core::{Selector, SelectorExt as _};
use kube::runtime::controller::{Action, Config as RunConfig, Controller};
use kube::runtime::reflector::ObjectRef;
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
use crate::api::identity::server_identity_uses;
use crate::api::keys::{KIND_PROFILE, KIND_SERVER};
use crate::api::secret_grant::profile_secret_refs;
use crate::api::{McpProfile, McpServer};
use crate::operator::scope::{Scope, profile_servers_in};
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
    let mut triggers = ProfileTriggers::default();
    let server_cache = cache(
        server_writer,
        scope.api::<McpServer>(client.clone()),
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

/// Which profiles a server cache event affects: not every selecting profile, which at 10,000
/// servers would be reconciled thousands of times. It remembers each server's labels as of its
/// previous event, in event order, so a label change that drops a server from a selector is seen
/// without the profile's status.
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

#[tracing::instrument(target = "spear_trace", name = "operator.reconcile", skip_all, fields(kind = KIND_PROFILE, profile = profile.metadata.name.as_deref().unwrap_or_default()))]
async fn reconcile_profile(profile: Arc<McpProfile>, ctx: Arc<Context>) -> Result<Action, Error> {
    ControllerMetrics::count(&ctx.metrics.reconciles, KIND_PROFILE);
    let (namespace, name) = identity(&*profile)?;
    // Before the first list, "missing" would be a lie written to the status.
    ctx.servers_ready.wait(KIND_SERVER).await?;
    let servers: Vec<McpServer> = profile_servers_in(&ctx.servers, &namespace, &profile).into_values().collect();
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
}
