//! The kubernetes approver against the test control plane: `spearlet run` (in process, as a pod's
//! agent would, through the test kubeconfig) over a real Streamable HTTP server whose calls all
//! need approval; a call that waits on its McpApproval; `kubectl spear approve` and `deny` (the
//! real plugin binary) deciding it; the chart's admission policy refusing a forged `decidedBy`
//! and a second decision.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube::ResourceExt as _;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use spear::agent::run_in_pod;
use spear::api::{ApprovalMode, McpApproval, McpProfile, McpServer};
use spear::testing::control_plane::ControlPlane;
use spear::testing::mcp_servers;
use tokio_util::sync::CancellationToken;

use crate::chart::{objects, repo};

const PATIENCE: Duration = Duration::from_secs(60);

/// The chart's approval objects (the approver ClusterRole, the admission policy and its binding),
/// applied for real: the policy holds cluster-wide, for McpApprovals only. Returns once the API
/// server enforces it: a new policy takes effect a moment after it is stored, and a test that
/// writes sooner would see its forged decision accepted.
async fn apply_approval_policy(ns: &spear::testing::control_plane::TestNamespace) {
    let client = &ns.client;
    let install = std::fs::read_to_string(repo().join("manifests/install.yaml")).expect("install.yaml");
    let apply = PatchParams::apply("spear-test-approval").force();
    for value in objects(&install) {
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let wanted = matches!(kind.as_str(), "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding")
            || (kind == "ClusterRole" && name == "spear-mcp-approver");
        if !wanted {
            continue;
        }
        let object: DynamicObject = serde_json::from_value(value).expect("object");
        let gvk = GroupVersionKind::try_from(object.types.as_ref().expect("types")).expect("gvk");
        let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.expect("served");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        api.patch(&name, &apply, &Patch::Apply(&object)).await.unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
    }
    assert!(install.contains("kind: ValidatingAdmissionPolicy\n"), "the chart ships the policy");

    // Probe with throwaway McpApprovals until a forged decidedBy is refused.
    let approvals = ns.api::<McpApproval>();
    let forged =
        json!({"status": {"decision": "Allow", "decidedBy": "someone-else", "decidedAt": "2026-01-01T00:00:00Z"}});
    let deadline = Instant::now() + PATIENCE;
    for attempt in 0.. {
        let probe: McpApproval = serde_json::from_value(json!({
            "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpApproval", "metadata": {"name": format!("policy-probe-{attempt}")},
            "spec": {"pod": "probe", "profile": "p", "server": "fx", "tool": "echo", "name": "fx__echo",
                     "argumentsDigest": "sha256:0", "door": "grpc", "expiresAt": "2030-01-01T00:00:00Z"},
        }))
        .expect("a probe");
        approvals.create(&PostParams::default(), &probe).await.expect("create a probe McpApproval");
        let name = probe.name_any();
        let answer = approvals.patch_status(&name, &PatchParams::default(), &Patch::Merge(&forged)).await;
        let refused = answer.err().is_some_and(|e| e.to_string().contains("your own user name"));
        approvals.delete(&name, &Default::default()).await.expect("delete the probe");
        if refused {
            return;
        }
        assert!(Instant::now() < deadline, "the admission policy was not enforced within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn kubectl_spear(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let link = dir.path().join("kubectl-spear");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_spearlet"), &link).expect("link the plugin name");
    Command::new(link)
        .args(args)
        .env("KUBECONFIG", ControlPlane::shared().kubeconfig_path())
        .output()
        .expect("kubectl spear runs")
}

