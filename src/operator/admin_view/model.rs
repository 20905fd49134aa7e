//! What the admin view shows, built from the objects the view's watches hold (pure: no I/O, no
//! clock). The page ([`super::page`]) and the JSON endpoint render this one value, so they
//! cannot disagree.
//!
//! Decisions, and why:
//! - **Status as the controller wrote it.** Accepted, Ready, tool count, last error, resolved
//!   and missing servers and the tool preview are read from `status`; nothing here probes or
//!   recomputes them, so the view shows what `kubectl get -o yaml` shows.
//! - **The decision log is `spearlet explain`'s.** Each namespace's McpServers and McpProfiles
//!   become one registry [`Snapshot`] (invalid objects left out and named, as the in-pod agent
//!   leaves them out), and each profile is explained by [`explain_json`] over it without a
//!   request, as `spearlet explain --profile P` does, except that the namespace's servers the
//!   profile does not name (`not_in_profile`) are counted, not listed (`notInProfile`): with
//!   many servers and profiles they would be most of the page. Tool-level decisions use the tool names
//!   the operator's probes recorded in `status.tools`; servers without them (stdio, not probed)
//!   are decided on servers and patterns alone, and the explanation says so.
//! - **Injected pods from metadata only.** [`InjectedPods`] keeps the pods that carry the
//!   webhook's `mcp.spear.dev/injected` annotation and drops every other pod as its event
//!   arrives, so memory grows with injected pods, not with the cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::ResourceExt as _;
use serde::Serialize;
use serde_json::Value;

use crate::api::conditions::{reasons, types};
use crate::api::keys::{ANNOTATION_INJECTED, ANNOTATION_PROFILE, INJECTION_ENABLED, LABEL_INJECTION};
use crate::api::manifest::Object;
use crate::api::{McpProfile, McpServer, Transport, Validate};
use crate::operator::status::known_tools;
use crate::policy::explain::explain_json;
use crate::policy::{CompiledProfile, ServerTools, ToolInfo, ToolList};
use crate::registry::snapshot::{Entry, Snapshot};

/// Which operator replica answered (every replica serves the view).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replica {
    /// The replica's identity (its pod name in a cluster).
    pub identity: String,
    /// Whether it holds the leader Lease now (only the leader writes status).
    pub leader: bool,
}

/// A pod the webhook injected: the metadata the view keeps of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InjectedPod {
    pub namespace: String,
    pub name: String,
    /// `mcp.spear.dev/profile`.
    pub profile: String,
    /// `metadata.creationTimestamp`, RFC 3339.
    pub created: Option<String>,
    /// The pod is being deleted.
    pub terminating: bool,
}

impl InjectedPod {
    /// The pod, if the webhook injected it (it carries `mcp.spear.dev/injected`).
    pub fn from_meta(meta: &ObjectMeta) -> Option<InjectedPod> {
        let annotations = meta.annotations.as_ref()?;
        annotations.get(ANNOTATION_INJECTED)?;
        Some(InjectedPod {
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
            profile: annotations.get(ANNOTATION_PROFILE).cloned().unwrap_or_default(),
            created: meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
            terminating: meta.deletion_timestamp.is_some(),
        })
    }
}

/// The injected pods of a pod watch, kept from its events (a watch's initial list replaces the
/// whole set only once it is complete, as kube's reflector store does).
#[derive(Debug, Default)]
pub struct InjectedPods {
    current: BTreeMap<(String, String), InjectedPod>,
    /// A re-list in progress.
    listing: Option<BTreeMap<(String, String), InjectedPod>>,
    listed: bool,
}

impl InjectedPods {
    /// A (re-)list starts.
    pub fn init(&mut self) {
        self.listing = Some(BTreeMap::new());
    }

    /// A pod of the list in progress.
    pub fn init_apply(&mut self, meta: &ObjectMeta) {
        if let (Some(listing), Some(pod)) = (self.listing.as_mut(), InjectedPod::from_meta(meta)) {
            listing.insert((pod.namespace.clone(), pod.name.clone()), pod);
        }
    }

