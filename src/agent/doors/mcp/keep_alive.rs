//! Keeps rmcp's `/mcp` sessions alive while the fast path ([`super::fast_path`]) answers their
//! calls. Those calls never reach rmcp's session worker, whose idle timer
//! (`SessionConfig::keep_alive`, `--mcp-session-idle-seconds`) restarts only on events it handles.
//!
//! ```text
//! fast call ──▶ Activity of its session (sharded map; one lookup, two atomics) ──▶ the call
//!                 └─ none yet: insert it and spawn the session's keeper
//! keeper:  touch ──▶ sleep every (= idle / 4) ──▶ a call in flight or ended meanwhile? ──yes──▶ touch …
//!                                                                └─no──▶ remove the entry, end
//! ```
//!
//! **The one dependence on rmcp's internals**, checked against rmcp 3.9.0 (`Cargo.lock`): a touch
//! is `LocalSessionHandle::close_request_wise_channel` of a channel no session opens
//! ([`NEVER_OPENED`]), on the handle in the public `LocalSessionManager::sessions` map. The worker
//! answers it without the handler and, as for every event, restarts its idle timer (its loop makes
//! the `keep_alive` sleep anew each turn, `session/local.rs`). If an rmcp release changes that,
//! `tests::a_touch_restarts_rmcps_idle_timer` fails, and so does `tests/it/serve.rs`'s
//! `mcp_calls_alone_keep_a_session_alive_and_hearing_list_changed`. The exit: `src/agent/README.md`.
//!
//! - The hot path never waits for a touch: touches run in the keeper, one per `every` at most.
//! - Never early, never late: a session expires no sooner than the idle time after its last call
//!   ended, no later than that plus `every`; a call in flight keeps it alive however long it runs.
//! - Never revives: a touch reaches only a running worker; a keeper whose session is gone removes
//!   its entry and ends. Only sessions rmcp knows get an entry, so unknown ids cannot grow the map.
//! - `every` is idle / 4, no floor: a 1 s floor would let a 1 s idle session expire between touches.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use rmcp::transport::streamable_http_server::session::SessionId;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionError};
use tokio_util::sync::CancellationToken;

/// The request channel a touch closes: one no session ever opens (rmcp numbers a session's
/// request channels from 0, one per request).
const NEVER_OPENED: u64 = u64::MAX;

/// Why a touch did not reach a session: it is gone, and its keeper ends.
#[derive(Debug, thiserror::Error)]
enum TouchError {
    #[error("no longer in rmcp's sessions")]
    Unknown,
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// The fast calls of one session, as its keeper sees them.
#[derive(Debug, Default)]
struct Activity {
    /// Fast calls running now.
    in_flight: AtomicUsize,
    /// A fast call ended since the keeper last looked.
    called: AtomicBool,
}

impl Activity {
    /// Whether the session was used since the last look (and clears that).
    fn used(&self) -> bool {
        // In this order: a call ends by setting `called`, then leaving `in_flight` (see
        // `Drop for CallGuard`), so one that ended before `in_flight` is read here has set
        // `called` before it is read, and the keeper touches again after every call's end.
        let busy = self.in_flight.load(Ordering::SeqCst) > 0;
        let called = self.called.swap(false, Ordering::SeqCst);
        busy || called
    }

