//! The client pool against real MCP servers: the PyPI `mcp` fixture server, npm
//! server-everything and server-filesystem, over stdio and Streamable HTTP, including the faults
//! where bridges and gateways were seen to fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use spear::api::manifest::Object;
use spear::api::{McpServer, ServerBudgets};
use spear::mcp::health::HealthState;
use spear::mcp::{ErrorCode, Pool, PoolOptions};
use spear::policy::ServerTools;
use spear::registry::snapshot::{Entry, Snapshot};
use spear::testing::mcp_servers::{self, Command};

const SECOND: Duration = Duration::from_secs(1);
const BIG: usize = 1 << 20;

/// The fixture server run with `flags`, every tool allowed.
fn fixture(id: &str, flags: &[&str]) -> McpServer {
    McpServer::test(id).running(&mcp_servers::fixture_stdio(flags)).allowing(["*"])
}

fn snapshot(servers: Vec<McpServer>) -> Snapshot {
    Snapshot::build(servers.into_iter().map(|s| Entry::local("test.yaml", 1, Object::Server(s))), Vec::new())
}

fn options() -> PoolOptions {
    PoolOptions { idle_timeout: None, ..PoolOptions::default() }
}

async fn pool_with(servers: Vec<McpServer>, options: PoolOptions) -> Pool {
    let pool = Pool::with_env(options, Arc::new(|name: &str| std::env::var(name).ok()));
    let errors = pool.apply(&snapshot(servers)).await;
    assert!(errors.is_empty(), "{errors:?}");
    pool
}

fn args(value: Value) -> Option<Map<String, Value>> {
    value.as_object().cloned()
}

fn text(output: &spear::mcp::ToolOutput) -> String {
    let json = serde_json::to_value(&output.result).expect("result serializes");
    json["content"].as_array().expect("content").iter().filter_map(|c| c["text"].as_str()).collect::<Vec<_>>().join("")
}

async fn call(
    pool: &Pool,
    server: &str,
    tool: &str,
    a: Value,
    timeout: Duration,
) -> Result<String, spear::mcp::McpError> {
    pool.call_tool(server, tool, args(a), timeout, BIG).await.map(|o| text(&o))
}

/// A child process of the test (an HTTP server), killed when dropped.
struct Spawned(std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_http_fixture(port: u16) -> Spawned {
    let child = mcp_servers::fixture_http(port, &[])
        .to_std()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the fixture server starts");
    assert!(mcp_servers::wait_for_http(port, 20 * SECOND).await, "the HTTP fixture did not listen on {port}");
    Spawned(child)
}

fn kill(signal: &str, pid: u32) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

// === basics ===

#[tokio::test]
async fn lists_and_calls_tools_over_stdio() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    let tools = pool.list_tools("fx").await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for expected in ["echo", "sleep", "big", "probe", "add_tool", "flood_list_changed", "lists", "env", "pid"] {
        assert!(names.contains(&expected), "{expected} missing from {names:?}");
    }
    assert_eq!(call(&pool, "fx", "echo", json!({"text": "hi"}), 10 * SECOND).await.expect("echo"), "hi");
    let status = pool.status("fx").expect("status");
    assert_eq!(status.health.state, HealthState::Connected);
    assert!(status.info.and_then(|i| i.name).is_some(), "initialize captured");
    pool.shutdown().await;
}

#[tokio::test]
async fn arguments_that_break_the_input_schema_are_refused_before_the_server_sees_them() {
    let pool = pool_with(vec![fixture("fx", &[])], PoolOptions { check_arguments: true, ..options() }).await;
    pool.list_tools("fx").await.expect("tools/list");
    // The server would answer a tool error (`Ok` with isError); the agent's refusal is `Err`.
    for (arguments, at) in [(json!({"text": 5}), "'/text'"), (json!({}), "the root")] {
        let refused = call(&pool, "fx", "echo", arguments.clone(), 10 * SECOND).await.expect_err("refused");
        assert_eq!(refused.code, ErrorCode::McpInvalidArguments, "{arguments}: {refused:?}");
        assert!(!refused.retryable, "{refused:?}");
        assert!(refused.message.contains("inputSchema") && refused.message.contains(at), "{}", refused.message);
    }
    assert_eq!(call(&pool, "fx", "echo", json!({"text": "hi"}), 10 * SECOND).await.expect("echo"), "hi");
    pool.shutdown().await;
    // Off (the default), the server gets the call and answers it with its own tool error.
    let unchecked = pool_with(vec![fixture("fx", &[])], options()).await;
    unchecked.list_tools("fx").await.expect("tools/list");
    let output = unchecked.call_tool("fx", "echo", args(json!({})), 10 * SECOND, BIG).await.expect("sent");
    assert_eq!(output.result.is_error, Some(true), "the server's own answer: {}", text(&output));
    unchecked.shutdown().await;
}

