//! `tools/call` through the pool: permits, the session, one timer for the whole call, the outcome
//! into health, then the output cap and the outputSchema check.
//!
//! A 2026-07-28 server's request for input ends the call ([`input_required`]) unless the door
//! relays it ([`Pool::call_tool_continuing`] with a [`Continuation`]); the agent answers no
//! round itself. A call abandoned before its answer is cancelled at the server
//! ([`CancelWhenAbandoned`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ClientCapabilities, ClientRequest, InputRequest, InputRequiredResult, ProtocolVersion, RequestMetaObject,
    ServerResult,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::{Map, Value};
use tracing::Instrument;

use super::slot::{Live, SchemaOf, Slot};
use super::{Inner, Pool};
use crate::mcp::error::{ErrorCode, McpError};
use crate::mcp::health::Action;
use crate::mcp::output::{self, Truncation};
use crate::mcp::relay::{InFlight, Relay};
use crate::mcp::tool_schema;
use crate::telemetry::{PoolMetrics, otel};

/// A tool call's result, capped.
#[derive(Clone, Debug)]
pub struct ToolOutput {
    /// The result as the server sent it (after the cap).
    pub result: CallToolResult,
    /// Set when the output was cut (`mcp_output_too_large`).
    pub truncated: Option<Truncation>,
    /// Size of the result before the cap, as `output::result_size` counts it.
    pub(crate) bytes: usize,
    /// How long the call took, waiting for permits and the session included.
    pub latency: Duration,
    /// The server asked for input instead of answering (2026-07-28 `InputRequiredResult`); only
    /// from [`Pool::call_tool_continuing`], for a door that relays it to its client. `result`
    /// then holds the `mcp_approval_required` error for everyone else.
    pub input_required: Option<Arc<InputRequiredResult>>,
}

/// What a client sends back to continue a call whose server asked for input (2026-07-28):
/// the answers and the server's opaque state, passed to the server unchanged (the server
/// checks its state's integrity; the agent neither reads nor trusts it).
#[derive(Clone, Debug, Default)]
pub struct Continuation {
    pub input_responses: Option<rmcp::model::InputResponses>,
    pub request_state: Option<String>,
    /// What the caller can answer when a server asks for input: of its declared capabilities,
    /// the kinds the agent relays (`elicitation`, `sampling`, `roots`). A 2026-07-28 server gets
    /// them as the request's `clientCapabilities`, in place of the pool's own (none), so it asks
    /// only for input this caller can give.
    pub client_capabilities: Option<ClientCapabilities>,
}

impl Continuation {
    /// A caller's answers and state, with the relayed part of what it `declared`.
    pub fn new(
        input_responses: Option<rmcp::model::InputResponses>,
        request_state: Option<String>,
        declared: Option<ClientCapabilities>,
    ) -> Self {
        let client_capabilities = declared.map(|declared| {
            let mut relayed = ClientCapabilities::default();
            relayed.elicitation = declared.elicitation;
            relayed.sampling = declared.sampling;
            relayed.roots = declared.roots;
            relayed
        });
        Continuation { input_responses, request_state, client_capabilities }
    }

    /// The capabilities to send `server`'s session, when it takes them per request.
    fn capabilities_for(&self, protocol: &ProtocolVersion) -> Option<&ClientCapabilities> {
        self.client_capabilities.as_ref().filter(|_| is_modern(protocol))
    }
}

impl Pool {
    /// Calls `tool` on `server` with the server's budgets (or tighter ones). A server asking for
    /// input ends the call with `mcp_approval_required` naming what it asked.
    pub async fn call_tool(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<Map<String, Value>>,
        timeout: Duration,
        max_output_bytes: usize,
    ) -> Result<ToolOutput, McpError> {
        let output = self.call_tool_continuing(server, tool, arguments, None, None, timeout, max_output_bytes).await?;
        match &output.input_required {
            Some(asked) => Err(input_required(server, tool, asked)),
            None => Ok(output),
        }
    }

