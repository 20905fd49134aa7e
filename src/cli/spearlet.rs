//! `spearlet` subcommands available so far: offline validation and migration.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use super::{EXIT_INVALID, usage_error};
use crate::api::manifest;
use crate::convert;
use crate::mcp::{Pool, PoolOptions};
use crate::policy::{CompiledProfile, EffectiveSet, RequestScope, ServerTools};
use crate::registry::dir::{DirOptions, DirSource};
use crate::registry::snapshot::Snapshot;
use crate::registry::view::RegistryView;
use crate::telemetry::LogArgs;

/// The per-pod MCP agent of spear-mcp.
#[derive(Parser, Debug)]
#[command(name = "spearlet", version, about)]
pub struct Args {
    #[command(flatten)]
    log: LogArgs,

    #[command(subcommand)]
    command: Command,
}

/// How `explain` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    /// Aligned text for people.
    Table,
    /// One JSON document for machines.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the agent in local mode: chat completions with MCP tools and /mcp on --http-addr,
    /// gRPC on --grpc-addr, health and metrics on --admin-addr, over a registry directory
    /// (stdio servers run as child processes). Stops on SIGINT/SIGTERM after in-flight requests
    /// finish (--shutdown-grace-seconds). Exit status: 0 after a clean shutdown, 1 when a server
    /// fails, 2 on a usage error.
    Serve(super::serve::ServeArgs),
    /// Run the in-pod agent (Kubernetes mode): the pod's McpProfile and its namespace's
    /// McpServers from the API (in-cluster config, or --kubeconfig), stdio servers through the
    /// bridge sockets; the same doors as `serve`. Exit status as for `serve`.
    Run(super::run::RunArgs),
    /// List and call the tools this pod may use, through the agent's gRPC door.
    Tools {
        #[command(subcommand)]
        command: super::tools::ToolsCommand,
    },
    /// Load a registry directory (local mode) and print its snapshot.
    ///
    /// With --watch, keeps running and prints every new revision as files change (until SIGINT
    /// or SIGTERM). Problems are printed as `file:line: field: message (fix)`; the last good
    /// objects of a broken file keep serving. Exit status without --watch: 0 when the registry
    /// is clean, 1 when it is degraded, 2 on a usage error (for example a missing directory).
    Registry {
        /// Directory of McpServer/McpProfile manifests (*.yaml, *.yml, *.json; not recursive).
        #[arg(long, env = "SPEAR_REGISTRY_DIR", value_name = "DIR")]
        registry_dir: PathBuf,
        /// Keep watching the directory and print each new revision.
        #[arg(long, env = "SPEAR_REGISTRY_WATCH")]
        watch: bool,
    },
    /// Explain what a profile exposes: the effective servers and tools, and why the rest is not.
    ///
    /// Without --connect it decides on servers and patterns alone and says so; with --connect it
    /// lists every allowed server's tools first. Exit status: 0 on success, 1 when the profile
    /// is unknown or the request is refused, 2 on a usage error.
    Explain {
        /// Directory of McpServer/McpProfile manifests (local mode).
        #[arg(long, env = "SPEAR_REGISTRY_DIR", value_name = "DIR")]
        registry_dir: PathBuf,
        /// The McpProfile to explain.
        #[arg(long, env = "SPEAR_PROFILE")]
        profile: String,
        /// A request scope as JSON: {"server_ids": [...], "tool_allowlist": [...],
        /// "tool_denylist": [...], "budgets": {...}}.
        #[arg(long, env = "SPEAR_EXPLAIN_REQUEST", value_name = "JSON")]
        request: Option<String>,
        /// Output format.
        #[arg(long, env = "SPEAR_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
        output: OutputFormat,
        /// Connect to each allowed server first and list its tools, so tool-level decisions are
        /// shown too (stdio servers are started as local child processes, then stopped).
        #[arg(long, env = "SPEAR_EXPLAIN_CONNECT")]
        connect: bool,
    },
    /// Validate McpServer/McpProfile manifests offline (for CI and GitOps pipelines).
    ///
    /// Prints one line per problem as `file:line: field: message (fix)`. Exit status: 0 when
    /// everything is valid, 1 when a manifest is invalid, 2 on a usage error.
    Validate {
        /// Files, directories (their *.yaml, *.yml and *.json files, not recursive) or `-` for stdin.
        #[arg(required = true, value_name = "FILE|DIR|-")]
        paths: Vec<PathBuf>,
    },
    /// Convert file-based registry configs (TOML or JSON, one server per file) into McpServer YAML.
    ///
    /// Prints a YAML stream, or writes `<name>.yaml` files into --output-dir. Exit status: 0 when
    /// every file converted, 1 when one did not (each error names the file and key), 2 on a usage
    /// error.
    Convert {
        /// Legacy config files (*.toml or *.json).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Write one file per server here instead of printing to stdout.
        #[arg(long, env = "SPEAR_CONVERT_OUTPUT_DIR")]
        output_dir: Option<PathBuf>,
        /// Namespace to set on the generated objects (omitted by default).
        #[arg(long, env = "SPEAR_CONVERT_NAMESPACE")]
        namespace: Option<String>,
    },
    /// Serve a stdio MCP server on a Unix socket (the pod sidecar): `bridge --socket PATH -- CMD ARGS...`.
    ///
    /// Runs CMD (argv, never a shell) as a child and relays its stdin/stdout byte for byte to one
    /// client on the socket. A second client is refused while one is connected; a client that
    /// leaves gets its child replaced; a child that exits is restarted with backoff. Its stderr
    /// goes to the log; nothing is written to stdout. Exit status: 0 after SIGTERM/SIGINT (the
    /// child is stopped first and the socket removed), 1 when CMD cannot start or the socket
    /// cannot be served, 2 on a usage error.
    Bridge {
        /// Unix socket to listen on; its directory must exist, a stale socket file is replaced.
        #[arg(long, env = "SPEAR_BRIDGE_SOCKET", value_name = "PATH")]
        socket: PathBuf,
        /// Server id shown in log lines (defaults to the command's file name).
        #[arg(long, env = "SPEAR_SERVER_ID", value_name = "ID")]
        server_id: Option<String>,
        /// The MCP server's command and arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD ARGS")]
        command: Vec<String>,
    },
}

