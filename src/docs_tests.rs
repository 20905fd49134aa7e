//! The prose names what exists: every code name in backticks in `docs/`, `CONTRIBUTING.md` and
//! the module READMEs that looks like a Rust item or a file must be found in the tree, so a
//! rename that forgets the docs fails here instead of misleading the next reader.
//!
//! What counts as a code name (anything else in backticks, such as commands, YAML and flags, is
//! left alone):
//! - `some/file.rs` or `dir/`: the file or directory exists under `src/` or the repository root;
//! - `file.rs:name`: that file exists and `name` is defined in it (an item, a method, a field, a
//!   variant, a constant);
//! - `Type::item`, `module::item`: each segment is defined in the crate, its tests or benches
//!   (paths into other crates, such as `rmcp::...` or `std::...`, are skipped);
//! - a bare `snake_case_name`, `name()` or `CamelCaseName`: the word appears somewhere in the
//!   tree (code, chart, scripts, tests), so metric, label and resource names pass and stale
//!   identifiers fail.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Where the prose lives.
const DOCS: &[&str] = &["docs", "CONTRIBUTING.md", "src/agent/README.md", "src/bridge/README.md", "src/mcp/README.md"];
/// Where a bare word may be found.
const CORPUS: &[&str] = &[
    "src",
    "tests",
    "hack",
    "charts",
    "proto",
    "e2e",
    "fuzz",
    "examples",
    "benches",
    "crds",
    "Cargo.toml",
    ".ci",
    "clippy.toml",
];
/// Where Rust items are defined: the crate, and the tests and benches a doc may name.
const RUST: &[&str] = &["src", "tests", "benches", "e2e", "fuzz/fuzz_targets"];
/// First segments that name no item of this tree: primitive and prelude types (crate names
/// come from Cargo.toml).
const EXTERNAL: &[&str] = &[
    "std",
    "core",
    "alloc",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "f32",
    "f64",
    "str",
    "bool",
    "char",
    "String",
    "Vec",
    "Option",
    "Result",
    "Box",
    "Arc",
    "agentgateway",
    "linkerd2",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(path: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else { return };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.file_name().is_some_and(|n| n == "target" || n == "corpus" || n == "node_modules") {
                continue;
            }
            files(&p, keep, out);
        }
    } else if keep(path) {
        out.push(path.to_path_buf());
    }
}

/// Every name a Rust file defines: items, impl and trait members, fields, variants, modules.
#[derive(Default)]
struct Definitions(BTreeSet<String>);

impl<'ast> Visit<'ast> for Definitions {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let ident = match item {
            syn::Item::Const(i) => Some(&i.ident),
            syn::Item::Enum(i) => Some(&i.ident),
            syn::Item::Fn(i) => Some(&i.sig.ident),
            syn::Item::Macro(i) => i.ident.as_ref(),
            syn::Item::Mod(i) => Some(&i.ident),
            syn::Item::Static(i) => Some(&i.ident),
            syn::Item::Struct(i) => Some(&i.ident),
            syn::Item::Trait(i) => Some(&i.ident),
            syn::Item::Type(i) => Some(&i.ident),
            _ => None,
        };
        if let Some(ident) = ident {
            self.0.insert(ident.to_string());
        }
        syn::visit::visit_item(self, item);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.0.insert(f.sig.ident.to_string());
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_impl_item_const(&mut self, c: &'ast syn::ImplItemConst) {
        self.0.insert(c.ident.to_string());
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        self.0.insert(f.sig.ident.to_string());
        syn::visit::visit_trait_item_fn(self, f);
    }
    fn visit_field(&mut self, f: &'ast syn::Field) {
        if let Some(ident) = &f.ident {
            self.0.insert(ident.to_string());
        }
    }
    fn visit_variant(&mut self, v: &'ast syn::Variant) {
        self.0.insert(v.ident.to_string());
        syn::visit::visit_variant(self, v);
    }
}

fn definitions_of(file: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut found = Definitions::default();
    if let Ok(parsed) = syn::parse_file(&text) {
        found.visit_file(&parsed);
    }
    // A file defines its module too.
    if let Some(stem) = file.file_stem().and_then(|s| s.to_str()) {
        found.0.insert(stem.to_string());
    }
    found.0
}

/// The tree a check runs against.
struct Tree {
    root: PathBuf,
    rust: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    defined: BTreeSet<String>,
    corpus: String,
    /// Crates a path may start with that are not this one (their names are not checked).
    external: BTreeSet<String>,
}

impl Tree {
    fn load(root: &Path) -> Tree {
        let mut rust = Vec::new();
        for place in RUST {
            files(&root.join(place), &|p| p.extension().is_some_and(|e| e == "rs"), &mut rust);
        }
        let defined = rust.iter().flat_map(|f| definitions_of(f)).collect();
        let mut dirs: Vec<PathBuf> = rust.iter().filter_map(|f| f.parent().map(Path::to_path_buf)).collect();
        dirs.sort();
        dirs.dedup();
        let mut corpus_files = Vec::new();
        for place in CORPUS {
            files(&root.join(place), &|p| p.extension().is_none_or(|e| e != "md"), &mut corpus_files);
        }
        // This file names stale words on purpose (its self-test): not evidence that they exist.
        corpus_files.retain(|f| !f.ends_with("src/docs_tests.rs"));
        let corpus = corpus_files.iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect::<Vec<_>>().join("\n");
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
        let mut external: BTreeSet<String> = EXTERNAL.iter().map(|s| s.to_string()).collect();
        if let Ok(manifest) = manifest.parse::<toml::Table>() {
            for (table, deps) in &manifest {
                if table.ends_with("dependencies")
                    && let Some(deps) = deps.as_table()
                {
                    external.extend(deps.keys().map(|name| name.replace('-', "_")));
                }
            }
        }
        Tree { root: root.to_path_buf(), rust, dirs, defined, corpus, external }
    }

