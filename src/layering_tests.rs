//! The pure modules stay pure: `api`, `policy` and `registry::snapshot` (with the pure helpers
//! they use) import no I/O crate and name no I/O path, so they can be reasoned about, tested and
//! fuzzed without a network, a cluster or a file system. Checked on the source with `syn`: every
//! `use` tree and every path in code, including grouped imports such as `use std::{fs, io}`.
//!
//! The layering's nevers hold too: [`NEVERS`] lists what each part never imports, and no
//! production file of that part names `crate::<it>`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::visit::Visit;

/// Files that must stay pure, relative to `src/`: whole directories or single files.
const PURE: &[&str] = &[
    "api",
    "policy",
    "registry/snapshot.rs",
    "registry/describe.rs",
    "mcp/arguments.rs",
    "mcp/oauth",
    "secrets",
    "trust/bundle.rs",
];

/// Path prefixes that do I/O. `kube::core` (types, selectors) and `kube::CustomResource` (the
/// derive) are allowed: they are data.
const FORBIDDEN: &[&[&str]] = &[
    &["kube", "Client"],
    &["kube", "Api"],
    &["kube", "api"],
    &["kube", "client"],
    &["kube", "runtime"],
    &["kube", "config"],
    &["kube_runtime"],
    &["tokio", "net"],
    &["tokio", "fs"],
    &["tokio", "process"],
    &["std", "fs"],
    &["std", "net"],
    &["std", "process"],
    &["axum"],
    &["tonic"],
    &["hyper"],
    &["reqwest"],
    &["rmcp", "transport"],
];

fn forbidden(path: &[String]) -> bool {
    let path: Vec<&str> = path.iter().map(String::as_str).filter(|s| *s != "crate" && *s != "::").collect();
    FORBIDDEN.iter().any(|prefix| path.len() >= prefix.len() && path[..prefix.len()] == **prefix)
}

#[derive(Default)]
struct Imports {
    found: Vec<String>,
}

impl Imports {
    fn check(&mut self, path: Vec<String>) {
        if forbidden(&path) {
            self.found.push(path.join("::"));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.check([prefix.clone(), vec![n.ident.to_string()]].concat()),
            syn::UseTree::Rename(r) => self.check([prefix.clone(), vec![r.ident.to_string()]].concat()),
            syn::UseTree::Glob(_) => self.check(prefix.clone()),
            syn::UseTree::Group(g) => g.items.iter().for_each(|item| self.use_tree(prefix, item)),
        }
    }
}

impl<'ast> Visit<'ast> for Imports {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.check(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(path).expect("readable src dir").map(|e| e.expect("entry").path()).collect();
        entries.sort();
        entries.iter().for_each(|entry| rust_files(entry, out));
    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// Unit tests may use the file system (golden files) and fixtures from any part; only the code
/// under test must keep the rules, so `#[cfg(test)]` items and `tests.rs` files are skipped.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.meta.to_token_stream().to_string().contains("test"))
}

/// The production code of `file`: `None` for a `tests.rs` or `*_tests.rs` file, else its items
/// without the `#[cfg(test)]` ones.
fn production_code(file: &Path) -> Option<syn::File> {
    if file.ends_with("tests.rs") || file.to_string_lossy().ends_with("_tests.rs") {
        return None;
    }
    let text = std::fs::read_to_string(file).expect("readable source");
    let mut ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    ast.items.retain(|item| match item {
        syn::Item::Mod(m) => !is_test_only(&m.attrs),
        syn::Item::Fn(f) => !is_test_only(&f.attrs),
        _ => true,
    });
    Some(ast)
}

#[test]
fn pure_modules_import_no_io() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for pure in PURE {
        rust_files(&src.join(pure), &mut files);
    }
    assert!(files.len() > 10, "the pure modules were not found under {}", src.display());
    let mut violations = Vec::new();
    for file in &files {
        let Some(ast) = production_code(file) else { continue };
        let mut imports = Imports::default();
        imports.visit_file(&ast);
        violations.extend(imports.found.into_iter().map(|path| format!("{}: {path}", file.display())));
    }
    assert!(violations.is_empty(), "I/O in a pure module (move it to a shell module):\n{}", violations.join("\n"));
}

/// The parts a never names: a list, or every module of the crate but a few.
enum Parts {
    These(&'static [&'static str]),
    AllBut(&'static [&'static str]),
}

/// A never of the layering: no file of `from` names `crate::<to>` outside its tests.
struct Never {
    from: &'static [&'static str],
    to: Parts,
    why: &'static str,
}

