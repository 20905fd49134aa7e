//! The effective set explained, for `spearlet explain` (a table or JSON) and the admin
//! `/debug/effective` (JSON). Pure.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::api::McpProfile;
use crate::policy::rank::Turn;
use crate::policy::select::{self, Pinned, SelectionPolicy, Why};
use crate::policy::{EffectiveSet, PolicyError, RequestScope};
use crate::registry::snapshot::Snapshot;

/// What `explain --request` and `/debug/effective?request=` take: a request scope, plus the
/// chat request's `messages` and `max_tools` to show the tool selection for.
#[derive(Debug, Default)]
pub struct ExplainRequest {
    /// The scope (every key but `messages` and `max_tools`).
    pub scope: Option<RequestScope>,
    /// The conversation, as a chat request sends it.
    pub messages: Option<Vec<Value>>,
    /// As the chat request's `mcp.max_tools`.
    pub max_tools: Option<u32>,
}

impl ExplainRequest {
    /// Parses the JSON object; the error names the field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut object: Map<String, Value> =
            serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
        let messages = match object.remove("messages") {
            None | Some(Value::Null) => None,
            Some(Value::Array(messages)) => Some(messages),
            Some(_) => return Err("messages: expected an array of chat messages".into()),
        };
        let max_tools = match object.remove("max_tools") {
            None | Some(Value::Null) => None,
            Some(value) => Some(
                value
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| (1..=128).contains(n))
                    .ok_or_else(|| format!("max_tools: expected an integer from 1 to 128, got {value}"))?,
            ),
        };
        let scope = if object.is_empty() {
            None
        } else {
            Some(serde_path_to_error::deserialize(Value::Object(object)).map_err(|e| e.to_string())?)
        };
        Ok(ExplainRequest { scope, messages, max_tools })
    }
}

/// The tool selection a chat request with `request`'s messages would get in its first round
/// (tools its messages already called are pinned), as JSON: every tool of the set with its
/// score, offered or not, best first. `None` when the profile offers every tool.
pub fn explain_selection(
    profile: &McpProfile,
    set: &EffectiveSet,
    request: &ExplainRequest,
) -> Result<Option<Value>, PolicyError> {
    let spec = profile.spec.chat.as_ref().and_then(|c| c.tool_selection.as_ref());
    let Some(policy) = SelectionPolicy::new(spec, request.max_tools)? else { return Ok(None) };
    let messages = request.messages.as_deref().unwrap_or_default();
    let mut pinned = Pinned::default();
    for name in select::called_names(messages) {
        pinned.pin(name, Why::Called);
    }
    let texts = select::turns(messages);
    let turns: Vec<Turn<'_>> = texts.iter().map(|(role, text)| Turn { role: *role, text }).collect();
    let selection = set.select(&policy, &turns, &pinned);
    let offered: std::collections::HashMap<&Arc<str>, Why> = selection.tools.iter().map(|t| (&t.name, t.why)).collect();
    let tools: Vec<Value> = set
        .ranked(&turns)
        .into_iter()
        .map(|(name, score)| {
            let why = offered.get(&name).copied();
            json!({"name": &*name, "score": select::rounded(score), "offered": why.is_some(), "why": why})
        })
        .collect();
    let definition = tool_definition;
    let all = select::estimated_tokens(set.tools().map(|(_, t)| definition(t)));
    let (find_description, find_schema) = select::find_tools_definition();
    let find_tools =
        selection.find_tools.then_some((select::FIND_TOOLS, Some(find_description.as_str()), &find_schema));
    let offered_tokens = select::estimated_tokens(
        set.tools().filter(|(_, t)| offered.contains_key(&t.name)).map(|(_, t)| definition(t)).chain(find_tools),
    );
    Ok(Some(json!({
        "maxTools": policy.max_tools,
        "of": selection.of,
        "offered": selection.tools.len(),
        "findTools": selection.find_tools.then_some(select::FIND_TOOLS),
        "promptTokens": {"all": all, "offered": offered_tokens, "estimate": "tool definitions' JSON bytes / 4"},
        "tools": tools,
    })))
}

fn tool_definition(t: &crate::policy::EffectiveTool) -> (&str, Option<&str>, &Value) {
    (&t.name, t.tool.description.as_deref(), &t.tool.input_schema)
}

