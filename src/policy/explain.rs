//! The effective set explained, for `spearlet explain` (a table or JSON) and the admin
//! `/debug/effective` (JSON). Pure.

use crate::policy::EffectiveSet;
use crate::registry::snapshot::Snapshot;

/// The note shown when tool lists were not fetched.
pub(crate) const NOT_LISTED: &str = "tool lists not fetched: decided on servers and patterns alone (per-tool decisions need a connection to each server)";

/// The effective set as JSON (explain, `/debug/effective`): servers with their tools and
/// budgets, every exclusion with its reason. `listed` says whether tool lists were known.
pub(crate) fn explain_json(snapshot: &Snapshot, set: &EffectiveSet, listed: bool) -> serde_json::Value {
    let servers: Vec<serde_json::Value> = set
        .servers
        .iter()
        .map(|s| {
            let spec = snapshot.server(&s.id).map(|v| v.object.spec.clone()).unwrap_or_default();
            serde_json::json!({
                "id": &*s.id,
                "namePart": &*s.server_part,
                "budgets": s.budgets,
                "allowedTools": spec.allowed_tools,
                "deniedTools": spec.denied_tools,
                "tools": s.tools.as_ref().map(|tools| tools.iter().map(|t| serde_json::json!({
                    "name": &*t.name, "tool": &*t.tool.name,
                })).collect::<Vec<_>>()),
            })
        })
        .collect();
    serde_json::json!({
        "profile": set.profile,
        "revision": set.revision.as_str(),
        "toolsListed": listed,
        "note": if listed { None } else { Some(NOT_LISTED) },
        "servers": servers,
        "excluded": set.decisions(),
        "loopBudgets": set.loop_budgets,
    })
}

/// The effective set as an aligned table for people (`spearlet explain --output table`).
pub(crate) fn explain_table(snapshot: &Snapshot, set: &EffectiveSet, listed: bool) -> String {
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

fn join_or_dash(items: &[String]) -> String {
    if items.is_empty() { "-".into() } else { items.join(",") }
}
