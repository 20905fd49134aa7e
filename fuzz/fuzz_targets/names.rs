//! Model-facing tool names and the route table (`src/policy/name.rs`), alone and through the
//! effective set (`src/policy/effective.rs`) of a registry built from the input.
//!
//! Properties (the module header's promises):
//! - every name is `^[a-zA-Z0-9_-]{1,64}$` (what OpenAI-style function names allow);
//! - the mapping is injective: an unshortened name decodes back to its (server part, tool) pair
//!   (parts plain, or `_` + URL-safe base64), for any server part of the plain shape that ids and
//!   `toolNamespace`s have; only 64-character (shortened) names may collide, and `may_collide`
//!   says so; `free_name` never returns a taken name;
//! - in an effective set: names are unique and never one of the caller's own tool names; each
//!   routes to its own (server, tool), also in the dotted form `mcp.<server>.<tool>`; any other
//!   string routes to an exposed tool or nowhere; a caller's tool name never routes (unless
//!   dotted, which the chat loop checks against the caller's tools first).
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spear::fuzzing::{Effective, base_name, free_name, may_collide, name_target};

const IDS: &[&str] = &["fs", "web", "git-hub", "a1"];
const NAMESPACES: &[&str] = &["fs", "web", "Tools_1", "x-y", "git-hub"];

#[derive(Arbitrary, Debug)]
enum Tool {
    Raw(String),
    Long(u8, u8),
    Dotted(String),
}

impl Tool {
    fn text(&self) -> String {
        match self {
            Tool::Raw(s) => s.clone(),
            Tool::Long(c, n) => char::from(b'a' + c % 26).to_string().repeat(usize::from(*n)),
            Tool::Dotted(s) => format!("{s}.{s}"),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Server {
    id: u8,
    namespace: Option<u8>,
    tools: Vec<Tool>,
}

#[derive(Arbitrary, Debug)]
enum Caller {
    Raw(String),
    /// An exposed name taken by the caller's own tool.
    Exposed(u8),
    Dotted(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    pairs: Vec<(String, String)>,
    servers: Vec<Server>,
    callers: Vec<Caller>,
    probes: Vec<String>,
    salt_taken: Vec<String>,
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_plain(part: &str) -> bool {
    !part.is_empty()
        && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !part.contains("__")
        && !part.starts_with('_')
        && !part.ends_with('_')
}

/// `_` + URL-safe base64 without padding, decoded.
fn decode_part(part: &str) -> Option<String> {
    let Some(encoded) = part.strip_prefix('_') else { return is_plain(part).then(|| part.to_string()) };
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for b in encoded.bytes() {
        let v = ALPHABET.iter().position(|&a| a == b)? as u32;
        bits = (bits << 6) | v;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    String::from_utf8(out).ok()
}

fn check_pair(server: &str, tool: &str) {
    let name = base_name(server, tool);
    assert!(valid_name(&name), "{name:?} for ({server:?}, {tool:?})");
    assert_eq!(may_collide(&name), name.len() == 64);
    if !is_plain(server) {
        return;
    }
    if name.len() < 64 {
        let rest = name.strip_prefix("mcp__").expect("the prefix");
        let (s, t) = rest.split_once("__").expect("the separator");
        assert_eq!(s, server, "{name:?} ends its server part early");
        assert_eq!(decode_part(t).as_deref(), Some(tool), "{name:?} does not decode to {tool:?}");
        assert_eq!(name_target(&name), Some((true, server.to_string())));
    }
}

fn manifests(servers: &[Server]) -> (String, BTreeMap<String, Vec<String>>) {
    let mut docs = Vec::new();
    let mut tools: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for s in servers {
        let id = IDS[usize::from(s.id) % IDS.len()];
        if !ids.insert(id) {
            continue;
        }
        let mut spec = serde_json::json!({"transport": "stdio", "stdio": {"command": "server"}, "allowedTools": ["*"]});
        if let Some(ns) = s.namespace {
            spec["toolNamespace"] = NAMESPACES[usize::from(ns) % NAMESPACES.len()].into();
        }
        docs.push(serde_json::json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": id}, "spec": spec}));
        tools.insert(id.to_string(), s.tools.iter().map(Tool::text).collect());
    }
    let profile = serde_json::json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpProfile",
        "metadata": {"name": "p"}, "spec": {"servers": ids.iter().collect::<Vec<_>>()}});
    docs.push(profile);
    let text = docs.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n---\n");
    (text, tools)
}

fn check_set(set: &Effective, caller: &[String], probes: &[String]) {
    let tools = set.tools();
    let mut names = BTreeSet::new();
    let mut routes = BTreeSet::new();
    for (name, server, tool) in &tools {
        assert!(valid_name(name), "exposed {name:?}");
        assert!(names.insert(name.clone()), "{name:?} exposed twice");
        assert!(routes.insert((server.clone(), tool.clone())), "({server}, {tool}) exposed twice");
        assert!(!caller.contains(name), "{name:?} is the caller's own tool");
        let route = Some((server.clone(), tool.clone()));
        assert_eq!(set.route(name), route, "{name:?} routes elsewhere");
        assert_eq!(set.route(&format!("mcp.{server}.{tool}")), route, "dotted mcp.{server}.{tool}");
    }
    for probe in probes.iter().chain(caller) {
        if let Some(route) = set.route(probe) {
            assert!(routes.contains(&route), "{probe:?} routes to {route:?}, which is not exposed");
        }
    }
    for c in caller {
        if !c.starts_with("mcp.") {
            assert_eq!(set.route(c), None, "the caller's tool {c:?} routes to a server");
        }
    }
}

fuzz_target!(|input: Input| {
    for (server, tool) in &input.pairs {
        check_pair(server, tool);
        let base = base_name(server, tool);
        let mut taken: Vec<&str> = input.salt_taken.iter().map(String::as_str).collect();
        taken.push(&base);
        let free = free_name(&base, server, server, tool, true, &taken);
        assert!(valid_name(&free) && !taken.contains(&free.as_str()), "free_name gave {free:?}");
    }

    let (text, tools) = manifests(&input.servers);
    let Ok(plain) = Effective::new(&text, "p", &tools, None, &[]) else { return };
    check_set(&plain, &[], &input.probes);
    let exposed = plain.tools();
    let caller: Vec<String> = input
        .callers
        .iter()
        .map(|c| match c {
            Caller::Raw(s) => s.clone(),
            Caller::Exposed(i) if !exposed.is_empty() => exposed[usize::from(*i) % exposed.len()].0.clone(),
            Caller::Dotted(i) if !exposed.is_empty() => {
                let (_, s, t) = &exposed[usize::from(*i) % exposed.len()];
                format!("mcp.{s}.{t}")
            }
            _ => "own_tool".to_string(),
        })
        .collect();
    let refs: Vec<&str> = caller.iter().map(String::as_str).collect();
    let set = Effective::new(&text, "p", &tools, None, &refs).expect("the same profile compiles");
    check_set(&set, &caller, &input.probes);
    assert_eq!(set.tools().len(), exposed.len(), "caller tools changed how many tools are exposed");
});
