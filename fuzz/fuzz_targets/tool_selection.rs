//! `chat.toolSelection` and the resource identifiers (`src/policy/select.rs`,
//! `src/policy/rank.rs`, `src/chat/tool_loop.rs:run_find_tools`, `src/policy/items.rs`) over the
//! example registry's `developer` profile with tool lists from the input.
//!
//! Input: arbitrary-encoded tool lists, conversation (model and user text are untrusted),
//! pinned names, `alwaysInclude` patterns, `maxTools`, `find_tools` arguments as JSON text, and
//! a resource URI as a client would send it.
//!
//! Properties:
//! - a round offers only tools of the effective set, each once, at most `maxTools` of them
//!   ranked; `find_tools` is offered exactly when tools were left out;
//! - `find_tools` with any arguments answers (names of the set's tools, at most 20) or refuses
//!   with `mcp_invalid_arguments`, never panics;
//! - a resource URI the agent accepts round-trips: `resource_id(parse(uri)) == uri`.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use spear::fuzzing::{Effective, parse_resource_id, resource_id};

const REGISTRY: &str = spear::fuzzing::EXAMPLE_REGISTRY;
const SERVERS: &[&str] = &["everything", "everything-http", "filesystem"];

#[derive(Arbitrary, Debug)]
struct Input {
    tools: Vec<(u8, String)>,
    turns: Vec<(bool, String)>,
    called: Vec<String>,
    pinned: Vec<String>,
    always: Vec<String>,
    max_tools: u8,
    find_arguments: String,
    uri: String,
}

fuzz_target!(|input: Input| {
    let mut tools: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (server, name) in input.tools.into_iter().take(200) {
        tools.entry(SERVERS[server as usize % SERVERS.len()].to_string()).or_default().push(name);
    }
    let Ok(effective) = Effective::new(REGISTRY, "developer", &tools, None, &[]) else { return };
    let exposed: BTreeSet<String> = effective.tools().into_iter().map(|(name, ..)| name).collect();
    let mut messages: Vec<Value> = input
        .turns
        .into_iter()
        .take(16)
        .map(|(user, text)| json!({"role": if user { "user" } else { "assistant" }, "content": text}))
        .collect();
    let calls: Vec<Value> = input
        .called
        .iter()
        .map(|name| json!({"id": "c", "type": "function", "function": {"name": name, "arguments": "{}"}}))
        .collect();
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
    let max_tools = u32::from(input.max_tools % 32) + 1;
    if let Ok(offered) = effective.select(max_tools, input.always, &messages, &input.pinned) {
        assert_eq!(offered.of, exposed.len());
        let mut seen = BTreeSet::new();
        for (name, _) in &offered.tools {
            assert!(exposed.contains(name), "offered {name}, which the set does not have");
            assert!(seen.insert(name.clone()), "offered {name} twice");
        }
        let ranked = offered.tools.iter().filter(|(_, why)| why == "ranked").count();
        assert!(ranked <= max_tools as usize);
        assert_eq!(offered.find_tools, offered.tools.len() < offered.of);
    }
    let arguments: Value = serde_json::from_str(&input.find_arguments).unwrap_or(Value::String(input.find_arguments));
    match effective.find_tools(&arguments) {
        Ok(found) => {
            assert!(found.len() <= 20);
            assert!(found.iter().all(|name| exposed.contains(name)), "find_tools found a tool outside the set");
        }
        Err((code, _)) => assert_eq!(code, "mcp_invalid_arguments"),
    }
    if let Some((server, uri)) = parse_resource_id(&input.uri) {
        assert_eq!(resource_id(&server, &uri), input.uri);
    }
});
