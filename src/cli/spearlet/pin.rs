//! `spearlet pin`: starts (or reaches) one server of a registry directory, lists its tools, and
//! prints its McpServer with `spec.pinning.tools` filled: the lock file that lives in Git with
//! the manifest. The tools are listed through the agent's own client pool and digested by the
//! agent's own function (`policy::pin`), so what is printed is what every agent will compare.
//!
//! It prints, never writes: a registry file may hold several documents and comments that a
//! rewrite would lose; `> server.yaml` is the person's decision after reading the list.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::api::keys;
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
/// explain --connect`); agents then withhold any tool that differs from its pin. Exit status: 0
/// on success, 1 when the server cannot be listed, 2 on a usage error.
#[derive(clap::Args, Debug)]
pub(crate) struct PinArgs {
    /// Directory of McpServer/McpProfile manifests.
    #[arg(long, env = keys::ENV_REGISTRY_DIR, value_name = "DIR")]
    registry_dir: PathBuf,
    /// The McpServer to pin (its metadata.name).
    #[arg(long, value_name = "NAME")]
    server: String,
}

impl PinArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let snapshot = DirSource::load(&self.registry_dir).map_err(usage)?;
        let Some(entry) = snapshot.server(&self.server) else {
            let problems = snapshot.problems().iter().map(|p| format!("\n  {p}")).collect::<String>();
            return Err(usage(format!(
                "{} has no valid McpServer named '{}'{problems}",
                self.registry_dir.display(),
                self.server
            )));
        };
        let tools = block_on(list(&snapshot, &self.server))?;
        let pinning = crate::policy::pin::pins_for(&entry.object.spec, &tools)
            .map_err(|e| anyhow::anyhow!("{}: spec.allowedTools or deniedTools: {e}", self.server))?;
        let unserved = tools.len() - pinning.tools.len();
        let mut server = (*entry.object).clone();
        let pinned = pinning.tools.len();
        server.spec.pinning = Some(pinning);
        server.status = None;
        emit(&format!("---\n{}", serde_yaml::to_string(&server)?));
        tell(format_args!(
            "pinned {pinned} tool(s) of {}; {unserved} listed tool(s) its allowedTools/deniedTools do not serve were left unpinned",
            self.server
        ));
        Ok(ExitCode::SUCCESS)
    }
}

/// The server's tools as the agent's pool lists them.
async fn list(snapshot: &Snapshot, server: &str) -> anyhow::Result<Vec<ToolInfo>> {
    let pool = Pool::new(PoolOptions { idle_timeout: None, ..PoolOptions::default() });
    for error in pool.apply(snapshot).await {
        tell(format_args!("warning: {error}"));
    }
    let listed = pool.server_tools(server, server).await;
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