/// The nevers of `docs/architecture.md`'s layering, each once, with its reason. The libraries do
/// not reach up into the parts that serve them, and the registry, the operator and the agent
/// share names through `api` only. [`not_imported`] derives the per-module table from this list.
const NEVERS: &[Never] = &[
    Never {
        from: &["registry", "mcp"],
        to: Parts::These(&["agent", "cli", "operator", "chat"]),
        why: "a library does not reach up into the parts that serve it",
    },
    Never {
        from: &["chat", "operator"],
        to: Parts::These(&["agent", "cli"]),
        why: "chat is driven by the agent, the operator by the cli",
    },
    Never { from: &["chat"], to: Parts::These(&["operator"]), why: "chat and the operator share nothing" },
    Never { from: &["operator"], to: Parts::These(&["chat"]), why: "chat and the operator share nothing" },
    Never { from: &["chat"], to: Parts::These(&["registry"]), why: "chat sees effective sets, never snapshots" },
    Never {
        from: &["policy"],
        to: Parts::These(&["agent", "cli", "operator", "chat", "mcp"]),
        why: "policy decides over resources and snapshots only",
    },
    Never { from: &["agent"], to: Parts::These(&["cli"]), why: "the agent is a library the cli runs" },
    Never { from: &["agent"], to: Parts::These(&["operator"]), why: "the agent and the operator meet in api only" },
    Never { from: &["api"], to: Parts::AllBut(&[]), why: "api defines; it imports nothing of the crate" },
    Never {
        from: &["bridge"],
        to: Parts::AllBut(&["child"]),
        why: "the bridge turns a process into a socket and knows no resource",
    },
];

/// The crate's top-level modules, from `src/lib.rs`.
fn crate_modules(src: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(src.join("lib.rs")).expect("readable lib.rs");
    let ast = syn::parse_file(&text).expect("lib.rs parses");
    ast.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(m) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// Module → the modules it must not use (with why), from [`NEVERS`].
fn not_imported(modules: &[String]) -> BTreeMap<&'static str, BTreeMap<String, &'static str>> {
    let mut table: BTreeMap<&'static str, BTreeMap<String, &'static str>> = BTreeMap::new();
    for never in NEVERS {
        for from in never.from {
            let to: Vec<String> = match &never.to {
                Parts::These(parts) => parts.iter().map(|p| p.to_string()).collect(),
                Parts::AllBut(kept) => {
                    modules.iter().filter(|m| m != from && !kept.contains(&m.as_str())).cloned().collect()
                }
            };
            let row = table.entry(from).or_default();
            row.extend(to.into_iter().map(|to| (to, never.why)));
        }
    }
    table
}

#[derive(Default)]
struct CrateUses {
    found: Vec<String>,
}

impl<'ast> Visit<'ast> for CrateUses {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if let syn::UseTree::Path(p) = &item.tree
            && p.ident == "crate"
            && let syn::UseTree::Path(module) = &*p.tree
        {
            self.found.push(module.ident.to_string());
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let mut segments = path.segments.iter().map(|s| s.ident.to_string());
        if segments.next().as_deref() == Some("crate")
            && let Some(module) = segments.next()
        {
            self.found.push(module);
        }
        syn::visit::visit_path(self, path);
    }
}

#[test]
fn libraries_do_not_import_the_parts_above_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = crate_modules(&src);
    let table = not_imported(&modules);
    assert!(table.values().flat_map(BTreeMap::keys).all(|m| modules.contains(m)), "a never names no module");
    let mut violations = Vec::new();
    for (module, forbidden) in &table {
        let mut files = Vec::new();
        rust_files(&src.join(module), &mut files);
        rust_files(&src.join(format!("{module}.rs")), &mut files);
        assert!(!files.is_empty(), "module {module} not found");
        for file in &files {
            let Some(ast) = production_code(file) else { continue };
            let mut uses = CrateUses::default();
            uses.visit_file(&ast);
            for used in &uses.found {
                if let Some(why) = forbidden.get(used) {
                    violations.push(format!("{}: crate::{used} ({why})", file.display()));
                }
            }
        }
    }
    violations.sort();
    violations.dedup();
    assert!(violations.is_empty(), "a module imports a part above it:\n{}", violations.join("\n"));
}

#[test]
fn the_nevers_cover_the_layering_rows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let table = not_imported(&crate_modules(&src));
    let row = |module: &str| table.get(module).map(|row| row.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!(row("agent"), ["cli", "operator"]);
    assert!(row("api").contains(&"registry".to_string()) && !row("api").contains(&"api".to_string()));
    assert!(row("bridge").contains(&"api".to_string()) && !row("bridge").contains(&"child".to_string()));
    assert_eq!(row("chat"), ["agent", "cli", "operator", "registry"]);
}

#[test]
fn the_check_sees_grouped_and_inline_io() {
    let ast = syn::parse_file(
        "use std::{fs, io::Read}; use kube::{core::Selector, Client}; fn f() { std::net::TcpStream::connect(\"x\"); }",
    )
    .expect("parses");
    let mut imports = Imports::default();
    imports.visit_file(&ast);
    assert_eq!(imports.found, ["std::fs", "kube::Client", "std::net::TcpStream::connect"]);
}
