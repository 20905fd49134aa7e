//! Reading McpServer / McpProfile manifests from YAML or JSON text, with line numbers.
//!
//! ```text
//! text ──yaml-rust2 events──▶ per document: JSON value + (field path → line) index
//!      ──serde (strict: unknown fields are errors)──▶ McpServer | McpProfile
//!      ──validate()──▶ problems, each with line, field, message and fix
//! ```
//!
//! One pass over the YAML events builds both the value and the line index, so every problem
//! (syntax, type, unknown field, validation) points at the line of the field it names. Scalars
//! resolve with the YAML 1.2 core schema, as the API server's YAML decoder does (`yes` is a
//! string, not a boolean). A document with any problem yields no object: callers never see a
//! half-valid resource.
//!
//! Manifests come from registry authors, who are not trusted with the agent's memory. The
//! parser's events are pulled in a loop (yaml-rust2's `Parser::load` recurses once per nesting
//! level, so deep input would overflow the stack), and every document is held to caps: nesting
//! depth, nodes and scalar bytes with alias expansions counted (an alias is a copy: a few
//! hundred bytes of nested aliases can expand to gigabytes), and bytes of the field-path line
//! index. A manifest past a cap is one problem naming the cap and the fix, never a crash.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::{Map, Number, Value};
use yaml_rust2::Yaml;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::keys::{API_VERSION, KIND_PROFILE, KIND_SERVER};
use super::{McpProfile, McpServer, Validate, ValidationError};

/// A resource read from a manifest.
// The variants differ in size, but objects are moved a few times per file read, never on a hot
// path; boxing them would only add noise at every match.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Server(McpServer),
    Profile(McpProfile),
}

impl Object {
    /// The object's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Server(_) => KIND_SERVER,
            Object::Profile(_) => KIND_PROFILE,
        }
    }

    /// The object's `metadata.name` (validated objects always have one).
    pub fn name(&self) -> &str {
        let meta = match self {
            Object::Server(s) => &s.metadata,
            Object::Profile(p) => &p.metadata,
        };
        meta.name.as_deref().unwrap_or_default()
    }
}

/// A valid object and where its document starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// 1-based line of the document's first node.
    pub line: usize,
    pub object: Object,
}

/// One problem in a manifest, located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line.
    pub line: usize,
    /// The field path the problem is about (`spec.stdio.command`), or `document` for syntax.
    pub field: String,
    pub message: String,
    pub fix: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {} ({})", self.line, self.field, self.message, self.fix)
    }
}

/// The outcome of reading one manifest text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    /// Valid objects, in document order.
    pub documents: Vec<Document>,
    /// Every problem found, in document order. Non-empty means the text is invalid.
    pub problems: Vec<Problem>,
}

impl Parsed {
    /// Whether the text had no problem.
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Whether a file name is one a registry directory reads: `*.yaml`, `*.yml` or `*.json`, not
/// hidden, not an editor backup, lock or temp file (`~`, `.bak`, `.orig`, `.swp`, `.tmp`,
/// `#...#`). Temp files matter: editors write them next to the real file, and reading a
/// half-written copy would flap the registry.
pub fn is_manifest_file_name(name: &str) -> bool {
    let ignored = name.starts_with('.')
        || name.ends_with('~')
        || (name.starts_with('#') && name.ends_with('#'))
        || [".bak", ".orig", ".swp", ".tmp"].iter().any(|suffix| name.ends_with(suffix));
    let manifest = [".yaml", ".yml", ".json"].iter().any(|ext| name.len() > ext.len() && name.ends_with(ext));
    manifest && !ignored
}

/// Largest manifest text read, in bytes. Kubernetes stores objects of at most about 1.5 MiB; a
/// file of several such objects fits.
pub(crate) const MAX_MANIFEST_BYTES: usize = 8 << 20;
/// Deepest nesting of mappings and sequences in a document. The resource types nest about eight
/// levels at most (label selector expressions); the rest is headroom.
pub(crate) const MAX_DEPTH: usize = 64;
/// What one parse (a file or stdin, every document in it) may spend. The budget is the file's: a
/// document under it repeated many times in one file must not multiply what is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Nodes, alias expansions included.
    pub nodes: usize,
    /// Scalar bytes, alias expansions included.
    pub scalar_bytes: usize,
    /// Bytes of field paths in the line indexes (a long key repeats in every path below it).
    pub path_bytes: usize,
}