#[tokio::test]
async fn a_call_the_agent_abandons_is_cancelled_at_the_server() {
    let record = tempfile::NamedTempFile::new().expect("record file");
    let path = record.path().to_string_lossy().into_owned();
    let pool = pool_with(vec![fixture("fx", &["--record", &path])], options()).await;
    pool.list_tools("fx").await.expect("tools/list");
    let abandoned = call(&pool, "fx", "sleep", json!({"ms": 30_000}), Duration::from_millis(500)).await;
    assert_eq!(abandoned.expect_err("over its budget").code, ErrorCode::McpTimeout);
    // The server hears `notifications/cancelled` and stops the call's work.
    let deadline = tokio::time::Instant::now() + 10 * SECOND;
    while !std::fs::read_to_string(record.path()).unwrap_or_default().contains("cancelled sleep 30000") {
        assert!(tokio::time::Instant::now() < deadline, "the server never heard the cancellation");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The session is still good.
    assert_eq!(call(&pool, "fx", "echo", json!({"text": "after"}), 10 * SECOND).await.expect("echo"), "after");
    pool.shutdown().await;
}

#[tokio::test]
async fn npm_everything_and_filesystem_servers_work_over_stdio() {
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::write(root.path().join("hello.txt"), "hello from disk").expect("write");
    let pool = pool_with(
        vec![
            McpServer::test("everything").running(&mcp_servers::everything_stdio()).allowing(["*"]),
            McpServer::test("fs").running(&mcp_servers::filesystem_stdio(root.path())).allowing(["*"]),
        ],
        options(),
    )
    .await;
    let out = call(&pool, "everything", "echo", json!({"message": "ping"}), 20 * SECOND).await.expect("echo");
    assert!(out.contains("ping"), "{out}");
    let fs_tools = pool.list_tools("fs").await.expect("fs tools");
    let read = if fs_tools.iter().any(|t| t.name == "read_text_file") { "read_text_file" } else { "read_file" };
    let path = root.path().join("hello.txt");
    let out = call(&pool, "fs", read, json!({"path": path}), 20 * SECOND).await.expect("read");
    assert!(out.contains("hello from disk"), "{out}");
    pool.shutdown().await;
}

#[tokio::test]
async fn lists_and_calls_over_streamable_http() {
    let port = mcp_servers::free_port();
    let _server = start_http_fixture(port).await;
    let pool = pool_with(vec![McpServer::test("web").http_at(port).allowing(["*"])], options()).await;
    assert!(pool.list_tools("web").await.expect("tools").iter().any(|t| t.name == "echo"));
    assert_eq!(call(&pool, "web", "echo", json!({"text": "over http"}), 10 * SECOND).await.expect("echo"), "over http");
    pool.shutdown().await;
}

/// The pool speaks whichever revision each real server speaks: the PyPI `mcp` 2.x fixture over
/// stdio and Streamable HTTP and an rmcp 3.x server answer `server/discover` and are spoken to
/// statelessly (2026-07-28); the npm reference server only knows the `initialize` handshake and
/// gets it. Calls and lists work the same on both.
#[tokio::test]
async fn the_pool_speaks_the_revision_each_real_server_speaks() {
    let py_port = mcp_servers::free_port();
    let _py_http = start_http_fixture(py_port).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let rmcp_port = listener.local_addr().expect("addr").port();
    let rmcp_server = tokio::spawn(spear::testing::echo::serve_http(listener));
    let pool = pool_with(
        vec![
            fixture("py-stdio", &[]),
            McpServer::test("py-http").http_at(py_port).allowing(["*"]),
            McpServer::test("rmcp-http").http_at(rmcp_port).allowing(["*"]),
            McpServer::test("npm").running(&mcp_servers::everything_stdio()).allowing(["*"]),
        ],
        options(),
    )
    .await;
    for (server, text_arg, revision) in [
        ("py-stdio", "text", "2026-07-28"),
        ("py-http", "text", "2026-07-28"),
        ("rmcp-http", "text", "2026-07-28"),
        ("npm", "message", "2025-11-25"),
    ] {
        let out = call(&pool, server, "echo", json!({ text_arg: "both" }), 20 * SECOND).await;
        assert!(out.as_deref().is_ok_and(|o| o.contains("both")), "{server}: {out:?}");
        assert!(pool.list_tools(server).await.is_ok_and(|t| t.iter().any(|t| t.name == "echo")), "{server}");
        let spoken = pool.status(server).and_then(|s| s.protocol_version);
        assert_eq!(spoken.as_deref(), Some(revision), "{server}");
    }
    pool.shutdown().await;
    rmcp_server.abort();
}

/// A server redeployed speaking another revision is detected again, not spoken to in the
/// revision remembered: an rmcp 3.x server (2026-07-28) on a port is replaced by npm
/// server-everything (2025-11-25) on the same port. The old stateless session's calls to the
/// new server time out (rmcp's client does not fail them), so after `timeouts_before_restart`
/// (3) timed-out calls the session restarts, the remembered revision fails to start and is
/// dropped, and the probe finds the new one.
#[tokio::test]
async fn a_server_redeployed_with_another_revision_is_detected_again() {
    let port = mcp_servers::free_port();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
    let modern = tokio::spawn(spear::testing::echo::serve_http(listener));
    let pool = pool_with(vec![McpServer::test("web").http_at(port).allowing(["*"])], options()).await;
    assert_eq!(call(&pool, "web", "echo", json!({"text": "one"}), 10 * SECOND).await.expect("rmcp echo"), "one");
    assert_eq!(pool.status("web").and_then(|s| s.protocol_version).as_deref(), Some("2026-07-28"));

    modern.abort();
    let _ = modern.await;
    let legacy = mcp_servers::everything_http(port)
        .to_std()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("server-everything starts");
    let _legacy = Spawned(legacy);
    assert!(mcp_servers::wait_for_http(port, 20 * SECOND).await, "server-everything listens on {port}");
    let deadline = Instant::now() + 60 * SECOND;
    let answer = loop {
        match call(&pool, "web", "echo", json!({"message": "two"}), 2 * SECOND).await {
            Ok(answer) => break answer,
            Err(e) => assert!(Instant::now() < deadline, "never reached the redeployed server: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(answer.contains("two"), "{answer}");
    assert_eq!(pool.status("web").and_then(|s| s.protocol_version).as_deref(), Some("2025-11-25"));
    pool.shutdown().await;
}

/// A 2026-07-28 server that answers a call with `InputRequiredResult` (it wants a person to
/// confirm) gets no answer from the agent, which has no person to ask: the call ends at once
/// with `mcp_approval_required` naming what was asked, never a hang or a retry loop.
#[tokio::test]
async fn a_server_asking_for_input_ends_the_call_with_a_structured_error_naming_what_was_asked() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    let started = Instant::now();
    let err = call(&pool, "fx", "ask", json!({"what": "the transfer"}), 10 * SECOND).await.expect_err("input asked");
    assert_eq!(err.code, ErrorCode::McpApprovalRequired, "{err:?}");
    assert!(!err.retryable);
    assert!(err.message.contains("Please confirm: the transfer") && err.message.contains("elicitation"), "{err:?}");
    assert!(started.elapsed() < 5 * SECOND, "answered at once");
    assert_eq!(pool.status("fx").expect("status").health.state, HealthState::Connected, "the server is fine");
    pool.shutdown().await;
}

// === budgets ===

#[tokio::test]
async fn output_over_the_budget_is_truncated_with_a_marker() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    let out = pool.call_tool("fx", "big", args(json!({"bytes": 100_000})), 10 * SECOND, 1000).await.expect("call");
    let truncated = out.truncated.expect("over the cap");
    assert_eq!(truncated.original_bytes, 100_000);
    let body = text(&out);
    assert!(body.starts_with(&"x".repeat(1000)) || body.len() >= 1000, "kept the first 1000 bytes");
    assert!(body.contains("mcp_output_too_large"), "explicit marker");
    assert!(body.len() < 1000 + 200, "cut to the cap plus the marker");
    pool.shutdown().await;
}

#[tokio::test]
async fn a_slow_call_times_out_on_budget_and_other_servers_are_unaffected() {
    let pool = pool_with(vec![fixture("slow", &[]), fixture("fast", &[])], options()).await;
    call(&pool, "slow", "echo", json!({"text": "warm"}), 10 * SECOND).await.expect("warm up");
    call(&pool, "fast", "echo", json!({"text": "warm"}), 10 * SECOND).await.expect("warm up");
    let budget = Duration::from_millis(300);
    let started = Instant::now();
    let (slow, fast) = tokio::join!(
        call(&pool, "slow", "sleep", json!({"ms": 5000}), budget),
        call(&pool, "fast", "echo", json!({"text": "still here"}), 5 * SECOND),
    );
    let err = slow.expect_err("times out");
    assert_eq!(err.code, ErrorCode::McpTimeout);
    assert!(err.retryable);
    assert!(started.elapsed() < budget + Duration::from_millis(100) + Duration::from_millis(400), "bounded wait");
    assert_eq!(fast.expect("the other server answers"), "still here");
    pool.shutdown().await;
}

#[tokio::test]
async fn the_concurrency_cap_makes_extra_calls_wait() {
    let mut server = fixture("fx", &[]);
    server.spec.budgets = Some(ServerBudgets { max_concurrency: Some(2), ..Default::default() });
    let pool = pool_with(vec![server], options()).await;
    call(&pool, "fx", "echo", json!({"text": "warm"}), 10 * SECOND).await.expect("warm up");
    let calls = (0..5).map(|_| call(&pool, "fx", "probe", json!({"ms": 150}), 10 * SECOND));
    let seen: Vec<i64> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("probe").trim().parse().expect("a number"))
        .collect();
    let max = seen.iter().copied().max().expect("five answers");
    assert_eq!(max, 2, "the server saw at most 2 calls at once (and the cap was used): {seen:?}");
    pool.shutdown().await;
}

// === cache ===

#[tokio::test]
async fn list_changed_refreshes_the_cached_tool_list() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    let before = pool.list_tools("fx").await.expect("tools");
    assert!(!before.iter().any(|t| t.name == "fresh_tool"));
    let again = pool.list_tools("fx").await.expect("cached");
    assert!(Arc::ptr_eq(&before, &again), "served from the cache");
    let changed = pool.list_changed("fx").expect("known server");
    call(&pool, "fx", "add_tool", json!({"name": "fresh_tool"}), 10 * SECOND).await.expect("add_tool");
    tokio::time::timeout(5 * SECOND, changed).await.expect("notification within 5 s");
    let after = pool.list_tools("fx").await.expect("refreshed");
    assert!(after.iter().any(|t| t.name == "fresh_tool"), "refreshed after list_changed");
    pool.shutdown().await;
}