    /// [`Self::call_tool`] for a door that relays: `continuation` carries a 2026-07-28 client's
    /// answers to an earlier round, and a server asking for input comes back as `Ok` with
    /// [`ToolOutput::input_required`] set; `relay` takes what a 2025 server sends during the call
    /// (progress, log messages, sampling and elicitation requests).
    #[allow(clippy::too_many_arguments)] // The doors' signature; inside, they travel as a `ToolCall`.
    pub async fn call_tool_continuing(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<Map<String, Value>>,
        continuation: Option<&Continuation>,
        relay: Option<&Relay>,
        timeout: Duration,
        max_output_bytes: usize,
    ) -> Result<ToolOutput, McpError> {
        let slot = match self.slot(server) {
            Ok(slot) => slot,
            Err(error) => {
                self.inner.options.metrics.call(server, tool, Duration::ZERO, None, Some(error.code.as_str()));
                return Err(error);
            }
        };
        let started = Instant::now();
        // The call to the server, as the trace sees it; its context goes out in the request's
        // `_meta` (and as headers to a Streamable HTTP server, see `connect/http.rs`).
        let span = tracing::info_span!(
            target: otel::TARGET,
            "pool.call",
            otel.kind = "client",
            server_id = server,
            tool = tool,
            code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let call = ToolCall { server, tool, slot, continuation, relay, timeout, max_output_bytes, span };
        // One timer for the whole call: waiting for permits and the session counts against the
        // budget too (the caller's budget is wall time), and a single timer keeps the hot path
        // cheap. `reached` records the session the call went out on, if it got that far.
        let reached: Mutex<Option<Arc<Live>>> = Mutex::new(None);
        let work = call.send(&self.inner, arguments, &reached);
        let outcome = tokio::time::timeout(timeout, work).instrument(call.span.clone()).await;
        let latency = started.elapsed();
        let live = reached.lock().take();
        // `?`: a result the output checks reject ends the call here, uncounted.
        let result = call.settle(outcome, live, latency, self.inner.options.timeouts_before_restart).await?;
        call.record(&self.inner.options.metrics, &result, latency);
        result
    }
}

/// What [`ToolCall::send`] yields: the server's answer or why the session failed it, or why the
/// call never went out.
type Sent = Result<Result<CallToolResponse, ServiceError>, McpError>;

/// One tool call as the pool runs it: where it goes, what the caller brings, its budgets and the
/// span the trace sees.
struct ToolCall<'a> {
    server: &'a str,
    tool: &'a str,
    slot: Arc<Slot>,
    continuation: Option<&'a Continuation>,
    relay: Option<&'a Relay>,
    timeout: Duration,
    max_output_bytes: usize,
    span: tracing::Span,
}

