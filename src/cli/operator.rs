//! `spear-operator` subcommands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::api::crd;
use crate::telemetry::LogArgs;

/// The spear-mcp control plane: validates McpServer/McpProfile resources and injects agents.
#[derive(Parser, Debug)]
#[command(name = "spear-operator", version, about)]
pub struct Args {
    #[command(flatten)]
    log: LogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the CustomResourceDefinitions generated from the Rust types (for `kubectl apply -f -`).
    Crds {
        /// Write one file per CRD into this directory instead of printing a YAML stream.
        #[arg(long, env = "SPEAR_CRDS_OUTPUT_DIR")]
        output_dir: Option<PathBuf>,
    },
}

impl Args {
    /// Runs the selected subcommand.
    pub fn run(self) -> ExitCode {
        let Self { log, command } = self;
        if let Err(e) = log.init() {
            return super::usage_error(e);
        }
        match command {
            Command::Crds { output_dir } => crds(output_dir),
        }
    }
}

fn crds(output_dir: Option<PathBuf>) -> ExitCode {
    let rendered = match crd::render() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: rendering CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(dir) = output_dir else {
        for (_, yaml) in rendered {
            print!("---\n{yaml}");
        }
        return ExitCode::SUCCESS;
    };
    for (file, yaml) in rendered {
        let path = dir.join(file);
        if let Err(e) = std::fs::write(&path, yaml) {
            eprintln!("error: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
