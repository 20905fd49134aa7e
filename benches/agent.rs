//! The agent's own cost, measured against bare baselines in the same run (issue 6):
//!
//! - latency of `tools/call` on an echo tool: S = bare rmcp client → echo server over stdio;
//!   H = bare rmcp Streamable HTTP client → echo server over HTTP; A = the same HTTP client →
//!   `spearlet serve` `/mcp` → the echo server over stdio. Target: p50(A) ≤ p50(S) + p50(H) + 50 µs,
//!   p99(A) ≤ p99(S) + p99(H) + 200 µs. Measured twice: call by call in turn (each process
//!   idle between its calls), and back to back in blocks as `../shared/bench/side-by-side` does
//!   (hot processes), where the agent's share is (A - S) / H, that bench's (G - A) / F2.
//! - gRPC: G = a bare tonic unary echo (the same `CallTool` messages, answered in its own process);
//!   AG = `spearlet` gRPC `CallTool` → the echo server over stdio. Target as above with G for H.
//! - both MCP revisions: H and A with 2025-11-25 session clients, H26 and A26 the same with
//!   2026-07-28 stateless clients (`server/discover`, no session); latency and throughput each.
//! - throughput: 64 concurrent HTTP clients for 10 s on H and on A (and H26/A26); target A ≥ 0.8 × H,
//!   0 errors; with each process's CPU time per call (from `/proc`), to show where a call's cost
//!   goes. AB is A in front of an echo server on tokio's blocking stdin/stdout (how servers on
//!   rmcp's `transport::stdio()` read), to show what such a server costs beside the agent.
//! - chat-loop overhead: one completion with one tool round through the agent (a scripted
//!   upstream in this process, standing in for a hosted model API; the echo tool over stdio)
//!   against the same three steps made directly (upstream, bare stdio call, upstream); target
//!   ≤ 1 ms per round.
//! - tracing off vs on (issue 17): A against AT, the same agent exporting every span over
//!   OTLP/HTTP to a loopback sink in this process; latency alternating, CPU per call, RSS.
//! - the pod's API key: A against AK, the same agent with `--api-key` and clients sending it;
//!   latency alternating, throughput and CPU per call.
//! - idle RSS of `spearlet serve` on `examples/registry` with its servers connected (target
//!   ≤ 15 MiB), next to the RSS of the bare echo server process as a floor.
//!
//! Run: `cargo bench --bench agent`. The echo servers are this binary re-run with `--serve-echo`
//! (stdio) or `--serve-echo-http PORT`, so no interpreter's speed is in the figures; the agent is
//! the real `spearlet` binary of the same build. Latency calls alternate one by one between the
//! clients so drift (other load, CPU idle states) hits all alike. Without `--bench` (under
//! `cargo test --all-targets`) it is a short smoke run of the harness.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use serde_json::json;
use spear::agent::grpc::pb;
use spear::agent::grpc::pb::mcp_sessions_client::McpSessionsClient;
use spear::agent::grpc::pb::mcp_sessions_server::{McpSessions, McpSessionsServer};
use spear::testing::bench::{percentile, us};
use spear::testing::proc_stats::{cpu_time, rss_kib};
use spear::testing::{echo, mcp_servers};
use tonic::{Request, Response, Status};

type Client = RunningService<RoleClient, ()>;

/// Bench size: full under `cargo bench`, tiny as a smoke test.
struct Size {
    latency_calls: usize,
    clients: usize,
    throughput_for: Duration,
    idle_rss: bool,
}

async fn call(client: &Client, tool: &str) -> Result<Duration, String> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    params.arguments = json!({"text": "ping"}).as_object().cloned();
    let started = Instant::now();
    let result = client.peer().call_tool(params).await.map_err(|e| e.to_string())?;
    if result.is_error == Some(true) {
        return Err(format!("tool error: {:?}", result.content));
    }
    Ok(started.elapsed())
}

async fn http_client(url: &str) -> Client {
    http_client_speaking(url, Revision::Sessions, None).await
}

/// The two MCP revisions a client may speak: 2025-11-25 (`initialize`, a session) and
/// 2026-07-28 (`server/discover`, then stateless requests with `_meta`).
#[derive(Clone, Copy, PartialEq)]
enum Revision {
    Sessions,
    Stateless,
}

