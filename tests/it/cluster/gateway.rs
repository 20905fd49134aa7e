//! `spearlet gateway` against the test control plane: callers authenticate with real projected
//! ServiceAccount tokens (the TokenRequest API, what the kubelet asks for), the gateway checks
//! them with real TokenReviews, and McpProfileBindings give each caller its profile. The MCP
//! servers are rmcp echo servers over Streamable HTTP; the clients are rmcp, plain HTTP for the
//! refusals, and the PyPI `mcp` SDK for the metadata discovery.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use rmcp::ServiceExt as _;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use spear::api::{McpProfile, McpProfileBinding, McpServer};
use spear::testing::control_plane::{ControlPlane, TestNamespace};
use spear::testing::mcp_servers;

/// The test control plane's `--service-account-issuer`.
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const AUDIENCE: &str = "spear-mcp-gateway";
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"gw","version":"1"}}}"#;

/// A running `spearlet gateway`, killed on drop.
struct Gateway {
    child: Child,
    http: u16,
    admin: u16,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        crate::serve::terminate(&mut self.child, Duration::from_secs(10));
    }
}

impl Gateway {
    fn mcp(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.http)
    }

    async fn start(namespace: &str, audit: &std::path::Path) -> Gateway {
        let (http, admin) = (mcp_servers::free_port(), mcp_servers::free_port());
        let kubeconfig = ControlPlane::shared().kubeconfig_path();
        let child = Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["gateway", "--namespace", namespace, "--egress-deny-cidrs", ""])
            .args(["--http-addr", &format!("127.0.0.1:{http}"), "--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--audit-log", &audit.to_string_lossy()])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spearlet gateway starts");
        let gateway = Gateway { child, http, admin };
        let ready = format!("http://127.0.0.1:{admin}/readyz");
        for _ in 0..300 {
            if reqwest::get(&ready).await.is_ok_and(|r| r.status().is_success()) {
                return gateway;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the gateway was not ready within 30 s");
    }
}

async fn create<K>(api: &Api<K>, value: Value)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).expect("a valid object");
    api.create(&PostParams::default(), &object).await.expect("create");
}

/// Two echo servers, a profile for each, four service accounts and the bindings:
/// `app` → reader, `other` → writer, `both` → reader and writer, `stranger` → none.
async fn registry(ns: &TestNamespace, alpha: u16, beta: u16) {
    let servers: Api<McpServer> = ns.api();
    for (name, port) in [("alpha", alpha), ("beta", beta)] {
        // beta: one call a minute, per caller in the gateway as per pod.
        let server = json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": name},
            "spec": {"transport": "streamableHttp", "http": {"url": format!("http://127.0.0.1:{port}/mcp")}, "allowedTools": ["*"],
                "budgets": if name == "beta" { json!({"rateLimit": {"perMinute": 1, "burst": 1}}) } else { json!({}) }}});
        create(&servers, server).await;
    }
    let profiles: Api<McpProfile> = ns.api();
    for (name, server) in [("reader", "alpha"), ("writer", "beta")] {
        let profile = json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpProfile", "metadata": {"name": name},
            "spec": {"servers": [server]}});
        create(&profiles, profile).await;
    }
    let accounts: Api<ServiceAccount> = ns.api();
    for name in ["app", "other", "both", "stranger"] {
        create(&accounts, json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})).await;
    }
    let bindings: Api<McpProfileBinding> = ns.api();
    let sa = |name: &str| json!({"kind": "ServiceAccount", "name": name});
    for (name, profile, subjects) in
        [("readers", "reader", json!([sa("app"), sa("both")])), ("writers", "writer", json!([sa("other"), sa("both")]))]
    {
        let binding = json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpProfileBinding", "metadata": {"name": name},
            "spec": {"profileRef": {"name": profile}, "subjects": subjects}});
        create(&bindings, binding).await;
    }
    // The API server refuses what the gateway would ignore: a namespace on a User subject.
    let bad: McpProfileBinding = serde_json::from_value(json!({"apiVersion": "mcp.spear.dev/v1alpha1",
        "kind": "McpProfileBinding", "metadata": {"name": "bad"},
        "spec": {"profileRef": {"name": "reader"}, "subjects": [{"kind": "User", "name": "alice", "namespace": "x"}]}}))
    .expect("an object");
    let refused = bindings.create(&PostParams::default(), &bad).await.expect_err("refused at admission");
    assert!(refused.to_string().contains("namespace is for ServiceAccount subjects only"), "{refused}");
}