#[tokio::test]
async fn a_config_change_restarts_only_the_changed_server() {
    let a = fixture("a", &[]);
    let b = fixture("b", &[]);
    let pool = pool_with(vec![a.clone(), b.clone()], options()).await;
    let pid = |pool: &Pool, id: &str| pool.status(id).and_then(|s| s.pid);
    call(&pool, "a", "echo", json!({"text": "1"}), 10 * SECOND).await.expect("a");
    call(&pool, "b", "echo", json!({"text": "1"}), 10 * SECOND).await.expect("b");
    let (a_pid, b_pid) = (pid(&pool, "a").expect("a pid"), pid(&pool, "b").expect("b pid"));

    let mut changed = b.clone();
    changed.spec.stdio.as_mut().expect("stdio").args.push("--stderr-chatter".into());
    let mut narrowed = a.clone();
    narrowed.spec.allowed_tools = vec!["echo".into()]; // not a connection field
    assert!(pool.apply(&snapshot(vec![narrowed, changed])).await.is_empty());
    call(&pool, "a", "echo", json!({"text": "2"}), 10 * SECOND).await.expect("a");
    call(&pool, "b", "echo", json!({"text": "2"}), 10 * SECOND).await.expect("b");
    assert_eq!(pid(&pool, "a"), Some(a_pid), "unchanged server keeps its session");
    assert_ne!(pid(&pool, "b"), Some(b_pid), "changed server got a new one");

    assert!(pool.apply(&snapshot(vec![a])).await.is_empty());
    let removed = call(&pool, "b", "echo", json!({"text": "3"}), SECOND).await.expect_err("removed");
    assert_eq!(removed.code, ErrorCode::McpUnavailable);
    pool.shutdown().await;
}

// === stopping ===

