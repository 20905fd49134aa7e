//! Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`, off by default; never
//! in a release build). Most of the crate is `pub(crate)`: these are thin wrappers that call the
//! crate-private functions and hand back plain data. The properties are asserted in the targets
//! (`fuzz/fuzz_targets/*.rs`, listed in `fuzz/README.md`); a wrapper asserts only what it alone
//! can see, and says so in its doc.
//!
//! Nothing here is an API: it may change with the targets at any time.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request};
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, ReadBuf};

use crate::agent::doors::mcp::fast_path::{self, ToolCallRequest};
use crate::agent::http_guard;
use crate::api::env_ref::{self, Segment};
use crate::api::manifest::{self, Object};
use crate::chat::tool_loop::{self, After, ChoicePlan, LoopState, Next};
use crate::chat::types::{ChatCompletion, ChatRequest, McpOptions};
use crate::mcp::connect::FrameGuard;
use crate::mcp::{output, pool};
use crate::operator::inject::{self, InjectConfig};
use crate::operator::webhook::{self, Inputs, Lookup, LookupError};
use crate::policy::{CompiledProfile, EffectiveSet, RequestScope, ServerTools, ToolInfo, ToolList, name};
use crate::registry::{Entry, Snapshot};

/// The example registry (`examples/registry/`) as one multi-document text: the registry the
/// chat and webhook targets decide against, so their inputs meet real servers and profiles.
pub const EXAMPLE_REGISTRY: &str = concat!(
    include_str!("../examples/registry/everything.yaml"),
    "\n---\n",
    include_str!("../examples/registry/filesystem.yaml"),
    "\n---\n",
    include_str!("../examples/registry/profiles.yaml"),
);

// === manifest ===

/// What [`manifest::parse`] made of a text: each valid object as JSON (with its `apiVersion`
/// and `kind`), and each problem's line, field and message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManifestRead {
    pub documents: Vec<Value>,
    pub problems: Vec<(usize, String, String)>,
}

/// Reads a manifest text ([`manifest::parse`]).
pub fn parse_manifest(text: &str) -> ManifestRead {
    manifest_read(manifest::parse(text))
}

/// A parse's budget, or what it spent of one ([`manifest::Budget`], [`manifest::Spent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestCost {
    pub nodes: usize,
    pub scalar_bytes: usize,
    pub path_bytes: usize,
}

/// The budget every real parse has ([`manifest::Budget::FILE`]).
pub const MANIFEST_FILE_BUDGET: ManifestCost = ManifestCost {
    nodes: manifest::Budget::FILE.nodes,
    scalar_bytes: manifest::Budget::FILE.scalar_bytes,
    path_bytes: manifest::Budget::FILE.path_bytes,
};

/// The most text a parse reads ([`manifest::MAX_MANIFEST_BYTES`]).
pub const MAX_MANIFEST_BYTES: usize = manifest::MAX_MANIFEST_BYTES;

/// Reads a manifest text under `budget` ([`manifest::parse_within`]), with what it spent.
pub fn parse_manifest_within(text: &str, budget: ManifestCost) -> (ManifestRead, ManifestCost) {
    let budget =
        manifest::Budget { nodes: budget.nodes, scalar_bytes: budget.scalar_bytes, path_bytes: budget.path_bytes };
    let (parsed, spent) = manifest::parse_within(text, budget);
    let spent = ManifestCost { nodes: spent.nodes, scalar_bytes: spent.scalar_bytes, path_bytes: spent.path_bytes };
    (manifest_read(parsed), spent)
}

fn manifest_read(parsed: manifest::Parsed) -> ManifestRead {
    let documents = parsed
        .documents
        .iter()
        .map(|d| match &d.object {
            Object::Server(s) => serde_json::to_value(s),
            Object::Profile(p) => serde_json::to_value(p),
        })
        .map(|v| v.unwrap_or(Value::Null))
        .collect();
    ManifestRead { documents, problems: parsed.problems.into_iter().map(|p| (p.line, p.field, p.message)).collect() }
}

// === env templates and the kubelet ===

/// One piece of a parsed `${ENV:...}` template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplatePart {
    Literal(String),
    Env { name: String, default: Option<String> },
}

/// [`env_ref::parse`]: the template's parts, or the error's text.
pub fn parse_template(input: &str) -> Result<Vec<TemplatePart>, String> {
    let template = env_ref::parse(input).map_err(|e| e.to_string())?;
    Ok(template
        .segments()
        .iter()
        .map(|s| match s {
            Segment::Literal(text) => TemplatePart::Literal(text.clone()),
            Segment::Env { name, default } => TemplatePart::Env { name: name.clone(), default: default.clone() },
        })
        .collect())
}

/// What the agent makes of `input` in an environment: `None` when it is not a valid template,
/// `Some(Err(name))` when `name` is unset and has no default.
pub fn expand_template(input: &str, lookup: impl Fn(&str) -> Option<String>) -> Option<Result<String, String>> {
    let template = env_ref::parse(input).ok()?;
    Some(template.expand(lookup).map_err(|missing| missing.name))
}