impl Args {
    /// Runs the selected subcommand.
    pub fn run(self) -> ExitCode {
        let Self { log, command } = self;
        if let Err(e) = log.init() {
            return usage_error(e);
        }
        match command {
            Command::Serve(args) => args.run(),
            Command::Run(args) => args.run(),
            Command::Tools { command } => super::tools::run(command),
            Command::Registry { registry_dir, watch } => registry(&registry_dir, watch),
            Command::Explain { registry_dir, profile, request, output, connect } => {
                explain(&registry_dir, &profile, request.as_deref(), output, connect)
            }
            Command::Validate { paths } => validate(&paths),
            Command::Convert { files, output_dir, namespace } => {
                convert_files(&files, output_dir.as_deref(), namespace)
            }
            Command::Bridge { socket, server_id, command } => bridge(socket, server_id, command),
        }
    }
}

/// Expands the arguments into (display name, source) pairs; a missing path is a usage error.
fn collect_inputs(paths: &[PathBuf]) -> Result<Vec<(String, Option<PathBuf>)>, String> {
    let mut inputs = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            inputs.push(("<stdin>".to_string(), None));
            continue;
        }
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.is_dir() {
            inputs.push((path.display().to_string(), Some(path.clone())));
            continue;
        }
        let entries = std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter(|e| manifest::is_manifest_file_name(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect();
        if files.is_empty() {
            return Err(format!("{}: no *.yaml, *.yml or *.json files in this directory", path.display()));
        }
        files.sort();
        inputs.extend(files.into_iter().map(|f| (f.display().to_string(), Some(f))));
    }
    Ok(inputs)
}

fn read_input(source: Option<&Path>) -> std::io::Result<String> {
    match source {
        Some(path) => std::fs::read_to_string(path),
        None => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text)?;
            Ok(text)
        }
    }
}

fn validate(paths: &[PathBuf]) -> ExitCode {
    let inputs = match collect_inputs(paths) {
        Ok(inputs) => inputs,
        Err(e) => return usage_error(e),
    };
    let (mut objects, mut problems) = (0, 0);
    for (name, source) in &inputs {
        let text = match read_input(source.as_deref()) {
            Ok(text) => text,
            Err(e) => return usage_error(format!("{name}: {e}")),
        };
        let parsed = manifest::parse(&text);
        objects += parsed.documents.len();
        problems += parsed.problems.len();
        for problem in &parsed.problems {
            println!("{name}:{problem}");
        }
    }
    if problems > 0 {
        eprintln!("{problems} problem(s) in {} file(s)", inputs.len());
        ExitCode::from(EXIT_INVALID)
    } else {
        eprintln!("ok: {objects} object(s) in {} file(s)", inputs.len());
        ExitCode::SUCCESS
    }
}