/// Whether any process of the group `pgid` is alive.
fn group_alive(pgid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", "--", &format!("-{pgid}")])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The fixture behind `sh -c SCRIPT`, where SCRIPT runs the server as `"$0" "$@"`.
fn wrapped(script: &str) -> Command {
    wrapping(&mcp_servers::fixture_stdio(&[]), script)
}

/// `server` behind `sh -c SCRIPT`, where SCRIPT runs it as `"$0" "$@"`.
fn wrapping(server: &Command, script: &str) -> Command {
    let mut args = vec!["-c".to_string(), script.to_string(), server.program.to_string_lossy().into_owned()];
    args.extend(server.args.iter().cloned());
    Command { program: "/bin/sh".into(), args, env: server.env.clone() }
}

/// A stopped server's process group gets SIGTERM and a grace period before SIGKILL, so a package
/// runner can clean up (npx killed mid-download leaves a broken npm cache). The stand-in for npx
/// runs the server, then goes on cleaning up (a sleep); only SIGTERM runs its trap. A server
/// that ignores SIGTERM is killed once the grace is over. Nothing of either group is left.
#[tokio::test]
async fn a_stopped_server_gets_sigterm_and_a_grace_period_before_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("cleaned-up");
    let gentle = wrapped(&format!("trap 'echo cleaned > {}; exit 0' TERM; \"$0\" \"$@\"; sleep 30", marker.display()));
    let stubborn = wrapped("trap '' TERM; \"$0\" \"$@\"; sleep 30");
    let pool = pool_with(
        vec![
            McpServer::test("gentle").running(&gentle).allowing(["*"]),
            McpServer::test("stubborn").running(&stubborn).allowing(["*"]),
        ],
        options(),
    )
    .await;
    for server in ["gentle", "stubborn"] {
        call(&pool, server, "echo", json!({"text": "up"}), 10 * SECOND).await.expect("started");
    }
    let groups: Vec<u32> =
        ["gentle", "stubborn"].iter().map(|s| pool.status(s).and_then(|st| st.pid).expect("pid")).collect();

    let started = Instant::now();
    pool.shutdown().await;
    let took = started.elapsed();
    assert_eq!(std::fs::read_to_string(&marker).ok().as_deref(), Some("cleaned\n"), "SIGTERM reached the wrapper");
    for pgid in groups {
        // SIGKILLed members are reaped by init a moment later.
        let deadline = Instant::now() + 3 * SECOND;
        while group_alive(pgid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!group_alive(pgid), "process group {pgid} outlived the stop");
    }
    // The stubborn one was given its grace (3 s), then killed rather than waited for (30 s).
    assert!(took >= Duration::from_millis(2900) && took < 10 * SECOND, "the stop took {took:?}");
}

/// A server that takes long to start (a stand-in for `npx` downloading its package) is not cut
/// short by callers' budgets: it starts once, in the background, within its own startup budget;
/// meanwhile listings say it is starting and calls time out saying so; its end counts as a list
/// change, after which its tools are listed.
#[tokio::test]
async fn a_slow_start_outlives_callers_budgets_and_lists_within_its_startup_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let starts = dir.path().join("starts");
    let slow = wrapped(&format!("echo start >> {}; sleep 3; exec \"$0\" \"$@\"", starts.display()));
    let pool = pool_with(
        vec![McpServer::test("slow").running(&slow).allowing(["*"])],
        PoolOptions { startup_wait: Duration::from_millis(500), ..options() },
    )
    .await;
    let ended = pool.list_changed("slow").expect("known server");
    let listing = pool.list_tools("slow").await.expect_err("still starting after 500 ms");
    assert!(listing.retryable && listing.message.starts_with("starting (sh), "), "{listing:?}");
    match pool.server_tools("slow", "slow").await {
        ServerTools::Starting(starting) => {
            assert_eq!((starting.what.as_str(), starting.budget), ("sh", Duration::from_secs(120)));
        }
        other => panic!("expected Starting, got {other:?}"),
    }
    let call = call(&pool, "slow", "echo", json!({"text": "?"}), Duration::from_millis(300)).await;
    let err = call.expect_err("the server is not up yet");
    assert_eq!(err.code, ErrorCode::McpTimeout);
    assert!(err.message.contains("the server is starting (sh)"), "{err:?}");
    tokio::time::timeout(20 * SECOND, ended).await.expect("the start's end is announced");
    let tools = pool.list_tools("slow").await.expect("listed once started");
    assert!(tools.iter().any(|t| t.name == "echo"), "{tools:?}");
    assert!(pool.status("slow").expect("status").starting.is_none());
    assert_eq!(std::fs::read_to_string(&starts).expect("starts").lines().count(), 1, "started once, never restarted");
    pool.shutdown().await;
}

