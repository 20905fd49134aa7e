//! Chat completion requests (`src/chat/types.rs`) and the tool loop's decisions
//! (`src/chat/tool_loop.rs`), driven as the chat door drives them (`spear::fuzzing::ChatLoop`
//! mirrors `src/agent/doors/chat.rs`'s `run_loop` without I/O) over the registry in
//! `examples/registry/`.
//!
//! Input: a request body, then optionally a 0 byte and (arbitrary-encoded) the servers' tool
//! lists and the model's answers; without them, fixed lists and answers that call each injected
//! tool, a caller tool and an unknown one.
//!
//! Properties:
//! - parsing any body returns (a request or a reason);
//! - the upstream request offers the caller's tools then the injected ones, the injected names
//!   never equal a caller's, and each injected name routes to an exposed (server, tool);
//! - the agent never executes a caller's tool, and every call it executes that routes goes to a
//!   (server, tool) of the effective set (the rest are answered `mcp_policy_denied`), and only
//!   `function` calls are executed (a `custom` call is denied whatever it names);
//! - budgets hold: tool calls executed over the whole loop <= maxTotalToolCalls, upstream requests
//!   <= maxIterations, and the loop asks again only while another request is allowed;
//! - an answer returned to the caller carries only the caller's own tool calls.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use spear::fuzzing::ChatLoop;

const REGISTRY: &str = spear::fuzzing::EXAMPLE_REGISTRY;
const SERVERS: &[&str] = &["everything", "everything-http", "filesystem"];
const TOOLS: &[&str] = &["echo", "get-sum", "read_file", "write_file", "move_file", "list_directory", "delete_all"];

#[derive(Arbitrary, Debug)]
enum Target {
    Injected(u8),
    Caller(u8),
    Dotted(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Call {
    target: Target,
    /// A `custom` call instead of a function call.
    custom: bool,
    arguments: Option<String>,
}

#[derive(Arbitrary, Debug)]
enum Answer {
    Calls(Vec<Call>),
    NoChoices,
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Script {
    readonly: bool,
    tools: Vec<(u8, u8, Option<String>)>,
    answers: Vec<Answer>,
}

fn default_script() -> Script {
    let call = |target| Call { target, custom: false, arguments: Some("{}".into()) };
    Script {
        readonly: false,
        tools: (0..SERVERS.len() as u8).flat_map(|s| (0..TOOLS.len() as u8).map(move |t| (s, t, None))).collect(),
        answers: vec![
            Answer::Calls(vec![call(Target::Injected(0)), call(Target::Injected(1)), call(Target::Raw("nope".into()))]),
            Answer::Calls(vec![call(Target::Injected(2)), call(Target::Caller(0))]),
            Answer::Calls(vec![]),
        ],
    }
}

fn pick(names: &[String], i: u8) -> String {
    if names.is_empty() { "none".to_string() } else { names[usize::from(i) % names.len()].clone() }
}

fn answer(a: &Answer, chat: &ChatLoop) -> Vec<u8> {
    let calls = match a {
        Answer::Raw(s) => return s.as_bytes().to_vec(),
        Answer::NoChoices => return br#"{"id": "c", "choices": []}"#.to_vec(),
        Answer::Calls(calls) => calls,
    };
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let name = match &c.target {
                Target::Injected(k) => pick(chat.injected(), *k),
                Target::Caller(k) => pick(chat.caller_tools(), *k),
                Target::Dotted(k) => {
                    let tools = chat.effective().tools();
                    if tools.is_empty() {
                        "mcp.x.y".into()
                    } else {
                        let (_, s, t) = &tools[usize::from(*k) % tools.len()];
                        format!("mcp.{s}.{t}")
                    }
                }
                Target::Raw(s) => s.clone(),
            };
            if c.custom {
                json!({"id": format!("call_{i}"), "type": "custom", "custom": {"name": name, "input": c.arguments}})
            } else {
                json!({"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": c.arguments}})
            }
        })
        .collect();
    let message = if tool_calls.is_empty() {
        json!({"role": "assistant", "content": "done"})
    } else {
        json!({"role": "assistant", "content": null, "tool_calls": tool_calls})
    };
    let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
    json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        .to_string()
        .into_bytes()
}

fuzz_target!(|data: &[u8]| {
    let (body, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let script = match rest {
        Some(rest) => match Script::arbitrary_take_rest(Unstructured::new(rest)) {
            Ok(s) => s,
            Err(_) => return,
        },
        None => default_script(),
    };
    let mut tools: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (s, t, raw) in &script.tools {
        let tool = raw.clone().unwrap_or_else(|| TOOLS[usize::from(*t) % TOOLS.len()].to_string());
        tools.entry(SERVERS[usize::from(*s) % SERVERS.len()].to_string()).or_default().push(tool);
    }
    let profile = if script.readonly { "readonly" } else { "developer" };
    let mut chat = match ChatLoop::start(REGISTRY, profile, &tools, body) {
        Ok(Some(chat)) => chat,
        Ok(None) | Err(_) => return,
    };

    let caller_names: Vec<String> = chat.caller_tools().to_vec();
    let caller: BTreeSet<&str> = caller_names.iter().map(String::as_str).collect();
    let exposed: BTreeSet<(String, String)> = chat.effective().tools().into_iter().map(|(_, s, t)| (s, t)).collect();
    let mut expected_upstream: Vec<String> = chat.caller_tools().to_vec();
    expected_upstream.extend(chat.injected().iter().cloned());
    assert_eq!(chat.upstream_tools(), expected_upstream.as_slice(), "upstream tools: the caller's, then the injected");
    for name in chat.injected() {
        assert!(!caller.contains(name.as_str()), "injected {name:?} is also the caller's tool");
        let route = chat.effective().route(name).expect("an injected name routes");
        assert!(exposed.contains(&route), "{name:?} routes outside the set");
    }
    let (max_iterations, max_total) = chat.effective().loop_budgets();

    let mut executed_total = 0usize;
    for a in &script.answers {
        if chat.is_done() {
            break;
        }
        let bytes = answer(a, &chat);
        let step = chat.step(&bytes);
        assert!(
            step.iterations <= max_iterations.max(1),
            "{} requests, maxIterations {max_iterations}",
            step.iterations
        );
        for name in &step.executed {
            assert!(!caller.contains(name.as_str()), "the agent executed the caller's tool {name:?}");
            if let Some(route) = chat.effective().route(name) {
                assert!(exposed.contains(&route), "{name:?} runs {route:?}, outside the effective set");
            }
        }
        assert_eq!(step.executed_non_function, 0, "a non-function call ran an MCP tool");
        executed_total += step.executed.len() + step.denied.len();
        assert!(executed_total <= max_total as usize, "{executed_total} calls, maxTotalToolCalls {max_total}");
        if !step.refused.is_empty() {
            assert!(step.budget_note && executed_total == max_total as usize, "refused before the budget was used");
        }
        match &step.returned {
            Some(returned) => {
                for name in returned {
                    assert!(caller.contains(name.as_str()), "{name:?} returned to the caller, not its tool");
                }
                assert!(chat.is_done());
            }
            None if step.bad_answer => assert!(chat.is_done()),
            None => {
                assert!(step.iterations < max_iterations, "asks again after {} of {max_iterations}", step.iterations)
            }
        }
    }
});
