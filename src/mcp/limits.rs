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
//! - **Lists, as the pages arrive.** Each page is admitted when it arrives ([`ListAdmission`]),
//!   so what one page held is dropped before the next is asked for, and listing stops once the
//!   list is full: at most [`ListLimits::max_pages`] pages, [`ListLimits::max_tools`] tools, and
//!   [`ListLimits::max_list_bytes`] bytes and [`ListLimits::max_list_values`] JSON values kept
//!   in all; and it stops once four times `max_list_bytes` was received, kept or not.
//! - **Every field of a tool counts.** A description longer than `max_description_bytes` is cut
//!   on a character boundary; a tool is left out (a schema cut in half would mislead the model)
//!   when its input or output schema serializes larger than `max_schema_bytes`, its other
//!   fields (name, title, annotations, icons, `_meta`) larger than `max_other_bytes`, or it holds
//!   more than `max_tool_values` JSON values: a value costs the agent tens of bytes however short
//!   its JSON (`0,` is two bytes), so bytes alone do not bound memory.
//! - What was cut is a [`ListCut`], reported on the agent's `/debug/effective` and the
//!   operator's status.

use std::fmt;

use rmcp::model::Tool;
use serde_json::Value;

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
    /// Bytes of an input or output schema (as JSON) above which the tool is left out.
    pub max_schema_bytes: usize,
    /// Bytes of a tool's other fields (name, title, annotations, icons, `_meta`, as JSON) above
    /// which it is left out.
    pub max_other_bytes: usize,
    /// JSON values (numbers, strings, arrays, objects...) of one tool above which it is left out.
    pub max_tool_values: usize,
    /// Bytes (as JSON) of the whole list kept; listing stops once it is reached.
    pub max_list_bytes: usize,
    /// JSON values of the whole list kept; listing stops once it is reached.
    pub max_list_values: usize,
}

impl Default for ListLimits {
    /// 1,000 tools is ten times the largest public server's list (GitHub's, about 100), and a
    /// prompt could not hold more anyway; 4 KiB of description and 64 KiB of schema are well above
    /// any real tool's, and so are 16 KiB of other fields and 8,192 values (a large real schema
    /// has a few hundred). 8 MiB and 256 Ki values in all bound the list at some tens of MiB
    /// of memory, whatever its shape.
    fn default() -> Self {
        ListLimits {
            max_pages: 100,
            max_tools: 1000,
            max_description_bytes: 4096,
            max_schema_bytes: 64 << 10,
            max_other_bytes: 16 << 10,
            max_tool_values: 8192,
            max_list_bytes: 8 << 20,
            max_list_values: 256 << 10,
        }
    }
}

/// What [`ListAdmission`] cut from one list. Empty when nothing was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListCut {
    /// More pages were offered than `max_pages`.
    pub pages_cut: bool,
    /// The list reached `max_list_bytes` or `max_list_values`: the rest was not kept, and no
    /// more pages were fetched.
    pub size_cut: bool,
    /// Tools beyond `max_tools`, or beyond the list's size caps.
    pub tools_dropped: usize,
    /// Descriptions shortened.
    pub descriptions_cut: usize,
    /// Tools left out for their own size (names, the first few).
    pub oversized: Vec<String>,
    /// How many tools were left out for their own size.
    pub oversized_count: usize,
}

/// Names of oversized tools kept in a [`ListCut`] (the count says how many in all).
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
        if self.size_cut {
            parts.push("the list reached its size cap; the rest was not kept or fetched".to_string());
        }
        if self.tools_dropped > 0 {
            parts.push(format!("{} tools over the cap were left out", self.tools_dropped));
        }
        if self.descriptions_cut > 0 {
            parts.push(format!("{} descriptions were shortened", self.descriptions_cut));
        }
        if self.oversized_count > 0 {
            parts.push(format!(
                "{} tools were left out for their size (an input or output schema, or other fields, over the size \
                 cap, or too many JSON values) ({})",
                self.oversized_count,
                self.oversized.join(", ")
            ));
        }
        f.write_str(&parts.join("; "))
    }
}

/// A `Write` that only counts: the JSON size of a value without building it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes of `value` as JSON (`usize::MAX` when it does not serialize).
fn json_bytes<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value).map_or(usize::MAX, |()| counter.0)
}

/// JSON values in `value`, itself included.
fn values_in(value: &Value) -> usize {
    let mut count = 0usize;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        count += 1;
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    count
}

fn object_values(map: &serde_json::Map<String, Value>) -> usize {
    1 + map.values().map(values_in).sum::<usize>()
}

