//! Relevance ranking of tools for a conversation: BM25F over each tool's words, pure.
//!
//! A profile over busy servers exposes hundreds of tools; offering all of them to the model costs
//! prompt tokens every round and makes it choose worse. [`ToolIndex`] is built once per catalog
//! (the [`super::effective::ProfileCatalog`] holds it as a [`CatalogRank`]) and ranks every tool
//! against a [`Query`] in microseconds, offline, with no model. Decisions and why:
//!
//! - **Fields and weights.** A tool's model-facing name split into words, its server's name and
//!   display name, its description, and its parameters' names and descriptions are separate
//!   fields, each with a weight ([`RankParams`]); a term's frequency is the weighted sum over
//!   fields of its count normalized by that field's length against the field's average (BM25F
//!   proper, computed once at build), so a word in the name counts more than the same word deep
//!   in a parameter's description, and a long description does not drown a short name. The
//!   weights, `k1` and `b` were chosen on the tuning split of the retrieval evaluation
//!   (`benches/tool_ranking.rs`), by its sweep, never on its held-out split.
//! - **Words.** Split at anything not alphanumeric and at camelCase and letter/digit boundaries
//!   (`getCurrentWeather`, `list_PRs2` → `get current weather`, `list prs 2`), lowercased,
//!   stemmed with the Snowball English stemmer so `files`/`file` and `searching`/`search` meet.
//!   A short stop list removes words every request carries ("please", "the").
//! - **The query.** The latest user turn counts most; earlier turns count less the older they
//!   are ([`Query::from_turns`]). The text read is bounded ([`MAX_TURN_BYTES`], [`MAX_TURNS`]),
//!   so a huge conversation costs no more than a long one: the text is the caller's, untrusted.
//! - **Ties** keep catalog order, so the same conversation always gets the same tools.

use std::collections::HashMap;
use std::sync::Arc;

use rust_stemmers::{Algorithm, Stemmer};

use super::decision::EffectiveTool;

/// The ranker's tunable constants. [`RankParams::default`] holds the values chosen on the tuning
/// split of the retrieval evaluation (see the module header); the evaluation's sweep
/// (`TOOL_RANKING_SWEEP=1 cargo bench --bench tool_ranking`) is how they were found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankParams {
    /// Weights of a tool's fields, in [`Field`] order: name, server, description, parameters.
    pub field_weights: [f32; 4],
    /// BM25 term-frequency saturation.
    pub k1: f32,
    /// BM25 length normalization (0 none, 1 full).
    pub b: f32,
}

impl Default for RankParams {
    fn default() -> Self {
        RankParams { field_weights: [3.0, 1.0, 1.0, 0.25], k1: 0.9, b: 0.9 }
    }
}
/// Bytes of one turn read into a query; the rest of a longer turn is ignored.
pub const MAX_TURN_BYTES: usize = 8 * 1024;
/// Turns read into a query, newest first.
pub const MAX_TURNS: usize = 8;
/// Weight of a turn one step older than the next: the latest user turn 1, the one before 0.5, ...
const TURN_DECAY: f32 = 0.5;
/// Weight of words from assistant and tool messages, relative to a user turn of the same age.
const OTHER_ROLE_WEIGHT: f32 = 0.5;

/// Words that carry no tool's meaning but appear in most requests.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "could", "do", "for", "from", "i", "in", "is", "it", "me",
    "my", "of", "on", "or", "please", "that", "the", "this", "to", "we", "what", "which", "with", "would", "you",
    "your",
];

/// The fields of a tool that are indexed.
#[derive(Clone, Copy, Debug)]
pub enum Field {
    /// The model-facing name, split into words.
    Name = 0,
    /// The server's name and display name.
    Server = 1,
    /// The tool's description.
    Description = 2,
    /// Parameter names and descriptions.
    Parameters = 3,
}

/// One tool's text, as the index reads it.
#[derive(Clone, Debug, Default)]
pub struct ToolText<'a> {
    /// The model-facing name (`mcp__github__list_issues`).
    pub name: &'a str,
    /// The server's name and display name, space-separated.
    pub server: &'a str,
    /// The tool's description.
    pub description: &'a str,
    /// The `inputSchema`, whose property names and descriptions are read.
    pub input_schema: Option<&'a serde_json::Value>,
}

/// Splits `text` into lowercased, stemmed words without stop words, calling `each` per word.
pub fn words(stemmer: &Stemmer, text: &str, mut each: impl FnMut(String)) {
    let mut word = String::new();
    let mut previous: Option<char> = None;
    let mut flush = |word: &mut String| {
        if !word.is_empty() {
            let lower = word.to_lowercase();
            if !STOP_WORDS.contains(&lower.as_str()) {
                each(stemmer.stem(&lower).into_owned());
            }
            word.clear();
        }
    };
    for c in text.chars() {
        if !c.is_alphanumeric() {
            flush(&mut word);
            previous = None;
            continue;
        }
        if let Some(p) = previous {
            let camel = p.is_lowercase() && c.is_uppercase();
            let digit_edge = p.is_ascii_digit() != c.is_ascii_digit();
            if camel || digit_edge {
                flush(&mut word);
            }
        }
        word.push(c);
        previous = Some(c);
    }
    flush(&mut word);
}

