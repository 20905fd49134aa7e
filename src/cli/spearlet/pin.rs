//! `spearlet pin` (and `kubectl spear pin`): starts (or reaches) one server of a registry
//! directory or a namespace, lists its tools, and prints its McpServer with `spec.pinning.tools`
//! filled: the lock file that lives in Git with the manifest. The tools are listed through the agent's own client pool and digested by the
//! agent's own function (`policy::pin`), so what is printed is what every agent will compare.
//!
//! It prints, never writes: a registry file may hold several documents and comments that a
//! rewrite would lose; `> server.yaml` is the person's decision after reading the list.

use std::path::PathBuf;
use std::process::ExitCode;

use super::explain::cluster;
use crate::api::{McpServer, Pinning, keys};
use crate::cli::{block_on, emit, tell, usage};
use crate::mcp::{Pool, PoolOptions};
use crate::policy::{ServerTools, ToolInfo};
use crate::registry::dir::DirSource;
use crate::registry::snapshot::Snapshot;

/// Pin a server's tools: list them and print its McpServer with spec.pinning filled.
///
/// Starts the server as `spearlet serve` would (a stdio server as a local child process, then
/// stopped; a Streamable HTTP server reached at its URL), lists its tools, and prints the
/// manifest with a `sha256:` pin for each tool its allowedTools/deniedTools serve and
/// `pinning.mode: enforce` (or the mode it already has). Review the tools first (`spearlet
/// explain --connect`); agents then withhold any tool that differs from its pin. Local mode
/// (--registry-dir) reads the server from a directory; cluster mode (no --registry-dir) reads it
/// from the namespace's McpServers through the Kubernetes API, and this machine must reach the
/// server (and set the variables its configuration reads) as the pod does. Exit status: 0 on
/// success, 1 when the server cannot be read or listed, 2 on a usage error.
#[derive(clap::Args, Debug)]
pub(crate) struct PinArgs {
    /// The McpServer to pin (its metadata.name); or --server NAME.
    #[arg(value_name = "NAME", required_unless_present = "server", conflicts_with = "server")]
    name: Option<String>,
    /// The McpServer to pin (its metadata.name).
    #[arg(long, value_name = "NAME")]
    server: Option<String>,
    /// Directory of McpServer/McpProfile manifests (local mode). Without it: cluster mode.
    #[arg(long, env = keys::ENV_REGISTRY_DIR, value_name = "DIR")]
    registry_dir: Option<PathBuf>,
    #[command(flatten)]
    kube: cluster::KubeArgs,
}

impl PinArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let name = self.name.clone().or_else(|| self.server.clone()).unwrap_or_default();
        let (snapshot, source) = match &self.registry_dir {
            Some(_) if !self.kube.given().is_empty() => {
                return Err(usage(format!(
                    "--registry-dir is local mode and {} cluster mode: pass one of them",
                    self.kube.given().join(", ")
                )));
            }
            Some(dir) => (DirSource::load(dir).map_err(usage)?, dir.display().to_string()),
            None => {
                let read = cluster::read_server(&name, &self.kube);
                let (_, namespace, snapshot) = block_on(async {
                    read.await.map_err(|e| if e.is_usage() { usage(e) } else { anyhow::Error::new(e) })
                })?;
                (snapshot, format!("namespace {namespace}"))
            }
        };
        let Some(entry) = snapshot.server(&name) else {
            let problems = snapshot.problems().iter().map(|p| format!("\n  {p}")).collect::<String>();
            return Err(usage(format!("{source} has no valid McpServer named '{name}'{problems}")));
        };
        let tools = block_on(list(&snapshot, &name))?;
        let pinning = crate::policy::pin::pins_for(&entry.object.spec, &tools)
            .map_err(|e| anyhow::anyhow!("{name}: spec.allowedTools or deniedTools: {e}"))?;
        let unserved = tools.len() - pinning.tools.len();
        let pinned = pinning.tools.len();
        let server = manifest_of(&entry.object, pinning);
        emit(&format!("---\n{}", serde_yaml::to_string(&server)?));
        tell(format_args!(
            "pinned {pinned} tool(s) of {name}; {unserved} listed tool(s) its allowedTools/deniedTools do not serve were left unpinned"
        ));
        Ok(ExitCode::SUCCESS)
    }
}

/// The manifest to keep in Git: the server's name, namespace, labels, annotations and spec with
/// `pinning`; what the API server adds (uid, resourceVersion, managed fields, status, kubectl's
/// last-applied copy) left out.
fn manifest_of(server: &McpServer, pinning: Pinning) -> McpServer {
    let meta = &server.metadata;
    let mut annotations = meta.annotations.clone().unwrap_or_default();
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    let mut spec = server.spec.clone();
    spec.pinning = Some(pinning);
    let mut out = McpServer::new(meta.name.as_deref().unwrap_or_default(), spec);
    out.metadata.namespace = meta.namespace.clone();
    out.metadata.labels = meta.labels.clone().filter(|l| !l.is_empty());
    out.metadata.annotations = Some(annotations).filter(|a| !a.is_empty());
    out
}

/// The server's tools as the agent's pool lists them.
async fn list(snapshot: &Snapshot, server: &str) -> anyhow::Result<Vec<ToolInfo>> {
    let pool = Pool::new(PoolOptions { idle_timeout: None, ..PoolOptions::default() });
    for error in pool.apply(snapshot).await {
        tell(format_args!("warning: {error}"));
    }
    // A listing gives up on a start after a few seconds; a start (an `npx` download) may take
    // its whole budget: wait for it to end, then list again. Subscribed before listing, so a
    // start that ends in between is not missed.
    let listed = loop {
        let ended = pool.list_changed(server);
        let listed = pool.server_tools(server, server).await;
        let (ServerTools::Starting(starting), Ok(ended)) = (&listed, ended) else { break listed };
        let left = (starting.since + starting.budget).duration_since(std::time::SystemTime::now()).unwrap_or_default();
        if left.is_zero() || tokio::time::timeout(left, ended).await.is_err() {
            break listed;
        }
    };
    pool.shutdown().await;
    match listed {
        ServerTools::Listed(list) => Ok(list.tools().iter().map(|(tool, _)| tool.clone()).collect()),
        ServerTools::EnvMissing { variable } => {
            anyhow::bail!("{server}: the variable {variable} its configuration reads is not set: set it and run again")
        }
        ServerTools::ListFailed { message, .. } => anyhow::bail!("{server}: listing its tools failed: {message}"),
        ServerTools::Starting(starting) => anyhow::bail!(
            "{server}: still {} when its start budget ran out: raise budgets.startupTimeoutMs or run again",
            starting.describe(std::time::SystemTime::now())
        ),
        ServerTools::Unknown => anyhow::bail!("{server}: its tools could not be listed"),
    }
}
