//! Immutable registry snapshots and the pure per-source index that builds them.
//!
//! ```text
//! source file ──api::manifest::parse──▶ Parsed ──SourceIndex::apply(file, parsed)──┐
//! file gone ───────────────────────────────────▶ SourceIndex::delete(file) ────────┤
//! directory gone ──────────────────────────────▶ SourceIndex::set_source_problems ─┤
//!                                                                                  ▼
//!              SourceIndex::snapshot() ──▶ Snapshot::build(entries, problems) ──▶ Snapshot
//!                                             │ duplicates: first file by path wins
//!                                             └ revision = hash(sorted (kind, name, resourceVersion))
//! ```
//!
//! Pure: no I/O, no clock. A snapshot's [`Revision`] depends only on the set of objects (kind,
//! name, resourceVersion), so equal sets give equal revisions on every agent and across
//! restarts, and any added, removed or changed object gives a new one. Problems never take part
//! in the revision: a broken file that keeps serving its last good objects leaves the revision
//! alone and only marks the snapshot degraded.
//!
//! Local mode has no API server to hand out resourceVersions, so [`content_version`] derives one
//! from the object's canonical JSON: it changes iff the parsed object changes (whitespace and
//! comments in the YAML do not count). Local mode keys objects by `metadata.name` alone and
//! ignores `metadata.namespace`, as a single-namespace agent does.
//!
//! A file is the unit of atomicity: a file with any problem contributes its last good objects
//! (all of them, as they were), never a half-valid mix of old and new documents.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::api::keys::{KIND_PROFILE, KIND_SERVER};
use crate::api::manifest::{Object, Parsed, Problem};
use crate::api::names::short_hash;
use crate::api::{McpProfile, McpServer};

/// A resourceVersion for an object that has none (local mode): a hash of its canonical JSON.
pub fn content_version(object: &impl Serialize) -> String {
    // An object that cannot be serialized has no content to hash; every such object shares one
    // version, which is still stable. McpServer/McpProfile always serialize.
    let value = serde_json::to_value(object).unwrap_or(Value::Null);
    let canonical = serde_json::to_vec(&canonicalize(value)).unwrap_or_default();
    short_hash(&canonical)
}

/// Rebuilds every map with its keys in sorted order, whatever serde_json's `preserve_order`
/// feature says, so that key order in the source text never changes the hash.
fn canonicalize(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<String, Value> = map.into_iter().map(|(k, v)| (k, canonicalize(v))).collect();
            Value::Object(sorted.into_iter().collect::<Map<String, Value>>())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonicalize).collect()),
        other => other,
    }
}

// === impl Revision ===

/// The revision of a snapshot: a stable hash over its sorted (kind, name, resourceVersion) set.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(String);

impl Revision {
    /// The revision as text (16 lowercase hex characters).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Hashes the sorted `(kind, name, resourceVersion)` triples.
    fn of<'a>(triples: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Self {
        let sorted: BTreeSet<(&str, &str, &str)> = triples.into_iter().collect();
        let mut text = String::new();
        for (kind, name, version) in sorted {
            // NUL and newline cannot occur in kinds, DNS names or resourceVersions, so the
            // encoding is unambiguous.
            text.push_str(kind);
            text.push('\0');
            text.push_str(name);
            text.push('\0');
            text.push_str(version);
            text.push('\n');
        }
        Revision(short_hash(text.as_bytes()))
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// === impl SourceProblem ===

/// A problem a source found, located in the file (or source) it came from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceProblem {
    /// The file (or source name) the problem is in.
    pub file: PathBuf,
    /// 1-based line; 0 when the problem is about the whole file or source.
    pub line: usize,
    /// The field path the problem is about (`spec.stdio.command`, `document`, `file`, `directory`).
    pub field: String,
    pub message: String,
    pub(crate) fix: String,
}

impl SourceProblem {
    /// A manifest problem, placed in `file`.
    pub(crate) fn in_file(file: &Path, problem: Problem) -> Self {
        let Problem { line, field, message, fix } = problem;
        SourceProblem { file: file.to_path_buf(), line, field, message, fix }
    }
}

impl fmt::Display for SourceProblem {
    /// `file:line: field: message (fix)`; the line is left out when it is 0 (whole file).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        write!(f, ": {}: {} ({})", self.field, self.message, self.fix)
    }
}

// === impl Entry ===

/// An object with its resourceVersion, shared between snapshots.
#[derive(Debug, PartialEq)]
pub struct Versioned<T> {
    /// `metadata.resourceVersion` from the API server, or [`content_version`] in local mode.
    pub resource_version: String,
    pub object: Arc<T>,
}

