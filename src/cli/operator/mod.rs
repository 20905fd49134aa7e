//! `spear-operator`: `crds` prints the CRDs; `inject` prints the pod the webhook would admit
//! (offline); `run` runs the controllers, the webhook and the admin server. One file per
//! subcommand.

mod crds;
mod inject;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub(crate) use self::run::RunArgs;
use crate::cli::{exit, usage};
use crate::telemetry::LogArgs;

/// The spear-mcp control plane: validates McpServer/McpProfile resources and injects agents.
#[derive(Parser, Debug)]
#[command(name = "spear-operator", version, about)]
pub struct Args {
    #[command(flatten)]
    log: LogArgs,

    #[command(flatten)]
    trust: crate::cli::TrustArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    Crds(crds::CrdsArgs),
    Inject(inject::InjectArgs),
    Run(Box<RunArgs>),
}

impl Args {
    /// Runs the selected subcommand and returns the process's exit status.
    pub fn run(self) -> ExitCode {
        let Self { log, trust, command } = self;
        let code = exit(log.init().map_err(usage).and_then(|_logs| {
            trust.configure()?;
            match command {
                Command::Crds(args) => args.run(),
                Command::Inject(args) => args.run(),
                Command::Run(args) => args.run(),
            }
        }));
        // Spans still batched leave before the process does.
        crate::telemetry::otel::shutdown();
        code
    }
}
