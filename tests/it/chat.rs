//! `POST /v1/chat/completions` end to end: a real agent core over the real PyPI-`mcp` fixture
//! server, the chat router on a loopback port, and a scripted upstream in place of the hosted
//! model API (the one test double: a hosted model is neither free nor deterministic). Each test
//! asserts on what the caller got back and on what the upstream was sent.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};
use spear::agent::AuditSink;
use spear::agent::chat::{self, ChatService};
use spear::api::manifest::Object;
use spear::api::{McpProfile, McpProfileSpec, McpServer, ToolSelection, ToolSelectionMode};
use spear::chat::{UpstreamOverride, UpstreamTimeouts};
use spear::testing::mcp_servers;

use crate::support::{TestAgent, start_agent, start_agent_audited};

// === the scripted upstream ===

/// One request the upstream received.
#[derive(Clone, Debug)]
struct Recorded {
    authorization: Option<String>,
    body: Value,
}

#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<(StatusCode, Value)>>,
    requests: Mutex<Vec<Recorded>>,
}

/// Stands in for a hosted OpenAI-compatible model API (`POST {base}/chat/completions`): it
/// replays a script of answers in order and records every request, so tests assert on what the
/// agent forwarded. An exhausted script answers 500, failing the test visibly.
pub(crate) struct ScriptedUpstream {
    /// `http://127.0.0.1:<port>/v1`.
    pub(crate) base_url: String,
    script: Arc<Script>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedUpstream {
    pub(crate) async fn start(answers: Vec<(StatusCode, Value)>) -> Self {
        let script = Arc::new(Script { answers: Mutex::new(answers.into()), requests: Mutex::default() });
        async fn handle(State(script): State<Arc<Script>>, headers: HeaderMap, body: String) -> (StatusCode, String) {
            let body: Value = serde_json::from_str(&body).unwrap_or_else(|e| json!({"unparsable": e.to_string()}));
            let authorization = headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
            script.requests.lock().push(Recorded { authorization, body });
            let next = script.answers.lock().pop_front();
            let (status, answer) = next.unwrap_or((
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"message": "scripted upstream: script exhausted", "type": "test"}}),
            ));
            (status, answer.to_string())
        }
        let app = axum::Router::new().route("/v1/chat/completions", post(handle)).with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ScriptedUpstream { base_url: format!("http://127.0.0.1:{port}/v1"), script, task }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.script.requests.lock().clone()
    }
}

/// A final answer.
pub(crate) fn answer(content: &str) -> (StatusCode, Value) {
    completion(json!({"role": "assistant", "content": content, "refusal": null}), "stop")
}

/// An answer calling tools: `(id, name, arguments JSON string)`.
pub(crate) fn calls(calls: &[(&str, &str, &str)]) -> (StatusCode, Value) {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
        .collect();
    completion(json!({"role": "assistant", "content": null, "refusal": null, "tool_calls": tool_calls}), "tool_calls")
}

fn completion(message: Value, finish_reason: &str) -> (StatusCode, Value) {
    let body = json!({
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": 1_700_000_000, "model": "test-model",
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        "system_fingerprint": "fp_test",
    });
    (StatusCode::OK, body)
}

// === the agent with its chat door ===

/// A running agent (fixture server `fx` in its profile `p`, server `outside` not), its chat
/// router on a loopback port, and the scripted upstream the profile points at.
struct Chat {
    /// `http://127.0.0.1:<port>/v1`: an OpenAI SDK's `base_url`.
    base_url: String,
    upstream: ScriptedUpstream,
    client: reqwest::Client,
    _agent: TestAgent,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Chat {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// What the caller got.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    fn revision(&self) -> Option<&str> {
        self.headers.get("x-spear-registry-revision").and_then(|v| v.to_str().ok())
    }
}

async fn start(script: Vec<(StatusCode, Value)>) -> Chat {
    start_with(script, |_| {}, UpstreamOverride::default()).await
}

async fn start_with(
    script: Vec<(StatusCode, Value)>,
    edit: impl FnOnce(&mut McpProfileSpec),
    overrides: UpstreamOverride,
) -> Chat {
    let upstream = ScriptedUpstream::start(script).await;
    let fixture = mcp_servers::fixture_stdio(&[]);
    let mut profile = McpProfile::test("p").servers(["fx"]).upstream(&upstream.base_url).upstream_model("test-model");
    edit(&mut profile.spec);
    let agent = start_agent(
        vec![
            Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"])),
            // Never in the profile: connected lazily, so never started either.
            Object::Server(McpServer::test("outside").running(&fixture).allowing(["*"])),
            Object::Profile(profile),
        ],
        "p",
    )
    .await;
    serve_chat(upstream, agent, overrides).await
}

/// The chat router of `agent` on a loopback port.
async fn serve_chat(upstream: ScriptedUpstream, agent: TestAgent, overrides: UpstreamOverride) -> Chat {
    let service = ChatService::new(agent.agent.clone(), overrides, UpstreamTimeouts::default()).expect("chat service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind chat");
    let port = listener.local_addr().expect("addr").port();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, chat::router(service)).await;
    });
    spear::install_crypto_provider();
    let client = reqwest::Client::builder().build().expect("client");
    Chat { base_url: format!("http://127.0.0.1:{port}/v1"), upstream, client, _agent: agent, server }
}