// Manual impl: cloning shares the object, so `T` need not be `Clone`.
impl<T> Clone for Versioned<T> {
    fn clone(&self) -> Self {
        Versioned { resource_version: self.resource_version.clone(), object: Arc::clone(&self.object) }
    }
}

/// A versioned object of either kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Server(Versioned<McpServer>),
    Profile(Versioned<McpProfile>),
}

impl Item {
    /// The object's kind.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Item::Server(_) => KIND_SERVER,
            Item::Profile(_) => KIND_PROFILE,
        }
    }

    /// The object's `metadata.name`.
    pub(crate) fn name(&self) -> &str {
        let name = match self {
            Item::Server(s) => &s.object.metadata.name,
            Item::Profile(p) => &p.object.metadata.name,
        };
        name.as_deref().unwrap_or_default()
    }
}

/// One object as a source read it: where it came from and its version.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The file (or source name) the object came from; duplicates keep the first by this path.
    pub(crate) file: PathBuf,
    /// 1-based line of the object's document (0 when the source has no lines).
    pub(crate) line: usize,
    pub(crate) item: Item,
}

impl Entry {
    /// An object with a resourceVersion given by its source (the API server).
    pub(crate) fn new(file: impl Into<PathBuf>, line: usize, resource_version: String, object: Object) -> Self {
        let item = match object {
            Object::Server(s) => Item::Server(Versioned { resource_version, object: Arc::new(s) }),
            Object::Profile(p) => Item::Profile(Versioned { resource_version, object: Arc::new(p) }),
        };
        Entry { file: file.into(), line, item }
    }

    /// A local-mode object: its resourceVersion is its [`content_version`].
    pub fn local(file: impl Into<PathBuf>, line: usize, object: Object) -> Self {
        let version = match &object {
            Object::Server(s) => content_version(s),
            Object::Profile(p) => content_version(p),
        };
        Entry::new(file, line, version, object)
    }
}

// === impl Snapshot ===

/// What the registry holds at one moment: immutable, shared behind an `Arc`.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    revision: Revision,
    servers: BTreeMap<String, Versioned<McpServer>>,
    profiles: BTreeMap<String, Versioned<McpProfile>>,
    problems: Vec<SourceProblem>,
}

impl Default for Snapshot {
    /// The empty registry (with the empty set's revision).
    fn default() -> Self {
        Snapshot::build(Vec::new(), Vec::new())
    }
}