/// POSTs `body` over HTTP/2 with prior knowledge (h2c); status and headers.
async fn h2_post(
    port: u16,
    token: Option<&str>,
    profile: Option<&str>,
    session: Option<&str>,
    body: &str,
) -> (u16, axum::http::HeaderMap) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake::<_, _, axum::body::Body>(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("an HTTP/2 connection");
    let driver = tokio::spawn(connection);
    let mut request = axum::http::Request::post(format!("http://127.0.0.1:{port}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if let Some(profile) = profile {
        request = request.header("spear-profile", profile);
    }
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let request = request.body(axum::body::Body::from(body.to_string())).expect("a request");
    let response = sender.send_request(request).await.expect("an HTTP/2 answer");
    let (parts, _) = response.into_parts();
    driver.abort();
    (parts.status.as_u16(), parts.headers)
}

async fn echo_server() -> (u16, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    (port, tokio::spawn(spear::testing::echo::serve_http(listener)))
}

/// The tool names a caller with `token` (and `profile` header) sees through rmcp.
async fn tools_of(url: &str, token: &str) -> Vec<String> {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token.to_string());
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("a session");
    let mut names: Vec<String> =
        client.list_all_tools().await.expect("tools").into_iter().map(|t| t.name.to_string()).collect();
    names.sort();
    let _ = client.cancel().await;
    names
}

