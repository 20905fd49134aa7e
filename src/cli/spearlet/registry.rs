//! `spearlet registry --registry-dir DIR [--watch]`: a registry directory's snapshot, and with
//! `--watch` every new revision as files change.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::api::keys;
use crate::cli::{EXIT_INVALID, run_until_signal, say, usage};
use crate::registry::describe::{describe, describe_change};
use crate::registry::dir::{DirOptions, DirSource};
use crate::registry::view::RegistryView;

/// Load a registry directory (local mode) and print its snapshot.
///
/// With --watch, keeps running and prints every new revision as files change (until SIGINT
/// or SIGTERM). Problems are printed as `file:line: field: message (fix)`; the last good
/// objects of a broken file keep serving. Exit status without --watch: 0 when the registry
/// is clean, 1 when it is degraded, 2 on a usage error (for example a missing directory).
#[derive(clap::Args, Debug)]
pub(crate) struct RegistryArgs {
    /// Directory of McpServer/McpProfile manifests (*.yaml, *.yml, *.json; not recursive).
    #[arg(long, env = keys::ENV_REGISTRY_DIR, value_name = "DIR")]
    registry_dir: PathBuf,
    /// Keep watching the directory and print each new revision.
    #[arg(long, env = keys::ENV_REGISTRY_WATCH)]
    watch: bool,
}

impl RegistryArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let dir = self.registry_dir;
        if self.watch {
            return run_until_signal(1, |cancel| watch(dir, cancel));
        }
        let snapshot = DirSource::load(&dir).map_err(usage)?;
        say(&describe(&dir, &snapshot));
        Ok(if snapshot.is_degraded() { ExitCode::from(EXIT_INVALID) } else { ExitCode::SUCCESS })
    }
}

async fn watch(dir: PathBuf, cancel: CancellationToken) -> anyhow::Result<ExitCode> {
    let dir: &Path = &dir;
    let mut source = DirSource::watch(dir, DirOptions::default()).map_err(usage)?;
    let mut rx = source.watch();
    let mut current = rx.borrow_and_update().clone();
    say(&describe(dir, &current));
    say(&format!("watching {} (Ctrl-C to stop)\n", dir.display()));
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
                let next = rx.borrow_and_update().clone();
                say(&describe_change(&current, &next));
                current = next;
            }
            result = source.finished() => {
                result?;
                break;
            }
            () = cancel.cancelled() => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}
