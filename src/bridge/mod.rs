//! `spearlet bridge`: the stdio sidecar. Runs a stdio MCP server as a child process and serves
//! its byte stream on a Unix socket, for the agent container of the same pod.
//!
//! ```text
//!  agent ──connect──▶ PATH.sock ──▶ Listener ──accept──▶ ┐
//!                                                        │ events      ┌────────────┐
//!  SIGTERM/SIGINT ──▶ CancellationToken ───────────────▶ ├───────────▶ │ Supervisor │ (policy.rs, pure)
//!  child exit ──▶ Child::wait ─────────────────────────▶ │             └─────┬──────┘
//!  client EOF/error ──▶ Session::client_gone ──────────▶ ┘                   │ actions
//!                                                                            ▼
//!      Session (relay.rs): client ⇄ child stdin/stdout      Child (child.rs): spawn, stop, stderr → log
//! ```
//!
//! This file is the thin I/O loop: it turns what happened into [`policy::Event`]s and carries
//! out the [`policy::Action`]s; every decision is in [`policy`]. Design notes: `README.md` here.

mod child;
pub mod policy;
mod relay;
mod socket;

use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::child::Child;
use self::policy::{Action, BackoffPolicy, Event, Supervisor};
use self::relay::{ClientGone, Session};
use self::socket::Listener;

pub(crate) use self::socket::SOCKET_MODE;

/// Pause after a failed `accept` (for example EMFILE), so a persistent error does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What `spearlet bridge` runs: where to listen and which command to start.
#[derive(Clone, Debug)]
pub(crate) struct BridgeConfig {
    /// Unix socket path to listen on; its directory must exist.
    pub(crate) socket: PathBuf,
    /// The MCP server's executable (looked up on PATH when it has no slash; never a shell).
    pub(crate) command: String,
    pub(crate) args: Vec<String>,
    /// Server id for log lines; defaults to the command's file name.
    pub(crate) server_id: Option<String>,
    /// Grace periods and restart backoff.
    pub(crate) timings: Timings,
    /// The only uid that may connect (the agent's, `SO_PEERCRED`); `None`: any.
    pub(crate) peer_uid: Option<u32>,
}

impl BridgeConfig {
    /// A configuration with the default [`Timings`] and no server id.
    pub(crate) fn new(socket: impl Into<PathBuf>, command: impl Into<String>, args: Vec<String>) -> Self {
        Self {
            socket: socket.into(),
            command: command.into(),
            args,
            server_id: None,
            timings: Timings::default(),
            peer_uid: None,
        }
    }

    /// The name log lines carry as `server_id`: the server id, else the command's file name.
    pub(crate) fn server_label(&self) -> String {
        if let Some(id) = &self.server_id {
            return id.clone();
        }
        let name = std::path::Path::new(&self.command).file_name().map(|n| n.to_string_lossy().into_owned());
        name.unwrap_or_else(|| self.command.clone())
    }
}

/// Grace periods and restart backoff of the bridge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timings {
    /// Restart delays for a child that exits on its own.
    pub(crate) backoff: BackoffPolicy,
    /// After its client left, how long the child may take to exit on stdin EOF before SIGTERM
    /// (the MCP stdio transport's own shutdown sequence).
    pub(crate) eof_grace: Duration,
    /// After SIGTERM for a child whose client left, how long before SIGKILL.
    pub(crate) term_grace: Duration,
    /// On shutdown, how long the child may take after SIGTERM before SIGKILL.
    pub(crate) shutdown_grace: Duration,
    /// When the child exits with a client connected, how long its last output may take to reach
    /// the client before the connection is closed.
    pub(crate) drain_grace: Duration,
    /// How long a connection that arrives while a client is connected is held before it is
    /// refused, in case the connected client is in fact gone (see `policy`).
    pub(crate) hold_grace: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            backoff: BackoffPolicy::default(),
            // Servers exit on EOF within milliseconds; this only bounds the replacement latency
            // of one that does not.
            eof_grace: Duration::from_secs(2),
            term_grace: Duration::from_secs(5),
            // Well inside Kubernetes' default 30 s terminationGracePeriodSeconds, leaving the
            // kubelet no reason to SIGKILL the sidecar itself.
            shutdown_grace: Duration::from_secs(10),
            drain_grace: Duration::from_secs(1),
            // Far longer than the moment between a client's close and the bridge seeing it, short
            // enough that a genuinely second client gets its answer without noticeable delay.
            hold_grace: Duration::from_millis(500),
        }
    }
}

