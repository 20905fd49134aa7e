//! `spearlet explain` (and `kubectl spear explain`): what a profile exposes, and why the rest is
//! not exposed.
//!
//! Two sources, one decision log: local mode reads a directory (`--registry-dir`); cluster mode
//! ([`cluster`]) reads the namespace's McpServers and the one McpProfile from the API server, as
//! the pod's agent does, so both end in the same `Snapshot::build`, `CompiledProfile` and
//! `policy::explain` calls and the cluster revision is the one an agent in sync reports. Cluster
//! mode's `--connect` does not start servers on the workstation (their URLs and sidecars live in
//! the cluster): it asks the pod's own agent, through a port-forward, for its live
//! `/debug/effective`, which has the tool-level decisions and the revision the pod is on.

pub(super) mod cluster;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;

use crate::api::keys;
use crate::cli::{block_on, emit, say, tell, usage};
use crate::mcp::{Pool, PoolOptions};
use crate::policy::explain::{
    ExplainRequest, ListedItems, explain_items, explain_json, explain_selection, explain_table, items_table,
    live_table, revisions_json, selection_table,
};
use crate::policy::{CompiledProfile, PolicyError, ServerTools};
use crate::registry::dir::DirSource;
use crate::registry::snapshot::Snapshot;

/// How `explain` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    /// Aligned text for people.
    Table,
    /// One JSON document for machines.
    Json,
}

/// Explain what a profile exposes: the effective servers and tools, and why the rest is not.
///
/// Local mode (--registry-dir) reads a directory of manifests; cluster mode (no --registry-dir)
/// reads the McpServers and the McpProfile of a namespace from the Kubernetes API (kubeconfig,
/// or in-cluster), for --profile P or for --pod NAME (the profile its mcp.spear.dev/profile
/// annotation names). Without --connect it decides on servers and patterns alone and says so;
/// with --connect, local mode lists every allowed server's tools first, and cluster mode (with
/// --pod) asks the pod's agent for its live decisions and registry revision through a
/// port-forward to its admin port. Exit status: 0 on success, 1 when the profile, the pod or
/// the agent cannot be read or the request is refused, 2 on a usage error.
#[derive(clap::Args, Debug)]
pub(crate) struct ExplainArgs {
    /// Directory of McpServer/McpProfile manifests (local mode). Without it: cluster mode.
    #[arg(long, env = keys::ENV_REGISTRY_DIR, value_name = "DIR")]
    registry_dir: Option<PathBuf>,
    /// The McpProfile to explain.
    #[arg(long, env = keys::ENV_PROFILE)]
    profile: Option<String>,
    /// (cluster) A pod: explain the profile its mcp.spear.dev/profile annotation names, and say
    /// whether it was injected; with --connect, ask its agent.
    #[arg(long, value_name = "NAME")]
    pod: Option<String>,
    /// (cluster) A caller of `spearlet gateway`, by user name as TokenReview reports it
    /// (`system:serviceaccount:NS:NAME` for a ServiceAccount): print the namespace's
    /// McpProfileBindings' decision for it, then explain the profile it gets (with --profile: the
    /// one it asks for with the Spear-Profile header).
    #[arg(long, value_name = "USER")]
    subject: Option<String>,
    /// (cluster, with --subject) A group of the caller; repeatable. A ServiceAccount's groups are
    /// `system:serviceaccounts` and `system:serviceaccounts:NS`, added here for one.
    #[arg(long = "group", value_name = "GROUP")]
    groups: Vec<String>,
    #[command(flatten)]
    kube: cluster::KubeArgs,
    /// A request as JSON: a scope {"server_ids": [...], "tool_allowlist": [...],
    /// "tool_denylist": [...], "budgets": {...}}, and for chat.toolSelection the conversation
    /// and limit {"messages": [...], "max_tools": 10} (the selection needs --connect).
    #[arg(long, env = keys::ENV_EXPLAIN_REQUEST, value_name = "JSON")]
    request: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, env = keys::ENV_OUTPUT, value_enum, default_value_t = OutputFormat::Table)]
    output: OutputFormat,
    /// Local mode: connect to each allowed server first and list its tools, so tool-level
    /// decisions are shown too (stdio servers are started as local child processes, then
    /// stopped). Cluster mode (needs --pod): ask the pod's agent for its live /debug/effective.
    #[arg(long, env = keys::ENV_EXPLAIN_CONNECT)]
    connect: bool,
}