/// The env value the webhook writes for a sidecar's `stdio.env` value `value`, with `defined`
/// the variables set before it on the container ([`inject`]'s `kubelet_value`), and the
/// warnings it gave.
pub fn kubelet_value(value: &str, defined: &[&str]) -> (String, Vec<String>) {
    let defined: BTreeSet<&str> = defined.iter().copied().collect();
    let mut warnings = Vec::new();
    let out = inject::kubelet_value("fuzz", "spec.stdio.env[0].value", value, &defined, &mut warnings);
    (out, warnings)
}

/// A literal argv entry as the webhook writes it for the kubelet.
pub fn escape_dollars(s: &str) -> String {
    inject::escape_dollars(s)
}

// === /mcp fast path and the HTTP door's guard ===

/// A `tools/call` the fast path takes: the id (as JSON), the tool name and the arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct FastCall {
    pub id: Value,
    pub name: String,
    pub arguments: Option<Map<String, Value>>,
}

/// The fast path's reading of a `/mcp` body; `None` sends it to rmcp.
pub fn fast_path_call(body: &[u8]) -> Option<FastCall> {
    let call = ToolCallRequest::parse(&Bytes::copy_from_slice(body))?;
    let id = serde_json::to_value(&call.id).unwrap_or(Value::Null);
    Some(FastCall { id, name: call.params.name.to_string(), arguments: call.params.arguments })
}

/// The fast path's reading of a 2026-07-28 stateless `/mcp` body sent with `version` and
/// `headers`; `None` sends it to rmcp.
pub fn fast_path_stateless_call(body: &[u8], version: &str, headers: &HeaderMap) -> Option<FastCall> {
    let call = ToolCallRequest::parse_stateless(&Bytes::copy_from_slice(body), version, headers)?;
    let id = serde_json::to_value(&call.id).unwrap_or(Value::Null);
    Some(FastCall { id, name: call.params.name.to_string(), arguments: call.params.arguments })
}

/// The protocol version when the headers allow the stateless fast path.
pub fn fast_path_stateless(headers: &HeaderMap, allowed_hosts: &[String]) -> Option<String> {
    fast_path::fast_path_stateless(headers, allowed_hosts).map(str::to_string)
}

/// The session id when the headers allow the fast path.
pub fn fast_path_session(headers: &HeaderMap, allowed_hosts: &[String]) -> Option<String> {
    fast_path::fast_path_session(headers, allowed_hosts).map(str::to_string)
}

/// Whether `host` passes the door's Host check.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    http_guard::host_allowed(host, allowed)
}

/// Why the HTTP door's guard refuses a request with these headers (and, for HTTP/2, this URI
/// authority, ignored when it does not make a URI), if it does.
pub fn guard_refusal(
    headers: HeaderMap,
    authority: Option<&str>,
    hosts: Vec<String>,
    origins: Vec<String>,
) -> Option<String> {
    let mut request = Request::new(Body::empty());
    // An authority that does not make a URI is not one a request can carry: the path alone.
    let uri = authority.and_then(|a| format!("http://{a}/mcp").parse().ok());
    *request.uri_mut() = uri.unwrap_or_else(|| axum::http::Uri::from_static("/mcp"));
    *request.headers_mut() = headers;
    http_guard::refusal(&request, &http_guard::Allowed::new(hosts, origins))
}

// === names and the effective set ===

/// The model-facing name of `tool` on the server whose name part is `server_part`.
pub fn base_name(server_part: &str, tool: &str) -> String {
    name::base_name(server_part, tool)
}

/// Whether a name may be shortened (only those need a collision check).
pub fn may_collide(name: &str) -> bool {
    name::may_collide(name)
}

/// A name not in `taken` (see `policy::name::free_name`).
pub fn free_name(base: &str, server_part: &str, hash_key: &str, tool: &str, keep_base: bool, taken: &[&str]) -> String {
    name::free_name(base, server_part, hash_key, tool, keep_base, |n| taken.contains(&n))
}

/// The server a name belongs to by its shape: `(true, part)` for `mcp__<part>__…`, `(false, id)`
/// for the dotted `mcp.<id>.<tool>`.
pub fn name_target(name: &str) -> Option<(bool, String)> {
    match name::target(name)? {
        name::Target::ServerPart(part) => Some((true, part.to_string())),
        name::Target::ServerId(id) => Some((false, id.to_string())),
    }
}

/// An effective set over the manifests in `manifests` (valid documents only), with each
/// listed server's tools from `tools` (server id → tool names; unlisted servers are unknown).
pub struct Effective {
    set: EffectiveSet,
}

/// A snapshot of the valid documents of `manifests`.
fn snapshot(manifests: &str) -> Snapshot {
    let parsed = manifest::parse(manifests);
    let entries = parsed.documents.into_iter().map(|d| Entry::local("fuzz.yaml", d.line, d.object));
    Snapshot::build(entries, Vec::new())
}

