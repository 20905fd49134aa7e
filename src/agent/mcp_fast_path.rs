//! The hot request of `/mcp`, a plain `tools/call` in an established session, answered directly
//! with one JSON reply; everything else goes to rmcp's Streamable HTTP service unchanged.
//!
//! ```text
//! POST /mcp ─┬─ session known, Host allowed, JSON accepted, one tools/call
//! │          │    ──▶ McpEndpoint::call (the same core call as rmcp's handler) ──▶ application/json
//! │          └─ anything else (initialize, tools/list, notifications, batches, GET, DELETE,
//! │               2026-07-28 stateless requests) ──▶ rmcp StreamableHttpService
//! ```
//!
//! Why: through rmcp each call crosses the session worker, a per-request SSE channel and the
//! service task before reaching the handler; that hand-off was most of the agent's CPU per call
//! under load (benches/agent.rs). The reply is what rmcp would send, as a JSON response, which the
//! protocol allows for any request. A `progressToken` does not change that: the agent sends no
//! progress notifications for its calls on either path (rmcp clients attach a token to every
//! request).
//!
//! rmcp still owns the session: a fast call counts as activity through
//! [`super::mcp_keep_alive`], which keeps rmcp's idle timer from closing a session that only
//! calls tools. A session rmcp no longer knows (expired, deleted) never takes the fast path, so
//! rmcp answers its requests, with 404.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, JsonRpcRequest, ProtocolVersion,
    RequestId,
};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::tower::StreamableHttpService;
use tower::ServiceExt;

use super::http_guard::host_allowed;
use super::mcp_endpoint::McpEndpoint;
use super::mcp_keep_alive::SessionKeeper;

/// Largest request body read (rmcp's own default limit).
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";

/// State of the `/mcp` route: the handler, rmcp's service and its sessions.
#[derive(Clone)]
pub(crate) struct McpRoute {
    endpoint: McpEndpoint,
    sessions: Arc<LocalSessionManager>,
    keeper: Arc<SessionKeeper>,
    service: StreamableHttpService<McpEndpoint, LocalSessionManager>,
    allowed_hosts: Arc<[String]>,
}

impl McpRoute {
    /// `/mcp` over `service`, whose sessions live in `sessions` and are kept alive by `keeper`
    /// while fast calls use them; `allowed_hosts` as given to it.
    pub(crate) fn new(
        endpoint: McpEndpoint,
        sessions: Arc<LocalSessionManager>,
        keeper: Arc<SessionKeeper>,
        service: StreamableHttpService<McpEndpoint, LocalSessionManager>,
        allowed_hosts: Vec<String>,
    ) -> Self {
        McpRoute { endpoint, sessions, keeper, service, allowed_hosts: allowed_hosts.into() }
    }
}

/// The `/mcp` handler: the fast path when it applies, else rmcp.
pub(crate) async fn handle(State(route): State<McpRoute>, request: Request<Body>) -> Response {
    let session = match fast_path_session(request.headers(), &route.allowed_hosts) {
        Some(session) if request.method() == Method::POST => session.to_string(),
        _ => return forward(&route, request).await,
    };
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return (StatusCode::PAYLOAD_TOO_LARGE, format!("request body over {MAX_BODY_BYTES} bytes"))
                .into_response();
        }
    };
    if let Some(call) = ToolCallRequest::parse(&bytes)
        && route.sessions.has_session(&session.as_str().into()).await.unwrap_or(false)
    {
        let _in_flight = route.keeper.call_started(&session);
        let params = call.params;
        let mut result =
            route.endpoint.call(&params.name, params.arguments, &call.id.to_string(), Some(&session)).await;
        // A session speaks a 2025-era revision, whose results have no `resultType` (rmcp's path
        // strips it the same way).
        result.result_type.take_if(|t| t.is_complete());
        let reply = serde_json::json!({ "jsonrpc": "2.0", "id": call.id, "result": result });
        return ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], reply.to_string())
            .into_response();
    }
    forward(&route, Request::from_parts(parts, Body::from(bytes))).await
}

async fn forward(route: &McpRoute, request: Request<Body>) -> Response {
    match route.service.clone().oneshot(request).await {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    }
}

/// The session id when the headers allow the fast path: a session, a JSON body, a client that
/// takes a JSON reply, a `Host` rmcp would accept (its DNS-rebinding check, which the fast path
/// must not bypass) and an `MCP-Protocol-Version` rmcp knows, or none (rmcp then assumes
/// 2025-03-26). `None` sends the request to rmcp, which answers or refuses it itself (400 for an
/// unknown protocol version), so the fast path never accepts what rmcp would refuse.
pub(crate) fn fast_path_session<'a>(headers: &'a HeaderMap, allowed_hosts: &[String]) -> Option<&'a str> {
    let text = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    let json_body = text(header::CONTENT_TYPE.as_str())?.starts_with("application/json");
    let json_reply = text(header::ACCEPT.as_str())?.contains("application/json");
    // `host_allowed` is rmcp's rule, so a Host rmcp refuses (one that is not a URI authority,
    // `127.0.0.1:4040/x`) goes to rmcp.
    let host = text(header::HOST.as_str())?;
    let known_version = match headers.get(PROTOCOL_VERSION_HEADER) {
        None => true,
        Some(value) => value.to_str().is_ok_and(|v| ProtocolVersion::KNOWN_VERSIONS.iter().any(|k| k.as_str() == v)),
    };
    (json_body && json_reply && known_version && host_allowed(host, allowed_hosts)).then_some(())?;
    text(SESSION_HEADER).filter(|s| !s.is_empty())
}

