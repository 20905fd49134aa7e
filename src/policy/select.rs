//! Which of the effective set's tools a chat round offers the model (`chat.toolSelection`), pure.
//!
//! ```text
//! ProfileCatalog ──once, lazily──▶ CatalogRank (ToolIndex over every catalog tool)
//! EffectiveSet + SelectionPolicy + conversation + pinned names ──select──▶ Selection
//!     pinned (called, found, forced, alwaysInclude) ∪ top K by score, among the set's tools only
//! ```
//!
//! Decisions and why:
//! - **Never wider.** Candidates are the effective set's tools and nothing else: the index covers
//!   the catalog (the profile's tools before request narrowing) so it is built once per catalog,
//!   and the set decides which of its ids may be offered. A pinned name that is not in the set is
//!   ignored. `alwaysInclude` selects among allowed tools; it allows nothing.
//! - **Stable order.** The offered tools keep the set's order (server, then list order), not the
//!   score order, so a round that offers the same tools sends the same prefix and upstream
//!   prompt caches keep working.
//! - **A way out.** When tools are left out, the built-in [`FIND_TOOLS`] is offered: it ranks the
//!   whole set against the model's own words and pins what it finds for the next rounds. It is not
//!   offered when every tool already is, or when a caller's or an MCP tool has its name.
//! - **Scores are reported** (the `spear` extension field, `explain --request`) so "why did the
//!   model not see tool X" has an answer.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use super::decision::{Layer, LayerPatterns, PolicyError};
use super::effective::EffectiveSet;
use super::rank::{Query, Role, ToolIndex, Turn};
use crate::api::{ToolSelection, ToolSelectionMode};

/// The built-in tool with which the model searches the tools it was not offered.
pub const FIND_TOOLS: &str = "mcp__spear__find_tools";
/// Tools one `find_tools` call returns at most (and by default, [`FIND_TOOLS_DEFAULT_LIMIT`]).
pub const FIND_TOOLS_MAX_LIMIT: usize = 20;
pub const FIND_TOOLS_DEFAULT_LIMIT: usize = 5;
/// Bytes of a `find_tools` query read; the rest is ignored (the text is the model's).
const FIND_TOOLS_MAX_QUERY_BYTES: usize = 1024;

/// A request's selection settings: the profile's `chat.toolSelection` tightened by the request's
/// `mcp.max_tools`. `None` from [`SelectionPolicy::new`] means every tool, every round.
#[derive(Debug)]
pub struct SelectionPolicy {
    /// Tools ranked in per round.
    pub max_tools: usize,
    always: LayerPatterns,
}

impl SelectionPolicy {
    /// The policy in force: the profile's `relevance` mode, or a request's `max_tools` (which
    /// lowers the profile's `maxTools`, and under mode `all` asks for relevance with that many).
    pub fn new(profile: Option<&ToolSelection>, request_max_tools: Option<u32>) -> Result<Option<Self>, PolicyError> {
        let relevance = profile.is_some_and(|s| s.mode == ToolSelectionMode::Relevance);
        let profile_max = profile.filter(|_| relevance).map(ToolSelection::max_tools);
        let max_tools = match (profile_max, request_max_tools) {
            (None, None) => return Ok(None),
            (Some(p), Some(r)) => p.min(r),
            (Some(k), None) | (None, Some(k)) => k,
        };
        let patterns = profile.map(|s| s.always_include.as_slice()).unwrap_or_default();
        let always = LayerPatterns::new(patterns, Layer::Profile)?;
        Ok(Some(SelectionPolicy { max_tools: max_tools.max(1) as usize, always }))
    }
}

/// Why a tool is offered this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Among the `maxTools` best scores.
    Ranked,
    /// Called earlier in the conversation.
    Called,
    /// Found by a `find_tools` call.
    Found,
    /// Named by the request's forced `tool_choice`.
    Forced,
    /// Matched by `alwaysInclude`.
    AlwaysInclude,
}

/// A tool offered this round.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SelectedTool {
    /// The model-facing name.
    pub name: Arc<str>,
    /// Its relevance to the conversation (0: no word in common); shown to two decimals.
    #[serde(serialize_with = "two_decimals")]
    pub score: f32,
    pub why: Why,
}

fn two_decimals<S: serde::Serializer>(score: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(rounded(*score))
}

/// A score to two decimals, as people read it (f32's digits past that are noise).
pub fn rounded(score: f32) -> f64 {
    (f64::from(score) * 100.0).round() / 100.0
}

/// The tools one round offers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Selection {
    /// Offered, in the effective set's order.
    pub tools: Vec<SelectedTool>,
    /// Tools in the effective set.
    pub of: usize,
    /// Whether [`FIND_TOOLS`] is offered too (tools were left out, and the name is free).
    pub find_tools: bool,
}

/// Names pinned into every round, with why (the first reason given wins).
#[derive(Clone, Debug, Default)]
pub struct Pinned {
    names: HashMap<String, Why>,
}

impl Pinned {
    /// Pins `name` for `why`, unless it is pinned already.
    pub fn pin(&mut self, name: &str, why: Why) {
        self.names.entry(name.to_string()).or_insert(why);
    }

    fn why(&self, name: &str) -> Option<Why> {
        self.names.get(name).copied()
    }
}

/// The text of a chat message's `content` (a string, or the text parts of an array).
pub fn message_text(message: &serde_json::Value) -> std::borrow::Cow<'_, str> {
    match message.get("content") {
        Some(serde_json::Value::String(text)) => text.as_str().into(),
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(serde_json::Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")
            .into(),
        _ => "".into(),
    }
}

