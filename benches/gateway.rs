//! The gateway against the per-pod agent, in one run (issue 45): a caller's `/mcp` tool call
//! through `spearlet gateway` (bearer token, TokenReview, binding, sealed session) and through
//! `spearlet run` (the per-pod agent with its key), to the same echo server; then many callers.
//!
//! ```text
//! this bench (raw HTTP/1.1 keep-alive, one session per client)
//!   ├─ A: spearlet run --profile p (own process, --api-key)   ─┐
//!   └─ G: spearlet gateway (own process, ServiceAccount token) ─┴─ Streamable HTTP ─▶ echo (this
//!                                                                   binary, --serve-echo-http)
//! both read the registry from the test control plane (kube-apiserver + etcd); G reviews tokens there
//!
//! 1. latency: blocks of calls, A then G, repeated: p50 / p99 each, G / A
//! 2. throughput: 16 callers (one session each) for a few seconds, A then G, twice: calls/s, G / A
//! 3. many callers: C ServiceAccounts over B bindings (B / 10 profiles), one token each (TokenRequest):
//!    each caller's first request (initialize: its TokenReview), then one call each (cached):
//!    p50 / p99, the gateway's RSS before and after, and the profiles' agents it made
//! ```
//!
//! Run: `cargo bench --bench gateway` (needs the test control plane: `hack/control-plane.sh`,
//! `SPEAR_CONTROL_PLANE_BIN`). Without `--bench` (under `cargo test --all-targets`) a smoke run
//! of the harness. Decisions: raw HTTP rather than rmcp clients, so the client's own cost is small
//! and the same for both paths; both agents are the release `spearlet` of the same build; the
//! echo server is its own process, as a remote server would be.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use serde_json::json;
use spear::api::{McpProfile, McpProfileBinding, McpServer};
use spear::testing::bench::{percentile, us};
use spear::testing::control_plane::ControlPlane;
use spear::testing::mcp_servers;
use spear::testing::proc_stats::rss_kib;

const TOOL: &str = "mcp__echo__echo";
const AUDIENCE: &str = "spear-mcp-gateway";
const API_KEY: &str = "bench-agent-key-0123456789";
const VERSION: &str = "2025-11-25";

struct Size {
    rounds: usize,
    block: usize,
    concurrent: usize,
    window: Duration,
    callers: usize,
    bindings: usize,
}