/// What each server of the set lists: resource URIs and prompt names, on the server.
pub type ListedItems = std::collections::BTreeMap<String, (Vec<String>, Vec<String>)>;

/// The resources and prompts each server lists, decided by the resource and prompt policy:
/// `{"exposed": [{server, kind, item, id}], "excluded": [{server, kind, item, reason, detail}]}`.
pub fn explain_items(set: &EffectiveSet, listed: &ListedItems) -> Value {
    use crate::policy::items::{self, ItemKind};
    let mut exposed = Vec::new();
    let mut excluded = Vec::new();
    for server in &set.servers {
        let Some((resources, prompts)) = listed.get(&*server.id) else { continue };
        let all =
            resources.iter().map(|r| (ItemKind::Resource, r)).chain(prompts.iter().map(|p| (ItemKind::Prompt, p)));
        for (kind, item) in all {
            match set.item_decision(&server.id, kind, item) {
                Ok(()) => {
                    let id = match kind {
                        ItemKind::Resource => items::resource_id(&server.id, item),
                        ItemKind::Prompt => items::prompt_name(&server.server_part, item),
                    };
                    exposed.push(json!({"server": &*server.id, "kind": kind, "item": item, "id": id}));
                }
                Err(d) => excluded.push(json!({
                    "server": &*server.id, "kind": kind, "item": item, "reason": d.reason, "detail": d.detail,
                })),
            }
        }
    }
    json!({"exposed": exposed, "excluded": excluded})
}

/// `explain_items`' JSON as lines for people.
pub(crate) fn items_table(explained: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let rows = |key: &str| explained[key].as_array().cloned().unwrap_or_default();
    let (exposed, excluded) = (rows("exposed"), rows("excluded"));
    if exposed.is_empty() && excluded.is_empty() {
        return out;
    }
    let _ = writeln!(out, "RESOURCES AND PROMPTS");
    for row in &exposed {
        let _ = writeln!(
            out,
            "  {:<8} {}",
            row["kind"].as_str().unwrap_or_default(),
            row["id"].as_str().unwrap_or_default()
        );
    }
    for row in &excluded {
        let what =
            format!("{}/{}", row["server"].as_str().unwrap_or_default(), row["item"].as_str().unwrap_or_default());
        let detail = row["detail"].as_str().map(|d| format!(" ({d})")).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<8} {what:<40} {}{detail}",
            row["kind"].as_str().unwrap_or_default(),
            row["reason"].as_str().unwrap_or_default()
        );
    }
    out
}

/// `explain_selection`'s JSON as lines for people: the offered tools, then the best few left out.
pub(crate) fn selection_table(selection: &Value) -> String {
    use std::fmt::Write as _;
    /// Tools left out that the table shows (the JSON has them all).
    const LEFT_OUT_SHOWN: usize = 10;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "TOOL SELECTION (relevance, maxTools {}): {} of {} offered{}; about {} prompt tokens of tools, {} with all",
        selection["maxTools"],
        selection["offered"],
        selection["of"],
        selection["findTools"].as_str().map(|f| format!(", plus {f}")).unwrap_or_default(),
        selection["promptTokens"]["offered"],
        selection["promptTokens"]["all"],
    );
    let tools = selection["tools"].as_array().map(Vec::as_slice).unwrap_or_default();
    for tool in tools.iter().filter(|t| t["offered"] == true) {
        let why = tool["why"].as_str().unwrap_or_default();
        let (name, score) = (tool["name"].as_str().unwrap_or_default(), tool["score"].as_f64().unwrap_or_default());
        let _ = writeln!(out, "  {name:<48} {score:>8.2} {why}");
    }
    let left_out: Vec<&Value> = tools.iter().filter(|t| t["offered"] == false).collect();
    for tool in left_out.iter().take(LEFT_OUT_SHOWN) {
        let (name, score) = (tool["name"].as_str().unwrap_or_default(), tool["score"].as_f64().unwrap_or_default());
        let _ = writeln!(out, "  {name:<48} {score:>8.2} not offered");
    }
    if left_out.len() > LEFT_OUT_SHOWN {
        let _ =
            writeln!(out, "  ... {} more not offered (--output json lists them all)", left_out.len() - LEFT_OUT_SHOWN);
    }
    out
}

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
                "allowedResources": spec.allowed_resources,
                "deniedResources": spec.denied_resources,
                "allowedPrompts": spec.allowed_prompts,
                "deniedPrompts": spec.denied_prompts,
                "auth": server_auth(&spec),
                "tools": s.tools.as_ref().map(|tools| tools.iter().map(|t| {
                    let mut tool = serde_json::json!({"name": &*t.name, "tool": &*t.tool.name});
                    // Served under `pinning.mode: warn` although it does not match its pin.
                    if let Some(reason) = &t.pin_warning {
                        tool["pinWarning"] = reason.to_string().into();
                    }
                    if needs_approval(t) {
                        tool["approval"] = serde_json::json!({
                            "mode": t.approval,
                            "approvers": crate::approval::chain(set.approval()),
                            "timeoutSeconds": set.approval().and_then(|a| a.timeout_seconds).unwrap_or(crate::api::approval::DEFAULT_APPROVAL_TIMEOUT_SECONDS),
                        });
                    }
                    tool
                }).collect::<Vec<_>>()),
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

