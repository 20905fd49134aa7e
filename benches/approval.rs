//! Latency an approver adds to a tool call, per approver kind, against the same call without
//! approval in the same run: the agent core over the real PyPI-`mcp` fixture server (stdio), one
//! server with `approvalPolicy: always` and one without, the profile's chain `[caller, webhook]`.
//!
//! - `none`: the server without approval (the baseline).
//! - `caller`: a `/mcp` 2025-11-25 caller that declared elicitation, answered at once by a task
//!   standing in for the client (the agent's own cost: the form, the relay, reading the answer;
//!   a real client adds its network hop and its person).
//! - `webhook`: the gRPC door (no caller to ask), so the chain's webhook decides: an axum service
//!   on loopback answering `allow` (unsigned: HMAC-SHA256 over a request of about 500 bytes is a
//!   microsecond or two).
//!
//! - `kubernetes` (when the test control plane is available, `SPEAR_CONTROL_PLANE_BIN`): the
//!   chain `[kubernetes]` of a second agent in a namespace of the test control plane; a task
//!   watching McpApprovals there decides each at once (the API server's round trips: create,
//!   the watch event, the status write, the agent's watch event).
//!
//! Calls alternate one by one between the three so drift hits all alike. Run:
//! `cargo bench --bench approval` (`cargo test --all-targets` runs a short smoke form).
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::time::{Duration, Instant};

use rmcp::model::{ElicitResult, ElicitationAction};
use serde_json::json;
use spear::agent::audit::Door;
use spear::agent::{Agent, AgentOptions, CallContext};
use spear::api::manifest::Object;
use spear::api::{ApprovalMode, McpApproval, McpProfile, McpServer};
use spear::mcp::{Relay, Relayed};
use spear::testing::bench::{percentile, process_env, static_agent, us};
use spear::testing::mcp_servers;
use tokio_util::sync::CancellationToken;

