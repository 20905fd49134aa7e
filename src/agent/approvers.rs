//! Asking the approvers of a call that needs approval (`McpProfile.spec.approval`), in order;
//! the first that can be asked decides. The questions and the reading of answers are pure
//! (`crate::approval`); this module sends them and waits.
//!
//! - **caller**, 2025-11-25 session that declared elicitation: the form goes out through the
//!   call's relay (`elicitation/create` on the caller's session), and the agent waits.
//! - **caller**, 2026-07-28 request that declared elicitation: the form goes back as the call's
//!   `InputRequiredResult`, with a state the agent seals (`approval::round`); the caller's retry
//!   carries the answer. Nothing waits in between.
//! - **webhook**: a signed POST through [`OutboundHttp`] (no redirects, no link-local or metadata
//!   addresses, loopback only when the URL names loopback), one client per URL, kept.
//! - **kubernetes** (cluster mode): an McpApproval created in the pod's namespace with the agent's
//!   own client, then watched until it is decided (`kubectl spear approve` / `deny`) or the wait
//!   ends; the operator deletes it later.
//!
//! The wait is the profile's `timeoutSeconds` or what is left of the call's time budget,
//! whichever is shorter; running out denies (`timeout`). A webhook whose signing key is
//! configured but absent from the environment denies (`error`): an unsigned request would be
//! refused by a careful receiver and accepted by a careless one, and neither is what was asked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rmcp::model::{ElicitRequest, InputRequest, InputRequests, InputRequiredResult};

use super::audit::{ApprovalRecord, Door};
use super::core::CallContext;
use crate::api::{ApprovalMode, ApproverKind, ProfileApproval, WebhookApprover};
use crate::approval::round::{self, Opened, RoundKey};
use crate::approval::{Decision, Subject, Verdict, form, webhook};
use crate::mcp::outbound_http::OutboundHttp;
use crate::mcp::{Continuation, ErrorCode, McpError, Relay, ToolOutput};

/// Most webhook clients kept (one per URL); past it, the cache starts over.
const MAX_WEBHOOK_CLIENTS: usize = 64;

/// What approval lets through: the call as the caller sent it, or (approved by a 2026-07-28
/// caller in an input round) with the approval taken out of what the server gets.
#[derive(Debug)]
pub(crate) enum Approved {
    /// Approved by an approver that holds no round (a webhook, a 2025 session).
    AsSent,
    /// Approved in an input round: the server gets this continuation, and its own rounds are
    /// sealed with the approval.
    InRound(Continuation),
}

/// The approval step's outcome: approved, the question for a 2026-07-28 caller (the call's
/// result for now), or the refusal; with the decision for the audit line and metrics.
pub(crate) type Step = (Result<Result<Approved, ToolOutput>, McpError>, Option<ApprovalRecord>);

/// How the call's caller can be asked.
#[derive(Clone, Copy, Debug)]
pub(crate) enum CallerChannel<'a> {
    /// It cannot (chat, gRPC, or no relay).
    None,
    /// A 2025-11-25 session's relay.
    Session(&'a Relay),
    /// A 2026-07-28 request and what it sent back.
    Round(&'a Continuation),
}

/// What the chain came to.
#[derive(Debug)]
pub(crate) enum Asked {
    /// An approver decided (`allow` runs the call).
    Decided { approver: ApproverKind, verdict: Verdict, latency: Duration },
    /// Approved earlier in this 2026-07-28 call (a later round of the server's own): the server
    /// gets its own state back.
    ApprovedEarlier { server_state: Option<String> },
    /// The question goes back to a 2026-07-28 caller as the call's result.
    Question(Arc<InputRequiredResult>),
    /// No approver can be asked; why, per approver.
    Nobody(String),
}

/// The agent's approvers: who it is (for webhook requests), its sealing key, its webhook clients.
#[derive(Debug)]
pub(crate) struct Approvers {
    origin: webhook::Origin,
    /// `None` only when the OS gave no randomness: 2026-07-28 callers are then not asked.
    round_key: Option<RoundKey>,
    clients: Mutex<HashMap<String, Arc<OutboundHttp>>>,
    /// The Kubernetes API (cluster mode): where McpApprovals go.
    kube: Option<KubeClient>,
    /// `--egress-deny-cidrs`, for webhooks.
    egress: crate::egress::AddressDenyList,
    /// Where the signing keys read are held (for redaction).
    secrets: Arc<crate::secrets::HeldSecrets>,
}

/// The agent's Kubernetes client, for McpApprovals (`kube::Client` has no `Debug`).
#[derive(Clone)]
pub(crate) struct KubeClient(pub(crate) kube::Client);

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClient(..)")
    }
}

