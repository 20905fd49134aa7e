//! Approvers (`McpProfile.spec.approval`) with the real binaries: `spearlet serve` over a real
//! stdio server whose `approvalPolicy` makes every call need approval, the PyPI `mcp` client as
//! the caller approver (2025-11-25 and 2026-07-28), a Python approval webhook that checks the
//! HMAC signature as a platform team's would, and `spearlet tools call` over gRPC.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;
use spear::testing::mcp_servers;

use crate::serve::{
    LEGACY, STATELESS, admin_metric, call_error, fixture_registry, http_get, next_event, script, serve, serve_with_env,
    start_client,
};

/// The fixture registry with every call of `fx` needing approval, and `approval` as the
/// profile's `spec.approval` (YAML flow).
fn approval_registry(dir: &Path, approval: &str) {
    fixture_registry(dir);
    let fx = std::fs::read_to_string(dir.join("fx.yaml")).expect("fx.yaml");
    std::fs::write(dir.join("fx.yaml"), format!("{fx}  approvalPolicy: {{default: always}}\n")).expect("write fx.yaml");
    std::fs::write(
        dir.join("profile.yaml"),
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [fx]\n  \
             approval: {approval}\n"
        ),
    )
    .expect("write profile.yaml");
}

/// One `/mcp` call through the Python client with `extra` flags: the approval question it was
/// asked (if any) and the call event.
fn mcp_call(served: &crate::serve::Served, call: &str, extra: &[&str]) -> (Option<String>, Value) {
    let (mut client, mut lines) = start_client(served, &[call], false, extra);
    assert_eq!(next_event(&mut lines)["event"], "initialized");
    assert_eq!(next_event(&mut lines)["event"], "tools");
    let mut event = next_event(&mut lines);
    let mut asked = None;
    if event["event"] == "approval" {
        asked = event["message"].as_str().map(str::to_string);
        event = next_event(&mut lines);
    }
    assert_eq!(event["event"], "call", "{event}");
    assert!(client.wait().expect("client exit").success());
    (asked, event)
}

/// The `{"error": {...}}` object of a failed call event.
#[test]
fn the_mcp_caller_approves_or_denies_in_its_own_client_on_both_revisions() {
    let dir = tempfile::tempdir().expect("tempdir");
    approval_registry(dir.path(), "{timeoutSeconds: 3, approvers: [{caller: {}}]}");
    let audit = tempfile::NamedTempFile::new().expect("audit file");
    let audit_path = audit.path().to_string_lossy().into_owned();
    let served = serve(dir, &["--audit-log", &audit_path]);
    let call = r#"mcp__fx__echo={"text": "hello approver"}"#;

    // `/debug/effective` (what `spearlet explain --connect` shows) names the chain per tool.
    let (_, body) = http_get(served.admin, "/debug/effective").expect("debug/effective");
    let explained: Value = serde_json::from_str(&body).expect("JSON");
    let tools = explained["servers"][0]["tools"].as_array().cloned().unwrap_or_default();
    let echo = tools.iter().find(|t| t["tool"] == "echo").expect("echo served");
    assert_eq!(echo["approval"]["mode"], "always", "{echo}");
    assert_eq!(echo["approval"]["timeoutSeconds"], 3, "{echo}");
    let chain = echo["approval"]["approvers"].as_array().cloned().unwrap_or_default();
    assert!(chain.len() == 1 && chain[0].as_str().unwrap_or_default().starts_with("caller"), "{echo}");

    for mode in [LEGACY, STATELESS] {
        let (asked, called) = mcp_call(&served, call, &["--mode", mode, "--approve", "yes"]);
        let asked = asked.unwrap_or_else(|| panic!("{mode}: the caller was asked: {called}"));
        assert!(asked.contains("'echo'") && asked.contains("'fx'") && asked.contains("hello approver"), "{asked}");
        assert_eq!(called["is_error"], false, "{mode}: approved, the call ran: {called}");
        assert_eq!(called["text"], "hello approver", "{mode}: {called}");

        for (answer, said) in [("no", "did not approve"), ("decline", "declined")] {
            let (asked, called) = mcp_call(&served, call, &["--mode", mode, "--approve", answer]);
            assert!(asked.is_some(), "{mode} {answer}: asked");
            let error = call_error(&called);
            assert_eq!(error["error"]["code"], "mcp_approval_denied", "{mode} {answer}: {called}");
            assert_eq!(error["error"]["retryable"], false);
            let message = error["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("caller approver") && message.contains(said), "{mode} {answer}: {message}");
        }
    }

    // A session that declared no elicitation cannot be asked: skipped, and with no other
    // approver, the call needs an approval nobody can give.
    let (asked, called) = mcp_call(&served, call, &["--mode", LEGACY]);
    assert_eq!(asked, None);
    let error = call_error(&called);
    assert_eq!(error["error"]["code"], "mcp_approval_required", "{called}");
    assert!(error["error"]["message"].as_str().unwrap_or_default().contains("did not declare elicitation"), "{error}");

    // A caller that never answers: denied when timeoutSeconds runs out.
    let (asked, called) = mcp_call(&served, call, &["--mode", LEGACY, "--approve", "silent"]);
    assert!(asked.is_some());
    let error = call_error(&called);
    assert_eq!(error["error"]["code"], "mcp_approval_denied", "{called}");
    assert!(error["error"]["message"].as_str().unwrap_or_default().contains("(timeout)"), "{error}");

    let count = |decision: &str| {
        let series = format!("mcp_approval_total{{server_id=\"fx\",approver=\"caller\",decision=\"{decision}\"}}");
        admin_metric(served.admin, &series)
    };
    assert_eq!((count("allow"), count("deny"), count("timeout")), (2.0, 4.0, 1.0));

    let lines = std::fs::read_to_string(audit.path()).expect("audit log");
    let approvals: Vec<Value> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| l.get("approval").cloned())
        .collect();
    assert_eq!(approvals.len(), 7, "one audit line per decision: {lines}");
    assert!(approvals.iter().all(|a| a["approver"] == "caller" && a["latency_ms"].is_number()), "{approvals:?}");
}