impl Budget {
    /// Every parse's budget. Nodes: far above any real registry file (a server with a thousand
    /// tool patterns is a few thousand nodes). Scalar and path bytes: four times the largest text.
    pub(crate) const FILE: Budget = Budget { nodes: 200_000, scalar_bytes: 32 << 20, path_bytes: 32 << 20 };
}

impl Default for Budget {
    fn default() -> Self {
        Budget::FILE
    }
}

/// What a parse spent of its [`Budget`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Spent {
    pub nodes: usize,
    pub scalar_bytes: usize,
    pub path_bytes: usize,
}

/// Reads every document of `text`; nothing that fails is returned as an object.
pub fn parse(text: &str) -> Parsed {
    parse_within(text, Budget::FILE).0
}

/// [`parse`] under `budget`, with what it spent (up to where it stopped).
pub(crate) fn parse_within(text: &str, budget: Budget) -> (Parsed, Spent) {
    let mut parsed = Parsed::default();
    if text.len() > MAX_MANIFEST_BYTES {
        parsed.problems.push(Problem {
            line: 1,
            field: "document".into(),
            message: format!("the manifest is {} bytes; at most {MAX_MANIFEST_BYTES} are read", text.len()),
            fix: "split it into several files".into(),
        });
        return (parsed, Spent::default());
    }
    // The YAML scanner takes a NUL for the end of the stream: what follows would vanish unread.
    if let Some(at) = text.find('\0') {
        let line = 1 + text[..at].matches('\n').count();
        parsed.problems.push(Problem {
            line,
            field: "document".into(),
            message: "the manifest contains a NUL byte: the text after it would be ignored".into(),
            fix: "save the file as plain UTF-8 text".into(),
        });
        return (parsed, Spent::default());
    }
    let mut builder = Builder { budget, ..Builder::default() };
    let mut parser = Parser::new_from_str(text);
    loop {
        match parser.next_token() {
            Ok((Event::StreamEnd, _)) => break,
            Ok((event, mark)) => builder.on_event(event, mark),
            Err(e) => {
                parsed.problems.push(Problem {
                    line: e.marker().line().max(1),
                    field: "document".into(),
                    message: format!("YAML syntax error: {}", e.info()),
                    fix: "fix the YAML syntax at this line".into(),
                });
                return (parsed, builder.spent());
            }
        }
        if let Some(problem) = builder.over_limit.take() {
            parsed.problems.push(problem);
            return (parsed, builder.spent());
        }
    }
    let spent = builder.spent();
    for doc in builder.docs {
        read_document(doc, &mut parsed);
    }
    (parsed, spent)
}

fn read_document(doc: RawDocument, parsed: &mut Parsed) {
    let problem = |field: &str, message: String, fix: &str| Problem {
        line: doc.line_of(field),
        field: field.to_string(),
        message,
        fix: fix.to_string(),
    };
    if let Some(error) = doc.error {
        parsed.problems.push(error);
        return;
    }
    let Value::Object(map) = &doc.value else {
        if !doc.value.is_null() {
            parsed.problems.push(problem(
                "document",
                "a manifest document must be a mapping".into(),
                "write an McpServer or McpProfile object",
            ));
        }
        return;
    };
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(API_VERSION) => {}
        Some(other) => {
            parsed.problems.push(problem(
                "apiVersion",
                format!("'{other}' is not supported"),
                "use apiVersion: mcp.spear.dev/v1alpha1",
            ));
            return;
        }
        None => {
            parsed.problems.push(problem(
                "apiVersion",
                "apiVersion is missing".into(),
                "add apiVersion: mcp.spear.dev/v1alpha1",
            ));
            return;
        }
    }
    let object = match map.get("kind").and_then(Value::as_str) {
        Some(KIND_SERVER) => deserialize::<McpServer>(&doc).map(|s| (s.validate(), Object::Server(s))),
        Some(KIND_PROFILE) => deserialize::<McpProfile>(&doc).map(|p| (p.validate(), Object::Profile(p))),
        Some(other) => {
            parsed.problems.push(problem(
                "kind",
                format!("kind '{other}' is not supported"),
                "use McpServer or McpProfile",
            ));
            return;
        }
        None => {
            parsed.problems.push(problem("kind", "kind is missing".into(), "add kind: McpServer or kind: McpProfile"));
            return;
        }
    };
    match object {
        Err(problems) => parsed.problems.extend(problems),
        Ok((errors, _)) if !errors.is_empty() => {
            parsed.problems.extend(errors.into_iter().map(|ValidationError { field, message, fix }| Problem {
                line: doc.line_of(&field),
                field,
                message,
                fix,
            }))
        }
        Ok((_, object)) => parsed.documents.push(Document { line: doc.start_line, object }),
    }
}

