//! What one MCP server may make the agent hold: the frame limit of its replies, and caps on its
//! tool list. Pure.
//!
//! A server is untrusted (its image is the registry author's choice, and it may be compromised),
//! so neither a tool result nor a tool list may grow the agent without bound:
//! - **Frames.** A reply line (stdio, bridge) or SSE event (HTTP) larger than
//!   [`frame_limit`] is dropped and the session restarted (`mcp_output_too_large`). The limit
//!   follows the server's `maxToolOutputBytes` (a result larger than that is cut anyway), with
//!   room for JSON escaping (up to 6× for control characters; 2× covers text) and for a tool-list
//!   page, and never more than the pool's ceiling (16 MiB, rmcp's own line limit).
//! - **Lists.** At most [`ListLimits::max_pages`] pages and [`ListLimits::max_tools`] tools; a
//!   description longer than `max_description_bytes` is cut on a character boundary; a tool
//!   whose input schema serializes larger than `max_schema_bytes` is left out (a schema cut
//!   in half would mislead the model). What was cut is a [`ListCut`], reported on the agent's
//!   `/debug/effective` and the operator's status.

use std::fmt;

use rmcp::model::Tool;

/// Room for one tools/list page in a frame, whatever the output budget: 1 MiB holds about a
/// thousand tools with ordinary schemas.
const LIST_PAGE_BYTES: usize = 1 << 20;
/// JSON-RPC envelope and content wrapping around a result's text.
const ENVELOPE_BYTES: usize = 64 << 10;

/// The frame limit for a server whose results are cut at `max_tool_output_bytes`, at most
/// `ceiling`.
pub(crate) fn frame_limit(max_tool_output_bytes: u32, ceiling: usize) -> usize {
    let output = usize::try_from(max_tool_output_bytes).unwrap_or(usize::MAX);
    output.saturating_mul(2).saturating_add(ENVELOPE_BYTES).max(LIST_PAGE_BYTES).min(ceiling)
}

/// Caps on one server's tool list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListLimits {
    /// Pages fetched (a server that always returns a cursor stops here).
    pub max_pages: usize,
    /// Tools kept; the rest are left out.
    pub max_tools: usize,
    /// Bytes of a description kept.
    pub max_description_bytes: usize,
    /// Bytes of an input schema (as JSON) above which the tool is left out.
    pub max_schema_bytes: usize,
}

impl Default for ListLimits {
    /// 1,000 tools is ten times the largest public server's list (GitHub's, about 100), and a
    /// prompt could not hold more anyway; 4 KiB of description and 64 KiB of schema are well above
    /// any real tool's.
    fn default() -> Self {
        ListLimits { max_pages: 100, max_tools: 1000, max_description_bytes: 4096, max_schema_bytes: 64 << 10 }
    }
}

/// What [`admit`] cut from one list. Empty when nothing was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListCut {
    /// More pages were offered than `max_pages`.
    pub pages_cut: bool,
    /// Tools beyond `max_tools`.
    pub tools_dropped: usize,
    /// Descriptions shortened.
    pub descriptions_cut: usize,
    /// Tools left out for their schema size (names, the first few).
    pub oversized_schemas: Vec<String>,
    /// How many tools were left out for their schema size.
    pub oversized_schema_count: usize,
}

/// Names of oversized-schema tools kept in a [`ListCut`] (the count says how many in all).
const NAMED_OVERSIZED: usize = 5;
/// Bytes of a tool name copied into a [`ListCut`] (names are the server's, unbounded).
const NAME_BYTES: usize = 128;

impl ListCut {
    /// Whether anything was cut.
    pub fn is_empty(&self) -> bool {
        *self == ListCut::default()
    }
}