fn lists(snapshot: &Snapshot, tools: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, ServerTools> {
    tools
        .iter()
        .filter_map(|(id, names)| {
            let server = snapshot.server(id)?;
            let part = server.object.spec.tool_namespace.as_deref().unwrap_or(id);
            let infos = names.iter().map(|n| ToolInfo::named(n)).collect();
            Some((id.clone(), ServerTools::Listed(Arc::new(ToolList::new(part, infos)))))
        })
        .collect()
}

impl Effective {
    /// The set for `profile` with a request scope (the chat request's `mcp` object, without
    /// `enabled`) and the caller's own tool names; `Err` with the reason when there is none.
    pub fn new(
        manifests: &str,
        profile: &str,
        tools: &BTreeMap<String, Vec<String>>,
        scope: Option<&RequestScope>,
        caller_tools: &[&str],
    ) -> Result<Self, String> {
        let snapshot = snapshot(manifests);
        let compiled = CompiledProfile::compile(&snapshot, profile).map_err(|e| e.to_string())?;
        let lists = lists(&snapshot, tools);
        let set = compiled
            .catalog(|id| lists.get(id).cloned().unwrap_or(ServerTools::Unknown))
            .effective(scope, caller_tools)
            .map_err(|e| e.to_string())?;
        Ok(Effective { set })
    }

    /// Every exposed tool: (model-facing name, server id, tool name).
    pub fn tools(&self) -> Vec<(String, String, String)> {
        self.set.tools().map(|(s, t)| (t.name.to_string(), s.id.to_string(), t.tool.name.to_string())).collect()
    }

    /// Where a name as a model writes it goes: (server id, tool name).
    pub fn route(&self, name: &str) -> Option<(String, String)> {
        self.set.route(name).map(|r| (r.server.to_string(), r.tool.to_string()))
    }

    /// One chat round's selection under `chat.toolSelection: relevance` with `max_tools` and
    /// `always_include`, for `messages` (chat messages, oldest first) with `pinned` names. `Err`
    /// when a pattern does not compile.
    pub fn select(
        &self,
        max_tools: u32,
        always_include: Vec<String>,
        messages: &[serde_json::Value],
        pinned: &[String],
    ) -> Result<Offered, String> {
        use crate::api::{ToolSelection, ToolSelectionMode};
        use crate::policy::rank::Turn;
        use crate::policy::select::{self, Pinned, SelectionPolicy, Why};
        let spec = ToolSelection { mode: ToolSelectionMode::Relevance, max_tools: Some(max_tools), always_include };
        let policy = SelectionPolicy::new(Some(&spec), None).map_err(|e| e.to_string())?.ok_or("relevance is on")?;
        let mut pins = Pinned::default();
        for name in pinned {
            pins.pin(name, Why::Found);
        }
        for name in select::called_names(messages) {
            pins.pin(name, Why::Called);
        }
        let texts = select::turns(messages);
        let turns: Vec<Turn<'_>> = texts.iter().map(|(role, text)| Turn { role: *role, text }).collect();
        let selection = self.set.select(&policy, &turns, &pins);
        let offered = selection
            .tools
            .iter()
            .map(|t| {
                (
                    t.name.to_string(),
                    serde_json::to_value(t.why).ok().and_then(|w| w.as_str().map(str::to_string)).unwrap_or_default(),
                )
            })
            .collect();
        Ok(Offered { tools: offered, find_tools: selection.find_tools, of: selection.of })
    }

    /// A `find_tools` call with `arguments` as the model sent them (any JSON): the names found,
    /// or the error code and message the model gets.
    pub fn find_tools(&self, arguments: &serde_json::Value) -> Result<Vec<String>, (String, String)> {
        let groups = self.set.tool_groups(|_| None);
        crate::chat::tool_loop::run_find_tools(&self.set, arguments.as_object(), &groups)
            .map(|(_, found)| found.iter().map(|n| n.to_string()).collect())
            .map_err(|e| (e.code.as_str().to_string(), e.message))
    }

    /// (maxIterations, maxTotalToolCalls) after every layer.
    pub fn loop_budgets(&self) -> (u32, u32) {
        (self.set.loop_budgets.max_iterations, self.set.loop_budgets.max_total_tool_calls)
    }
}

/// What one round offers: (name, why) pairs, whether `find_tools` is offered, and how many tools
/// the set has.
#[derive(Clone, Debug)]
pub struct Offered {
    pub tools: Vec<(String, String)>,
    pub find_tools: bool,
    pub of: usize,
}

// === the chat tool loop ===

/// The chat door's tool loop without I/O: `crate::agent::doors::chat`'s `run_loop` step by step, with
/// the model's answers supplied by the caller and tool calls only recorded.
pub struct ChatLoop {
    effective: Effective,
    caller: Vec<String>,
    injected: Vec<String>,
    upstream_tools: Vec<String>,
    plan: ChoicePlan,
    state: LoopState,
    done: bool,
}

/// What one model answer led to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatStep {
    /// Names of the calls the agent executed (sent to `Agent::call_tool`), in order.
    pub executed: Vec<String>,
    /// How many executed calls were not `function` calls (must be none: only a function call
    /// runs an MCP tool).
    pub executed_non_function: usize,
    /// Names of the calls answered `mcp_policy_denied` without running (not function calls).
    pub denied: Vec<String>,
    /// Names of the calls refused by `maxTotalToolCalls`.
    pub refused: Vec<String>,
    /// Names of the calls left in the answer when it goes back to the caller (`None`: the loop
    /// asks the model again).
    pub returned: Option<Vec<String>>,
    /// A budget note was set.
    pub budget_note: bool,
    /// Upstream requests so far.
    pub iterations: u32,
    /// The answer did not parse as a completion (the door answers 502).
    pub bad_answer: bool,
}