    /// The list is complete: it replaces what was known.
    pub fn init_done(&mut self) {
        if let Some(listing) = self.listing.take() {
            self.current = listing;
        }
        self.listed = true;
    }

    /// A pod was added or changed: kept if injected, dropped otherwise.
    pub fn apply(&mut self, meta: &ObjectMeta) {
        let key = (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default());
        match InjectedPod::from_meta(meta) {
            Some(pod) => self.current.insert(key, pod),
            None => self.current.remove(&key),
        };
    }

    /// A pod was deleted.
    pub fn delete(&mut self, meta: &ObjectMeta) {
        let key = (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default());
        self.current.remove(&key);
    }

    /// Whether a complete list has been seen.
    pub fn is_listed(&self) -> bool {
        self.listed
    }

    /// The injected pods, by namespace and name.
    pub fn pods(&self) -> Vec<InjectedPod> {
        self.current.values().cloned().collect()
    }
}

/// What the view is built from: the watches' objects, and what the watches could not do.
#[derive(Debug, Default)]
pub struct Inputs {
    pub servers: Vec<Arc<McpServer>>,
    pub profiles: Vec<Arc<McpProfile>>,
    pub namespaces: Vec<Arc<Namespace>>,
    pub pods: Vec<InjectedPod>,
    pub replica: Replica,
    /// One line per watch that has not listed or is failing (shown at the top of the page).
    pub problems: Vec<String>,
}

/// The whole view.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminView {
    pub replica: Replica,
    pub problems: Vec<String>,
    /// Namespaces with McpServers, McpProfiles or injected pods, and every injection-enabled
    /// one, by name.
    pub namespaces: Vec<NamespaceView>,
}

/// One namespace's registry and pods.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceView {
    pub name: String,
    /// Labelled `mcp.spear.dev/injection=enabled`.
    pub injection_enabled: bool,
    pub servers: Vec<ServerRow>,
    pub profiles: Vec<ProfileRow>,
    pub pods: Vec<InjectedPod>,
}

/// A condition as shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConditionView {
    pub status: String,
    pub reason: String,
    pub message: String,
}

impl ConditionView {
    fn of(conditions: &[Condition], type_: &str) -> Option<ConditionView> {
        conditions.iter().find(|c| c.type_ == type_).map(|c| ConditionView {
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
    }
}

/// A server's health in one word, from its conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// `Ready=True`: the last probe listed its tools.
    Ready,
    /// `Ready=False`: the last probe failed (`lastError` says why).
    Failing,
    /// `Accepted=False`: the spec is invalid; agents leave it out.
    Rejected,
    /// stdio: runs as a sidecar in each pod; the operator does not probe it.
    Sidecar,
    /// `Ready=Unknown/ProbeSkipped`: the operator does not probe this namespace or address.
    NotProbed,
    /// No status for the current generation yet.
    Pending,
}

impl Health {
    /// The word shown on the page.
    pub fn label(self) -> &'static str {
        match self {
            Health::Ready => "ready",
            Health::Failing => "failing",
            Health::Rejected => "rejected",
            Health::Sidecar => "sidecar",
            Health::NotProbed => "not probed",
            Health::Pending => "pending",
        }
    }

    fn of(server: &McpServer, accepted: Option<&ConditionView>, ready: Option<&ConditionView>) -> Health {
        let current = server.status.as_ref().is_some_and(|s| s.observed_generation == server.metadata.generation);
        if !current {
            return Health::Pending;
        }
        if accepted.is_some_and(|c| c.status == "False") {
            return Health::Rejected;
        }
        if server.spec.transport == Transport::Stdio {
            return Health::Sidecar;
        }
        match ready.map(|c| (c.status.as_str(), c.reason.as_str())) {
            Some(("True", _)) => Health::Ready,
            Some(("False", _)) => Health::Failing,
            Some(("Unknown", reasons::PROBE_SKIPPED)) => Health::NotProbed,
            _ => Health::Pending,
        }
    }
}