impl fmt::Display for ListCut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.pages_cut {
            parts.push("more tools/list pages than the cap were offered; the rest were not fetched".to_string());
        }
        if self.tools_dropped > 0 {
            parts.push(format!("{} tools over the cap were left out", self.tools_dropped));
        }
        if self.descriptions_cut > 0 {
            parts.push(format!("{} descriptions were shortened", self.descriptions_cut));
        }
        if self.oversized_schema_count > 0 {
            parts.push(format!(
                "{} tools were left out for input schemas over the size cap ({})",
                self.oversized_schema_count,
                self.oversized_schemas.join(", ")
            ));
        }
        f.write_str(&parts.join("; "))
    }
}

/// Applies `limits` to `tools` (the pages fetched; `more_pages` when the page cap stopped the
/// fetch): what the agent keeps, and what it cut.
pub(crate) fn admit(tools: Vec<Tool>, more_pages: bool, limits: &ListLimits) -> (Vec<Tool>, ListCut) {
    let mut cut = ListCut { pages_cut: more_pages, ..ListCut::default() };
    let mut kept = Vec::with_capacity(tools.len().min(limits.max_tools));
    for mut tool in tools {
        let schema_bytes = serde_json::to_vec(&*tool.input_schema).map_or(usize::MAX, |v| v.len());
        if schema_bytes > limits.max_schema_bytes {
            cut.oversized_schema_count += 1;
            if cut.oversized_schemas.len() < NAMED_OVERSIZED {
                let name = &tool.name[..tool.name.floor_char_boundary(NAME_BYTES)];
                cut.oversized_schemas.push(name.to_string());
            }
            continue;
        }
        if kept.len() == limits.max_tools {
            cut.tools_dropped += 1;
            continue;
        }
        if let Some(description) = &tool.description
            && description.len() > limits.max_description_bytes
        {
            let end = description.floor_char_boundary(limits.max_description_bytes);
            tool.description = Some(description[..end].to_string().into());
            cut.descriptions_cut += 1;
        }
        kept.push(tool);
    }
    (kept, cut)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn tool(name: &str, description: &str, schema_padding: usize) -> Tool {
        let mut schema = serde_json::Map::new();
        schema.insert("type".into(), "object".into());
        schema.insert("description".into(), "x".repeat(schema_padding).into());
        Tool::new(name.to_string(), description.to_string(), Arc::new(schema))
    }

    #[test]
    fn the_frame_limit_follows_the_output_budget_within_bounds() {
        let ceiling = 16 << 20;
        assert_eq!(frame_limit(65_536, ceiling), LIST_PAGE_BYTES, "small budgets still fit a list page");
        assert_eq!(frame_limit(4 << 20, ceiling), (8 << 20) + ENVELOPE_BYTES);
        assert_eq!(frame_limit(16 << 20, ceiling), ceiling, "never above the ceiling");
        assert_eq!(frame_limit(u32::MAX, ceiling), ceiling);
    }

    #[test]
    fn counts_descriptions_and_schemas_are_capped_and_reported() {
        let limits = ListLimits { max_pages: 2, max_tools: 2, max_description_bytes: 8, max_schema_bytes: 200 };
        let tools = vec![
            tool("a", "short", 0),
            tool("huge", "x", 1000),
            tool("b", "ééééééééé", 0), // 18 bytes: cut to 8 on a char boundary
            tool("c", "over the count", 0),
        ];
        let (kept, cut) = admit(tools, true, &limits);
        let names: Vec<&str> = kept.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(kept[1].description.as_deref(), Some("éééé"));
        assert_eq!(
            cut,
            ListCut {
                pages_cut: true,
                tools_dropped: 1,
                descriptions_cut: 1,
                oversized_schemas: vec!["huge".into()],
                oversized_schema_count: 1
            }
        );
        let text = cut.to_string();
        assert!(text.contains("1 tools over the cap") && text.contains("huge"), "{text}");
    }

    #[test]
    fn an_ordinary_list_is_kept_whole() {
        let (kept, cut) = admit(vec![tool("a", "d", 10), tool("b", "d", 10)], false, &ListLimits::default());
        assert_eq!(kept.len(), 2);
        assert!(cut.is_empty());
    }
}