/// Servers that need longer to start than rmcp's 10 s `server/discover` probe waits (a cold
/// `npx` or `uvx` download) are listed within the default startup budget, in the revision they
/// speak: a 2025-11-25 server answers the abandoned probe late with an error, which is dropped,
/// and is started once; a 2026-07-28 server answers it late with a result and is started again
/// speaking that revision. Before, the late error failed every start of a 2025 server.
#[tokio::test]
async fn servers_slower_to_start_than_the_discover_probe_are_listed_in_their_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let modern = mcp_servers::fixture_stdio(&[]);
    let legacy = mcp_servers::everything_stdio();
    let cases = [
        ("legacy-15", &legacy, 15, "2025-11-25", 1),
        ("legacy-30", &legacy, 30, "2025-11-25", 1),
        ("modern-15", &modern, 15, "2026-07-28", 2),
        ("modern-30", &modern, 30, "2026-07-28", 2),
    ];
    let starts = |id: &str| dir.path().join(id);
    let servers = cases.iter().map(|(id, server, delay, ..)| {
        let script = format!("echo start >> {}; sleep {delay}; exec \"$0\" \"$@\"", starts(id).display());
        McpServer::test(id).running(&wrapping(server, &script)).allowing(["*"])
    });
    let pool =
        pool_with(servers.collect(), PoolOptions { startup_wait: Duration::from_millis(500), ..options() }).await;
    for (id, ..) in &cases {
        let listing = pool.list_tools(id).await.expect_err("a first listing starts the server");
        assert!(listing.retryable, "{id}: {listing:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(110);
    while cases.iter().any(|(id, ..)| pool.status(id).is_some_and(|s| s.starting.is_some())) {
        let states: Vec<_> = cases.iter().map(|(id, ..)| (id, pool.status(id))).collect();
        assert!(Instant::now() < deadline, "every start ends within the default 120 s budget: {states:?}");
        tokio::time::sleep(SECOND).await;
    }
    for (id, _, delay, revision, started) in cases {
        let tools = pool
            .list_tools(id)
            .await
            .unwrap_or_else(|e| panic!("{id} (up after {delay} s): {e:?}; {:?}", pool.status(id)));
        assert!(tools.iter().any(|t| t.name == "echo"), "{id}: {tools:?}");
        let spoken = pool.status(id).and_then(|s| s.protocol_version);
        assert_eq!(spoken.as_deref(), Some(revision), "{id}");
        let count = std::fs::read_to_string(starts(id)).expect("starts").lines().count();
        assert_eq!(count, started, "{id}: starts");
    }
    pool.shutdown().await;
}

/// A server that cannot be reached is reported by cause, URL and fix, never by rmcp's Rust
/// types ("Send message error Transport [rmcp::transport::worker::WorkerTransport<...>]").
#[tokio::test]
async fn an_unreachable_server_is_reported_by_cause_url_and_fix() {
    let port = mcp_servers::free_port();
    let pool = pool_with(vec![McpServer::test("gone").http_at(port).allowing(["*"])], options()).await;
    let error = pool.list_tools("gone").await.expect_err("nothing listens there");
    assert_eq!(
        error.message,
        format!(
            "initialize failed: connection refused at http://127.0.0.1:{port}/mcp: is the server running and listening there?"
        )
    );
    let status = format!("{:?}", pool.status("gone"));
    assert!(!status.contains("rmcp::") && status.contains("connection refused at"), "{status}");
    pool.shutdown().await;
}

/// A start that runs past its budget, and one whose server is removed from the registry while
/// it starts, leave nothing behind: the stand-in for `npx` starts a grandchild (as npx starts
/// the real server) and never answers; its whole process group is stopped, not only the leader.
#[tokio::test]
async fn a_start_past_its_budget_or_removed_midway_leaves_no_process_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hanging = |name: &str| {
        let pidfile = dir.path().join(name);
        let script = format!("echo $$ > {}; sleep 300 & wait", pidfile.display());
        (wrapped(&script), pidfile)
    };
    let (over, over_pid) = hanging("over");
    let (removed, removed_pid) = hanging("removed");
    let mut over = McpServer::test("over").running(&over).allowing(["*"]);
    over.spec.budgets = Some(ServerBudgets { startup_timeout_ms: Some(1000), ..Default::default() });
    let removed = McpServer::test("removed").running(&removed).allowing(["*"]);
    let pool =
        pool_with(vec![over.clone(), removed], PoolOptions { startup_wait: Duration::from_millis(300), ..options() })
            .await;
    let ended = pool.list_changed("over").expect("known server");
    assert!(pool.list_tools("over").await.is_err());
    assert!(pool.list_tools("removed").await.is_err());
    let read_pid =
        |path: &std::path::Path| std::fs::read_to_string(path).ok().and_then(|p| p.trim().parse::<u32>().ok());
    let (over_group, removed_group) =
        (read_pid(&over_pid).expect("over started"), read_pid(&removed_pid).expect("removed started"));
    assert!(group_alive(removed_group));

    tokio::time::timeout(10 * SECOND, ended).await.expect("the start ended on its budget");
    let failed = pool.list_tools("over").await.expect_err("no session within the budget");
    assert!(failed.message.contains("1000 ms"), "{failed:?}");
    assert!(pool.apply(&snapshot(vec![over])).await.is_empty());
    for (name, pgid) in [("over", over_group), ("removed", removed_group)] {
        // SIGTERM, then up to the grace (3 s); the members are reaped a moment later.
        let deadline = Instant::now() + 6 * SECOND;
        while group_alive(pgid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!group_alive(pgid), "the process group of '{name}' ({pgid}) outlived its start");
    }
    pool.shutdown().await;
}

// === faults ===

#[tokio::test]
async fn a_killed_child_fails_its_call_and_the_next_call_gets_a_new_process() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    call(&pool, "fx", "echo", json!({"text": "warm"}), 10 * SECOND).await.expect("warm up");
    let old = pool.status("fx").and_then(|s| s.pid).expect("pid");
    let pending = call(&pool, "fx", "sleep", json!({"ms": 10_000}), 20 * SECOND);
    let killer = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        kill("-9", old);
    };
    let (result, ()) = tokio::join!(pending, killer);
    let err = result.expect_err("the call's process died");
    assert_eq!(err.code, ErrorCode::McpUnavailable);
    assert!(err.retryable);
    assert_eq!(pool.status("fx").expect("status").health.state, HealthState::Down, "Down until respawned");
    assert_eq!(call(&pool, "fx", "echo", json!({"text": "back"}), 10 * SECOND).await.expect("recovered"), "back");
    let new = pool.status("fx").and_then(|s| s.pid).expect("pid");
    assert_ne!(new, old);
    assert_eq!(pool.status("fx").expect("status").health.state, HealthState::Connected);
    pool.shutdown().await;
}