fn convert_files(files: &[PathBuf], output_dir: Option<&Path>, namespace: Option<String>) -> ExitCode {
    let mut failed = false;
    for file in files {
        let Some(format) = convert::Format::from_path(file) else {
            return usage_error(format!("{}: expected a .toml or .json file", file.display()));
        };
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) => return usage_error(format!("{}: {e}", file.display())),
        };
        let mut server = match convert::convert(&text, format) {
            Ok(server) => server,
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                failed = true;
                continue;
            }
        };
        server.metadata.namespace.clone_from(&namespace);
        let yaml = match convert::to_yaml(&server, &file.display().to_string()) {
            Ok(yaml) => yaml,
            Err(e) => {
                eprintln!("{}: rendering YAML: {e}", file.display());
                failed = true;
                continue;
            }
        };
        match output_dir {
            None => print!("---\n{yaml}"),
            Some(dir) => {
                let name = server.metadata.name.as_deref().unwrap_or("server");
                let out = dir.join(format!("{name}.yaml"));
                if let Err(e) = std::fs::write(&out, yaml) {
                    eprintln!("{}: {e}", out.display());
                    failed = true;
                } else {
                    eprintln!("{} -> {}", file.display(), out.display());
                }
            }
        }
    }
    if failed { ExitCode::from(EXIT_INVALID) } else { ExitCode::SUCCESS }
}

// === registry ===

fn registry(dir: &Path, watch: bool) -> ExitCode {
    if !watch {
        return match DirSource::load(dir) {
            Ok(snapshot) => {
                print!("{}", describe(dir, &snapshot));
                if snapshot.is_degraded() { ExitCode::from(EXIT_INVALID) } else { ExitCode::SUCCESS }
            }
            Err(e) => usage_error(e),
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(watch_registry(dir))
}

async fn watch_registry(dir: &Path) -> ExitCode {
    let mut source = match DirSource::watch(dir, DirOptions::default()) {
        Ok(source) => source,
        Err(e) => return usage_error(e),
    };
    let mut rx = source.watch();
    let mut current = rx.borrow_and_update().clone();
    print!("{}", describe(dir, &current));
    println!("watching {} (Ctrl-C to stop)", dir.display());
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
                let next = rx.borrow_and_update().clone();
                print!("{}", describe_change(&current, &next));
                current = next;
            }
            result = source.finished() => {
                if let Err(e) = result {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
                break;
            }
            _ = crate::cli::shutdown_signal() => break,
        }
    }
    ExitCode::SUCCESS
}

fn join_or_dash(items: &[String]) -> String {
    if items.is_empty() { "-".into() } else { items.join(",") }
}

/// A human-readable table of a snapshot.
fn describe(dir: &Path, snapshot: &Snapshot) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let servers = snapshot.servers();
    let profiles = snapshot.profiles();
    let _ = writeln!(
        out,
        "registry {}: revision {}, {} server(s), {} profile(s){}",
        dir.display(),
        snapshot.revision(),
        servers.len(),
        profiles.len(),
        if snapshot.is_degraded() { ", DEGRADED" } else { "" }
    );
    let _ = writeln!(out, "{:<24} {:<15} {:<16} ALLOWED TOOLS", "SERVER", "TRANSPORT", "VERSION");
    for (name, server) in servers {
        let spec = &server.object.spec;
        let _ = writeln!(
            out,
            "{name:<24} {:<15} {:<16} {}",
            spec.transport.as_str(),
            server.resource_version,
            join_or_dash(&spec.allowed_tools)
        );
    }
    let _ = writeln!(out, "{:<24} {:<40} DEFAULT SERVERS", "PROFILE", "SERVERS");
    for (name, profile) in profiles {
        let spec = &profile.object.spec;
        let defaults = spec.default_servers.as_deref().map_or_else(|| "(all allowed)".to_string(), join_or_dash);
        let _ = writeln!(out, "{name:<24} {:<40} {defaults}", join_or_dash(&spec.servers));
    }
    for problem in snapshot.problems() {
        let _ = writeln!(out, "problem: {problem}");
    }
    out
}

/// One line per new revision, then its problems.
fn describe_change(old: &Snapshot, new: &Snapshot) -> String {
    use std::fmt::Write as _;
    let changes = old.changes(new);
    let mut parts: Vec<String> = changes.upserts.iter().map(|(k, n)| format!("~{k}/{n}")).collect();
    parts.extend(changes.deletes.iter().map(|(k, n)| format!("-{k}/{n}")));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "revision {} -> {}: {}{}",
        old.revision(),
        new.revision(),
        if parts.is_empty() { "no object changed".to_string() } else { parts.join(" ") },
        if new.is_degraded() { format!(" (DEGRADED: {} problem(s))", new.problems().len()) } else { String::new() }
    );
    for problem in new.problems() {
        let _ = writeln!(out, "problem: {problem}");
    }
    out
}

// === explain ===

/// Said wherever tools are not listed, so nobody mistakes a pattern-level answer for the full one.
use crate::policy::explain::{NOT_LISTED, explain_json};

