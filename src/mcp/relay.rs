//! What a server sends during a call, passed on to the caller's door: progress, log messages,
//! and the sampling and elicitation requests of the 2025 revisions (a 2026-07-28 server asks
//! with `InputRequiredResult` instead, see `Continuation`).
//!
//! The pool keeps one session per server for all callers, so every such message is first
//! attributed to one call, or to none:
//! - progress, by its token: each request the pool sends carries rmcp's own token (unique in its
//!   session), which the relay maps back to the caller's own token (or drops the message when
//!   the caller asked for no progress);
//! - a request that arrived on a Streamable HTTP call's own response stream, to that call
//!   (rmcp's `InboundStreamOrigin`);
//! - anything else (stdio, a standalone stream, log messages): to the call in flight when it is
//!   the only call on the session. With several, none can be named, and nothing is guessed: a
//!   caller must never see another's elicitation. The message is then logged (notifications) or
//!   refused as if no caller could answer (requests).
//!
//! A call without a relay (the chat loop, gRPC: no person to ask) still counts as in flight, so
//! that its server's messages are never taken for another call's. A server's requests to such a
//! call are answered as before the relay existed: elicitation declined, sampling refused.
//!
//! Bounds (a server is untrusted): notifications go through a bounded channel per call
//! ([`RELAY_BUFFER`]; when the caller reads slower than the server writes, the surplus is
//! dropped, never queued without bound); a log message's data is cut to [`MAX_LOG_DATA_BYTES`]
//! and a progress message to [`MAX_PROGRESS_MESSAGE_BYTES`].