fn main() {
    if spear::testing::bench::serve_echo_http_if_asked() {
        return;
    }
    spear::install_crypto_provider();
    let full = std::env::args().any(|a| a == "--bench");
    let size = if full {
        Size { rounds: 10, block: 200, concurrent: 16, window: Duration::from_secs(5), callers: 1_000, bindings: 100 }
    } else {
        Size { rounds: 1, block: 20, concurrent: 2, window: Duration::from_millis(500), callers: 20, bindings: 4 }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(run(size));
}

/// A child process killed when dropped.
struct Child(tokio::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

fn spawn(command: &mut tokio::process::Command) -> Child {
    Child(command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().expect("spawns"))
}

async fn ready(admin: u16) {
    let url = format!("http://127.0.0.1:{admin}/readyz");
    for _ in 0..600 {
        if reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} not ready within 60 s");
}

/// One client's session at one door.
#[derive(Clone)]
struct Session {
    http: reqwest::Client,
    url: String,
    bearer: String,
    id: String,
    next: Arc<AtomicU64>,
}

impl Session {
    async fn open(http: &reqwest::Client, url: &str, bearer: &str) -> Session {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
        let answer = post(http, url, bearer, None, &init).await;
        let id =
            answer.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).expect("a session id").to_string();
        let _ = answer.bytes().await;
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let _ = post(http, url, bearer, Some(&id), &initialized).await.bytes().await;
        Session { http: http.clone(), url: url.to_string(), bearer: bearer.to_string(), id, next: Arc::default() }
    }

    async fn call(&self) -> Duration {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": TOOL, "arguments": {"text": "hi"}}});
        let started = Instant::now();
        let answer = post(&self.http, &self.url, &self.bearer, Some(&self.id), &call).await;
        let body = answer.text().await.expect("a body");
        let took = started.elapsed();
        assert!(body.contains("\"result\"") && !body.contains("\"isError\":true"), "a failed call: {body}");
        took
    }
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    bearer: &str,
    session: Option<&str>,
    body: &serde_json::Value,
) -> reqwest::Response {
    let mut request = http
        .post(url)
        .bearer_auth(bearer)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", VERSION)
        .body(body.to_string());
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let answer = request.send().await.expect("the door answers");
    assert!(answer.status().is_success(), "{url}: HTTP {}", answer.status());
    answer
}

fn sorted(mut samples: Vec<Duration>) -> Vec<Duration> {
    samples.sort();
    samples
}

fn p(samples: &[Duration], q: f64) -> f64 {
    us(percentile(samples, q))
}

/// Calls per second of `sessions` calling back to back for `window`.
async fn throughput(sessions: &[Session], window: Duration) -> f64 {
    let calls = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let started = Instant::now();
    futures::stream::iter(sessions.iter().cloned())
        .for_each_concurrent(None, |session| {
            let calls = calls.clone();
            async move {
                while Instant::now() < deadline {
                    session.call().await;
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
    calls.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

async fn run(size: Size) {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("bench-gateway").await;
    let exe = std::env::current_exe().expect("the bench binary");
    let echo_port = mcp_servers::free_port();
    let _echo = spawn(tokio::process::Command::new(&exe).args(["--serve-echo-http", &echo_port.to_string()]));
    assert!(mcp_servers::wait_for_http(echo_port, Duration::from_secs(10)).await, "the echo server listens");

    let profiles = (size.bindings / 10).max(1);
    let server: McpServer = serde_json::from_value(json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer",
        "metadata": {"name": "echo"}, "spec": {"transport": "streamableHttp",
        "http": {"url": format!("http://127.0.0.1:{echo_port}/mcp")}, "allowedTools": ["*"]}}))
    .expect("a server");
    ns.api::<McpServer>().create(&PostParams::default(), &server).await.expect("create echo");
    for i in 0..profiles {
        let profile = McpProfile::test(&format!("p{i}")).servers(["echo"]);
        ns.api::<McpProfile>().create(&PostParams::default(), &profile).await.expect("create a profile");
    }
    let accounts: Api<ServiceAccount> = ns.api();
    let names: Vec<String> =
        std::iter::once("caller".to_string()).chain((0..size.callers).map(|i| format!("c{i}"))).collect();
    futures::stream::iter(names.iter())
        .for_each_concurrent(16, |name| {
            let accounts = accounts.clone();
            async move {
                let sa: ServiceAccount =
                    serde_json::from_value(json!({"metadata": {"name": name}})).expect("an account");
                accounts.create(&PostParams::default(), &sa).await.expect("create an account");
            }
        })
        .await;
    // `caller` → p0; callers c0.. over `bindings` bindings, binding b → profile p(b % profiles).
    let bindings: Api<McpProfileBinding> = ns.api();
    let per_binding = size.callers.div_ceil(size.bindings);
    for b in 0..size.bindings {
        let mut subjects: Vec<serde_json::Value> = (b * per_binding..((b + 1) * per_binding).min(size.callers))
            .map(|i| json!({"kind": "ServiceAccount", "name": format!("c{i}")}))
            .collect();
        if b == 0 {
            subjects.push(json!({"kind": "ServiceAccount", "name": "caller"}));
        }
        let binding: McpProfileBinding = serde_json::from_value(json!({"apiVersion": "mcp.spear.dev/v1alpha1",
            "kind": "McpProfileBinding", "metadata": {"name": format!("b{b}")},
            "spec": {"profileRef": {"name": format!("p{}", b % profiles)}, "subjects": subjects}}))
        .expect("a binding");
        bindings.create(&PostParams::default(), &binding).await.expect("create a binding");
    }

    let kubeconfig = control_plane.kubeconfig_path().to_string_lossy().into_owned();
    let spearlet = env!("CARGO_BIN_EXE_spearlet");
    let port = || mcp_servers::free_port();
    let (a_http, a_admin) = (port(), port());
    let _agent = spawn(tokio::process::Command::new(spearlet).args([
        "run",
        "--profile",
        "p0",
        "--namespace",
        &ns.name,
        "--kubeconfig",
        &kubeconfig,
        "--api-key",
        API_KEY,
        "--http-addr",
        &format!("127.0.0.1:{a_http}"),
        "--grpc-addr",
        &format!("127.0.0.1:{}", port()),
        "--admin-addr",
        &format!("127.0.0.1:{a_admin}"),
        "--egress-deny-cidrs",
        "",
        "--audit-log",
        "off",
        "--log-level",
        "warn",
    ]));
    let (g_http, g_admin) = (port(), port());
    let gateway = spawn(tokio::process::Command::new(spearlet).args([
        "gateway",
        "--namespace",
        &ns.name,
        "--kubeconfig",
        &kubeconfig,
        "--http-addr",
        &format!("127.0.0.1:{g_http}"),
        "--admin-addr",
        &format!("127.0.0.1:{g_admin}"),
        "--egress-deny-cidrs",
        "",
        "--audit-log",
        "off",
        "--log-level",
        "warn",
    ]));
    let gateway_pid = gateway.0.id().expect("the gateway runs");
    ready(a_admin).await;
    ready(g_admin).await;
    let a_url = format!("http://127.0.0.1:{a_http}/mcp");
    let g_url = format!("http://127.0.0.1:{g_http}/mcp");
    let caller_token = ns.service_account_token("caller", AUDIENCE).await;
    let http = reqwest::Client::builder().http1_only().build().expect("a client");
    let a = Session::open(&http, &a_url, API_KEY).await;
    let g = Session::open(&http, &g_url, &caller_token).await;
    for _ in 0..50 {
        a.call().await;
        g.call().await;
    }

    // 1. latency, blocks in turn.
    let (mut a_samples, mut g_samples) = (Vec::new(), Vec::new());
    for _ in 0..size.rounds {
        for _ in 0..size.block {
            a_samples.push(a.call().await);
        }
        for _ in 0..size.block {
            g_samples.push(g.call().await);
        }
    }
    let (a_samples, g_samples) = (sorted(a_samples), sorted(g_samples));

    // 2. throughput, each path in turn, twice.
    let mut a_sessions = Vec::new();
    let mut g_sessions = Vec::new();
    for _ in 0..size.concurrent {
        let client = reqwest::Client::builder().http1_only().build().expect("a client");
        a_sessions.push(Session::open(&client, &a_url, API_KEY).await);
        g_sessions.push(Session::open(&client, &g_url, &caller_token).await);
    }
    let (mut a_rates, mut g_rates) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        a_rates.push(throughput(&a_sessions, size.window).await);
        g_rates.push(throughput(&g_sessions, size.window).await);
    }

    // 3. many callers.
    let tokens: Vec<String> = futures::stream::iter((0..size.callers).map(|i| format!("c{i}")))
        .map(|name| {
            let ns = &ns;
            async move { ns.service_account_token(&name, AUDIENCE).await }
        })
        .buffered(16)
        .collect()
        .await;
    let rss_before = rss_kib(gateway_pid);
    let mut first = Vec::with_capacity(size.callers);
    let mut sessions = Vec::with_capacity(size.callers);
    for token in &tokens {
        let started = Instant::now();
        sessions.push(Session::open(&http, &g_url, token).await);
        first.push(started.elapsed());
    }
    let mut cached = Vec::with_capacity(size.callers);
    for session in &sessions {
        cached.push(session.call().await);
    }
    let rss_after = rss_kib(gateway_pid);
    let (first, cached) = (sorted(first), sorted(cached));
    let metrics = reqwest::get(format!("http://127.0.0.1:{g_admin}/metrics")).await.expect("metrics");
    let metrics = metrics.text().await.expect("metrics text");
    let admitted = metrics
        .lines()
        .find(|l| l.starts_with("mcp_gateway_requests_total{outcome=\"admitted\"}"))
        .unwrap_or("admitted: none")
        .to_string();

    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "gateway bench ({} rounds of {} calls, {} callers x {:?}, {} callers over {} bindings and {profiles} profiles)",
        size.rounds, size.block, size.concurrent, size.window, size.callers, size.bindings
    );
    println!("| path | p50 us | p99 us | calls/s ({} callers), two windows |", size.concurrent);
    println!("|---|---|---|---|");
    println!(
        "| A: per-pod agent (spearlet run) | {:.0} | {:.0} | {:.0} / {:.0} |",
        p(&a_samples, 0.5),
        p(&a_samples, 0.99),
        a_rates[0],
        a_rates[1]
    );
    println!(
        "| G: gateway | {:.0} | {:.0} | {:.0} / {:.0} |",
        p(&g_samples, 0.5),
        p(&g_samples, 0.99),
        g_rates[0],
        g_rates[1]
    );
    println!(
        "| G / A | {:.2} | {:.2} | {:.2} |",
        p(&g_samples, 0.5) / p(&a_samples, 0.5),
        p(&g_samples, 0.99) / p(&a_samples, 0.99),
        mean(&g_rates) / mean(&a_rates)
    );
    println!();
    println!("| {} callers | p50 us | p99 us |", size.callers);
    println!("|---|---|---|");
    println!("| first request (initialize, a TokenReview) | {:.0} | {:.0} |", p(&first, 0.5), p(&first, 0.99));
    println!("| then one call each (token cached) | {:.0} | {:.0} |", p(&cached, 0.5), p(&cached, 0.99));
    println!(
        "gateway RSS {:.1} MiB before the callers, {:.1} MiB after ({:.0} B per caller: its cached token answer and session); {admitted}",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        (rss_after.saturating_sub(rss_before) * 1024) as f64 / size.callers as f64,
    );
}