fn explain(dir: &Path, profile: &str, request: Option<&str>, output: OutputFormat, connect: bool) -> ExitCode {
    let scope: Option<RequestScope> = match request.map(serde_json::from_str).transpose() {
        Ok(scope) => scope,
        Err(e) => return usage_error(format!("--request is not a valid request scope: {e}")),
    };
    let snapshot = match DirSource::load(dir) {
        Ok(snapshot) => snapshot,
        Err(e) => return usage_error(e),
    };
    for problem in snapshot.problems() {
        eprintln!("warning: registry problem (last good objects are used): {problem}");
    }
    let compiled = match CompiledProfile::compile(&snapshot, profile) {
        Ok(compiled) => compiled,
        Err(e) => {
            eprintln!("error: {} ({})", e, e.code());
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let tools = if connect {
        match list_all_tools(&snapshot, &compiled) {
            Ok(tools) => tools,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        BTreeMap::new()
    };
    let lookup = |id: &str| tools.get(id).cloned().unwrap_or(ServerTools::Unknown);
    let set = match compiled.effective(lookup, scope.as_ref(), &[]) {
        Ok(set) => set,
        Err(e) => {
            eprintln!("error: {} ({})", e, e.code());
            return ExitCode::from(EXIT_INVALID);
        }
    };
    match output {
        OutputFormat::Json => println!("{}", explain_json(&snapshot, &set, connect)),
        OutputFormat::Table => print!("{}", explain_table(&snapshot, &set, connect)),
    }
    ExitCode::SUCCESS
}

/// Lists every allowed server's tools through a short-lived client pool.
fn list_all_tools(snapshot: &Snapshot, compiled: &CompiledProfile) -> std::io::Result<BTreeMap<String, ServerTools>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    Ok(runtime.block_on(async {
        let pool = Pool::new(PoolOptions { idle_timeout: None, ..PoolOptions::default() });
        for error in pool.apply(snapshot).await {
            eprintln!("warning: {error}");
        }
        let lists = compiled.servers().map(|(id, part)| {
            let pool = pool.clone();
            async move { (id.to_string(), pool.server_tools(id, part).await) }
        });
        let tools = futures::future::join_all(lists).await.into_iter().collect();
        pool.shutdown().await;
        tools
    }))
}

fn explain_table(snapshot: &Snapshot, set: &EffectiveSet, listed: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "profile {} at registry revision {}", set.profile, set.revision);
    if !listed {
        let _ = writeln!(out, "note: {NOT_LISTED}");
    }
    let _ = writeln!(
        out,
        "{:<24} {:<20} {:>10} {:>12} {:>6}  TOOLS (allowed / denied patterns)",
        "SERVER", "NAME PART", "TIMEOUT MS", "OUTPUT BYTES", "CONC"
    );
    for s in &set.servers {
        let spec = snapshot.server(&s.id).map(|v| v.object.spec.clone()).unwrap_or_default();
        let tools = match &s.tools {
            Some(tools) => tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>().join(","),
            None => format!("{} / {}", join_or_dash(&spec.allowed_tools), join_or_dash(&spec.denied_tools)),
        };
        let b = s.budgets;
        let _ = writeln!(
            out,
            "{:<24} {:<20} {:>10} {:>12} {:>6}  {tools}",
            s.id, s.server_part, b.tool_timeout_ms, b.max_tool_output_bytes, b.max_concurrency
        );
    }
    let decisions = set.decisions();
    if !decisions.is_empty() {
        let _ = writeln!(out, "EXCLUDED");
        for d in decisions {
            let what = match &d.tool {
                Some(tool) => format!("{}/{tool}", d.server),
                None => d.server.clone(),
            };
            let detail = d.detail.as_deref().map(|x| format!(" ({x})")).unwrap_or_default();
            let _ = writeln!(out, "  {what:<40} {}{detail}", d.reason);
        }
    }
    let l = set.loop_budgets;
    let _ =
        writeln!(out, "loop budgets: maxIterations {}, maxTotalToolCalls {}", l.max_iterations, l.max_total_tool_calls);
    out
}

// === bridge ===

fn bridge(socket: PathBuf, server_id: Option<String>, argv: Vec<String>) -> ExitCode {
    let Some((command, args)) = argv.split_first() else {
        return usage_error("bridge needs a command after `--`");
    };
    let mut config = crate::bridge::BridgeConfig::new(socket, command.clone(), args.to_vec());
    config.server_id = server_id;
    // One thread is plenty for one child and one client, and keeps the sidecar small.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            crate::cli::shutdown_signal().await;
            trigger.cancel();
        });
        // Let the signal task run once so its handlers are installed before the child starts: a
        // SIGTERM during startup is then not lost (a container's PID 1 ignores it by default).
        tokio::task::yield_now().await;
        crate::bridge::run(config, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