/// A JSON-RPC `tools/call` the fast path may answer, read as rmcp's own message type so it
/// accepts exactly what rmcp's handler would. (A struct of rmcp's id and params types was not
/// enough: serde skips unknown members without checking them, so bodies rmcp refuses, with a
/// `result` member, a string that is not UTF-8 or a lone surrogate escape, took the fast path.)
#[derive(Debug, PartialEq)]
pub(crate) struct ToolCallRequest {
    pub(crate) id: RequestId,
    pub(crate) params: CallToolRequestParams,
}

impl ToolCallRequest {
    /// The call in `body`, or `None` when rmcp should handle it: not a single `tools/call`
    /// request, or one rmcp would refuse (arguments that are not an object, for one).
    pub(crate) fn parse(body: &Bytes) -> Option<Self> {
        match serde_json::from_slice::<ClientJsonRpcMessage>(body).ok()? {
            JsonRpcMessage::Request(JsonRpcRequest { id, request: ClientRequest::CallToolRequest(call), .. }) => {
                Some(ToolCallRequest { id, params: call.params })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Option<ToolCallRequest> {
        ToolCallRequest::parse(&Bytes::from(body.to_string()))
    }

    #[test]
    fn a_plain_tools_call_takes_the_fast_path() {
        let call = parse(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"mcp__fs__read","arguments":{"path":"a"}}}"#,
        );
        let call = call.expect("a fast call");
        assert_eq!(call.id, RequestId::Number(7));
        assert_eq!(call.params.name, "mcp__fs__read");
        assert_eq!(call.params.arguments.and_then(|a| a.get("path").cloned()), Some(serde_json::Value::from("a")));
        let text_id = parse(r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"t"}}"#);
        assert_eq!(text_id.map(|c| c.id), Some(RequestId::String("x".into())));
        // rmcp clients put a progress token on every request; the agent sends no progress anyway.
        let with_token =
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"_meta":{"progressToken":0},"name":"t"}}"#;
        assert!(parse(with_token).is_some());
    }

    #[test]
    fn everything_else_goes_to_rmcp() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}]"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":[1]}}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"t"}}"#,
            "not json",
        ] {
            assert_eq!(parse(body), None, "{body}");
        }
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/mcp_fast_path.rs`): rmcp refuses a message with a
    /// `result` or `error` member next to `method`, or one with a string that is not UTF-8 or
    /// holds a lone surrogate escape, and the fast path answered it as a call.
    #[test]
    fn invalid_utf8_in_an_unknown_member_goes_to_rmcp() {
        // Found by fuzz target mcp_fast_path: a byte that is not UTF-8 inside a member the fast
        // path ignores (rmcp refuses the whole message).
        let mut body = br#"{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"_m%ta": {"prog"#.to_vec();
        body.push(0xe3);
        body.extend_from_slice(br#"ressToken": 0}, "name": "t"}}"#);
        assert_eq!(ToolCallRequest::parse(&Bytes::from(body)), None);
        let valid = br#"{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "t"}}"#;
        assert!(ToolCallRequest::parse(&Bytes::from_static(valid)).is_some());
    }

    #[test]
    fn a_call_with_a_result_or_error_member_goes_to_rmcp() {
        for body in [
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t","arguments":{}},"error":null}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t"},"x":"\ud800"}"#,
        ] {
            assert!(serde_json::from_str::<ClientJsonRpcMessage>(body).is_err(), "rmcp takes {body}");
            assert_eq!(parse(body), None, "{body}");
        }
        // A body that is not UTF-8 in a member the call does not use.
        let body = b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"_x\":{\"a\xae\":0},\"name\":\"t\"}}";
        assert!(serde_json::from_slice::<ClientJsonRpcMessage>(body).is_err(), "rmcp takes it");
        assert_eq!(ToolCallRequest::parse(&Bytes::from_static(body)), None);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (header::HeaderName::from_static(k), HeaderValue::from_static(v))).collect()
    }

    #[test]
    fn the_fast_path_needs_a_session_json_both_ways_and_an_allowed_host() {
        let allowed = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        let good = [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("host", "127.0.0.1:4040"),
            ("mcp-session-id", "abc"),
        ];
        assert_eq!(fast_path_session(&headers(&good), &allowed), Some("abc"));
        let mut versioned = good.to_vec();
        versioned.push(("mcp-protocol-version", "2025-06-18"));
        assert_eq!(fast_path_session(&headers(&versioned), &allowed), Some("abc"), "a known version");
        for (drop, replace) in [
            ("mcp-session-id", None),
            ("accept", Some("text/event-stream")),
            ("content-type", Some("text/plain")),
            ("host", Some("evil.example:4040")),
            ("host", None),
            ("mcp-protocol-version", Some("1999-01-01")),
        ] {
            let mut pairs: Vec<_> = good.iter().filter(|(k, _)| *k != drop).cloned().collect();
            if let Some(value) = replace {
                pairs.push((drop, value));
            }
            assert_eq!(fast_path_session(&headers(&pairs), &allowed), None, "{drop} = {replace:?}");
        }
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/mcp_fast_path.rs`): a Host whose name part is allowed
    /// but that is no URI authority took the fast path, where rmcp answers 400.
    #[test]
    fn a_host_that_is_no_authority_goes_to_rmcp() {
        let allowed = vec!["127.0.0.1".to_string()];
        for list in [allowed, Vec::new()] {
            for host in ["127.0.0.1:4040/x", "127.0.0.1:40 40", "127.0.0.1:4040:1"] {
                let mut map = headers(&[
                    ("content-type", "application/json"),
                    ("accept", "application/json"),
                    ("mcp-session-id", "abc"),
                ]);
                map.insert(header::HOST, HeaderValue::from_str(host).expect("a header value"));
                assert_eq!(fast_path_session(&map, &list), None, "{host} with {list:?}");
            }
        }
    }
}
