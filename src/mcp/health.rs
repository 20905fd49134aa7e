//! Per-server health, as a small state machine fed by call outcomes. Pure.
//!
//! ```text
//!            connect ok / call ok
//!   Down ─────────────────────────▶ Connected
//!    ▲  ▲                              │ timeout (fewer than the kill threshold in a row)
//!    │  │ connect failed / session     ▼
//!    │  └──── broke (crash, EOF) ──── Degraded ──call ok──▶ Connected
//!    └──────────────────────────────────┘
//! ```
//!
//! Health never says Connected for a server whose calls fail: any transport failure is Down
//! until a new session is established, and timeouts make it Degraded at once.

use std::time::Duration;

use serde::Serialize;

/// The three states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum HealthState {
    /// A session is up and the last call succeeded.
    Connected,
    /// A session is up but calls time out.
    Degraded,
    /// No working session.
    #[default]
    Down,
}

/// Health and figures of one server.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    pub state: HealthState,
    /// The last error (no secret values).
    pub(crate) last_error: Option<String>,
    /// Sessions established after the first one.
    pub reconnects: u64,
    /// Timeouts in a row (reset by any success).
    pub(crate) consecutive_timeouts: u32,
    /// Calls finished (any outcome).
    pub(crate) calls: u64,
    /// Sum of call latencies, for the mean.
    pub(crate) latency_total_ms: u64,
    /// Slowest call.
    pub(crate) latency_max_ms: u64,
    /// Sessions established in total.
    pub sessions: u64,
}

/// What the pool should do after recording an outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Nothing.
    Keep,
    /// Kill the session (and child) so the next call starts a fresh one.
    Restart,
}

impl Health {
    /// A session was established.
    pub(crate) fn connected(&mut self) {
        if self.sessions > 0 {
            self.reconnects += 1;
        }
        self.sessions += 1;
        self.state = HealthState::Connected;
        self.consecutive_timeouts = 0;
    }

    /// Establishing a session failed, or the session broke.
    pub(crate) fn down(&mut self, error: &str) {
        self.state = HealthState::Down;
        self.last_error = Some(error.to_string());
    }

    /// A call finished (successfully at the protocol level; a tool's own `isError` counts).
    pub(crate) fn call_ok(&mut self, latency: Duration) {
        self.record(latency);
        self.consecutive_timeouts = 0;
        self.state = HealthState::Connected;
    }

    /// A call timed out. After `kill_after` in a row the session is to be restarted.
    pub(crate) fn call_timed_out(&mut self, latency: Duration, kill_after: u32, message: &str) -> Action {
        self.record(latency);
        self.consecutive_timeouts += 1;
        self.last_error = Some(message.to_string());
        if self.consecutive_timeouts >= kill_after.max(1) {
            self.state = HealthState::Down;
            self.consecutive_timeouts = 0;
            Action::Restart
        } else {
            self.state = HealthState::Degraded;
            Action::Keep
        }
    }

    fn record(&mut self, latency: Duration) {
        let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        self.calls += 1;
        self.latency_total_ms = self.latency_total_ms.saturating_add(ms);
        self.latency_max_ms = self.latency_max_ms.max(ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_new_server_is_down_until_connected() {
        let mut h = Health::default();
        assert_eq!(h.state, HealthState::Down);
        h.connected();
        assert_eq!((h.state, h.sessions, h.reconnects), (HealthState::Connected, 1, 0));
        h.down("child exited");
        h.connected();
        assert_eq!(h.reconnects, 1);
    }

    #[test]
    fn timeouts_degrade_then_restart_and_success_resets() {
        let mut h = Health::default();
        h.connected();
        assert_eq!(h.call_timed_out(MS, 3, "t"), Action::Keep);
        assert_eq!(h.state, HealthState::Degraded);
        h.call_ok(MS);
        assert_eq!((h.state, h.consecutive_timeouts), (HealthState::Connected, 0));
        assert_eq!(h.call_timed_out(MS, 2, "t"), Action::Keep);
        assert_eq!(h.call_timed_out(MS, 2, "t"), Action::Restart);
        assert_eq!(h.state, HealthState::Down, "never Connected while calls fail");
    }
}