/// Appends the property names and descriptions of a JSON Schema (nested objects and array items
/// too, to a bounded depth) to `out`.
fn schema_text(schema: &serde_json::Value, depth: usize, out: &mut String) {
    const MAX_DEPTH: usize = 4;
    if depth > MAX_DEPTH {
        return;
    }
    if let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) {
        for (name, property) in properties {
            out.push(' ');
            out.push_str(name);
            if let Some(description) = property.get("description").and_then(|d| d.as_str()) {
                out.push(' ');
                out.push_str(description);
            }
            schema_text(property, depth + 1, out);
        }
    }
    if let Some(items) = schema.get("items") {
        schema_text(items, depth + 1, out);
    }
}

/// A BM25F index over a catalog's tools, built once per catalog.
pub struct ToolIndex {
    stemmer: Stemmer,
    params: RankParams,
    /// Term → (tool, BM25F pseudo-frequency: field-weighted, length-normalized) for every tool
    /// holding it.
    postings: HashMap<String, Vec<(u32, f32)>>,
    /// Tools indexed.
    tools: usize,
}

impl std::fmt::Debug for ToolIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolIndex").field("tools", &self.tools).field("terms", &self.postings.len()).finish()
    }
}

impl ToolIndex {
    /// Indexes `tools` with the chosen [`RankParams`]; a tool's position is its id in every
    /// result.
    pub fn build<'a>(tools: impl IntoIterator<Item = ToolText<'a>>) -> Self {
        Self::build_with(RankParams::default(), tools)
    }

    /// Indexes `tools` with `params` (the evaluation's sweep tries others).
    pub fn build_with<'a>(params: RankParams, tools: impl IntoIterator<Item = ToolText<'a>>) -> Self {
        const FIELDS: usize = 4;
        let stemmer = Stemmer::create(Algorithm::English);
        // Pass 1: each tool's word counts and length per field.
        let mut counted: Vec<[(HashMap<String, f32>, f32); FIELDS]> = Vec::new();
        let mut parameters = String::new();
        for tool in tools {
            parameters.clear();
            if let Some(schema) = tool.input_schema {
                schema_text(schema, 0, &mut parameters);
            }
            let texts = [tool.name, tool.server, tool.description, parameters.as_str()];
            let mut fields: [(HashMap<String, f32>, f32); FIELDS] = Default::default();
            for (field, text) in fields.iter_mut().zip(texts) {
                words(&stemmer, text, |word| {
                    *field.0.entry(word).or_default() += 1.0;
                    field.1 += 1.0;
                });
            }
            counted.push(fields);
        }
        let n = counted.len().max(1) as f32;
        let mut average = [0.0f32; FIELDS];
        for fields in &counted {
            for (sum, field) in average.iter_mut().zip(fields) {
                *sum += field.1 / n;
            }
        }
        // Pass 2 (BM25F): a term's frequency is the weighted sum over fields of its count
        // normalized by that field's length against the field's average, so a long description
        // does not drown a short name.
        let mut postings: HashMap<String, Vec<(u32, f32)>> = HashMap::new();
        let tools = counted.len();
        for (id, fields) in counted.into_iter().enumerate() {
            let mut frequencies: HashMap<String, f32> = HashMap::new();
            for (f, (counts, length)) in fields.into_iter().enumerate() {
                let norm = 1.0 - params.b + params.b * length / average[f].max(1.0);
                let weight = params.field_weights[f] / norm.max(f32::EPSILON);
                for (term, count) in counts {
                    *frequencies.entry(term).or_default() += weight * count;
                }
            }
            for (term, frequency) in frequencies {
                postings.entry(term).or_default().push((id as u32, frequency));
            }
        }
        ToolIndex { stemmer, params, postings, tools }
    }

    /// Tools indexed.
    pub fn len(&self) -> usize {
        self.tools
    }

    /// Whether no tool is indexed.
    pub fn is_empty(&self) -> bool {
        self.tools == 0
    }

    /// The query's weighted, stemmed words.
    pub fn query(&self, turns: &[Turn<'_>]) -> Query {
        Query::from_turns(&self.stemmer, turns)
    }

    /// Each tool's score for `query` (0 for a tool sharing no word with it), by tool id.
    pub fn scores(&self, query: &Query) -> Vec<f32> {
        let mut scores = vec![0.0f32; self.tools];
        let n = self.tools as f32;
        let k1 = self.params.k1;
        for (term, query_weight) in &query.terms {
            let Some(postings) = self.postings.get(term) else { continue };
            let df = postings.len() as f32;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for &(id, tf) in postings {
                scores[id as usize] += query_weight * idf * tf * (k1 + 1.0) / (tf + k1);
            }
        }
        scores
    }

    /// The ids of the `k` best-scored tools among those `eligible` says yes to, best first,
    /// with their scores; ties keep catalog order. Tools that share no word with the query
    /// (score 0) are included only to fill `k`.
    pub fn top(&self, query: &Query, k: usize, eligible: impl Fn(u32) -> bool) -> Vec<(u32, f32)> {
        let scores = self.scores(query);
        let mut ranked: Vec<(u32, f32)> =
            scores.into_iter().enumerate().map(|(id, s)| (id as u32, s)).filter(|(id, _)| eligible(*id)).collect();
        // A stable sort keeps catalog order among equal scores.
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        ranked.truncate(k);
        ranked
    }
}