/// Where the registry comes from, decided from the flags.
enum Source {
    Local { dir: PathBuf, profile: String },
    Cluster(cluster::Target),
}

impl ExplainArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let request = self
            .request
            .as_deref()
            .map(ExplainRequest::parse)
            .transpose()
            .map_err(|e| usage(format!("--request is not a valid request: {e}")))?
            .unwrap_or_default();
        match self.source()? {
            Source::Local { dir, profile } => {
                let snapshot = DirSource::load(&dir).map_err(usage)?;
                warn_problems(&snapshot);
                let (tools, items) = if self.connect {
                    let compiled = compile(&snapshot, &profile)?;
                    block_on(list_all_tools(&snapshot, &compiled))?
                } else {
                    (BTreeMap::new(), ListedItems::new())
                };
                let mut explained = explain(&snapshot, &profile, &request, self.connect.then_some((&tools, &items)))?;
                add_grants(&mut explained, &snapshot);
                self.print(explained, &[], None);
            }
            Source::Cluster(target) => {
                let connect = self.connect;
                let read = cluster::read(&target, connect, self.request.as_deref());
                let found = block_on(async {
                    read.await.map_err(|e| if e.is_usage() { usage(e) } else { anyhow::Error::new(e) })
                })?;
                warn_problems(&found.snapshot);
                let mut explained = explain(&found.snapshot, &found.profile, &request, None)?;
                add_cluster_grants(&mut explained, &found.snapshot);
                let mut heading = vec![found.source_line()];
                heading.extend(found.pod.as_ref().map(cluster::PodInfo::line));
                heading.extend(found.caller.iter().flat_map(cluster::CallerDecision::lines));
                let mut extra = serde_json::Map::new();
                extra.insert("source".into(), found.source_json());
                if let Some(caller) = &found.caller {
                    extra.insert("caller".into(), caller.json());
                }
                if let Some(pod) = &found.pod {
                    extra.insert("pod".into(), pod.json());
                }
                let live = found.live.map(|live| {
                    let cluster_revision = found.snapshot.revision().as_str();
                    let pod_revision = live["revision"].as_str().unwrap_or_default().to_string();
                    extra.insert("revisions".into(), revisions_json(&pod_revision, cluster_revision));
                    let table = live_table(&live, cluster_revision);
                    extra.insert("live".into(), live);
                    table
                });
                self.print(explained, &heading, Some((extra, live)));
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    /// Local or cluster mode from the flags; mixing them, or a missing profile, is a usage error.
    fn source(&self) -> anyhow::Result<Source> {
        let pod = self.pod.is_some().then_some("--pod");
        let subject = self.subject.is_some().then_some("--subject");
        let given: Vec<&str> = pod.into_iter().chain(subject).chain(self.kube.given()).collect();
        if let Some(dir) = &self.registry_dir {
            if !given.is_empty() {
                return Err(usage(format!(
                    "--registry-dir is local mode and {} cluster mode: drop --registry-dir (and {}) to read the \
                     cluster, or drop {} to read the directory",
                    given.join(", "),
                    keys::ENV_REGISTRY_DIR,
                    given.join(", ")
                )));
            }
            let profile = self.profile.clone().ok_or_else(|| usage("--profile is required with --registry-dir"))?;
            return Ok(Source::Local { dir: dir.clone(), profile });
        }
        if !self.groups.is_empty() && self.subject.is_none() {
            return Err(usage("--group is for a gateway caller: pass --subject USER with it"));
        }
        if let Some(user) = &self.subject {
            if self.pod.is_some() || self.connect {
                return Err(usage(
                    "--subject explains a gateway caller: drop --pod and --connect (a caller has no pod agent to ask)",
                ));
            }
            let mut groups = self.groups.clone();
            if let Some(ns) = user.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split(':').next()) {
                for group in ["system:serviceaccounts".to_string(), format!("system:serviceaccounts:{ns}")] {
                    if !groups.contains(&group) {
                        groups.push(group);
                    }
                }
            }
            return Ok(Source::Cluster(cluster::Target {
                subject: cluster::Subject::Caller { user: user.clone(), groups, requested: self.profile.clone() },
                namespace: self.kube.namespace.clone(),
                kubeconfig: self.kube.kubeconfig.clone(),
                context: self.kube.context.clone(),
            }));
        }
        let subject = match (&self.profile, &self.pod) {
            (Some(_), Some(_)) => {
                return Err(usage(
                    "--profile and --pod: pass one (the pod's mcp.spear.dev/profile annotation names its profile)",
                ));
            }
            (None, None) => {
                return Err(usage(
                    "pass --profile P or --pod NAME (cluster mode), or --registry-dir DIR --profile P (local mode)",
                ));
            }
            (Some(profile), None) => {
                if self.connect {
                    return Err(usage(
                        "--connect in cluster mode asks a pod's agent: pass --pod NAME instead of --profile (or use \
                         --registry-dir to connect to the servers from here)",
                    ));
                }
                cluster::Subject::Profile(profile.clone())
            }
            (None, Some(pod)) => cluster::Subject::Pod(pod.clone()),
        };
        Ok(Source::Cluster(cluster::Target {
            subject,
            namespace: self.kube.namespace.clone(),
            kubeconfig: self.kube.kubeconfig.clone(),
            context: self.kube.context.clone(),
        }))
    }

    /// Prints the explanation: `heading` lines first in a table; cluster mode's `extra` keys are
    /// added to the JSON and its live table appended.
    fn print(
        &self,
        explained: Explained,
        heading: &[String],
        cluster: Option<(serde_json::Map<String, Value>, Option<String>)>,
    ) {
        let (extra, live) = cluster.unwrap_or_default();
        match self.output {
            OutputFormat::Json => {
                let mut json = explained.json;
                for (key, value) in extra {
                    json[key] = value;
                }
                emit(&format!("{json}\n"));
            }
            OutputFormat::Table => {
                let mut table: String = heading.iter().map(|line| format!("{line}\n")).collect();
                table.push_str(&explained.table);
                if let Some(live) = live {
                    table.push_str("LIVE (the pod's agent, /debug/effective)\n");
                    table.push_str(&live);
                }
                say(&table);
            }
        }
    }
}