/// An HTTP MCP client of `url` speaking `revision`, sending `key` as its bearer token when given.
async fn http_client_speaking(url: &str, revision: Revision, key: Option<&str>) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    if let Some(key) = key {
        config = config.auth_header(key);
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    let client = match revision {
        Revision::Sessions => ().serve(transport).await,
        Revision::Stateless => {
            let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
            ().serve_with_lifecycle(transport, lifecycle).await
        }
    };
    client.expect("an HTTP MCP client")
}

/// A child process killed when dropped.
struct Spawned(tokio::process::Child);

fn spawn(command: &mut tokio::process::Command) -> Spawned {
    Spawned(command.kill_on_drop(true).spawn().expect("a bench process starts"))
}

/// The first child process of `pid` (the agent's stdio server), if any.
fn first_child(pid: u32) -> Option<u32> {
    let output = std::process::Command::new("pgrep").args(["-P", &pid.to_string()]).output().ok()?;
    String::from_utf8_lossy(&output.stdout).split_whitespace().next()?.parse().ok()
}

/// [`throughput`], also printing each process's CPU time per call, to show where a call's
/// cost goes and how busy the machine was.
async fn throughput_with_cpu(
    label: &str,
    url: &str,
    tool: &str,
    revision: Revision,
    size: &Size,
    processes: &[(&str, u32)],
    key: Option<&str>,
) -> (u64, u64) {
    let before: Vec<Duration> = processes.iter().map(|(_, pid)| cpu_time(*pid)).collect();
    let started = Instant::now();
    let (calls, errors) = throughput(url, tool, revision, size.clients, size.throughput_for, key).await;
    let wall = started.elapsed();
    let used: Vec<Duration> =
        processes.iter().zip(&before).map(|((_, pid), before)| cpu_time(*pid).saturating_sub(*before)).collect();
    let per_call: Vec<String> = processes
        .iter()
        .zip(&used)
        .map(|((name, _), used)| format!("{name} {:.0}", us(*used) / calls.max(1) as f64))
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let busy = used.iter().sum::<Duration>().as_secs_f64() / (wall.as_secs_f64() * cores);
    println!(
        "  {label}: CPU per call (us): {}; these processes kept {:.0}% of {cores} cores busy",
        per_call.join(" + "),
        busy * 100.0
    );
    (calls, errors)
}

/// A bare tonic unary echo: `CallTool` answers with its arguments as text, nothing else.
struct GrpcEcho;

