//! OpenTelemetry traces end to end: a real `spearlet serve` exporting over OTLP/gRPC to a real
//! OpenTelemetry Collector (`hack/otelcol.sh`: the OTLP receiver and the OTLP/HTTP exporter,
//! built from the collector's Go modules), a real MCP server instrumented with the OpenTelemetry
//! Python SDK (`tests/servers/traced_server.py`, exporting to the same collector over OTLP/HTTP),
//! and the scripted upstream of `chat.rs` in place of the hosted model. The collector forwards
//! what it received as OTLP JSON to a loopback sink in this test, which reads the trace.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use parking_lot::Mutex;
use serde_json::{Value, json};
use spear::testing::mcp_servers;

use crate::chat::{ScriptedUpstream, answer, calls};
use crate::serve::http_get;

/// The collector version `hack/otelcol.sh` builds; must match it.
const OTELCOL_VERSION: &str = "v0.165.0";
const OTELCOL_BUILD_REVISION: &str = "b3";

/// `$SPEAR_OTELCOL`, else the path `hack/otelcol.sh` builds into; panics with what to run.
fn otelcol() -> PathBuf {
    let path = std::env::var_os("SPEAR_OTELCOL").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("SPEAR_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/spear-mcp"));
        cache.join(format!("otelcol/{OTELCOL_VERSION}-{OTELCOL_BUILD_REVISION}/bin/otelcol"))
    });
    assert!(path.exists(), "no collector at {}: run hack/otelcol.sh (or set SPEAR_OTELCOL)", path.display());
    path
}

/// A child process stopped when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One span as the collector exported it.
#[derive(Clone, Debug)]
struct Span {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: HashMap<String, Value>,
}

/// Every span of the OTLP JSON bodies the sink received.
fn spans(bodies: &[Value]) -> Vec<Span> {
    let mut out = Vec::new();
    for body in bodies {
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            let service = resource["resource"]["attributes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["key"] == "service.name")
                .and_then(|a| a["value"]["stringValue"].as_str())
                .unwrap_or_default()
                .to_string();
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    let attributes = span["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|a| {
                            let value = a["value"].as_object()?.values().next()?.clone();
                            Some((a["key"].as_str()?.to_string(), value))
                        })
                        .collect();
                    let text = |key: &str| span[key].as_str().unwrap_or_default().to_string();
                    out.push(Span {
                        service: service.clone(),
                        name: text("name"),
                        trace_id: text("traceId"),
                        span_id: text("spanId"),
                        parent: text("parentSpanId"),
                        attributes,
                    });
                }
            }
        }
    }
    out
}

/// The tree under `parent`, one line a span, indented by depth.
fn render(spans: &[Span], parent: &str, depth: usize, out: &mut String) {
    for span in spans.iter().filter(|s| s.parent == parent) {
        let mut attributes: Vec<String> = span
            .attributes
            .iter()
            .filter(|(k, _)| !k.starts_with("thread.") && !k.starts_with("code.") && *k != "busy_ns" && *k != "idle_ns")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        attributes.sort();
        out.push_str(&format!(
            "{}{} [{}] {} {}\n",
            "  ".repeat(depth),
            span.name,
            span.service,
            span.span_id,
            attributes.join(" ")
        ));
        render(spans, &span.span_id, depth + 1, out);
    }
}

