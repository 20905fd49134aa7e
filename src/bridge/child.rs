//! The MCP server process: spawn it from argv (never a shell), forward its stderr to the log,
//! stop it the way the MCP stdio transport asks (stdin EOF, then SIGTERM, then SIGKILL).
//!
//! ```text
//!  argv ──spawn──▶ child (own process group)
//!                    stdin  ◀── relay (client → child)
//!                    stdout ──▶ relay (child → client)
//!                    stderr ──▶ forward_stderr ──▶ tracing (target spear::bridge, server_id, pid)
//! ```
//!
//! The child leads its own process group so that signals reach what it started too (`npx` runs
//! `node`, `uvx` runs `python`), and a Ctrl-C in a terminal reaches it only through the bridge.

use std::io;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::{BridgeConfig, Error};

/// A stderr line longer than this is logged in pieces: a child that writes megabytes without a
/// newline must not grow the bridge's memory without bound.
const MAX_LOG_LINE: usize = 16 * 1024;

/// How long the stderr forwarder may take to log a dead child's last lines before moving on
/// (its last words, often the reason it died, belong in the log before the restart message).
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// One running MCP server process.
pub(super) struct Child {
    inner: tokio::process::Child,
    pid: u32,
    started: Instant,
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    stderr_task: Option<JoinHandle<()>>,
    /// Set once the process has been waited for: its pid (and process group id) may be reused
    /// from then on, so no signal is sent after it.
    reaped: bool,
}

impl Child {
    /// Starts the configured command with piped stdio; an error is fatal for the bridge.
    pub(super) fn spawn(config: &BridgeConfig, server: &Arc<str>) -> Result<Self, Error> {
        let mut command = Command::new(&config.command);
        command
            .args(&config.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Backstop: a child is never left running when its handle is dropped (a panic, an
            // early return); the orderly paths stop it explicitly first.
            .kill_on_drop(true)
            // 0 = a new process group whose id is the child's pid (see the module header).
            .process_group(0);
        let mut inner = command.spawn().map_err(|source| Error::Spawn { command: config.command.clone(), source })?;
        let pid = inner.id().expect("a child that was just spawned and not yet waited for has a pid");
        let stderr_task = inner.stderr.take().map(|stderr| {
            let server = Arc::clone(server);
            tokio::spawn(forward_stderr(stderr, server, pid).in_current_span())
        });
        tracing::info!(pid, command = %config.command, args = ?config.args, "MCP server started");
        Ok(Self {
            pid,
            started: Instant::now(),
            stdin: inner.stdin.take(),
            stdout: inner.stdout.take(),
            stderr_task,
            inner,
            reaped: false,
        })
    }

    /// The process id (also its process group id).
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// How long the process has been running.
    pub(super) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Hands the stdio pipes to a session. `None` if a session already took them.
    pub(super) fn take_stdio(&mut self) -> Option<(ChildStdin, ChildStdout)> {
        Some((self.stdin.take()?, self.stdout.take()?))
    }

    /// Waits for the process to exit (cancel-safe), then lets the stderr forwarder finish.
    pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.inner.wait().await;
        self.reaped = true;
        self.drain_stderr().await;
        status
    }

    /// Stops the process: closes its stdin and waits `eof_grace` (MCP stdio servers exit at end of
    /// input), then SIGTERM and `term_grace`, then SIGKILL. A zero `eof_grace` skips the first step.
    pub(super) async fn stop(&mut self, eof_grace: Duration, term_grace: Duration) -> io::Result<ExitStatus> {
        self.stdin = None;
        if !eof_grace.is_zero()
            && let Ok(status) = tokio::time::timeout(eof_grace, self.wait()).await
        {
            return status;
        }
        self.signal(Signal::TERM);
        if let Ok(status) = tokio::time::timeout(term_grace, self.wait()).await {
            return status;
        }
        tracing::warn!(pid = self.pid, grace = ?term_grace, "MCP server ignored SIGTERM; sending SIGKILL");
        self.signal(Signal::KILL);
        self.wait().await
    }

    /// Sends `signal` to the child's process group, unless the child was already reaped.
    fn signal(&self, signal: Signal) {
        if self.reaped {
            return;
        }
        if let Err(error) = crate::child::signal_group(self.pid, signal) {
            tracing::warn!(pid = self.pid, ?signal, %error, "cannot signal the MCP server");
        }
    }

    async fn drain_stderr(&mut self) {
        if let Some(task) = self.stderr_task.take() {
            // A grandchild may keep stderr open forever: bounded, then the forwarder runs on alone.
            let _ = tokio::time::timeout(STDERR_DRAIN, task).await;
        }
    }
}

/// Logs each stderr line of the child at `info` (its own log, not an error of ours), tagged with
/// the server id and pid. Never writes to stdout: the bridge's stdout carries nothing.
async fn forward_stderr(stderr: ChildStderr, server: Arc<str>, pid: u32) {
    crate::child::for_each_line(stderr, MAX_LOG_LINE, |text| {
        tracing::info!(target: "spear::bridge", server_id = %server, pid, stream = "stderr", "{text}");
    })
    .await;
}

/// A hint for the common reasons a command cannot start, appended to the spawn error.
pub(super) fn spawn_hint(kind: io::ErrorKind) -> &'static str {
    match kind {
        io::ErrorKind::NotFound => " (is it installed in this image and on PATH?)",
        io::ErrorKind::PermissionDenied => " (is it an executable file?)",
        _ => "",
    }
}