impl ToolCall<'_> {
    /// Takes the permits and the session (kept in `reached`), then sends `tools/call`.
    async fn send(
        &self,
        inner: &Arc<Inner>,
        arguments: Option<Map<String, Value>>,
        reached: &Mutex<Option<Arc<Live>>>,
    ) -> Sent {
        let _call = inner
            .calls
            .acquire()
            .await
            .map_err(|_| McpError::new(ErrorCode::McpUnavailable, "the pool is shutting down"))?;
        let _permit = self
            .slot
            .concurrency
            .acquire()
            .await
            .map_err(|_| McpError::new(ErrorCode::McpUnavailable, "the server was removed"))?;
        let live = Slot::session(&self.slot, inner).await?;
        if inner.options.check_arguments
            && let Some(Ok(validator)) = self.slot.validator(self.tool, SchemaOf::Input).await.as_deref()
            && let Err(violation) = tool_schema::check_arguments(validator, arguments.as_ref())
        {
            let (tool, server) = (self.tool, &self.slot.config.id);
            return Err(McpError::new(ErrorCode::McpInvalidArguments, format!("'{tool}' on '{server}': {violation}")));
        }
        *reached.lock() = Some(live.clone());
        let mut params = CallToolRequestParams::new(self.tool.to_string());
        params.arguments = arguments;
        otel::inject_meta(&self.span, &mut params.meta);
        if let Some(continuation) = self.continuation {
            params.input_responses = continuation.input_responses.clone();
            params.request_state = continuation.request_state.clone();
        }
        // One round: the agent fulfils no `input_required` round itself (it has no human and
        // no model of the server's choosing to offer), see `input_required`.
        let peer = live.conn.service.peer();
        let caller = self.continuation.and_then(|c| c.capabilities_for(&live.conn.protocol));
        let mut meta = caller.map(caller_meta);
        // A 2026-07-28 server sends log messages only to a request that asks for them.
        if let Some(level) = self.relay.and_then(Relay::log_level).filter(|_| is_modern(&live.conn.protocol)) {
            meta.get_or_insert_with(RequestMetaObject::new).set_log_level(level);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let in_flight = Some((&live.conn.calls, self.relay));
        Ok(send_call(peer, request, meta, in_flight).await.and_then(|result| match result {
            ServerResult::CallToolResult(result) => Ok(CallToolResponse::Complete(result)),
            ServerResult::InputRequiredResult(asked) => Ok(CallToolResponse::InputRequired(asked)),
            ServerResult::CreateTaskResult(task) => Ok(CallToolResponse::Task(task)),
            _ => Err(ServiceError::UnexpectedResponse),
        }))
    }

    /// The caller's result of the call's `outcome` (`Err`: the budget ran out) on `live`, the
    /// session it went out on; health records it, and `restart_after` timeouts in a row restart
    /// the session. The outer `Err` is a result the output checks rejected ([`Self::checked`]),
    /// which the caller gets without the call being counted.
    async fn settle(
        &self,
        outcome: Result<Sent, tokio::time::error::Elapsed>,
        live: Option<Arc<Live>>,
        latency: Duration,
        restart_after: u32,
    ) -> Result<Result<ToolOutput, McpError>, McpError> {
        let (server, tool, slot) = (self.server, self.tool, &self.slot);
        match (outcome, live) {
            // The budget ran out waiting for the server's start, which goes on: say so.
            (Err(_), None) if let Some(starting) = slot.starting() => Ok(Err(McpError::new(
                ErrorCode::McpTimeout,
                format!(
                    "'{tool}' on '{server}' did not run within {} ms: the server is {}; retry shortly",
                    self.timeout.as_millis(),
                    starting.describe(std::time::SystemTime::now())
                ),
            ))),
            (Err(_), live) => {
                let error = McpError::new(
                    ErrorCode::McpTimeout,
                    format!("'{tool}' on '{server}' did not finish within {} ms", self.timeout.as_millis()),
                );
                // Only a call that went out counts against the session's health.
                if let Some(live) = live {
                    let action = slot.health.lock().call_timed_out(latency, restart_after, &error.message);
                    if action == Action::Restart {
                        tracing::warn!(server_id = %slot.config.id, "calls keep timing out: restarting the session");
                        slot.discard(&live).await;
                    }
                }
                Ok(Err(error))
            }
            (Ok(Err(error)), _) => Ok(Err(error)),
            (Ok(Ok(Err(e))), Some(live)) => Ok(Err(slot.failed(&live, e).await)),
            (Ok(Ok(Ok(response))), Some(live)) => {
                slot.health.lock().call_ok(latency);
                *live.last_used.lock() = Instant::now();
                self.answered(response, latency).await
            }
            (Ok(Ok(_)), None) => Ok(Err(McpError::new(ErrorCode::McpUnavailable, "the call had no session"))),
        }
    }

    /// The caller's result of the server's answer (the outer `Err` as in [`Self::settle`]).
    async fn answered(
        &self,
        response: CallToolResponse,
        latency: Duration,
    ) -> Result<Result<ToolOutput, McpError>, McpError> {
        let (server, tool) = (self.server, self.tool);
        match response {
            CallToolResponse::InputRequired(asked) => {
                let result = input_required(server, tool, &asked).to_call_tool_result();
                Ok(Ok(ToolOutput { result, truncated: None, bytes: 0, latency, input_required: Some(Arc::new(asked)) }))
            }
            CallToolResponse::Complete(result) => self.checked(result, latency).await.map(Ok),
            // A task handle (SEP-2663), or a kind rmcp adds later.
            _ => Ok(Err(McpError::new(
                ErrorCode::McpUnavailable,
                format!("'{tool}' on '{server}' answered with a task handle; the agent does not poll tasks"),
            ))),
        }
    }

    /// A complete result, capped to `maxToolOutputBytes` and checked against the tool's
    /// outputSchema.
    async fn checked(&self, result: CallToolResult, latency: Duration) -> Result<ToolOutput, McpError> {
        let (server, tool, max_output_bytes) = (self.server, self.tool, self.max_output_bytes);
        let structured = result.structured_content.is_some();
        let output = cap_result(result, max_output_bytes, latency)?;
        // A tool with an outputSchema must answer structuredContent that conforms; one
        // the cap had to drop cannot be passed on as a valid result.
        let validator = self.slot.validator(tool, SchemaOf::Output).await;
        if structured && output.result.structured_content.is_none() && validator.is_some() {
            return Err(McpError::new(
                ErrorCode::McpOutputTooLarge,
                format!(
                    "'{tool}' on '{server}' answered {} bytes, over its {max_output_bytes}-byte \
                     maxToolOutputBytes, and its structuredContent (which its outputSchema requires) \
                     does not fit",
                    output.bytes
                ),
            ));
        }
        if let Some(Ok(validator)) = validator.as_deref()
            && let Err(violation) = tool_schema::check(validator, &output.result)
        {
            return Err(McpError::new(
                ErrorCode::McpUnavailable,
                format!("'{tool}' on '{server}' broke its own outputSchema: {violation}"),
            ));
        }
        Ok(output)
    }

    /// Counts the call in `metrics` and marks its span with the outcome.
    fn record(&self, metrics: &PoolMetrics, result: &Result<ToolOutput, McpError>, latency: Duration) {
        let (bytes, error) = match result {
            Ok(output) if output.input_required.is_some() => (None, Some(ErrorCode::McpApprovalRequired.as_str())),
            Ok(output) => (Some(output.bytes), output.truncated.map(|_| ErrorCode::McpOutputTooLarge.as_str())),
            Err(error) => (None, Some(error.code.as_str())),
        };
        metrics.call(self.server, self.tool, latency, bytes, error);
        self.span.record("code", error.unwrap_or("ok"));
        if error.is_some() {
            self.span.record("otel.status_code", "ERROR");
        }
    }
}