/// One McpServer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerRow {
    pub name: String,
    pub display_name: Option<String>,
    /// `stdio` or `streamableHttp`.
    pub transport: String,
    pub health: Health,
    pub accepted: Option<ConditionView>,
    pub ready: Option<ConditionView>,
    /// `GrantReady`, for servers whose person's grant lives in a Secret.
    pub grant: Option<ConditionView>,
    pub tool_count: Option<u32>,
    pub tools: Vec<String>,
    pub last_error: Option<String>,
    pub last_probe_time: Option<String>,
    /// `name version` from `initialize`.
    pub server_info: Option<String>,
}

/// One McpProfile, with its decision log.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileRow {
    pub name: String,
    pub accepted: Option<ConditionView>,
    pub resolved_refs: Option<ConditionView>,
    pub resolved_servers: Vec<String>,
    pub missing_servers: Vec<String>,
    pub tool_preview: Vec<String>,
    /// `spearlet explain --output json` for this profile, or why it cannot be explained.
    pub explain: Result<Value, String>,
}

/// Builds the view (pure).
pub fn build(inputs: Inputs) -> AdminView {
    let mut names: BTreeSet<String> = BTreeSet::new();
    names.extend(inputs.servers.iter().filter_map(|s| s.namespace()));
    names.extend(inputs.profiles.iter().filter_map(|p| p.namespace()));
    names.extend(inputs.pods.iter().map(|p| p.namespace.clone()));
    let enabled: BTreeSet<String> = inputs
        .namespaces
        .iter()
        .filter(|ns| ns.labels().get(LABEL_INJECTION).is_some_and(|v| v == INJECTION_ENABLED))
        .map(|ns| ns.name_any())
        .collect();
    names.extend(enabled.iter().cloned());
    let namespaces = names
        .into_iter()
        .map(|name| {
            let in_ns = |ns: Option<String>| ns.as_deref() == Some(name.as_str());
            let servers: Vec<McpServer> =
                inputs.servers.iter().filter(|s| in_ns(s.namespace())).map(|s| McpServer::clone(s)).collect();
            let profiles: Vec<McpProfile> =
                inputs.profiles.iter().filter(|p| in_ns(p.namespace())).map(|p| McpProfile::clone(p)).collect();
            let pods = inputs.pods.iter().filter(|p| p.namespace == name).cloned().collect();
            namespace_view(&name, enabled.contains(&name), &servers, &profiles, pods)
        })
        .collect();
    AdminView { replica: inputs.replica, problems: inputs.problems, namespaces }
}

fn namespace_view(
    name: &str,
    injection_enabled: bool,
    servers: &[McpServer],
    profiles: &[McpProfile],
    mut pods: Vec<InjectedPod>,
) -> NamespaceView {
    let snapshot = namespace_snapshot(servers, profiles);
    let known = known_tools(servers);
    let mut server_rows: Vec<ServerRow> = servers.iter().map(server_row).collect();
    server_rows.sort_by(|a, b| a.name.cmp(&b.name));
    let mut profile_rows: Vec<ProfileRow> = profiles.iter().map(|p| profile_row(p, &snapshot, &known)).collect();
    profile_rows.sort_by(|a, b| a.name.cmp(&b.name));
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    NamespaceView { name: name.to_string(), injection_enabled, servers: server_rows, profiles: profile_rows, pods }
}

