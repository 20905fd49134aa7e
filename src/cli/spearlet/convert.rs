//! `spearlet convert FILE...`: file-based registry configs (TOML/JSON, one server per file) into
//! McpServer YAML.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::api::keys;
use crate::cli::{EXIT_INVALID, emit, tell, usage};
use crate::convert;

/// Convert file-based registry configs (TOML or JSON, one server per file) into McpServer YAML.
///
/// Prints a YAML stream, or writes `<name>.yaml` files into --output-dir. Exit status: 0 when
/// every file converted, 1 when one did not (each error names the file and key), 2 on a usage
/// error.
#[derive(clap::Args, Debug)]
pub(crate) struct ConvertArgs {
    /// Legacy config files (*.toml or *.json).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Write one file per server here instead of printing to stdout.
    #[arg(long, env = keys::ENV_CONVERT_OUTPUT_DIR)]
    output_dir: Option<PathBuf>,
    /// Namespace to set on the generated objects (omitted by default).
    #[arg(long, env = keys::ENV_CONVERT_NAMESPACE)]
    namespace: Option<String>,
}

impl ConvertArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let mut failed = false;
        for file in &self.files {
            let Some(format) = convert::Format::from_path(file) else {
                return Err(usage(format!("{}: expected a .toml or .json file", file.display())));
            };
            let text = std::fs::read_to_string(file).map_err(|e| usage(format!("{}: {e}", file.display())))?;
            let mut server = match convert::convert(&text, format) {
                Ok(server) => server,
                Err(e) => {
                    tell(format_args!("{}: {e}", file.display()));
                    failed = true;
                    continue;
                }
            };
            server.metadata.namespace.clone_from(&self.namespace);
            let yaml = match convert::to_yaml(&server, &file.display().to_string()) {
                Ok(yaml) => yaml,
                Err(e) => {
                    tell(format_args!("{}: rendering YAML: {e}", file.display()));
                    failed = true;
                    continue;
                }
            };
            match &self.output_dir {
                None => emit(&format!("---\n{yaml}")),
                Some(dir) => {
                    let name = server.metadata.name.as_deref().unwrap_or("server");
                    let out = dir.join(format!("{name}.yaml"));
                    if let Err(e) = std::fs::write(&out, yaml) {
                        tell(format_args!("{}: {e}", out.display()));
                        failed = true;
                    } else {
                        tell(format_args!("{} -> {}", file.display(), out.display()));
                    }
                }
            }
        }
        Ok(if failed { ExitCode::from(EXIT_INVALID) } else { ExitCode::SUCCESS })
    }
}