impl ChatLoop {
    /// Starts a completion of the chat request `body` over the profile's effective set, as the
    /// door does: parse, `mcp` options, effective set, tool choice plan, upstream body. `Err`
    /// with the reason the door would refuse the request; `Ok(None)` when `mcp.enabled` is false
    /// (a plain proxy, no loop).
    pub fn start(
        manifests: &str,
        profile: &str,
        tools: &BTreeMap<String, Vec<String>>,
        body: &[u8],
    ) -> Result<Option<Self>, String> {
        let mut request = ChatRequest::from_slice(body).map_err(|e| e.to_string())?;
        let options = McpOptions::parse(request.mcp.take()).map_err(|e| e.to_string())?;
        if !options.enabled {
            return Ok(None);
        }
        let caller: Vec<String> = request.caller_tool_names().into_iter().map(str::to_string).collect();
        let caller_refs: Vec<&str> = caller.iter().map(String::as_str).collect();
        let effective = Effective::new(manifests, profile, tools, options.scope.as_ref(), &caller_refs)?;
        let injected_tools = tool_loop::injected_tools(&effective.set);
        let injected: Vec<String> = injected_tools.iter().filter_map(|t| t.name()).map(str::to_string).collect();
        let snapshot = snapshot(manifests);
        let default_choice = snapshot.profile(profile).and_then(|p| p.object.spec.tool_choice).unwrap_or_default();
        let plan = tool_loop::plan_tool_choice(
            request.tool_choice.as_ref(),
            default_choice,
            &caller_refs.iter().copied().collect(),
            &injected.iter().map(String::as_str).collect(),
        )
        .map_err(|e| e.to_string())?;
        let body = tool_loop::upstream_body(request, injected_tools, Some("fuzz-model"));
        // The request sent upstream never carries the `mcp` object.
        let wire = serde_json::to_value(&body).unwrap_or(Value::Null);
        assert!(wire.get("mcp").is_none(), "the mcp object is forwarded upstream");
        let upstream_tools = body.caller_tool_names().into_iter().map(str::to_string).collect();
        let state = LoopState::new(effective.set.loop_budgets);
        Ok(Some(ChatLoop { effective, caller, injected, upstream_tools, plan, state, done: false }))
    }

    /// The model-facing names the agent injected.
    pub fn injected(&self) -> &[String] {
        &self.injected
    }

    /// The caller's own tool names.
    pub fn caller_tools(&self) -> &[String] {
        &self.caller
    }

    /// Every tool name of the upstream request, in order (the caller's, then the injected).
    pub fn upstream_tools(&self) -> &[String] {
        &self.upstream_tools
    }

    /// The effective set the loop routes with.
    pub fn effective(&self) -> &Effective {
        &self.effective
    }

    /// Whether the loop is over.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Sends the next request (as `run_loop` does) and handles `answer`, the model's reply to it.
    pub fn step(&mut self, answer: &[u8]) -> ChatStep {
        assert!(!self.done, "a step after the loop ended");
        let _choice = self.plan.for_iteration(self.state.iterations());
        self.state.request_sent();
        let mut step = ChatStep { iterations: self.state.iterations(), ..ChatStep::default() };
        let Ok(mut completion) = serde_json::from_slice::<ChatCompletion>(answer) else {
            self.done = true;
            step.bad_answer = true;
            return step;
        };
        let Some(choice) = completion.choices.first_mut() else {
            self.done = true;
            step.returned = Some(Vec::new());
            return step;
        };
        let caller: HashSet<&str> = self.caller.iter().map(String::as_str).collect();
        let set = &self.effective.set;
        let kinds = tool_loop::classify(choice.message.calls(), &caller, |n| set.route(n).is_some());
        let names = |choice: &crate::chat::types::Choice| {
            choice.message.calls().iter().map(|c| c.name().to_string()).collect::<Vec<_>>()
        };
        match self.state.decide(&kinds) {
            Next::Return => {
                self.done = true;
                step.returned = Some(names(choice));
            }
            Next::Stop(_) => {
                tool_loop::strip_executed(choice, &kinds);
                self.done = true;
                step.budget_note = true;
                step.returned = Some(names(choice));
            }
            Next::Execute(round) => {
                let calls = choice.message.calls();
                step.executed = round.run.iter().filter_map(|&i| calls.get(i)).map(|c| c.name().to_string()).collect();
                step.executed_non_function =
                    round.run.iter().filter_map(|&i| calls.get(i)).filter(|c| !c.is_function()).count();
                step.denied = round.denied.iter().filter_map(|&i| calls.get(i)).map(|c| c.name().to_string()).collect();
                step.refused =
                    round.refused.iter().filter_map(|&i| calls.get(i)).map(|c| c.name().to_string()).collect();
                step.budget_note = round.note.is_some();
                if round.then == After::ReturnToCaller {
                    tool_loop::strip_executed(choice, &kinds);
                    self.done = true;
                    step.returned = Some(names(choice));
                }
            }
        }
        step
    }
}

