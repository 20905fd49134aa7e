//! The hot request of `/mcp`, a plain `tools/call` rmcp would accept, answered directly;
//! everything else goes to rmcp's Streamable HTTP service unchanged. Why (through rmcp, a
//! service, its channels and task per request are most of the agent's CPU per call) and which of
//! rmcp's checks it mirrors: `src/agent/README.md`.
//!
//! ```text
//! POST /mcp ─┬─ a session the agent knows, or a 2026-07-28 stateless call; Host allowed; JSON both ways;
//! │          │  one plain tools/call ──▶ McpEndpoint::call (the core call rmcp's handler makes)
//! │          └─ anything else (initialize, tools/list, notifications, batches, GET, DELETE)
//! │               ──▶ rmcp StreamableHttpService
//! ```
//!
//! - The reply is what rmcp would send, as one JSON response; when the server sends progress or
//!   log messages before its result (`crate::mcp::relay`), it becomes an SSE stream at that
//!   moment: those messages, in order, then the result.
//! - A session whose client declared sampling or elicitation never takes the fast path: a
//!   server's request to it goes out on the call's stream with an id the session routes back
//!   ([`super::sessions`]), so that the client's answer (a POST of its own) reaches the call.
//! - A fast call marks its session in use ([`super::sessions::SessionTable::in_use`]). A session
//!   the table no longer knows (expired, deleted) never takes the fast path, so rmcp answers its
//!   requests, with 404.
//! - A client's `notifications/cancelled` for a fast call (rmcp never saw the call) cancels it
//!   here ([`FastCalls`]); the notification still goes on to rmcp.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientJsonRpcMessage, ClientRequest, GetMeta, JsonRpcMessage,
    JsonRpcRequest, ProtocolVersion, RequestId,
};
// rmcp spells these as the spec does (`Mcp-Session-Id`); `HeaderMap` lookups by `&str` ignore case.
use rmcp::transport::common::http_header::{
    HEADER_MCP_METHOD, HEADER_MCP_NAME, HEADER_MCP_PROTOCOL_VERSION, HEADER_SESSION_ID,
};
use rmcp::transport::streamable_http_server::tower::StreamableHttpService;
use tower::ServiceExt;
use tracing::Instrument as _;

use super::endpoint::{self, McpEndpoint};
use super::sessions::{AgentSessions, SessionTable};
use crate::agent::http_guard::host_allowed;
use crate::agent::{CallContext, CallerName, Door};
use crate::mcp::{Continuation, Relay, Relayed};
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Largest request body read (rmcp's own default limit).
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// State of the `/mcp` route: rmcp's service and the sessions it serves.
#[derive(Clone)]
pub(crate) struct McpRoute {
    endpoint: McpEndpoint,
    sessions: Arc<SessionTable>,
    service: StreamableHttpService<McpEndpoint, AgentSessions<McpEndpoint>>,
    allowed_hosts: Arc<[String]>,
    fast_calls: Arc<FastCalls>,
}

/// The fast calls in flight, by session and request id, each with the token that cancels it.
/// An entry lives as long as its call, so the map is bounded by the calls in flight.
#[derive(Default)]
struct FastCalls(parking_lot::Mutex<HashMap<(String, String), CancellationToken>>);

/// Removes a fast call's entry when the call ends.
struct FastCall {
    calls: Arc<FastCalls>,
    key: (String, String),
}

impl FastCalls {
    fn start(self: &Arc<Self>, session: &str, id: &str) -> (CancellationToken, FastCall) {
        let key = (session.to_string(), id.to_string());
        let token = CancellationToken::new();
        self.0.lock().insert(key.clone(), token.clone());
        (token, FastCall { calls: self.clone(), key })
    }

    fn cancel(&self, session: &str, id: &str) {
        if let Some(token) = self.0.lock().remove(&(session.to_string(), id.to_string())) {
            token.cancel();
        }
    }
}

impl Drop for FastCall {
    fn drop(&mut self) {
        self.calls.0.lock().remove(&self.key);
    }
}

/// The request id a `notifications/cancelled` body names, as `RequestId` displays it.
fn cancelled_request(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "requestId")]
        request_id: RequestId,
    }
    #[derive(serde::Deserialize)]
    struct Notification {
        method: String,
        params: Params,
    }
    let notification: Notification = serde_json::from_slice(body).ok()?;
    (notification.method == "notifications/cancelled").then(|| notification.params.request_id.to_string())
}

