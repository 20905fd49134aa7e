//! `POST /v1/chat/completions`, OpenAI-compatible: the workload's MCP tools are injected into the
//! request, and the agent executes the model's calls to them until the model answers. It is the
//! door for agent-unaware callers: any OpenAI client works by changing its base URL. The
//! decisions live in the pure `crate::chat` library; this file is the I/O around them.
//!
//! ```text
//! caller ─POST─▶ ChatRequest ─ McpOptions (the `mcp` object; never forwarded)
//!                   │ Agent::effective(scope, caller tool names)   403 / 400 before the model is asked
//!                   ▼
//!   tool_loop::upstream_body (+ MCP tools) + plan_tool_choice      400 for a forced unknown tool
//!   upstream::resolve (flags > profile > caller's Authorization)  503 when nothing is configured
//!   loop ── Upstream::complete ──▶ answer ──classify, LoopState::decide──┐
//!     ▲        502 / upstream's own error status                        │
//!     └─ role=tool messages ◀─ join_all(Agent::call_tool) ◀─ Execute ────┤
//!                                                   Return / Stop ───────┴─▶ answer + "spear"
//!                                                       ─▶ JSON, or SSE (stream::chunks)
//! ```
//!
//! - A request that arrives while the agent starts waits for the first tool lists
//!   (`Agent::settled`); a call to a server whose list is not known waits in `Agent::call_tool`.
//! - `stream: true` still asks the upstream with `stream: false` (the loop must see each answer
//!   whole); the final answer goes out as SSE chunks. Why, and `n > 1`: `src/agent/README.md`.
//! - A streamed request whose loop runs past [`STREAM_COMMIT_AFTER`] (a tool call waiting for an
//!   approver, a slow model) gets its 200 and SSE headers then, and an SSE comment every
//!   [`KEEP_ALIVE_EVERY`], so proxies and clients do not take the silence for a dead connection.
//!   An error after that point goes out as a `data: {"error": ...}` event (as OpenAI streams
//!   errors), since the status is sent. The loop ends when the caller goes away, as before.
//! - Every answer that read the registry, errors included, carries `x-spear-registry-revision`; a
//!   successful one with MCP enabled carries the `spear` extension field (revision, tool calls,
//!   iterations, budget note, the loop's messages), with which an agent-aware caller continues.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use tracing::Instrument as _;

use crate::agent::audit::{self, Door};
use crate::agent::core::{Agent, CallContext};
use crate::agent::revision::stamp_revision;
use crate::api::keys::ENV_UPSTREAM_API_KEY;
use crate::chat::tool_loop::{self, After, ChoicePlan, LoopState, Next, Round, ToolOffer};
use crate::chat::types::{ChatCompletion, ChatRequest, ChoiceKind, McpOptions, ToolCallItem};
use crate::chat::upstream::{self, Target, Upstream};
use crate::chat::{ChatError, UpstreamError, UpstreamOverride, UpstreamTimeouts, stream};
use crate::policy::EffectiveSet;
use crate::policy::select::{self, Selection, SelectionPolicy};
use crate::telemetry::otel;

pub(crate) const COMPLETIONS_PATH: &str = "/v1/chat/completions";
/// Largest request body. Conversations with inline images run to megabytes; the port is
/// loopback-only, so a generous cap costs nothing (axum's default, 2 MiB, is too small).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The chat completions door: the agent core, the upstream settings and an HTTP client.
#[derive(Clone)]
pub struct ChatService {
    inner: Arc<Inner>,
}

struct Inner {
    agent: Agent,
    overrides: UpstreamOverride,
    /// `$SPEAR_UPSTREAM_API_KEY`, read once at start (the webhook sets it from the profile's
    /// `apiKeySecretRef`).
    env_api_key: Option<String>,
    upstream: Upstream,
}

