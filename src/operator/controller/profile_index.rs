//! Which McpServers each McpProfile selects by label, and which profiles a server event affects,
//! kept from the events instead of found by scanning.
//!
//! At 10,000 servers and 1,000 profiles in one namespace the scans were most of the
//! controller's CPU at its start (BENCHMARKS.md, "reconcile"): every server event compared the
//! server with every profile (parsing each selector again), and every reconcile of a selecting
//! profile matched its selector against every server of the namespace. Here a server event costs
//! one lookup for the profiles naming it plus one match per selecting profile of its namespace
//! (each selector parsed once), and a selecting profile's servers are a set read in one step.
//!
//! Invariant: for each indexed profile with a selector, `selected` is exactly the servers of its
//! namespace whose labels, as of their last event, the selector matches. A profile enters with
//! [`ProfileIndex::set_profile`], which its reconcile calls before it reads the servers, so any
//! server event after that triggers it again; it leaves with [`ProfileIndex::retain_profiles`]
//! when the caller sees it gone. Until it is indexed, a profile's own watch reconciles it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt as _};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::{McpProfile, McpServer};

/// A server as the index knows it: (namespace, name).
type ServerKey = (String, String);
type Labels = BTreeMap<String, String>;

/// See the module documentation.
#[derive(Default)]
pub(super) struct ProfileIndex {
    /// Each server's labels as of its last event.
    labels: HashMap<ServerKey, Labels>,
    /// The labels of a re-list in progress, which replace `labels` when it is complete.
    relist: Option<HashMap<ServerKey, Labels>>,
    /// The profiles naming each server in `spec.servers`.
    naming: HashMap<ServerKey, HashSet<ObjectRef<McpProfile>>>,
    /// The profiles with a selector, by namespace.
    selecting: HashMap<String, HashSet<ObjectRef<McpProfile>>>,
    profiles: HashMap<ObjectRef<McpProfile>, Indexed>,
}

/// What the index holds of one profile.
struct Indexed {
    namespace: String,
    named: Vec<String>,
    selector: Option<Selecting>,
}

struct Selecting {
    /// As written, to see a change.
    source: LabelSelector,
    /// `None` when it does not parse: it selects nothing (`Accepted` says why).
    parsed: Option<Selector>,
    /// Names of the servers it selects.
    selected: BTreeSet<String>,
}

impl Selecting {
    fn matches(&self, labels: &Labels) -> bool {
        self.parsed.as_ref().is_some_and(|selector| selector.matches(labels))
    }

    /// Recomputes `selected` from every known server's labels (a scan: only when the selector
    /// is new or changed, or after a re-list).
    fn reselect_all(&mut self, namespace: &str, labels: &HashMap<ServerKey, Labels>) {
        self.selected = labels
            .iter()
            .filter(|((ns, _), labels)| ns == namespace && self.matches(labels))
            .map(|((_, name), _)| name.clone())
            .collect();
    }
}

impl ProfileIndex {
    /// Indexes `profile` as it is now (a no-op when its servers and selector are unchanged), and
    /// returns the names of the servers its selector selects.
    pub(super) fn set_profile(&mut self, profile: &McpProfile) -> BTreeSet<String> {
        let key = ObjectRef::from_obj(profile);
        let namespace = profile.metadata.namespace.clone().unwrap_or_default();
        let unchanged = self.profiles.get(&key).is_some_and(|indexed| {
            indexed.named == profile.spec.servers
                && indexed.selector.as_ref().map(|s| &s.source) == profile.spec.server_selector.as_ref()
        });
        if !unchanged {
            self.remove_profile(&key);
            for name in &profile.spec.servers {
                self.naming.entry((namespace.clone(), name.clone())).or_default().insert(key.clone());
            }
            let selector = profile.spec.server_selector.as_ref().map(|source| {
                let mut selecting = Selecting {
                    source: source.clone(),
                    parsed: Selector::try_from(source.clone()).ok(),
                    selected: BTreeSet::new(),
                };
                selecting.reselect_all(&namespace, &self.labels);
                self.selecting.entry(namespace.clone()).or_default().insert(key.clone());
                selecting
            });
            let named = profile.spec.servers.clone();
            self.profiles.insert(key.clone(), Indexed { namespace, named, selector });
        }
        self.profiles.get(&key).and_then(|p| p.selector.as_ref()).map(|s| s.selected.clone()).unwrap_or_default()
    }