#[tonic::async_trait]
impl McpSessions for GrpcEcho {
    async fn open(&self, _: Request<pb::OpenRequest>) -> Result<Response<pb::OpenReply>, Status> {
        Err(Status::unimplemented("echo only"))
    }
    async fn list_tools(&self, _: Request<pb::ListToolsRequest>) -> Result<Response<pb::ListToolsReply>, Status> {
        Err(Status::unimplemented("echo only"))
    }
    async fn call_tool(&self, request: Request<pb::CallToolRequest>) -> Result<Response<pb::CallToolReply>, Status> {
        let request = request.into_inner();
        Ok(Response::new(pb::CallToolReply { status: "ok".into(), text: request.args_json, ..Default::default() }))
    }
    async fn close(&self, _: Request<pb::CloseRequest>) -> Result<Response<pb::CloseReply>, Status> {
        Err(Status::unimplemented("echo only"))
    }
    async fn list_resources(
        &self,
        _: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesReply>, Status> {
        Err(Status::unimplemented("echo only"))
    }
    async fn read_resource(
        &self,
        _: Request<pb::ReadResourceRequest>,
    ) -> Result<Response<pb::ReadResourceReply>, Status> {
        Err(Status::unimplemented("echo only"))
    }
    async fn list_prompts(&self, _: Request<pb::ListPromptsRequest>) -> Result<Response<pb::ListPromptsReply>, Status> {
        Err(Status::unimplemented("echo only"))
    }
    async fn get_prompt(&self, _: Request<pb::GetPromptRequest>) -> Result<Response<pb::GetPromptReply>, Status> {
        Err(Status::unimplemented("echo only"))
    }
}

async fn grpc_call(client: &mut McpSessionsClient<tonic::transport::Channel>, session: &str, tool: &str) -> Duration {
    let request = pb::CallToolRequest {
        session_id: session.to_string(),
        tool: tool.to_string(),
        args_json: r#"{"text":"ping"}"#.to_string(),
    };
    let started = Instant::now();
    let reply = client.call_tool(request).await.expect("gRPC CallTool").into_inner();
    assert!(reply.error.is_none(), "{reply:?}");
    started.elapsed()
}

/// The scripted upstream: stands in for a hosted model API (the only double). The first round
/// asks for the echo tool; once a tool message is in the conversation it answers.
async fn scripted_upstream(axum::Json(body): axum::Json<serde_json::Value>) -> axum::Json<serde_json::Value> {
    let answered = body["messages"].as_array().is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
    let message = if answered {
        json!({"role": "assistant", "content": "done"})
    } else {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "mcp__echo__echo", "arguments": "{\"text\":\"ping\"}"}}]})
    };
    let finish = if answered { "stop" } else { "tool_calls" };
    axum::Json(json!({"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}]}))
}

/// Starts `spearlet serve` on free ports over `dir`; returns it and its HTTP and admin ports.
async fn start_agent(dir: &Path, profile: &str, audit: &Path) -> (Spawned, u16, u16) {
    let (agent, http, _, admin) = start_agent_with(dir, profile, audit, &[]).await;
    (agent, http, admin)
}

/// [`start_agent`] with extra flags; also returns the gRPC port.
async fn start_agent_with(dir: &Path, profile: &str, audit: &Path, extra: &[&str]) -> (Spawned, u16, u16, u16) {
    start_agent_env(dir, profile, audit, extra, &[]).await
}

/// [`start_agent_with`] with extra environment variables.
async fn start_agent_env(
    dir: &Path,
    profile: &str,
    audit: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Spawned, u16, u16, u16) {
    let (http, grpc, admin) = (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let agent = spawn(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .arg("serve")
            .arg("--registry-dir")
            .arg(dir)
            .args(["--profile", profile])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .arg("--audit-log")
            .arg(audit)
            .args(extra)
            .envs(env.iter().copied())
            .env("SPEAR_LOG", "warn")
            .stdin(Stdio::null()),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(admin).await {
        assert!(Instant::now() < deadline, "spearlet serve not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (agent, http, grpc, admin)
}

async fn ready(admin: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", admin)).await else { return false };
    let request = "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text).await;
    text.starts_with("HTTP/1.1 200")
}

/// A registry with one stdio echo server (the bench binary run with `args`) and profile `bench`.
fn echo_registry(dir: &Path, exe: &Path, args: &str) {
    let yaml = format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: echo\nspec:\n  transport: stdio\n  \
         stdio:\n    command: {:?}\n    args: {args}\n  allowedTools: [\"*\"]\n  \
         budgets: {{maxConcurrency: 64}}\n---\n\
         apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: bench\nspec:\n  servers: [echo]\n",
        exe.display().to_string()
    );
    std::fs::write(dir.join("echo.yaml"), yaml).expect("write the bench registry");
}

/// `clients` sessions calling `tool` in a loop for `duration`: (calls, errors).
async fn throughput(
    url: &str,
    tool: &str,
    revision: Revision,
    clients: usize,
    duration: Duration,
    key: Option<&str>,
) -> (u64, u64) {
    let mut sessions = Vec::with_capacity(clients);
    for _ in 0..clients {
        sessions.push(http_client_speaking(url, revision, key).await);
    }
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = sessions
        .into_iter()
        .map(|client| {
            let (calls, errors, tool) = (calls.clone(), errors.clone(), tool.to_string());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    match call(&client, &tool).await {
                        Ok(_) => calls.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
                let _ = client.cancel().await;
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    (calls.load(Ordering::Relaxed), errors.load(Ordering::Relaxed))
}

async fn run(size: Size) {
    let exe: PathBuf = std::env::current_exe().expect("the bench binary's path");
    let dir = tempfile::tempdir().expect("a temp dir");

    // S: bare rmcp over stdio.
    let mut stdio_echo =
        spawn(tokio::process::Command::new(&exe).arg("--serve-echo").stdin(Stdio::piped()).stdout(Stdio::piped()));
    let (stdin, stdout) = (stdio_echo.0.stdin.take().expect("stdin"), stdio_echo.0.stdout.take().expect("stdout"));
    let bare_stdio: Client = ().serve((stdout, stdin)).await.expect("bare stdio client");

    // H: bare rmcp over Streamable HTTP, to an echo server in its own process.
    let echo_port = mcp_servers::free_port();
    let http_echo = spawn(tokio::process::Command::new(&exe).args(["--serve-echo-http", &echo_port.to_string()]));
    assert!(mcp_servers::wait_for_http(echo_port, Duration::from_secs(10)).await, "the HTTP echo server listens");
    let echo_url = format!("http://127.0.0.1:{echo_port}/mcp");
    let bare_http = http_client(&echo_url).await;
    let bare_http_stateless = http_client_speaking(&echo_url, Revision::Stateless, None).await;

    // A: the agent, forwarding to the echo server over stdio.
    let registry = dir.path().join("registry");
    std::fs::create_dir(&registry).expect("registry dir");
    echo_registry(&registry, &exe, r#"["--serve-echo"]"#);
    // The scripted upstream for the chat loop, in this process.
    let upstream_listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("upstream port");
    let upstream_port = upstream_listener.local_addr().expect("upstream addr").port();
    let upstream = axum::Router::new().route("/v1/chat/completions", axum::routing::post(scripted_upstream));
    tokio::spawn(async move { axum::serve(upstream_listener, upstream).await });
    let upstream_url = format!("http://127.0.0.1:{upstream_port}/v1");
    let (agent, agent_http, agent_grpc, _) =
        start_agent_with(&registry, "bench", &dir.path().join("audit.log"), &["--upstream-url", &upstream_url]).await;
    let agent_url = format!("http://127.0.0.1:{agent_http}/mcp");
    let through_agent = http_client(&agent_url).await;
    let through_agent_stateless = http_client_speaking(&agent_url, Revision::Stateless, None).await;

    // G: a bare tonic echo in its own process; AG: the agent's gRPC door.
    let grpc_echo_port = mcp_servers::free_port();
    let _grpc_echo = spawn(tokio::process::Command::new(&exe).args(["--serve-grpc-echo", &grpc_echo_port.to_string()]));
    assert!(mcp_servers::wait_for_http(grpc_echo_port, Duration::from_secs(10)).await, "the gRPC echo listens");
    let channel = |port: u16| async move {
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("an endpoint")
            .connect()
            .await
            .expect("a gRPC channel")
    };
    let mut bare_grpc = McpSessionsClient::new(channel(grpc_echo_port).await);
    let mut agent_grpc = McpSessionsClient::new(channel(agent_grpc).await);
    let session = agent_grpc
        .open(pb::OpenRequest { server_id: "echo".into(), ..Default::default() })
        .await
        .expect("a gRPC session")
        .into_inner()
        .session_id;

    // Chat: the direct sequence and the same through the agent.
    let http = reqwest::Client::new();
    let chat_body = json!({"model": "scripted", "messages": [{"role": "user", "content": "echo ping"}]});
    let upstream_completions = format!("{upstream_url}/chat/completions");
    let agent_completions = format!("http://127.0.0.1:{agent_http}/v1/chat/completions");
    let post = |url: String, body: serde_json::Value| {
        let http = http.clone();
        async move {
            let response = http.post(url).json(&body).send().await.expect("a chat request");
            assert!(response.status().is_success(), "{}", response.status());
            response.json::<serde_json::Value>().await.expect("a JSON completion")
        }
    };
    let direct_chat = || async {
        let started = Instant::now();
        let first = post(upstream_completions.clone(), chat_body.clone()).await;
        call(&bare_stdio, "echo").await.expect("the direct tool call");
        let mut messages = chat_body["messages"].as_array().cloned().unwrap_or_default();
        messages.push(first["choices"][0]["message"].clone());
        messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "ping"}));
        post(upstream_completions.clone(), json!({"model": "scripted", "messages": messages})).await;
        started.elapsed()
    };
    let agent_chat = || async {
        let started = Instant::now();
        let answer = post(agent_completions.clone(), chat_body.clone()).await;
        assert_eq!(answer["choices"][0]["message"]["content"], "done", "{answer}");
        started.elapsed()
    };

    for _ in 0..50 {
        call(&bare_stdio, "echo").await.expect("S warm-up");
        call(&bare_http, "echo").await.expect("H warm-up");
        call(&through_agent, "mcp__echo__echo").await.expect("A warm-up");
        call(&bare_http_stateless, "echo").await.expect("H26 warm-up");
        call(&through_agent_stateless, "mcp__echo__echo").await.expect("A26 warm-up");
        grpc_call(&mut bare_grpc, "", "echo").await;
        grpc_call(&mut agent_grpc, &session, "echo").await;
        direct_chat().await;
        agent_chat().await;
    }
    let mut samples: [Vec<Duration>; 9] = Default::default();
    for _ in 0..size.latency_calls {
        samples[0].push(call(&bare_stdio, "echo").await.expect("S"));
        samples[1].push(call(&bare_http, "echo").await.expect("H"));
        samples[2].push(call(&through_agent, "mcp__echo__echo").await.expect("A"));
        samples[3].push(grpc_call(&mut bare_grpc, "", "echo").await);
        samples[4].push(grpc_call(&mut agent_grpc, &session, "echo").await);
        samples[5].push(direct_chat().await);
        samples[6].push(agent_chat().await);
        samples[7].push(call(&bare_http_stateless, "echo").await.expect("H26"));
        samples[8].push(call(&through_agent_stateless, "mcp__echo__echo").await.expect("A26"));
    }
    for s in &mut samples {
        s.sort();
    }
    let p = |i: usize, q: f64| us(percentile(&samples[i], q));
    println!("agent bench: latency, {} calls per client, alternating call by call", samples[0].len());
    println!("{:<44} {:>10} {:>10}", "client", "p50 us", "p99 us");
    let rows = [
        "S  bare rmcp, stdio",
        "H  bare rmcp, Streamable HTTP",
        "A  HTTP client -> spearlet /mcp -> stdio",
        "G  bare tonic unary echo",
        "AG gRPC CallTool -> spearlet -> stdio",
        "chat, direct (upstream, tool, upstream)",
        "chat, through spearlet (one tool round)",
        "H26 bare rmcp, HTTP, 2026-07-28 stateless",
        "A26 2026-07-28 client -> spearlet -> stdio",
    ];
    for (i, name) in rows.iter().enumerate() {
        println!("{name:<44} {:>10.1} {:>10.1}", p(i, 0.5), p(i, 0.99));
    }
    // Each path through the agent against its two bare hops: S plus the matching bare door,
    // with 50 us (p50) and 200 us (p99) of allowance.
    let against_budget = |name: &str, through: usize, door: &str, bare: usize| {
        let (b50, b99) = (p(0, 0.5) + p(bare, 0.5) + 50.0, p(0, 0.99) + p(bare, 0.99) + 200.0);
        println!(
            "{name} p50 {:.1} us vs S+{door}+50 = {b50:.1} us (ratio {:.2}); {name} p99 {:.1} us vs S+{door}+200 = {b99:.1} us (ratio {:.2})",
            p(through, 0.5),
            p(through, 0.5) / b50,
            p(through, 0.99),
            p(through, 0.99) / b99
        );
    };
    against_budget("A", 2, "H", 1);
    println!("agent-added p50 over S+H: {:.1} us", p(2, 0.5) - p(0, 0.5) - p(1, 0.5));
    against_budget("A26", 8, "H26", 7);
    against_budget("AG", 4, "G", 3);
    // Two upstream rounds per completion; the difference also holds the client's hop to the agent.
    println!(
        "chat-loop overhead per round (p50): {:.1} us (through agent {:.1} us - direct {:.1} us, over 2 rounds)",
        (p(6, 0.5) - p(5, 0.5)) / 2.0,
        p(6, 0.5),
        p(5, 0.5)
    );

    // Back to back, as `../shared/bench/side-by-side` measures: each client makes a block of
    // calls in a row (its processes stay hot, as with one busy client), the clients taking turns
    // block by block so drift still hits all alike. There the agent's share is (G - A) / F2 with
    // npm server-everything; here the same ratio with this binary's echo server: (A - S) / H.
    const BLOCK: usize = 200;
    let mut back_to_back: [Vec<Duration>; 3] = Default::default();
    for _ in 0..size.latency_calls.div_ceil(BLOCK) {
        for _ in 0..BLOCK.min(size.latency_calls) {
            back_to_back[0].push(call(&bare_stdio, "echo").await.expect("S"));
        }
        for _ in 0..BLOCK.min(size.latency_calls) {
            back_to_back[1].push(call(&bare_http, "echo").await.expect("H"));
        }
        for _ in 0..BLOCK.min(size.latency_calls) {
            back_to_back[2].push(call(&through_agent, "mcp__echo__echo").await.expect("A"));
        }
    }
    for s in &mut back_to_back {
        s.sort();
    }
    let b = |i: usize, q: f64| us(percentile(&back_to_back[i], q));
    println!(
        "back to back, {} calls each in blocks of {BLOCK}: S p50 {:.1} us, H p50 {:.1} us, A p50 {:.1} us; \
         the agent's share (A - S) / H = {:.2} (side by side: (G - A) / F2, target <= 1.0)",
        back_to_back[0].len(),
        b(0, 0.5),
        b(1, 0.5),
        b(2, 0.5),
        (b(2, 0.5) - b(0, 0.5)) / b(1, 0.5)
    );

    // Throughput: the same number of clients against H, then A.
    let secs = size.throughput_for.as_secs_f64();
    let bench_pid = std::process::id();
    let h_processes = [("clients", bench_pid), ("echo HTTP server", http_echo.0.id().unwrap_or(0))];
    let (h_calls, h_errors) =
        throughput_with_cpu("H", &echo_url, "echo", Revision::Sessions, &size, &h_processes, None).await;
    let agent_pid = agent.0.id().unwrap_or(0);
    let a_processes =
        [("clients", bench_pid), ("agent", agent_pid), ("stdio echo server", first_child(agent_pid).unwrap_or(0))];
    let (a_calls, a_errors) =
        throughput_with_cpu("A", &agent_url, "mcp__echo__echo", Revision::Sessions, &size, &a_processes, None).await;
    println!(
        "throughput, {} clients for {secs:.1} s: H {:.0} calls/s ({h_errors} errors), A {:.0} calls/s ({a_errors} errors), A/H {:.2}",
        size.clients,
        h_calls as f64 / secs,
        a_calls as f64 / secs,
        a_calls as f64 / h_calls.max(1) as f64
    );
    // The same with 2026-07-28 stateless clients on both sides.
    let (h26_calls, h26_errors) =
        throughput_with_cpu("H26", &echo_url, "echo", Revision::Stateless, &size, &h_processes, None).await;
    let (a26_calls, a26_errors) =
        throughput_with_cpu("A26", &agent_url, "mcp__echo__echo", Revision::Stateless, &size, &a_processes, None).await;
    println!(
        "throughput, 2026-07-28 stateless: H26 {:.0} calls/s ({h26_errors} errors), A26 {:.0} calls/s ({a26_errors} errors), A26/H26 {:.2}",
        h26_calls as f64 / secs,
        a26_calls as f64 / secs,
        a26_calls as f64 / h26_calls.max(1) as f64
    );
    // The same agent with a two-thread runtime (the default is one thread).
    let (agent2, agent2_http, _, _) =
        start_agent_with(&registry, "bench", &dir.path().join("audit2.log"), &["--worker-threads", "2"]).await;
    let agent2_url = format!("http://127.0.0.1:{agent2_http}/mcp");
    let (a2_calls, a2_errors) =
        throughput(&agent2_url, "mcp__echo__echo", Revision::Sessions, size.clients, size.throughput_for, None).await;
    println!(
        "throughput, agent with --worker-threads 2: {:.0} calls/s ({a2_errors} errors), A2/H {:.2}",
        a2_calls as f64 / secs,
        a2_calls as f64 / h_calls.max(1) as f64
    );
    drop(agent2);
    // The same agent in front of an echo server on tokio's blocking stdio, as servers written on
    // rmcp's `transport::stdio()` read: that server's own cost, not the agent's, is the difference.
    let blocking_registry = dir.path().join("registry-tokio-stdio");
    std::fs::create_dir(&blocking_registry).expect("registry dir");
    echo_registry(&blocking_registry, &exe, r#"["--serve-echo", "--tokio-stdio"]"#);
    let (agent3, agent3_http, _, _) =
        start_agent_with(&blocking_registry, "bench", &dir.path().join("audit3.log"), &[]).await;
    let agent3_pid = agent3.0.id().unwrap_or(0);
    let a3_processes =
        [("clients", bench_pid), ("agent", agent3_pid), ("stdio echo server", first_child(agent3_pid).unwrap_or(0))];
    let agent3_url = format!("http://127.0.0.1:{agent3_http}/mcp");
    let (a3_calls, a3_errors) =
        throughput_with_cpu("AB", &agent3_url, "mcp__echo__echo", Revision::Sessions, &size, &a3_processes, None).await;
    println!(
        "throughput, agent -> echo server on tokio's blocking stdio: {:.0} calls/s ({a3_errors} errors), AB/H {:.2}",
        a3_calls as f64 / secs,
        a3_calls as f64 / h_calls.max(1) as f64
    );
    drop(agent3);
    tracing_cost(&registry, dir.path(), &size, &agent_url, a_calls).await;
    api_key_cost(&registry, dir.path(), &size, &agent_url, a_calls).await;
    println!(
        "RSS after load: agent {:.1} MiB, bare echo server {:.1} MiB",
        rss_kib(agent_pid) as f64 / 1024.0,
        rss_kib(stdio_echo.0.id().unwrap_or(0)) as f64 / 1024.0
    );
    drop(agent);

    // Idle RSS on the example registry, its servers connected (everything over HTTP too, when
    // the npm servers are installed). Its servers start with `npx`: not in the smoke run.
    if size.idle_rss {
        idle_rss(dir.path(), stdio_echo.0.id().unwrap_or(0)).await;
    }
}

/// Tracing off vs on (issue 17): A (no `OTEL_*` set: no OTel layer) against AT, the same agent
/// exporting every span over OTLP/HTTP to a loopback sink in this process (it takes the batches
/// and answers 200, as a collector's receiver does). Latency alternates A and AT call by call;
/// AT's throughput and CPU per call compare with A's above.
async fn tracing_cost(registry: &Path, dir: &Path, size: &Size, agent_url: &str, a_calls: u64) {
    let batches = Arc::new(AtomicU64::new(0));
    let sink_listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("sink port");
    let sink_port = sink_listener.local_addr().expect("sink addr").port();
    let counted = batches.clone();
    let sink = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |_body: axum::body::Bytes| async move {
            counted.fetch_add(1, Ordering::Relaxed);
            ""
        }),
    );
    tokio::spawn(async move { axum::serve(sink_listener, sink).await });
    let endpoint = format!("http://127.0.0.1:{sink_port}");
    let (traced, traced_http, _, _) = start_agent_env(
        registry,
        "bench",
        &dir.join("audit-traced.log"),
        &[],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")],
    )
    .await;
    let traced_url = format!("http://127.0.0.1:{traced_http}/mcp");
    let (off, on) = (http_client(agent_url).await, http_client(&traced_url).await);
    let (a, at) = alternating(&off, &on, size.latency_calls).await;
    let (a50, a99, t50, t99) =
        (us(percentile(&a, 0.5)), us(percentile(&a, 0.99)), us(percentile(&at, 0.5)), us(percentile(&at, 0.99)));
    println!(
        "tracing: latency, {} calls each, alternating: A (off) p50 {a50:.1} us p99 {a99:.1} us; AT (on, OTLP/HTTP to a \
         loopback sink) p50 {t50:.1} us p99 {t99:.1} us; AT/A p50 {:.2} p99 {:.2}",
        a.len(),
        t50 / a50,
        t99 / a99
    );
    let traced_pid = traced.0.id().unwrap_or(0);
    let bench_pid = std::process::id();
    let at_processes =
        [("clients", bench_pid), ("agent", traced_pid), ("stdio echo server", first_child(traced_pid).unwrap_or(0))];
    let secs = size.throughput_for.as_secs_f64();
    let (at_calls, at_errors) =
        throughput_with_cpu("AT", &traced_url, "mcp__echo__echo", Revision::Sessions, size, &at_processes, None).await;
    // Let the last batch go out before counting.
    tokio::time::sleep(Duration::from_secs(6)).await;
    println!(
        "throughput, tracing on: AT {:.0} calls/s ({at_errors} errors), AT/A {:.2}; the sink received {} OTLP batches",
        at_calls as f64 / secs,
        at_calls as f64 / a_calls.max(1) as f64,
        batches.load(Ordering::Relaxed)
    );
    println!("RSS after load, tracing on: agent {:.1} MiB", rss_kib(traced_pid) as f64 / 1024.0);
}

/// `calls` echo calls on each of two agents' clients, one by one in turn after 50 warm-up calls
/// each: both sets of latencies, sorted.
async fn alternating(first: &Client, second: &Client, calls: usize) -> (Vec<Duration>, Vec<Duration>) {
    for _ in 0..50 {
        call(first, "mcp__echo__echo").await.expect("warm-up of the first");
        call(second, "mcp__echo__echo").await.expect("warm-up of the second");
    }
    let (mut a, mut b) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    for _ in 0..calls {
        a.push(call(first, "mcp__echo__echo").await.expect("a call of the first"));
        b.push(call(second, "mcp__echo__echo").await.expect("a call of the second"));
    }
    a.sort();
    b.sort();
    (a, b)
}

/// The pod's API key on the call path: AK is A with `--api-key` and clients sending the key (every
/// request checked, its `Authorization` dropped), the way every injected pod runs. Latency
/// alternating with A, then throughput and CPU per call, as for AT.
async fn api_key_cost(registry: &Path, dir: &Path, size: &Size, agent_url: &str, a_calls: u64) {
    const KEY: &str = "bench-key-of-the-pod-0123456789abcdef";
    let (keyed, keyed_http, _, _) =
        start_agent_with(registry, "bench", &dir.join("audit-keyed.log"), &["--api-key", KEY]).await;
    let keyed_url = format!("http://127.0.0.1:{keyed_http}/mcp");
    let (off, on) =
        (http_client(agent_url).await, http_client_speaking(&keyed_url, Revision::Sessions, Some(KEY)).await);
    let (a, ak) = alternating(&off, &on, size.latency_calls).await;
    let (a50, a99, k50, k99) =
        (us(percentile(&a, 0.5)), us(percentile(&a, 0.99)), us(percentile(&ak, 0.5)), us(percentile(&ak, 0.99)));
    println!(
        "API key: latency, {} calls each, alternating: A (none) p50 {a50:.1} us p99 {a99:.1} us; AK (--api-key, sent) \
         p50 {k50:.1} us p99 {k99:.1} us; AK/A p50 {:.2} p99 {:.2}",
        a.len(),
        k50 / a50,
        k99 / a99
    );
    let keyed_pid = keyed.0.id().unwrap_or(0);
    let processes = [
        ("clients", std::process::id()),
        ("agent", keyed_pid),
        ("stdio echo server", first_child(keyed_pid).unwrap_or(0)),
    ];
    let (ak_calls, ak_errors) =
        throughput_with_cpu("AK", &keyed_url, "mcp__echo__echo", Revision::Sessions, size, &processes, Some(KEY)).await;
    println!(
        "throughput, API key: AK {:.0} calls/s ({ak_errors} errors), AK/A {:.2}",
        ak_calls as f64 / size.throughput_for.as_secs_f64(),
        ak_calls as f64 / a_calls.max(1) as f64
    );
}

async fn idle_rss(dir: &Path, floor_pid: u32) {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/registry");
    let everything = std::panic::catch_unwind(|| mcp_servers::everything_http(3001)).ok();
    let _everything_http = everything.as_ref().map(|command| {
        let mut command = tokio::process::Command::from(command.to_std());
        spawn(command.stdout(Stdio::null()).stderr(Stdio::null()))
    });
    if everything.is_some() {
        assert!(mcp_servers::wait_for_http(3001, Duration::from_secs(30)).await, "server-everything listens on :3001");
    }
    let (agent, _, _) = start_agent(&examples, "developer", &dir.join("audit-idle.log")).await;
    // Idle: let start-up allocations settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = agent.0.id().unwrap_or(0);
    let children = std::process::Command::new("pgrep")
        .args(["-P", &pid.to_string()])
        .output()
        .map_or(0, |o| String::from_utf8_lossy(&o.stdout).split_whitespace().count());
    let (rss, floor) = (rss_kib(pid) as f64 / 1024.0, rss_kib(floor_pid) as f64 / 1024.0);
    println!(
        "idle RSS of spearlet serve on examples/registry ({children} stdio servers as children{}): {rss:.1} MiB \
         (target <= 15 MiB); bare rmcp echo server process: {floor:.1} MiB; ratio {:.2}",
        if everything.is_some() { ", everything over HTTP on :3001" } else { ", no HTTP server running" },
        rss / floor.max(0.1)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--serve-echo") {
        let blocking = args.iter().any(|a| a == "--tokio-stdio");
        echo::serve_stdio(if blocking { echo::StdioMode::TokioBlocking } else { echo::StdioMode::Reactor });
        return;
    }
    if spear::testing::bench::serve_echo_http_if_asked() {
        return;
    }
    if let Some(port) = args.iter().position(|a| a == "--serve-grpc-echo").and_then(|i| args.get(i + 1)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port.parse::<u16>().expect("a port")));
        runtime.block_on(async {
            tonic::transport::Server::builder()
                .add_service(McpSessionsServer::new(GrpcEcho))
                .serve(addr)
                .await
                .expect("serving the gRPC echo");
        });
        return;
    }
    spear::install_crypto_provider();
    let size = if args.iter().any(|a| a == "--bench") {
        Size { latency_calls: 2000, clients: 64, throughput_for: Duration::from_secs(10), idle_rss: true }
    } else {
        Size { latency_calls: 5, clients: 4, throughput_for: Duration::from_millis(300), idle_rss: false }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    runtime.block_on(run(size));
}
