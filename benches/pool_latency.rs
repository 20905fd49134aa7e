//! Latency of a `tools/call` on a trivial echo tool through the client pool, against the same
//! call by a bare rmcp client to the same kind of server, in the same run: over stdio, and
//! through the `spearlet bridge` Unix socket. Issue target: pool/bare p50 ratio <= 1.05.
//!
//! Run: `cargo bench --bench pool_latency`. The echo server is this binary itself, re-run with
//! `--serve-echo` (an rmcp stdio server), so no interpreter's speed is in the figures. Calls
//! alternate one by one between the four clients so drift (other load, CPU idle states) hits
//! all alike.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use spear::api::McpServer;
use spear::api::manifest::Object;
use spear::mcp::config::Mode;
use spear::mcp::{Pool, PoolOptions};
use spear::registry::snapshot::{Entry, Snapshot};
use spear::testing::bench::{main_serving_echo, percentile, us};

const ROUNDS: usize = 20;

type Client = RunningService<RoleClient, ()>;

async fn bare_call(client: &Client) -> Duration {
    let mut params = CallToolRequestParams::new("echo");
    params.arguments = json!({"text": "ping"}).as_object().cloned();
    let started = Instant::now();
    client.peer().call_tool(params).await.expect("bare echo");
    started.elapsed()
}

async fn pool_call(pool: &Pool, server: &str) -> Duration {
    let started = Instant::now();
    pool.call_tool(server, "echo", json!({"text": "ping"}).as_object().cloned(), Duration::from_secs(10), 65_536)
        .await
        .expect("pooled echo");
    started.elapsed()
}

/// Starts `spearlet bridge` serving the echo server on `socket`.
fn start_bridge(socket: &Path, echo: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .arg("bridge")
        .arg("--socket")
        .arg(socket)
        .arg("--")
        .arg(echo)
        .arg("--serve-echo")
        .env("SPEAR_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spearlet bridge starts")
}

async fn wait_for(socket: &Path) {
    for _ in 0..200 {
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            // That probe was a client too; give the bridge a moment to start a fresh child.
            tokio::time::sleep(Duration::from_millis(200)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the bridge did not listen on {}", socket.display());
}

/// This bench binary re-run as the echo server.
fn echo_server(id: &str, exe: &Path) -> McpServer {
    McpServer::test(id).stdio(&exe.display().to_string(), ["--serve-echo"]).allowing(["*"])
}

async fn run(calls_per_round: usize) {
    let exe: PathBuf = std::env::current_exe().expect("the bench binary's path");
    let dir = tempfile::tempdir().expect("a temp dir");

    // Bare rmcp over stdio.
    let mut child = tokio::process::Command::new(&exe)
        .arg("--serve-echo")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("echo server starts");
    let (stdin, stdout) = (child.stdin.take().expect("stdin"), child.stdout.take().expect("stdout"));
    let bare_stdio: Client = ().serve((stdout, stdin)).await.expect("bare stdio client");

    // Bare rmcp through the bridge.
    let bare_socket = dir.path().join("bare.sock");
    let _bridge_bare = start_bridge(&bare_socket, &exe);
    wait_for(&bare_socket).await;
    let stream = tokio::net::UnixStream::connect(&bare_socket).await.expect("bridge socket");
    let bare_bridge: Client = ().serve(stream).await.expect("bare bridge client");

    // The pool over stdio, and the pool through a bridge (sidecar mode).
    let local = Pool::new(PoolOptions { idle_timeout: None, ..PoolOptions::default() });
    let snapshot = |s: McpServer| Snapshot::build([Entry::local("bench.yaml", 1, Object::Server(s))], Vec::new());
    assert!(local.apply(&snapshot(echo_server("echo", &exe))).await.is_empty());
    // The agent's layout in a pod: one directory per server.
    let echo_socket = dir.path().join("echo").join("mcp.sock");
    std::fs::create_dir(dir.path().join("echo")).expect("socket dir");
    let _bridge_pool = start_bridge(&echo_socket, &exe);
    wait_for(&echo_socket).await;
    let sidecar = Pool::new(PoolOptions {
        mode: Mode::sidecar(dir.path().to_path_buf()),
        idle_timeout: None,
        ..PoolOptions::default()
    });
    assert!(sidecar.apply(&snapshot(echo_server("echo", &exe))).await.is_empty());

    // Warm up every path (sessions, caches, page faults).
    for _ in 0..50 {
        bare_call(&bare_stdio).await;
        bare_call(&bare_bridge).await;
        pool_call(&local, "echo").await;
        pool_call(&sidecar, "echo").await;
    }
    // Calls alternate one by one between the four clients, so every client sees the same
    // machine state (CPU idle states and wake-up latency dominate at this scale).
    let mut samples: [Vec<Duration>; 4] = Default::default();
    for _ in 0..ROUNDS * calls_per_round {
        samples[0].push(bare_call(&bare_stdio).await);
        samples[1].push(pool_call(&local, "echo").await);
        samples[2].push(bare_call(&bare_bridge).await);
        samples[3].push(pool_call(&sidecar, "echo").await);
    }
    for s in &mut samples {
        s.sort();
    }
    let names = ["bare rmcp, stdio", "pool, stdio", "bare rmcp, bridge socket", "pool, bridge socket"];
    println!("pool_latency: {} calls per client, alternating call by call, echo tool", samples[0].len());
    println!("{:<28} {:>10} {:>10}", "client", "p50 us", "p99 us");
    for (name, s) in names.iter().zip(&samples) {
        println!("{name:<28} {:>10.1} {:>10.1}", us(percentile(s, 0.5)), us(percentile(s, 0.99)));
    }
    let ratio = |pool: &[Duration], bare: &[Duration]| us(percentile(pool, 0.5)) / us(percentile(bare, 0.5));
    println!(
        "pool/bare p50 ratio: stdio {:.3}, bridge {:.3}",
        ratio(&samples[1], &samples[0]),
        ratio(&samples[3], &samples[2])
    );
    local.shutdown().await;
    sidecar.shutdown().await;
}

fn main() {
    main_serving_echo(|full| run(if full { 100 } else { 2 }));
}