#[tokio::test]
async fn a_frozen_child_times_out_every_call_on_budget_then_is_respawned() {
    let pool = pool_with(vec![fixture("fx", &[]), fixture("ok", &[])], options()).await;
    call(&pool, "fx", "echo", json!({"text": "warm"}), 10 * SECOND).await.expect("warm up");
    let frozen = pool.status("fx").and_then(|s| s.pid).expect("pid");
    kill("-STOP", frozen);
    let budget = Duration::from_millis(300);
    for attempt in 1..=3 {
        let started = Instant::now();
        let err = call(&pool, "fx", "echo", json!({"text": "?"}), budget).await.expect_err("frozen");
        let took = started.elapsed();
        assert_eq!(err.code, ErrorCode::McpTimeout, "attempt {attempt}");
        assert!(took < budget + Duration::from_millis(100), "attempt {attempt} answered after {took:?}");
        let state = pool.status("fx").expect("status").health.state;
        let expected = if attempt < 3 { HealthState::Degraded } else { HealthState::Down };
        assert_eq!(state, expected, "attempt {attempt}");
        assert_eq!(call(&pool, "ok", "echo", json!({"text": "fine"}), 5 * SECOND).await.expect("unaffected"), "fine");
    }
    assert_eq!(
        call(&pool, "fx", "echo", json!({"text": "respawned"}), 10 * SECOND).await.expect("new child"),
        "respawned"
    );
    assert_ne!(pool.status("fx").and_then(|s| s.pid), Some(frozen));
    assert_eq!(pool.status("fx").expect("status").health.state, HealthState::Connected);
    pool.shutdown().await;
    // The frozen child was killed by the restart; SIGCONT is harmless if it is already gone.
    let _ = std::process::Command::new("kill").args(["-CONT", &frozen.to_string()]).status();
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_without_affecting_others() {
    let pool = pool_with(vec![fixture("hang", &["--hang"]), fixture("ok", &[])], options()).await;
    let budget = Duration::from_millis(500);
    let started = Instant::now();
    let (hung, ok) = tokio::join!(
        call(&pool, "hang", "echo", json!({"text": "?"}), budget),
        call(&pool, "ok", "echo", json!({"text": "fine"}), 10 * SECOND),
    );
    assert_eq!(hung.expect_err("never answers").code, ErrorCode::McpTimeout);
    assert!(started.elapsed() < 10 * SECOND);
    assert_eq!(ok.expect("unaffected"), "fine");
    pool.shutdown().await;
}

#[tokio::test]
async fn garbage_on_stdout_is_reported_and_the_session_keeps_working() {
    let pool = pool_with(vec![fixture("junk", &["--garbage-stdout"])], options()).await;
    // The non-JSON line is skipped (rmcp), counted and warned about with the server id (the
    // frame guard); the session is not torn down for one stray print.
    let out = call(&pool, "junk", "echo", json!({"text": "after garbage"}), 10 * SECOND).await.expect("echo");
    assert_eq!(out, "after garbage");
    assert_eq!(pool.status("junk").expect("status").garbage_lines, 1);
    pool.shutdown().await;
}

#[tokio::test]
async fn a_reply_over_the_frame_limit_fails_that_call_and_the_next_succeeds() {
    let options = PoolOptions { frame_limit: 256 * 1024, ..options() };
    let pool = pool_with(vec![fixture("fx", &[])], options).await;
    let err = pool
        .call_tool("fx", "big", args(json!({"bytes": 1_000_000})), 10 * SECOND, usize::MAX)
        .await
        .expect_err("over the frame limit");
    assert_eq!(err.code, ErrorCode::McpOutputTooLarge, "{err}");
    assert_eq!(call(&pool, "fx", "echo", json!({"text": "next"}), 10 * SECOND).await.expect("new session"), "next");
    pool.shutdown().await;
}

#[tokio::test]
async fn an_http_server_restarted_is_reached_again() {
    let port = mcp_servers::free_port();
    let server = start_http_fixture(port).await;
    let pool = pool_with(vec![McpServer::test("web").http_at(port).allowing(["*"])], options()).await;
    call(&pool, "web", "echo", json!({"text": "one"}), 10 * SECOND).await.expect("first");
    drop(server);
    let down = call(&pool, "web", "echo", json!({"text": "two"}), 3 * SECOND).await.expect_err("server is down");
    assert!(matches!(down.code, ErrorCode::McpUnavailable | ErrorCode::McpTimeout), "{down}");
    let _server = start_http_fixture(port).await;
    let mut last = None;
    // The first call after the restart may still see the old session fail; the next one works.
    for _ in 0..3 {
        match call(&pool, "web", "echo", json!({"text": "three"}), 10 * SECOND).await {
            Ok(out) => {
                last = Some(out);
                break;
            }
            Err(e) => tracing::debug!(error = %e, "retrying after restart"),
        }
    }
    assert_eq!(last.as_deref(), Some("three"));
    pool.shutdown().await;
}

#[tokio::test]
async fn a_missing_env_var_makes_only_that_server_unavailable() {
    let mut needs = fixture("needs", &[]);
    needs.spec.stdio.as_mut().expect("stdio").env.push(k8s_openapi::api::core::v1::EnvVar {
        name: "TOKEN".into(),
        value: Some("${ENV:SPEAR_TEST_SURELY_UNSET_VAR}".into()),
        value_from: None,
    });
    let mut passes = fixture("passes", &[]);
    passes.spec.stdio.as_mut().expect("stdio").env.push(k8s_openapi::api::core::v1::EnvVar {
        name: "GREETING".into(),
        value: Some("${ENV:SPEAR_TEST_SURELY_UNSET_VAR:-hello}".into()),
        value_from: None,
    });
    let pool = pool_with(vec![needs, passes], options()).await;
    let err = call(&pool, "needs", "echo", json!({"text": "?"}), 5 * SECOND).await.expect_err("env missing");
    assert_eq!(err.code, ErrorCode::McpUnavailable);
    assert!(!err.retryable);
    assert!(err.message.contains("SPEAR_TEST_SURELY_UNSET_VAR"), "{err}");
    assert_eq!(
        pool.server_tools("needs", "needs").await,
        ServerTools::EnvMissing { variable: "SPEAR_TEST_SURELY_UNSET_VAR".into() }
    );
    let greeting = call(&pool, "passes", "env", json!({"name": "GREETING"}), 10 * SECOND).await.expect("default used");
    assert_eq!(greeting, "hello");
    let leaked = call(&pool, "passes", "env", json!({"name": "CARGO_MANIFEST_DIR"}), 10 * SECOND).await.expect("env");
    assert_eq!(leaked, "<unset>", "the agent's own environment is not passed to children");
    pool.shutdown().await;
}

#[tokio::test]
async fn a_hundred_concurrent_first_calls_share_one_session() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    let calls = (0..100).map(|i| call(&pool, "fx", "pid", json!({}), 30 * SECOND).map_err(move |e| (i, e)));
    let pids: Vec<String> = futures::future::join_all(calls).await.into_iter().map(|r| r.expect("call")).collect();
    assert!(
        pids.iter().all(|p| *p == pids[0]),
        "one process served all: {:?}",
        pids.iter().collect::<std::collections::BTreeSet<_>>()
    );
    let health = pool.status("fx").expect("status").health;
    assert_eq!((health.sessions, health.reconnects), (1, 0));
    pool.shutdown().await;
}