impl Approvers {
    /// Approvers for an agent at `origin`, with its Kubernetes client in cluster mode.
    pub(crate) fn new(
        origin: webhook::Origin,
        kube: Option<KubeClient>,
        egress: crate::egress::AddressDenyList,
        secrets: Arc<crate::secrets::HeldSecrets>,
    ) -> Self {
        let round_key = RoundKey::random()
            .inspect_err(|e| tracing::error!(error = %e, "no randomness for sealing approval rounds; 2026-07-28 callers cannot approve"))
            .ok();
        Approvers { origin, round_key, clients: Mutex::new(HashMap::new()), kube, egress, secrets }
    }

    /// The approval step of a call that needs approval under `mode`: asks `chain`'s approvers
    /// (the profile's `spec.approval`) within `wait`.
    pub(crate) async fn approve(
        &self,
        chain: Option<&ProfileApproval>,
        subject: &Subject<'_>,
        mode: ApprovalMode,
        context: &CallContext<'_>,
        wait: Duration,
    ) -> Step {
        let needs = match mode {
            ApprovalMode::DestructiveHint => {
                " (approvalPolicy destructiveHint: its annotations do not say readOnlyHint or destructiveHint: false)"
            }
            _ => " (approvalPolicy)",
        };
        let (tool, server) = (subject.tool, subject.server);
        let Some(chain) = chain.filter(|c| !c.approvers.is_empty()) else {
            let message = format!(
                "'{tool}' on '{server}' needs approval{needs} and no approver is configured (the profile's spec.approval)"
            );
            return (Err(McpError::new(ErrorCode::McpApprovalRequired, message)), None);
        };
        let door = door_name(context.door);
        let caller = match (context.input, context.relay) {
            (Some(continuation), _) => CallerChannel::Round(continuation),
            (None, Some(relay)) => CallerChannel::Session(relay),
            (None, None) => CallerChannel::None,
        };
        match self.ask(chain, subject, door, caller, wait).await {
            Asked::Question(question) => {
                let result = McpError::new(
                    ErrorCode::McpApprovalRequired,
                    format!("'{tool}' on '{server}' waits for the caller's approval"),
                )
                .to_call_tool_result();
                let output = ToolOutput {
                    result,
                    truncated: None,
                    bytes: 0,
                    latency: Duration::ZERO,
                    input_required: Some(question),
                };
                (Ok(Err(output)), None)
            }
            Asked::ApprovedEarlier { server_state } => {
                let (responses, declared) = match caller {
                    CallerChannel::Round(c) => (c.input_responses.clone(), c.client_capabilities.clone()),
                    _ => (None, None),
                };
                let mut continuation = Continuation::new(None, server_state, None);
                continuation.input_responses = responses.map(|mut r| {
                    r.remove(round::INPUT_KEY);
                    r
                });
                continuation.client_capabilities = declared;
                (Ok(Ok(Approved::InRound(continuation))), None)
            }
            Asked::Nobody(why) => {
                let message =
                    format!("'{tool}' on '{server}' needs approval{needs} and no approver can be asked: {why}");
                (Err(McpError::new(ErrorCode::McpApprovalRequired, message)), None)
            }
            Asked::Decided { approver, verdict, latency } => {
                let record = ApprovalRecord {
                    approver: approver.as_str(),
                    decision: verdict.decision.as_str(),
                    latency_ms: super::audit::millis(latency),
                    reason: verdict.reason.clone(),
                };
                if verdict.decision != Decision::Allow {
                    let message = format!(
                        "'{tool}' on '{server}' was not approved by the {} approver ({}): {}",
                        approver.as_str(),
                        verdict.decision.as_str(),
                        verdict.reason
                    );
                    return (Err(McpError::new(ErrorCode::McpApprovalDenied, message)), Some(record));
                }
                let approved = match caller {
                    // Approved in a round: the server starts its own rounds afresh, with the
                    // caller's capabilities.
                    CallerChannel::Round(c) if approver == ApproverKind::Caller => {
                        let mut continuation = Continuation::new(None, None, None);
                        continuation.client_capabilities = c.client_capabilities.clone();
                        Approved::InRound(continuation)
                    }
                    _ => Approved::AsSent,
                };
                (Ok(Ok(approved)), Some(record))
            }
        }
    }

