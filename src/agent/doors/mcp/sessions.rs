//! `/mcp`'s 2025-era sessions, kept by the agent: one small record per session behind rmcp's
//! Streamable HTTP service, which still does the HTTP side (the checks, 404 for an unknown id,
//! `DELETE`, SSE framing and keep-alives). rmcp calls in through its `SessionManager` trait; no
//! rmcp task, channel or service lives per session, only per request and per open stream.
//!
//! ```text
//! POST initialize ─▶ create_session: a record ─▶ rmcp's worker runs the handshake over an
//!                    InitTransport (the answer fills the record), then ends
//! POST request    ─▶ create_stream: one rmcp service for this request (serve_directly, the
//!                    session's revision and capabilities as its peer) over a RequestTransport:
//!                    in: the request, then the client's answers to what it asked, its cancel;
//!                    out: the request's SSE stream (its asks renumbered per session)
//! POST answer / notification ─▶ accept_message: to the request it belongs to
//! GET             ─▶ create_standalone_stream: the session's one notification stream
//! DELETE          ─▶ close_session
//! idle: a lookup finds a session gone at its idle time; [`SessionTable::expire`] frees the
//!       memory of the rest every idle / 4
//! ```
//!
//! Decisions:
//! - A record is a few hundred bytes: rmcp's own sessions cost about 58 KiB each (seven channels,
//!   three tasks; `benches/sessions.rs`), and an agent may hold thousands.
//! - rmcp's worker ends after the handshake and then closes its session through this manager;
//!   that one close is recognised ([`Session::worker_done`]) and kept from ending the session.
//! - A session is in use while a request of it runs or its stream is open: idle time counts
//!   from the end of the last (a call that runs for an hour keeps its session).
//! - Streams resume only within a request still running or its stream's cached tail: the events
//!   of a request stream carry ids; a client that lost the stream gets the rest after its
//!   `Last-Event-ID`. Once the request ended, its stream is gone (rmcp's own sessions kept it).

#![allow(deprecated)] // logging/setLevel: deprecated by SEP-2577, live in 2025-11-25.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::Stream;
use rmcp::model::{
    ClientCapabilities, ClientJsonRpcMessage, ClientNotification, ClientRequest, Implementation,
    InitializeRequestParams, LoggingLevel, ProtocolVersion, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::Transport;
use rmcp::transport::common::server_side_http::{ServerSseMessage, SessionId};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::{RoleServer, ServerHandler};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Messages one request's SSE stream holds before its handler waits: rmcp's own per-request buffer.
const STREAM_BUFFER: usize = 16;
/// Notifications the standalone stream holds before a sender waits (then times out, see
/// `endpoint::NOTIFY_TIMEOUT`).
const NOTIFY_BUFFER: usize = 32;
/// The reconnect delay a request stream's priming event asks for: rmcp's default `sse_retry`,
/// which its `GET` streams prime with too.
const PRIMING_RETRY: Duration = Duration::from_secs(3);
/// Events of a request stream kept for a client that resumes it: a call relays at most a few
/// progress and log messages between a drop and the reconnect (rmcp's default retry, 3 s).
const RESUME_TAIL: usize = 64;

/// Why a session operation failed; rmcp answers these with 500 (a resume: an empty stream).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("no session {0}")]
    Unknown(SessionId),
    #[error("the session's initialize was already answered or never started")]
    NotInitializing,
    #[error("the handshake ended without an answer")]
    NoAnswer,
    #[error("a session stream carries requests only")]
    NotARequest,
    #[error("event id {0:?} names no request stream of this session")]
    NoStream(String),
}

/// What a session's client declared, kept only when it can be asked something (sampling,
/// elicitation): a request's handler relays the servers' requests to such a client.
type Declared = Option<Box<ClientCapabilities>>;

/// One 2025-era session.
#[derive(Debug)]
pub(crate) struct Session {
    id: SessionId,
    /// Set once the handshake answered: the negotiated revision and what the client declared.
    negotiated: std::sync::OnceLock<(ProtocolVersion, Declared)>,
    /// Milliseconds since the table's epoch of the last request's start or end.
    last_used: AtomicU64,
    /// Requests running and streams open.
    busy: AtomicU32,
    /// rmcp's handshake worker for this session ended; its close must not end the session.
    worker_done: AtomicBool,
    state: parking_lot::Mutex<SessionState>,
}