/// What a tool weighs, every listed field counted.
struct Weight {
    input_bytes: usize,
    output_bytes: usize,
    other_bytes: usize,
    description_bytes: usize,
    values: usize,
}

fn weigh(tool: &Tool) -> Weight {
    let output = tool.output_schema.as_deref();
    let other_bytes = [
        tool.name.len(),
        tool.title.as_ref().map_or(0, json_bytes),
        tool.annotations.as_ref().map_or(0, json_bytes),
        tool.icons.as_ref().map_or(0, json_bytes),
        tool.meta.as_ref().map_or(0, |m| json_bytes(&m.0)),
    ]
    .into_iter()
    .fold(0usize, usize::saturating_add);
    // Typed fields cost about one value each; icons a few.
    let typed_values = 4 + tool.icons.as_ref().map_or(0, |i| 4 * i.len()) + tool.annotations.as_ref().map_or(0, |_| 6);
    let values = object_values(&tool.input_schema)
        + output.map_or(0, object_values)
        + tool.meta.as_ref().map_or(0, |m| object_values(&m.0))
        + typed_values;
    Weight {
        input_bytes: json_bytes(&*tool.input_schema),
        output_bytes: output.map_or(0, json_bytes),
        other_bytes,
        description_bytes: tool.description.as_ref().map_or(0, |d| d.len()),
        values,
    }
}

/// One server's tool list, admitted page by page as it arrives (see the module header).
pub(crate) struct ListAdmission {
    limits: ListLimits,
    kept: Vec<Tool>,
    cut: ListCut,
    bytes: usize,
    values: usize,
    /// Bytes of every tool received, kept or not.
    received: usize,
    full: bool,
}

/// A list stops once this many times `max_list_bytes` was received, kept or not: a server
/// that sends only oversized tools does not make the agent parse all its pages.
const RECEIVED_PER_KEPT: usize = 4;

impl ListAdmission {
    pub(crate) fn new(limits: &ListLimits) -> Self {
        ListAdmission {
            limits: *limits,
            kept: Vec::new(),
            cut: ListCut::default(),
            bytes: 0,
            values: 0,
            received: 0,
            full: false,
        }
    }

    /// Admits one page's tools; `false` once the list is full (fetch no more pages).
    pub(crate) fn page(&mut self, tools: Vec<Tool>) -> bool {
        let limits = self.limits;
        for mut tool in tools {
            if self.full {
                self.cut.tools_dropped += 1;
                continue;
            }
            let weight = weigh(&tool);
            let received = [weight.input_bytes, weight.output_bytes, weight.other_bytes, weight.description_bytes]
                .into_iter()
                .fold(0usize, usize::saturating_add);
            self.received = self.received.saturating_add(received);
            if self.received > limits.max_list_bytes.saturating_mul(RECEIVED_PER_KEPT) {
                self.cut.size_cut = true;
                self.full = true;
            }
            if weight.input_bytes > limits.max_schema_bytes
                || weight.output_bytes > limits.max_schema_bytes
                || weight.other_bytes > limits.max_other_bytes
                || weight.values > limits.max_tool_values
            {
                self.cut.oversized_count += 1;
                if self.cut.oversized.len() < NAMED_OVERSIZED {
                    let name = &tool.name[..tool.name.floor_char_boundary(NAME_BYTES)];
                    self.cut.oversized.push(name.to_string());
                }
                continue;
            }
            if self.kept.len() == limits.max_tools {
                self.cut.tools_dropped += 1;
                self.full = true;
                continue;
            }
            let mut description_bytes = weight.description_bytes;
            if let Some(description) = &tool.description
                && description.len() > limits.max_description_bytes
            {
                let end = description.floor_char_boundary(limits.max_description_bytes);
                tool.description = Some(description[..end].to_string().into());
                description_bytes = end;
                self.cut.descriptions_cut += 1;
            }
            let bytes = [weight.input_bytes, weight.output_bytes, weight.other_bytes, description_bytes]
                .into_iter()
                .fold(0usize, usize::saturating_add);
            if self.bytes.saturating_add(bytes) > limits.max_list_bytes
                || self.values.saturating_add(weight.values) > limits.max_list_values
            {
                self.cut.tools_dropped += 1;
                self.cut.size_cut = true;
                self.full = true;
                continue;
            }
            self.bytes += bytes;
            self.values += weight.values;
            self.kept.push(tool);
        }
        !self.full
    }

    /// The tools kept and what was cut; `more_pages`: the page cap stopped the listing.
    pub(crate) fn finish(self, more_pages: bool) -> (Vec<Tool>, ListCut) {
        let mut cut = self.cut;
        cut.pages_cut = more_pages && !self.full;
        (self.kept, cut)
    }
}