    /// Counts one more call in flight.
    fn count(self: &Arc<Self>) -> CallGuard {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        CallGuard(self.clone())
    }
}

/// The fast path's record of session activity and the keepers that report it to rmcp.
#[derive(Debug)]
pub(crate) struct SessionKeeper {
    sessions: Arc<LocalSessionManager>,
    /// Time between touches of a busy session.
    every: Duration,
    /// Sessions with a running keeper.
    active: DashMap<SessionId, Arc<Activity>>,
    shutdown: CancellationToken,
}

/// One fast call in flight; dropping it (the call ended, or its client went away) counts as use.
#[must_use = "the call counts as in flight until this is dropped"]
pub(crate) struct CallGuard(Arc<Activity>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.called.store(true, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SessionKeeper {
    /// A keeper of `sessions`, whose worker closes a session after `idle` without an event;
    /// keeper tasks end on `shutdown`.
    pub(crate) fn new(sessions: Arc<LocalSessionManager>, idle: Duration, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(SessionKeeper { sessions, every: idle / 4, active: DashMap::new(), shutdown })
    }

    /// A fast call in `session` (one rmcp knows) starts; it counts as in flight until the guard
    /// is dropped. Starts the session's keeper when it has none; never waits.
    pub(crate) fn call_started(self: &Arc<Self>, session: &str) -> CallGuard {
        // Each call is counted while its entry's shard lock is held: the keeper removes an
        // unused entry under the same lock (see `keep`), so it never removes one a call counts on.
        if let Some(activity) = self.active.get(session) {
            return activity.count();
        }
        let id: SessionId = session.into();
        let (guard, new) = match self.active.entry(id.clone()) {
            Entry::Occupied(entry) => (entry.get().count(), false),
            Entry::Vacant(entry) => (entry.insert(Arc::default()).count(), true),
        };
        if new {
            tokio::spawn(self.clone().keep(id));
        }
        guard
    }

    /// The keeper of session `id`: touches now, then every `every` while the session is used.
    async fn keep(self: Arc<Self>, id: SessionId) {
        loop {
            if let Err(error) = self.touch(&id).await {
                tracing::debug!(session = %id, %error, "/mcp session gone; its keeper ends");
                self.active.remove(&id);
                return;
            }
            tokio::select! {
                () = self.shutdown.cancelled() => {
                    self.active.remove(&id);
                    return;
                }
                () = tokio::time::sleep(self.every) => {}
            }
            // Unused since the last touch: the entry goes (under its shard lock, so no call is
            // counted on it meanwhile) and the session's next call starts a new keeper.
            if self.active.remove_if(&id, |_, activity| !activity.used()).is_some() {
                return;
            }
        }
    }

    /// One event through session `id`'s worker, which restarts its idle timer; an error when
    /// the session is gone.
    async fn touch(&self, id: &SessionId) -> Result<(), TouchError> {
        let handle = self.sessions.sessions.read().await.get(id).cloned().ok_or(TouchError::Unknown)?;
        handle.close_request_wise_channel(NEVER_OPENED).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use rmcp::ServiceExt as _;
    use rmcp::model::ClientJsonRpcMessage;
    use rmcp::transport::streamable_http_server::session::SessionManager as _;

    use super::*;

    /// A server that answers `initialize` and nothing else: the session's worker is what is tested.
    #[derive(Clone)]
    struct Quiet;

    impl rmcp::ServerHandler for Quiet {}

    /// The pinned dependence on rmcp (see the module header), exercised on rmcp's own session
    /// manager and worker: touched more often than the idle time, a session outlives several idle
    /// times; untouched, its worker ends after one. Real time (no paused clock in this crate's
    /// tokio features), with margins of half the idle time for a loaded machine.
    #[tokio::test]
    async fn a_touch_restarts_rmcps_idle_timer() {
        const IDLE: Duration = Duration::from_secs(2);
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(IDLE);
        let sessions = Arc::new(sessions);
        let (id, transport) = sessions.create_session().await.expect("rmcp creates a session");
        // Ends when the session's worker does (its transport closes).
        let served = tokio::spawn(async move {
            let running = Quiet.serve(transport).await.expect("the server starts on the session");
            let _ = running.waiting().await;
        });
        let initialize: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        }))
        .expect("an initialize request");
        sessions.initialize_session(&id, initialize).await.expect("the session initializes");
        let keeper = SessionKeeper::new(sessions.clone(), IDLE, CancellationToken::new());

        let started = Instant::now();
        while started.elapsed() < IDLE * 2 {
            tokio::time::sleep(IDLE / 4).await;
            keeper.touch(&id).await.expect("a touched session stays open past its idle time");
        }
        assert!(!served.is_finished(), "the session's worker still runs");

        let untouched = Instant::now();
        tokio::time::timeout(IDLE * 5, served)
            .await
            .expect("an untouched session closes after its idle time")
            .expect("the server task ends cleanly");
        assert!(untouched.elapsed() >= IDLE * 9 / 10, "closed {:?} after the last touch", untouched.elapsed());
        assert!(keeper.touch(&id).await.is_err(), "a closed session cannot be touched back to life");
    }
}
