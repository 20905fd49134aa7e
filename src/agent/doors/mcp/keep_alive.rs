//! Keeps rmcp's `/mcp` sessions alive while the fast path ([`super::fast_path`]) answers
//! their calls.
//!
//! rmcp owns the session lifecycle: it creates sessions, routes their notifications, closes them
//! on `DELETE` and after `SessionConfig::keep_alive` (`--mcp-session-idle-seconds`) without an
//! event in the session's worker. The worker restarts its idle timer on every event it handles,
//! but the fast path's calls never reach it: before this module a client that only called tools
//! got a 404 after the idle time, while busy, and heard no more `tools/list_changed`.
//!
//! So the fast path reports activity to rmcp through its public session API, without the
//! handler: a *touch* is `LocalSessionHandle::close_request_wise_channel` of a request channel
//! that was never opened, on the handle from `LocalSessionManager::sessions`: one event the worker
//! answers itself, finding nothing to close (checked against rmcp 3.9's `session/local.rs`;
//! `serve::mcp_calls_alone_keep_a_session_alive_and_hearing_list_changed` fails if a
//! later rmcp stops counting it as activity). It used to open a request channel and close it
//! again: two events, and a channel (its first 32-slot block, about 12 KB), an id and an SSE
//! priming event made and dropped per touch, on the agent's one thread, beside the call that
//! started the keeper; and the keeper that waits on a touch took 3.1 KB per session that had
//! called a tool, now 1.5 KB (benches/sessions.rs).
//!
//! ```text
//! fast call ──▶ Activity of its session (sharded map; one lookup, two atomics) ──▶ the call
//!                 └─ none yet: insert it and spawn the session's keeper
//! keeper:  touch ──▶ sleep every (= idle / 4) ──▶ a call in flight or ended meanwhile? ──yes──▶ touch …
//!                                                                └─no──▶ remove the entry, end
//! ```
//!
//! - The hot path never waits for a touch (the worker's channel is bounded and may be busy):
//!   touches run in the keeper task, at most one per `every` per session.
//! - Never early: a session expires no sooner than the idle time after its last call ended, and
//!   no later than that plus `every`. A call in flight keeps its session alive however long it runs.
//! - Never keeps a closed session alive: a touch reaches only a worker that still runs; when
//!   the session is gone from rmcp's map (expired, `DELETE`d) or its worker has quit, the keeper
//!   removes its entry and ends. Only sessions rmcp knows get an entry (the fast path checks
//!   first), so unknown ids cannot grow the map.
//! - `every` is idle / 4 with no floor: the flag's minimum (1 s) bounds it at four touches per
//!   second per busy session, and a fixed floor such as 1 s would equal the idle time at
//!   `--mcp-session-idle-seconds 1`, letting the session expire between touches.

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