    /// Asks `chain`'s approvers about `subject` in order, waiting at most `wait`.
    pub(crate) async fn ask(
        &self,
        chain: &ProfileApproval,
        subject: &Subject<'_>,
        door: &str,
        caller: CallerChannel<'_>,
        wait: Duration,
    ) -> Asked {
        let wait = wait.min(chain.timeout());
        let mut skipped: Vec<String> = Vec::new();
        for approver in &chain.approvers {
            match (approver.kind(), caller) {
                (Some(ApproverKind::Caller), CallerChannel::Session(relay)) if relay.elicits() => {
                    return ask_session(relay, subject, wait).await;
                }
                (Some(ApproverKind::Caller), CallerChannel::Round(continuation))
                    if declares_elicitation(continuation) && self.round_key.is_some() =>
                {
                    if let Some(key) = &self.round_key {
                        return ask_round(key, continuation, subject, wait);
                    }
                }
                (Some(ApproverKind::Caller), _) => {
                    let why = match caller {
                        CallerChannel::Round(c) if declares_elicitation(c) => {
                            "the agent cannot seal an input round (no randomness at start)".to_string()
                        }
                        _ => caller_cannot_answer(door, caller),
                    };
                    skipped.push(format!("caller: {why}"));
                }
                (Some(ApproverKind::Webhook), _) => {
                    let Some(hook) = &approver.webhook else { continue };
                    let started = Instant::now();
                    let verdict = self.ask_webhook(hook, subject, door, wait).await;
                    return Asked::Decided { approver: ApproverKind::Webhook, verdict, latency: started.elapsed() };
                }
                (Some(ApproverKind::Kubernetes), _) => match (&self.kube, self.origin.namespace.as_deref()) {
                    (Some(KubeClient(client)), Some(namespace)) => {
                        let started = Instant::now();
                        let verdict = self.ask_kubernetes(client, namespace, subject, door, wait).await;
                        let latency = started.elapsed();
                        return Asked::Decided { approver: ApproverKind::Kubernetes, verdict, latency };
                    }
                    _ => skipped.push("kubernetes: no cluster (local mode)".to_string()),
                },
                (None, _) => skipped.push("an approver that sets none or several kinds".to_string()),
            }
        }
        if skipped.is_empty() {
            skipped.push("spec.approval of the profile lists no approver".to_string());
        }
        Asked::Nobody(skipped.join("; "))
    }

    /// A server's request for input during a call approved through rounds: its state, sealed
    /// with the approval, so the caller's next retry is not asked again.
    pub(crate) fn seal_server_round(
        &self,
        name: &str,
        digest: &str,
        asked: &InputRequiredResult,
        valid_for: Duration,
    ) -> InputRequiredResult {
        let mut sealed = asked.clone();
        let Some(key) = &self.round_key else { return sealed };
        let call = round::Call { name, digest };
        let expires = jiff::Timestamp::now()
            .as_second()
            .saturating_add(i64::try_from(valid_for.as_secs()).unwrap_or(i64::MAX).max(1));
        let approved = Opened::Approved { server_state: asked.request_state.clone() };
        sealed.request_state = Some(round::seal(key, call, expires, &approved));
        sealed
    }

