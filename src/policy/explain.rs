//! The effective set explained, for `spearlet explain` and the admin `/debug/effective`. Pure.

use crate::policy::EffectiveSet;
use crate::registry::snapshot::Snapshot;

/// The note shown when tool lists were not fetched.
pub const NOT_LISTED: &str = "tool lists not fetched: decided on servers and patterns alone (per-tool decisions need a connection to each server)";

/// The effective set as JSON (explain, `/debug/effective`): servers with their tools and
/// budgets, every exclusion with its reason. `listed` says whether tool lists were known.
pub fn explain_json(snapshot: &Snapshot, set: &EffectiveSet, listed: bool) -> serde_json::Value {
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