// === the webhook ===

/// What the webhook's lookup answers: fixed inputs, the profile only when it is the one asked
/// for (as a GET of it would), and the servers only with a profile.
struct Fixed(Inputs);

impl Lookup for Fixed {
    async fn fetch(&self, _namespace: &str, profile: Option<&str>) -> Result<Inputs, LookupError> {
        let found = self.0.profile.clone().filter(|p| profile.is_some() && p.metadata.name.as_deref() == profile);
        let servers = if found.is_some() { self.0.servers.clone() } else { Vec::new() };
        Ok(Inputs {
            namespace_labels: self.0.namespace_labels.clone(),
            profile: found,
            servers,
            secrets: Default::default(),
        })
    }
}

/// The webhook's answer to one AdmissionReview body, with the lookup answering `inputs`.
pub enum Review {
    /// Not an AdmissionReview of a Pod with a request (HTTP 400).
    BadRequest,
    /// The review failed (HTTP 500, the failure policy decides), with the error's text.
    Error(String),
    /// The answer, and the request's pod as the webhook read it (namespace from the request),
    /// as JSON.
    Answer { response: Box<AdmissionResponse>, pod: Option<Value> },
}

/// Runs the webhook's review (`webhook::review`, then `inject::mutate`) on `body` as the
/// `/mutate-pods` handler does. The lookup answers at once, so the future is polled to the end
/// here without a runtime. `profile` and `servers` that do not parse as resources are left out.
pub fn webhook_review(
    body: &[u8],
    namespace_labels: BTreeMap<String, String>,
    profile: Option<Value>,
    servers: Vec<Value>,
    native_sidecars: bool,
) -> Review {
    let Ok(incoming) = serde_json::from_slice::<AdmissionReview<Pod>>(body) else { return Review::BadRequest };
    let Ok(request): Result<AdmissionRequest<Pod>, _> = incoming.try_into() else { return Review::BadRequest };
    let pod = request.object.clone().map(|mut pod| {
        if let Some(ns) = request.namespace.clone().filter(|n| !n.is_empty()) {
            pod.metadata.namespace = Some(ns);
        }
        serde_json::to_value(pod).unwrap_or(Value::Null)
    });
    let profile = profile.and_then(|p| serde_json::from_value(p).ok());
    let servers = servers.into_iter().filter_map(|s| serde_json::from_value(s).ok()).collect();
    let inputs = Inputs { namespace_labels, profile, servers, secrets: Default::default() };
    let mut config = InjectConfig::new("agent:fuzz", "spearlet:fuzz");
    config.native_sidecars = native_sidecars;
    match futures::executor::block_on(webhook::review(&Fixed(inputs), &config, request)) {
        Ok(reviewed) => Review::Answer { response: Box::new(reviewed.response), pod },
        Err(error) => Review::Error(crate::telemetry::error_chain(&error)),
    }
}

// === tool output caps and the frame guard ===

/// [`output::cap`] on a `CallToolResult` as JSON: the truncation's (original, limit) bytes.
pub fn cap_output(result: &mut Value, limit: usize) -> Option<(usize, usize)> {
    output::cap(result, limit).map(|t| (t.original_bytes, t.limit_bytes))
}

/// [`output::result_size`].
pub fn result_size(result: &Value) -> usize {
    output::result_size(result)
}

/// The pool's cap on a tool result (its shortcut for small text results included): `None` when
/// `result` is not a `CallToolResult`; else the result as rmcp reads it, the result after the cap
/// (both as JSON), and whether it was cut.
pub fn cap_tool_result(result: &Value, limit: usize) -> Option<Result<(Value, Value, bool), String>> {
    let parsed: rmcp::model::CallToolResult = serde_json::from_value(result.clone()).ok()?;
    let before = serde_json::to_value(&parsed).unwrap_or(Value::Null);
    Some(
        pool::cap_result(parsed, limit, std::time::Duration::ZERO)
            .map(|out| (before, serde_json::to_value(&out.result).unwrap_or(Value::Null), out.truncated.is_some()))
            .map_err(|e| e.to_string()),
    )
}

/// The bytes a [`FrameGuard`] over `input` let through, in reads of the given sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Framed {
    /// Bytes read before the end or the error.
    pub output: Vec<u8>,
    /// The guard failed a read (`InvalidData`).
    pub failed: bool,
    /// The guard's tripped flag.
    pub tripped: bool,
    /// Lines it counted as not JSON.
    pub garbage: u64,
    /// A read after the failure failed too.
    pub failed_after: bool,
}