#[derive(Debug, Default)]
struct SessionState {
    log_level: Option<LoggingLevel>,
    /// Resources subscribed to (`spear://<server>/<uri>`).
    subscribed: HashSet<String>,
    /// The open standalone (GET) stream.
    stream: Option<mpsc::Sender<ServerSseMessage>>,
    /// Requests running through rmcp, by their JSON-RPC id as the client sent it.
    requests: HashMap<String, Arc<RequestStream>>,
    /// Asks sent to the client (its answers come back by these ids), each with its request
    /// and the id that request's handler gave it.
    asks: HashMap<u64, (Arc<RequestStream>, RequestId)>,
    next_ask: u64,
    next_stream: u64,
}

impl Session {
    /// The client declared sampling or elicitation: its calls relay the servers' requests.
    pub(crate) fn answers_requests(&self) -> bool {
        self.negotiated.get().is_some_and(|(_, declared)| declared.is_some())
    }

    pub(crate) fn log_level(&self) -> Option<LoggingLevel> {
        self.state.lock().log_level
    }

    /// Sends `message` on the session's standalone stream, if one is open; false when none is
    /// or its client went away.
    pub(crate) async fn notify(&self, message: ServerJsonRpcMessage) -> bool {
        let stream = self.state.lock().stream.clone();
        match stream {
            Some(stream) => stream.send(ServerSseMessage::from_message(message)).await.is_ok(),
            None => false,
        }
    }

    /// Its client holds the standalone (GET) stream open.
    pub(crate) fn listening(&self) -> bool {
        self.state.lock().stream.as_ref().is_some_and(|s| !s.is_closed())
    }

    /// The rmcp peer a request of this session is served with: its revision and declarations.
    fn peer_info(&self) -> InitializeRequestParams {
        let (version, declared) = self.negotiated.get().cloned().unwrap_or_default();
        let capabilities = declared.map(|d| *d).unwrap_or_default();
        InitializeRequestParams::new(capabilities, Implementation::new("mcp-client", "")).with_protocol_version(version)
    }
}

/// Marks its session busy while held; the end of its use restarts the idle time.
pub(crate) struct Busy {
    session: Arc<Session>,
    table: Arc<SessionTable>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.table.touch(&self.session);
        self.session.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every 2025-era session of the agent's `/mcp`.
#[derive(Debug)]
pub(crate) struct SessionTable {
    sessions: parking_lot::RwLock<HashMap<SessionId, Arc<Session>>>,
    epoch: Instant,
    idle: Duration,
}

impl SessionTable {
    /// A table whose sessions end after `idle` unused.
    pub(crate) fn new(idle: Duration) -> Self {
        SessionTable { sessions: parking_lot::RwLock::default(), epoch: Instant::now(), idle }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self, session: &Session) {
        session.last_used.store(self.now_ms(), Ordering::Release);
    }

    fn insert(&self) -> Arc<Session> {
        let id = rmcp::transport::common::server_side_http::session_id();
        let session = Arc::new(Session {
            id: id.clone(),
            negotiated: std::sync::OnceLock::new(),
            last_used: AtomicU64::new(self.now_ms()),
            busy: AtomicU32::new(0),
            worker_done: AtomicBool::new(false),
            state: parking_lot::Mutex::default(),
        });
        self.sessions.write().insert(id, session.clone());
        session
    }

    /// The session `id` names, answered (a session whose handshake is still running is not one
    /// yet) and not idle past its time, counting as use.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        let session = self.known(id)?;
        session.negotiated.get()?;
        self.touch(&session);
        Some(session)
    }

    /// The session `id` names, answered or not, unless it is idle past its time: that one is
    /// ended here, so a request finds it gone at its idle time exactly, not at the next sweep.
    fn known(&self, id: &str) -> Option<Arc<Session>> {
        let session = self.sessions.read().get(id).cloned()?;
        if self.idle_past(&session, self.now_ms()) {
            self.remove(id);
            return None;
        }
        Some(session)
    }

