//! The bridge's decisions, pure: when the child (re)starts, what a new client gets, what ends a
//! session. No I/O and no clock: the caller passes `now`, so every decision is unit-tested
//! without processes, sockets or sleeping.
//!
//! ```text
//!  events from the I/O loop (mod.rs)          Supervisor              actions it executes
//!  Spawned, ClientConnected, HoldExpired,  ─▶ state Down | Idle |  ─▶ Attach | Hold | Refuse |
//!  ClientLeft, ChildExited,                   Serving | Stopping      AttachHeld | RefuseHeld |
//!  ShutdownRequested                          + held newcomer          ReplaceChild | ChildGone |
//!                                             + Backoff                Shutdown | None
//! ```
//!
//! States: `Down` (no child; one is due at `restart_at`), `Idle` (child up, no client),
//! `Serving` (child up, one client relayed to it), `Stopping` (shutdown requested).
//!
//! A client replacing a dead one is never refused. Connections are accepted only in `Idle` and
//! `Serving`: while `Down` they wait in the listen backlog for the next child. A connection that
//! arrives while `Serving` is first *held* for a short grace: the current client may be gone
//! already with its end not yet seen (its close and the new connection arrive together, or a
//! process that forked keeps its socket open a moment longer). If the current session ends within
//! the grace, the held client gets the fresh child; otherwise it is refused. A third connection
//! while one is held is refused at once.

use std::time::{Duration, Instant};

/// Restart delays for a child that exits on its own: exponential from `initial`, capped at `max`,
/// and back to `initial` once a child stayed up for `stable_after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BackoffPolicy {
    /// Delay after the first exit.
    pub(crate) initial: Duration,
    /// Upper bound of the delay.
    pub(crate) max: Duration,
    /// Uptime after which a child counts as healthy again (the failure count resets).
    pub(crate) stable_after: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            // Short enough that a one-off crash costs the client a barely noticeable pause.
            initial: Duration::from_millis(100),
            // A crash-looping server is retried twice a minute: it heals soon after its cause is
            // fixed (a Secret mounted, a dependency back) without burning the pod's CPU.
            max: Duration::from_secs(30),
            // One minute up means the server got past its startup (npx downloads, config checks):
            // a later crash is a new incident and gets the short delay again.
            stable_after: Duration::from_secs(60),
        }
    }
}

/// Exponential restart backoff with a cap and a reset after a stable run.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    policy: BackoffPolicy,
    /// Consecutive exits of children that did not reach `stable_after`.
    failures: u32,
}

// === impl Backoff ===

impl Backoff {
    /// A backoff with no failure recorded yet.
    pub(crate) fn new(policy: BackoffPolicy) -> Self {
        Self { policy, failures: 0 }
    }

    /// Records the end of a child that ran for `uptime` and returns the delay before the next one.
    ///
    /// `fault` is true when the child exited on its own (whatever its status: a server that exits
    /// 0 in a loop is as broken as one that crashes); false when the bridge stopped it because its
    /// client left, which restarts at once and does not count as a failure.
    pub(crate) fn child_ended(&mut self, uptime: Duration, fault: bool) -> Duration {
        if uptime >= self.policy.stable_after {
            self.failures = 0;
        }
        if !fault {
            return Duration::ZERO;
        }
        let factor = 2u32.saturating_pow(self.failures);
        self.failures = self.failures.saturating_add(1);
        self.policy.initial.saturating_mul(factor).min(self.policy.max)
    }
}

/// What happened, as the I/O loop reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A child process started.
    Spawned,
    /// A client connection was accepted.
    ClientConnected,
    /// The grace of a held connection ran out.
    HoldExpired,
    /// The relayed client went away (end of its stream, or a read/write error on it).
    ClientLeft,
    /// The child exited on its own.
    ChildExited,
    /// SIGTERM/SIGINT (the shutdown token) arrived.
    ShutdownRequested,
}

/// What the I/O loop must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    None,
    /// Relay the new client to the idle child.
    Attach,
    /// Keep the new connection aside and start its grace timer: the current client may be gone.
    Hold,
    /// Another client is connected: tell the new one so and close it.
    Refuse,
    /// Relay the held connection to the child that just started (and stop its grace timer).
    AttachHeld,
    /// The current client stayed: refuse the held connection like [`Action::Refuse`].
    RefuseHeld,
    /// The client left mid-session: close its stream, stop the child (stdin EOF, SIGTERM,
    /// SIGKILL) and start a fresh one at once, so no half-initialized session is reused.
    ReplaceChild,
    /// The child is gone: close the client if one is relayed (after draining the child's last
    /// output) and start the next child after `restart_in`.
    ChildGone {
        /// Backoff delay before the next child.
        restart_in: Duration,
    },
    /// Stop the child (SIGTERM, then SIGKILL), close the client, remove the socket and return.
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Down { restart_at: Instant },
    Idle { since: Instant },
    Serving { since: Instant },
    Stopping,
}