impl McpRoute {
    /// `/mcp` over `service`, whose sessions live in `sessions`; `allowed_hosts` as given to it.
    pub(crate) fn new(
        endpoint: McpEndpoint,
        sessions: Arc<SessionTable>,
        service: StreamableHttpService<McpEndpoint, AgentSessions<McpEndpoint>>,
        allowed_hosts: Vec<String>,
    ) -> Self {
        let fast_calls = Arc::default();
        McpRoute { endpoint, sessions, service, allowed_hosts: allowed_hosts.into(), fast_calls }
    }
}

/// The `/mcp` handler: the fast path when it applies, else rmcp.
pub(crate) async fn handle(State(route): State<McpRoute>, request: Request<Body>) -> Response {
    if request.method() == Method::POST
        && let Some(version) = fast_path_stateless(request.headers(), &route.allowed_hosts)
    {
        let version = version.to_string();
        return stateless(&route, request, &version).await;
    }
    let session = match fast_path_session(request.headers(), &route.allowed_hosts) {
        Some(session) if request.method() == Method::POST => session.to_string(),
        _ => return forward(&route, request).await,
    };
    let (parts, body) = request.into_parts();
    let bytes = match read_body(body).await {
        Ok(bytes) => bytes,
        Err(too_large) => return too_large,
    };
    if let Some(call) = ToolCallRequest::parse(&bytes)
        && let Some(record) = route.sessions.get(&session)
        && !record.answers_requests()
    {
        let in_flight = route.sessions.in_use(&record);
        let params = call.params;
        let span = endpoint::call_span(params.meta.as_ref(), Some(&parts.headers));
        let token = params.meta.as_ref().and_then(|meta| meta.get_progress_token());
        let (relay, relayed) = Relay::channel(token, record.log_level(), false, false);
        let (endpoint, id) = (route.endpoint.clone(), call.id.to_string());
        let (cancel, registered) = route.fast_calls.start(&session, &id);
        let caller = parts.extensions.get::<CallerName>().cloned();
        let response = async move {
            let (_in_flight, _registered) = (in_flight, registered);
            let context = CallContext {
                relay: Some(&relay),
                cancelled: Some(&cancel),
                caller: caller.as_ref().map(|c| &*c.0),
                ..CallContext::new(Door::Mcp, &id, Some(&session))
            };
            let response = endpoint.call(&params.name, params.arguments, context);
            // Without a continuation the core answers only `Complete`. A session speaks a
            // 2025-era revision, whose results have no `resultType` (rmcp strips it the same way).
            response.instrument(span).await.map(|response| match response {
                CallToolResponse::Complete(mut result) => {
                    result.result_type.take_if(|t| t.is_complete());
                    CallToolResponse::Complete(result)
                }
                other => other,
            })
        };
        return relay_reply(call.id, Box::pin(response), relayed).await;
    }
    if let Some(id) = cancelled_request(&bytes) {
        route.fast_calls.cancel(&session, &id);
    }
    forward(&route, Request::from_parts(parts, Body::from(bytes))).await
}

/// The request body, or the 413 answer when it is over [`MAX_BODY_BYTES`].
async fn read_body(body: Body) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|_| {
        (StatusCode::PAYLOAD_TOO_LARGE, format!("request body over {MAX_BODY_BYTES} bytes")).into_response()
    })
}

/// A call in progress, as the fast path runs it.
type PendingCall = BoxFuture<'static, Result<CallToolResponse, rmcp::ErrorData>>;