/// A chat request with two tool calls to a Streamable HTTP MCP server is one trace: the caller's
/// `traceparent` is its root's parent, each upstream round and each tool call a child of the
/// chat span, each pool call a child of its tool call, and the server's span (in another process
/// and language) a child of the pool call, reached by both the header and `_meta`. No span
/// carries an argument value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_request_with_two_tool_calls_is_one_trace_across_the_agent_and_the_server() {
    spear::install_crypto_provider();
    // The sink the collector exports to (OTLP JSON over HTTP).
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = {
        let received = received.clone();
        axum::Router::new().route(
            "/v1/traces",
            post(move |body: String| async move {
                if let Ok(value) = serde_json::from_str::<Value>(&body) {
                    received.lock().push(value);
                }
                "{}"
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind sink");
    let sink_port = listener.local_addr().expect("addr").port();
    let sink_task = tokio::spawn(async move {
        let _ = axum::serve(listener, sink).await;
    });

    // The collector.
    let dir = tempfile::tempdir().expect("tempdir");
    let (grpc, http) = (mcp_servers::free_port(), mcp_servers::free_port());
    let config = dir.path().join("otelcol.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: \"127.0.0.1:{grpc}\"}}\n      http: {{endpoint: \"127.0.0.1:{http}\"}}\n\
             exporters:\n  otlp_http:\n    traces_endpoint: \"http://127.0.0.1:{sink_port}/v1/traces\"\n    encoding: json\n    \
             compression: none\n    retry_on_failure: {{enabled: false}}\n\
             service:\n  telemetry:\n    metrics: {{level: none}}\n    logs: {{level: warn}}\n  \
             pipelines:\n    traces: {{receivers: [otlp], exporters: [otlp_http]}}\n"
        ),
    )
    .expect("write config");
    let _collector = Killed(
        Command::new(otelcol()).arg("--config").arg(&config).stdin(Stdio::null()).spawn().expect("start the collector"),
    );
    assert!(mcp_servers::wait_for_http(grpc, Duration::from_secs(20)).await, "the collector listens");

    // The traced MCP server, exporting to the collector's OTLP/HTTP receiver.
    let server_port = mcp_servers::free_port();
    let mut server = mcp_servers::traced_http(server_port, &format!("http://127.0.0.1:{http}")).to_std();
    let _server = Killed(server.stdin(Stdio::null()).spawn().expect("start traced_server.py"));
    assert!(mcp_servers::wait_for_http(server_port, Duration::from_secs(30)).await, "the traced server listens");

    // The agent, exporting over OTLP/gRPC.
    let upstream = ScriptedUpstream::start(vec![
        calls(&[
            ("c1", "mcp__traced__echo", r#"{"text": "SECRET-ARGUMENT-ONE"}"#),
            ("c2", "mcp__traced__echo", r#"{"text": "SECRET-ARGUMENT-TWO"}"#),
        ]),
        answer("done"),
    ])
    .await;
    let registry = dir.path().join("registry");
    std::fs::create_dir(&registry).expect("registry dir");
    std::fs::write(
        registry.join("registry.yaml"),
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: traced}}\nspec:\n  transport: streamableHttp\n  \
             http: {{url: \"http://127.0.0.1:{server_port}/mcp\"}}\n  allowedTools: [echo]\n---\n\
             apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {{name: p}}\nspec:\n  servers: [traced]\n"
        ),
    )
    .expect("write registry");
    let (agent_http, agent_grpc, admin) =
        (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let _agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["serve", "--profile", "p", "--audit-log", "off", "--registry-dir"])
            .arg(&registry)
            .args(["--http-addr", &format!("127.0.0.1:{agent_http}")])
            .args(["--grpc-addr", &format!("127.0.0.1:{agent_grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--upstream-url", &upstream.base_url])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{grpc}"))
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env_remove("OTEL_SERVICE_NAME")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn spearlet serve"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(admin, "/readyz"), Some((200, _))) {
        assert!(Instant::now() < deadline, "the agent did not get ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // One chat request, inside the caller's trace.
    let (trace_id, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let reply = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{agent_http}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .body(json!({"model": "m", "messages": [{"role": "user", "content": "echo twice"}]}).to_string())
        .send()
        .await
        .expect("chat request");
    assert_eq!(reply.status(), 200);
    let reply: Value = serde_json::from_str(&reply.text().await.expect("body")).expect("json");
    assert_eq!(reply["spear"]["tool_calls"].as_array().map(Vec::len), Some(2), "{reply}");

    // Wait for the whole tree: 1 chat + 2 rounds + 2 tool calls + 2 pool calls + 2 server spans.
    let deadline = Instant::now() + Duration::from_secs(20);
    let all = loop {
        let all = spans(&received.lock());
        if all.len() >= 9 || Instant::now() > deadline {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut tree = String::new();
    render(&all, caller_span, 0, &mut tree);
    eprintln!("the trace as the collector exported it (under the caller's span {caller_span}):\n{tree}");

    let named = |name: &str| all.iter().filter(|s| s.name == name).cloned().collect::<Vec<_>>();
    assert!(all.iter().all(|s| s.trace_id == trace_id), "one trace, the caller's: {all:#?}");
    let chat = named("chat.completion");
    assert_eq!(chat.len(), 1, "{tree}");
    let chat = &chat[0];
    assert_eq!((chat.parent.as_str(), chat.service.as_str()), (caller_span, "spearlet"));
    assert_eq!(chat.attributes["code"], "ok");
    assert!(chat.attributes["registry_revision"].as_str().is_some_and(|r| !r.is_empty()), "{tree}");
    let rounds = named("chat.upstream");
    assert_eq!(rounds.len(), 2, "{tree}");
    assert!(rounds.iter().all(|r| r.parent == chat.span_id), "{tree}");
    let tool_calls = named("tool.call");
    assert_eq!(tool_calls.len(), 2, "{tree}");
    for call in &tool_calls {
        assert_eq!(call.parent, chat.span_id, "{tree}");
        assert_eq!((&call.attributes["server_id"], &call.attributes["tool"]), (&json!("traced"), &json!("echo")));
        assert_eq!(call.attributes["code"], "ok");
        let pool: Vec<_> = all.iter().filter(|s| s.name == "pool.call" && s.parent == call.span_id).collect();
        assert_eq!(pool.len(), 1, "one pool call under each tool call: {tree}");
        let served: Vec<_> = all.iter().filter(|s| s.parent == pool[0].span_id).collect();
        assert_eq!(served.len(), 1, "the server's span continues the pool call: {tree}");
        assert_eq!((served[0].name.as_str(), served[0].service.as_str()), ("traced_server.echo", "traced-mcp-server"));
        for carrier in ["test.traceparent_in_header", "test.traceparent_in_meta", "test.carriers_agree"] {
            assert_eq!(served[0].attributes[carrier], true, "{carrier}: {tree}");
        }
    }
    // Arguments never reach the trace.
    let exported = serde_json::to_string(&*received.lock()).expect("json");
    assert!(!exported.contains("SECRET-ARGUMENT"), "an argument value was exported: {exported}");
    sink_task.abort();
}
