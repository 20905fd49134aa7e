//! The McpProfileBindings of the gateway's namespace, watched with a kube-runtime reflector. Each
//! change publishes the bindings that pass validation; one that fails grants nothing and is
//! logged with the field and the fix (once per resourceVersion).

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::{McpProfileBinding, Validate};

/// The valid bindings, and whether a complete list has been stored.
#[derive(Clone, Debug, Default)]
pub struct Bindings {
    pub valid: Arc<Vec<McpProfileBinding>>,
    pub listed: bool,
}

/// Starts watching the bindings of `namespace` until `stop`; the receiver sees each change.
pub fn watch(client: Client, namespace: &str, stop: CancellationToken) -> watch::Receiver<Bindings> {
    let (tx, rx) = watch::channel(Bindings::default());
    let api: Api<McpProfileBinding> = Api::namespaced(client, namespace);
    let (store, writer) = reflector::store();
    let events = reflector(writer, watcher::watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        tokio::pin!(events);
        let mut listed = false;
        let mut reported = BTreeSet::new();
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => event,
            };
            match event {
                None => return,
                Some(Err(e)) => tracing::warn!(error = %e, "watching McpProfileBindings failed; retrying"),
                Some(Ok(Event::Init | Event::InitApply(_))) => {}
                Some(Ok(event)) => {
                    listed |= matches!(event, Event::InitDone);
                    let mut valid = Vec::new();
                    for binding in store.state() {
                        let problems = binding.validate();
                        if problems.is_empty() {
                            valid.push((*binding).clone());
                        } else if reported.insert((binding.name_any(), binding.resource_version())) {
                            for problem in problems {
                                tracing::warn!(binding = %binding.name_any(), %problem, "McpProfileBinding ignored: it grants nothing until fixed");
                            }
                        }
                    }
                    valid.sort_by_key(ResourceExt::name_any);
                    tx.send_replace(Bindings { valid: Arc::new(valid), listed });
                }
            }
        }
    });
    rx
}