impl Snapshot {
    /// Builds a snapshot. Of two objects with the same kind and name, the one from the file that
    /// sorts first by path (then by line) is kept and the other is reported on `metadata.name`.
    pub fn build(entries: impl IntoIterator<Item = Entry>, problems: Vec<SourceProblem>) -> Self {
        let mut entries: Vec<Entry> = entries.into_iter().collect();
        entries.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        let mut problems = problems;
        let mut servers = BTreeMap::new();
        let mut profiles = BTreeMap::new();
        let mut first_seen: BTreeMap<(&'static str, String), (PathBuf, usize)> = BTreeMap::new();
        for Entry { file, line, item } in entries {
            let key = (item.kind(), item.name().to_string());
            if let Some((kept_file, kept_line)) = first_seen.get(&key) {
                problems.push(SourceProblem {
                    file,
                    line,
                    field: "metadata.name".into(),
                    message: format!(
                        "{} '{}' is already defined at {}:{}; this definition is ignored",
                        key.0,
                        key.1,
                        kept_file.display(),
                        kept_line
                    ),
                    fix: "give each object a unique metadata.name, or remove the duplicate".into(),
                });
                continue;
            }
            first_seen.insert(key.clone(), (file, line));
            match item {
                Item::Server(s) => {
                    servers.insert(key.1, s);
                }
                Item::Profile(p) => {
                    profiles.insert(key.1, p);
                }
            }
        }
        problems.sort();
        problems.dedup();
        let revision = Revision::of(
            servers
                .iter()
                .map(|(name, s)| (KIND_SERVER, name.as_str(), s.resource_version.as_str()))
                .chain(profiles.iter().map(|(name, p)| (KIND_PROFILE, name.as_str(), p.resource_version.as_str()))),
        );
        Snapshot { revision, servers, profiles, problems }
    }

    /// The revision: changes iff some object was added, removed or changed.
    pub fn revision(&self) -> &Revision {
        &self.revision
    }

    /// Servers by `metadata.name`.
    pub fn servers(&self) -> &BTreeMap<String, Versioned<McpServer>> {
        &self.servers
    }

    /// Profiles by `metadata.name`.
    pub fn profiles(&self) -> &BTreeMap<String, Versioned<McpProfile>> {
        &self.profiles
    }

    pub fn server(&self, name: &str) -> Option<&Versioned<McpServer>> {
        self.servers.get(name)
    }

    pub fn profile(&self, name: &str) -> Option<&Versioned<McpProfile>> {
        self.profiles.get(name)
    }

    /// Problems the source found, sorted by file and line.
    pub fn problems(&self) -> &[SourceProblem] {
        &self.problems
    }

    /// Whether some input could not be used (the snapshot may be serving stale objects).
    pub fn is_degraded(&self) -> bool {
        !self.problems.is_empty()
    }

    /// What changed from `self` to `newer`: objects added or changed (by resourceVersion), and
    /// objects removed, each as `(kind, name)` in sorted order.
    pub(crate) fn changes(&self, newer: &Snapshot) -> Changes {
        fn diff<T>(
            kind: &'static str,
            old: &BTreeMap<String, Versioned<T>>,
            new: &BTreeMap<String, Versioned<T>>,
            out: &mut Changes,
        ) {
            for (name, v) in new {
                if old.get(name).is_none_or(|o| o.resource_version != v.resource_version) {
                    out.upserts.push((kind, name.clone()));
                }
            }
            out.deletes.extend(old.keys().filter(|n| !new.contains_key(*n)).map(|n| (kind, n.clone())));
        }
        let mut out = Changes::default();
        diff(KIND_SERVER, &self.servers, &newer.servers, &mut out);
        diff(KIND_PROFILE, &self.profiles, &newer.profiles, &mut out);
        out
    }
}

/// The difference between two snapshots, by `(kind, name)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Objects added or changed.
    pub(crate) upserts: Vec<(&'static str, String)>,
    /// Objects removed.
    pub(crate) deletes: Vec<(&'static str, String)>,
}

impl Changes {
    #[cfg(test)]
    /// Whether nothing changed.
    pub(crate) fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }
}

// === impl SourceIndex ===

/// What one file currently contributes.
#[derive(Clone, Debug, Default, PartialEq)]
struct FileState {
    /// The objects of the file's last read without problems, if it ever had one.
    last_good: Option<Vec<Entry>>,
    /// The problems of the file's latest read.
    problems: Vec<SourceProblem>,
}

/// Per-file state of a file-based source (pure): the last good objects and the current problems
/// of each file, plus problems about the source itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceIndex {
    files: BTreeMap<PathBuf, FileState>,
    source_problems: Vec<SourceProblem>,
}

impl SourceIndex {
    /// Records a fresh read of `file`: without problems its objects replace the file's; with any
    /// problem the file keeps its last good objects and reports the problems.
    pub(crate) fn apply(&mut self, file: &Path, parsed: Parsed) {
        let state = self.files.entry(file.to_path_buf()).or_default();
        if parsed.problems.is_empty() {
            let entries = parsed.documents.into_iter().map(|d| Entry::local(file, d.line, d.object)).collect();
            *state = FileState { last_good: Some(entries), problems: Vec::new() };
        } else {
            state.problems = parsed.problems.into_iter().map(|p| SourceProblem::in_file(file, p)).collect();
        }
    }

    /// Records that `file` could not be read; it keeps its last good objects.
    pub(crate) fn fail(&mut self, file: &Path, problem: SourceProblem) {
        self.files.entry(file.to_path_buf()).or_default().problems = vec![problem];
    }

    /// Forgets `file`: its objects and problems go away.
    pub(crate) fn delete(&mut self, file: &Path) {
        self.files.remove(file);
    }

    /// Replaces the problems about the source itself (for example, its directory is missing).
    pub(crate) fn set_source_problems(&mut self, problems: Vec<SourceProblem>) {
        self.source_problems = problems;
    }