    async fn ask_webhook(&self, hook: &WebhookApprover, subject: &Subject<'_>, door: &str, wait: Duration) -> Verdict {
        let Ok(url) = url::Url::parse(&hook.url) else {
            return Verdict::error("the approval webhook's URL is not valid");
        };
        let mut headers = Vec::new();
        let request =
            webhook::Request::new(subject, &self.origin, door, hook.include_arguments, jiff::Timestamp::now(), wait);
        let body = match serde_json::to_vec(&request) {
            Ok(body) => body,
            Err(e) => return Verdict::error(format!("the approval request could not be encoded: {e}")),
        };
        if let Some(env) = hook.signing_key_env() {
            match std::env::var_os(&env) {
                Some(key) if !key.is_empty() => {
                    if let Some(text) = key.to_str() {
                        self.secrets.hold(&format!("approval signing key {env}"), text, None);
                    }
                    headers.push((webhook::SIGNATURE_HEADER, webhook::signature(key.as_encoded_bytes(), &body)));
                }
                _ => {
                    return Verdict::error(format!(
                        "the approval webhook's signing key is not available: set the env var {env} (in a pod, \
                         the Secret must allow this profile with the annotation mcp.spear.dev/allowed-profiles)"
                    ));
                }
            }
        }
        let client = self.client(&hook.url);
        let where_to = format!("{}{}", url.origin().ascii_serialization(), url.path());
        match tokio::time::timeout(wait, client.post_json(&url, body, &headers, wait)).await {
            Err(_) => Verdict {
                decision: Decision::Timeout,
                reason: format!("the approval webhook at {where_to} did not answer in {} s", wait.as_secs()),
            },
            Ok(Err(e)) => {
                tracing::debug!(error = %e.message, webhook = %where_to, "approval webhook not reached");
                if e.message.contains("timed out") {
                    return Verdict {
                        decision: Decision::Timeout,
                        reason: format!("the approval webhook at {where_to} did not answer in {} s", wait.as_secs()),
                    };
                }
                let refused = e.lasting || e.message.contains("resolves only to addresses");
                let why = if refused {
                    "its address is refused by the agent's outbound policy"
                } else {
                    "it could not be reached"
                };
                Verdict::error(format!("the approval webhook at {where_to} was not asked: {why}"))
            }
            Ok(Ok(answer)) => webhook::read_answer(answer.status, &answer.body),
        }
    }

    async fn ask_kubernetes(
        &self,
        client: &kube::Client,
        namespace: &str,
        subject: &Subject<'_>,
        door: &str,
        wait: Duration,
    ) -> Verdict {
        use crate::approval::kubernetes;
        use kube::ResourceExt as _;
        let api: kube::Api<crate::api::McpApproval> = kube::Api::namespaced(client.clone(), namespace);
        let asked = kubernetes::question(subject, &self.origin, door, jiff::Timestamp::now(), wait);
        let created = match tokio::time::timeout(wait, api.create(&kube::api::PostParams::default(), &asked)).await {
            Err(_) => {
                return Verdict {
                    decision: Decision::Timeout,
                    reason: "creating the McpApproval took the whole wait".into(),
                };
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, %namespace, "McpApproval not created");
                return Verdict::error(format!(
                    "the McpApproval could not be created in namespace {namespace} ({}): does the agent's role allow \
                     create on mcpapprovals?",
                    kube_reason(&e)
                ));
            }
            Ok(Ok(created)) => created,
        };
        let name = created.name_any();
        tracing::info!(approval = %name, %namespace, server = subject.server, tool = subject.tool, "waiting for kubectl spear approve or deny");
        let decided = |object: Option<&crate::api::McpApproval>| object.and_then(kubernetes::read).is_some();
        let watched = kube::runtime::wait::await_condition(api, &name, decided);
        match tokio::time::timeout(wait, watched).await {
            Err(_) => Verdict {
                decision: Decision::Timeout,
                reason: format!("no decision on McpApproval {namespace}/{name} in {} s", wait.as_secs()),
            },
            Ok(Err(e)) => Verdict::error(format!("watching McpApproval {namespace}/{name} failed: {e}")),
            Ok(Ok(Some(object))) => kubernetes::read(&object)
                .unwrap_or_else(|| Verdict::error(format!("McpApproval {namespace}/{name} has no decision"))),
            Ok(Ok(None)) => Verdict::error(format!("McpApproval {namespace}/{name} was deleted before a decision")),
        }
    }

    fn client(&self, url: &str) -> Arc<OutboundHttp> {
        let mut clients = self.clients.lock();
        if let Some(client) = clients.get(url) {
            return client.clone();
        }
        if clients.len() >= MAX_WEBHOOK_CLIENTS {
            clients.clear();
        }
        let client = Arc::new(OutboundHttp::anchored(url, "approval requests", &self.egress));
        clients.insert(url.to_string(), client.clone());
        client
    }
}