/// The reply to `call`: one JSON reply when the call ends before its server sends anything to
/// pass on (the common case, and the cheapest); else an SSE stream of what the server sent, in
/// order, then the reply. The stream's task ends the call (cancelling it at the server) when
/// the client goes away, as dropping the JSON reply's handler does.
async fn relay_reply(id: RequestId, mut call: PendingCall, mut relayed: mpsc::Receiver<Relayed>) -> Response {
    let first = tokio::select! {
        biased;
        response = &mut call => return reply(&id, response),
        Some(message) = relayed.recv() => message,
    };
    let (events, body) = mpsc::channel::<Bytes>(crate::mcp::relay::RELAY_BUFFER);
    tokio::spawn(async move {
        let send = async |message: Relayed| match sse_notification(message) {
            Some(event) => events.send(event).await.is_ok(),
            None => true,
        };
        if !send(first).await {
            return;
        }
        loop {
            tokio::select! {
                biased;
                () = events.closed() => return,
                response = &mut call => {
                    while let Ok(message) = relayed.try_recv() {
                        send(message).await;
                    }
                    let (_, reply) = reply_body(&id, response);
                    let _ = events.send(sse_event(&reply)).await;
                    return;
                }
                Some(message) = relayed.recv() => if !send(message).await { return },
            }
        }
    });
    let body = futures::stream::unfold(body, |mut body| async move {
        body.recv().await.map(|event| (Ok::<_, std::convert::Infallible>(event), body))
    });
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, Body::from_stream(body)).into_response()
}

/// A relayed notification as one SSE event; `None` for a request, which the fast path never
/// relays (its relays take none, so a request here is answered as refused when dropped).
#[allow(deprecated)] // logging is deprecated by SEP-2577, yet lives in 2025-11-25.
fn sse_notification(message: Relayed) -> Option<Bytes> {
    let (method, params) = match message {
        Relayed::Progress(params) => ("notifications/progress", serde_json::to_value(params)),
        Relayed::Log(params) => ("notifications/message", serde_json::to_value(params)),
        Relayed::Sampling(..) | Relayed::Elicitation(..) => return None,
    };
    let params = params.ok()?;
    Some(sse_event(&serde_json::json!({ "jsonrpc": "2.0", "method": method, "params": params })))
}

/// One SSE `message` event carrying `message`.
fn sse_event(message: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}

/// One JSON-RPC reply carrying `response` (a result, a server's input request, or the error of
/// a request the server refused), as JSON.
fn reply(id: &RequestId, response: Result<CallToolResponse, rmcp::ErrorData>) -> Response {
    let (status, reply) = reply_body(id, response);
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], reply.to_string()).into_response()
}

/// The status and body of [`reply`].
fn reply_body(id: &RequestId, response: Result<CallToolResponse, rmcp::ErrorData>) -> (StatusCode, serde_json::Value) {
    let result = match response {
        Ok(CallToolResponse::Complete(result)) => serde_json::to_value(result),
        Ok(CallToolResponse::InputRequired(asked)) => serde_json::to_value(asked),
        Ok(other) => serde_json::to_value(rmcp::model::ServerResult::from(other)),
        Err(refused) => {
            // As rmcp answers a stateless request: a missing client capability is a 400 (a
            // session, whose caller cannot lack one per request, never gets it).
            let status = if refused.code == rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::OK
            };
            return (status, serde_json::json!({ "jsonrpc": "2.0", "id": id, "error": refused }));
        }
    };
    let reply = match result {
        Ok(result) => serde_json::json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(e) => serde_json::json!({ "jsonrpc": "2.0", "id": id,
            "error": { "code": -32603, "message": format!("the result could not be encoded: {e}") } }),
    };
    (StatusCode::OK, reply)
}

