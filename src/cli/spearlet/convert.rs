//! `spearlet convert FILE...`: the configs teams already have (the design's registry files, the
//! MCP Registry's server.json, client `mcpServers` configs) into McpServer YAML.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::api::keys;
use crate::cli::{EXIT_INVALID, emit, tell, usage};
use crate::convert::{self, Options, Prefer};

/// Convert MCP server configs into McpServer YAML: the design's file registry (TOML or JSON,
/// one server per file), the official MCP Registry's server.json, and client configs
/// (`mcpServers` of Claude Desktop, Claude Code and Cursor; `servers` of VS Code).
///
/// Prints a YAML stream, or writes `<name>.yaml` files into --output-dir. Secret values are never
/// copied: they become ${ENV:NAME} references, or with --secret references into a Secret; the
/// notes at the top of each document say what to set. Exit status: 0 when every file converted,
/// 1 when one did not (each error names the file and key; nothing of that file is written), 2 on
/// a usage error.
#[derive(clap::Args, Debug)]
pub(crate) struct ConvertArgs {
    /// Config files (*.toml or *.json).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Write one file per server here instead of printing to stdout.
    #[arg(long, env = keys::ENV_CONVERT_OUTPUT_DIR)]
    output_dir: Option<PathBuf>,
    /// Namespace to set on the generated objects (omitted by default).
    #[arg(long, env = keys::ENV_CONVERT_NAMESPACE)]
    namespace: Option<String>,
    /// Secret values become secretKeyRefs into this Secret (for a cluster) instead of
    /// ${ENV:NAME} references (for local mode).
    #[arg(long, value_name = "NAME")]
    secret: Option<String>,
    /// A server.json OCI package's entrypoint, which server.json does not carry: a JSON array
    /// (as `docker inspect` prints it) or words separated by spaces.
    #[arg(long, value_name = "ARGV")]
    entrypoint: Option<String>,
    /// For a server.json that offers both: run its remote endpoint or its package.
    #[arg(long, value_enum, default_value_t = Prefer::Remote)]
    prefer: Prefer,
}

impl ConvertArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        if let Some(secret) = self.secret.as_deref().filter(|s| !convert::is_secret_name(s)) {
            return Err(usage(format!("--secret {secret}: not a Secret name (lower-case DNS subdomain)")));
        }
        let entrypoint = self.entrypoint.as_deref().map(parse_argv).transpose()?;
        let options = Options { secret: self.secret.clone(), entrypoint, prefer: self.prefer };
        let mut failed = false;
        for file in &self.files {
            let text = std::fs::read_to_string(file).map_err(|e| usage(format!("{}: {e}", file.display())))?;
            let file_name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let converted =
                convert::Format::detect(&file_name, &text).and_then(|format| convert::convert(&text, format, &options));
            let converted = match converted {
                Ok(converted) => converted,
                Err(e) => {
                    for line in e.to_string().lines() {
                        tell(format_args!("{}: {line}", file.display()));
                    }
                    failed = true;
                    continue;
                }
            };
            for mut c in converted {
                c.server.metadata.namespace.clone_from(&self.namespace);
                failed |= !self.write(&c, &file.display().to_string());
            }
        }
        Ok(if failed { ExitCode::from(EXIT_INVALID) } else { ExitCode::SUCCESS })
    }

    /// Prints or writes one server; false when that failed (said on stderr).
    fn write(&self, c: &convert::Converted, origin: &str) -> bool {
        let name = c.server.metadata.name.as_deref().unwrap_or("server");
        let yaml = match convert::to_yaml(c, origin) {
            Ok(yaml) => yaml,
            Err(e) => {
                tell(format_args!("{origin}: {name}: rendering YAML: {e}"));
                return false;
            }
        };
        for note in &c.notes {
            tell(format_args!("{origin}: {name}: note: {note}"));
        }
        match &self.output_dir {
            None => emit(&format!("---\n{yaml}")),
            Some(dir) => {
                let out = dir.join(format!("{name}.yaml"));
                if let Err(e) = std::fs::write(&out, yaml) {
                    tell(format_args!("{}: {e}", out.display()));
                    return false;
                }
                tell(format_args!("{origin} -> {}", out.display()));
            }
        }
        true
    }
}

/// `["node", "/app/index.js"]` or `node /app/index.js`.
fn parse_argv(text: &str) -> anyhow::Result<Vec<String>> {
    let argv: Vec<String> = if text.trim_start().starts_with('[') {
        serde_json::from_str(text).map_err(|e| usage(format!("--entrypoint: not a JSON array of strings: {e}")))?
    } else {
        text.split_whitespace().map(str::to_string).collect()
    };
    if argv.is_empty() || argv[0].is_empty() {
        return Err(usage("--entrypoint: empty"));
    }
    Ok(argv)
}