/// The conversation as ranking turns: `user` messages are the user's, the rest count less.
pub fn turns(messages: &[serde_json::Value]) -> Vec<(Role, std::borrow::Cow<'_, str>)> {
    messages
        .iter()
        .map(|m| {
            let role = if m.get("role").and_then(serde_json::Value::as_str) == Some("user") {
                Role::User
            } else {
                Role::Other
            };
            (role, message_text(m))
        })
        .collect()
}

/// Function names the assistant messages of the conversation called.
pub fn called_names(messages: &[serde_json::Value]) -> impl Iterator<Item = &str> {
    messages
        .iter()
        .filter(|m| m.get("role").and_then(serde_json::Value::as_str) == Some("assistant"))
        .filter_map(|m| m.get("tool_calls").and_then(serde_json::Value::as_array))
        .flatten()
        .filter_map(|c| c.pointer("/function/name").and_then(serde_json::Value::as_str))
}

impl EffectiveSet {
    /// Every tool's score for `query`, by (server id, tool name) through the catalog's index.
    fn scored(&self, query_of: impl FnOnce(&ToolIndex) -> Query) -> Vec<(Arc<str>, f32, &str, &str)> {
        let rank = self.catalog().rank();
        let scores = rank.index.scores(&query_of(&rank.index));
        self.tools()
            .map(|(server, tool)| {
                let score =
                    rank.id(&server.id, &tool.tool.name).and_then(|id| scores.get(id as usize)).copied().unwrap_or(0.0);
                (tool.name.clone(), score, &*server.id, &*tool.tool.name)
            })
            .collect()
    }

    /// The tools a round offers: every pinned or `alwaysInclude` tool of the set, and the
    /// `policy.max_tools` best-scored others for `conversation` (oldest message first).
    pub fn select(&self, policy: &SelectionPolicy, conversation: &[Turn<'_>], pinned: &Pinned) -> Selection {
        let scored = self.scored(|index| index.query(conversation));
        let of = scored.len();
        let mut buffer = String::new();
        let mut why: Vec<Option<Why>> = scored
            .iter()
            .map(|(name, _, server, tool)| {
                pinned
                    .why(name)
                    .or_else(|| policy.always.is_match(server, tool, &mut buffer).then_some(Why::AlwaysInclude))
            })
            .collect();
        let mut ranked: Vec<usize> = (0..of).filter(|&i| why[i].is_none()).collect();
        // Stable: equal scores keep the set's order.
        ranked.sort_by(|&a, &b| scored[b].1.total_cmp(&scored[a].1));
        for &i in ranked.iter().take(policy.max_tools) {
            why[i] = Some(Why::Ranked);
        }
        let tools: Vec<SelectedTool> = scored
            .into_iter()
            .zip(why)
            .filter_map(|((name, score, _, _), why)| Some(SelectedTool { name, score, why: why? }))
            .collect();
        let find_tools = tools.len() < of && self.route(FIND_TOOLS).is_none();
        Selection { tools, of, find_tools }
    }

    /// Every tool of the set with its score for `conversation`, best first (ties in set order):
    /// what `explain` shows of the tools a round did not offer.
    pub fn ranked(&self, conversation: &[Turn<'_>]) -> Vec<(Arc<str>, f32)> {
        let mut scored: Vec<(Arc<str>, f32)> =
            self.scored(|index| index.query(conversation)).into_iter().map(|(name, score, ..)| (name, score)).collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        scored
    }

    /// Runs a `find_tools` call: the set's tools best matching `query`, at most `limit`, only
    /// those sharing a word with it.
    pub fn find_tools(&self, query: &str, limit: usize) -> Vec<SelectedTool> {
        let query = super::rank::truncate(query, FIND_TOOLS_MAX_QUERY_BYTES);
        let turn = [Turn { role: Role::User, text: query }];
        let mut scored = self.scored(|index| index.query(&turn));
        scored.retain(|s| s.1 > 0.0);
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        scored
            .into_iter()
            .take(limit.clamp(1, FIND_TOOLS_MAX_LIMIT))
            .map(|(name, score, _, _)| SelectedTool { name, score, why: Why::Found })
            .collect()
    }
}

/// Bytes of JSON per prompt token in [`estimated_tokens`]: OpenAI's rule of thumb for English
/// text (about 4 characters a token); tool schemas tokenize a little denser, so the estimate errs
/// low for them.
pub const BYTES_PER_TOKEN: usize = 4;

/// Prompt tokens the tool definitions cost, estimated as their JSON's bytes (as an OpenAI request
/// carries them: `{"type": "function", "function": {name, description, parameters}}`) divided
/// by [`BYTES_PER_TOKEN`].
pub fn estimated_tokens<'a>(
    tools: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a serde_json::Value)>,
) -> usize {
    let bytes: usize = tools
        .into_iter()
        .map(|(name, description, parameters)| {
            let definition = serde_json::json!({
                "type": "function",
                "function": {"name": name, "description": description, "parameters": parameters},
            });
            definition.to_string().len()
        })
        .sum();
    bytes.div_ceil(BYTES_PER_TOKEN)
}

/// The JSON Schema of [`FIND_TOOLS`]'s arguments and its description, as offered to the model.
pub fn find_tools_definition() -> (String, serde_json::Value) {
    let description = format!(
        "Search the tools available to you that are not listed yet. Give a few words about what you need; the \
         best matches (up to {FIND_TOOLS_MAX_LIMIT}) are returned with their descriptions and can be called from \
         your next step."
    );
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What the tool should do, in a few words."},
            "limit": {
                "type": "integer", "minimum": 1, "maximum": FIND_TOOLS_MAX_LIMIT,
                "description": format!("How many tools to return (default {FIND_TOOLS_DEFAULT_LIMIT}).")
            }
        },
        "required": ["query"],
        "additionalProperties": false
    });
    (description, schema)
}