    /// Unused for the idle time: no request running, no stream open (both hold a [`Busy`]), none
    /// started or ended since.
    fn idle_past(&self, session: &Session, now: u64) -> bool {
        let idle = u64::try_from(self.idle.as_millis()).unwrap_or(u64::MAX);
        session.busy.load(Ordering::Acquire) == 0
            && now.saturating_sub(session.last_used.load(Ordering::Acquire)) >= idle
    }

    /// Marks `session` in use until the guard drops: a request rmcp runs, a fast call (which
    /// rmcp never sees), an open stream.
    pub(crate) fn in_use(self: &Arc<Self>, session: &Arc<Session>) -> Busy {
        session.busy.fetch_add(1, Ordering::AcqRel);
        self.touch(session);
        Busy { session: session.clone(), table: self.clone() }
    }

    fn remove(&self, id: &str) -> Option<Arc<Session>> {
        let session = self.sessions.write().remove(id)?;
        // Its stream and requests end with it: their senders go, so the client sees the end.
        let mut state = session.state.lock();
        state.stream = None;
        state.asks.clear();
        drop(state);
        Some(session)
    }

    /// Ends the sessions unused for the idle time (frees them: [`Self::get`] already treats them
    /// as gone); returns how many.
    pub(crate) fn expire(&self) -> usize {
        let now = self.now_ms();
        let expired: Vec<SessionId> =
            self.sessions.read().values().filter(|s| self.idle_past(s, now)).map(|s| s.id.clone()).collect();
        for id in &expired {
            // Checked again: a request may have come in meanwhile.
            if self.sessions.read().get(id).is_some_and(|s| self.idle_past(s, self.now_ms())) {
                self.remove(id);
            }
        }
        expired.len()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.sessions.read().len()
    }

    /// The answered sessions now.
    pub(crate) fn all(&self) -> Vec<Arc<Session>> {
        self.sessions.read().values().filter(|s| s.negotiated.get().is_some()).cloned().collect()
    }

    /// Records `session`'s log level; the most verbose level any session asked for.
    pub(crate) fn set_log_level(&self, session: &Session, level: LoggingLevel) -> LoggingLevel {
        session.state.lock().log_level = Some(level);
        self.all().iter().filter_map(|s| s.log_level()).min_by_key(|l| crate::mcp::relay::severity(*l)).unwrap_or(level)
    }

    /// Records (or, with `subscribe` false, removes) `session`'s subscription to `resource`.
    pub(crate) fn subscribe(&self, session: &Session, resource: &str, subscribe: bool) {
        let mut state = session.state.lock();
        if subscribe {
            state.subscribed.insert(resource.to_string());
        } else {
            state.subscribed.remove(resource);
        }
    }

    /// Whether a session other than `session` subscribes to `resource`.
    pub(crate) fn subscribed_elsewhere(&self, session: &Session, resource: &str) -> bool {
        self.all().iter().any(|s| s.id != session.id && s.state.lock().subscribed.contains(resource))
    }

    /// The sessions subscribed to `resource`.
    pub(crate) fn subscribers(&self, resource: &str) -> Vec<Arc<Session>> {
        self.all().into_iter().filter(|s| s.state.lock().subscribed.contains(resource)).collect()
    }
}

/// One request's stream: where its handler's messages go, and the tail kept for a resume.
#[derive(Debug)]
struct RequestStream {
    number: u64,
    inner: parking_lot::Mutex<StreamInner>,
    /// The client's answers and cancellation for this request, into its rmcp service.
    inbox: mpsc::UnboundedSender<ClientJsonRpcMessage>,
}

#[derive(Debug)]
struct StreamInner {
    out: mpsc::Sender<ServerSseMessage>,
    sent: u64,
    tail: VecDeque<ServerSseMessage>,
}