/// A reader handing out `input` in chunks of the given sizes (cycled; 0 means pending once, then
/// one byte).
struct Chunked<'a> {
    input: &'a [u8],
    sizes: &'a [usize],
    next: usize,
    pending: bool,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let size = if self.sizes.is_empty() { usize::MAX } else { self.sizes[self.next % self.sizes.len()] };
        self.next += 1;
        if size == 0 && !self.pending {
            self.pending = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.pending = false;
        let n = size.max(1).min(buf.remaining()).min(self.input.len());
        let (head, tail) = self.input.split_at(n);
        buf.put_slice(head);
        self.input = tail;
        Poll::Ready(Ok(()))
    }
}

/// Reads `input` through a [`FrameGuard`] of `limit` bytes per line, with the inner reader
/// handing out chunks of `chunks` sizes and the caller's buffer `buffer` bytes long (at least 1).
pub fn frame_guard(input: &[u8], chunks: &[usize], buffer: usize, limit: usize) -> Framed {
    let tripped = Arc::new(AtomicBool::new(false));
    let garbage = Arc::new(AtomicU64::new(0));
    let inner = Chunked { input, sizes: chunks, next: 0, pending: false };
    let mut guard = FrameGuard::new(inner, limit, tripped.clone()).reporting("fuzz".into(), garbage.clone());
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut storage = vec![0u8; buffer.max(1)];
    let mut output = Vec::new();
    let mut failed = false;
    // Each read moves at least one byte or is pending at most once in a row, so this ends.
    let mut pending_in_a_row = 0;
    loop {
        let mut buf = ReadBuf::new(&mut storage);
        match Pin::new(&mut guard).poll_read(&mut cx, &mut buf) {
            Poll::Pending => {
                pending_in_a_row += 1;
                assert!(pending_in_a_row <= 1, "pending twice without progress");
                continue;
            }
            Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
            Poll::Ready(Ok(())) => output.extend_from_slice(buf.filled()),
            Poll::Ready(Err(e)) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
                // AsyncRead's contract: an error comes with no bytes read.
                assert!(buf.filled().is_empty(), "bytes filled with an error");
                failed = true;
                break;
            }
        }
        pending_in_a_row = 0;
    }
    let failed_after = failed && {
        let mut buf = ReadBuf::new(&mut storage);
        matches!(Pin::new(&mut guard).poll_read(&mut cx, &mut buf), Poll::Ready(Err(_)))
    };
    Framed {
        output,
        failed,
        tripped: tripped.load(Ordering::Relaxed),
        garbage: garbage.load(Ordering::Relaxed),
        failed_after,
    }
}

// === resources and prompts ===

/// A client's resource URI read back as (server id, the server's URI), as `/mcp` and gRPC read it.
pub fn parse_resource_id(id: &str) -> Option<(String, String)> {
    crate::policy::items::parse_resource_id(id).map(|(s, u)| (s.to_string(), u.to_string()))
}

/// The aggregated URI of `uri` on `server`.
pub fn resource_id(server: &str, uri: &str) -> String {
    crate::policy::items::resource_id(server, uri)
}

impl Effective {
    /// A client's resource URI decided as every door decides it (`Agent::read_resource`,
    /// `subscribe_resource`, `complete`): parsed into (server id, the server's URI), then the
    /// policy on that URI as it is. `Ok` with the pair the server would be sent; `Err` with the
    /// refusal's reason (`unsafe_uri`, `denied_by:server`, ...) or `not_a_resource`.
    pub fn decide_resource(&self, id: &str) -> Result<(String, String), String> {
        let (server, uri) = crate::policy::items::parse_resource_id(id).ok_or("not_a_resource")?;
        self.set
            .item_decision(server, crate::policy::items::ItemKind::Resource, uri)
            .map_err(|d| d.reason.to_string())?;
        Ok((server.to_string(), uri.to_string()))
    }
}

/// `mcp::oauth::parse_token_response`: `Ok((access_token, expires_in seconds))` or the error text.
pub fn parse_token_response(status: u16, body: &[u8]) -> Result<(String, Option<u64>), String> {
    crate::mcp::oauth::parse_token_response(status, body)
        .map(|t| (t.access_token, t.expires_in.map(|d| d.as_secs())))
        .map_err(|e| e.message)
}

/// `mcp::oauth::request_scopes`.
pub fn request_scopes(asked: &[String], allowed: &[String]) -> Vec<String> {
    crate::mcp::oauth::request_scopes(asked, allowed)
}

/// `mcp::oauth::grant_refusal` over a JSON text of `grant_types_supported` (`None` when it is not
/// JSON).
pub fn grant_refusal(grant_types_supported: &str, grant: &str) -> Option<Option<String>> {
    let value: Value = serde_json::from_str(grant_types_supported).ok()?;
    Some(crate::mcp::oauth::grant_refusal(Some(&value), grant))
}

/// `mcp::oauth::challenge_summary`.
pub fn challenge_summary(challenge: &str) -> String {
    crate::mcp::oauth::challenge_summary(challenge)
}