/// A 2026-07-28 stateless request whose headers allow the fast path: answered here when its body
/// is a plain `tools/call` whose `_meta` and `Mcp-Method`/`Mcp-Name` headers agree with it as
/// rmcp requires; anything else goes to rmcp.
async fn stateless(route: &McpRoute, request: Request<Body>, version: &str) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = match read_body(body).await {
        Ok(bytes) => bytes,
        Err(too_large) => return too_large,
    };
    if let Some(call) = ToolCallRequest::parse_stateless(&bytes, version, &parts.headers) {
        let params = call.params;
        let span = endpoint::call_span(params.meta.as_ref(), Some(&parts.headers));
        let declared = params.meta.as_ref().and_then(|meta| meta.client_capabilities());
        let continuation = Continuation::new(params.input_responses, params.request_state, declared);
        let request_id = call.id.to_string();
        // Progress only: 2026-07-28 sends no requests to the client and no log messages.
        let token = params.meta.as_ref().and_then(|meta| meta.get_progress_token());
        let (relay, relayed) = Relay::channel(token, None, false, false);
        let endpoint = route.endpoint.clone();
        let caller = parts.extensions.get::<CallerName>().cloned();
        let response = async move {
            let response = endpoint.call(
                &params.name,
                params.arguments,
                CallContext {
                    input: Some(&continuation),
                    relay: Some(&relay),
                    caller: caller.as_ref().map(|c| &*c.0),
                    ..CallContext::new(Door::Mcp, &request_id, None)
                },
            );
            // Required from 2026-07-28 on; a result relayed from a 2025-era server has none.
            response.instrument(span).await.map(|response| match response {
                CallToolResponse::Complete(mut result) => {
                    result.result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
                    CallToolResponse::Complete(result)
                }
                other => other,
            })
        };
        return relay_reply(call.id, Box::pin(response), relayed).await;
    }
    forward(route, Request::from_parts(parts, Body::from(bytes))).await
}

async fn forward(route: &McpRoute, request: Request<Body>) -> Response {
    match route.service.clone().oneshot(request).await {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    }
}

/// The session id when the headers allow the fast path: a session, a JSON body, a client that
/// takes a JSON reply, a `Host` rmcp would accept (its DNS-rebinding check, which the fast path
/// must not bypass) and an `MCP-Protocol-Version` rmcp knows of a session revision (before
/// 2026-07-28), or none (rmcp then assumes 2025-03-26). `None` sends the request to rmcp, which
/// answers or refuses it itself (400 for an unknown protocol version; 400 too for a session
/// request naming 2026-07-28, whose requests must carry `_meta`), so the fast path never accepts
/// what rmcp would refuse.
pub(crate) fn fast_path_session<'a>(headers: &'a HeaderMap, allowed_hosts: &[String]) -> Option<&'a str> {
    let text = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    let known_version = match headers.get(HEADER_MCP_PROTOCOL_VERSION) {
        None => true,
        Some(value) => value.to_str().is_ok_and(|v| {
            v < ProtocolVersion::V_2026_07_28.as_str()
                && ProtocolVersion::KNOWN_VERSIONS.iter().any(|k| k.as_str() == v)
        }),
    };
    (json_both_ways(headers) && known_version && host_is_allowed(headers, allowed_hosts)).then_some(())?;
    text(HEADER_SESSION_ID).filter(|s| !s.is_empty())
}

/// The `MCP-Protocol-Version` when the headers allow the stateless fast path: no session, a
/// JSON body, a client that takes JSON and SSE, an allowed `Host`, and a version rmcp knows of
/// the 2026-07-28 revision or later (rmcp serves those statelessly).
pub(crate) fn fast_path_stateless<'a>(headers: &'a HeaderMap, allowed_hosts: &[String]) -> Option<&'a str> {
    if headers.contains_key(HEADER_SESSION_ID) {
        return None;
    }
    let mut versions = headers.get_all(HEADER_MCP_PROTOCOL_VERSION).iter();
    let (Some(version), None) = (versions.next(), versions.next()) else { return None };
    let version = version.to_str().ok()?;
    let stateless = version >= ProtocolVersion::V_2026_07_28.as_str()
        && ProtocolVersion::KNOWN_VERSIONS.iter().any(|k| k.as_str() == version);
    (stateless && json_both_ways(headers) && host_is_allowed(headers, allowed_hosts)).then_some(version)
}