    /// The files the index knows, sorted.
    pub(crate) fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.keys().map(PathBuf::as_path)
    }

    /// The snapshot of everything the files currently contribute.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let entries = self.files.values().filter_map(|f| f.last_good.as_ref()).flatten().cloned();
        let problems =
            self.source_problems.iter().chain(self.files.values().flat_map(|f| f.problems.iter())).cloned().collect();
        Snapshot::build(entries, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::manifest::parse;

    fn server_yaml(name: &str, command: &str) -> String {
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: {name}\nspec:\n  transport: stdio\n  stdio:\n    command: {command}\n"
        )
    }

    fn profile_yaml(name: &str) -> String {
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: {name}\nspec:\n  servers: [fs]\n"
        )
    }

    fn parsed(text: &str) -> Parsed {
        let parsed = parse(text);
        assert!(parsed.is_valid() || text.contains("BROKEN"), "{:?}", parsed.problems);
        parsed
    }

    fn index(files: &[(&str, &str)]) -> SourceIndex {
        let mut index = SourceIndex::default();
        for (file, text) in files {
            index.apply(Path::new(file), parsed(text));
        }
        index
    }

    #[test]
    fn equal_object_sets_give_equal_revisions_whatever_the_files() {
        let one = index(&[("a.yaml", &format!("{}---\n{}", server_yaml("fs", "node"), profile_yaml("p")))]).snapshot();
        let two = index(&[("z.yaml", &profile_yaml("p")), ("b.yaml", &server_yaml("fs", "node"))]).snapshot();
        assert_eq!(one.revision(), two.revision());
        assert_eq!(one.revision().as_str().len(), 16);
        assert!(one.revision().as_str().chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn whitespace_comments_and_key_order_do_not_change_the_revision() {
        let plain = index(&[("a.yaml", &server_yaml("fs", "node"))]).snapshot();
        let noisy = "# a comment\napiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nspec:\n  stdio: {command: node}\n\n  transport: stdio   # trailing\nmetadata: {name: fs}\n";
        let noisy = index(&[("a.yaml", noisy)]).snapshot();
        assert_eq!(plain.revision(), noisy.revision());
        assert_eq!(plain.server("fs"), noisy.server("fs"));
    }

    #[test]
    fn any_added_removed_or_changed_object_changes_the_revision() {
        let base = index(&[("a.yaml", &server_yaml("fs", "node"))]).snapshot();
        let changed = index(&[("a.yaml", &server_yaml("fs", "python"))]).snapshot();
        let added =
            index(&[("a.yaml", &server_yaml("fs", "node")), ("b.yaml", &server_yaml("git", "node"))]).snapshot();
        let renamed = index(&[("a.yaml", &server_yaml("fs2", "node"))]).snapshot();
        let empty = SourceIndex::default().snapshot();
        let revisions: BTreeSet<&Revision> =
            [&base, &changed, &added, &renamed, &empty].iter().map(|s| s.revision()).collect();
        assert_eq!(revisions.len(), 5);
        assert_eq!(empty, Snapshot::default());
    }

    #[test]
    fn the_same_name_in_both_kinds_is_not_a_duplicate() {
        let snap =
            index(&[("a.yaml", &format!("{}---\n{}", server_yaml("fs", "node"), profile_yaml("fs")))]).snapshot();
        assert!(!snap.is_degraded(), "{:?}", snap.problems());
        assert!(snap.server("fs").is_some() && snap.profile("fs").is_some());
    }

    #[test]
    fn revision_depends_on_kind_name_and_version_only() {
        let a = Revision::of([("McpServer", "fs", "1"), ("McpProfile", "p", "2")]);
        let b = Revision::of([("McpProfile", "p", "2"), ("McpServer", "fs", "1")]);
        let c = Revision::of([("McpProfile", "fs", "1"), ("McpProfile", "p", "2")]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Stable across builds and machines: a fixed input has a fixed revision.
        assert_eq!(Revision::of([]).to_string(), short_hash(b""));
    }

    #[test]
    fn problems_do_not_take_part_in_the_revision() {
        let good = index(&[("a.yaml", &server_yaml("fs", "node"))]);
        let mut broken = good.clone();
        broken.apply(Path::new("a.yaml"), parse("BROKEN: [\n"));
        let (good, broken) = (good.snapshot(), broken.snapshot());
        assert_eq!(good.revision(), broken.revision());
        assert!(broken.is_degraded() && !good.is_degraded());
        assert_eq!(broken.problems()[0].file, Path::new("a.yaml"));
        assert_eq!(broken.problems()[0].field, "document");
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_objects_until_fixed() {
        let mut idx = index(&[("a.yaml", &server_yaml("fs", "node"))]);
        let good = idx.snapshot();
        idx.apply(Path::new("a.yaml"), parse(&server_yaml("fs", "node").replace("stdio\n", "grpc\n")));
        let broken = idx.snapshot();
        assert_eq!(broken.server("fs"), good.server("fs"));
        assert_eq!(broken.problems()[0].field, "spec.transport");
        assert_eq!(broken.problems()[0].line, 6);
        idx.apply(Path::new("a.yaml"), parsed(&server_yaml("fs", "python")));
        let fixed = idx.snapshot();
        assert!(!fixed.is_degraded());
        assert_ne!(fixed.revision(), good.revision());
    }

    #[test]
    fn a_file_broken_from_the_start_contributes_nothing_not_even_its_valid_documents() {
        let text = format!("{}---\nBROKEN: [\n", server_yaml("fs", "node"));
        let mut idx = SourceIndex::default();
        idx.apply(Path::new("a.yaml"), parse(&text));
        let snap = idx.snapshot();
        assert!(snap.servers().is_empty());
        assert!(snap.is_degraded());
    }

    #[test]
    fn deleting_a_file_removes_its_objects_and_problems() {
        let mut idx = index(&[("a.yaml", &server_yaml("fs", "node")), ("b.yaml", &profile_yaml("p"))]);
        idx.fail(
            Path::new("b.yaml"),
            SourceProblem {
                file: "b.yaml".into(),
                line: 0,
                field: "file".into(),
                message: "m".into(),
                fix: "f".into(),
            },
        );
        assert!(idx.snapshot().is_degraded());
        idx.delete(Path::new("b.yaml"));
        let snap = idx.snapshot();
        assert!(!snap.is_degraded());
        assert!(snap.profiles().is_empty());
        assert_eq!(idx.files().collect::<Vec<_>>(), vec![Path::new("a.yaml")]);
    }

    #[test]
    fn duplicates_keep_the_first_file_by_path_and_report_the_other() {
        let snap =
            index(&[("b.yaml", &server_yaml("fs", "python")), ("a.yaml", &server_yaml("fs", "node"))]).snapshot();
        let kept = snap.server("fs").map(|s| s.object.spec.stdio.as_ref().map(|s| s.command.clone()));
        assert_eq!(kept, Some(Some("node".to_string())));
        assert_eq!(snap.problems().len(), 1);
        let problem = &snap.problems()[0];
        assert_eq!(
            (problem.file.as_path(), problem.line, problem.field.as_str()),
            (Path::new("b.yaml"), 1, "metadata.name")
        );
        assert!(problem.message.contains("a.yaml:1"), "{}", problem.message);
        // The revision is the one of the kept set.
        assert_eq!(snap.revision(), index(&[("a.yaml", &server_yaml("fs", "node"))]).snapshot().revision());
    }

    #[test]
    fn duplicates_within_one_file_keep_the_first_document() {
        let text = format!("{}---\n{}", server_yaml("fs", "node"), server_yaml("fs", "python"));
        let snap = index(&[("a.yaml", &text)]).snapshot();
        assert_eq!(snap.problems().len(), 1);
        assert_eq!(snap.problems()[0].line, 10);
    }

    #[test]
    fn problems_display_file_line_field_message_and_fix() {
        let p = SourceProblem {
            file: "d/a.yaml".into(),
            line: 3,
            field: "spec.x".into(),
            message: "bad".into(),
            fix: "fix it".into(),
        };
        assert_eq!(p.to_string(), "d/a.yaml:3: spec.x: bad (fix it)");
        let whole = SourceProblem { line: 0, ..p };
        assert_eq!(whole.to_string(), "d/a.yaml: spec.x: bad (fix it)");
    }

    #[test]
    fn content_version_changes_iff_the_object_changes() {
        let a = parse(&server_yaml("fs", "node")).documents.remove(0).object;
        let b = parse(&server_yaml("fs", "node")).documents.remove(0).object;
        let c = parse(&server_yaml("fs", "deno")).documents.remove(0).object;
        let (Object::Server(a), Object::Server(b), Object::Server(c)) = (a, b, c) else { panic!("servers") };
        assert_eq!(content_version(&a), content_version(&b));
        assert_ne!(content_version(&a), content_version(&c));
    }

    #[test]
    fn changes_list_upserts_and_deletes_by_kind_and_name() {
        let a = Snapshot::build(
            vec![
                Entry::new("a.yaml", 1, "1".into(), Object::Server(McpServer::test("keep"))),
                Entry::new("a.yaml", 2, "1".into(), Object::Server(McpServer::test("edit"))),
                Entry::new("a.yaml", 3, "1".into(), Object::Server(McpServer::test("gone"))),
            ],
            Vec::new(),
        );
        let b = Snapshot::build(
            vec![
                Entry::new("a.yaml", 1, "1".into(), Object::Server(McpServer::test("keep"))),
                Entry::new("a.yaml", 2, "2".into(), Object::Server(McpServer::test("edit"))),
                Entry::new("a.yaml", 4, "1".into(), Object::Profile(McpProfile::test("new"))),
            ],
            Vec::new(),
        );
        let c = a.changes(&b);
        assert_eq!(c.upserts, [(KIND_SERVER, "edit".to_string()), (KIND_PROFILE, "new".to_string())]);
        assert_eq!(c.deletes, [(KIND_SERVER, "gone".to_string())]);
        assert!(b.changes(&b).is_empty());
    }
}
