//! `spearlet serve`: the agent in local mode (flags → [`LocalConfig`] → [`run_local`]).

use std::path::PathBuf;
use std::process::ExitCode;

use super::agent_args::AgentArgs;
use crate::agent::{LocalConfig, run_local};
use crate::api::keys;
use crate::cli::run_until_signal;

/// Run the agent in local mode: chat completions with MCP tools and /mcp on --http-addr,
/// gRPC on --grpc-addr, health and metrics on --admin-addr, over a registry directory
/// (stdio servers run as child processes). Stops on SIGINT/SIGTERM after in-flight requests
/// finish (--shutdown-grace-seconds). Exit status: 0 after a clean shutdown, 1 when a server
/// fails, 2 on a usage error.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Directory of McpServer/McpProfile manifests (local mode; re-read on change).
    #[arg(long, env = keys::ENV_REGISTRY_DIR, value_name = "DIR")]
    pub(crate) registry_dir: PathBuf,
    /// The McpProfile to serve. May be omitted when the registry has exactly one profile.
    #[arg(long, env = keys::ENV_PROFILE)]
    pub(crate) profile: Option<String>,
    #[command(flatten)]
    pub(crate) agent: AgentArgs,
}

impl ServeArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let threads = usize::from(self.agent.worker_threads);
        let config = self.config()?;
        run_until_signal(threads, |cancel| async move { super::agent_outcome(run_local(config, cancel).await) })
    }
}

impl ServeArgs {
    /// The plain configuration: local mode keeps the admin port on loopback unless told otherwise.
    pub(crate) fn config(self) -> anyhow::Result<LocalConfig> {
        Ok(LocalConfig {
            registry_dir: self.registry_dir,
            profile: self.profile,
            agent: self.agent.config(std::net::Ipv4Addr::LOCALHOST, 600)?,
        })
    }
}