/// Whether calls of `tool` need approval (its McpServer's `approvalPolicy`, and its annotations).
fn needs_approval(tool: &super::EffectiveTool) -> bool {
    let annotations = tool.tool.metadata.as_ref().and_then(|m| m.get("annotations"));
    super::approval::needs_approval(tool.approval, annotations)
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
            Some(tools) => tools
                .iter()
                .map(|t| match &t.pin_warning {
                    Some(reason) => format!("{} ({reason}: served, pinning.mode warn)", t.name),
                    None => t.name.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
            None => format!("{} / {}", join_or_dash(&spec.allowed_tools), join_or_dash(&spec.denied_tools)),
        };
        let b = s.budgets;
        let _ = writeln!(
            out,
            "{:<24} {:<20} {:>10} {:>12} {:>6}  {tools}",
            s.id, s.server_part, b.tool_timeout_ms, b.max_tool_output_bytes, b.max_concurrency
        );
    }
    let authenticated: Vec<(&str, String)> = set
        .servers
        .iter()
        .filter_map(|s| snapshot.server(&s.id).and_then(|v| server_auth(&v.object.spec)).map(|a| (&*s.id, a)))
        .collect();
    if !authenticated.is_empty() {
        let _ = writeln!(out, "AUTH");
        for (server, mode) in authenticated {
            let _ = writeln!(out, "  {server:<40} {mode}");
        }
    }
    let approved: Vec<&str> = set
        .servers
        .iter()
        .flat_map(|s| s.tools.iter().flat_map(|t| t.iter()))
        .filter(|t| needs_approval(t))
        .map(|t| &*t.name)
        .collect();
    if !approved.is_empty() {
        let chain = crate::approval::chain(set.approval());
        let chain = if chain.is_empty() {
            "none: these calls end with mcp_approval_required".to_string()
        } else {
            chain.join(", then ")
        };
        let _ = writeln!(out, "APPROVAL");
        let _ = writeln!(out, "  needed by  {}", approved.join(","));
        let _ = writeln!(out, "  approvers  {chain}");
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

/// How the agent authenticates to a Streamable HTTP server (`http.auth`'s mode, or `headers`
/// when it sends configured headers only); `None` for stdio servers and servers with neither.
fn server_auth(spec: &crate::api::McpServerSpec) -> Option<String> {
    let http = spec.http.as_ref()?;
    match &http.auth {
        Some(auth) => Some(auth.mode().to_string()),
        None if !http.headers.is_empty() => Some("headers".to_string()),
        None => None,
    }
}

fn join_or_dash(items: &[String]) -> String {
    if items.is_empty() { "-".into() } else { items.join(",") }
}

// === A pod's live answer (cluster mode) ===

/// How a pod's registry revision compares with the cluster's, as JSON:
/// `{"pod": X, "cluster": Y, "inSync": bool}`.
pub fn revisions_json(pod: &str, cluster: &str) -> Value {
    json!({"pod": pod, "cluster": cluster, "inSync": pod == cluster})
}

/// A pod agent's `/debug/effective` answer (`explain_json`'s shape, plus the agent's
/// `registryProblems` and `listCut`) as lines for people, headed by how its revision compares
/// with `cluster_revision` (what the API server holds now).
pub(crate) fn live_table(live: &Value, cluster_revision: &str) -> String {
    use std::fmt::Write as _;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out = String::new();
    let pod_revision = text(&live["revision"]);
    let comparison = if pod_revision == cluster_revision {
        "in sync".to_string()
    } else {
        "out of sync: the agent has not seen the latest change yet (it follows within a second while its \
         watch works), or its watch is failing (registry problems below), or it cannot read an object \
         this command can (another spearlet version)"
            .to_string()
    };
    let _ = writeln!(out, "pod on registry revision {pod_revision}, cluster at {cluster_revision}: {comparison}");
    for problem in live["registryProblems"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "agent registry problem: {}", text(problem));
    }
    if live["toolsListed"] != true {
        let _ = writeln!(out, "note: the agent has no tool lists yet (its servers are still starting)");
    }
    let _ = writeln!(out, "{:<24} {:<20} TOOLS", "SERVER", "NAME PART");
    for server in live["servers"].as_array().into_iter().flatten() {
        let tools = match server["tools"].as_array() {
            Some(tools) => tools.iter().map(|t| text(&t["name"])).collect::<Vec<_>>().join(","),
            None => "(not listed)".to_string(),
        };
        let cut = server["listCut"].as_str().map(|c| format!(" (list cut: {c})")).unwrap_or_default();
        let _ = writeln!(out, "{:<24} {:<20} {tools}{cut}", text(&server["id"]), text(&server["namePart"]));
    }
    let excluded = live["excluded"].as_array().map(Vec::as_slice).unwrap_or_default();
    if !excluded.is_empty() {
        let _ = writeln!(out, "EXCLUDED");
        for d in excluded {
            let what = match d["tool"].as_str() {
                Some(tool) => format!("{}/{tool}", text(&d["server"])),
                None => text(&d["server"]),
            };
            let detail = d["detail"].as_str().map(|x| format!(" ({x})")).unwrap_or_default();
            let _ = writeln!(out, "  {what:<40} {}{detail}", text(&d["reason"]));
        }
    }
    out
}

#[cfg(test)]
mod live_tests {
    use serde_json::json;

    use super::{live_table, revisions_json};

    fn live(revision: &str) -> serde_json::Value {
        json!({
            "profile": "dev", "revision": revision, "toolsListed": true,
            "registryProblems": ["namespaces/ns/mcpservers: watch: the agent may not list and watch mcpservers (grant ...)"],
            "servers": [{"id": "fs", "namePart": "fs", "tools": [{"name": "mcp__fs__read_file", "tool": "read_file"}],
                         "listCut": "tools: 1000 of 1200"}],
            "excluded": [
                {"server": "fs", "tool": "write_file", "reason": "not_allowed_by:server"},
                {"server": "git", "reason": "not_in_profile"},
            ],
        })
    }

    #[test]
    fn the_live_table_compares_revisions_and_shows_tool_level_decisions() {
        let table = live_table(&live("aaaa"), "aaaa");
        assert!(table.starts_with("pod on registry revision aaaa, cluster at aaaa: in sync\n"), "{table}");
        assert!(table.contains("agent registry problem: namespaces/ns/mcpservers: watch:"), "{table}");
        assert!(table.contains("mcp__fs__read_file (list cut: tools: 1000 of 1200)"), "{table}");
        assert!(table.contains("  fs/write_file") && table.contains("not_allowed_by:server"), "{table}");
        assert!(table.contains("  git ") && table.contains("not_in_profile"), "{table}");
        let behind = live_table(&live("aaaa"), "bbbb");
        assert!(behind.starts_with("pod on registry revision aaaa, cluster at bbbb: out of sync"), "{behind}");
    }

    #[test]
    fn revisions_say_whether_the_pod_is_in_sync() {
        assert_eq!(revisions_json("a", "a"), json!({"pod": "a", "cluster": "a", "inSync": true}));
        assert_eq!(revisions_json("a", "b")["inSync"], false);
    }
}