    /// Forgets the profiles for which `keep` is false (deleted ones; the caller holds the store).
    pub(super) fn retain_profiles(&mut self, keep: impl Fn(&ObjectRef<McpProfile>) -> bool) {
        let gone: Vec<ObjectRef<McpProfile>> = self.profiles.keys().filter(|key| !keep(key)).cloned().collect();
        for key in gone {
            self.remove_profile(&key);
        }
    }

    fn remove_profile(&mut self, key: &ObjectRef<McpProfile>) {
        let Some(indexed) = self.profiles.remove(key) else { return };
        for name in indexed.named {
            let server = (indexed.namespace.clone(), name);
            if let Some(profiles) = self.naming.get_mut(&server) {
                profiles.remove(key);
                if profiles.is_empty() {
                    self.naming.remove(&server);
                }
            }
        }
        if let Some(profiles) = self.selecting.get_mut(&indexed.namespace) {
            profiles.remove(key);
            if profiles.is_empty() {
                self.selecting.remove(&indexed.namespace);
            }
        }
    }

    /// Takes in a server cache event and returns the indexed profiles to reconcile again: those
    /// naming a changed or deleted server, or selecting it before or after; after a complete
    /// re-list, all of them (a deletion may have been missed).
    pub(super) fn on_server_event(&mut self, event: &watcher::Event<McpServer>) -> Vec<ObjectRef<McpProfile>> {
        match event {
            watcher::Event::Apply(server) => {
                let Some(key) = server_key(server) else { return Vec::new() };
                let labels = server.metadata.labels.clone().unwrap_or_default();
                let affected = self.reselect(&key, Some(&labels));
                self.labels.insert(key, labels);
                affected
            }
            watcher::Event::Delete(server) => {
                let Some(key) = server_key(server) else { return Vec::new() };
                self.labels.remove(&key);
                self.reselect(&key, None)
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            watcher::Event::InitApply(server) => {
                if let Some(key) = server_key(server) {
                    let labels = server.metadata.labels.clone().unwrap_or_default();
                    self.relist.get_or_insert_default().insert(key, labels);
                }
                Vec::new()
            }
            watcher::Event::InitDone => {
                self.labels = self.relist.take().unwrap_or_default();
                let labels = &self.labels;
                for indexed in self.profiles.values_mut() {
                    if let Some(selecting) = indexed.selector.as_mut() {
                        selecting.reselect_all(&indexed.namespace, labels);
                    }
                }
                self.profiles.keys().cloned().collect()
            }
        }
    }

    /// Moves server `key` in or out of each selecting profile of its namespace by its new labels
    /// (`None`: deleted), and returns the profiles that named or selected it, before or now.
    fn reselect(&mut self, key: &ServerKey, labels: Option<&Labels>) -> Vec<ObjectRef<McpProfile>> {
        let (namespace, name) = key;
        let mut affected: HashSet<ObjectRef<McpProfile>> = self.naming.get(key).cloned().unwrap_or_default();
        for profile in self.selecting.get(namespace).into_iter().flatten() {
            let Some(selecting) = self.profiles.get_mut(profile).and_then(|p| p.selector.as_mut()) else { continue };
            let now = labels.is_some_and(|labels| selecting.matches(labels));
            let before = if now { !selecting.selected.insert(name.clone()) } else { selecting.selected.remove(name) };
            if now || before {
                affected.insert(profile.clone());
            }
        }
        let mut affected: Vec<ObjectRef<McpProfile>> = affected.into_iter().collect();
        affected.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        affected
    }
}

fn server_key(server: &McpServer) -> Option<ServerKey> {
    Some((server.metadata.namespace.clone()?, server.metadata.name.clone()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(namespace: &str, name: &str, team: Option<&str>) -> McpServer {
        let mut server = McpServer::test(name).in_namespace(namespace);
        server.metadata.labels = team.map(|team| BTreeMap::from([("team".to_string(), team.to_string())]));
        server
    }

    fn names(refs: Vec<ObjectRef<McpProfile>>) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    fn apply(index: &mut ProfileIndex, server: McpServer) -> Vec<String> {
        names(index.on_server_event(&watcher::Event::Apply(server)))
    }

    #[test]
    fn a_server_change_triggers_the_profiles_that_name_or_select_it_in_its_namespace() {
        let mut index = ProfileIndex::default();
        index.set_profile(&McpProfile::test("names-it").in_namespace("a").servers(["fs"]));
        index.set_profile(&McpProfile::test("names-another").in_namespace("a").servers(["git"]));
        index.set_profile(&McpProfile::test("selects").in_namespace("a").selecting("team", "x"));
        index
            .set_profile(&McpProfile::test("other-namespace").in_namespace("b").servers(["fs"]).selecting("team", "x"));
        assert_eq!(apply(&mut index, server("a", "fs", Some("x"))), ["names-it", "selects"]);
        assert_eq!(apply(&mut index, server("a", "fs", Some("y"))), ["names-it", "selects"], "it selected it before");
        assert_eq!(apply(&mut index, server("a", "fs", Some("y"))), ["names-it"]);
        assert_eq!(apply(&mut index, server("a", "other", None)), Vec::<String>::new());
    }

    #[test]
    fn a_label_change_triggers_the_profiles_that_selected_it_before_and_after_only() {
        let mut index = ProfileIndex::default();
        for team in ["x", "y", "z"] {
            index.set_profile(&McpProfile::test(&format!("team-{team}")).in_namespace("a").selecting("team", team));
        }
        index.on_server_event(&watcher::Event::Init);
        assert!(index.on_server_event(&watcher::Event::InitApply(server("a", "fs", Some("x")))).is_empty());
        assert_eq!(index.on_server_event(&watcher::Event::InitDone).len(), 3, "a re-list triggers all");
        // x → y: team-x must drop it, team-y gains it, team-z is untouched.
        assert_eq!(apply(&mut index, server("a", "fs", Some("y"))), ["team-x", "team-y"]);
        // A status-only change (labels unchanged) triggers the selecting profile only.
        assert_eq!(apply(&mut index, server("a", "fs", Some("y"))), ["team-y"]);
        // Deleted, whatever labels the deletion carries: the profile that selected it.
        assert_eq!(names(index.on_server_event(&watcher::Event::Delete(server("a", "fs", None)))), ["team-y"]);
        // A server never seen before selects by its labels now.
        assert_eq!(apply(&mut index, server("a", "new", Some("z"))), ["team-z"]);
    }

    #[test]
    fn the_selected_set_follows_labels_relists_and_selector_changes() {
        let mut index = ProfileIndex::default();
        apply(&mut index, server("a", "one", Some("x")));
        apply(&mut index, server("a", "two", Some("y")));
        apply(&mut index, server("b", "three", Some("x")));
        let profile = McpProfile::test("p").in_namespace("a").selecting("team", "x");
        assert_eq!(index.set_profile(&profile), BTreeSet::from(["one".to_string()]), "its namespace only");
        apply(&mut index, server("a", "two", Some("x")));
        assert_eq!(index.set_profile(&profile).len(), 2);
        // A re-list replaces what was known: `one` is gone, `four` is new.
        index.on_server_event(&watcher::Event::Init);
        for s in [server("a", "two", Some("x")), server("a", "four", Some("x"))] {
            index.on_server_event(&watcher::Event::InitApply(s));
        }
        assert_eq!(index.set_profile(&profile).len(), 2, "the old set holds until the re-list is complete");
        index.on_server_event(&watcher::Event::InitDone);
        let selected: Vec<String> = index.set_profile(&profile).into_iter().collect();
        assert_eq!(selected, ["four", "two"]);
        // A changed selector is matched afresh; one that does not parse selects nothing.
        let other = McpProfile::test("p").in_namespace("a").selecting("team", "y");
        assert!(index.set_profile(&other).is_empty());
        let mut broken = profile.clone();
        if let Some(selector) = broken.spec.server_selector.as_mut() {
            selector.match_expressions = Some(vec![Default::default()]);
        }
        assert!(index.set_profile(&broken).is_empty());
        assert!(apply(&mut index, server("a", "two", Some("x"))).is_empty(), "nothing selects it now");
    }

    #[test]
    fn a_removed_profile_is_never_triggered_again() {
        let mut index = ProfileIndex::default();
        let profile = McpProfile::test("p").in_namespace("a").servers(["fs"]).selecting("team", "x");
        index.set_profile(&profile);
        assert_eq!(apply(&mut index, server("a", "fs", Some("x"))), ["p"]);
        index.retain_profiles(|key| key.name != "p");
        assert!(apply(&mut index, server("a", "fs", Some("x"))).is_empty());
        assert!(index.naming.is_empty() && index.selecting.is_empty() && index.profiles.is_empty());
        // Renaming a named server in the spec drops the old name.
        index.set_profile(&profile);
        index.set_profile(&McpProfile::test("p").in_namespace("a").servers(["git"]));
        assert!(apply(&mut index, server("a", "fs", None)).is_empty());
        assert_eq!(apply(&mut index, server("a", "git", None)), ["p"]);
    }

    proptest::proptest! {
        /// Any sequence of server events leaves each profile's selected set equal to a scan of
        /// the servers as they are, and triggers exactly the profiles naming the server or
        /// selecting it before or after the event.
        #[test]
        fn the_index_agrees_with_a_scan(events in proptest::collection::vec(
            (0..2usize, 0..4usize, proptest::option::of(0..3usize), proptest::bool::ANY), 0..40)
        ) {
            let teams = ["x", "y", "z"];
            let profiles = [
                McpProfile::test("sx").in_namespace("a").selecting("team", "x"),
                McpProfile::test("sy").in_namespace("a").servers(["s1"]).selecting("team", "y"),
                McpProfile::test("nb").in_namespace("b").servers(["s0", "s2"]),
            ];
            let mut index = ProfileIndex::default();
            for p in &profiles {
                index.set_profile(p);
            }
            let mut known: BTreeMap<(String, String), Option<String>> = BTreeMap::new();
            for (ns, name, team, delete) in events {
                let (ns, name) = (["a", "b"][ns].to_string(), format!("s{name}"));
                let team = team.map(|t| teams[t].to_string());
                let server = server(&ns, &name, team.as_deref());
                let before = known.get(&(ns.clone(), name.clone())).cloned();
                let (event, now) = if delete {
                    known.remove(&(ns.clone(), name.clone()));
                    (watcher::Event::Delete(server), None)
                } else {
                    known.insert((ns.clone(), name.clone()), team.clone());
                    (watcher::Event::Apply(server), Some(team))
                };
                let got = names(index.on_server_event(&event));
                let selects = |p: &McpProfile, team: &Option<String>| {
                    let wanted = p.spec.server_selector.as_ref()
                        .and_then(|s| s.match_labels.as_ref())
                        .and_then(|l| l.get("team"));
                    wanted.is_some() && wanted == team.as_ref()
                };
                let mut expected: Vec<String> = profiles.iter()
                    .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
                    .filter(|p| p.spec.servers.contains(&name)
                        || before.as_ref().is_some_and(|t| selects(p, t))
                        || now.as_ref().is_some_and(|t| selects(p, t)))
                    .map(|p| p.metadata.name.clone().unwrap_or_default())
                    .collect();
                expected.sort();
                proptest::prop_assert_eq!(got, expected);
                for p in &profiles {
                    let scanned: BTreeSet<String> = known.iter()
                        .filter(|((ns, _), team)| p.metadata.namespace.as_deref() == Some(ns.as_str()) && selects(p, team))
                        .map(|((_, name), _)| name.clone())
                        .collect();
                    proptest::prop_assert_eq!(index.set_profile(p), scanned);
                }
            }
        }
    }
}
