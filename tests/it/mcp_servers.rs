//! The test MCP servers (`spear::testing::mcp_servers`, installed by `hack/mcp-servers.sh`) are
//! real and usable: each test spawns one, speaks MCP to it by hand (newline-delimited JSON-RPC
//! over stdio, or Streamable HTTP POSTs) with tokio + serde_json only, and kills it on drop. The
//! agent's own client is tested elsewhere; these tests only prove the peers and their knobs.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spear::testing::mcp_servers::{self, Command};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Protocol version the hand-written client offers; every server here speaks it.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// One answer: covers a cold node or python start (the SDK import) on a loaded 2-core CI box.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// The fixture server's tools, as `tests/servers/fixture_server.py` defines them.
const FIXTURE_TOOLS: [&str; 10] =
    ["add_tool", "ask", "big", "echo", "env", "flood_list_changed", "lists", "pid", "probe", "sleep"];

/// The result of a JSON-RPC response, panicking on an error response.
fn result_of(response: Value) -> Value {
    assert!(response.get("error").is_none(), "the server must answer without an error: {response}");
    response["result"].clone()
}

/// The names in a `tools/list` result.
fn tool_names(result: &Value) -> BTreeSet<String> {
    let tools = result["tools"].as_array().unwrap_or_else(|| panic!("tools/list must return tools: {result}"));
    tools.iter().filter_map(|tool| tool["name"].as_str().map(str::to_owned)).collect()
}

/// The text of a `tools/call` result (its text blocks, joined), asserting it is not an error.
fn text_of(result: &Value) -> String {
    assert_ne!(result["isError"], json!(true), "the tool call must succeed: {result}");
    let content = result["content"].as_array().unwrap_or_else(|| panic!("a tool result must have content: {result}"));
    content.iter().filter_map(|block| block["text"].as_str()).collect()
}

fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "spear-it", "version": "0"},
    })
}

// === stdio ===

/// An MCP server child over stdio; killed when dropped.
struct StdioPeer {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl StdioPeer {
    fn spawn(command: &Command) -> Self {
        let mut child = tokio::process::Command::from(command.to_std())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Inherited: a server's own log is the first thing to read when a test here fails.
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {command:?} must succeed: {e}"));
        let stdin = child.stdin.take().expect("stdin must be piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout must be piped")).lines();
        Self { child, stdin, stdout, next_id: 1 }
    }

    /// The next stdout line, raw.
    async fn line(&mut self) -> String {
        match tokio::time::timeout(ANSWER_TIMEOUT, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => panic!("the server closed stdout (exit: {:?})", self.child.try_wait()),
            Ok(Err(e)) => panic!("reading the server's stdout must succeed: {e}"),
            Err(_) => panic!("the server wrote nothing for {ANSWER_TIMEOUT:?}"),
        }
    }

    async fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.expect("writing to the server's stdin must succeed");
        self.stdin.flush().await.expect("flushing the server's stdin must succeed");
    }

    /// Sends requests with fresh ids, without waiting; returns the ids.
    async fn send_requests(&mut self, method: &str, params: &[Value]) -> Vec<u64> {
        let mut ids = Vec::new();
        for params in params {
            let id = self.next_id;
            self.next_id += 1;
            self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
            ids.push(id);
        }
        ids
    }

    /// Reads messages until the response to `id`, answering server requests with "method not
    /// found" and collecting notifications into `notifications`.
    async fn response(&mut self, id: u64, notifications: &mut Vec<Value>) -> Value {
        loop {
            let line = self.line().await;
            let message: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line must be JSON-RPC ({e}): {line}"));
            match (message.get("id"), message.get("method")) {
                (Some(got), None) if *got == json!(id) => return message,
                (Some(got), None) => panic!("unexpected response {got} while waiting for {id}: {message}"),
                (Some(request_id), Some(_)) => {
                    let reply = json!({"jsonrpc": "2.0", "id": request_id,
                        "error": {"code": -32601, "message": "not supported by this test client"}});
                    self.send(&reply).await;
                }
                (None, _) => notifications.push(message),
            }
        }
    }

    /// One request, answered: its result.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let ids = self.send_requests(method, &[params]).await;
        result_of(self.response(ids[0], &mut Vec::new()).await)
    }

    /// `initialize`, then `notifications/initialized`: the initialize result.
    async fn initialize(&mut self) -> Value {
        let result = self.request("initialize", initialize_params()).await;
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        result
    }

    async fn call_text(&mut self, tool: &str, arguments: Value) -> String {
        text_of(&self.request("tools/call", json!({"name": tool, "arguments": arguments})).await)
    }
}

