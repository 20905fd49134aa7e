//! `spearlet serve`: flags → config → [`crate::agent::serve::serve`]. Thin.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::run::AgentArgs;
use super::{shutdown_signal, usage_error};
use crate::mcp::config::Mode;
use crate::registry::dir::{DirOptions, DirSource};
use crate::registry::view::RegistryView;

/// Where audit lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditTarget {
    /// stderr, beside the logs.
    Stderr,
    /// No audit.
    Off,
    /// Appended to a file.
    File(PathBuf),
}

impl std::str::FromStr for AuditTarget {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "stderr" | "-" => AuditTarget::Stderr,
            "off" | "none" => AuditTarget::Off,
            path => AuditTarget::File(PathBuf::from(path)),
        })
    }
}

/// Flags of `spearlet serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Directory of McpServer/McpProfile manifests (local mode; re-read on change).
    #[arg(long, env = "SPEAR_REGISTRY_DIR", value_name = "DIR")]
    pub registry_dir: PathBuf,
    /// The McpProfile to serve. May be omitted when the registry has exactly one profile.
    #[arg(long, env = "SPEAR_PROFILE")]
    pub profile: Option<String>,
    /// The doors, audit and shutdown (shared with `spearlet run`).
    #[command(flatten)]
    pub agent: AgentArgs,
}

impl ServeArgs {
    /// Runs the agent until SIGINT/SIGTERM. Exit status: 0 after a clean shutdown, 1 when a
    /// server fails, 2 on a usage error (bad directory, taken port, unknown profile).
    pub fn run(self) -> ExitCode {
        let runtime = match self.agent.runtime() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: starting the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        runtime.block_on(async {
            let cancel = CancellationToken::new();
            let signal = cancel.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                signal.cancel();
            });
            self.run_until(cancel).await
        })
    }

    /// Runs the agent until `cancel` (no signal handling).
    pub async fn run_until(self, cancel: CancellationToken) -> ExitCode {
        crate::install_crypto_provider();
        let watch = match DirSource::watch_until(&self.registry_dir, DirOptions::default(), &cancel) {
            Ok(watch) => Arc::new(watch),
            Err(e) => return usage_error(format!("--registry-dir: {e}")),
        };
        let profile = match self.profile.clone() {
            Some(profile) => profile,
            None => {
                let snapshot = watch.snapshot();
                let names: Vec<&str> = snapshot.profiles().keys().map(String::as_str).collect();
                match names.as_slice() {
                    [only] => (*only).to_string(),
                    [] => {
                        return usage_error(format!(
                            "--profile: {} has no McpProfile; add one or pass --profile",
                            self.registry_dir.display()
                        ));
                    }
                    many => {
                        return usage_error(format!(
                            "--profile: the registry has several profiles ({}); pick one",
                            many.join(", ")
                        ));
                    }
                }
            }
        };
        let registry: Arc<dyn RegistryView> = watch;
        self.agent.serve(profile, registry, Mode::Local, cancel, None).await
    }
}