    fn file(&self, name: &str) -> Option<PathBuf> {
        for base in [self.root.join("src"), self.root.clone()] {
            let path = base.join(name.trim_end_matches('/'));
            if path.exists() {
                return Some(path);
            }
        }
        let suffix = format!("/{}", name.trim_start_matches("src/").trim_end_matches('/'));
        let ends = |f: &&PathBuf| f.to_string_lossy().ends_with(&suffix);
        self.rust.iter().find(ends).or_else(|| self.dirs.iter().find(ends)).cloned()
    }

    /// What is wrong with the code name `span`, if it is one.
    fn check(&self, span: &str) -> Option<String> {
        let is_ident = |s: &str| {
            !s.is_empty()
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !s.starts_with(|c: char| c.is_ascii_digit())
        };
        if let Some((file, name)) = span.split_once(".rs:") {
            let file = format!("{file}.rs");
            let name = name.split("::").last().unwrap_or(name).trim_end_matches("()");
            if !is_ident(file.trim_end_matches(".rs").rsplit('/').next().unwrap_or_default()) || !is_ident(name) {
                return None;
            }
            return match self.file(&file) {
                None => Some(format!("`{span}`: no file {file}")),
                Some(path) if !definitions_of(&path).contains(name) => {
                    Some(format!("`{span}`: {} defines no `{name}`", path.display()))
                }
                Some(_) => None,
            };
        }
        let first = span.split(['/', ':']).next().unwrap_or_default();
        if (span.ends_with(".rs") || (span.ends_with('/') && span.contains('/')))
            && span.chars().all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
            && !span.starts_with("../")
            && !self.external.contains(first)
        {
            return self.file(span).is_none().then(|| format!("`{span}`: no such file or directory"));
        }
        let path = span.trim_end_matches("()");
        if path.contains("::") {
            let segments: Vec<&str> = path.split("::").collect();
            if !segments.iter().all(|s| is_ident(s)) || self.external.contains(segments[0]) {
                return None;
            }
            let checked = segments.iter().filter(|s| !matches!(**s, "crate" | "spear" | "super" | "self"));
            let missing: Vec<&&str> = checked.filter(|s| !self.defined.contains(**s)).collect();
            return (!missing.is_empty()).then(|| format!("`{span}`: nothing in src/ defines {missing:?}"));
        }
        let span = path;
        let snake = is_ident(span) && span.contains('_') && span.chars().all(|c| !c.is_ascii_uppercase());
        let camel = is_ident(span)
            && span.starts_with(|c: char| c.is_ascii_uppercase())
            && span.chars().any(|c| c.is_ascii_lowercase())
            && span.chars().skip(1).any(|c| c.is_ascii_uppercase());
        if snake || camel {
            let stem =
                ["_total", "_bucket", "_sum", "_count"].iter().fold(span, |s, suffix| s.trim_end_matches(suffix));
            return (!self.corpus.contains(stem)).then(|| format!("`{span}`: appears nowhere in the tree"));
        }
        None
    }
}

/// Code names in backticks in `text` (inline code only; fenced blocks are skipped).
fn code_spans(text: &str) -> Vec<(usize, String)> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            spans.push((number + 1, code.trim().to_string()));
        }
    }
    spans
}

fn problems(tree: &Tree, docs: &[PathBuf]) -> Vec<String> {
    let mut found = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(doc).unwrap_or_default();
        for (line, span) in code_spans(&text) {
            if let Some(problem) = tree.check(&span) {
                found.push(format!("{}:{line}: {problem}", doc.strip_prefix(&tree.root).unwrap_or(doc).display()));
            }
        }
    }
    found
}

#[test]
fn every_code_name_in_the_docs_exists() {
    let root = repo();
    let tree = Tree::load(&root);
    let mut docs = Vec::new();
    for place in DOCS {
        files(&root.join(place), &|p| p.extension().is_some_and(|e| e == "md"), &mut docs);
    }
    assert!(docs.len() >= 5, "the docs were not found: {docs:?}");
    let found = problems(&tree, &docs);
    assert!(found.is_empty(), "names in the docs that the tree does not have:\n{}", found.join("\n"));
}

/// The check fails on a rename: the names the docs once kept after the code moved on.
#[test]
fn a_renamed_item_or_file_is_reported() {
    let tree = Tree::load(&repo());
    for stale in [
        "agent/mcp_endpoint.rs:error_result",
        "connect.rs:TraceHeaders",
        "src/agent/gone.rs",
        "Pool::call_tool_everywhere",
        "never_defined_fn()",
        "error_result_of_the_past",
        "TraceHeadersOfThePast",
    ] {
        assert!(tree.check(stale).is_some(), "{stale} passed");
    }
    for fine in [
        "core.rs:Agent",
        "Pool::apply",
        "src/mcp/",
        "rmcp::transport::common::http_header::HEADER_SESSION_ID",
        "mcp_audit_dropped_lines_total",
        "McpServer",
        "kubectl apply -f x.yaml",
    ] {
        assert_eq!(tree.check(fine), None, "{fine}");
    }
}