/// Who wrote a turn of the conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The user.
    User,
    /// The assistant, a tool's answer, or the system prompt.
    Other,
}

/// One turn of a conversation, oldest first in a slice.
#[derive(Clone, Copy, Debug)]
pub struct Turn<'a> {
    /// Who wrote it.
    pub role: Role,
    /// Its text.
    pub text: &'a str,
}

/// A ranking query: stemmed words with weights.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Query {
    terms: Vec<(String, f32)>,
}

impl Query {
    /// Builds the query of a conversation (oldest turn first): the latest user turn weighs 1,
    /// every turn before it half the one after, assistant and tool turns half a user turn. At most
    /// [`MAX_TURNS`] turns of at most [`MAX_TURN_BYTES`] each are read.
    pub fn from_turns(stemmer: &Stemmer, turns: &[Turn<'_>]) -> Self {
        let mut weights: HashMap<String, f32> = HashMap::new();
        // Turns after the latest user turn (tool answers in a running loop) count as recent.
        let latest_user = turns.iter().rposition(|t| t.role == Role::User);
        let mut age = 0i32;
        for (index, turn) in turns.iter().enumerate().rev().take(MAX_TURNS) {
            if let Some(latest) = latest_user
                && index < latest
            {
                age += 1;
            }
            let role_weight = if turn.role == Role::User { 1.0 } else { OTHER_ROLE_WEIGHT };
            let weight = role_weight * TURN_DECAY.powi(age);
            words(stemmer, truncate(turn.text, MAX_TURN_BYTES), |word| {
                let entry = weights.entry(word).or_default();
                // A word's weight is its best turn's, not the sum: repeating a word does not
                // outweigh the rest of the request.
                *entry = entry.max(weight);
            });
        }
        let mut terms: Vec<(String, f32)> = weights.into_iter().collect();
        terms.sort_by(|a, b| a.0.cmp(&b.0));
        Query { terms }
    }

    /// Whether the query has no word (no tool scores above 0).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

/// The index over a catalog's tools, with each tool's id by (server id, tool name on the server).
pub(crate) struct CatalogRank {
    pub(super) index: ToolIndex,
    ids: HashMap<Arc<str>, HashMap<Arc<str>, u32>>,
}

impl std::fmt::Debug for CatalogRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.index.fmt(f)
    }
}