fn server_row(server: &McpServer) -> ServerRow {
    let status = server.status.clone().unwrap_or_default();
    let accepted = ConditionView::of(&status.conditions, types::ACCEPTED);
    let ready = ConditionView::of(&status.conditions, types::READY);
    let health = Health::of(server, accepted.as_ref(), ready.as_ref());
    let transport = match server.spec.transport {
        Transport::Stdio => "stdio",
        Transport::StreamableHttp => "streamableHttp",
    };
    let server_info = status.server_info.as_ref().and_then(|info| match (&info.name, &info.version) {
        (Some(name), Some(version)) => Some(format!("{name} {version}")),
        (Some(name), None) => Some(name.clone()),
        _ => None,
    });
    ServerRow {
        name: server.name_any(),
        display_name: server.spec.display_name.clone(),
        transport: transport.to_string(),
        health,
        accepted,
        ready,
        grant: ConditionView::of(&status.conditions, types::GRANT_READY),
        tool_count: status.tool_count,
        tools: status.tools,
        last_error: status.last_error,
        last_probe_time: status.last_probe_time.map(|t| t.0.to_string()),
        server_info,
    }
}

fn profile_row(profile: &McpProfile, snapshot: &Snapshot, known: &BTreeMap<String, Vec<String>>) -> ProfileRow {
    let status = profile.status.clone().unwrap_or_default();
    let name = profile.name_any();
    ProfileRow {
        accepted: ConditionView::of(&status.conditions, types::ACCEPTED),
        resolved_refs: ConditionView::of(&status.conditions, types::RESOLVED_REFS),
        resolved_servers: status.resolved_servers,
        missing_servers: status.missing_servers,
        tool_preview: status.tool_preview,
        explain: explain(snapshot, &name, known),
        name,
    }
}

/// `spearlet explain --profile NAME --output json` over the namespace's snapshot, with the
/// probed tool names standing in for `--connect`'s listings.
fn explain(snapshot: &Snapshot, profile: &str, known: &BTreeMap<String, Vec<String>>) -> Result<Value, String> {
    let compiled = CompiledProfile::compile(snapshot, profile).map_err(|e| format!("{e} ({})", e.code()))?;
    let parts: BTreeMap<&str, &str> = compiled.servers().collect();
    let all_listed = parts.keys().all(|id| known.contains_key(*id));
    // As `status::tool_preview` does: the same policy path the agent takes, over names only.
    let tools = |id: &str| match (known.get(id), parts.get(id)) {
        (Some(tools), Some(part)) => {
            ServerTools::Listed(ToolList::new(part, tools.iter().map(|t| ToolInfo::named(t)).collect()).into())
        }
        _ => ServerTools::Unknown,
    };
    let set = compiled.effective(tools, None, &[]).map_err(|e| format!("{e} ({})", e.code()))?;
    let mut explained = explain_json(snapshot, &set, all_listed);
    // Every other server of the namespace is `not_in_profile`: with thousands of servers and
    // hundreds of profiles that is most of the page and says nothing, so it becomes a count.
    if let Some(Value::Array(excluded)) = explained.get_mut("excluded") {
        let before = excluded.len();
        excluded.retain(|d| d["reason"] != NOT_IN_PROFILE);
        explained["notInProfile"] = Value::from(before - excluded.len());
    }
    Ok(explained)
}

/// The decision log's reason for a server the profile does not allow.
const NOT_IN_PROFILE: &str = "not_in_profile";

/// The registry an agent in this namespace would hold: valid objects only (as `KubeSource`
/// serves them), each with its resourceVersion.
fn namespace_snapshot(servers: &[McpServer], profiles: &[McpProfile]) -> Snapshot {
    let version = |meta: &ObjectMeta| meta.resource_version.clone().unwrap_or_default();
    let servers = servers
        .iter()
        .filter(|s| s.validate().is_empty())
        .map(|s| Entry::new(s.name_any(), 0, version(&s.metadata), Object::Server(s.clone())));
    let profiles = profiles
        .iter()
        .filter(|p| p.validate().is_empty())
        .map(|p| Entry::new(p.name_any(), 0, version(&p.metadata), Object::Profile(p.clone())));
    Snapshot::build(servers.chain(profiles), Vec::new())
}