#![allow(deprecated)] // sampling and logging are deprecated by SEP-2577, yet live in 2025-11-25.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::ErrorData;
use rmcp::model::{
    ClientCapabilities, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationCapability, FormElicitationCapability, InputRequest, InputRequiredResult,
    InputResponses, LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken, RequestId,
    SamplingCapability,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// Messages held per call for its door before more are dropped. A door forwards each as it
/// comes; 64 covers a burst of progress and log lines between two reads.
pub const RELAY_BUFFER: usize = 64;
/// Largest log message data passed on, serialized; longer data becomes a note saying so.
pub const MAX_LOG_DATA_BYTES: usize = 16 * 1024;
/// Largest progress message passed on; cut on a character boundary.
pub const MAX_PROGRESS_MESSAGE_BYTES: usize = 1024;

/// The answer a caller gives to a server's request.
pub type Answer<T> = oneshot::Sender<Result<T, ErrorData>>;

/// One message from a server to the caller of a call.
#[derive(Debug)]
pub enum Relayed {
    /// Progress of the call, with the caller's own token.
    Progress(ProgressNotificationParam),
    /// A log message of the call's server, at or above the caller's level.
    Log(LoggingMessageNotificationParam),
    /// `sampling/createMessage`; the caller answers through the sender.
    Sampling(CreateMessageRequestParams, Answer<CreateMessageResult>),
    /// `elicitation/create`; the caller answers through the sender.
    Elicitation(ElicitRequestParams, Answer<ElicitResult>),
}

/// A caller's end of a call's relay: what its door can take, and where it goes.
#[derive(Clone, Debug)]
pub struct Relay {
    sender: mpsc::Sender<Relayed>,
    /// The caller's `progressToken`; `None`: it asked for no progress.
    progress_token: Option<ProgressToken>,
    /// The caller's `logging/setLevel`; `None`: it set none, and gets no log messages.
    log_level: Option<LoggingLevel>,
    /// The caller declared `sampling`.
    sampling: bool,
    /// The caller declared `elicitation`.
    elicitation: bool,
}

impl Relay {
    /// A relay for one call, and the receiver its door reads.
    pub fn channel(
        progress_token: Option<ProgressToken>,
        log_level: Option<LoggingLevel>,
        sampling: bool,
        elicitation: bool,
    ) -> (Relay, mpsc::Receiver<Relayed>) {
        let (sender, receiver) = mpsc::channel(RELAY_BUFFER);
        (Relay { sender, progress_token, log_level, sampling, elicitation }, receiver)
    }

    /// The caller's log level, if it asked for log messages.
    pub fn log_level(&self) -> Option<LoggingLevel> {
        self.log_level
    }

    /// Passes on the server's progress under the caller's token; dropped when the caller asked
    /// for none or its buffer is full.
    pub fn progress(&self, mut params: ProgressNotificationParam) {
        let Some(token) = &self.progress_token else { return };
        params.progress_token = token.clone();
        if let Some(message) = params.message.as_mut() {
            cut_to(message, MAX_PROGRESS_MESSAGE_BYTES);
        }
        let _ = self.sender.try_send(Relayed::Progress(params));
    }

    /// Passes on a log message at or above the caller's level; dropped otherwise or when the
    /// caller's buffer is full.
    pub fn log(&self, mut params: LoggingMessageNotificationParam) {
        let Some(level) = self.log_level else { return };
        if severity(params.level) < severity(level) {
            return;
        }
        cap_log_data(&mut params.data);
        let _ = self.sender.try_send(Relayed::Log(params));
    }

    /// Asks the caller for a completion; refused when it cannot sample or is gone.
    pub async fn sample(&self, params: CreateMessageRequestParams) -> Result<CreateMessageResult, ErrorData> {
        if !self.sampling {
            return Err(sampling_refused("the caller of this call did not declare sampling"));
        }
        let (answer, answered) = oneshot::channel();
        if self.sender.try_send(Relayed::Sampling(params, answer)).is_err() {
            return Err(sampling_refused("the caller of this call is not reading (gone or busy)"));
        }
        answered.await.unwrap_or_else(|_| Err(sampling_refused("the call ended before its caller answered")))
    }

    /// Asks the caller for input; declined when it cannot elicit, cancelled when it is gone.
    pub async fn elicit(&self, params: ElicitRequestParams) -> Result<ElicitResult, ErrorData> {
        if !self.elicitation {
            return Ok(declined());
        }
        let defaults = params_defaults(&params);
        let (answer, answered) = oneshot::channel();
        if self.sender.try_send(Relayed::Elicitation(params, answer)).is_err() {
            return Ok(ElicitResult::new(ElicitationAction::Cancel));
        }
        let answer = answered.await.unwrap_or_else(|_| Ok(ElicitResult::new(ElicitationAction::Cancel)));
        answer.map(|mut answer| {
            apply_defaults(&defaults, &mut answer);
            answer
        })
    }
}

impl Relay {
    /// What the caller can answer, as the capabilities a 2026-07-28 server is told per request.
    pub fn capabilities(&self) -> ClientCapabilities {
        answering(self.sampling, self.elicitation)
    }

    /// Whether the caller declared elicitation (it can be asked a form).
    pub fn elicits(&self) -> bool {
        self.elicitation
    }

    /// Whether the caller can answer any request at all.
    pub fn answers_requests(&self) -> bool {
        self.sampling || self.elicitation
    }

    /// Answers a 2026-07-28 server's round of input requests by asking the caller each in turn
    /// (the bridge for a 2025 caller, who is asked as a 2025 server would ask it). `None` when
    /// one of them cannot be put to the caller (a kind it did not declare, roots), or it refused
    /// a sampling request: the round cannot be completed, and the call ends as it did before.
    pub async fn answer_round(&self, asked: &InputRequiredResult) -> Option<InputResponses> {
        let mut responses = InputResponses::new();
        for (key, request) in asked.input_requests.iter().flatten() {
            let answer = match request {
                InputRequest::Elicitation(request) if self.elicitation => {
                    serde_json::to_value(self.elicit(request.params.clone()).await.ok()?).ok()?
                }
                InputRequest::CreateMessage(request) if self.sampling => {
                    serde_json::to_value(self.sample(request.params.clone()).await.ok()?).ok()?
                }
                _ => return None,
            };
            responses.insert(key.clone(), answer);
        }
        Some(responses)
    }
}

/// The `default` of each property of a form elicitation's schema (SEP-1034).
fn params_defaults(params: &ElicitRequestParams) -> serde_json::Map<String, Value> {
    let ElicitRequestParams::FormElicitationParams { requested_schema, .. } = params else {
        return serde_json::Map::new();
    };
    let schema = serde_json::to_value(requested_schema).unwrap_or_default();
    let properties = schema.get("properties").and_then(Value::as_object);
    properties
        .into_iter()
        .flatten()
        .filter_map(|(name, property)| property.get("default").map(|d| (name.clone(), d.clone())))
        .collect()
}

/// SEP-1034 as the server's client: an accepted form carries the schema's default for each field
/// the caller left out, as a form shown pre-filled and submitted unchanged would. A caller that
/// declines or cancels sends nothing, and a field it filled is never changed.
fn apply_defaults(defaults: &serde_json::Map<String, Value>, answer: &mut ElicitResult) {
    if answer.action != ElicitationAction::Accept || defaults.is_empty() {
        return;
    }
    let content = answer.content.get_or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Value::Object(content) = content {
        for (name, default) in defaults {
            content.entry(name.clone()).or_insert_with(|| default.clone());
        }
    }
}

/// The client capabilities that say a client answers sampling and (form) elicitation requests.
pub fn answering(sampling: bool, elicitation: bool) -> ClientCapabilities {
    let mut capabilities = ClientCapabilities::default();
    if sampling {
        capabilities.sampling = Some(SamplingCapability::default());
    }
    if elicitation {
        let mut form = ElicitationCapability::default();
        form.form = Some(FormElicitationCapability::default());
        capabilities.elicitation = Some(form);
    }
    capabilities
}

/// A server's sampling request nobody can answer: the MCP spec's "user rejected" code (-1), with
/// why, so the server can tell its own caller.
pub fn sampling_refused(why: &str) -> ErrorData {
    ErrorData::new(rmcp::model::ErrorCode(-1), format!("sampling refused by spearlet: {why}"), None)
}

/// The elicitation answer when nobody can be asked (the agent has no person of its own).
pub fn declined() -> ElicitResult {
    ElicitResult::new(ElicitationAction::Decline)
}

/// The calls in flight on one session, for attributing what its server sends.
#[derive(Debug, Default)]
pub struct InFlight {
    relayed: parking_lot::Mutex<HashMap<u64, Entry>>,
    next_key: AtomicUsize,
    /// Calls in flight that relay nothing (they count for the only-call rule).
    unrelayed: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct Entry {
    request_id: RequestId,
    progress_token: ProgressToken,
    relay: Relay,
}

/// Where a server's message came from, as far as the transport tells.
#[derive(Clone, Copy, Debug)]
pub enum Origin<'a> {
    /// It arrived on the response stream of this request of ours.
    Request(&'a RequestId),
    /// Nothing ties it to a request.
    Unknown,
}

impl InFlight {
    /// Registers a relaying call sent as `request_id` with rmcp's `progress_token`, until the
    /// guard drops.
    pub fn enter(self: &Arc<Self>, request_id: RequestId, progress_token: ProgressToken, relay: Relay) -> CallGuard {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed) as u64;
        self.relayed.lock().insert(key, Entry { request_id, progress_token, relay });
        CallGuard { calls: self.clone(), key: Some(key) }
    }

    /// Counts a call that relays nothing, until the guard drops.
    pub fn enter_unrelayed(self: &Arc<Self>) -> CallGuard {
        self.unrelayed.fetch_add(1, Ordering::AcqRel);
        CallGuard { calls: self.clone(), key: None }
    }

    /// The relay of the call whose request carried `token`.
    pub fn by_progress_token(&self, token: &ProgressToken) -> Option<Relay> {
        self.relayed.lock().values().find(|e| &e.progress_token == token).map(|e| e.relay.clone())
    }

    /// The relay of the call a message from `origin` belongs to, if one can be named.
    pub fn attribute(&self, origin: Origin<'_>) -> Option<Relay> {
        let relayed = self.relayed.lock();
        match origin {
            Origin::Request(id) => relayed.values().find(|e| &e.request_id == id).map(|e| e.relay.clone()),
            Origin::Unknown => {
                let only = relayed.len() == 1 && self.unrelayed.load(Ordering::Acquire) == 0;
                only.then(|| relayed.values().next().map(|e| e.relay.clone())).flatten()
            }
        }
    }
}

/// A call's place in [`InFlight`]; dropping it ends the call there.
#[derive(Debug)]
pub struct CallGuard {
    calls: Arc<InFlight>,
    key: Option<u64>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        match self.key {
            Some(key) => {
                self.calls.relayed.lock().remove(&key);
            }
            None => {
                self.calls.unrelayed.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// Severity order of the MCP log levels (RFC 5424's, lowest first).
pub fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// Replaces log data longer than [`MAX_LOG_DATA_BYTES`] (serialized) by a note of its size.
fn cap_log_data(data: &mut Value) {
    let size = match data {
        Value::String(text) => text.len(),
        Value::Null | Value::Bool(_) | Value::Number(_) => return,
        _ => serde_json::to_vec(data).map_or(usize::MAX, |bytes| bytes.len()),
    };
    if size > MAX_LOG_DATA_BYTES {
        if let Value::String(text) = data {
            cut_to(text, MAX_LOG_DATA_BYTES);
            text.push_str(" …[cut by spearlet]");
        } else {
            *data =
                Value::String(format!("[{size} bytes of log data, over spearlet's {MAX_LOG_DATA_BYTES}: not relayed]"));
        }
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn cut_to(text: &mut String, max: usize) {
    text.truncate(text.floor_char_boundary(max));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(token: i64, message: Option<String>) -> ProgressNotificationParam {
        let mut params = ProgressNotificationParam::new(ProgressToken(rmcp::model::NumberOrString::Number(token)), 1.0);
        params.message = message;
        params
    }

    fn log(level: LoggingLevel, data: Value) -> LoggingMessageNotificationParam {
        LoggingMessageNotificationParam::new(level, data)
    }

    fn token(name: &str) -> ProgressToken {
        ProgressToken(rmcp::model::NumberOrString::String(name.into()))
    }

    #[test]
    fn progress_goes_to_the_call_that_sent_the_token_under_the_callers_token() {
        let calls = Arc::new(InFlight::default());
        let (a, mut a_rx) = Relay::channel(Some(token("caller-a")), None, false, false);
        let (b, mut b_rx) = Relay::channel(Some(token("caller-b")), None, false, false);
        let _a = calls.enter(RequestId::Number(1), ProgressToken(rmcp::model::NumberOrString::Number(1)), a);
        let _b = calls.enter(RequestId::Number(2), ProgressToken(rmcp::model::NumberOrString::Number(2)), b);
        let relay = calls.by_progress_token(&ProgressToken(rmcp::model::NumberOrString::Number(2))).expect("call b");
        relay.progress(progress(2, Some("x".repeat(5000))));
        match b_rx.try_recv() {
            Ok(Relayed::Progress(p)) => {
                assert_eq!(p.progress_token, token("caller-b"));
                assert_eq!(p.message.map(|m| m.len()), Some(MAX_PROGRESS_MESSAGE_BYTES));
            }
            other => panic!("expected progress for b, got {other:?}"),
        }
        assert!(a_rx.try_recv().is_err(), "call a got b's progress");
        assert!(calls.by_progress_token(&ProgressToken(rmcp::model::NumberOrString::Number(3))).is_none());
    }

    #[test]
    fn a_caller_that_asked_no_progress_gets_none() {
        let (relay, mut rx) = Relay::channel(None, None, false, false);
        relay.progress(progress(1, None));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn an_unattributable_message_goes_to_no_call() {
        let calls = Arc::new(InFlight::default());
        let (a, _a_rx) = Relay::channel(None, None, true, true);
        let (b, _b_rx) = Relay::channel(None, None, true, true);
        let guard_a = calls.enter(RequestId::Number(1), ProgressToken(rmcp::model::NumberOrString::Number(1)), a);
        assert!(calls.attribute(Origin::Unknown).is_some(), "the only call in flight is named");
        let guard_b = calls.enter(RequestId::Number(2), ProgressToken(rmcp::model::NumberOrString::Number(2)), b);
        assert!(calls.attribute(Origin::Unknown).is_none(), "two calls: no guess");
        assert!(calls.attribute(Origin::Request(&RequestId::Number(2))).is_some(), "the stream names b");
        drop(guard_b);
        let chat = calls.enter_unrelayed();
        assert!(calls.attribute(Origin::Unknown).is_none(), "a chat-loop call is in flight too: no guess");
        drop(chat);
        assert!(calls.attribute(Origin::Unknown).is_some());
        drop(guard_a);
        assert!(calls.attribute(Origin::Unknown).is_none(), "no call in flight");
    }

    #[test]
    fn logs_below_the_callers_level_or_without_one_are_dropped_and_huge_data_is_cut() {
        let (relay, mut rx) = Relay::channel(None, Some(LoggingLevel::Warning), false, false);
        relay.log(log(LoggingLevel::Info, Value::from("quiet")));
        assert!(rx.try_recv().is_err());
        relay.log(log(LoggingLevel::Error, serde_json::json!({"blob": "y".repeat(100_000)})));
        match rx.try_recv() {
            Ok(Relayed::Log(l)) => {
                let text = l.data.as_str().expect("a note");
                assert!(text.contains("not relayed") && text.len() < 200, "{text}");
            }
            other => panic!("expected a log, got {other:?}"),
        }
        relay.log(log(LoggingLevel::Error, Value::from("é".repeat(20_000))));
        match rx.try_recv() {
            Ok(Relayed::Log(l)) => assert!(l.data.as_str().is_some_and(|t| t.len() <= MAX_LOG_DATA_BYTES + 32)),
            other => panic!("expected a log, got {other:?}"),
        }
        let (silent, mut silent_rx) = Relay::channel(None, None, false, false);
        silent.log(log(LoggingLevel::Emergency, Value::from("x")));
        assert!(silent_rx.try_recv().is_err(), "no setLevel: no logs");
    }

    #[test]
    fn a_flood_is_bounded_by_the_buffer() {
        let (relay, mut rx) = Relay::channel(Some(token("t")), Some(LoggingLevel::Debug), false, false);
        for _ in 0..10_000 {
            relay.progress(progress(1, None));
            relay.log(log(LoggingLevel::Debug, Value::from("spam")));
        }
        let mut held = 0;
        while rx.try_recv().is_ok() {
            held += 1;
        }
        assert_eq!(held, RELAY_BUFFER);
    }

    #[tokio::test]
    async fn an_accepted_form_gets_the_schemas_defaults_for_what_the_caller_left_out() {
        let params: ElicitRequestParams = serde_json::from_value(serde_json::json!({
            "mode": "form", "message": "defaults?",
            "requestedSchema": {"type": "object", "properties": {
                "name": {"type": "string", "default": "John Doe"},
                "age": {"type": "integer", "default": 30},
                "score": {"type": "number", "default": 95.5},
                "status": {"type": "string", "enum": ["active", "inactive"], "default": "active"},
                "verified": {"type": "boolean", "default": true},
                "nickname": {"type": "string"}
            }}
        }))
        .expect("params");
        let (relay, mut rx) = Relay::channel(None, None, false, true);
        let answering = tokio::spawn(async move {
            let Some(Relayed::Elicitation(_, answer)) = rx.recv().await else { panic!("no elicitation") };
            let accepted = ElicitResult::new(ElicitationAction::Accept).with_content(serde_json::json!({"age": 41}));
            let _ = answer.send(Ok(accepted));
            let Some(Relayed::Elicitation(_, answer)) = rx.recv().await else { panic!("no elicitation") };
            let _ = answer.send(Ok(ElicitResult::new(ElicitationAction::Decline)));
        });
        let accepted = relay.elicit(params.clone()).await.expect("answer");
        assert_eq!(
            accepted.content,
            Some(
                serde_json::json!({"name": "John Doe", "age": 41, "score": 95.5, "status": "active", "verified": true})
            )
        );
        let declined = relay.elicit(params).await.expect("answer");
        assert_eq!((declined.action, declined.content), (ElicitationAction::Decline, None));
        answering.await.expect("the caller");
    }

    #[tokio::test]
    async fn requests_to_a_caller_that_cannot_answer_are_refused_and_a_gone_caller_cancels() {
        let (relay, rx) = Relay::channel(None, None, false, false);
        let params: CreateMessageRequestParams = serde_json::from_value(serde_json::json!({
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 10
        }))
        .expect("params");
        let refused = relay.sample(params.clone()).await.expect_err("no sampling declared");
        assert_eq!(refused.code.0, -1);
        let elicit: ElicitRequestParams = serde_json::from_value(serde_json::json!({
            "message": "name?", "requestedSchema": {"type": "object", "properties": {}}
        }))
        .expect("params");
        assert_eq!(relay.elicit(elicit.clone()).await.expect("answer").action, ElicitationAction::Decline);
        drop(rx);
        let (able, able_rx) = Relay::channel(None, None, true, true);
        drop(able_rx);
        assert!(able.sample(params).await.is_err());
        assert_eq!(able.elicit(elicit).await.expect("answer").action, ElicitationAction::Cancel);
    }
}
