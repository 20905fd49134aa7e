//! `spear-operator crds`: the CRDs generated from the Rust types.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use crate::api::{crd, keys};
use crate::cli::{emit, tell};

/// Print the CustomResourceDefinitions generated from the Rust types (for `kubectl apply -f -`).
#[derive(clap::Args, Debug)]
pub(crate) struct CrdsArgs {
    /// Write one file per CRD into this directory instead of printing a YAML stream.
    #[arg(long, env = keys::ENV_CRDS_OUTPUT_DIR)]
    output_dir: Option<PathBuf>,
}

impl CrdsArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let rendered = crd::render().context("rendering CRDs")?;
        let Some(dir) = self.output_dir else {
            for (_, yaml) in rendered {
                emit(&format!("---\n{yaml}"));
            }
            return Ok(ExitCode::SUCCESS);
        };
        for (file, yaml) in rendered {
            let path = dir.join(file);
            std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
            tell(format_args!("wrote {}", path.display()));
        }
        Ok(ExitCode::SUCCESS)
    }
}