pub(crate) fn cap_result(
    result: CallToolResult,
    max_output_bytes: usize,
    latency: Duration,
) -> Result<ToolOutput, McpError> {
    // The common case (text only, well under the cap) is decided without serializing anything.
    let text_only: Option<usize> = result
        .content
        .iter()
        .map(|c| c.as_text().map(|t| t.text.len()))
        .sum::<Option<usize>>()
        .filter(|_| result.structured_content.is_none());
    if let Some(bytes) = text_only.filter(|size| *size <= max_output_bytes) {
        return Ok(ToolOutput { result, truncated: None, bytes, latency, input_required: None });
    }
    let mut json = serde_json::to_value(&result)
        .map_err(|e| McpError::new(ErrorCode::McpUnavailable, format!("unreadable tool result: {e}")))?;
    let bytes = output::result_size(&json);
    let Some(truncated) = output::cap(&mut json, max_output_bytes) else {
        return Ok(ToolOutput { result, truncated: None, bytes, latency, input_required: None });
    };
    let result = serde_json::from_value(json)
        .map_err(|e| McpError::new(ErrorCode::McpUnavailable, format!("unreadable tool result: {e}")))?;
    Ok(ToolOutput { result, truncated: Some(truncated), bytes, latency, input_required: None })
}

/// Longest piece of a server's elicitation message quoted in an error (it is the server's text,
/// reaching a model as tool output: bounded, and marked as the server's).
const MAX_ASKED_QUOTE: usize = 200;