/// The field path of a field serde ignored, as a manifest spells it: serde_ignored writes a `?`
/// segment where it passed through an `Option` (`spec.stdio.?.sandbox`).
pub(crate) fn ignored_field(path: &serde_ignored::Path<'_>) -> String {
    path.to_string().split('.').filter(|segment| *segment != "?").collect::<Vec<_>>().join(".")
}

/// Strict deserialization: type errors carry their field path, unknown fields are errors.
fn deserialize<T: DeserializeOwned>(doc: &RawDocument) -> Result<T, Vec<Problem>> {
    let mut unknown = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| unknown.push(ignored_field(&path));
    let result: Result<T, _> =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(doc.value.clone(), &mut record));
    // `status` is written by the operator; a manifest may carry it (for example `kubectl get -o
    // yaml` output) and it is ignored, not an error. Metadata fields are Kubernetes' own.
    // `apiVersion` and `kind` were checked before and are not fields of the Rust type.
    unknown.retain(|p| !matches!(p.split(['.', '[']).next(), Some("status" | "metadata" | "apiVersion" | "kind")));
    let mut problems: Vec<Problem> = unknown
        .into_iter()
        .map(|field| Problem {
            line: doc.line_of(&field),
            message: "unknown field".into(),
            fix: "remove it or fix its spelling (see `kubectl explain` or docs/reference.md)".into(),
            field,
        })
        .collect();
    match result {
        Ok(value) if problems.is_empty() => Ok(value),
        Ok(_) => Err(problems),
        Err(e) => {
            let mut field = e.path().to_string();
            let message = e.inner().to_string();
            // serde reports a missing field at its parent; name the field itself.
            if let Some(name) = message.strip_prefix("missing field `").and_then(|m| m.split('`').next()) {
                field = if field == "." { name.to_string() } else { format!("{field}.{name}") };
            }
            let field = if field == "." { "document".to_string() } else { field };
            let fix = if message.contains(super::LEGACY_SSE_REASON) {
                super::LEGACY_SSE_FIX.into()
            } else {
                "give the field the type and value the resource reference describes".into()
            };
            problems.push(Problem { line: doc.line_of(&field), message, fix, field });
            Err(problems)
        }
    }
}

// === YAML events → JSON value + line index ===

/// One YAML document as a JSON value, with the line of every field path.
#[derive(Default)]
struct RawDocument {
    value: Value,
    start_line: usize,
    lines: BTreeMap<String, usize>,
    error: Option<Problem>,
}

impl RawDocument {
    /// The line of `field`, or of its closest ancestor that has one, or the document's start.
    fn line_of(&self, field: &str) -> usize {
        let mut path = field;
        loop {
            if let Some(line) = self.lines.get(path) {
                return *line;
            }
            match path.rfind(['.', '[']) {
                Some(i) => path = &path[..i],
                None => return self.start_line,
            }
        }
    }
}

enum Frame {
    Map { map: Map<String, Value>, key: Option<String>, path: String },
    Seq { items: Vec<Value>, path: String },
}

/// What a document has used of the caps so far; an anchored value remembers its own cost, which
/// every alias to it spends again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cost {
    nodes: usize,
    scalar_bytes: usize,
}

#[derive(Default)]
struct Builder {
    docs: Vec<RawDocument>,
    current: RawDocument,
    stack: Vec<Frame>,
    /// Anchored values and their cost.
    anchors: BTreeMap<usize, (Value, Cost)>,
    /// Anchors of the containers being built, set when they close, with the document's cost
    /// when they opened.
    open_anchors: Vec<(usize, Cost)>,
    /// What the documents so far have cost.
    cost: Cost,
    /// Bytes of field paths in the line indexes and frames so far.
    path_bytes: usize,
    /// Set when the document went past a cap: parsing stops with this problem.
    over_limit: Option<Problem>,
    budget: Budget,
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() { key.to_string() } else { format!("{parent}.{key}") }
}