impl Chat {
    async fn post(&self, body: Value) -> Answer {
        let response = self
            .client
            .post(format!("{}/chat/completions", self.base_url))
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-caller")
            .body(body.to_string())
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("chat request");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body");
        Answer { status, headers, text }
    }
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Names of the tools a recorded request offered.
fn tool_names(request: &Recorded) -> Vec<String> {
    request.body["tools"]
        .as_array()
        .map(|tools| {
            tools.iter().filter_map(|t| t["function"]["name"].as_str()).map(str::to_string).collect::<Vec<_>>()
        })
        .unwrap_or_default()
}

/// The `role=tool` messages of a recorded request, as `(tool_call_id, content)`.
fn tool_messages(request: &Recorded) -> Vec<(String, String)> {
    request.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().into(),
            )
        })
        .collect()
}

// === tests ===

#[tokio::test]
async fn an_mcp_tool_call_is_executed_and_the_model_is_asked_again() {
    let chat = start(vec![calls(&[("call_1", "mcp__fx__echo", r#"{"text": "hello"}"#)]), answer("done")]).await;
    let reply = chat.post(json!({"messages": user("say hello"), "temperature": 0.5})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["choices"][0]["message"]["content"], "done");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let spear = &body["spear"];
    assert_eq!(spear["iterations"], 2);
    assert_eq!(spear["tool_calls"][0]["name"], "mcp__fx__echo");
    assert_eq!(spear["tool_calls"][0]["server_id"], "fx");
    assert_eq!(spear["tool_calls"][0]["tool"], "echo");
    assert_eq!(spear["tool_calls"][0]["status"], "ok");
    assert_eq!(spear["tool_calls"][0]["iteration"], 1);
    assert!(spear["tool_calls"][0]["latency_ms"].is_number());
    assert!(spear.get("budget_exceeded").is_none());
    let revision = reply.revision().expect("revision header");
    assert_eq!(spear["registry_revision"], revision);

    let requests = chat.upstream.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(first.body["model"], "test-model", "the profile's model fills a request without one");
    assert_eq!(first.body["temperature"], 0.5, "unknown fields are forwarded");
    assert_eq!(first.body["tool_choice"], "auto", "the profile's default toolChoice");
    assert!(first.body.get("mcp").is_none());
    assert_eq!(first.authorization.as_deref(), Some("Bearer sk-caller"), "no key configured: the caller's");
    let echo = first.body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["function"]["name"] == "mcp__fx__echo")
        .expect("echo injected");
    assert_eq!(echo["type"], "function");
    assert_eq!(echo["function"]["description"], "Returns its text.");
    assert_eq!(echo["function"]["parameters"]["properties"]["text"]["type"], "string");

    let second = &requests[1];
    let messages = second.body["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 3, "user, assistant with the call, tool answer: {messages:?}");
    assert_eq!(messages[1]["role"], "assistant");
    assert_eq!(messages[1]["tool_calls"][0]["id"], "call_1");
    assert_eq!(tool_messages(second), [("call_1".to_string(), "hello".to_string())]);
    assert_eq!(spear["messages"].as_array().map(Vec::len), Some(2), "the exchange is reported");
}

/// A chat request sent while the agent is still starting (its server slow to start) waits for
/// the first tool lists: the model is offered the tools, and its call runs.
#[tokio::test]
async fn a_request_sent_while_the_agent_starts_gets_the_tools_and_its_calls_run() {
    let upstream = ScriptedUpstream::start(vec![
        calls(&[("call_1", "mcp__fx__echo", r#"{"text": "from the first second"}"#)]),
        answer("done"),
    ])
    .await;
    let fixture = mcp_servers::fixture_stdio(&[]).delayed(2.0);
    let profile = McpProfile::test("p").servers(["fx"]).upstream(&upstream.base_url).upstream_model("test-model");
    let agent = crate::support::spawn_agent(
        vec![Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"])), Object::Profile(profile)],
        "p",
    );
    assert!(!agent.agent.is_ready());
    let chat = serve_chat(upstream, agent, UpstreamOverride::default()).await;
    let reply = chat.post(json!({"model": "test-model", "messages": user("echo something")})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let requests = chat.upstream.requests();
    assert!(tool_names(&requests[0]).contains(&"mcp__fx__echo".to_string()), "offered: {:?}", tool_names(&requests[0]));
    let messages = tool_messages(&requests[1]);
    assert!(messages[0].1.contains("from the first second"), "{messages:?}");
}

#[tokio::test]
async fn parallel_calls_run_concurrently_and_each_gets_its_tool_message() {
    let chat = start(vec![
        calls(&[("call_a", "mcp__fx__probe", r#"{"ms": 800}"#), ("call_b", "mcp__fx__probe", r#"{"ms": 800}"#)]),
        answer("both done"),
    ])
    .await;
    let reply = chat.post(json!({"messages": user("probe twice")})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["spear"]["tool_calls"].as_array().map(Vec::len), Some(2));
    let requests = chat.upstream.requests();
    let answers = tool_messages(&requests[1]);
    let ids: Vec<&str> = answers.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["call_a", "call_b"]);
    // `probe` returns the most calls the server saw running at once: both were in flight.
    for (_, content) in &answers {
        assert_eq!(content, "2", "calls ran concurrently: {answers:?}");
    }
}

#[tokio::test]
async fn a_tool_timeout_is_tool_output_and_the_request_still_succeeds() {
    let chat =
        start(vec![calls(&[("call_1", "mcp__fx__sleep", r#"{"ms": 5000}"#)]), answer("the tool was too slow")]).await;
    let reply = chat.post(json!({"messages": user("sleep"), "mcp": {"budgets": {"tool_timeout_ms": 300}}})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["spear"]["tool_calls"][0]["status"], "mcp_timeout");
    assert_eq!(body["choices"][0]["message"]["content"], "the tool was too slow");
    let (_, content) = &tool_messages(&chat.upstream.requests()[1])[0];
    let output: Value = serde_json::from_str(content).expect("error object");
    assert_eq!(output["error"]["code"], "mcp_timeout");
    assert_eq!(output["error"]["retryable"], true);
}

#[tokio::test]
async fn max_iterations_stops_the_loop_with_a_budget_note() {
    let echo = || calls(&[("call_1", "mcp__fx__echo", r#"{"text": "again"}"#)]);
    let chat = start(vec![echo(), echo(), echo()]).await;
    let reply = chat.post(json!({"messages": user("loop"), "mcp": {"budgets": {"max_iterations": 2}}})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(chat.upstream.requests().len(), 2, "maxIterations counts upstream requests");
    let choice = &body["choices"][0];
    assert!(choice["message"].get("tool_calls").is_none(), "MCP calls stripped: {choice}");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(body["spear"]["iterations"], 2);
    assert_eq!(body["spear"]["tool_calls"].as_array().map(Vec::len), Some(1), "only the first round ran");
    assert_eq!(body["spear"]["budget_exceeded"]["code"], "mcp_budget_exceeded");
    assert!(body["spear"]["budget_exceeded"]["message"].as_str().is_some_and(|m| m.contains("maxIterations")));
}

#[tokio::test]
async fn max_total_tool_calls_runs_the_first_calls_and_refuses_the_rest() {
    let chat = start_with(
        vec![
            calls(&[
                ("call_1", "mcp__fx__echo", r#"{"text": "one"}"#),
                ("call_2", "mcp__fx__echo", r#"{"text": "two"}"#),
            ]),
            answer("one of two"),
        ],
        |spec| {
            spec.budgets = Some(spear::api::ProfileBudgets { max_total_tool_calls: Some(1), ..Default::default() });
        },
        UpstreamOverride::default(),
    )
    .await;
    let reply = chat.post(json!({"messages": user("two echoes")})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    let answers = tool_messages(&chat.upstream.requests()[1]);
    assert_eq!(answers[0], ("call_1".to_string(), "one".to_string()));
    assert_eq!(answers[1].0, "call_2");
    assert!(answers[1].1.contains("mcp_budget_exceeded"), "{}", answers[1].1);
    let statuses: Vec<&str> =
        body["spear"]["tool_calls"].as_array().expect("calls").iter().filter_map(|c| c["status"].as_str()).collect();
    assert_eq!(statuses, ["ok", "mcp_budget_exceeded"]);
    assert_eq!(body["spear"]["budget_exceeded"]["code"], "mcp_budget_exceeded");
    assert_eq!(body["choices"][0]["message"]["content"], "one of two");
}

#[tokio::test]
async fn a_forced_mcp_tool_applies_to_the_first_request_only() {
    let chat = start(vec![calls(&[("call_1", "mcp__fx__echo", r#"{"text": "x"}"#)]), answer("ok")]).await;
    let forced = json!({"type": "function", "function": {"name": "mcp__fx__echo"}});
    let reply = chat.post(json!({"messages": user("echo"), "tool_choice": forced})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let requests = chat.upstream.requests();
    assert_eq!(requests[0].body["tool_choice"], forced);
    assert_eq!(requests[1].body["tool_choice"], "auto", "later rounds let the model stop");
}

#[tokio::test]
async fn a_forced_unknown_tool_is_refused_naming_it() {
    let chat = start(vec![answer("never asked")]).await;
    let forced = json!({"type": "function", "function": {"name": "mcp__fx__nope"}});
    let reply = chat.post(json!({"messages": user("x"), "tool_choice": forced})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    let error = &reply.json()["error"];
    assert!(error["message"].as_str().is_some_and(|m| m.contains("mcp__fx__nope")), "{error}");
    assert_eq!(error["param"], "tool_choice");
    assert!(reply.revision().is_some(), "the set was computed: the revision is stamped");
    assert!(chat.upstream.requests().is_empty());
}

#[tokio::test]
async fn tool_choice_none_passes_through() {
    let chat = start(vec![answer("no tools used")]).await;
    let reply = chat.post(json!({"messages": user("x"), "tool_choice": "none"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.json()["spear"]["iterations"], 1);
    let requests = chat.upstream.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].body["tool_choice"], "none");
}

#[tokio::test]
async fn the_mcp_object_narrows_the_tools_and_is_never_forwarded() {
    let chat = start(vec![answer("narrowed")]).await;
    let reply = chat
        .post(json!({"messages": user("x"), "mcp": {"server_ids": ["fx"], "tool_allowlist": ["echo", "sleep"]}}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let requests = chat.upstream.requests();
    assert_eq!(tool_names(&requests[0]), ["mcp__fx__echo", "mcp__fx__sleep"]);
    assert!(requests[0].body.get("mcp").is_none());
}

#[tokio::test]
async fn a_server_outside_the_profile_is_refused_before_the_model_is_asked() {
    let chat = start(vec![answer("never asked")]).await;
    let reply = chat.post(json!({"messages": user("x"), "mcp": {"server_ids": ["outside"]}})).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text);
    let error = &reply.json()["error"];
    assert_eq!(error["code"], "mcp_policy_denied");
    assert!(error["message"].as_str().is_some_and(|m| m.contains("outside")), "{error}");
    assert!(chat.upstream.requests().is_empty());
}

#[tokio::test]
async fn an_unknown_key_in_the_mcp_object_is_refused_naming_it() {
    let chat = start(vec![answer("never asked")]).await;
    let reply = chat.post(json!({"messages": user("x"), "mcp": {"server_idz": ["fx"]}})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text);
    let error = &reply.json()["error"];
    assert!(error["message"].as_str().is_some_and(|m| m.contains("server_idz")), "{error}");
    assert!(chat.upstream.requests().is_empty());
}

fn weather_tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
}

#[tokio::test]
async fn caller_tools_are_kept_and_their_calls_returned_unexecuted() {
    let chat = start(vec![calls(&[("call_w", "get_weather", r#"{"city": "Oslo"}"#)])]).await;
    let reply = chat.post(json!({"messages": user("weather?"), "tools": [weather_tool("get_weather")]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["tool_calls"][0]["id"], "call_w");
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["arguments"], r#"{"city": "Oslo"}"#);
    assert_eq!(body["spear"]["tool_calls"], json!([]));
    let requests = chat.upstream.requests();
    assert_eq!(requests.len(), 1);
    let names = tool_names(&requests[0]);
    assert_eq!(names[0], "get_weather", "the caller's tools come first");
    assert!(names.contains(&"mcp__fx__echo".to_string()));
}

#[tokio::test]
async fn a_mixed_answer_runs_the_mcp_calls_and_returns_only_the_callers() {
    let chat = start(vec![calls(&[
        ("call_w", "get_weather", r#"{"city": "Oslo"}"#),
        ("call_e", "mcp__fx__echo", r#"{"text": "side"}"#),
    ])])
    .await;
    let reply = chat.post(json!({"messages": user("both"), "tools": [weather_tool("get_weather")]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(chat.upstream.requests().len(), 1, "the caller continues, not the agent");
    let returned = body["choices"][0]["message"]["tool_calls"].as_array().expect("calls");
    assert_eq!(returned.len(), 1);
    assert_eq!(returned[0]["id"], "call_w");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    let messages = body["spear"]["messages"].as_array().expect("exchange");
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["tool_calls"].as_array().map(Vec::len), Some(2), "the full assistant message");
    assert_eq!(messages[1], json!({"role": "tool", "tool_call_id": "call_e", "content": "side"}));
}

#[tokio::test]
async fn a_caller_tool_with_an_mcp_name_wins_and_the_mcp_tool_is_renamed() {
    let chat = start(vec![calls(&[("call_1", "mcp__fx__echo", r#"{"text": "mine"}"#)])]).await;
    let reply = chat.post(json!({"messages": user("x"), "tools": [weather_tool("mcp__fx__echo")]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["choices"][0]["message"]["tool_calls"][0]["id"], "call_1", "the caller's, unexecuted");
    assert_eq!(body["spear"]["tool_calls"], json!([]));
    let names = tool_names(&chat.upstream.requests()[0]);
    assert_eq!(names.iter().filter(|n| *n == "mcp__fx__echo").count(), 1, "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("mcp__fx__echo") && n != "mcp__fx__echo"), "renamed: {names:?}");
}

#[tokio::test]
async fn invalid_arguments_become_tool_output() {
    let chat = start(vec![calls(&[("call_1", "mcp__fx__echo", "{not json")]), answer("fixed")]).await;
    let reply = chat.post(json!({"messages": user("x")})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.json()["spear"]["tool_calls"][0]["status"], "mcp_invalid_arguments");
    let (id, content) = &tool_messages(&chat.upstream.requests()[1])[0];
    assert_eq!(id, "call_1");
    assert!(content.contains("mcp_invalid_arguments"), "{content}");
}

#[tokio::test]
async fn a_tool_outside_the_profile_is_neither_injected_nor_executed() {
    let chat = start_with(
        vec![calls(&[("call_1", "mcp__outside__pid", "{}"), ("call_2", "mcp__fx__pid", "{}")]), answer("denied")],
        |spec| spec.tool_denylist = vec!["pid".into()],
        UpstreamOverride::default(),
    )
    .await;
    let reply = chat.post(json!({"messages": user("pids")})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let requests = chat.upstream.requests();
    let names = tool_names(&requests[0]);
    assert!(names.contains(&"mcp__fx__echo".to_string()));
    assert!(!names.iter().any(|n| n.contains("outside") || n.ends_with("pid")), "{names:?}");
    let body = reply.json();
    for call in body["spear"]["tool_calls"].as_array().expect("calls") {
        assert_eq!(call["status"], "mcp_policy_denied", "{call}");
        assert_eq!(call["server_id"], Value::Null, "never routed to a server: {call}");
    }
    for (_, content) in tool_messages(&requests[1]) {
        assert!(content.contains("mcp_policy_denied"), "{content}");
    }
}

/// A model answer whose call is not a `function` call (`type: custom`, or a misspelt type)
/// but names an MCP tool of the set: the tool never runs, whatever the call names; the model
/// reads `mcp_policy_denied` and the call never reaches a server (a custom call used to run it).
#[tokio::test]
async fn a_custom_tool_call_named_like_an_mcp_tool_is_denied_not_run() {
    let tool_calls = json!([
        {"id": "call_1", "type": "custom", "custom": {"name": "mcp__fx__echo", "input": "{\"text\": \"hi\"}"}},
        {"id": "call_2", "type": "Function", "function": {"name": "mcp__fx__echo", "arguments": "{\"text\": \"hi\"}"}},
        {"id": "call_3", "type": "function", "function": {"name": "mcp__fx__echo", "arguments": "{\"text\": \"hi\"}"}},
    ]);
    let first = completion(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}), "tool_calls");
    let chat = start(vec![first, answer("done")]).await;
    let reply = chat.post(json!({"messages": user("echo")})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    let records = body["spear"]["tool_calls"].as_array().expect("calls").clone();
    assert_eq!(records.len(), 3, "{records:?}");
    for denied in &records[..2] {
        assert_eq!(denied["status"], "mcp_policy_denied", "{denied}");
        assert_eq!(denied["server_id"], Value::Null, "never routed to a server: {denied}");
    }
    assert_eq!(records[2]["status"], "ok", "the function call runs: {}", records[2]);
    assert_eq!(records[2]["server_id"], "fx");
    let answers = tool_messages(&chat.upstream.requests()[1]);
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert!(answers[0].1.contains("mcp_policy_denied") && answers[0].1.contains("'custom'"), "{answers:?}");
    assert!(answers[1].1.contains("mcp_policy_denied"), "{answers:?}");
    assert!(answers[2].1.contains("hi"), "{answers:?}");
}

#[tokio::test]
async fn mcp_disabled_is_a_plain_proxy() {
    let chat = start(vec![calls(&[("call_1", "mcp__fx__echo", r#"{"text": "x"}"#)])]).await;
    let reply = chat.post(json!({"messages": user("x"), "mcp": {"enabled": false}})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["choices"][0]["message"]["tool_calls"][0]["id"], "call_1", "returned, not executed");
    assert!(body.get("spear").is_none());
    let requests = chat.upstream.requests();
    assert_eq!(requests.len(), 1);
    assert!(requests[0].body.get("tools").is_none() && requests[0].body.get("tool_choice").is_none());
    assert!(requests[0].body.get("mcp").is_none());
}

/// Splits an SSE body into its `data:` payloads.
fn sse_events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {e:?}")).to_string())
        .collect()
}

#[tokio::test]
async fn streaming_sends_the_final_answer_as_openai_chunks() {
    let long = "The echo tool said hello, and this answer is long enough to need several content deltas.";
    let chat = start(vec![calls(&[("call_1", "mcp__fx__echo", r#"{"text": "hello"}"#)]), answer(long)]).await;
    let reply =
        chat.post(json!({"messages": user("x"), "stream": true, "stream_options": {"include_usage": true}})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(reply.headers.get("content-type").and_then(|v| v.to_str().ok()), Some("text/event-stream"));
    assert!(reply.revision().is_some());

    let events = sse_events(&reply.text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk JSON")).collect();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], "chatcmpl-scripted");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(content, long);
    assert!(chunks.iter().filter(|c| c["choices"][0]["delta"]["content"].is_string()).count() > 2);
    let finish: Vec<&Value> =
        chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
    assert_eq!(finish, [&json!("stop")]);
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"], json!([]), "the usage chunk comes last");
    assert_eq!(last["usage"]["total_tokens"], 15);
    assert_eq!(last["spear"]["tool_calls"][0]["status"], "ok");

    for request in chat.upstream.requests() {
        assert_eq!(request.body["stream"], false, "the loop asks without streaming");
        assert!(request.body.get("stream_options").is_none());
    }
}

#[tokio::test]
async fn no_upstream_configured_is_503_saying_how_to_configure_one() {
    let chat = start_with(vec![], |spec| spec.chat = None, UpstreamOverride::default()).await;
    let reply = chat.post(json!({"messages": user("x")})).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.text);
    let error = &reply.json()["error"];
    assert_eq!(error["code"], "upstream_not_configured");
    assert!(error["message"].as_str().is_some_and(|m| m.contains("spec.chat.upstream.url")), "{error}");
}

#[tokio::test]
async fn an_upstream_error_status_and_body_pass_through() {
    let limited =
        json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}});
    let chat = start(vec![(StatusCode::TOO_MANY_REQUESTS, limited.clone())]).await;
    let reply = chat.post(json!({"messages": user("x")})).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.json(), limited);
    assert!(reply.revision().is_some());
}

#[tokio::test]
async fn an_unreachable_upstream_is_502() {
    let closed = mcp_servers::free_port();
    let overrides =
        UpstreamOverride { url: Some(format!("http://127.0.0.1:{closed}/v1")), api_key: None, api_key_env: None };
    let chat = start_with(vec![], |_| {}, overrides).await;
    let reply = chat.post(json!({"messages": user("x")})).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "upstream_unreachable");
}

/// An upstream that answers every request with `answer`, counting the requests it got.
async fn fixed_upstream(
    answer: impl Fn() -> axum::response::Response + Clone + Send + Sync + 'static,
) -> (String, Arc<std::sync::atomic::AtomicUsize>, tokio::task::JoinHandle<()>) {
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().fallback(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer = answer.clone();
        async move { answer() }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://127.0.0.1:{port}/v1"), hits, task)
}

/// The attack: an upstream (or whoever controls its URL) redirects the agent's POST, with the
/// model key in it, to another origin. The agent follows no redirect; the caller gets the 3xx.
#[tokio::test]
async fn an_upstream_redirect_is_not_followed_with_the_key() {
    use axum::response::IntoResponse;
    let (elsewhere, elsewhere_hits, _elsewhere) = fixed_upstream(|| (StatusCode::OK, "{}").into_response()).await;
    let location = format!("{elsewhere}/chat/completions");
    let (url, hits, _upstream) = fixed_upstream(move || {
        (StatusCode::TEMPORARY_REDIRECT, [(axum::http::header::LOCATION, location.clone())]).into_response()
    })
    .await;
    let overrides = UpstreamOverride { url: Some(url), api_key: Some("sk-agent".into()), api_key_env: None };
    let chat = start_with(vec![], |_| {}, overrides).await;
    let reply = chat.post(json!({"messages": user("x")})).await;
    assert_eq!(reply.status, StatusCode::TEMPORARY_REDIRECT, "{}", reply.text);
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(elsewhere_hits.load(std::sync::atomic::Ordering::SeqCst), 0, "the redirect was not followed");
}

/// The attack: an upstream answers with an endless body. The agent stops reading at its cap.
#[tokio::test]
async fn an_oversized_upstream_answer_is_refused_not_buffered() {
    use axum::response::IntoResponse;
    let (url, _, _upstream) = fixed_upstream(|| (StatusCode::OK, vec![b' '; 17 << 20]).into_response()).await;
    let overrides = UpstreamOverride { url: Some(url), api_key: None, api_key_env: None };
    let chat = start_with(vec![], |_| {}, overrides).await;
    let reply = chat.post(json!({"messages": user("x")})).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text);
    assert!(reply.json()["error"]["message"].as_str().unwrap_or_default().contains("larger than"), "{}", reply.text);
}

#[tokio::test]
async fn a_configured_key_replaces_the_callers_authorization() {
    let overrides = UpstreamOverride { url: None, api_key: Some("sk-agent".into()), api_key_env: None };
    let chat = start_with(vec![answer("ok")], |_| {}, overrides).await;
    let reply = chat.post(json!({"messages": user("x"), "model": "own-model"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let requests = chat.upstream.requests();
    assert_eq!(requests[0].authorization.as_deref(), Some("Bearer sk-agent"));
    assert_eq!(requests[0].body["model"], "own-model", "the request's model wins over the profile's");
}

#[tokio::test]
async fn the_openai_python_sdk_completes_a_tool_using_chat() {
    let echo = |id: &str, text: &str| calls(&[(id, "mcp__fx__echo", &format!(r#"{{"text": "{text}"}}"#))]);
    let chat = start(vec![
        // Non-streaming: one MCP round, then the answer.
        echo("call_1", "plain"),
        answer("plain done"),
        // Streaming: one MCP round, then the answer.
        echo("call_2", "streamed"),
        answer("streamed done"),
        // The SDK's stream helper, given a caller tool the model calls.
        calls(&[("call_w", "get_weather", r#"{"city": "Oslo"}"#)]),
    ])
    .await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/servers/openai_client.py");
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(mcp_servers::python()).arg(script).arg(&chat.base_url).output(),
    )
    .await
    .expect("SDK script within 120 s")
    .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "SDK script failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    let result: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));

    assert_eq!(result["plain"]["content"], "plain done");
    assert_eq!(result["plain"]["finish_reason"], "stop");
    assert!(result["plain"]["revision"].is_string());
    assert_eq!(result["plain"]["spear"]["tool_calls"][0]["status"], "ok");
    assert_eq!(result["stream"]["content"], "streamed done");
    assert_eq!(result["stream"]["finish_reason"], "stop");
    assert_eq!(result["stream"]["usage_total_tokens"], 15);
    assert_eq!(
        result["stream_helper"]["tool_call"],
        json!({"id": "call_w", "name": "get_weather", "arguments": {"city": "Oslo"}})
    );
    assert_eq!(result["stream_helper"]["finish_reason"], "tool_calls");

    let requests = chat.upstream.requests();
    assert_eq!(requests.len(), 5);
    assert_eq!(tool_messages(&requests[1]), [("call_1".to_string(), "plain".to_string())]);
    assert_eq!(tool_messages(&requests[3]), [("call_2".to_string(), "streamed".to_string())]);
    assert!(requests.iter().all(|r| r.body.get("mcp").is_none()));
    assert_eq!(requests[0].authorization.as_deref(), Some("Bearer sk-sdk"));
}

/// The chat door has no caller to ask: the profile's webhook approver decides each call the model
/// makes, and a denial reaches the model as the tool's error output (the OpenAI SDK sees a normal
/// completion either way). A streamed request whose approval takes 14 s gets its stream at 10 s
/// and SSE comments while it waits, which the SDK reads past.
#[tokio::test]
async fn the_openai_sdk_completes_chats_whose_calls_a_webhook_approves_or_denies() {
    let webhook = tokio::task::spawn_blocking(crate::approval::Webhook::start_unsigned).await.expect("webhook");
    let upstream = ScriptedUpstream::start(vec![
        calls(&[("call_1", "mcp__fx__echo", r#"{"text": "slower"}"#)]),
        answer("approved done"),
        calls(&[("call_2", "mcp__fx__echo", r#"{"text": "deny"}"#)]),
        answer("denied done"),
        calls(&[("call_3", "mcp__fx__echo", r#"{"text": "slower"}"#)]),
        answer("raw done"),
    ])
    .await;
    let fixture = mcp_servers::fixture_stdio(&[]);
    let mut profile = McpProfile::test("p").servers(["fx"]).upstream(&upstream.base_url).upstream_model("test-model");
    let hook = spear::api::WebhookApprover {
        url: format!("http://127.0.0.1:{}/approve", webhook.port),
        signing_secret_ref: None,
        include_arguments: true,
    };
    let approver = spear::api::Approver { webhook: Some(hook), ..Default::default() };
    profile.spec.approval = Some(spear::api::ProfileApproval { timeout_seconds: Some(25), approvers: vec![approver] });
    let always = spear::api::ApprovalMode::Always;
    let server = McpServer::test("fx").running(&fixture).allowing(["*"]).approval(always, []);
    let agent = start_agent(vec![Object::Server(server), Object::Profile(profile)], "p").await;
    let chat = serve_chat(upstream, agent, UpstreamOverride::default()).await;

    let started = std::time::Instant::now();
    let result = openai_sdk(&chat, &["approval"]).await;
    assert!(started.elapsed() > Duration::from_secs(14), "the streamed call waited for its approver");
    assert_eq!(result["streamed"], "approved done", "{result}");
    assert_eq!(result["content"], "denied done", "{result}");
    assert_eq!(result["spear"]["tool_calls"][0]["status"], "mcp_approval_denied", "{result}");

    // The same wait as raw SSE: headers and a comment at 10 s, then the chunks at 14 s.
    let reply = chat.post(json!({"messages": user("x"), "stream": true})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert!(reply.text.starts_with(": keep-alive\n\ndata: {"), "{}", reply.text);
    assert!(reply.text.contains("raw done") && reply.text.ends_with("data: [DONE]\n\n"), "{}", reply.text);

    let requests = chat.upstream.requests();
    assert_eq!(tool_messages(&requests[1]), [("call_1".to_string(), "slower".to_string())]);
    let denied = &tool_messages(&requests[3])[0].1;
    assert!(denied.contains("mcp_approval_denied") && denied.contains("not this one"), "{denied}");
    let asked = webhook.requests();
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert!(asked.iter().all(|r| r["request"]["door"] == "chat"), "{asked:?}");
}

/// A model that calls a rate-limited tool more often than its limit in one round: the calls past
/// it reach the model as `mcp_rate_limited` tool output with the wait, the completion succeeds,
/// and the OpenAI SDK sees a normal answer.
#[tokio::test]
async fn the_openai_sdk_completes_a_chat_whose_calls_hit_a_rate_limit() {
    let echo = |id: &str| (id.to_string(), "mcp__fx__echo", r#"{"text": "again"}"#);
    let round: Vec<(String, &str, &str)> = ["call_1", "call_2", "call_3"].iter().map(|id| echo(id)).collect();
    let round: Vec<(&str, &str, &str)> = round.iter().map(|(id, n, a)| (id.as_str(), *n, *a)).collect();
    let limit = spear::api::RateLimit { per_minute: 1, burst: Some(2) };
    let chat = start_with(
        vec![calls(&round), answer("done within bounds")],
        |p| {
            p.rate_limits.insert("fx/echo".into(), limit);
        },
        UpstreamOverride::default(),
    )
    .await;
    let result = openai_sdk(&chat, &["selection"]).await;
    assert_eq!(result["content"], "done within bounds", "{result}");
    let statuses: Vec<&str> = result["spear"]["tool_calls"]
        .as_array()
        .expect("tool_calls")
        .iter()
        .filter_map(|c| c["status"].as_str())
        .collect();
    let limited = statuses.iter().filter(|s| **s == "mcp_rate_limited").count();
    assert_eq!((statuses.len(), limited), (3, 1), "{statuses:?}");
    let requests = chat.upstream.requests();
    let answers = tool_messages(&requests[1]);
    let told = answers.iter().find(|(_, text)| text.contains("mcp_rate_limited")).expect("the model is told");
    let error: Value = serde_json::from_str(&told.1).expect("the error object");
    assert_eq!(error["error"]["retryable"], true, "{error}");
    assert!(error["error"]["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0 && ms <= 60_000), "{error}");
}

/// A profile whose `defaultServers` is empty offers nothing to a request that names no server,
/// and the answer says so in `spear.warnings`.
#[tokio::test]
async fn an_empty_tool_set_is_a_warning_in_the_answer() {
    let chat =
        start_with(vec![answer("no tools")], |p| p.default_servers = Some(vec![]), UpstreamOverride::default()).await;
    let reply = chat.post(json!({"messages": user("x")})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let warnings = reply.json()["spear"]["warnings"].clone();
    let warnings: Vec<&str> = warnings.as_array().expect("warnings").iter().filter_map(Value::as_str).collect();
    assert!(warnings.iter().any(|w| w.contains("defaultServers: []")), "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("no MCP tool is offered")), "{warnings:?}");
    assert!(tool_names(&chat.upstream.requests()[0]).is_empty());
    // A request naming a server gets its tools and no warning.
    let chat =
        start_with(vec![answer("tools")], |p| p.default_servers = Some(vec![]), UpstreamOverride::default()).await;
    let reply = chat.post(json!({"messages": user("x"), "mcp": {"server_ids": ["fx"]}})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert!(reply.json()["spear"].get("warnings").is_none(), "{}", reply.text);
}

/// Runs `tests/servers/openai_client.py` against `chat` with `args`; its stdout as JSON.
async fn openai_sdk(chat: &Chat, args: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/servers/openai_client.py");
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(mcp_servers::python()).arg(script).arg(&chat.base_url).args(args).output(),
    )
    .await
    .expect("SDK script within 120 s")
    .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "SDK script failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test]
async fn relevance_selection_offers_k_tools_of_500_and_find_tools_reaches_the_rest() {
    const K: usize = 10;
    let upstream = ScriptedUpstream::start(vec![
        calls(&[("call_find", "mcp__spear__find_tools", r#"{"query": "star history of github repositories"}"#)]),
        calls(&[("call_star", "mcp__cat__github_star", r#"{"repos": "octocat/Hello-World"}"#)]),
        answer("done"),
    ])
    .await;
    let catalog = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/tool_retrieval/catalog.jsonl");
    let cat = mcp_servers::fixture_stdio(&["--catalog", catalog, "--catalog-tools", "500"]);
    let fixture = mcp_servers::fixture_stdio(&[]);
    let profile = McpProfile::test("p")
        .servers(["fx", "cat"])
        .upstream(&upstream.base_url)
        .upstream_model("test-model")
        .tool_selection(ToolSelection {
            mode: ToolSelectionMode::Relevance,
            max_tools: Some(K as u32),
            always_include: vec!["fx/echo".into()],
        });
    let audit_dir = tempfile::tempdir().expect("tempdir");
    let audit_path = audit_dir.path().join("audit.jsonl");
    let audit_file = std::fs::File::create(&audit_path).expect("audit file");
    let agent = start_agent_audited(
        vec![
            Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"])),
            Object::Server(McpServer::test("cat").running(&cat).allowing(["*"])),
            Object::Profile(profile),
        ],
        "p",
        AuditSink::new(Box::new(audit_file), false),
    )
    .await;
    let audited = agent.agent.clone();
    let chat = serve_chat(upstream, agent, UpstreamOverride::default()).await;
    let result = openai_sdk(&chat, &["selection"]).await;
    assert_eq!(result["content"], "done");

    let requests = chat.upstream.requests();
    assert_eq!(requests.len(), 3);
    let offered: Vec<Vec<String>> = requests.iter().map(tool_names).collect();
    let selections = result["spear"]["tool_selection"].as_array().expect("spear.tool_selection").clone();
    assert_eq!(selections.len(), 3, "one selection per upstream request");
    for (round, names) in offered.iter().enumerate() {
        let selection = &selections[round];
        assert_eq!(selection["of"], 510, "500 catalog tools and the fixture's 10");
        let why = |name: &str| {
            selection["tools"].as_array().expect("tools").iter().find(|t| t["name"] == name).map(|t| t["why"].clone())
        };
        // The bound of the issue: K ranked + called + alwaysInclude (+ found), plus the caller's
        // own tool and find_tools.
        let pinned = names.iter().filter(|n| why(n).is_some_and(|w| w != "ranked")).count();
        let ranked = names.iter().filter(|n| why(n).is_some_and(|w| w == "ranked")).count();
        assert_eq!(ranked, K, "round {round}: {names:?}");
        assert_eq!(names.len(), K + pinned + 2, "round {round}: {names:?}");
        assert_eq!(names[0], "get_weather", "the caller's tool comes first, every round");
        assert!(names.contains(&"mcp__spear__find_tools".to_string()));
        assert_eq!(why("mcp__fx__echo"), Some(json!("always_include")));
    }
    // Round 1: the user's words rank the catalog's user-details tool in.
    assert!(offered[0].contains(&"mcp__cat__get_user_info".to_string()), "{:?}", offered[0]);
    assert!(!offered[0].contains(&"mcp__cat__github_star".to_string()));
    // find_tools answered from the whole set, and what it found is offered from round 2 on.
    let found = &tool_messages(&requests[1])[0];
    assert_eq!(found.0, "call_find");
    assert!(found.1.contains("mcp__cat__github_star"), "{}", found.1);
    let answer: Value = serde_json::from_str(&found.1).expect("find_tools answers JSON");
    assert!(answer["tools"].as_array().is_some_and(|t| t.iter().all(|t| t["group"] == "cat")), "{answer}");
    assert_eq!(answer["groups"][0]["id"], "cat", "each found tool's server group: {answer}");
    assert!(offered[1].contains(&"mcp__cat__github_star".to_string()), "{:?}", offered[1]);
    // The found tool ran on its server; called, it stays offered.
    let star = tool_messages(&requests[2]).pop().expect("the star call's answer");
    assert_eq!(star, ("call_star".to_string(), r#"{"repos": "octocat/Hello-World"}"#.to_string()));
    let star_why =
        selections[2]["tools"].as_array().expect("tools").iter().find(|t| t["name"] == "mcp__cat__github_star");
    assert!(star_why.is_some_and(|t| t["why"] == "called" || t["why"] == "found"));
    let statuses: Vec<&Value> =
        result["spear"]["tool_calls"].as_array().expect("calls").iter().map(|c| &c["status"]).collect();
    assert_eq!(statuses, [&json!("ok"), &json!("ok")], "find_tools counts as a call");
    audited.flush_audit();
    let lines: Vec<Value> = std::fs::read_to_string(&audit_path)
        .expect("audit log")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("an audit line is JSON"))
        .filter(|l| l["kind"] != "effective_set")
        .collect();
    let called: Vec<(&str, &str)> =
        lines.iter().map(|l| (l["called_as"].as_str().unwrap_or(""), l["status"].as_str().unwrap_or(""))).collect();
    assert_eq!(called, [("mcp__spear__find_tools", "ok"), ("mcp__cat__github_star", "ok")]);
    assert!(lines[0].get("server_id").is_none(), "the agent answered find_tools itself");
}

#[tokio::test]
async fn resources_named_by_the_request_are_read_through_the_policy_and_attached_before_the_question() {
    let upstream = ScriptedUpstream::start(vec![answer("read it")]).await;
    let everything = mcp_servers::everything_stdio();
    let mut server = McpServer::test("everything").running(&everything).allowing(["echo"]);
    server.spec.allowed_resources = vec!["demo://resource/static/document/*".into()];
    server.spec.denied_resources = vec!["*/features.md".into()];
    let profile =
        McpProfile::test("p").servers(["everything"]).upstream(&upstream.base_url).upstream_model("test-model");
    let agent = start_agent(vec![Object::Server(server), Object::Profile(profile)], "p").await;
    let chat = serve_chat(upstream, agent, UpstreamOverride::default()).await;
    let doc = |name: &str| format!("spear://everything/demo://resource/static/document/{name}");

    let messages = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "summarize"}]);
    let ok = chat.post(json!({"messages": messages, "mcp": {"resources": [doc("instructions.md")]}})).await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    let sent = &chat.upstream.requests()[0].body["messages"];
    assert_eq!(sent.as_array().map(Vec::len), Some(3), "{sent}");
    assert_eq!(sent[2]["content"], "summarize", "the question stays last");
    let attached = sent[1]["content"].as_str().expect("the attachment");
    assert_eq!(sent[1]["role"], "user");
    assert!(attached.contains(&format!("<resource uri=\"{}\"", doc("instructions.md"))), "{attached}");
    assert!(attached.contains("trust=\"untrusted\""), "{attached}");

    let refused = chat.post(json!({"messages": messages, "mcp": {"resources": [doc("features.md")]}})).await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    let error = refused.json();
    assert_eq!(error["error"]["code"], "mcp_policy_denied");
    assert_eq!(error["error"]["param"], "mcp.resources");
    assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("denied_by:server")), "{error}");
    assert_eq!(chat.upstream.requests().len(), 1, "the model is not asked when an attachment is refused");
}