#[tokio::test]
async fn fixture_server_answers_over_stdio() {
    let mut peer = StdioPeer::spawn(&mcp_servers::fixture_stdio(&[]));
    let init = peer.initialize().await;
    assert_eq!(init["serverInfo"]["name"], "spear-fixture", "{init}");
    assert_eq!(init["protocolVersion"], PROTOCOL_VERSION, "{init}");
    assert_eq!(init["capabilities"]["tools"]["listChanged"], true, "add_tool needs listChanged: {init}");

    let tools = tool_names(&peer.request("tools/list", json!({})).await);
    assert_eq!(tools, FIXTURE_TOOLS.iter().map(|name| (*name).to_owned()).collect());

    assert_eq!(peer.call_text("echo", json!({"text": "hello, MCP"})).await, "hello, MCP");
    assert_eq!(peer.call_text("sleep", json!({"ms": 10})).await, "slept");
    let big = peer.call_text("big", json!({"bytes": 100_000})).await;
    assert_eq!(big.len(), 100_000);
    assert!(big.is_ascii());

    let unknown = peer.send_requests("tools/call", &[json!({"name": "nope", "arguments": {}})]).await;
    let response = peer.response(unknown[0], &mut Vec::new()).await;
    assert_eq!(response["error"]["code"], -32602, "an unknown tool is a protocol error: {response}");
}

#[tokio::test]
async fn probe_reports_the_peak_of_concurrent_calls() {
    let mut peer = StdioPeer::spawn(&mcp_servers::fixture_stdio(&[]));
    peer.initialize().await;
    // Three calls in flight at once: each sleeps long enough for all three to overlap.
    let calls = vec![json!({"name": "probe", "arguments": {"ms": 500}}); 3];
    let ids = peer.send_requests("tools/call", &calls).await;
    let mut peaks = Vec::new();
    for id in ids {
        peaks.push(text_of(&result_of(peer.response(id, &mut Vec::new()).await)));
    }
    assert_eq!(peaks, ["3", "3", "3"], "the server must run the three calls concurrently");
    // A later lone call still reports the peak seen so far.
    assert_eq!(peer.call_text("probe", json!({"ms": 1})).await, "3");
}

#[tokio::test]
async fn add_tool_registers_a_tool_and_sends_list_changed() {
    let mut peer = StdioPeer::spawn(&mcp_servers::fixture_stdio(&["--stderr-chatter"]));
    peer.initialize().await;
    let ids = peer.send_requests("tools/call", &[json!({"name": "add_tool", "arguments": {"name": "shout"}})]).await;
    let mut notifications = Vec::new();
    let added = text_of(&result_of(peer.response(ids[0], &mut notifications).await));
    assert_eq!(added, "added shout");
    assert!(
        notifications.iter().any(|n| n["method"] == "notifications/tools/list_changed"),
        "add_tool must notify before answering: {notifications:?}"
    );
    assert!(tool_names(&peer.request("tools/list", json!({})).await).contains("shout"));
    assert_eq!(peer.call_text("shout", json!({"text": "hey"})).await, "hey");
}

#[tokio::test]
async fn everything_and_filesystem_servers_list_tools_over_stdio() {
    let mut everything = StdioPeer::spawn(&mcp_servers::everything_stdio());
    let init = everything.initialize().await;
    assert!(init["serverInfo"]["name"].is_string(), "{init}");
    assert!(tool_names(&everything.request("tools/list", json!({})).await).contains("echo"));
    assert_eq!(everything.call_text("echo", json!({"message": "hi"})).await, "Echo: hi");

    let root = tempfile::tempdir().expect("a temp dir must be creatable");
    let file = root.path().join("hello.txt");
    std::fs::write(&file, "hello from spear\n").expect("the test file must be writable");
    let mut filesystem = StdioPeer::spawn(&mcp_servers::filesystem_stdio(root.path()));
    filesystem.initialize().await;
    let tools = tool_names(&filesystem.request("tools/list", json!({})).await);
    // 2026.8.31 has both; read_file is the deprecated alias of read_text_file.
    assert!(tools.contains("read_text_file") && tools.contains("read_file"), "{tools:?}");
    let path = file.to_string_lossy();
    assert_eq!(filesystem.call_text("read_text_file", json!({"path": path})).await, "hello from spear\n");
}

#[tokio::test]
async fn garbage_flag_writes_a_non_json_line_first() {
    let mut peer = StdioPeer::spawn(&mcp_servers::fixture_stdio(&["--garbage-stdout"]));
    let first = peer.line().await;
    assert_eq!(first, "this is not json");
    assert!(serde_json::from_str::<Value>(&first).is_err());
    // Then it behaves normally.
    peer.initialize().await;
    assert_eq!(peer.call_text("echo", json!({"text": "still here"})).await, "still here");
}

#[tokio::test]
async fn hang_flag_never_answers() {
    let mut peer = StdioPeer::spawn(&mcp_servers::fixture_stdio(&["--hang"]));
    peer.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params()})).await;
    // Long enough for a normal start to answer (about 1 s), short enough to keep the suite quick.
    let silence = tokio::time::timeout(Duration::from_secs(3), peer.stdout.next_line()).await;
    assert!(silence.is_err(), "a hanging server must not answer: {silence:?}");
}