/// An approval webhook on loopback that allows everything; returns its URL.
async fn webhook() -> String {
    let app = axum::Router::new().route(
        "/approve",
        axum::routing::post(|| async { axum::Json(json!({"decision": "allow", "reason": "bench"})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the webhook");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://127.0.0.1:{port}/approve")
}

/// An agent whose only approver is `kubernetes: {}`, in `namespace` of the test control plane.
async fn cluster_agent(client: kube::Client, namespace: &str) -> (Agent, CancellationToken) {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let mut profile = McpProfile::test("p").servers(["gated"]);
    profile.spec.approval = Some(
        serde_json::from_value(json!({"timeoutSeconds": 30, "approvers": [{"kubernetes": {}}]})).expect("approval"),
    );
    let objects = vec![
        Object::Server(McpServer::test("gated").running(&fixture).allowing(["*"]).approval(ApprovalMode::Always, [])),
        Object::Profile(profile),
    ];
    let options = AgentOptions::new("p").in_cluster(client, namespace.to_string(), Some("bench-pod".into()));
    static_agent(objects, process_env(), options).await
}

/// Decides every McpApproval of `namespace` as it appears: `Allow`, by "bench".
async fn approve_all(client: kube::Client, namespace: String) {
    use futures::TryStreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let api: kube::Api<McpApproval> = kube::Api::namespaced(client, &namespace);
    let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
    futures::pin_mut!(stream);
    while let Ok(Some(approval)) = stream.try_next().await {
        if approval.status.as_ref().and_then(|s| s.decision).is_some() {
            continue;
        }
        let status = json!({"status": {"decision": "Allow", "decidedBy": "bench", "decidedAt": jiff::Timestamp::now().to_string()}});
        let name = kube::ResourceExt::name_any(&approval);
        let _ = api.patch_status(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&status)).await;
    }
}

async fn agent(url: &str) -> (Agent, CancellationToken) {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let mut profile = McpProfile::test("p").servers(["plain", "gated"]);
    profile.spec.approval = Some(
        serde_json::from_value(json!({"timeoutSeconds": 10, "approvers": [
            {"caller": {}},
            {"webhook": {"url": url}},
        ]}))
        .expect("approval"),
    );
    let objects = vec![
        Object::Server(McpServer::test("plain").running(&fixture).allowing(["*"])),
        Object::Server(McpServer::test("gated").running(&fixture).allowing(["*"]).approval(ApprovalMode::Always, [])),
        Object::Profile(profile),
    ];
    static_agent(objects, process_env(), AgentOptions::new("p")).await
}

async fn call(agent: &Agent, name: &str, context: CallContext<'_>) -> Duration {
    let set = agent.effective(None, &[]).expect("effective set");
    let started = Instant::now();
    let call = agent.call_tool(&set, name, Ok(json!({"text": "ping"}).as_object().cloned()), context).await;
    let latency = started.elapsed();
    if let Err(error) = &call.result {
        panic!("{name}: {error}");
    }
    latency
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let calls = if bench { 300 } else { 3 };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async move {
        spear::install_crypto_provider();
        let url = webhook().await;
        let (agent, cancel) = agent(&url).await;
        let (relay, mut relayed) = Relay::channel(None, None, false, true);
        // The client: accepts every form at once with approve: true.
        tokio::spawn(async move {
            while let Some(message) = relayed.recv().await {
                if let Relayed::Elicitation(_, answer) = message {
                    let mut accepted = ElicitResult::new(ElicitationAction::Accept);
                    accepted.content = Some(json!({"approve": true}));
                    let _ = answer.send(Ok(accepted));
                }
            }
        });
        let grpc = || CallContext::new(Door::Grpc, "bench", None);
        let mcp = CallContext { relay: Some(&relay), ..CallContext::new(Door::Mcp, "bench", Some("s")) };
        // Warm up: sessions, the webhook client's connection.
        for _ in 0..3 {
            call(&agent, "mcp__plain__echo", grpc()).await;
            call(&agent, "mcp__gated__echo", mcp).await;
            call(&agent, "mcp__gated__echo", grpc()).await;
        }
        let (mut none, mut caller, mut hook) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..calls {
            none.push(call(&agent, "mcp__plain__echo", grpc()).await);
            caller.push(call(&agent, "mcp__gated__echo", mcp).await);
            hook.push(call(&agent, "mcp__gated__echo", grpc()).await);
        }
        for samples in [&mut none, &mut caller, &mut hook] {
            samples.sort();
        }
        let (base50, base99) = (percentile(&none, 0.5), percentile(&none, 0.99));
        println!("approval bench: {calls} calls each, the PyPI-mcp fixture's echo over stdio");
        println!("  none     p50 {:>9.1} us  p99 {:>9.1} us", us(base50), us(base99));
        for (kind, samples) in [("caller", &caller), ("webhook", &hook)] {
            let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
            println!(
                "  {kind:<8} p50 {:>9.1} us  p99 {:>9.1} us  added p50 {:>8.1} us  ratio p50 {:.2}",
                us(p50),
                us(p99),
                us(p50) - us(base50),
                p50.as_secs_f64() / base50.as_secs_f64()
            );
        }
        cancel.cancel();

        if std::env::var_os(spear::testing::control_plane::ENV_BIN).is_none() {
            println!("  kubernetes: skipped (no test control plane: set SPEAR_CONTROL_PLANE_BIN=\"$(hack/control-plane.sh)\")");
            return;
        }
        let control_plane = spear::testing::control_plane::ControlPlane::shared();
        let ns = control_plane.namespace("approval-bench").await;
        tokio::spawn(approve_all(ns.client.clone(), ns.name.clone()));
        let (agent, cancel) = cluster_agent(ns.client.clone(), &ns.name).await;
        let mut kube = Vec::new();
        for i in 0..calls.min(100) + 3 {
            let latency = call(&agent, "mcp__gated__echo", grpc()).await;
            if i >= 3 {
                kube.push(latency);
            }
        }
        kube.sort();
        let (p50, p99) = (percentile(&kube, 0.5), percentile(&kube, 0.99));
        println!(
            "  kubernetes p50 {:>9.1} us  p99 {:>9.1} us  added p50 {:>8.1} us over the baseline above ({} calls, a test control plane on loopback)",
            us(p50),
            us(p99),
            us(p50) - us(base50),
            kube.len()
        );
        cancel.cancel();
    });
}
