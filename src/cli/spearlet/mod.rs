//! `spearlet`: the per-pod agent and its tools. One file per subcommand.

mod agent_args;
mod bridge;
mod convert;
mod explain;
mod install;
mod registry;
mod run;
mod serve;
#[cfg(test)]
mod tests;
mod tools;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use self::agent_args::AgentArgs;
pub use self::run::RunArgs;
pub use self::serve::ServeArgs;
pub use self::tools::ToolsCommand;
use crate::agent::RunError;
use crate::cli::{exit, usage};
use crate::telemetry::LogArgs;

/// The per-pod MCP agent of spear-mcp.
#[derive(Parser, Debug)]
#[command(name = "spearlet", version, about)]
pub struct Args {
    #[command(flatten)]
    log: LogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    Serve(ServeArgs),
    Run(RunArgs),
    /// List and call the tools this pod may use, through the agent's gRPC door.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    Registry(registry::RegistryArgs),
    Explain(explain::ExplainArgs),
    Validate(validate::ValidateArgs),
    Convert(convert::ConvertArgs),
    Bridge(bridge::BridgeArgs),
    Install(install::InstallArgs),
}

impl Args {
    /// Runs the selected subcommand and returns the process's exit status.
    pub fn run(self) -> ExitCode {
        let Self { log, command } = self;
        exit(log.init().map_err(usage).and_then(|()| match command {
            Command::Serve(args) => args.run(),
            Command::Run(args) => args.run(),
            Command::Tools { command } => command.run(),
            Command::Registry(args) => args.run(),
            Command::Explain(args) => args.run(),
            Command::Validate(args) => args.run(),
            Command::Convert(args) => args.run(),
            Command::Bridge(args) => args.run(),
            Command::Install(args) => args.run(),
        }))
    }
}

/// The agent's outcome for [`exit`]: configuration errors are usage errors.
fn agent_outcome(result: Result<(), RunError>) -> anyhow::Result<ExitCode> {
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.is_usage() => Err(usage(e)),
        Err(e) => Err(e.into()),
    }
}