/// `mcp::oauth::quote`.
pub fn quote(text: &str) -> String {
    crate::mcp::oauth::quote(text)
}

/// `mcp::oauth::authorization_code::read_redirect` of a redirect's query, expecting `state` from
/// `issuer`: ("code", the code), ("stray", "") or ("refused", the message).
pub fn read_redirect(query: &str, state: &str, issuer: &str, iss_supported: bool) -> (&'static str, String) {
    use crate::mcp::oauth::authorization_code::{ExpectedRedirect, Redirect, read_redirect};
    match read_redirect(query, &ExpectedRedirect { state, issuer, iss_supported }) {
        Redirect::Code(code) => ("code", code),
        Redirect::Stray => ("stray", String::new()),
        Redirect::Refused(why) => ("refused", why),
    }
}

/// `mcp::oauth::grant::StoredGrant::parse`: `Ok((its Debug text, refresh token))` or the error.
pub fn parse_grant(bytes: &[u8]) -> Result<(String, Option<String>), String> {
    crate::mcp::oauth::grant::StoredGrant::parse(bytes)
        .map(|g| (format!("{g:?}"), g.refresh_token.clone()))
        .map_err(|e| e.to_string())
}

/// `mcp::oauth::grant_secret` over a grant Secret shaped by whoever may write it: its
/// `allowed-servers` and renewal-claim annotations and its `grant.json`, read for `server` by the
/// agent `holder` at `now`: (whether the grant was handed over, who else holds the renewal, what
/// the condition's presence says of a refusal note).
pub fn grant_secret(
    allowed: Option<&str>,
    claim: Option<&str>,
    refused: Option<&str>,
    data: &[u8],
    (server, holder, now): (&str, &str, u64),
) -> (bool, Option<String>, Option<String>) {
    use crate::api::keys::{ANNOTATION_GRANT_LOGIN_REQUIRED, ANNOTATION_GRANT_RENEWING, GRANT_SECRET_KEY};
    use crate::mcp::oauth::grant_secret::{self, GrantPresence};
    let mut annotations = std::collections::BTreeMap::new();
    for (key, value) in [
        (crate::api::secret_grant::ANNOTATION_ALLOWED_SERVERS, allowed),
        (ANNOTATION_GRANT_RENEWING, claim),
        (ANNOTATION_GRANT_LOGIN_REQUIRED, refused),
    ] {
        if let Some(value) = value {
            annotations.insert(key.to_string(), value.to_string());
        }
    }
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            annotations: Some(annotations),
            ..Default::default()
        },
        data: Some([(GRANT_SECRET_KEY.to_string(), k8s_openapi::ByteString(data.to_vec()))].into()),
        ..Default::default()
    };
    let given = grant_secret::grant_of(&secret, server).is_ok();
    let presence = match grant_secret::presence(secret.metadata.annotations.as_ref()) {
        GrantPresence::LoginRequired(why) => Some(why),
        _ => None,
    };
    (given, grant_secret::claimed_by_other(&secret, holder, now), presence)
}

/// `mcp::login::resource_covers` (`None`: `server` is not a URL).
pub fn resource_covers(resource: &str, server: &str) -> Option<bool> {
    Some(crate::mcp::login::resource_covers(resource, &url::Url::parse(server).ok()?))
}

/// `mcp::login::authorization_server` of a metadata document for the MCP server at `server`:
/// `Ok((authorization endpoint, token endpoint, registration endpoint))` or the refusal;
/// `None` when the document is not a JSON object or `server` not a URL.
pub fn authorization_server(document: &[u8], server: &str) -> Option<Result<(String, String, Option<String>), String>> {
    let Ok(Value::Object(document)) = serde_json::from_slice(document) else { return None };
    let server = url::Url::parse(server).ok()?;
    Some(
        crate::mcp::login::authorization_server(&document, &server)
            .map(|found| {
                (
                    found.authorization_endpoint.to_string(),
                    found.token_endpoint.to_string(),
                    found.registration_endpoint.map(|u| u.to_string()),
                )
            })
            .map_err(|e| e.to_string()),
    )
}

// === pinned tool digests ===

/// The pin digest (`sha256:<hex>`) of a tool as a server lists it: the JSON parsed as rmcp's
/// `Tool` and digested as the agent does (`mcp::pool::tool_info`, `policy::pin::digest`);
/// `None` when rmcp refuses the JSON as a tool.
pub fn tool_digest(tool: &Value) -> Option<String> {
    let tool: rmcp::model::Tool = serde_json::from_value(tool.clone()).ok()?;
    Some(crate::api::pinning::format_digest(&crate::policy::pin::digest(&pool::tool_info(&tool))))
}

// === approval ===

/// What a webhook's answer decides ([`crate::approval::webhook::read_answer`]): the decision
/// (`allow`, `deny`, `timeout`, `error`) and the reason passed on.
pub fn approval_webhook_answer(status: u16, body: &[u8]) -> (&'static str, String) {
    let verdict = crate::approval::webhook::read_answer(status, body);
    (verdict.decision.as_str(), verdict.reason)
}