/// The webhook of `approval_webhook.py`, its port and the file it logs requests to.
pub(crate) struct Webhook {
    child: Child,
    pub(crate) port: u16,
    log: tempfile::NamedTempFile,
    key: tempfile::NamedTempFile,
}

impl Webhook {
    /// A webhook that checks signatures with `key`.
    fn start(key: &str) -> Webhook {
        Self::spawn(Some(key))
    }

    /// A webhook that checks no signature.
    pub(crate) fn start_unsigned() -> Webhook {
        Self::spawn(None)
    }

    fn spawn(key: Option<&str>) -> Webhook {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let key_file = tempfile::NamedTempFile::new().expect("key file");
        let mut command = Command::new(mcp_servers::python());
        command.arg(script("approval_webhook.py")).arg("--log").arg(log.path());
        if let Some(key) = key {
            std::fs::write(key_file.path(), key).expect("write the key");
            command.arg("--key-file").arg(key_file.path());
        }
        let mut child = command.stdout(Stdio::piped()).spawn().expect("spawn the approval webhook");
        let mut port = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut port).expect("the webhook's port");
        Webhook { child, port: port.trim().parse().expect("a port"), log, key: key_file }
    }

    pub(crate) fn requests(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.log.path()).expect("webhook log");
        text.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect()
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn grpc_call(grpc: u16, text: &str) -> (Output, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["tools", "call", "fx/echo", "--args", &format!(r#"{{"text": "{text}"}}"#)])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .output()
        .expect("spawn spearlet tools call");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, said)
}

#[test]
fn a_signed_webhook_decides_and_everything_but_its_allow_denies() {
    let webhook = Webhook::start("s3cret");
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://127.0.0.1:{}/approve", webhook.port);
    approval_registry(
        dir.path(),
        &format!(
            "{{timeoutSeconds: 2, approvers: [{{caller: {{}}}}, {{webhook: {{url: \"{url}\", \
             signingSecretRef: {{name: approver-key, key: hmac}}, includeArguments: true}}}}]}}"
        ),
    );
    let served = serve_with_env(dir, &["--audit-log", "off"], &[("SPEAR_APPROVAL_KEY_APPROVER_KEY_HMAC", "s3cret")]);

    let (allowed, said) = grpc_call(served.grpc, "allow");
    assert!(allowed.status.success() && said.contains("allow"), "{said}");
    let denied = |text: &str, needle: &str| {
        let (out, said) = grpc_call(served.grpc, text);
        assert_eq!(out.status.code(), Some(1), "{text}: {said}");
        assert!(said.contains("mcp_approval_denied") && said.contains(needle), "{text}: {said}");
    };
    denied("deny", "not this one");
    denied("slow", "(timeout)");
    denied("garbage", "not a JSON object with a decision");
    denied("error", "HTTP 500");

    // The /mcp caller that cannot answer a form is skipped: the webhook decides.
    let (asked, called) = mcp_call(&served, r#"mcp__fx__echo={"text": "allow"}"#, &["--mode", LEGACY]);
    assert_eq!((asked, &called["is_error"]), (None, &Value::Bool(false)), "{called}");

    let requests = webhook.requests();
    assert_eq!(requests.len(), 6, "{requests:?}");
    for logged in &requests {
        assert_eq!(logged["signed"], true, "every request is signed with the key: {logged}");
        assert_eq!(logged["content_type"], "application/json");
        let request = &logged["request"];
        assert_eq!(
            (&request["profile"], &request["server"], &request["tool"]),
            (&"p".into(), &"fx".into(), &"echo".into())
        );
        assert_eq!(request["name"], "mcp__fx__echo");
        assert!(request["argumentsDigest"].as_str().unwrap_or_default().starts_with("sha256:"), "{request}");
        assert!(request["registryRevision"].is_string() && request["expiresAt"].is_string(), "{request}");
    }
    assert_eq!(requests[0]["request"]["arguments"]["text"], "allow", "includeArguments sends them");
    assert_eq!(requests[0]["request"]["door"], "grpc");
    assert_eq!(requests[5]["request"]["door"], "mcp");
    let ids: std::collections::BTreeSet<&str> = requests.iter().filter_map(|r| r["request"]["id"].as_str()).collect();
    assert_eq!(ids.len(), requests.len(), "one id per question");

    // The receiver's key no longer matches the agent's: it refuses the signature, which denies.
    std::fs::write(webhook.key.path(), "rotated").expect("rotate the key");
    denied("allow", "HTTP 401");
    assert_eq!(webhook.requests().last().map(|r| r["signed"].clone()), Some(Value::Bool(false)));

    // Nothing listens any more: denied, not allowed and not hung.
    drop(webhook);
    denied("allow", "could not be reached");

    let count = |decision: &str| {
        let series = format!("mcp_approval_total{{server_id=\"fx\",approver=\"webhook\",decision=\"{decision}\"}}");
        admin_metric(served.admin, &series)
    };
    assert_eq!((count("allow"), count("deny"), count("timeout"), count("error")), (2.0, 1.0, 1.0, 4.0));
}

/// A webhook approver whose signing key is configured but not in the agent's environment: the
/// call is denied naming the env var to set, and the webhook is never asked unsigned.
#[test]
fn a_webhook_whose_signing_key_is_missing_is_never_asked_unsigned() {
    let webhook = Webhook::start("s3cret");
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://127.0.0.1:{}/approve", webhook.port);
    approval_registry(
        dir.path(),
        &format!(
            "{{approvers: [{{webhook: {{url: \"{url}\", signingSecretRef: {{name: approver-key, key: hmac}}}}}}]}}"
        ),
    );
    let served = serve(dir, &["--audit-log", "off"]);
    let (out, said) = grpc_call(served.grpc, "allow");
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("mcp_approval_denied") && said.contains("SPEAR_APPROVAL_KEY_APPROVER_KEY_HMAC"), "{said}");
    assert!(webhook.requests().is_empty());
}

/// The webhook request goes through the agent's outbound policy: a redirect is not followed (the
/// approval a redirect points at is never asked, and the call is denied), and a cloud metadata
/// address is refused before any connection.
#[test]
fn an_approval_webhook_is_held_to_the_outbound_policy() {
    let webhook = Webhook::start_unsigned();
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("http://127.0.0.1:{}/redirect", webhook.port);
    approval_registry(dir.path(), &format!("{{approvers: [{{webhook: {{url: \"{url}\", includeArguments: true}}}}]}}"));
    let served = serve(dir, &["--audit-log", "off"]);
    let (out, said) = grpc_call(served.grpc, "allow");
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("mcp_approval_denied") && said.contains("HTTP 302"), "{said}");
    let paths: Vec<Value> = webhook.requests().iter().map(|r| r["path"].clone()).collect();
    assert_eq!(paths, [Value::from("/redirect")], "the redirect was not followed");

    let dir = tempfile::tempdir().expect("tempdir");
    approval_registry(dir.path(), "{approvers: [{webhook: {url: \"https://169.254.169.254/approve\"}}]}");
    let served = serve(dir, &["--audit-log", "off"]);
    let (out, said) = grpc_call(served.grpc, "allow");
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("mcp_approval_denied") && said.contains("refused by the agent's outbound policy"), "{said}");
}
