//! `spearlet install --to PATH`: the injected init container's copy of the spearlet.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::api::keys;
use crate::cli::{tell, usage};
use crate::install::install_self;

/// Copy this executable to PATH (the webhook's init container: `/spearlet install --to
/// /spear/bin/spearlet`), so the spearlet image needs no shell and no `cp`.
///
/// Writes a temporary file next to PATH, sets mode 0755, syncs it and renames it over PATH: a
/// file already there (an earlier run's copy) is replaced whole, never seen half-written.
/// Exit status: 0 when installed, 1 when reading or writing failed, 2 when PATH is a directory
/// or its directory does not exist.
#[derive(clap::Args, Debug)]
pub(crate) struct InstallArgs {
    /// The file to write, in an existing directory (for example /spear/bin/spearlet).
    #[arg(long, env = keys::ENV_INSTALL_TO, value_name = "PATH")]
    pub(super) to: PathBuf,
}

impl InstallArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        match install_self(&self.to) {
            Ok(bytes) => {
                tell(format_args!("installed {} ({bytes} bytes)", self.to.display()));
                Ok(ExitCode::SUCCESS)
            }
            Err(e) if e.is_usage() => Err(usage(format!("--to {}: {e}", self.to.display()))),
            Err(e) => Err(e.into()),
        }
    }
}