impl CatalogRank {
    /// Indexes every tool the catalog exposes. `servers` yields (server id, server text, tools),
    /// where the server text is its id, name part and `displayName`.
    pub(crate) fn build<'a>(servers: impl Iterator<Item = (&'a Arc<str>, String, &'a [EffectiveTool])>) -> Self {
        let mut ids: HashMap<Arc<str>, HashMap<Arc<str>, u32>> = HashMap::new();
        let mut texts: Vec<(Arc<str>, String)> = Vec::new();
        let mut entries: Vec<(usize, &EffectiveTool)> = Vec::new();
        for (server, text, tools) in servers {
            let by_name = ids.entry(server.clone()).or_default();
            texts.push((server.clone(), text));
            for tool in tools {
                let id = u32::try_from(entries.len()).unwrap_or(u32::MAX);
                by_name.insert(tool.tool.name.clone(), id);
                entries.push((texts.len() - 1, tool));
            }
        }
        let index = ToolIndex::build(entries.iter().map(|(server, tool)| ToolText {
            name: &tool.name,
            server: &texts[*server].1,
            description: tool.tool.description.as_deref().unwrap_or_default(),
            input_schema: Some(&tool.tool.input_schema),
        }));
        CatalogRank { index, ids }
    }

    pub(super) fn id(&self, server: &str, tool: &str) -> Option<u32> {
        self.ids.get(server)?.get(tool).copied()
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> &str {
    &text[..text.floor_char_boundary(max)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn truncate_cuts_at_the_last_character_boundary_within_max() {
        assert_eq!(truncate("héllo", 1), "h");
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("héllo", 6), "héllo");
        assert_eq!(truncate("héllo", 99), "héllo");
        assert_eq!(truncate("", 0), "");
    }

    fn tool<'a>(name: &'a str, description: &'a str) -> ToolText<'a> {
        ToolText { name, server: "", description, input_schema: None }
    }

    fn collect(text: &str) -> Vec<String> {
        let stemmer = Stemmer::create(Algorithm::English);
        let mut out = Vec::new();
        words(&stemmer, text, |w| out.push(w));
        out
    }

    #[test]
    fn names_split_into_words_at_case_digit_and_punctuation_edges() {
        assert_eq!(collect("mcp__github__listPullRequests2"), ["mcp", "github", "list", "pull", "request", "2"]);
        assert_eq!(collect("get_current_weather"), ["get", "current", "weather"]);
        // Stop words go, stems meet.
        assert_eq!(collect("Please search the files"), ["search", "file"]);
        assert_eq!(collect("searching FILES"), ["search", "file"]);
    }

    #[test]
    fn the_tool_whose_words_the_request_uses_ranks_first() {
        let index = ToolIndex::build([
            tool("mcp__fs__read_file", "Read the complete contents of a file."),
            tool("mcp__weather__get_forecast", "Weather forecast for a city."),
            tool("mcp__github__create_issue", "Open a new issue in a repository."),
        ]);
        let query = index.query(&[Turn { role: Role::User, text: "What's the weather forecast in Paris?" }]);
        let top = index.top(&query, 1, |_| true);
        assert_eq!(top[0].0, 1);
        let query = index.query(&[Turn { role: Role::User, text: "open an issue about the crash" }]);
        assert_eq!(index.top(&query, 1, |_| true)[0].0, 2);
    }

    #[test]
    fn a_word_in_the_name_outweighs_the_same_word_in_a_parameter() {
        let index = ToolIndex::build([
            ToolText {
                name: "mcp__db__query",
                server: "",
                description: "Run SQL.",
                input_schema: Some(&json!({"properties": {"table": {"description": "the table to search"}}})),
            },
            tool("mcp__docs__search", "Full-text lookup."),
        ]);
        let query = index.query(&[Turn { role: Role::User, text: "search" }]);
        let scores = index.scores(&query);
        assert!(scores[1] > scores[0], "{scores:?}");
        assert!(scores[0] > 0.0, "parameter descriptions are indexed: {scores:?}");
    }

    #[test]
    fn the_latest_user_turn_outweighs_older_turns() {
        let index = ToolIndex::build([tool("mcp__a__weather", "weather"), tool("mcp__b__calendar", "calendar")]);
        let turns = [
            Turn { role: Role::User, text: "weather tomorrow?" },
            Turn { role: Role::Other, text: "Sunny." },
            Turn { role: Role::User, text: "now put it in my calendar" },
        ];
        let query = index.query(&turns);
        assert_eq!(index.top(&query, 2, |_| true).iter().map(|t| t.0).collect::<Vec<_>>(), [1, 0]);
    }

    #[test]
    fn ties_keep_catalog_order_and_ineligible_tools_are_never_returned() {
        let index = ToolIndex::build([tool("mcp__a__x", "same"), tool("mcp__b__y", "same"), tool("mcp__c__z", "same")]);
        let query = index.query(&[Turn { role: Role::User, text: "nothing in common" }]);
        assert!(query.terms.iter().all(|(w, _)| w == "noth" || w == "common"));
        let top = index.top(&query, 2, |id| id != 0);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn huge_turns_are_read_only_up_to_the_bound() {
        let stemmer = Stemmer::create(Algorithm::English);
        let long = format!("{} needle", "filler ".repeat(MAX_TURN_BYTES));
        let query = Query::from_turns(&stemmer, &[Turn { role: Role::User, text: &long }]);
        assert!(query.terms.iter().all(|(w, _)| w != "needl"), "{query:?}");
        let many: Vec<Turn<'_>> = (0..100).map(|_| Turn { role: Role::User, text: "x" }).collect();
        assert_eq!(Query::from_turns(&stemmer, &many).terms.len(), 1);
        // A multi-byte character at the cut does not panic.
        let cut = "é".repeat(MAX_TURN_BYTES);
        let _ = Query::from_turns(&stemmer, &[Turn { role: Role::User, text: &cut }]);
    }

    #[test]
    fn an_empty_catalog_ranks_nothing() {
        let index = ToolIndex::build(std::iter::empty());
        let query = index.query(&[Turn { role: Role::User, text: "anything" }]);
        assert!(index.top(&query, 5, |_| true).is_empty());
        assert!(index.is_empty());
    }
}