/// Why the bridge stopped with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The command could not be started (not found, not executable, ...). Never retried.
    #[error("cannot start '{command}': {source}{hint}", hint = child::spawn_hint(.source.kind()))]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// The socket's directory is missing or unusable.
    #[error("socket directory {dir}: {reason}")]
    SocketDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Something other than a socket is at the socket path; the bridge does not delete it.
    #[error("{path} exists and is {kind}: refusing to replace it (remove it or choose another --socket)")]
    SocketPathTaken {
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// Binding or preparing the socket failed.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the bridge until `shutdown` is cancelled (then `Ok`) or the command cannot start.
///
/// On shutdown the child gets SIGTERM (SIGKILL after [`Timings::shutdown_grace`]) and the socket
/// file is removed; it is removed on the error paths too.
pub(crate) async fn run(config: BridgeConfig, shutdown: CancellationToken) -> Result<(), Error> {
    let server: Arc<str> = config.server_label().into();
    let span = tracing::info_span!("bridge", server_id = %server);
    async move {
        let listener = Listener::bind(&config.socket, config.peer_uid)?;
        tracing::info!(socket = %config.socket.display(), mode = format_args!("{SOCKET_MODE:o}"), "listening");
        let supervisor = Supervisor::new(config.timings.backoff, Instant::now());
        let mut bridge =
            Bridge { config, server, listener, supervisor, child: None, session: None, held: None, hold_timer: None };
        bridge.serve(shutdown).await
    }
    .instrument(span)
    .await
}

// === impl Bridge ===

/// What the I/O loop observed, with its payload.
enum Input {
    Shutdown,
    ClientGone(ClientGone),
    ChildExited(std::io::Result<ExitStatus>),
    SpawnDue,
    Accepted(std::io::Result<tokio::net::UnixStream>),
    HoldExpired,
}

struct Bridge {
    config: BridgeConfig,
    server: Arc<str>,
    listener: Listener,
    supervisor: Supervisor,
    child: Option<Child>,
    session: Option<Session>,
    /// The held connection (`Action::Hold`).
    held: Option<tokio::net::UnixStream>,
    /// End of the held connection's grace; cleared when it fires (a timer fires once).
    hold_timer: Option<Instant>,
}

impl Bridge {
    async fn serve(&mut self, shutdown: CancellationToken) -> Result<(), Error> {
        loop {
            let input = self.next_input(&shutdown).await;
            let event = match &input {
                Input::Shutdown => Event::ShutdownRequested,
                Input::ClientGone(_) => Event::ClientLeft,
                Input::ChildExited(_) => Event::ChildExited,
                Input::SpawnDue => {
                    self.child = Some(Child::spawn(&self.config, &self.server)?);
                    Event::Spawned
                }
                Input::Accepted(Ok(_)) => Event::ClientConnected,
                Input::HoldExpired => Event::HoldExpired,
                Input::Accepted(Err(error)) => {
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let action = self.supervisor.on(event, Instant::now());
            if self.execute(action, input).await {
                return Ok(());
            }
        }
    }

    async fn next_input(&mut self, shutdown: &CancellationToken) -> Input {
        let restart_at = self.supervisor.restart_at();
        let accepting = self.supervisor.accepts_clients();
        let hold_timer = self.hold_timer;
        tokio::select! {
            // Order matters when several are ready: shutdown first; a client's end before the
            // child's exit, because a client that closes makes the child exit on stdin EOF
            // right after, and that exit is the session ending, not a crash to back off from.
            biased;
            () = shutdown.cancelled() => Input::Shutdown,
            gone = client_gone(&mut self.session) => Input::ClientGone(gone),
            status = child_exit(&mut self.child) => Input::ChildExited(status),
            () = sleep_until(restart_at) => Input::SpawnDue,
            accepted = self.listener.accept(), if accepting => Input::Accepted(accepted),
            () = sleep_until(hold_timer) => {
                self.hold_timer = None;
                Input::HoldExpired
            }
        }
    }

    /// Carries out `action`; true when the bridge is done.
    async fn execute(&mut self, action: Action, input: Input) -> bool {
        match action {
            Action::None => {}
            Action::Attach => {
                let Input::Accepted(Ok(stream)) = input else { return false };
                self.attach(stream);
            }
            Action::AttachHeld => {
                self.hold_timer = None;
                let stream = self.held.take().expect("AttachHeld follows Hold, whose stream is kept until then");
                self.attach(stream);
            }
            Action::Hold => {
                let Input::Accepted(Ok(stream)) = input else { return false };
                tracing::debug!(grace = ?self.config.timings.hold_grace, "a client is connected; holding the new one");
                self.held = Some(stream);
                self.hold_timer = Some(Instant::now() + self.config.timings.hold_grace);
            }
            Action::Refuse => {
                let Input::Accepted(Ok(stream)) = input else { return false };
                refuse(stream);
            }
            Action::RefuseHeld => {
                if let Some(stream) = self.held.take() {
                    refuse(stream);
                }
            }
            Action::ReplaceChild => {
                let reason = match &input {
                    Input::ClientGone(gone) => gone.to_string(),
                    _ => "left".into(),
                };
                // Closes the client's stream and the child's stdin: the start of the stop sequence.
                self.session = None;
                if let Some(mut child) = self.child.take() {
                    let (pid, uptime) = (child.pid(), child.uptime());
                    let status = child.stop(self.config.timings.eof_grace, self.config.timings.term_grace).await;
                    tracing::info!(
                        pid,
                        ?uptime,
                        status = %display_status(&status),
                        "client {reason}; stopped its MCP server, starting a fresh one for the next client"
                    );
                }
            }
            Action::ChildGone { restart_in } => {
                let status = match &input {
                    Input::ChildExited(status) => display_status(status),
                    _ => "unknown".into(),
                };
                let (pid, uptime) = self.child.take().map(|c| (c.pid(), c.uptime())).unwrap_or_default();
                tracing::warn!(pid, ?uptime, %status, ?restart_in, "MCP server exited; restarting");
                if let Some(session) = self.session.take() {
                    session.drain(self.config.timings.drain_grace).await;
                    tracing::info!("disconnected the client: its MCP server exited");
                }
            }
            Action::Shutdown => {
                tracing::info!("shutting down: forwarding SIGTERM to the MCP server");
                if let Some(mut child) = self.child.take() {
                    let status = child.stop(Duration::ZERO, self.config.timings.shutdown_grace).await;
                    tracing::info!(pid = child.pid(), status = %display_status(&status), "MCP server stopped");
                }
                self.session = None;
                self.held = None;
                return true;
            }
        }
        false
    }

    /// Relays `stream` to the current child.
    fn attach(&mut self, stream: tokio::net::UnixStream) {
        let child = self.child.as_mut().expect("attaching happens only when a spawned child is up");
        let (stdin, stdout) =
            child.take_stdio().expect("a child serves one session: every client that leaves replaces it");
        tracing::info!(pid = child.pid(), "client connected");
        self.session = Some(Session::start(stream, stdin, stdout));
    }
}

fn refuse(stream: tokio::net::UnixStream) {
    tracing::warn!("refused a second client: another one is connected (one client at a time)");
    tokio::spawn(relay::refuse(stream).in_current_span());
}

async fn client_gone(session: &mut Option<Session>) -> ClientGone {
    match session {
        Some(session) => session.client_gone().await,
        None => std::future::pending().await,
    }
}

async fn child_exit(child: &mut Option<Child>) -> std::io::Result<ExitStatus> {
    match child {
        Some(child) => child.wait().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn display_status(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("unknown ({e})"),
    }
}