/// POSTs `body` with `token`, `profile` and `session`; status, headers and body text.
async fn post(
    url: &str,
    token: Option<&str>,
    profile: Option<&str>,
    session: Option<&str>,
    body: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(profile) = profile {
        request = request.header("spear-profile", profile);
    }
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let response = request.send().await.expect("the gateway answers");
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    (status, headers, response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn callers_get_their_bindings_profile_and_nothing_else() {
    spear::install_crypto_provider();
    let ns = ControlPlane::shared().namespace("gateway").await;
    let ((alpha, _a), (beta, _b)) = (echo_server().await, echo_server().await);
    registry(&ns, alpha, beta).await;
    let work = tempfile::tempdir().expect("tempdir");
    let audit = work.path().join("audit.jsonl");
    let gateway = Gateway::start(&ns.name, &audit).await;
    let url = gateway.mcp();

    // Each caller sees its binding's profile, through the per-pod agent's names.
    let app = ns.service_account_token("app", AUDIENCE).await;
    let other = ns.service_account_token("other", AUDIENCE).await;
    assert_eq!(tools_of(&url, &app).await, ["mcp__alpha__echo"]);
    assert_eq!(tools_of(&url, &other).await, ["mcp__beta__echo"]);

    // A call outside the caller's profile is refused by the profile's policy; inside, it runs
    // and its audit line names the caller.
    let config = StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header(other.clone());
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("a session");
    let call = |name: &str| {
        rmcp::model::CallToolRequestParams::new(name.to_string())
            .with_arguments(json!({"message": "hi"}).as_object().cloned().unwrap_or_default())
    };
    let refused = client.call_tool(call("mcp__alpha__echo")).await.expect("an answer");
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let ran = client.call_tool(call("mcp__beta__echo")).await.expect("an answer");
    assert_ne!(ran.is_error, Some(true), "{ran:?}");
    let limited = client.call_tool(call("mcp__beta__echo")).await.expect("an answer");
    assert_eq!(limited.is_error, Some(true), "beta allows one call a minute: {limited:?}");
    assert!(format!("{limited:?}").contains("rate limit"), "{limited:?}");
    let _ = client.cancel().await;

    // No binding: 403 with the reason; no token, a bad one or one for another audience: 401
    // with the RFC 9728 challenge.
    let stranger = ns.service_account_token("stranger", AUDIENCE).await;
    let (status, _, body) = post(&url, Some(&stranger), None, None, INITIALIZE).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("not_bound") && body.contains(&format!("system:serviceaccount:{}:stranger", ns.name)),
        "{body}"
    );
    assert!(!body.contains("reader") && !body.contains("writer"), "a refusal names no other caller's profile: {body}");
    let wrong_audience = ns.service_account_token("app", "https://kubernetes.default.svc").await;
    let metadata_url = format!("http://127.0.0.1:{}/.well-known/oauth-protected-resource/mcp", gateway.http);
    for (authorization, error) in [
        (None, None),
        (Some("not-a-token"), Some("invalid_token")),
        (Some(wrong_audience.as_str()), Some("invalid_token")),
    ] {
        let (status, headers, body) = post(&url, authorization, None, None, INITIALIZE).await;
        assert_eq!(status, 401, "{body}");
        let challenge = headers.get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(challenge.starts_with(&format!("Bearer resource_metadata=\"{metadata_url}\"")), "{challenge}");
        assert_eq!(error.is_some(), challenge.contains("error=\"invalid_token\""), "{challenge}");
        assert!(!body.contains(&wrong_audience), "the token is not echoed");
    }

    // Bound to two profiles: choose with Spear-Profile, or be refused; a profile not bound is
    // refused even when named.
    let both = ns.service_account_token("both", AUDIENCE).await;
    let (status, _, body) = post(&url, Some(&both), None, None, INITIALIZE).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("profile_choice_required") && body.contains("reader, writer"), "{body}");
    let (status, _, body) = post(&url, Some(&app), Some("writer"), None, INITIALIZE).await;
    assert_eq!(status, 403, "{body}");
    let (status, headers, body) = post(&url, Some(&both), Some("reader"), None, INITIALIZE).await;
    assert_eq!(status, 200, "{body}");
    let boths_session = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).expect("a session id").to_string();
    // Another caller of the same profile has its own rate-limit buckets: `other` used beta's
    // one call a minute, `both` still has its own.
    let config = StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header(both.clone()).custom_headers(
        [(http::HeaderName::from_static("spear-profile"), http::HeaderValue::from_static("writer"))].into(),
    );
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("a session as writer");
    let ran = client.call_tool(call("mcp__beta__echo")).await.expect("an answer");
    assert_ne!(ran.is_error, Some(true), "both's own bucket: {ran:?}");
    let _ = client.cancel().await;

    // A session id works for its own caller only: another caller bound to the same profile, or
    // the same caller under another profile, gets 404.
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let (status, _, _) = post(&url, Some(&both), Some("reader"), Some(&boths_session), list).await;
    assert_eq!(status, 200);
    let (status, _, _) = post(&url, Some(&app), None, Some(&boths_session), list).await;
    assert_eq!(status, 404, "another caller's session id");
    let (status, _, _) = post(&url, Some(&both), Some("writer"), Some(&boths_session), list).await;
    assert_eq!(status, 404, "the same caller under another profile");
    let unsealed = boths_session.rsplit_once('.').map(|(id, _)| id).expect("a sealed id");
    let (status, _, _) = post(&url, Some(&both), Some("reader"), Some(unsealed), list).await;
    assert_eq!(status, 404, "the door's own id without its seal");

    // The same answers over HTTP/2 (h2c, prior knowledge): 401 with the challenge, a sealed id
    // that is another caller's is 404, the caller's own initialize is admitted and sealed.
    let (status, headers) = h2_post(gateway.http, None, None, None, INITIALIZE).await;
    assert_eq!(status, 401);
    assert!(headers.get("www-authenticate").and_then(|v| v.to_str().ok()).is_some_and(|c| c.contains(&metadata_url)));
    let (status, _) = h2_post(gateway.http, Some(&app), None, Some(&boths_session), list).await;
    assert_eq!(status, 404, "another caller's session id over HTTP/2");
    let (status, headers) = h2_post(gateway.http, Some(&both), Some("reader"), None, INITIALIZE).await;
    assert_eq!(status, 200);
    let sealed = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).expect("a session id over HTTP/2");
    assert!(sealed.rsplit_once('.').is_some_and(|(_, mac)| mac.len() == 32), "{sealed}");

    // A per-pod agent with the same profile serves the same tools, byte for byte: the gateway runs
    // the agent's own core and door.
    let (agent_http, agent_admin, agent_grpc) =
        (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let mut agent = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["run", "--profile", "reader", "--namespace", &ns.name, "--egress-deny-cidrs", "", "--audit-log", "off"])
        .args(["--http-addr", &format!("127.0.0.1:{agent_http}"), "--admin-addr", &format!("127.0.0.1:{agent_admin}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{agent_grpc}"), "--api-key", "the-pods-key-0123456789"])
        .arg("--kubeconfig")
        .arg(ControlPlane::shared().kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spearlet run starts");
    let agent_ready = format!("http://127.0.0.1:{agent_admin}/readyz");
    for _ in 0..300 {
        if reqwest::get(&agent_ready).await.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listing = |url: String, key: String| async move {
        let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(key);
        let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("a session");
        let tools = client.list_all_tools().await.expect("tools");
        let _ = client.cancel().await;
        serde_json::to_value(tools).expect("JSON")
    };
    let through_agent = listing(format!("http://127.0.0.1:{agent_http}/mcp"), "the-pods-key-0123456789".into()).await;
    let through_gateway = listing(url.clone(), app.clone()).await;
    crate::serve::terminate(&mut agent, Duration::from_secs(10));
    assert_eq!(through_agent, through_gateway, "the pod and the gateway caller with one profile see one set");

    // The PyPI `mcp` SDK discovers the metadata from the 401 and works with the token.
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/gateway_client.py");
    let (python, url2, app2) = (mcp_servers::python(), url.clone(), app.clone());
    let output = tokio::task::spawn_blocking(move || Command::new(python).arg(script).arg(&url2).arg(&app2).output())
        .await
        .expect("join")
        .expect("python runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let found: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(found["status"], 401);
    assert_eq!(found["metadata_url"], metadata_url.as_str());
    assert_eq!(found["resource"], url.as_str());
    assert_eq!(found["authorization_servers"], json!([ISSUER]));
    assert_eq!(found["resource_allowed"], true);
    assert_eq!(found["tools"], json!(["mcp__alpha__echo"]));

    // `spearlet explain --subject` prints the same decision, with its log.
    let explain = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["explain", "-n", &ns.name, "--kubeconfig"])
            .arg(ControlPlane::shared().kubeconfig_path())
            .args(args)
            .output()
            .expect("spearlet explain runs")
    };
    let both_name = format!("system:serviceaccount:{}:both", ns.name);
    let refused = explain(&["--subject", &both_name]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("Spear-Profile") && said.contains("binding readers -> McpProfile reader: names the caller"),
        "{said}"
    );
    let chosen = explain(&["--subject", &both_name, "--profile", "writer"]);
    let said = String::from_utf8_lossy(&chosen.stdout);
    assert!(chosen.status.success(), "{}", String::from_utf8_lossy(&chosen.stderr));
    assert!(said.contains("gets McpProfile writer") && said.contains("beta"), "{said}");
    let stranger_name = format!("system:serviceaccount:{}:stranger", ns.name);
    let refused = explain(&["--subject", &stranger_name]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("bound to no McpProfile") && said.contains("does not name the caller"), "{said}");

    // A profile no binding names any more has its agent stopped.
    let served = || async {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", gateway.admin)).await.expect("metrics");
        let text = text.text().await.expect("metrics text");
        text.lines().find_map(|l| l.strip_prefix("mcp_gateway_profiles_served ")).map(str::to_string)
    };
    assert_eq!(served().await.as_deref(), Some("2"), "reader and writer");
    let bindings: Api<McpProfileBinding> = ns.api();
    bindings.delete("writers", &Default::default()).await.expect("delete the writers binding");
    let mut left = served().await;
    for _ in 0..100 {
        if left.as_deref() == Some("1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = served().await;
    }
    assert_eq!(left.as_deref(), Some("1"), "the writer profile's agent stopped once no binding named it");
    let (status, _, body) = post(&url, Some(&other), None, None, INITIALIZE).await;
    assert_eq!(status, 403, "the unbound caller is refused at once: {body}");

    // The audit names the caller of each call.
    drop(gateway);
    let lines = std::fs::read_to_string(&audit).expect("audit log");
    let calls: Vec<Value> = lines
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|l: &Value| l["tool_name"] == "echo")
        .collect();
    let other_name = format!("system:serviceaccount:{}:other", ns.name);
    assert!(calls.iter().any(|l| l["caller"] == other_name.as_str() && l["status"] == "ok"), "{lines}");
    assert!(!lines.contains(&other), "no token in the audit log");
}