impl RequestStream {
    /// Sends `message` as the stream's next event, kept in the tail for a resume.
    fn send(&self, message: ServerJsonRpcMessage) -> impl Future<Output = bool> + Send + 'static {
        let (out, event) = {
            let mut inner = self.inner.lock();
            inner.sent += 1;
            let event = ServerSseMessage::new(format!("{}.{}", self.number, inner.sent), message);
            if inner.tail.len() == RESUME_TAIL {
                inner.tail.pop_front();
            }
            inner.tail.push_back(event.clone());
            (inner.out.clone(), event)
        };
        async move { out.send(event).await.is_ok() }
    }

    /// A new stream for a client resuming after event `after`: the kept events past it, then
    /// what comes next.
    fn resume(&self, after: u64) -> mpsc::Receiver<ServerSseMessage> {
        let (out, rx) = mpsc::channel(STREAM_BUFFER + RESUME_TAIL);
        let mut inner = self.inner.lock();
        // The tail holds events `first..=sent`.
        let first = inner.sent + 1 - inner.tail.len() as u64;
        let skip = usize::try_from(after.saturating_add(1).saturating_sub(first)).unwrap_or(usize::MAX);
        for event in inner.tail.iter().skip(skip) {
            let _ = out.try_send(event.clone());
        }
        inner.out = out;
        rx
    }
}

/// rmcp's `SessionManager` over a [`SessionTable`], serving each request with `handler`.
pub(crate) struct AgentSessions<H> {
    table: Arc<SessionTable>,
    handler: H,
    /// The handshakes under way: the `initialize` to run, and where its answer goes.
    initializing: parking_lot::Mutex<HashMap<SessionId, InitChannel>>,
    shutdown: CancellationToken,
}

struct InitChannel {
    request: oneshot::Sender<ClientJsonRpcMessage>,
    answer: oneshot::Receiver<ServerJsonRpcMessage>,
}

impl<H: ServerHandler + Clone> AgentSessions<H> {
    /// Sessions of `table`, served by `handler`; the expiry task ends with `shutdown`.
    pub(crate) fn new(table: Arc<SessionTable>, handler: H, shutdown: CancellationToken) -> Self {
        let every = (table.idle / 4).max(Duration::from_millis(10));
        let expiring = table.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => { expiring.expire(); }
                }
            }
        });
        AgentSessions { table, handler, initializing: parking_lot::Mutex::default(), shutdown }
    }

    fn session(&self, id: &SessionId) -> Result<Arc<Session>, SessionError> {
        self.table.get(id).ok_or_else(|| SessionError::Unknown(id.clone()))
    }
}

impl<H: ServerHandler + Clone> SessionManager for AgentSessions<H> {
    type Error = SessionError;
    type Transport = InitTransport;