impl fmt::Debug for ChatService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No key in here: the override redacts its own, the env key is not printed.
        f.debug_struct("ChatService")
            .field("profile", &self.inner.agent.profile())
            .field("overrides", &self.inner.overrides)
            .field("env_api_key", &self.inner.env_api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl ChatService {
    /// The door over `agent`, with the flags' upstream settings; reads `SPEAR_UPSTREAM_API_KEY`.
    pub fn new(agent: Agent, overrides: UpstreamOverride, timeouts: UpstreamTimeouts) -> Result<Self, UpstreamError> {
        let env_api_key = upstream::non_empty_env(ENV_UPSTREAM_API_KEY);
        let upstream = Upstream::new(timeouts, agent.egress())?;
        Ok(ChatService { inner: Arc::new(Inner { agent, overrides, env_api_key, upstream }) })
    }

    /// Completes one request. `revision` is set as soon as the registry was used, so error
    /// answers carry it too.
    async fn complete(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        revision: &Mutex<Option<String>>,
    ) -> Result<Reply, ChatError> {
        let inner = &self.inner;
        require_json(headers)?;
        let mut request = ChatRequest::from_slice(body)?;
        let options = McpOptions::parse(request.mcp.take())?;
        let sse = request.stream == Some(true);
        let include_usage = request.include_usage();

        let state = inner.agent.state();
        *revision.lock() = Some(state.snapshot.revision().as_str().to_string());
        let profile = state.snapshot.profile(inner.agent.profile()).map(|p| p.object.clone());
        let upstream_spec = profile.as_ref().and_then(|p| p.spec.chat.as_ref()).and_then(|c| c.upstream.as_ref());

        if !options.enabled {
            // A plain proxy: nothing injected, nothing executed.
            let target = self.target(upstream_spec, headers)?;
            let body = tool_loop::upstream_body(request, Vec::new(), target.default_model.as_deref());
            let completion = inner.upstream.complete(&target, &body).await?;
            return Ok(Reply { completion, sse, include_usage, extension: None });
        }

        // A request that arrives while the agent starts waits for the first tool lists, so the
        // model is offered the workload's tools rather than none (bounded by the slowest
        // server's connect timeout; a missing profile does not wait).
        inner.agent.settled().await;
        let caller_names: Vec<String> = request.caller_tool_names().into_iter().map(str::to_string).collect();
        let caller: HashSet<&str> = caller_names.iter().map(String::as_str).collect();
        let caller_list: Vec<&str> = caller_names.iter().map(String::as_str).collect();
        let set = inner.agent.effective(options.scope.as_ref(), &caller_list)?;
        *revision.lock() = Some(set.revision.as_str().to_string());

        // Every effective tool may be forced, offered this round or not.
        let injectable: HashSet<&str> = set.tools().map(|(_, t)| &*t.name).collect();
        let plan = tool_loop::plan_tool_choice(
            request.tool_choice.as_ref(),
            profile.as_ref().and_then(|p| p.spec.tool_choice).unwrap_or_default(),
            &caller,
            &injectable,
        )?;
        let selection_spec =
            profile.as_ref().and_then(|p| p.spec.chat.as_ref()).and_then(|c| c.tool_selection.as_ref());
        let offer = SelectionPolicy::new(selection_spec, options.max_tools)?.map(|policy| {
            let forced = plan.first.as_ref().and_then(|c| match c.kind() {
                ChoiceKind::Function(name) => Some(name.to_string()),
                _ => None,
            });
            ToolOffer::new(policy, request.tools.clone(), forced.as_deref())
        });
        let target = self.target(upstream_spec, headers)?;
        if !options.resources.is_empty() {
            let message = self.read_attachments(&set, &options.resources).await?;
            tool_loop::attach_before_latest_user(&mut request.messages, message);
        }
        // Under relevance selection each round sets its own tools (`ToolOffer::round`); only
        // `all` copies every definition here.
        let injected = if offer.is_some() { Vec::new() } else { tool_loop::injected_tools(&set) };
        let body = tool_loop::upstream_body(request, injected, target.default_model.as_deref());
        let (completion, extension) = self.run_loop(&target, body, &set, &plan, &caller, offer).await?;
        let extension = serde_json::to_value(&extension).unwrap_or(Value::Null);
        Ok(Reply { completion, sse, include_usage, extension: Some(extension) })
    }

    /// Reads the request's `mcp.resources` through the policy (audited, each capped at its
    /// server's `maxToolOutputBytes`) into the message that attaches them; the first failure
    /// refuses the request before the model is asked.
    async fn read_attachments(&self, set: &EffectiveSet, ids: &[String]) -> Result<Value, ChatError> {
        let request_id = format!("chatcmpl-{}", uuid::Uuid::new_v4());
        let context = CallContext::new(Door::Chat, &request_id, None);
        let reads = ids.iter().map(|id| self.inner.agent.read_resource(set, id, context));
        let mut attached = Vec::with_capacity(ids.len());
        for (id, read) in ids.iter().zip(futures::future::join_all(reads).await) {
            let result =
                read.map_err(|source| ChatError::Resource { uri: audit::capped(id).to_string(), source })?.result;
            let contents = serde_json::to_value(&result.contents).ok().and_then(|v| v.as_array().cloned());
            attached.push((id.clone(), contents.unwrap_or_default()));
        }
        Ok(tool_loop::resource_message(&attached))
    }

    fn target(&self, spec: Option<&crate::api::UpstreamSpec>, headers: &HeaderMap) -> Result<Target, ChatError> {
        let inner = &self.inner;
        upstream::resolve(&inner.overrides, inner.env_api_key.as_deref(), spec, inner.agent.profile(), headers)
    }

    /// Asks the model, runs its MCP calls, and asks again until [`LoopState::decide`] says stop.
    async fn run_loop(
        &self,
        target: &Target,
        mut body: ChatRequest,
        set: &EffectiveSet,
        plan: &ChoicePlan,
        caller: &HashSet<&str>,
        mut offer: Option<ToolOffer>,
    ) -> Result<(ChatCompletion, Extension), ChatError> {
        let mut state = LoopState::new(set.loop_budgets);
        let mut extension = Extension {
            registry_revision: set.revision.as_str().to_string(),
            tool_calls: Vec::new(),
            iterations: 0,
            budget_exceeded: None,
            tool_selection: Vec::new(),
            messages: Vec::new(),
            warnings: set_warnings(set),
        };
        // `find_tools` is the agent's own unless a caller's or an MCP tool has its name.
        let builtin = offer.is_some() && set.route(select::FIND_TOOLS).is_none();
        let is_mcp = |name: &str| set.route(name).is_some() || (builtin && name == select::FIND_TOOLS);
        // The audit lines' request id: the first answer's completion id, once there is one.
        let mut request_id = format!("chatcmpl-{}", uuid::Uuid::new_v4());
        self.inner.agent.served_set(set, CallContext::new(Door::Chat, &request_id, None), true);
        let completion = loop {
            body.tool_choice = plan.for_iteration(state.iterations());
            if let Some(offer) = &offer {
                let (tools, selection) = offer.round(set, &body.messages);
                body.tools = tools;
                extension.tool_selection.push(RoundSelection { iteration: state.iterations() + 1, selection });
            }
            state.request_sent();
            let round = tracing::info_span!(
                target: otel::TARGET,
                "chat.upstream",
                otel.kind = "client",
                iteration = state.iterations(),
                code = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
            );
            let answered =
                self.inner.upstream.complete(target, &body).instrument(round.clone()).await.map_err(ChatError::from);
            match &answered {
                Ok(_) => round.record("code", "ok"),
                Err(error) => round.record("code", error.code()).record("otel.status_code", "ERROR"),
            };
            let mut completion = answered?;
            if state.iterations() == 1
                && let Some(id) = completion.id.as_ref().filter(|id| !id.is_empty())
            {
                request_id.clone_from(id);
            }
            let Some(choice) = completion.choices.first_mut() else { break completion };
            let kinds = tool_loop::classify(choice.message.calls(), caller, is_mcp);
            match state.decide(&kinds) {
                Next::Return => break completion,
                Next::Stop(note) => {
                    tracing::info!(request_id, message = %note.message, "chat tool loop stopped by a budget");
                    tool_loop::strip_executed(choice, &kinds);
                    extension.budget_exceeded = Some(note);
                    break completion;
                }
                Next::Execute(round) => {
                    let calls = choice.message.calls();
                    let builtin = builtin.then_some(()).and(offer.as_mut());
                    let answers = self
                        .execute(set, calls, &round, &request_id, state.iterations(), &mut extension, builtin)
                        .await;
                    let mut exchange = Vec::with_capacity(answers.len() + 1);
                    exchange.push(tool_loop::assistant_history(&choice.message));
                    exchange.extend(answers);
                    body.messages.extend(exchange.iter().cloned());
                    extension.messages.extend(exchange);
                    if let Some(note) = round.note {
                        extension.budget_exceeded = Some(note);
                    }
                    if round.then == After::ReturnToCaller {
                        tool_loop::strip_executed(choice, &kinds);
                        break completion;
                    }
                }
            }
        };
        extension.iterations = state.iterations();
        let budget = extension.budget_exceeded.as_ref().map(|note| note.budget);
        let calls = u32::try_from(extension.tool_calls.len()).unwrap_or(u32::MAX);
        self.inner.agent.chat_loop_done(extension.iterations, calls, budget);
        tracing::debug!(
            request_id,
            iterations = extension.iterations,
            tool_calls = extension.tool_calls.len(),
            "chat completion done"
        );
        Ok((completion, extension))
    }

    /// Runs a round's calls concurrently; returns one `role=tool` message per executed or refused
    /// call, in the order of the answer's calls, and records each call in `extension`. With
    /// `builtin`, calls to `find_tools` are answered by the agent and pin what they find.
    #[allow(clippy::too_many_arguments)]
    async fn execute(
        &self,
        set: &EffectiveSet,
        calls: &[ToolCallItem],
        round: &Round,
        request_id: &str,
        iteration: u32,
        extension: &mut Extension,
        builtin: Option<&mut ToolOffer>,
    ) -> Vec<Value> {
        let context = CallContext::new(Door::Chat, request_id, None);
        let agent = &self.inner.agent;
        let mut found = Vec::new();
        let groups = if builtin.is_some() { agent.tool_groups(set) } else { Vec::new() };
        let results = futures::future::join_all(round.run.iter().filter_map(|&i| calls.get(i)).map(|call| {
            let local = (builtin.is_some() && call.name() == select::FIND_TOOLS).then(|| {
                agent.call_builtin(set, call.name(), call.arguments_object(), context, |arguments| {
                    let (output, names) = tool_loop::run_find_tools(set, arguments, &groups)?;
                    found.extend(names);
                    Ok(output)
                })
            });
            async move {
                match local {
                    Some(done) => done,
                    None => agent.call_tool(set, call.name(), call.arguments_object(), context).await,
                }
            }
        }))
        .await;
        if let Some(offer) = builtin {
            offer.found(&found);
        }
        let denials = round.denied.iter().filter_map(|&i| calls.get(i)).map(|call| {
            let reason = format!(
                "a '{}' tool call never runs an MCP tool: only 'function' calls are routed to MCP servers",
                audit::capped(&call.kind)
            );
            agent.deny_call(set, call.name(), reason, context)
        });
        let denials: Vec<_> = denials.collect();

        let mut answers: Vec<(usize, Value, CallRecord)> =
            Vec::with_capacity(round.run.len() + round.denied.len() + round.refused.len());
        for (&i, done) in round.run.iter().chain(&round.denied).zip(results.into_iter().chain(denials)) {
            let record = CallRecord {
                name: done.name.clone(),
                server_id: done.server_id.as_deref().map(str::to_string),
                tool: done.tool.as_deref().map(str::to_string),
                status: done.status(),
                latency_ms: audit::millis(done.latency),
                iteration,
            };
            let id = calls.get(i).map(|c| c.id.as_str()).unwrap_or_default();
            answers.push((i, tool_loop::tool_message(id, done.model_text()), record));
        }
        let refusal = tool_loop::budget_refusal(set.loop_budgets.max_total_tool_calls);
        for &i in &round.refused {
            let Some(call) = calls.get(i) else { continue };
            let route = set.route(call.name());
            let record = CallRecord {
                name: call.name().to_string(),
                server_id: route.map(|r| r.server.to_string()),
                tool: route.map(|r| r.tool.to_string()),
                status: crate::mcp::ErrorCode::McpBudgetExceeded.as_str(),
                latency_ms: 0.0,
                iteration,
            };
            answers.push((i, tool_loop::tool_message(&call.id, refusal.clone()), record));
        }
        answers.sort_by_key(|(i, _, _)| *i);
        answers
            .into_iter()
            .map(|(_, message, record)| {
                extension.tool_calls.push(record);
                message
            })
            .collect()
    }
}

/// The `spear` extension field of an answer.
#[derive(Debug, Serialize)]
struct Extension {
    registry_revision: String,
    tool_calls: Vec<CallRecord>,
    iterations: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    budget_exceeded: Option<tool_loop::BudgetNote>,
    /// Under `chat.toolSelection: relevance`, the tools each upstream request offered, with
    /// their scores and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_selection: Vec<RoundSelection>,
    /// Every message the loop added to the conversation (assistant messages with their calls and
    /// the `role=tool` answers), in order: an agent-aware caller appends these instead of the
    /// returned message to keep the whole exchange.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    messages: Vec<Value>,
    /// What the caller should know about the set it was served (it offers no tool; the profile's
    /// `defaultServers` is empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// The `spear.warnings` of a request served `set`.
fn set_warnings(set: &EffectiveSet) -> Vec<String> {
    let mut warnings = Vec::new();
    if set.default_servers_empty() {
        warnings.push(format!(
            "McpProfile '{}' has defaultServers: [], so a request that names no server (mcp.server_ids) gets no MCP tools",
            set.profile
        ));
    }
    if set.tools().next().is_none() {
        warnings.push(format!(
            "no MCP tool is offered: McpProfile '{}' allows none for this request (see `spearlet explain` for why each is left out)",
            set.profile
        ));
    }
    warnings
}

/// The tools offered to one upstream request.
#[derive(Debug, Serialize)]
struct RoundSelection {
    iteration: u32,
    #[serde(flatten)]
    selection: Selection,
}

/// One tool call the loop made (or refused), for the `spear.tool_calls` field.
#[derive(Debug, Serialize)]
struct CallRecord {
    name: String,
    server_id: Option<String>,
    tool: Option<String>,
    status: &'static str,
    latency_ms: f64,
    iteration: u32,
}

/// A finished completion on its way to the caller.
struct Reply {
    completion: ChatCompletion,
    /// Sent as SSE chunks (the request's `stream: true`).
    sse: bool,
    include_usage: bool,
    extension: Option<Value>,
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let Reply { mut completion, sse, include_usage, extension } = self;
        if sse {
            let chunks = stream::chunks(&completion, include_usage, extension);
            let headers = [
                (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ];
            return (headers, stream::sse_body(&chunks)).into_response();
        }
        if let Some(extension) = extension {
            completion.extra.insert("spear".into(), extension);
        }
        axum::Json(completion).into_response()
    }
}

/// The router serving [`COMPLETIONS_PATH`]; merge it into the agent's HTTP router.
pub fn router(service: ChatService) -> Router {
    Router::new()
        .route(COMPLETIONS_PATH, post(completions))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(service)
}

/// `application/json` (parameters allowed, as `charset=utf-8`), or the refusal.
fn require_json(headers: &HeaderMap) -> Result<(), ChatError> {
    let content_type = headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let media_type = content_type.split(';').next().unwrap_or_default().trim();
    if media_type.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(ChatError::NotJson { content_type: content_type.chars().take(100).collect() })
    }
}

/// How long a streamed request may run before its 200 and SSE headers go out (a shorter loop
/// answers with its own status, errors included).
pub(crate) const STREAM_COMMIT_AFTER: Duration = Duration::from_secs(10);
/// An SSE comment this often while a committed stream waits: well under the 60 s idle timeout
/// of common proxies and load balancers.
pub(crate) const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

/// Aborts a spawned completion when its caller is gone (the handler or the stream dropped).
struct AbortOnDrop(tokio::task::JoinHandle<Response>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The handler: a streamed request that runs long gets its stream committed and kept alive
/// (see the module header); every other request is answered when it completes.
async fn completions(State(service): State<ChatService>, headers: HeaderMap, body: Bytes) -> Response {
    if !wants_stream(&body) {
        return respond(service, headers, body, Arc::default()).await;
    }
    let revision: Arc<Mutex<Option<String>>> = Arc::default();
    let mut task = AbortOnDrop(tokio::spawn(respond(service, headers, body, revision.clone())));
    tokio::select! {
        done = &mut task.0 => return done.unwrap_or_else(|e| internal_error(&e)),
        () = tokio::time::sleep(STREAM_COMMIT_AFTER) => {}
    }
    const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";
    // The first comment goes out at once, then one per KEEP_ALIVE_EVERY until the answer.
    let first = futures::stream::once(async { Ok::<_, std::convert::Infallible>(Bytes::from_static(KEEP_ALIVE)) });
    let rest = futures::stream::unfold(Some(task), |task| async move {
        let mut task = task?;
        tokio::select! {
            done = &mut task.0 => {
                let response = done.unwrap_or_else(|e| internal_error(&e));
                Some((Ok(final_events(response).await), None))
            }
            () = tokio::time::sleep(KEEP_ALIVE_EVERY) => Some((Ok(Bytes::from_static(KEEP_ALIVE)), Some(task))),
        }
    });
    let stream = futures::StreamExt::chain(first, rest);
    let mut response = axum::body::Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some(revision) = revision.lock().as_deref() {
        stamp_revision(headers, revision);
    }
    response
}

/// Whether the request asks for a stream (`"stream": true`); a body that does not parse is
/// answered (refused) by the normal path.
fn wants_stream(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Stream {
        #[serde(default)]
        stream: Option<bool>,
    }
    serde_json::from_slice::<Stream>(body).is_ok_and(|s| s.stream == Some(true))
}

/// The rest of a committed stream: the answer's SSE events as they are, or an error answer as
/// one `data: {"error": ...}` event and `[DONE]`.
async fn final_events(response: Response) -> Bytes {
    let ok = response.status().is_success();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap_or_default();
    if ok {
        return body;
    }
    let error: Value = serde_json::from_slice(&body).unwrap_or_else(
        |_| serde_json::json!({"error": {"message": String::from_utf8_lossy(&body), "type": "upstream_error"}}),
    );
    Bytes::from(format!("data: {error}\n\ndata: [DONE]\n\n"))
}

fn internal_error(e: &tokio::task::JoinError) -> Response {
    let body =
        serde_json::json!({"error": {"message": format!("the completion ended early: {e}"), "type": "internal_error"}});
    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
}

/// Parses, completes, maps errors, stamps the revision.
async fn respond(
    service: ChatService,
    headers: HeaderMap,
    body: Bytes,
    revision: Arc<Mutex<Option<String>>>,
) -> Response {
    let span = tracing::info_span!(
        target: otel::TARGET,
        "chat.completion",
        otel.kind = "server",
        registry_revision = tracing::field::Empty,
        code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    otel::continue_from_headers(&span, &headers);
    let completed = service.complete(&headers, &body, &revision).instrument(span.clone()).await;
    let revision = revision.lock().clone();
    if let Some(revision) = &revision {
        span.record("registry_revision", revision.as_str());
    }
    let mut response = match completed {
        Ok(reply) => {
            span.record("code", "ok");
            reply.into_response()
        }
        Err(error) => {
            span.record("code", error.code()).record("otel.status_code", "ERROR");
            tracing::info!(code = error.code(), %error, "chat completion refused");
            error.into_response()
        }
    };
    if let Some(revision) = revision {
        stamp_revision(response.headers_mut(), &revision);
    }
    response
}