/// A JSON body (`Content-Type` essence `application/json`) and an `Accept` with both
/// `application/json` and `text/event-stream` (weights above zero): rmcp's rule for a POST,
/// which answers 415 or 406 otherwise.
fn json_both_ways(headers: &HeaderMap) -> bool {
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().unwrap_or_default().trim().eq_ignore_ascii_case("application/json"));
    let (mut json, mut sse) = (false, false);
    for value in headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()) {
        // rmcp splits around quoted strings; a plain split could read a quoted "…, application/json"
        // as an entry of its own. Quotes are rare in Accept: such requests go to rmcp.
        if value.contains('"') {
            return false;
        }
        for entry in value.split(',') {
            let mut parts = entry.split(';');
            let essence = parts.next().unwrap_or_default().trim();
            // A zero weight refuses the type; anything else (or a parameter we cannot read) is
            // taken as refusing too, so the fast path only takes what rmcp surely accepts.
            if parts.any(|p| p.trim().to_ascii_lowercase().starts_with("q=")) {
                continue;
            }
            json |= essence.eq_ignore_ascii_case("application/json");
            sse |= essence.eq_ignore_ascii_case("text/event-stream");
        }
    }
    json_body && json && sse
}

/// The `Host` is one rmcp accepts (`host_allowed` is rmcp's rule, so a Host rmcp refuses, one
/// that is not a URI authority such as `127.0.0.1:4040/x`, goes to rmcp).
fn host_is_allowed(headers: &HeaderMap, allowed_hosts: &[String]) -> bool {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next().and_then(|h| h.to_str().ok()), hosts.next()) {
        (Some(host), None) => host_allowed(host, allowed_hosts),
        _ => false,
    }
}

/// A JSON-RPC `tools/call` the fast path may answer, read as rmcp's own message type so it
/// accepts exactly what rmcp's handler would. (A struct of rmcp's id and params types is not
/// enough: serde skips unknown members without checking them, so bodies rmcp refuses, with a
/// `result` member, a string that is not UTF-8 or a lone surrogate escape, would take the fast path.)
#[derive(Debug, PartialEq)]
pub(crate) struct ToolCallRequest {
    pub(crate) id: RequestId,
    pub(crate) params: CallToolRequestParams,
}

impl ToolCallRequest {
    /// The call in `body`, or `None` when rmcp should handle it: not a single `tools/call`
    /// request, or one rmcp would refuse (arguments that are not an object, for one).
    pub(crate) fn parse(body: &Bytes) -> Option<Self> {
        let JsonRpcMessage::Request(JsonRpcRequest { id, request, .. }) =
            serde_json::from_slice::<ClientJsonRpcMessage>(body).ok()?
        else {
            return None;
        };
        // rmcp's deserializer moves `params._meta` into the request's metadata (its own checks
        // read it there); the call needs it back: the caller's trace context and, on
        // 2026-07-28, its client capabilities.
        let meta = request.get_meta();
        let meta = (!meta.is_empty()).then(|| meta.clone());
        let ClientRequest::CallToolRequest(call) = request else { return None };
        let mut params = call.params;
        if params.meta.is_none() {
            params.meta = meta;
        }
        Some(ToolCallRequest { id, params })
    }