#[tokio::test]
async fn shutdown_leaves_no_child_behind() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    call(&pool, "fx", "echo", json!({"text": "x"}), 10 * SECOND).await.expect("call");
    let pid = pool.status("fx").and_then(|s| s.pid).expect("pid");
    pool.shutdown().await;
    let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
    assert!(
        gone || {
            tokio::time::sleep(SECOND).await;
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        },
        "child {pid} still runs"
    );
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "child {pid} was not reaped");
}

use futures::TryFutureExt as _;

// === through the bridge (Kubernetes sidecar mode) ===

/// Starts `spearlet bridge` serving `command` on `socket` (killed when the guard drops).
async fn start_bridge(socket: &std::path::Path, command: &Command) -> Spawned {
    start_bridge_with(socket, command, &[]).await
}

/// [`start_bridge`] with extra bridge flags.
async fn start_bridge_with(socket: &std::path::Path, command: &Command, flags: &[&str]) -> Spawned {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_spearlet"));
    cmd.arg("bridge").arg("--socket").arg(socket).args(flags).arg("--").arg(&command.program).args(&command.args);
    cmd.envs(command.env.iter().map(|(k, v)| (k, v)))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let bridge = Spawned(cmd.spawn().expect("spearlet bridge starts"));
    for _ in 0..200 {
        if socket.exists() {
            return bridge;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the bridge did not create {}", socket.display());
}

#[tokio::test]
async fn npm_servers_work_through_the_bridge_socket() {
    let run = tempfile::tempdir().expect("run dir");
    let root = tempfile::tempdir().expect("fs root");
    std::fs::write(root.path().join("note.txt"), "through the bridge").expect("write");
    for server in ["everything", "fs"] {
        std::fs::create_dir(run.path().join(server)).expect("socket dir");
    }
    let socket = |server: &str| run.path().join(server).join("mcp.sock");
    let _everything = start_bridge(&socket("everything"), &mcp_servers::everything_stdio()).await;
    let _fs = start_bridge(&socket("fs"), &mcp_servers::filesystem_stdio(root.path())).await;
    // The agent checks who listens: here both bridges run as this test's uid, as the sidecars
    // of a pod run as the uids the webhook gave them.
    let me = rustix::process::getuid().as_raw();
    let options = PoolOptions {
        mode: spear::mcp::config::Mode::Sidecar {
            socket_dir: run.path().to_path_buf(),
            sidecars: None,
            secret_refs: None,
            destinations: None,
            peer_uids: [("everything".to_string(), me), ("fs".to_string(), me)].into(),
        },
        ..options()
    };
    // In sidecar mode the stdio command is the sidecar's business; the pool only needs the socket.
    let pool = pool_with(
        vec![
            McpServer::test("everything").running(&mcp_servers::everything_stdio()).allowing(["*"]),
            fixture("fs", &[]),
        ],
        options,
    )
    .await;
    let out = call(&pool, "everything", "echo", json!({"message": "via socket"}), 20 * SECOND).await.expect("echo");
    assert!(out.contains("via socket"), "{out}");
    assert_eq!(pool.status("everything").and_then(|s| s.pid), None, "no child of the agent in sidecar mode");
    let path = root.path().join("note.txt");
    let out = call(&pool, "fs", "read_text_file", json!({"path": path}), 20 * SECOND).await.expect("read");
    assert!(out.contains("through the bridge"), "{out}");
    pool.shutdown().await;
}

// === caps and lifecycle ===

#[tokio::test]
async fn the_child_process_cap_refuses_one_more_child_with_a_clear_error() {
    let options = PoolOptions { max_children: 1, ..options() };
    let pool = pool_with(vec![fixture("a", &[]), fixture("b", &[])], options).await;
    call(&pool, "a", "echo", json!({"text": "1"}), 10 * SECOND).await.expect("first child");
    let err = call(&pool, "b", "echo", json!({"text": "2"}), 10 * SECOND).await.expect_err("over the cap");
    assert_eq!(err.code, ErrorCode::McpUnavailable);
    assert!(err.message.contains("cap"), "{err}");
    pool.shutdown().await;
}

#[tokio::test]
async fn idle_sessions_are_reaped_and_come_back_on_the_next_call() {
    let options = PoolOptions { idle_timeout: Some(Duration::from_millis(200)), ..PoolOptions::default() };
    let pool = pool_with(vec![fixture("fx", &[])], options).await;
    call(&pool, "fx", "echo", json!({"text": "x"}), 10 * SECOND).await.expect("call");
    let pid = pool.status("fx").and_then(|s| s.pid).expect("pid");
    let deadline = Instant::now() + 5 * SECOND;
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "idle child {pid} was reaped");
    assert_eq!(call(&pool, "fx", "echo", json!({"text": "again"}), 10 * SECOND).await.expect("respawned"), "again");
    pool.shutdown().await;
}

#[tokio::test]
async fn eager_connect_starts_sessions_before_any_call() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    assert_eq!(pool.status("fx").and_then(|s| s.pid), None, "lazy by default");
    pool.connect_all().await;
    assert!(pool.status("fx").and_then(|s| s.pid).is_some(), "eager connect spawned the child");
    assert_eq!(pool.status("fx").expect("status").health.state, HealthState::Connected);
    pool.shutdown().await;
}