impl Builder {
    /// The path the next value lands at, if it is a value (not a mapping key).
    fn next_value_path(&self) -> Option<String> {
        match self.stack.last() {
            None => Some(String::new()),
            Some(Frame::Map { key: Some(k), path, .. }) => Some(join(path, k)),
            Some(Frame::Map { key: None, .. }) => None,
            Some(Frame::Seq { items, path }) => Some(format!("{path}[{}]", items.len())),
        }
    }

    /// Places a finished value into its parent (or makes it the document).
    fn place(&mut self, value: Value, line: usize) {
        match self.stack.last_mut() {
            None => self.current.value = value,
            Some(Frame::Map { map, key, .. }) => {
                if let Some(k) = key.take() {
                    if map.contains_key(&k) && self.current.error.is_none() {
                        self.current.error = Some(Problem {
                            line,
                            field: "document".into(),
                            message: format!("duplicate key '{k}'"),
                            fix: "make every mapping key unique".into(),
                        });
                    }
                    map.insert(k, value);
                } else {
                    // A non-string key: the value itself becomes the key, as Kubernetes does.
                    let k = match value {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    *key = Some(k);
                }
            }
            Some(Frame::Seq { items, .. }) => items.push(value),
        }
    }

    fn record_line(&mut self, line: usize) {
        // A key is recorded when the key scalar is placed (in `on_event`).
        if let Some(path) = self.next_value_path() {
            self.index(path, line);
        }
    }

    /// Records the line of `path` (the first one wins), counting its bytes.
    fn index(&mut self, path: String, line: usize) {
        if let std::collections::btree_map::Entry::Vacant(entry) = self.current.lines.entry(path) {
            self.path_bytes += entry.key().len();
            entry.insert(line);
        }
    }

    fn spent(&self) -> Spent {
        Spent { nodes: self.cost.nodes, scalar_bytes: self.cost.scalar_bytes, path_bytes: self.path_bytes }
    }

    /// Spends `cost` of the file's budget; past it, records the problem and says so.
    fn spend(&mut self, cost: Cost, line: usize) -> bool {
        self.cost.nodes = self.cost.nodes.saturating_add(cost.nodes);
        self.cost.scalar_bytes = self.cost.scalar_bytes.saturating_add(cost.scalar_bytes);
        self.within_budget(line)
    }

    /// Whether the file is still within its budget; if not, records the problem.
    fn within_budget(&mut self, line: usize) -> bool {
        let Budget { nodes, scalar_bytes, path_bytes } = self.budget;
        let exceeded = if self.stack.len() > MAX_DEPTH {
            Some(format!("mappings and sequences nest deeper than {MAX_DEPTH} levels"))
        } else if self.cost.nodes > nodes {
            Some(format!("the file has more than {nodes} nodes (aliases count as copies)"))
        } else if self.cost.scalar_bytes > scalar_bytes {
            Some(format!("the file's values exceed {scalar_bytes} bytes (aliases count as copies)"))
        } else if self.path_bytes > path_bytes {
            Some(format!("the file's field paths exceed {path_bytes} bytes (very long keys, deeply nested)"))
        } else {
            None
        };
        let Some(message) = exceeded else { return true };
        self.over_limit = Some(Problem {
            line,
            field: "document".into(),
            message,
            fix: "write the resource out plainly: no deep nesting, no alias expanding to large copies".into(),
        });
        false
    }
}

fn scalar(text: String, style: TScalarStyle) -> Value {
    if style != TScalarStyle::Plain {
        return Value::String(text);
    }
    match Yaml::from_str(&text) {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Integer(i) => Value::Number(i.into()),
        Yaml::Real(r) => r.parse::<f64>().ok().and_then(Number::from_f64).map_or(Value::String(text), Value::Number),
        _ => Value::String(text),
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let line = mark.line().max(1);
        if self.over_limit.is_some() {
            return;
        }
        match event {
            Event::DocumentStart => {
                self.current = RawDocument { start_line: line, ..Default::default() };
                self.stack.clear();
                self.anchors.clear();
                self.open_anchors.clear();
                // `cost` and `path_bytes` carry on: the budget is the file's, not the document's.
            }
            Event::DocumentEnd => self.docs.push(std::mem::take(&mut self.current)),
            Event::Scalar(text, style, anchor, _) => {
                let is_key = matches!(self.stack.last(), Some(Frame::Map { key: None, .. }));
                if self.current.lines.is_empty() {
                    self.current.start_line = line;
                }
                let cost = Cost { nodes: 1, scalar_bytes: text.len() };
                if !self.spend(cost, line) {
                    return;
                }
                let value = scalar(text, style);
                if anchor > 0 {
                    self.anchors.insert(anchor, (value.clone(), cost));
                }
                if is_key {
                    if let (Some(Frame::Map { path, .. }), Value::String(k)) = (self.stack.last(), &value) {
                        let field = join(path, k);
                        self.index(field, line);
                    }
                } else {
                    self.record_line(line);
                }
                self.place(value, line);
            }
            Event::Alias(id) => {
                // Spent before the copy is made: the cap must hold before the memory is taken.
                let cost = self.anchors.get(&id).map_or(Cost { nodes: 1, scalar_bytes: 0 }, |(_, cost)| *cost);
                if !self.spend(cost, line) {
                    return;
                }
                self.record_line(line);
                let value = self.anchors.get(&id).map_or(Value::Null, |(value, _)| value.clone());
                self.place(value, line);
            }
            Event::MappingStart(anchor, _) | Event::SequenceStart(anchor, _) => {
                if self.stack.is_empty() {
                    self.current.start_line = line;
                }
                let path = self.next_value_path().unwrap_or_default();
                self.path_bytes += path.len();
                self.index(path.clone(), line);
                self.open_anchors.push((anchor, self.cost));
                self.stack.push(if matches!(event, Event::MappingStart(..)) {
                    Frame::Map { map: Map::new(), key: None, path }
                } else {
                    Frame::Seq { items: Vec::new(), path }
                });
                // Past a cap, `over_limit` is set and every later event is ignored.
                self.spend(Cost { nodes: 1, scalar_bytes: 0 }, line);
            }
            Event::MappingEnd | Event::SequenceEnd => {
                let value = match self.stack.pop() {
                    Some(Frame::Map { map, .. }) => Value::Object(map),
                    Some(Frame::Seq { items, .. }) => Value::Array(items),
                    None => Value::Null,
                };
                if let Some((anchor, at_open)) = self.open_anchors.pop().filter(|(a, _)| *a > 0) {
                    let cost = Cost {
                        nodes: self.cost.nodes - at_open.nodes,
                        scalar_bytes: self.cost.scalar_bytes - at_open.scalar_bytes,
                    };
                    self.anchors.insert(anchor, (value.clone(), cost));
                }
                self.place(value, line);
            }
            Event::StreamStart | Event::StreamEnd | Event::Nothing => {}
        }
        // A key's path is indexed after its node was spent: the last key of a file is counted here.
        if self.over_limit.is_none() {
            self.within_budget(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVER: &str = "\
apiVersion: mcp.spear.dev/v1alpha1
kind: McpServer
metadata:
  name: fs
spec:
  transport: stdio
  stdio:
    command: npx
    args: [\"-y\", \"@modelcontextprotocol/server-filesystem\"]
  allowedTools: [\"read_*\"]
";

    #[test]
    fn a_valid_server_parses_with_its_start_line() {
        let parsed = parse(SERVER);
        assert_eq!(parsed.problems, vec![]);
        assert_eq!(parsed.documents.len(), 1);
        assert_eq!(parsed.documents[0].line, 1);
        assert_eq!(parsed.documents[0].object.name(), "fs");
    }

    #[test]
    fn problems_point_at_the_line_of_their_field_in_later_documents() {
        let text =
            format!("{SERVER}---\n{}", SERVER.replace("name: fs", "name: web").replace("command: npx", "command: ''"));
        let parsed = parse(&text);
        assert_eq!(parsed.documents.len(), 1);
        assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems);
        assert_eq!(parsed.problems[0].field, "spec.stdio.command");
        assert_eq!(parsed.problems[0].line, 19);
    }

    #[test]
    fn unknown_fields_are_errors_naming_the_field() {
        let parsed = parse(&SERVER.replace("allowedTools", "allowedTool"));
        assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems);
        assert_eq!(parsed.problems[0].field, "spec.allowedTool");
        assert_eq!(parsed.problems[0].line, 10);
    }

    #[test]
    fn unknown_fields_inside_optional_blocks_are_named_as_written() {
        let parsed = parse(&SERVER.replace("command: npx", "command: npx\n    sandbox: true"));
        assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems);
        assert_eq!((parsed.problems[0].field.as_str(), parsed.problems[0].line), ("spec.stdio.sandbox", 9));
    }

    #[test]
    fn type_errors_name_the_field() {
        let parsed = parse(&SERVER.replace("transport: stdio", "transport: grpc"));
        assert_eq!(parsed.problems[0].field, "spec.transport");
        assert_eq!(parsed.problems[0].line, 6);
        assert!(parsed.problems[0].message.contains("grpc"));
    }

    #[test]
    fn the_legacy_sse_transport_is_refused_with_the_reason_and_the_fix() {
        let http = "transport: sse\n  http: {url: \"https://x.example.com/sse\"}";
        for spelling in ["sse", "SSE", "http_sse_legacy", "httpSse", "'sse'"] {
            let text = SERVER.replace("transport: stdio", &http.replace("sse\n", &format!("{spelling}\n")));
            for text in [
                text.clone(),
                serde_json::to_string(&serde_yaml::from_str::<Value>(&text).expect("yaml")).expect("json"),
            ] {
                let parsed = parse(&text);
                assert_eq!(parsed.problems.len(), 1, "{spelling}: {:?}", parsed.problems);
                let problem = &parsed.problems[0];
                assert_eq!(problem.field, "spec.transport");
                assert!(
                    problem.message.contains("HTTP+SSE") && problem.message.contains("not supported"),
                    "{problem:?}"
                );
                assert!(problem.fix.contains("streamableHttp") && problem.fix.contains("mcp-proxy"), "{problem:?}");
            }
        }
    }

    #[test]
    fn syntax_errors_report_a_line() {
        let parsed = parse("apiVersion: mcp.spear.dev/v1alpha1\nkind: [McpServer\n");
        assert_eq!(parsed.problems.len(), 1);
        assert_eq!(parsed.problems[0].field, "document");
    }

    #[test]
    fn duplicate_keys_are_refused() {
        let parsed = parse(&SERVER.replace("  transport: stdio\n", "  transport: stdio\n  transport: stdio\n"));
        assert_eq!(parsed.problems[0].message, "duplicate key 'transport'");
    }

    #[test]
    fn json_parses_too_and_yes_stays_a_string() {
        let parsed = parse(
            r#"{"apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "x"},
            "spec": {"transport": "stdio", "displayName": "yes", "stdio": {"command": "node"}}}"#,
        );
        assert_eq!(parsed.problems, vec![]);
        let Object::Server(s) = &parsed.documents[0].object else { panic!("a server") };
        assert_eq!(s.spec.display_name.as_deref(), Some("yes"));
    }

    #[test]
    fn only_manifest_file_names_are_read() {
        for name in ["a.yaml", "a.yml", "a.json", "server.v2.yaml", "#a.yaml", "with.dots.yaml"] {
            assert!(is_manifest_file_name(name), "{name}");
        }
        for name in [
            ".a.yaml",
            ".yaml",
            "a.yaml~",
            "a.yaml.bak",
            "a.yaml.orig",
            "a.yaml.swp",
            ".a.yaml.swp",
            "a.yaml.tmp",
            "#a.yaml#",
            ".#a.yaml",
            "a.txt",
            "a.yaml.txt",
            "a",
            "4913",
            "a.YAML.tmp",
            "yaml",
        ] {
            assert!(!is_manifest_file_name(name), "{name}");
        }
    }

    /// The attack: a few hundred bytes of nested aliases (a "billion laughs") expanded to
    /// gigabytes before anything was checked.
    #[test]
    fn an_alias_bomb_is_one_problem_not_gigabytes() {
        let mut text = String::from(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {name: x}\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
        );
        for i in 1..12 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(text.len() < 1000, "{}", text.len());
        let parsed = parse(&text);
        assert_eq!(parsed.documents, vec![]);
        assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems);
        assert!(parsed.problems[0].message.contains("aliases count as copies"), "{:?}", parsed.problems[0]);
        assert_eq!(parsed.problems[0].field, "document");
    }

    /// The attack: 14 KB of `- - - …` overflowed the stack (the process aborted).
    #[test]
    fn deep_nesting_is_one_problem_not_a_stack_overflow() {
        for deep in ["- ".repeat(200_000), "[".repeat(200_000), "{a: ".repeat(100_000)] {
            let parsed = parse(&deep);
            assert_eq!(parsed.documents, vec![]);
            assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems);
            let message = &parsed.problems[0].message;
            assert!(message.contains("nest deeper than 64") || message.contains("syntax"), "{message}");
        }
        let parsed = parse(&"- ".repeat(20_000));
        assert!(parsed.problems[0].message.contains("nest deeper than 64 levels"), "{:?}", parsed.problems);
    }