/// The bridge's state machine: one child, at most one client.
#[derive(Clone, Debug)]
pub(crate) struct Supervisor {
    state: State,
    backoff: Backoff,
    /// A connection is held (see the module header); the I/O loop holds its stream.
    held: bool,
}

// === impl Supervisor ===

impl Supervisor {
    /// Starts `Down` with the first child due at once (eager start: a command that cannot start
    /// fails the bridge before any client arrives, and the first call does not pay for startup).
    pub(crate) fn new(policy: BackoffPolicy, now: Instant) -> Self {
        Self { state: State::Down { restart_at: now }, backoff: Backoff::new(policy), held: false }
    }

    /// When the next child is due, if none is running and the bridge is not stopping.
    pub(crate) fn restart_at(&self) -> Option<Instant> {
        match self.state {
            State::Down { restart_at } => Some(restart_at),
            _ => None,
        }
    }

    /// Whether the I/O loop should accept connections now (otherwise they wait in the backlog).
    pub(crate) fn accepts_clients(&self) -> bool {
        matches!(self.state, State::Idle { .. } | State::Serving { .. })
    }

    /// Feeds one event and returns the action to execute.
    pub(crate) fn on(&mut self, event: Event, now: Instant) -> Action {
        match (event, self.state) {
            (Event::ShutdownRequested, _) => {
                self.state = State::Stopping;
                self.held = false;
                Action::Shutdown
            }
            (_, State::Stopping) => Action::None,
            (Event::Spawned, State::Down { .. }) if self.held => {
                self.held = false;
                self.state = State::Serving { since: now };
                Action::AttachHeld
            }
            (Event::Spawned, State::Down { .. }) => {
                self.state = State::Idle { since: now };
                Action::None
            }
            (Event::ClientConnected, State::Idle { since }) => {
                self.state = State::Serving { since };
                Action::Attach
            }
            (Event::ClientConnected, State::Serving { .. }) if !self.held => {
                self.held = true;
                Action::Hold
            }
            // One client at a time, and a live client keeps its session. Connections are not
            // accepted while `Down`, so refusing there is only the total-function default.
            (Event::ClientConnected, _) => Action::Refuse,
            (Event::HoldExpired, State::Serving { .. }) if self.held => {
                self.held = false;
                Action::RefuseHeld
            }
            // While `Down` the held client waits for the next child, like those in the backlog.
            (Event::HoldExpired, _) => Action::None,
            (Event::ClientLeft, State::Serving { since }) => {
                let _ = self.backoff.child_ended(now.saturating_duration_since(since), false);
                self.state = State::Down { restart_at: now };
                Action::ReplaceChild
            }
            (Event::ChildExited, State::Idle { since } | State::Serving { since }) => {
                let restart_in = self.backoff.child_ended(now.saturating_duration_since(since), true);
                self.state = State::Down { restart_at: now + restart_in };
                Action::ChildGone { restart_in }
            }
            // Spawned while up, ClientLeft without a client, ChildExited without a child: stale
            // reports of something already handled.
            (Event::Spawned | Event::ClientLeft | Event::ChildExited, _) => Action::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn policy() -> BackoffPolicy {
        BackoffPolicy { initial: 100 * MS, max: 1000 * MS, stable_after: 10_000 * MS }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut b = Backoff::new(policy());
        let delays: Vec<u128> = (0..7).map(|_| b.child_ended(MS, true).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn backoff_resets_after_a_stable_run() {
        let mut b = Backoff::new(policy());
        for _ in 0..5 {
            b.child_ended(MS, true);
        }
        assert_eq!(b.child_ended(10_000 * MS, true), 100 * MS, "a child up for stable_after starts over");
        assert_eq!(b.child_ended(MS, true), 200 * MS);
    }

    #[test]
    fn backoff_survives_thousands_of_failures_without_overflow() {
        let mut b = Backoff::new(BackoffPolicy::default());
        for _ in 0..10_000 {
            assert!(b.child_ended(Duration::ZERO, true) <= Duration::from_secs(30));
        }
    }

    #[test]
    fn a_stopped_child_restarts_at_once_and_does_not_count_as_a_failure() {
        let mut b = Backoff::new(policy());
        b.child_ended(MS, true);
        assert_eq!(b.child_ended(MS, false), Duration::ZERO);
        assert_eq!(b.child_ended(MS, true), 200 * MS, "the count is unchanged by a client-caused stop");
        assert_eq!(b.child_ended(20_000 * MS, false), Duration::ZERO);
        assert_eq!(b.child_ended(MS, true), 100 * MS, "a long session still resets the count");
    }

    fn up(now: Instant) -> Supervisor {
        let mut s = Supervisor::new(policy(), now);
        assert_eq!(s.restart_at(), Some(now), "the first child is started eagerly");
        assert!(!s.accepts_clients());
        assert_eq!(s.on(Event::Spawned, now), Action::None);
        s
    }

    #[test]
    fn the_first_client_is_attached_and_a_second_is_held_then_refused_while_the_first_stays() {
        let t0 = Instant::now();
        let mut s = up(t0);
        assert!(s.accepts_clients());
        assert_eq!(s.restart_at(), None);
        assert_eq!(s.on(Event::ClientConnected, t0), Action::Attach);
        assert!(s.accepts_clients(), "a second connection is accepted to be held, then answered");
        assert_eq!(s.on(Event::ClientConnected, t0), Action::Hold);
        assert_eq!(s.on(Event::ClientConnected, t0), Action::Refuse, "a third while one is held");
        assert_eq!(s.on(Event::HoldExpired, t0), Action::RefuseHeld);
        assert_eq!(s.on(Event::HoldExpired, t0), Action::None, "nothing held any more");
        assert_eq!(s.on(Event::ClientConnected, t0), Action::Hold, "the next newcomer is held again");
    }

    #[test]
    fn a_held_client_gets_the_fresh_child_when_the_current_client_turns_out_gone() {
        let t0 = Instant::now();
        let mut s = up(t0);
        s.on(Event::ClientConnected, t0);
        assert_eq!(s.on(Event::ClientConnected, t0), Action::Hold);
        assert_eq!(s.on(Event::ClientLeft, t0), Action::ReplaceChild);
        assert_eq!(s.on(Event::HoldExpired, t0), Action::None, "while Down the held client keeps waiting");
        assert_eq!(s.on(Event::Spawned, t0), Action::AttachHeld);
        assert_eq!(s.on(Event::ClientConnected, t0), Action::Hold, "serving the formerly held client");
    }

    #[test]
    fn a_held_client_waits_through_a_child_restart() {
        let t0 = Instant::now();
        let mut s = up(t0);
        s.on(Event::ClientConnected, t0);
        s.on(Event::ClientConnected, t0);
        assert_eq!(s.on(Event::ChildExited, t0), Action::ChildGone { restart_in: 100 * MS });
        assert_eq!(s.on(Event::Spawned, t0 + 100 * MS), Action::AttachHeld);
    }

    #[test]
    fn a_client_leaving_replaces_the_child_at_once() {
        let t0 = Instant::now();
        let mut s = up(t0);
        s.on(Event::ClientConnected, t0);
        assert_eq!(s.on(Event::ClientLeft, t0 + 5 * MS), Action::ReplaceChild);
        assert_eq!(s.restart_at(), Some(t0 + 5 * MS));
        assert!(!s.accepts_clients(), "the next client waits in the backlog for the fresh child");
        assert_eq!(s.on(Event::Spawned, t0 + 6 * MS), Action::None);
        assert_eq!(s.on(Event::ClientConnected, t0 + 7 * MS), Action::Attach);
    }

    #[test]
    fn a_child_exit_restarts_with_backoff_whether_or_not_a_client_is_connected() {
        let t0 = Instant::now();
        let mut s = up(t0);
        assert_eq!(s.on(Event::ChildExited, t0), Action::ChildGone { restart_in: 100 * MS });
        assert_eq!(s.restart_at(), Some(t0 + 100 * MS));
        s.on(Event::Spawned, t0 + 100 * MS);
        s.on(Event::ClientConnected, t0 + 100 * MS);
        assert_eq!(s.on(Event::ChildExited, t0 + 150 * MS), Action::ChildGone { restart_in: 200 * MS });
        assert_eq!(s.restart_at(), Some(t0 + 350 * MS));
        assert!(!s.accepts_clients());
    }

    #[test]
    fn shutdown_wins_from_every_state_and_nothing_follows_it() {
        let t0 = Instant::now();
        let down = Supervisor::new(policy(), t0);
        let idle = up(t0);
        let mut serving = up(t0);
        serving.on(Event::ClientConnected, t0);
        let mut holding = serving.clone();
        assert_eq!(holding.on(Event::ClientConnected, t0), Action::Hold);
        for mut s in [down, idle, serving, holding] {
            assert_eq!(s.on(Event::ShutdownRequested, t0), Action::Shutdown);
            assert_eq!(s.restart_at(), None, "no child is started while stopping");
            assert!(!s.accepts_clients());
            for e in [Event::Spawned, Event::ClientConnected, Event::HoldExpired, Event::ClientLeft, Event::ChildExited]
            {
                assert_eq!(s.on(e, t0), Action::None, "{e:?} after shutdown");
            }
        }
    }

    #[test]
    fn stale_reports_are_ignored() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(policy(), t0);
        assert_eq!(s.on(Event::ChildExited, t0), Action::None, "no child yet");
        assert_eq!(s.on(Event::ClientLeft, t0), Action::None, "no client yet");
        let mut s = up(t0);
        assert_eq!(s.on(Event::Spawned, t0), Action::None);
        assert_eq!(s.on(Event::ClientLeft, t0), Action::None, "idle: nobody to leave");
        assert_eq!(s.on(Event::HoldExpired, t0), Action::None, "idle: nothing held");
        assert!(s.accepts_clients(), "still idle");
    }
}
