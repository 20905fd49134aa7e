//! `spearlet explain`: what a profile exposes, and why the rest is not exposed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::api::keys;
use crate::cli::{block_on, terminal_safe, usage};
use crate::mcp::{Pool, PoolOptions};
use crate::policy::explain::{
    ExplainRequest, ListedItems, explain_items, explain_json, explain_selection, explain_table, items_table,
    selection_table,
};
use crate::policy::{CompiledProfile, PolicyError, ServerTools};
use crate::registry::dir::DirSource;
use crate::registry::snapshot::Snapshot;

/// How `explain` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OutputFormat {
    /// Aligned text for people.
    Table,
    /// One JSON document for machines.
    Json,
}

/// Explain what a profile exposes: the effective servers and tools, and why the rest is not.
///
/// Without --connect it decides on servers and patterns alone and says so; with --connect it
/// lists every allowed server's tools first. Exit status: 0 on success, 1 when the profile
/// is unknown or the request is refused, 2 on a usage error.
#[derive(clap::Args, Debug)]
pub(crate) struct ExplainArgs {
    /// Directory of McpServer/McpProfile manifests (local mode).
    #[arg(long, env = keys::ENV_REGISTRY_DIR, value_name = "DIR")]
    registry_dir: PathBuf,
    /// The McpProfile to explain.
    #[arg(long, env = keys::ENV_PROFILE)]
    profile: String,
    /// A request as JSON: a scope {"server_ids": [...], "tool_allowlist": [...],
    /// "tool_denylist": [...], "budgets": {...}}, and for chat.toolSelection the conversation
    /// and limit {"messages": [...], "max_tools": 10} (the selection needs --connect).
    #[arg(long, env = keys::ENV_EXPLAIN_REQUEST, value_name = "JSON")]
    request: Option<String>,
    /// Output format.
    #[arg(long, env = keys::ENV_OUTPUT, value_enum, default_value_t = OutputFormat::Table)]
    output: OutputFormat,
    /// Connect to each allowed server first and list its tools, so tool-level decisions are
    /// shown too (stdio servers are started as local child processes, then stopped).
    #[arg(long, env = keys::ENV_EXPLAIN_CONNECT)]
    connect: bool,
}

impl ExplainArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let request = self
            .request
            .as_deref()
            .map(ExplainRequest::parse)
            .transpose()
            .map_err(|e| usage(format!("--request is not a valid request: {e}")))?
            .unwrap_or_default();
        let snapshot = DirSource::load(&self.registry_dir).map_err(usage)?;
        for problem in snapshot.problems() {
            eprintln!("warning: registry problem (last good objects are used): {problem}");
        }
        let compiled =
            CompiledProfile::compile(&snapshot, &self.profile).map_err(|e| anyhow::anyhow!("{e} ({})", e.code()))?;
        let (tools, listed_items) = if self.connect {
            block_on(list_all_tools(&snapshot, &compiled))?
        } else {
            (BTreeMap::new(), ListedItems::new())
        };
        let lookup = |id: &str| tools.get(id).cloned().unwrap_or(ServerTools::Unknown);
        let refused = |e: PolicyError| anyhow::anyhow!("{e} ({})", e.code());
        let set = compiled.effective(lookup, request.scope.as_ref(), &[]).map_err(refused)?;
        let profile = snapshot.profile(&self.profile).map(|p| p.object.clone());
        let selection = match &profile {
            // Ranking needs the tools' descriptions: without --connect there is nothing to rank.
            Some(profile) if self.connect => explain_selection(profile, &set, &request).map_err(refused)?,
            _ => None,
        };
        match self.output {
            OutputFormat::Json => {
                let mut explained = explain_json(&snapshot, &set, self.connect);
                if let Some(selection) = selection {
                    explained["toolSelection"] = selection;
                }
                if self.connect {
                    explained["items"] = explain_items(&set, &listed_items);
                }
                println!("{explained}");
            }
            OutputFormat::Table => {
                let mut table = explain_table(&snapshot, &set, self.connect);
                if let Some(selection) = &selection {
                    table.push_str(&selection_table(selection));
                }
                if self.connect {
                    table.push_str(&items_table(&explain_items(&set, &listed_items)));
                }
                print!("{}", terminal_safe(&table));
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Lists every allowed server's tools, resources and prompts through a short-lived client pool.
async fn list_all_tools(
    snapshot: &Snapshot,
    compiled: &CompiledProfile,
) -> anyhow::Result<(BTreeMap<String, ServerTools>, ListedItems)> {
    /// Time for one server's resources or prompts listing (its tools had the start's budget).
    const ITEMS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
    let pool = Pool::new(PoolOptions { idle_timeout: None, ..PoolOptions::default() });
    for error in pool.apply(snapshot).await {
        eprintln!("warning: {error}");
    }
    let lists = compiled.servers().map(|(id, part)| {
        let pool = pool.clone();
        async move {
            let tools = pool.server_tools(id, part).await;
            let resources = pool.list_resources(id, ITEMS_TIMEOUT).await;
            let prompts = pool.list_prompts(id, ITEMS_TIMEOUT).await;
            for error in [resources.as_ref().err(), prompts.as_ref().err()].into_iter().flatten() {
                eprintln!("warning: {id}: {error}");
            }
            let resources = resources.unwrap_or_default().into_iter().map(|r| r.uri.clone()).collect();
            let prompts = prompts.unwrap_or_default().into_iter().map(|p| p.name).collect();
            (id.to_string(), tools, (resources, prompts))
        }
    });
    let mut tools = BTreeMap::new();
    let mut items = ListedItems::new();
    for (id, server_tools, server_items) in futures::future::join_all(lists).await {
        tools.insert(id.clone(), server_tools);
        items.insert(id, server_items);
    }
    pool.shutdown().await;
    Ok((tools, items))
}