    async fn create_session(&self) -> Result<(SessionId, InitTransport), SessionError> {
        let session = self.table.insert();
        let (request, request_rx) = oneshot::channel();
        let (answer_tx, answer) = oneshot::channel();
        self.initializing.lock().insert(session.id.clone(), InitChannel { request, answer });
        let transport = InitTransport {
            request: Some(request_rx),
            initialize: None,
            answer: Some(answer_tx),
            session,
            table: self.table.clone(),
        };
        Ok((transport.session.id.clone(), transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, SessionError> {
        let channel = self.initializing.lock().remove(id).ok_or(SessionError::NotInitializing)?;
        channel.request.send(message).map_err(|_| SessionError::NoAnswer)?;
        channel.answer.await.map_err(|_| SessionError::NoAnswer)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, SessionError> {
        Ok(self.table.known(id).is_some())
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), SessionError> {
        let worker_close =
            self.table.sessions.read().get(id).is_some_and(|s| s.worker_done.swap(false, Ordering::AcqRel));
        if !worker_close {
            self.table.remove(id);
        }
        Ok(())
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        let session = self.session(id)?;
        let ClientJsonRpcMessage::Request(request) = message else { return Err(SessionError::NotARequest) };
        let (out, rx) = mpsc::channel(STREAM_BUFFER);
        let (inbox, inbox_rx) = mpsc::unbounded_channel();
        let key = request.id.to_string();
        let stream = {
            let mut state = session.state.lock();
            state.next_stream += 1;
            let stream = Arc::new(RequestStream {
                number: state.next_stream,
                inner: parking_lot::Mutex::new(StreamInner { out, sent: 0, tail: VecDeque::new() }),
                inbox,
            });
            state.requests.insert(key.clone(), stream.clone());
            stream
        };
        let transport = RequestTransport {
            first: Some(ClientJsonRpcMessage::Request(request)),
            inbox: inbox_rx,
            session: session.clone(),
            stream: stream.clone(),
            key,
            answered: Arc::new(tokio::sync::Notify::new()),
            done: false,
        };
        let busy = self.table.in_use(&session);
        let service = rmcp::service::serve_directly_with_ct(
            self.handler.clone(),
            transport,
            Some(session.peer_info()),
            self.shutdown.child_token(),
        );
        tokio::spawn(async move {
            let _busy = busy;
            let _ = service.waiting().await;
        });
        // The first event primes the client's `Last-Event-ID` (SEP-1699).
        let priming = ServerSseMessage::priming(format!("{}.0", stream.number), PRIMING_RETRY);
        Ok(futures::StreamExt::chain(
            futures::stream::once(async move { priming }),
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), SessionError> {
        let session = self.session(id)?;
        match message {
            ClientJsonRpcMessage::Response(mut answer) => {
                let RequestId::Number(n) = answer.id else { return Ok(()) };
                let asked = u64::try_from(n).ok().and_then(|n| session.state.lock().asks.remove(&n));
                if let Some((stream, original)) = asked {
                    answer.id = original;
                    let _ = stream.inbox.send(ClientJsonRpcMessage::Response(answer));
                }
            }
            ClientJsonRpcMessage::Error(mut error) => {
                let Some(RequestId::Number(n)) = error.id else { return Ok(()) };
                let asked = u64::try_from(n).ok().and_then(|n| session.state.lock().asks.remove(&n));
                if let Some((stream, original)) = asked {
                    error.id = Some(original);
                    let _ = stream.inbox.send(ClientJsonRpcMessage::Error(error));
                }
            }
            ClientJsonRpcMessage::Notification(notification) => {
                if let ClientNotification::CancelledNotification(cancelled) = &notification.notification
                    && let Some(request) = &cancelled.params.request_id
                    && let Some(stream) = session.state.lock().requests.get(&request.to_string()).cloned()
                {
                    let _ = stream.inbox.send(ClientJsonRpcMessage::Notification(notification));
                }
            }
            ClientJsonRpcMessage::Request(_) => return Err(SessionError::NotARequest),
        }
        Ok(())
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        let session = self.session(id)?;
        let (tx, rx) = mpsc::channel(NOTIFY_BUFFER);
        // A second GET replaces the first: the client that opens one has lost the old one.
        session.state.lock().stream = Some(tx);
        // In use while the stream is open; its end restarts the idle time.
        let in_use = self.table.in_use(&session);
        Ok(futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), move |event| {
            let _ = &in_use;
            event
        }))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, SessionError> {
        let session = self.session(id)?;
        let unknown = || SessionError::NoStream(last_event_id.clone());
        let (number, after) = last_event_id.split_once('.').ok_or_else(unknown)?;
        let (number, after): (u64, u64) =
            (number.parse().map_err(|_| unknown())?, after.parse().map_err(|_| unknown())?);
        let stream = session.state.lock().requests.values().find(|s| s.number == number).cloned();
        let stream = stream.ok_or_else(unknown)?;
        Ok(tokio_stream::wrappers::ReceiverStream::new(stream.resume(after)))
    }
}

/// The handshake's transport: rmcp's worker reads the `initialize` from it and writes the
/// answer, which completes the session's record; then it ends, and the worker with it.
pub(crate) struct InitTransport {
    request: Option<oneshot::Receiver<ClientJsonRpcMessage>>,
    /// The `initialize` read, for what the client declared.
    initialize: Option<InitializeRequestParams>,
    answer: Option<oneshot::Sender<ServerJsonRpcMessage>>,
    session: Arc<Session>,
    table: Arc<SessionTable>,
}

impl Transport<RoleServer> for InitTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        message: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let ServerJsonRpcMessage::Response(response) = &message
            && let ServerResult::InitializeResult(result) = &response.result
        {
            let declared = self
                .initialize
                .take()
                .map(|init| init.capabilities)
                .filter(|c| c.sampling.is_some() || c.elicitation.is_some());
            let _ = self.session.negotiated.set((result.protocol_version.clone(), declared.map(Box::new)));
        }
        let sent = self.answer.take().map(|answer| answer.send(message).is_ok()).unwrap_or(false);
        std::future::ready(if sent { Ok(()) } else { Err(std::io::Error::other("no handshake is waiting")) })
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        let message = self.request.take()?.await.ok()?;
        if let ClientJsonRpcMessage::Request(request) = &message
            && let ClientRequest::InitializeRequest(init) = &request.request
        {
            self.initialize = Some(init.params.clone());
        }
        Some(message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl Drop for InitTransport {
    fn drop(&mut self) {
        if self.session.negotiated.get().is_some() {
            // The worker closes the session next; that close is this one's end, not the client's.
            self.session.worker_done.store(true, Ordering::Release);
        } else {
            // No answer: the handshake failed, and the session never was.
            self.table.remove(&self.session.id);
        }
    }
}

/// One request's transport: in, the request and then what the client sends for it; out, its
/// SSE stream. It ends once the request is answered or its client went away.
struct RequestTransport {
    first: Option<ClientJsonRpcMessage>,
    inbox: mpsc::UnboundedReceiver<ClientJsonRpcMessage>,
    session: Arc<Session>,
    stream: Arc<RequestStream>,
    key: String,
    answered: Arc<tokio::sync::Notify>,
    done: bool,
}

impl Transport<RoleServer> for RequestTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        mut message: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answer = match &message {
            ServerJsonRpcMessage::Response(r) => r.id.to_string() == self.key,
            ServerJsonRpcMessage::Error(e) => e.id.as_ref().is_some_and(|id| id.to_string() == self.key),
            _ => false,
        };
        if let ServerJsonRpcMessage::Request(asked) = &mut message {
            // Numbered per session, so the client's answer finds this request among all of the
            // session's (each request's rmcp service numbers its own asks from 0).
            let mut state = self.session.state.lock();
            state.next_ask += 1;
            let n = state.next_ask;
            let original = std::mem::replace(&mut asked.id, RequestId::Number(i64::try_from(n).unwrap_or(i64::MAX)));
            state.asks.insert(n, (self.stream.clone(), original));
        }
        let sent = self.stream.send(message);
        let answered = self.answered.clone();
        async move {
            let ok = sent.await;
            if answer {
                answered.notify_one();
            }
            if ok { Ok(()) } else { Err(std::io::Error::other("the client's stream is closed")) }
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        if self.done {
            return None;
        }
        tokio::select! {
            message = self.inbox.recv() => message,
            () = self.answered.notified() => { self.done = true; None }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl Drop for RequestTransport {
    fn drop(&mut self) {
        let mut state = self.session.state.lock();
        state.requests.remove(&self.key);
        let stream = &self.stream;
        state.asks.retain(|_, (s, _)| !Arc::ptr_eq(s, stream));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(table: &SessionTable) -> Arc<Session> {
        let session = table.insert();
        session.negotiated.set((ProtocolVersion::V_2025_11_25, None)).expect("first");
        session
    }

    #[test]
    fn a_session_is_known_only_once_its_handshake_answered() {
        let table = SessionTable::new(Duration::from_secs(60));
        let session = table.insert();
        assert!(table.get(&session.id).is_none(), "an unanswered handshake is no session yet");
        session.negotiated.set((ProtocolVersion::V_2025_11_25, None)).expect("first");
        assert!(table.get(&session.id).is_some());
        assert!(table.get("not-a-session").is_none());
    }

    #[test]
    fn an_idle_session_expires_and_a_busy_one_does_not() {
        let table = Arc::new(SessionTable::new(Duration::from_millis(200)));
        let (idle, swept, calling) = (answered(&table), answered(&table), answered(&table));
        let guard = table.in_use(&calling);
        std::thread::sleep(Duration::from_millis(250));
        assert!(table.get(&idle.id).is_none(), "past its idle time a lookup finds it gone, sweep or not");
        assert_eq!(table.expire(), 1, "the sweep frees the other idle one");
        assert!(table.sessions.read().get(&swept.id).is_none());
        assert!(table.get(&calling.id).is_some(), "a call in flight keeps its session");
        drop(guard);
        assert_eq!(table.expire(), 0, "idle time counts from the call's end");
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(table.expire(), 1);
        assert_eq!(table.len(), 0);
    }

    /// An open `GET` stream keeps its session however long it stays open, and its end restarts
    /// the idle time: a session does not end the moment its stream closes.
    #[tokio::test]
    async fn a_get_stream_keeps_its_session_and_its_end_restarts_the_idle_time() {
        use crate::agent::core::{Agent, AgentOptions};
        let table = Arc::new(SessionTable::new(Duration::from_millis(200)));
        let pool = crate::mcp::Pool::new(crate::mcp::PoolOptions::default());
        let registry = Arc::new(crate::registry::view::StaticRegistry::default());
        let agent = Agent::new(AgentOptions::new("p"), registry, pool);
        let shutdown = CancellationToken::new();
        let endpoint = super::super::endpoint::McpEndpoint::new(agent, shutdown.clone(), table.clone());
        let sessions = AgentSessions::new(table.clone(), endpoint, shutdown.clone());
        let session = answered(&table);
        let stream = sessions.create_standalone_stream(&session.id).await.expect("a stream");
        std::thread::sleep(Duration::from_millis(250));
        assert!(table.get(&session.id).is_some(), "its stream is open");
        std::thread::sleep(Duration::from_millis(250));
        drop(stream);
        assert!(table.get(&session.id).is_some(), "the stream's end is its last use");
        shutdown.cancel();
    }

    #[test]
    fn the_most_verbose_level_of_all_sessions_is_the_servers() {
        let table = SessionTable::new(Duration::from_secs(60));
        let (a, b) = (answered(&table), answered(&table));
        assert_eq!(table.set_log_level(&a, LoggingLevel::Error), LoggingLevel::Error);
        assert_eq!(table.set_log_level(&b, LoggingLevel::Debug), LoggingLevel::Debug);
        assert_eq!(table.set_log_level(&b, LoggingLevel::Warning), LoggingLevel::Warning);
        assert_eq!(a.log_level(), Some(LoggingLevel::Error));
    }

    #[test]
    fn a_subscription_is_per_session() {
        let table = SessionTable::new(Duration::from_secs(60));
        let (a, b) = (answered(&table), answered(&table));
        table.subscribe(&a, "spear://fs/x", true);
        assert!(!table.subscribed_elsewhere(&a, "spear://fs/x"));
        assert!(table.subscribed_elsewhere(&b, "spear://fs/x"));
        assert_eq!(table.subscribers("spear://fs/x").len(), 1);
        table.subscribe(&a, "spear://fs/x", false);
        assert!(table.subscribers("spear://fs/x").is_empty());
    }

    #[tokio::test]
    async fn a_resumed_stream_gets_the_events_after_the_last_one_seen() {
        let (out, _first) = mpsc::channel(STREAM_BUFFER);
        let (inbox, _inbox) = mpsc::unbounded_channel();
        let stream = RequestStream {
            number: 3,
            inner: parking_lot::Mutex::new(StreamInner { out, sent: 0, tail: VecDeque::new() }),
            inbox,
        };
        let note = |n: u32| {
            ServerJsonRpcMessage::notification(rmcp::model::ServerNotification::ProgressNotification(
                rmcp::model::ProgressNotification::new(rmcp::model::ProgressNotificationParam::new(
                    rmcp::model::ProgressToken(rmcp::model::NumberOrString::Number(1)),
                    f64::from(n),
                )),
            ))
        };
        for n in 1..=3 {
            assert!(stream.send(note(n)).await);
        }
        let mut resumed = stream.resume(1);
        let ids: Vec<_> =
            std::iter::from_fn(|| resumed.try_recv().ok()).map(|e| e.event_id.unwrap_or_default()).collect();
        assert_eq!(ids, ["3.2", "3.3"]);
    }
}