/// What a 2026-07-28 caller's answer to the approval question decides
/// ([`crate::approval::form::read_input_response`]).
pub fn approval_input_answer(answer: Option<&Value>) -> (&'static str, String) {
    let verdict = crate::approval::form::read_input_response(answer);
    (verdict.decision.as_str(), verdict.reason)
}

/// A state sealed under `key` for the call (`name`, `digest`) until `expires`: asked, or
/// approved carrying `server_state` ([`crate::approval::round::seal`]).
pub fn approval_round_seal(
    key: [u8; 32],
    (name, digest): (&str, &str),
    expires: i64,
    approved: Option<Option<String>>,
) -> String {
    use crate::approval::round::{self, Opened, RoundKey};
    let opened = match approved {
        None => Opened::Asked { asked_at: 0 },
        Some(server_state) => Opened::Approved { server_state },
    };
    round::seal(&RoundKey::from_bytes(key), round::Call { name, digest }, expires, &opened)
}

/// What `state` opens as under `key` for the call at `now` ([`crate::approval::round::open`]):
/// `None`, `Some(None)` (asked), or `Some(Some(server_state))` (approved).
pub fn approval_round_open(
    key: [u8; 32],
    state: &str,
    (name, digest): (&str, &str),
    now: i64,
) -> Option<Option<Option<String>>> {
    use crate::approval::round::{self, Opened, RoundKey};
    match round::open(&RoundKey::from_bytes(key), state, round::Call { name, digest }, now)? {
        Opened::Asked { .. } => Some(None),
        Opened::Approved { server_state } => Some(Some(server_state)),
    }
}

// === secrets ===

/// A held value as a fuzz target gives it: (value, origin, the server it is granted to).
pub type HeldSecret = (String, String, Option<String>);

/// A `Redactor` over held values, built once per input (building is most of a run's cost).
pub struct SecretRedactor(crate::secrets::Redactor);

impl SecretRedactor {
    pub fn new(secrets: &[HeldSecret]) -> Self {
        SecretRedactor(crate::secrets::Redactor::new(secrets.iter().map(|(value, origin, granted_to)| {
            crate::secrets::Secret {
                value: value.clone(),
                origin: origin.as_str().into(),
                granted_to: granted_to.as_deref().map(Into::into),
            }
        })))
    }

    /// `Redactor::redact`, or `Redactor::redact_cut` when `cut`.
    pub fn redact(&self, text: &str, cut: bool) -> String {
        if cut { self.0.redact_cut(text).into_owned() } else { self.0.redact(text).into_owned() }
    }

    /// `Redactor::foreign_in`.
    pub fn foreign_in(&self, text: &str, server: &str) -> Option<String> {
        self.0.foreign_in(text, server).map(str::to_string)
    }
}

/// The spellings `value` is searched in (`secrets::redact`), verbatim first; none when it is
/// shorter than the minimum.
pub fn secret_spellings(value: &str) -> Vec<String> {
    crate::secrets::searched_spellings(value)
}

/// The origin as a marker names it.
pub fn secret_origin(origin: &str) -> String {
    crate::secrets::sanitize_origin(origin).to_string()
}

/// Every detector, compiled once for all runs.
fn all_detectors() -> &'static crate::secrets::DetectorSet {
    static ALL: std::sync::OnceLock<crate::secrets::DetectorSet> = std::sync::OnceLock::new();
    ALL.get_or_init(|| crate::secrets::DetectorSet::new(&crate::secrets::Detector::ALL))
}

/// `DetectorSet::redact` with every detector.
pub fn detectors_redact(text: &str) -> String {
    all_detectors().redact(text).into_owned()
}

/// `DetectorSet::first_in` with every detector: the detector's wire name.
pub fn detectors_first_in(text: &str) -> Option<&'static str> {
    all_detectors().first_in(text).map(|d| d.as_str())
}

// === convert ===

/// What `spearlet convert` made of `text` read as format `format % 4` (design TOML, design JSON,
/// server.json, client config): each server as the YAML it prints (with `origin` in its header)
/// and as the JSON object it is; or the error's text.
pub fn convert_config(
    text: &str,
    format: u8,
    origin: &str,
    secret: bool,
    prefer_package: bool,
) -> Result<Vec<(String, Value)>, String> {
    use crate::convert::{self, Format, Options, Prefer};
    let format =
        [Format::DesignToml, Format::DesignJson, Format::ServerJson, Format::ClientConfig][usize::from(format % 4)];
    let options = Options {
        secret: secret.then(|| "mcp-tokens".to_string()),
        entrypoint: Some(vec!["/server".to_string()]),
        prefer: if prefer_package { Prefer::Package } else { Prefer::Remote },
    };
    let converted = convert::convert(text, format, &options).map_err(|e| e.to_string())?;
    converted
        .iter()
        .map(|c| {
            let yaml = convert::to_yaml(c, origin).map_err(|e| e.to_string())?;
            let json = serde_json::to_value(&c.server).map_err(|e| e.to_string())?;
            Ok((yaml, json))
        })
        .collect()
}
