//! Which namespaces the operator watches ([`Scope`]), and which McpServers of a reflector store a
//! profile allows (`profile_servers_in`): shared by the controllers, the webhook's cache and
//! the admin view.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::core::{Selector, SelectorExt as _};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};

use crate::api::{McpProfile, McpServer};

/// Which namespaces the controllers watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (the normal install).
    Cluster,
    /// One namespace only: McpServers, McpProfiles, RoleBindings there, and that Namespace.
    Namespace(String),
}

impl Scope {
    pub(crate) fn api<K>(&self, client: Client) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Scope::Cluster => Api::all(client),
            Scope::Namespace(ns) => Api::namespaced(client, ns),
        }
    }

    pub(crate) fn namespaces(&self) -> watcher::Config {
        match self {
            Scope::Cluster => watcher::Config::default(),
            Scope::Namespace(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
        }
    }
}

/// The McpServers of `namespace` in `store` that `profile` allows, by name: the named ones by
/// key, and with a selector, a scan of the store with the selector parsed once. Never the
/// whole namespace: a profile's status and injection depend on its own servers only, and
/// copying 10,000 servers per profile would be most of the controller's work at scale.
pub(crate) fn profile_servers_in(
    store: &Store<McpServer>,
    namespace: &str,
    profile: &McpProfile,
) -> BTreeMap<String, McpServer> {
    let mut found = BTreeMap::new();
    for name in &profile.spec.servers {
        if let Some(server) = store.get(&ObjectRef::new(name).within(namespace)) {
            found.insert(name.clone(), McpServer::clone(&server));
        }
    }
    if let Some(Ok(selector)) = profile.spec.server_selector.clone().map(Selector::try_from) {
        let selected = store.state_filter(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && selector.matches(s.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
        });
        for server in selected {
            if let Some(name) = &server.metadata.name {
                found.entry(name.clone()).or_insert_with(|| McpServer::clone(&server));
            }
        }
    }
    found
}

/// The servers `profile` allows that exist in `store`: those it names, and of `selected` (the
/// names its selector matched, from the controller's profile index). Sorted by name.
pub(crate) fn profile_servers_among(
    store: &Store<McpServer>,
    namespace: &str,
    profile: &McpProfile,
    selected: &BTreeSet<String>,
) -> Vec<McpServer> {
    let names: BTreeSet<&String> = profile.spec.servers.iter().chain(selected).collect();
    names
        .into_iter()
        .filter_map(|name| store.get(&ObjectRef::new(name).within(namespace)))
        .map(|server| McpServer::clone(&server))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::runtime::reflector;

    use super::*;
    use crate::operator::status::{known_tools, profile_status};

    fn labelled(namespace: &str, name: &str, team: &str) -> McpServer {
        let mut server = McpServer::test(name).in_namespace(namespace);
        server.metadata.labels = Some(BTreeMap::from([("team".to_string(), team.to_string())]));
        server
    }

    #[test]
    fn a_profiles_servers_from_the_store_are_the_named_and_the_selected_in_its_namespace() {
        let (store, mut writer) = reflector::store::<McpServer>();
        for server in [
            McpServer::test("fs").in_namespace("a"),
            labelled("a", "picked", "x"),
            labelled("a", "other-team", "y"),
            labelled("b", "fs", "x"),
            labelled("b", "elsewhere", "x"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(server));
        }
        let profile = McpProfile::test("p").in_namespace("a").servers(["fs", "missing"]).selecting("team", "x");
        let found = profile_servers_in(&store, "a", &profile);
        assert_eq!(found.keys().collect::<Vec<_>>(), ["fs", "picked"]);
        assert!(found.values().all(|s| s.metadata.namespace.as_deref() == Some("a")));
        // The status computed from them equals the one computed from the whole namespace.
        let namespace: Vec<McpServer> = store
            .state()
            .iter()
            .filter(|s| s.metadata.namespace.as_deref() == Some("a"))
            .map(|s| (**s).clone())
            .collect();
        let mine: Vec<McpServer> = found.into_values().collect();
        let at = Time(Timestamp::UNIX_EPOCH);
        assert_eq!(
            profile_status(&profile, &mine, &known_tools(&mine), at.clone()),
            profile_status(&profile, &namespace, &known_tools(&namespace), at)
        );
    }
}