/// One explanation in both formats.
struct Explained {
    json: Value,
    table: String,
}

/// Local mode: what each `http.auth.authorizationCode` server's stored grant says (the grant
/// files `spearlet serve` would read, `SPEAR_GRANT_DIR`), as `grants` in JSON and a GRANTS table.
fn add_grants(explained: &mut Explained, snapshot: &Snapshot) {
    use crate::mcp::{grant_store, oauth::grant};
    let now = grant::unix_now();
    let dir = grant_store::grant_dir(|v| std::env::var(v).ok());
    let mut states = serde_json::Map::new();
    for (name, server) in snapshot.servers() {
        let Some(http) = server.object.spec.http.as_ref() else { continue };
        let Some(auth) = http.auth.as_ref().filter(|a| a.authorization_code.is_some()) else { continue };
        let issuer = auth.issuer.as_deref().unwrap_or_default();
        let path = dir
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|d| grant_store::grant_path(d, name).map_err(|e| e.to_string()));
        let read = path.and_then(|p| match grant_store::read(&p) {
            Ok(g) => Ok(Some(g)),
            Err(grant_store::GrantStoreError::Missing { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        });
        let state =
            grant::grant_state(read.as_ref().map(Option::as_ref).map_err(Clone::clone), name, &http.url, issuer, now);
        states.insert(name.to_string(), state.into());
    }
    push_grants(explained, states);
}

/// Cluster mode: what the operator's `GrantReady` condition says of each server whose grant
/// lives in a Secret (`authorizationCode.tokenSecretRef`); the Secret itself is not read.
fn add_cluster_grants(explained: &mut Explained, snapshot: &Snapshot) {
    use crate::api::conditions::types::GRANT_READY;
    let mut states = serde_json::Map::new();
    for (name, server) in snapshot.servers() {
        let Some(reference) = crate::api::secret_grant::grant_secret_ref(&server.object) else { continue };
        let conditions = server.object.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let state = match conditions.iter().find(|c| c.type_ == GRANT_READY) {
            Some(c) => format!("{} ({}): {}", c.status, c.reason, c.message),
            None => format!(
                "Secret {:?}: not reported yet (the operator reports GrantReady in injection-enabled namespaces)",
                reference.secret
            ),
        };
        states.insert(name.to_string(), state.into());
    }
    push_grants(explained, states);
}

/// Each server's grant state, as a GRANTS table and the `grants` field (nothing when none).
fn push_grants(explained: &mut Explained, states: serde_json::Map<String, Value>) {
    if states.is_empty() {
        return;
    }
    explained.table.push_str("GRANTS\n");
    for (name, state) in &states {
        explained.table.push_str(&format!("  {name:<40} {}\n", state.as_str().unwrap_or_default()));
    }
    explained.json["grants"] = Value::Object(states);
}

fn warn_problems(snapshot: &Snapshot) {
    for problem in snapshot.problems() {
        tell(format_args!("warning: registry problem (last good objects are used): {problem}"));
    }
}

fn compile(snapshot: &Snapshot, profile: &str) -> anyhow::Result<CompiledProfile> {
    CompiledProfile::compile(snapshot, profile).map_err(|e| anyhow::anyhow!("{e} ({})", e.code()))
}

/// The decision log of `profile` in `snapshot` (pure): with `listed` tools, tool-level decisions,
/// the tool selection for the request's messages and the resources and prompts.
fn explain(
    snapshot: &Snapshot,
    profile: &str,
    request: &ExplainRequest,
    listed: Option<(&BTreeMap<String, ServerTools>, &ListedItems)>,
) -> anyhow::Result<Explained> {
    let compiled = compile(snapshot, profile)?;
    let tools = listed.map(|(tools, _)| tools);
    let lookup = |id: &str| tools.and_then(|t| t.get(id)).cloned().unwrap_or(ServerTools::Unknown);
    let refused = |e: PolicyError| anyhow::anyhow!("{e} ({})", e.code());
    let set = compiled.effective(lookup, request.scope.as_ref(), &[]).map_err(refused)?;
    let connected = listed.is_some();
    let selection = match snapshot.profile(profile) {
        // Ranking needs the tools' descriptions: without tool lists there is nothing to rank.
        Some(p) if connected => explain_selection(&p.object, &set, request).map_err(refused)?,
        _ => None,
    };
    let items = listed.map(|(_, items)| explain_items(&set, items));
    let mut json = explain_json(snapshot, &set, connected);
    let mut table = explain_table(snapshot, &set, connected);
    if let Some(selection) = selection {
        table.push_str(&selection_table(&selection));
        json["toolSelection"] = selection;
    }
    if let Some(items) = items {
        table.push_str(&items_table(&items));
        json["items"] = items;
    }
    Ok(Explained { json, table })
}

/// Lists every allowed server's tools, resources and prompts through a short-lived client pool.
async fn list_all_tools(
    snapshot: &Snapshot,
    compiled: &CompiledProfile,
) -> anyhow::Result<(BTreeMap<String, ServerTools>, ListedItems)> {
    /// Time for one server's resources or prompts listing (its tools had the start's budget).
    const ITEMS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
    let pool = Pool::new(PoolOptions { idle_timeout: None, ..PoolOptions::default() });
    for error in pool.apply(snapshot).await {
        tell(format_args!("warning: {error}"));
    }
    let lists = compiled.servers().map(|(id, part)| {
        let pool = pool.clone();
        async move {
            let tools = pool.server_tools(id, part).await;
            let resources = pool.list_resources(id, ITEMS_TIMEOUT).await;
            let prompts = pool.list_prompts(id, ITEMS_TIMEOUT).await;
            for error in [resources.as_ref().err(), prompts.as_ref().err()].into_iter().flatten() {
                tell(format_args!("warning: {id}: {error}"));
            }
            let resources = resources.unwrap_or_default().into_iter().map(|r| r.uri.clone()).collect();
            let prompts = prompts.unwrap_or_default().into_iter().map(|p| p.name).collect();
            (id.to_string(), tools, (resources, prompts))
        }
    });
    let mut tools = BTreeMap::new();
    let mut items = ListedItems::new();
    for (id, server_tools, server_items) in futures::future::join_all(lists).await {
        tools.insert(id.clone(), server_tools);
        items.insert(id, server_items);
    }
    pool.shutdown().await;
    Ok((tools, items))
}