#[tokio::test]
async fn a_20_mib_reply_over_the_default_frame_limit_fails_alone() {
    let pool = pool_with(vec![fixture("fx", &[])], options()).await;
    let err = pool
        .call_tool("fx", "big", args(json!({"bytes": 20 << 20})), 30 * SECOND, usize::MAX)
        .await
        .expect_err("20 MiB is over the 16 MiB frame limit");
    assert_eq!(err.code, ErrorCode::McpOutputTooLarge, "{err}");
    assert_eq!(call(&pool, "fx", "echo", json!({"text": "next"}), 10 * SECOND).await.expect("new session"), "next");
    pool.shutdown().await;
}

#[tokio::test]
async fn a_failed_listing_is_remembered_for_the_failure_ttl_then_retried() {
    let token_set = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let env = {
        let token_set = token_set.clone();
        move |name: &str| match name {
            "TEST_TOKEN_OF_FX" if token_set.load(std::sync::atomic::Ordering::SeqCst) => Some("t".to_string()),
            "TEST_TOKEN_OF_FX" => None,
            other => std::env::var(other).ok(),
        }
    };
    let mut server = fixture("fx", &[]);
    server.spec.stdio.as_mut().expect("stdio").env.push(k8s_openapi::api::core::v1::EnvVar {
        name: "TOKEN".into(),
        value: Some("${ENV:TEST_TOKEN_OF_FX}".into()),
        value_from: None,
    });
    let options = PoolOptions { failure_ttl: Duration::from_millis(300), ..options() };
    let pool = Pool::with_env(options, Arc::new(env));
    assert!(pool.apply(&snapshot(vec![server])).await.is_empty());
    assert!(pool.list_tools("fx").await.is_err(), "env missing");
    token_set.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(pool.list_tools("fx").await.is_err(), "the failure is remembered for the failure TTL");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(pool.list_tools("fx").await.is_ok(), "retried after the failure TTL");
    pool.shutdown().await;
}

#[tokio::test]
async fn calls_and_connects_are_counted_under_the_design_metric_names() {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = spear::telemetry::PoolMetrics::register(&mut registry);
    let pool = pool_with(vec![fixture("fx", &[])], PoolOptions { metrics, ..options() }).await;
    call(&pool, "fx", "echo", json!({"text": "ok"}), 10 * SECOND).await.expect("echo");
    call(&pool, "fx", "sleep", json!({"ms": 2000}), Duration::from_millis(100)).await.expect_err("timeout");
    pool.call_tool("fx", "big", args(json!({"bytes": 5000})), 10 * SECOND, 100).await.expect("truncated");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
    for line in [
        "mcp_server_connect_total{server_id=\"fx\"} 1",
        "mcp_tool_call_total{server_id=\"fx\",tool=\"echo\"} 1",
        "mcp_tool_call_error_total{server_id=\"fx\",tool=\"sleep\",code=\"mcp_timeout\"} 1",
        "mcp_tool_call_error_total{server_id=\"fx\",tool=\"big\",code=\"mcp_output_too_large\"} 1",
        "mcp_tool_call_output_bytes_sum{server_id=\"fx\",tool=\"big\"} 5000",
    ] {
        assert!(text.contains(line), "missing {line} in:\n{text}");
    }
    pool.shutdown().await;
}

/// Issue 13 finding 2: one sidecar cannot stand in for another, nor talk to another's server.
/// The agent only talks to a socket its server's sidecar uid listens on, and a bridge only
/// answers the agent's uid (`SO_PEERCRED` both ways). A test cannot run as two uids, so each side
/// is shown refusing a peer whose uid differs from the one it expects.
#[tokio::test]
async fn the_agent_and_the_bridge_each_refuse_a_peer_with_another_uid() {
    let run = tempfile::tempdir().expect("run dir");
    std::fs::create_dir(run.path().join("fx")).expect("socket dir");
    let socket = run.path().join("fx").join("mcp.sock");
    let me = rustix::process::getuid().as_raw();

    // A bridge that expects the agent at another uid refuses this process.
    let strict =
        start_bridge_with(&socket, &mcp_servers::fixture_stdio(&[]), &["--peer-uid", &(me + 1).to_string()]).await;
    let mut stream = tokio::net::UnixStream::connect(&socket).await.expect("connect");
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let ping = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
    let _ = stream.write_all(ping.as_bytes()).await;
    let mut buf = [0u8; 64];
    let read =
        tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await.expect("closed, not left open");
    assert!(matches!(read, Ok(0) | Err(_)), "the bridge answered a client that is not the agent: {read:?}");
    drop(strict);
    let _ = std::fs::remove_file(&socket);

    // The agent expecting the sidecar's uid refuses a socket someone else listens on.
    let _bridge = start_bridge(&socket, &mcp_servers::fixture_stdio(&[])).await;
    let options = PoolOptions {
        mode: spear::mcp::config::Mode::Sidecar {
            socket_dir: run.path().to_path_buf(),
            sidecars: None,
            secret_refs: None,
            destinations: None,
            peer_uids: [("fx".to_string(), me + 1)].into(),
        },
        ..options()
    };
    let pool = pool_with(vec![fixture("fx", &[])], options).await;
    let err = pool.list_tools("fx").await.expect_err("an impostor socket");
    assert!(err.message.contains("not by the server's sidecar"), "{err}");
    pool.shutdown().await;
}