/// The caller approver of a 2025-11-25 session: the form through its relay, waited for.
async fn ask_session(relay: &Relay, subject: &Subject<'_>, wait: Duration) -> Asked {
    let started = Instant::now();
    let verdict = match tokio::time::timeout(wait, relay.elicit(form::question(subject))).await {
        Ok(Ok(answer)) => form::read_answer(&answer),
        Ok(Err(e)) => Verdict::error(crate::approval::clean_reason(&format!(
            "the caller's client answered the approval form with an error: {}",
            e.message
        ))),
        Err(_) => Verdict {
            decision: Decision::Timeout,
            reason: format!("the caller did not answer the approval form in {} s", wait.as_secs()),
        },
    };
    Asked::Decided { approver: ApproverKind::Caller, verdict, latency: started.elapsed() }
}

/// The caller approver of a 2026-07-28 request: the answer to an earlier question, an approval
/// earlier in this call, or a new question.
fn ask_round(key: &RoundKey, continuation: &Continuation, subject: &Subject<'_>, wait: Duration) -> Asked {
    let digest = crate::approval::argument_digest(subject.arguments);
    let call = round::Call { name: subject.name, digest: &digest };
    let now = jiff::Timestamp::now();
    let opened = continuation.request_state.as_deref().and_then(|state| round::open(key, state, call, now.as_second()));
    match opened {
        Some(Opened::Asked { asked_at }) => {
            let answer = continuation.input_responses.as_ref().and_then(|r| r.get(round::INPUT_KEY));
            let verdict = form::read_input_response(answer);
            let waited = u64::try_from(now.as_millisecond().saturating_sub(asked_at)).unwrap_or_default();
            Asked::Decided { approver: ApproverKind::Caller, verdict, latency: Duration::from_millis(waited) }
        }
        Some(Opened::Approved { server_state }) => Asked::ApprovedEarlier { server_state },
        None => {
            // Whole seconds, rounded up: a wait under a second still lets the caller answer.
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let expires = now.as_second().saturating_add(i64::try_from(seconds).unwrap_or(i64::MAX).max(1));
            let asked = Opened::Asked { asked_at: now.as_millisecond() };
            let state = round::seal(key, call, expires, &asked);
            let question = InputRequest::Elicitation(ElicitRequest::new(form::question(subject)));
            let requests: InputRequests = [(round::INPUT_KEY.to_string(), question)].into_iter().collect();
            Asked::Question(Arc::new(InputRequiredResult::new(Some(requests), Some(state))))
        }
    }
}

/// The API server's reason for refusing a request (its status message, or the error's kind).
fn kube_reason(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => crate::approval::clean_reason(&status.message),
        other => crate::approval::clean_reason(&other.to_string()),
    }
}

fn door_name(door: Door) -> &'static str {
    match door {
        Door::Chat => "chat",
        Door::Mcp => "mcp",
        Door::Grpc => "grpc",
    }
}

fn declares_elicitation(continuation: &Continuation) -> bool {
    continuation.client_capabilities.as_ref().is_some_and(|c| c.elicitation.is_some())
}

fn caller_cannot_answer(door: &str, caller: CallerChannel<'_>) -> String {
    match caller {
        CallerChannel::None if door != "mcp" => format!("the {door} door has no caller to ask"),
        CallerChannel::None => "this call has no session to ask".to_string(),
        CallerChannel::Session(_) => "the caller's session did not declare elicitation".to_string(),
        CallerChannel::Round(_) => "the caller's request did not declare elicitation".to_string(),
    }
}
