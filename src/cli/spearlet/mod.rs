//! `spearlet`: the per-pod agent and its tools. One file per subcommand.

mod agent_args;
mod approve;
mod auth;
mod bridge;
mod convert;
mod explain;
mod gateway;
mod install;
mod pin;
mod reconnect;
mod registry;
mod run;
mod serve;
#[cfg(test)]
mod tests;
mod tools;
mod validate;
mod wait_ready;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use self::agent_args::AgentArgs;
pub use self::run::RunArgs;
pub use self::serve::ServeArgs;
pub use self::tools::ToolsCommand;
use crate::agent::RunError;
use crate::cli::{TrustArgs, exit, usage};
use crate::telemetry::LogArgs;

/// The per-pod MCP agent of spear-mcp.
#[derive(Parser, Debug)]
#[command(name = "spearlet", version, about)]
pub struct Args {
    #[command(flatten)]
    log: LogArgs,

    #[command(flatten)]
    trust: TrustArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    Serve(ServeArgs),
    Run(RunArgs),
    Gateway(gateway::GatewayArgs),
    /// List and call the tools this pod may use, through the agent's gRPC door.
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    Registry(registry::RegistryArgs),
    Explain(explain::ExplainArgs),
    Validate(validate::ValidateArgs),
    Convert(convert::ConvertArgs),
    Pin(pin::PinArgs),
    Approve(approve::ApproveArgs),
    Deny(approve::DenyArgs),
    Bridge(bridge::BridgeArgs),
    Install(install::InstallArgs),
    Reconnect(reconnect::ReconnectArgs),
    Auth(auth::AuthArgs),
    WaitReady(wait_ready::WaitReadyArgs),
}

impl Args {
    /// Runs the selected subcommand and returns the process's exit status.
    pub fn run(self) -> ExitCode {
        let Self { log, trust, command } = self;
        let code = exit(log.init().map_err(usage).and_then(|_logs| {
            trust.configure()?;
            match command {
                Command::Serve(args) => args.run(),
                Command::Run(args) => args.run(),
                Command::Gateway(args) => args.run(),
                Command::Tools { command } => command.run(),
                Command::Registry(args) => args.run(),
                Command::Explain(args) => args.run(),
                Command::Validate(args) => args.run(),
                Command::Convert(args) => args.run(),
                Command::Pin(args) => args.run(),
                Command::Approve(args) => args.run(),
                Command::Deny(args) => args.run(),
                Command::Bridge(args) => args.run(),
                Command::Install(args) => args.run(),
                Command::Reconnect(args) => args.run(),
                Command::Auth(args) => args.run(),
                Command::WaitReady(args) => args.run(),
            }
        }));
        // Spans still batched leave before the process does.
        crate::telemetry::otel::shutdown();
        code
    }
}

/// The name kubectl finds this binary by as a plugin: `kubectl spear explain ...` runs
/// `kubectl-spear explain ...` from the PATH (a link to, or a copy of, the spearlet).
pub const KUBECTL_PLUGIN: &str = "kubectl-spear";

/// `kubectl spear`: the spearlet invoked as the kubectl plugin `kubectl-spear`. Only the commands
/// that make sense from a workstation against a cluster.
#[derive(Parser, Debug)]
#[command(name = KUBECTL_PLUGIN, bin_name = "kubectl spear", version, about = "spear-mcp for kubectl: why a pod sees the tools it sees, pinning a server's tools, approving calls, logging in to a remote server")]
pub struct PluginArgs {
    #[command(flatten)]
    log: LogArgs,

    #[command(flatten)]
    trust: TrustArgs,

    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Subcommand, Debug)]
enum PluginCommand {
    Explain(explain::ExplainArgs),
    Pin(pin::PinArgs),
    Approve(approve::ApproveArgs),
    Deny(approve::DenyArgs),
    Auth(auth::AuthArgs),
}

impl PluginArgs {
    /// Runs the selected subcommand and returns the process's exit status.
    pub fn run(self) -> ExitCode {
        let Self { log, trust, command } = self;
        exit(log.init().map_err(usage).and_then(|_logs| {
            trust.configure()?;
            match command {
                PluginCommand::Explain(args) => args.run(),
                PluginCommand::Pin(args) => args.run(),
                PluginCommand::Approve(args) => args.run(),
                PluginCommand::Deny(args) => args.run(),
                PluginCommand::Auth(args) => args.run(),
            }
        }))
    }
}

/// Runs this process's command line: as `kubectl spear` when invoked by the name
/// [`KUBECTL_PLUGIN`] (`argv[0]`, so a link works), else as `spearlet`.
pub fn main() -> ExitCode {
    let argv0 = std::env::args_os().next().map(std::path::PathBuf::from);
    if argv0.as_deref().and_then(std::path::Path::file_name).is_some_and(|name| name == KUBECTL_PLUGIN) {
        PluginArgs::parse().run()
    } else {
        Args::parse().run()
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