/// Applies `limits` to `tools` (the pages fetched; `more_pages` when the page cap stopped the
/// fetch) at once: what the agent keeps, and what it cut.
#[cfg(test)]
pub(crate) fn admit(tools: Vec<Tool>, more_pages: bool, limits: &ListLimits) -> (Vec<Tool>, ListCut) {
    let mut admission = ListAdmission::new(limits);
    admission.page(tools);
    admission.finish(more_pages)
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
        let limits = ListLimits {
            max_pages: 2,
            max_tools: 2,
            max_description_bytes: 8,
            max_schema_bytes: 200,
            ..ListLimits::default()
        };
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
                pages_cut: false,
                size_cut: false,
                tools_dropped: 1,
                descriptions_cut: 1,
                oversized: vec!["huge".into()],
                oversized_count: 1
            }
        );
        let text = cut.to_string();
        assert!(text.contains("1 tools over the cap") && text.contains("huge"), "{text}");
    }

    fn with(mut tool: Tool, edit: impl FnOnce(&mut Tool)) -> Tool {
        edit(&mut tool);
        tool
    }

    #[test]
    fn output_schemas_annotations_meta_and_titles_count_too() {
        let limits = ListLimits::default();
        let mut big_object = serde_json::Map::new();
        big_object.insert("enum".into(), Value::Array(vec![0.into(); 40_000]));
        let big = Arc::new(big_object);
        let tools = vec![
            with(tool("out", "d", 0), |t| t.output_schema = Some(big.clone())),
            with(tool("meta", "d", 0), |t| t.meta = Some(rmcp::model::MetaObject((*big).clone()))),
            with(tool("title", "d", 0), |t| t.title = Some("t".repeat(20_000))),
            with(tool("annotated", "d", 0), |t| {
                t.annotations = Some(rmcp::model::ToolAnnotations::with_title("a".repeat(20_000)))
            }),
            with(tool("name", "d", 0), |t| t.name = "n".repeat(20_000).into()),
            tool("fine", "d", 0),
        ];
        let (kept, cut) = admit(tools, false, &limits);
        assert_eq!(kept.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>(), ["fine"]);
        assert_eq!(cut.oversized_count, 5, "{cut}");
        // Small values in a schema within the byte cap: too many values for one tool.
        let mut dense = serde_json::Map::new();
        dense.insert("enum".into(), Value::Array(vec![0.into(); 10_000]));
        let (kept, cut) =
            admit(vec![with(tool("dense", "d", 0), |t| t.input_schema = Arc::new(dense))], false, &limits);
        assert!(kept.is_empty() && cut.oversized == ["dense"], "{cut}");
    }

    #[test]
    fn pages_are_admitted_as_they_arrive_and_listing_stops_at_the_list_caps() {
        let limits = ListLimits { max_list_bytes: 10_000, ..ListLimits::default() };
        let mut admission = ListAdmission::new(&limits);
        let page = |p: usize| (0..10).map(|i| tool(&format!("t{p}_{i}"), "d", 300)).collect::<Vec<_>>();
        let mut pages = 0;
        while admission.page(page(pages)) {
            pages += 1;
            assert!(pages < 100, "listing never stopped");
        }
        let (kept, cut) = admission.finish(true);
        assert!(pages <= 3, "{pages} pages fetched");
        assert!(cut.size_cut && !cut.pages_cut && cut.tools_dropped > 0, "{cut}");
        assert!(kept.len() < 40, "{}", kept.len());
        assert!(cut.to_string().contains("size cap"), "{cut}");
        // The values cap works the same way.
        let limits = ListLimits { max_list_values: 50, ..ListLimits::default() };
        let mut admission = ListAdmission::new(&limits);
        assert!(!admission.page(page(0)));
        assert!(admission.finish(false).1.size_cut);
        // Pages of oversized tools only: listing stops after four times the list's byte cap.
        let limits = ListLimits { max_schema_bytes: 100, max_list_bytes: 10_000, ..ListLimits::default() };
        let mut admission = ListAdmission::new(&limits);
        let mut pages = 0;
        while admission.page(page(pages)) {
            pages += 1;
            assert!(pages < 100, "listing never stopped");
        }
        let (kept, cut) = admission.finish(true);
        assert!(kept.is_empty() && cut.size_cut && (10..=12).contains(&pages), "{pages}: {cut}");
    }

    #[test]
    fn an_ordinary_list_is_kept_whole() {
        let (kept, cut) = admit(vec![tool("a", "d", 10), tool("b", "d", 10)], false, &ListLimits::default());
        assert_eq!(kept.len(), 2);
        assert!(cut.is_empty());
    }
}