    /// [`Self::parse`] for a 2026-07-28 stateless request sent with `version`: also `None` unless
    /// its `_meta` carries that protocol version and the client capabilities (rmcp's required
    /// keys), and exactly one `Mcp-Method: tools/call` and one `Mcp-Name` equal to the tool's
    /// name accompany it (SEP-2243, which rmcp enforces). Names outside `[A-Za-z0-9_.-]` go to
    /// rmcp, whose header decoding (Base64 forms) the fast path does not repeat.
    pub(crate) fn parse_stateless(body: &Bytes, version: &str, headers: &HeaderMap) -> Option<Self> {
        let call = Self::parse(body)?;
        let meta = call.params.meta.as_ref();
        let same_version = meta.and_then(|m| m.protocol_version()).is_some_and(|v| v.as_str() == version);
        let complete = meta.is_some_and(|m| m.missing_required_keys(&ProtocolVersion::V_2026_07_28).is_empty());
        let plain_name = !call.params.name.is_empty()
            && call.params.name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        let only = |name: &str, expected: &str| {
            let mut values = headers.get_all(name).iter();
            matches!((values.next(), values.next()), (Some(v), None) if v.as_bytes() == expected.as_bytes())
        };
        (same_version
            && complete
            && plain_name
            && only(HEADER_MCP_METHOD, "tools/call")
            && only(HEADER_MCP_NAME, &call.params.name))
        .then_some(call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Option<ToolCallRequest> {
        ToolCallRequest::parse(&Bytes::from(body.to_string()))
    }

    /// A call that sends nothing before its result is one JSON reply; one whose server sends
    /// progress first becomes an SSE stream: the progress under the caller's token, then the result.
    #[tokio::test]
    async fn the_reply_turns_into_a_stream_only_when_something_comes_before_the_result() {
        use rmcp::model::{CallToolResult, NumberOrString, ProgressNotificationParam, ProgressToken};
        let result = || Ok(CallToolResponse::Complete(CallToolResult::success(vec![])));
        let (_relay, relayed) = Relay::channel(None, None, false, false);
        let quiet = relay_reply(RequestId::Number(1), Box::pin(async move { result() }), relayed).await;
        assert_eq!(quiet.headers()[header::CONTENT_TYPE], "application/json");

        let token = ProgressToken(NumberOrString::String("caller".into()));
        let (relay, relayed) = Relay::channel(Some(token), None, false, false);
        let (proceed, proceeded) = tokio::sync::oneshot::channel::<()>();
        let call = Box::pin(async move {
            relay.progress(ProgressNotificationParam::new(ProgressToken(NumberOrString::Number(7)), 50.0));
            let _ = proceeded.await;
            result()
        });
        let streamed = relay_reply(RequestId::Number(2), call, relayed).await;
        assert_eq!(streamed.headers()[header::CONTENT_TYPE], "text/event-stream");
        let _ = proceed.send(());
        let body = axum::body::to_bytes(streamed.into_body(), 1 << 20).await.expect("body");
        let events: Vec<serde_json::Value> = String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).expect("an event's JSON"))
            .collect();
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0]["method"], "notifications/progress");
        assert_eq!(events[0]["params"]["progressToken"], "caller");
        assert_eq!(events[1]["id"], 2);
        assert!(events[1]["result"].is_object(), "{events:?}");
    }

    /// A request the server refused as invalid is answered as the JSON-RPC error it is, with the
    /// caller's id, as rmcp answers it on the slow path.
    #[tokio::test]
    async fn a_request_the_server_refused_is_a_json_rpc_error() {
        let refused = rmcp::ErrorData::invalid_params("requestState failed its integrity check", None);
        let response = reply(&RequestId::Number(7), Err(refused));
        let body = axum::body::to_bytes(response.into_body(), 4096).await.expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(body["id"], 7);
        assert_eq!(body["error"]["code"], -32602);
        assert_eq!(body["error"]["message"], "requestState failed its integrity check");
        assert!(body.get("result").is_none(), "{body}");

        let data = serde_json::json!({"requiredCapabilities": {"sampling": {}}});
        let missing = rmcp::ErrorData::new(
            rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
            "this tool needs sampling",
            Some(data.clone()),
        );
        let response = reply(&RequestId::Number(8), Err(missing));
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "SEP-2575: -32021 is a 400");
        let body = axum::body::to_bytes(response.into_body(), 4096).await.expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!((&body["error"]["code"], &body["error"]["data"]), (&serde_json::json!(-32021), &data));
    }

    /// The call keeps the request's `_meta`: the trace context of a session call, and a
    /// 2026-07-28 caller's client capabilities, which the pool passes on to the server.
    #[test]
    fn a_call_keeps_its_meta() {
        let session = parse(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}"#,
        )
        .expect("fast path");
        let meta = serde_json::to_value(session.params.meta.expect("_meta kept")).expect("JSON");
        assert_eq!(meta["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");

        let body = STATELESS_CALL.replace(r#"clientCapabilities":{}"#, r#"clientCapabilities":{"sampling":{}}"#);
        let call = ToolCallRequest::parse_stateless(
            &Bytes::from(body),
            "2026-07-28",
            &headers(&stateless_headers("mcp__fx__echo")),
        )
        .expect("fast path");
        let declared = call.params.meta.and_then(|m| m.client_capabilities()).expect("client capabilities");
        assert!(declared.sampling.is_some() && declared.elicitation.is_none(), "{declared:?}");
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
            // A stateless revision is rmcp's to refuse on a session (found by the conformance suite).
            ("mcp-protocol-version", Some("2026-07-28")),
        ] {
            let mut pairs: Vec<_> = good.iter().filter(|(k, _)| *k != drop).cloned().collect();
            if let Some(value) = replace {
                pairs.push((drop, value));
            }
            assert_eq!(fast_path_session(&headers(&pairs), &allowed), None, "{drop} = {replace:?}");
        }
    }

    fn stateless_headers(name: &'static str) -> Vec<(&'static str, &'static str)> {
        vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("host", "127.0.0.1:4040"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", name),
        ]
    }

    const STATELESS_CALL: &str = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"mcp__fx__echo","arguments":{"text":"a"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;

    #[test]
    fn a_stateless_2026_call_takes_the_fast_path_only_when_rmcp_would_serve_it() {
        let allowed = vec!["127.0.0.1".to_string()];
        let good = stateless_headers("mcp__fx__echo");
        let map = headers(&good);
        assert_eq!(fast_path_stateless(&map, &allowed), Some("2026-07-28"));
        let body = Bytes::from_static(STATELESS_CALL.as_bytes());
        assert!(ToolCallRequest::parse_stateless(&body, "2026-07-28", &map).is_some());
        // Headers rmcp refuses, or that route elsewhere: not the stateless fast path.
        for (drop, replace) in [
            ("mcp-protocol-version", Some("2025-11-25")),
            ("mcp-protocol-version", Some("2099-01-01")),
            ("mcp-protocol-version", None),
            ("accept", Some("application/json")),
            ("accept", Some("application/json;q=0, text/event-stream")),
            ("accept", Some("text/plain;x=\"q, application/json\", text/event-stream")),
            ("content-type", Some("application/jsonx")),
            ("host", Some("evil.example")),
        ] {
            let mut pairs: Vec<_> = good.iter().filter(|(k, _)| *k != drop).cloned().collect();
            if let Some(value) = replace {
                pairs.push((drop, value));
            }
            assert_eq!(fast_path_stateless(&headers(&pairs), &allowed), None, "{drop} = {replace:?}");
        }
        let mut with_session = good.clone();
        with_session.push(("mcp-session-id", "abc"));
        assert_eq!(fast_path_stateless(&headers(&with_session), &allowed), None, "a session is not stateless");
        // Bodies and standard headers that do not agree: rmcp answers them (400s).
        for (name, method) in [("mcp__fx__other", "tools/call"), ("mcp__fx__echo", "tools/list")] {
            let mut pairs: Vec<_> = stateless_headers(name).into_iter().filter(|(k, _)| *k != "mcp-method").collect();
            pairs.push(("mcp-method", method));
            assert!(
                ToolCallRequest::parse_stateless(&body, "2026-07-28", &headers(&pairs)).is_none(),
                "{name} {method}"
            );
        }
        let no_name: Vec<_> = good.iter().filter(|(k, _)| *k != "mcp-name").cloned().collect();
        assert!(ToolCallRequest::parse_stateless(&body, "2026-07-28", &headers(&no_name)).is_none());
        let other_version = STATELESS_CALL.replace(
            "\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"",
            "\"io.modelcontextprotocol/protocolVersion\":\"2025-11-25\"",
        );
        assert!(ToolCallRequest::parse_stateless(&Bytes::from(other_version), "2026-07-28", &map).is_none());
        let no_capabilities = STATELESS_CALL.replace(",\"io.modelcontextprotocol/clientCapabilities\":{}", "");
        assert!(ToolCallRequest::parse_stateless(&Bytes::from(no_capabilities), "2026-07-28", &map).is_none());
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