/// The error of a call whose server asked for input (2026-07-28 `InputRequiredResult`): the agent
/// has no human to ask and offers no sampling, so the call ends here, naming what was asked,
/// instead of hanging or retrying.
pub(crate) fn input_required(server: &str, tool: &str, asked: &InputRequiredResult) -> McpError {
    let mut what: Vec<String> = Vec::new();
    for request in asked.input_requests.iter().flat_map(|requests| requests.values()) {
        what.push(match request {
            InputRequest::Elicitation(elicit) => {
                let message = serde_json::to_value(&elicit.params)
                    .ok()
                    .and_then(|p| p.get("message").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_default();
                let quoted: String = message.chars().take(MAX_ASKED_QUOTE).collect();
                format!("user input (elicitation; the server says: {quoted:?})")
            }
            InputRequest::CreateMessage(_) => "a model completion (sampling)".to_string(),
            InputRequest::ListRoots(_) => "the client's roots".to_string(),
            _ => "input of a kind this agent does not know".to_string(),
        });
    }
    if what.is_empty() {
        what.push("another round with its request state".to_string());
    }
    McpError::new(
        ErrorCode::McpApprovalRequired,
        format!(
            "'{tool}' on '{server}' asks for {}, which this agent cannot provide without a person; \
             the call was not completed",
            what.join(", ")
        ),
    )
}

/// The `_meta` that declares a caller's `capabilities` to a 2026-07-28 server.
pub(super) fn caller_meta(capabilities: &ClientCapabilities) -> RequestMetaObject {
    let mut meta = RequestMetaObject::new();
    meta.set_client_capabilities(capabilities.clone());
    meta
}

/// Whether a session speaks 2026-07-28 or later (per-request capabilities and log levels).
pub(super) fn is_modern(protocol: &ProtocolVersion) -> bool {
    protocol.as_str() >= ProtocolVersion::V_2026_07_28.as_str()
}

/// Sends `request` (with `meta` added to its `_meta`: a caller's capabilities, a log level) and
/// waits for its answer; a request abandoned before it (the caller's budget ran out) is
/// cancelled at the server. With `in_flight`, the request is one of the session's calls for as
/// long as it runs, so what the server sends meanwhile reaches the call's relay (see `relay`).
pub(super) async fn send_call(
    peer: &rmcp::service::Peer<rmcp::RoleClient>,
    request: ClientRequest,
    meta: Option<RequestMetaObject>,
    in_flight: Option<(&Arc<InFlight>, Option<&Relay>)>,
) -> Result<ServerResult, ServiceError> {
    let mut options = PeerRequestOptions::no_options();
    options.meta = meta;
    let handle = peer.send_request_with_option(request, options).await?;
    let _call = in_flight.map(|(calls, relay)| match relay {
        Some(relay) => calls.enter(handle.id.clone(), handle.progress_token.clone(), relay.clone()),
        None => calls.enter_unrelayed(),
    });
    let relays = in_flight.is_some_and(|(_, relay)| relay.is_some());
    let mut abandoned = CancelWhenAbandoned { peer: peer.clone(), id: Some(handle.id.clone()) };
    let result = handle.await_response().await;
    abandoned.id = None;
    if relays {
        // rmcp handles each notification in a task of its own: give those the server sent just
        // before its answer a turn to reach the relay before the call leaves the session.
        tokio::task::yield_now().await;
    }
    result
}

/// Sends `notifications/cancelled` for the request `id` when dropped while still set.
struct CancelWhenAbandoned {
    peer: rmcp::service::Peer<rmcp::RoleClient>,
    id: Option<rmcp::model::RequestId>,
}

impl Drop for CancelWhenAbandoned {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let peer = self.peer.clone();
        runtime.spawn(async move {
            let reason = Some("request abandoned by the caller".to_string());
            // The session may be gone already; nothing is waiting for this either way.
            let _ = peer.notify_cancelled(CancelledNotificationParam::new(Some(id), reason)).await;
        });
    }
}
