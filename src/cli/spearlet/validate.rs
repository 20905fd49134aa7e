//! `spearlet validate FILE|DIR|-...`: offline validation for CI and GitOps pipelines.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::api::manifest;
use crate::cli::{EXIT_INVALID, say, tell, usage};

/// Validate McpServer/McpProfile manifests offline (for CI and GitOps pipelines).
///
/// Prints one line per problem as `file:line: field: message (fix)`. Exit status: 0 when
/// everything is valid, 1 when a manifest is invalid, 2 on a usage error.
#[derive(clap::Args, Debug)]
pub(crate) struct ValidateArgs {
    /// Files, directories (their *.yaml, *.yml and *.json files, not recursive) or `-` for stdin.
    #[arg(required = true, value_name = "FILE|DIR|-")]
    paths: Vec<PathBuf>,
}

impl ValidateArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let inputs = collect_inputs(&self.paths)?;
        let (mut objects, mut problems) = (0, 0);
        for (name, source) in &inputs {
            let text = read_input(source.as_deref()).map_err(|e| usage(format!("{name}: {e}")))?;
            let parsed = manifest::parse(&text);
            objects += parsed.documents.len();
            problems += parsed.problems.len();
            for problem in &parsed.problems {
                say(&format!("{name}:{problem}\n"));
            }
        }
        if problems > 0 {
            tell(format_args!("{problems} problem(s) in {} file(s)", inputs.len()));
            Ok(ExitCode::from(EXIT_INVALID))
        } else {
            tell(format_args!("ok: {objects} object(s) in {} file(s)", inputs.len()));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Expands the arguments into (display name, source) pairs; a missing path is a usage error.
fn collect_inputs(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, Option<PathBuf>)>> {
    let mut inputs = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            inputs.push(("<stdin>".to_string(), None));
            continue;
        }
        let meta = std::fs::metadata(path).map_err(|e| usage(format!("{}: {e}", path.display())))?;
        if !meta.is_dir() {
            inputs.push((path.display().to_string(), Some(path.clone())));
            continue;
        }
        let entries = std::fs::read_dir(path).map_err(|e| usage(format!("{}: {e}", path.display())))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter(|e| manifest::is_manifest_file_name(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect();
        if files.is_empty() {
            return Err(usage(format!("{}: no *.yaml, *.yml or *.json files in this directory", path.display())));
        }
        files.sort();
        inputs.extend(files.into_iter().map(|f| (f.display().to_string(), Some(f))));
    }
    Ok(inputs)
}

/// The text of a file or stdin, at most one byte past what a manifest may have: `manifest::parse`
/// reports the size, and an endless stdin (`< /dev/zero`) is not read into memory first.
fn read_input(source: Option<&Path>) -> std::io::Result<String> {
    let reader: Box<dyn Read> = match source {
        Some(path) => Box::new(std::fs::File::open(path)?),
        None => Box::new(std::io::stdin()),
    };
    let mut bytes = Vec::new();
    reader.take(manifest::MAX_MANIFEST_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