/// `spearlet tools call fx/echo` over gRPC, in the background (it waits for its approval).
fn call(grpc: SocketAddr, text: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["tools", "call", "fx/echo", "--args", &format!(r#"{{"text": "{text}"}}"#)])
        .args(["--grpc-addr", &grpc.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spearlet tools call")
}

async fn said(child: tokio::process::Child) -> (bool, String) {
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output()).await.expect("the call ends").expect("output");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The one undecided McpApproval of `ns`, once the agent created it.
async fn pending(api: &Api<McpApproval>) -> McpApproval {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let listed = api.list(&ListParams::default()).await.expect("list McpApprovals");
        let mut open = listed.items.into_iter().filter(|a| a.status.as_ref().and_then(|s| s.decision).is_none());
        if let Some(approval) = open.next() {
            return approval;
        }
        assert!(Instant::now() < deadline, "no McpApproval appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn free_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, mcp_servers::free_port()))
}

#[tokio::test]
async fn a_call_waits_for_its_mcp_approval_and_kubectl_spear_approve_or_deny_decides() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("approve").await;
    apply_approval_policy(&ns).await;

    let port = mcp_servers::free_port();
    let _server = tokio::process::Command::from(mcp_servers::fixture_http(port, &[]).to_std())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the fixture server starts");
    assert!(mcp_servers::wait_for_http(port, PATIENCE).await, "the fixture server listens");
    let server = McpServer::test("fx").http_at(port).allowing(["*"]).approval(ApprovalMode::Always, []);
    ns.api::<McpServer>().create(&PostParams::default(), &server).await.expect("fx");
    let mut profile = McpProfile::test("p").servers(["fx"]);
    profile.spec.approval = Some(
        serde_json::from_value(json!({"timeoutSeconds": 50, "approvers": [{"kubernetes": {}}]})).expect("approval"),
    );
    ns.api::<McpProfile>().create(&PostParams::default(), &profile).await.expect("p");

    let socket_dir = tempfile::tempdir().expect("socket dir");
    let admin = free_addr();
    let mut config = super::kube_source::run_config(control_plane, &ns.name, socket_dir.path(), admin, None);
    config.pod_name = Some("agent-pod".into());
    let grpc = config.agent.grpc_addr;
    let cancel = CancellationToken::new();
    let run = tokio::spawn(run_in_pod(config, cancel.clone()));
    let deadline = Instant::now() + PATIENCE;
    while reqwest::get(format!("http://{admin}/readyz")).await.map(|r| r.status().as_u16()).ok() != Some(200) {
        assert!(Instant::now() < deadline && !run.is_finished(), "spearlet run did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A call waits on the McpApproval it created, which names the call but not its arguments.
    let approvals = ns.api::<McpApproval>();
    let waiting = call(grpc, "approve me");
    let asked = pending(&approvals).await;
    let name = asked.name_any();
    assert_eq!(
        (asked.spec.pod.as_str(), asked.spec.server.as_str(), asked.spec.tool.as_str()),
        ("agent-pod", "fx", "echo")
    );
    assert!(asked.spec.arguments_digest.starts_with("sha256:"), "{asked:?}");
    assert!(!serde_json::to_string(&asked).expect("json").contains("approve me"), "no arguments stored");

    // The admission policy: decidedBy is the writer's own name.
    let forged =
        json!({"status": {"decision": "Allow", "decidedBy": "someone-else", "decidedAt": "2026-01-01T00:00:00Z"}});
    let refused = approvals.patch_status(&name, &PatchParams::default(), &Patch::Merge(&forged)).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("your own user name"), "a forged decidedBy is refused: {message}");

    let approved = kubectl_spear(&["approve", &name, "-n", &ns.name, "--reason", "looks fine"]);
    let text = String::from_utf8_lossy(&approved.stderr).into_owned();
    assert!(approved.status.success(), "{text}");
    assert!(text.contains("approved McpApproval") && text.contains("'echo' on 'fx'"), "{text}");
    let (ok, output) = said(waiting).await;
    assert!(ok && output.contains("approve me"), "the approved call ran: {output}");

    // A decision is final: neither the plugin nor a direct write changes it.
    let again = kubectl_spear(&["deny", &name, "-n", &ns.name, "--reason", "changed my mind"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("decided already"), "{again:?}");
    let decided = approvals.get(&name).await.expect("get");
    let by = decided.status.as_ref().and_then(|s| s.decided_by.clone()).expect("decidedBy");
    let flip = json!({"status": {"decision": "Deny", "decidedBy": by, "decidedAt": "2026-01-01T00:00:00Z"}});
    let refused = approvals.patch_status(&name, &PatchParams::default(), &Patch::Merge(&flip)).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("a decision is final"), "{message}");

    // Denied: the caller gets mcp_approval_denied with who and why.
    let waiting = call(grpc, "deny me");
    let asked = pending(&approvals).await;
    let denied = kubectl_spear(&["deny", &asked.name_any(), "-n", &ns.name, "--reason", "not now"]);
    assert!(denied.status.success(), "{}", String::from_utf8_lossy(&denied.stderr));
    let (ok, output) = said(waiting).await;
    assert!(!ok && output.contains("mcp_approval_denied"), "{output}");
    assert!(output.contains(&format!("denied by {by}: not now")), "{output}");

    let (_, metrics) =
        (200, reqwest::get(format!("http://{admin}/metrics")).await.expect("metrics").text().await.expect("text"));
    for decision in ["allow", "deny"] {
        let series =
            format!("mcp_approval_total{{server_id=\"fx\",approver=\"kubernetes\",decision=\"{decision}\"}} 1");
        assert!(metrics.lines().any(|l| l == series), "{series}\n{metrics}");
    }
    cancel.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), run).await;
}