    /// The attack: one long key repeated in the path of every node below it.
    #[test]
    fn long_keys_over_many_nodes_stop_at_the_path_cap() {
        let key = "k".repeat(1 << 20);
        let items = "1, ".repeat(60_000);
        let text = format!("apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\n? {key}\n: [{items}]\n");
        let parsed = parse(&text);
        assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems.first().map(|p| &p.message));
        assert!(parsed.problems[0].message.contains("field paths exceed"), "{}", parsed.problems[0].message);
    }

    #[test]
    fn oversized_text_and_moderate_aliases() {
        let parsed = parse(&" ".repeat(MAX_MANIFEST_BYTES + 1));
        assert!(parsed.problems[0].message.contains("at most"), "{:?}", parsed.problems);
        // An anchor used a few times, as people write shared lists, still parses.
        let text = SERVER
            .replace("  allowedTools: [\"read_*\"]\n", "  allowedTools: &tools [\"read_*\"]\n  deniedTools: *tools\n");
        let parsed = parse(&text);
        assert_eq!(parsed.problems, vec![]);
        let Object::Server(s) = &parsed.documents[0].object else { panic!("a server") };
        assert_eq!(s.spec.denied_tools, ["read_*"]);
    }

    /// The attack: one document just under every cap (a 13 kB anchored string aliased 2,500
    /// times), repeated in one file, held a copy per document: 1 MB of text took 1.42 GiB.
    #[test]
    fn a_document_under_the_caps_repeated_in_one_file_is_one_problem() {
        let value = "x".repeat(13_000);
        let aliases = "*v, ".repeat(2_500);
        let document = format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: x}}\nv: &v {value}\nw: [{aliases}]\n"
        );
        assert!(parse(&document).problems.iter().all(|p| !p.message.contains("aliases count as copies")));
        let file = vec![document; 40].join("---\n");
        assert!(file.len() < 1 << 20, "{}", file.len());
        let parsed = parse(&file);
        assert_eq!(parsed.documents, vec![]);
        let over = parsed.problems.iter().filter(|p| p.message.contains("the file's values exceed")).count();
        assert_eq!(over, 1, "{:?}", parsed.problems.iter().map(|p| &p.message).collect::<Vec<_>>());
    }

    /// A sequence item's path is indexed after its node is spent: the last one of a file was
    /// never checked against the budget.
    #[test]
    fn the_last_path_of_a_file_counts_against_its_budget() {
        let within = |path_bytes| Budget { path_bytes, ..Budget::FILE };
        // `x` as a key, `x` again as the sequence's frame, `x[0]`, `x[1]`.
        let (parsed, spent) = parse_within("x: [a, b]", within(10));
        assert_eq!(spent.path_bytes, 10);
        assert!(parsed.problems.iter().all(|p| !p.message.contains("field paths")), "{:?}", parsed.problems);
        let (parsed, _) = parse_within("x: [a, b]", within(9));
        assert_eq!(parsed.problems.len(), 1);
        assert!(parsed.problems[0].message.contains("field paths exceed 9 bytes"), "{:?}", parsed.problems);
    }

    #[test]
    fn a_nul_byte_does_not_hide_the_rest_of_a_file() {
        let text = format!("{SERVER}\0---\n{}", SERVER.replace("name: fs", "name: hidden"));
        let parsed = parse(&text);
        assert_eq!(parsed.documents.len(), 0);
        assert_eq!(parsed.problems.len(), 1);
        assert_eq!(parsed.problems[0].line, 11);
        assert!(parsed.problems[0].message.contains("NUL byte"), "{:?}", parsed.problems);
    }

    #[test]
    fn status_in_a_manifest_is_ignored() {
        let parsed = parse(&format!("{SERVER}status:\n  toolCount: 3\n  unknownThing: 1\n"));
        assert_eq!(parsed.problems, vec![]);
    }
}