#[tokio::test]
async fn env_tool_reports_the_child_environment() {
    let mut command = mcp_servers::fixture_stdio(&[]);
    command.env.push(("SPEAR_FIXTURE_PROBE".to_owned(), "passed through".to_owned()));
    let mut peer = StdioPeer::spawn(&command);
    peer.initialize().await;
    assert_eq!(peer.call_text("env", json!({"name": "SPEAR_FIXTURE_PROBE"})).await, "passed through");
    assert_eq!(peer.call_text("env", json!({"name": "SPEAR_FIXTURE_NEVER_SET"})).await, "<unset>");
    let pid = peer.call_text("pid", json!({})).await;
    assert_eq!(pid.parse::<u32>().ok(), peer.child.id(), "pid must be the spawned child's");
}

// === Streamable HTTP ===

/// An MCP session over Streamable HTTP: POSTs JSON-RPC to `/mcp`, carrying `Mcp-Session-Id`.
struct HttpPeer {
    client: reqwest::Client,
    url: String,
    session: Option<String>,
    next_id: u64,
}

impl HttpPeer {
    fn new(port: u16) -> Self {
        // reqwest here is built with rustls but no provider (rmcp's features), so a Client needs a
        // process-wide one; the Err when another test installed it first is expected.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self { client: reqwest::Client::new(), url: format!("http://127.0.0.1:{port}/mcp"), session: None, next_id: 1 }
    }

    /// POSTs one message: the JSON-RPC response for a request (from a JSON body or an SSE
    /// `data:` line), `None` for an accepted notification.
    async fn post(&mut self, message: &Value) -> Option<Value> {
        let mut request = self
            .client
            .post(&self.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(message.to_string());
        if let Some(session) = &self.session {
            request = request.header("Mcp-Session-Id", session).header("MCP-Protocol-Version", PROTOCOL_VERSION);
        }
        let response = tokio::time::timeout(ANSWER_TIMEOUT, request.send())
            .await
            .unwrap_or_else(|_| panic!("no HTTP answer within {ANSWER_TIMEOUT:?}"))
            .expect("the POST must succeed");
        let status = response.status();
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.session = Some(session.to_str().expect("Mcp-Session-Id must be ASCII").to_owned());
        }
        let event_stream = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("text/event-stream"));
        let body = tokio::time::timeout(ANSWER_TIMEOUT, response.text())
            .await
            .unwrap_or_else(|_| panic!("the body did not end within {ANSWER_TIMEOUT:?}"))
            .expect("the body must be readable");
        assert!(status.is_success(), "POST {message} answered {status}: {body}");
        let id = message.get("id")?;
        let mut candidates: Vec<Value> = if event_stream {
            body.lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str(data.trim()).ok())
                .collect()
        } else {
            vec![serde_json::from_str(&body).unwrap_or_else(|e| panic!("the body must be JSON ({e}): {body}"))]
        };
        candidates.retain(|candidate| candidate.get("id") == Some(id) && candidate.get("method").is_none());
        Some(candidates.pop().unwrap_or_else(|| panic!("no response to {id} in: {body}")))
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        result_of(self.post(&message).await.expect("a request must be answered"))
    }

    async fn initialize(&mut self) -> Value {
        let result = self.request("initialize", initialize_params()).await;
        assert!(self.session.is_some(), "a stateful server must assign Mcp-Session-Id");
        let answer = self.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        assert!(answer.is_none());
        result
    }
}

/// Spawns an HTTP server command and waits for its port; the child dies with the returned guard.
async fn spawn_http(command: &Command, port: u16) -> Child {
    let child = tokio::process::Command::from(command.to_std())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {command:?} must succeed: {e}"));
    let start = Instant::now();
    assert!(mcp_servers::wait_for_http(port, ANSWER_TIMEOUT).await, "{command:?} never listened on {port}");
    println!("{} listening after {:?}", command.program.display(), start.elapsed());
    child
}

#[tokio::test]
async fn fixture_server_answers_over_streamable_http() {
    let port = mcp_servers::free_port();
    let _server = spawn_http(&mcp_servers::fixture_http(port, &[]), port).await;
    let mut peer = HttpPeer::new(port);
    let init = peer.initialize().await;
    assert_eq!(init["serverInfo"]["name"], "spear-fixture", "{init}");
    let tools = tool_names(&peer.request("tools/list", json!({})).await);
    assert_eq!(tools, FIXTURE_TOOLS.iter().map(|name| (*name).to_owned()).collect());
    let echoed = peer.request("tools/call", json!({"name": "echo", "arguments": {"text": "over http"}})).await;
    assert_eq!(text_of(&echoed), "over http");
}

#[tokio::test]
async fn everything_server_answers_over_streamable_http() {
    let port = mcp_servers::free_port();
    let _server = spawn_http(&mcp_servers::everything_http(port), port).await;
    let mut peer = HttpPeer::new(port);
    peer.initialize().await;
    assert!(tool_names(&peer.request("tools/list", json!({})).await).contains("echo"));
    let echoed = peer.request("tools/call", json!({"name": "echo", "arguments": {"message": "hi"}})).await;
    assert_eq!(text_of(&echoed), "Echo: hi");
}
