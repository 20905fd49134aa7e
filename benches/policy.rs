//! The injected tool list for 50 servers x 20 tools, from a snapshot with cached tool lists
//! (issue target: median <= 50 us): `effective_tool_list_50x20` computes the request's
//! effective set from the profile catalog and collects the (name, tool) list to inject.
//! Run: `cargo bench --bench policy`.
//!
//! Measured alongside, in the same run:
//! - baseline `copy_tool_list`: walking the cached lists and collecting every tool (borrowed)
//!   into a Vec, the least work any injector must do; the policy's cost is a ratio against it;
//! - `compile_profile`: compiling the profile's patterns, done once per snapshot revision;
//! - `catalog`: the server and profile layers applied to the cached lists and every tool named,
//!   done once per revision or tool-list change (what `effective` then shares per request);
//! - `effective_with_request`: a request that narrows by allowlist and denylist and has a
//!   caller-registered tool (patterns compiled per request);
//! - `*_pinned`: the same registry with `spec.pinning` (enforce) on every server and every tool
//!   pinned: the pin check runs when the catalog is built (a digest per tool), so `catalog`
//!   pays for it and `effective` (the per-request path) should not.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use spear::api::manifest::Object;
use spear::api::pinning::{PinnedFields, format_digest};
use spear::api::{McpProfile, McpServer, PinMode};
use spear::policy::effective::ProfileCatalog;
use spear::policy::{CompiledProfile, RequestScope, ServerTools, ToolInfo, ToolList};
use spear::registry::snapshot::{Entry, Snapshot};
use spear::testing::fixtures::NO_ARGS;

const SERVERS: usize = 50;
const TOOLS: usize = 20;

/// The pin `spearlet pin` writes for a tool built as below (`ToolInfo::named` + a description).
fn pin_of(name: &str, description: &str) -> String {
    let schema = serde_json::json!({"type": "object"});
    let fields = PinnedFields {
        name,
        title: None,
        description: Some(description),
        input_schema: &schema,
        output_schema: None,
        annotations: None,
    };
    format_digest(&fields.digest())
}

fn fixture(pinned: bool) -> (Snapshot, BTreeMap<String, ServerTools>) {
    let mut entries = Vec::new();
    let mut lists = BTreeMap::new();
    let ids: Vec<String> = (0..SERVERS).map(|i| format!("server-{i:02}")).collect();
    for id in &ids {
        let mut server = McpServer::test(id)
            .stdio("server", NO_ARGS)
            .allowing(["read_*", "list_*", "search", "get_*"])
            .denying(["*_secret"]);
        if pinned {
            let pins: Vec<(String, String)> = (0..TOOLS)
                .map(|t| {
                    let name = format!("{}_thing_{t}", ["read", "list", "get", "write"][t % 4]);
                    let pin = pin_of(&name, &format!("Does thing {t}"));
                    (name, pin)
                })
                .collect();
            server = server.pinning(PinMode::Enforce, pins.iter().map(|(n, p)| (n.as_str(), p.clone())));
        }
        entries.push(Entry::local(format!("{id}.yaml"), 1, Object::Server(server)));
        let tools = (0..TOOLS)
            .map(|t| {
                let prefix = ["read", "list", "get", "write"][t % 4];
                let mut info = ToolInfo::named(&format!("{prefix}_thing_{t}"));
                info.description = Some(format!("Does thing {t}").into());
                info
            })
            .collect();
        lists.insert(id.clone(), ServerTools::Listed(Arc::new(ToolList::new(id, tools))));
    }
    let profile = McpProfile::test("bench")
        .servers(&ids)
        .tool_allowlist(["read_*", "list_*", "get_*", "*/search"])
        .tool_denylist(["*delete*"]);
    entries.push(Entry::local("profile.yaml", 1, Object::Profile(profile)));
    (Snapshot::build(entries, Vec::new()), lists)
}

/// A request's effective set and the injected list itself: every exposed tool's name and
/// definition, borrowed as a request builder serializes them (the baseline borrows the same way).
fn injected_list(catalog: &Arc<ProfileCatalog>) {
    let set = catalog.effective(None, &[]).expect("effective set");
    let tools: Vec<_> = set.tools().map(|(_, t)| (&t.name, &t.tool)).collect();
    black_box(&tools);
    drop(tools);
    black_box(set);
}

fn bench(c: &mut Criterion) {
    let (snapshot, lists) = fixture(false);
    let compiled = CompiledProfile::compile(&snapshot, "bench").expect("profile compiles");
    let lookup = |id: &str| lists.get(id).cloned().unwrap_or(ServerTools::Unknown);
    let catalog = compiled.catalog(lookup);
    let set = catalog.effective(None, &[]).expect("effective set");
    assert_eq!(set.tools().count(), SERVERS * TOOLS * 3 / 4, "3 of 4 tool prefixes are allowed");

    c.bench_function("copy_tool_list (baseline)", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(SERVERS * TOOLS);
            for list in lists.values() {
                if let ServerTools::Listed(list) = list {
                    out.extend(list.tools().iter().map(|(t, name)| (name, t)));
                }
            }
            black_box(out)
        })
    });
    c.bench_function("effective_tool_list_50x20", |b| b.iter(|| injected_list(&catalog)));
    let request = RequestScope {
        tool_allowlist: Some(vec!["read_*".into(), "get_*".into()]),
        tool_denylist: vec!["*_1?".into()],
        ..Default::default()
    };
    let caller = ["mcp__server-00__read_thing_0"];
    c.bench_function("effective_with_request_50x20", |b| {
        b.iter(|| {
            let set = catalog.effective(Some(&request), &caller).expect("effective set");
            let tools: Vec<_> = set.tools().map(|(_, t)| (&t.name, &t.tool)).collect();
            black_box(&tools);
            drop(tools);
            black_box(set)
        })
    });
    c.bench_function("catalog_50x20", |b| b.iter(|| black_box(compiled.catalog(lookup))));
    c.bench_function("compile_profile_50_servers", |b| {
        b.iter(|| black_box(CompiledProfile::compile(&snapshot, "bench").expect("compiles")))
    });

    let (pinned_snapshot, _) = fixture(true);
    let pinned = CompiledProfile::compile(&pinned_snapshot, "bench").expect("profile compiles");
    let pinned_catalog = pinned.catalog(lookup);
    let pinned_set = pinned_catalog.effective(None, &[]).expect("effective set");
    assert_eq!(pinned_set.tools().count(), set.tools().count(), "every pinned tool matches its pin");
    c.bench_function("effective_tool_list_50x20_pinned", |b| b.iter(|| injected_list(&pinned_catalog)));
    c.bench_function("catalog_50x20_pinned", |b| b.iter(|| black_box(pinned.catalog(lookup))));
}

criterion_group!(benches, bench);
criterion_main!(benches);
