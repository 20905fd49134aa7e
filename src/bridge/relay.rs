//! One client session: two byte pumps between the client's Unix stream and the child's stdio.
//!
//! ```text
//!  client ──read──▶ [up pump]   ──write──▶ child stdin     (client EOF: child stdin closed)
//!  client ◀─write── [down pump] ◀──read─── child stdout    (child EOF: client write side shut)
//!                        │
//!                        └── each pump reports how it ended ──▶ Session::client_gone / drain
//! ```
//!
//! Bytes move as soon as they are read: no framing, no waiting for a newline, any message size.
//! The pumps report which side ended so the supervisor can tell "the client left" from "the child
//! went away" (the latter is learned from the process exit, not from its pipes).

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// Bytes moved per read: large enough for multi-MiB messages to cross in few syscalls, small
/// enough to be a negligible per-session cost.
const PUMP_BUF: usize = 64 * 1024;

/// What a second client reads before its connection is closed: a JSON-RPC error (id null, as for
/// a request that could not be read), so an MCP client reports a reason instead of a bare EOF.
pub(super) const BUSY_REPLY: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32000,\"message\":\"spearlet bridge: another client is connected to this MCP server (one client at a time); connect again after it disconnects\"}}\n";

/// Which pump reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// Client → child stdin.
    Up,
    /// Child stdout → client.
    Down,
}

/// How a pump ended.
#[derive(Debug)]
enum End {
    /// The source reached end of stream.
    SourceEof,
    SourceFailed(io::Error),
    SinkFailed(io::Error),
}

/// Why a session's client is considered gone.
#[derive(Debug)]
pub(super) enum ClientGone {
    /// The client closed its stream (or its write side: a half-close ends the session too).
    Closed,
    /// Reading from or writing to the client failed (reset, broken pipe).
    Failed(io::Error),
}

impl std::fmt::Display for ClientGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => f.write_str("closed its connection"),
            Self::Failed(e) => write!(f, "connection failed: {e}"),
        }
    }
}

/// A client relayed to a child. Dropping it stops both pumps and closes the client's stream and
/// the child's stdin.
pub(super) struct Session {
    reports: mpsc::UnboundedReceiver<(Direction, End)>,
    pumps: [JoinHandle<()>; 2],
    /// Set once the down pump (child → client) has reported.
    down_done: bool,
}

impl Session {
    /// Starts relaying `client` to the child's `stdin`/`stdout`.
    pub(super) fn start(client: UnixStream, stdin: ChildStdin, stdout: ChildStdout) -> Self {
        let (client_read, client_write) = client.into_split();
        let (tx, reports) = mpsc::unbounded_channel();
        let up = tokio::spawn(report(Direction::Up, tx.clone(), pump(client_read, stdin)).in_current_span());
        let down = tokio::spawn(report(Direction::Down, tx, pump(stdout, client_write)).in_current_span());
        Self { reports, pumps: [up, down], down_done: false }
    }

    /// Resolves when the client is gone: its stream ended or failed (cancel-safe).
    ///
    /// Ends on the child's side (its stdin closed, its stdout ended) are not reported here: the
    /// process exit is what counts for the child, and it arrives separately.
    pub(super) async fn client_gone(&mut self) -> ClientGone {
        loop {
            let Some((direction, end)) = self.reports.recv().await else {
                // Both pumps reported already; the caller learns the rest from the child.
                return std::future::pending().await;
            };
            if let Some(gone) = self.note(direction, end) {
                return gone;
            }
        }
    }

    /// Records a pump's end; the client's ends are returned, the child's are left to the exit.
    fn note(&mut self, direction: Direction, end: End) -> Option<ClientGone> {
        if direction == Direction::Down {
            self.down_done = true;
        }
        match (direction, end) {
            (Direction::Up, End::SourceEof) => Some(ClientGone::Closed),
            (Direction::Up, End::SourceFailed(e)) | (Direction::Down, End::SinkFailed(e)) => {
                Some(ClientGone::Failed(e))
            }
            (Direction::Up, End::SinkFailed(_)) | (Direction::Down, End::SourceEof | End::SourceFailed(_)) => None,
        }
    }

    /// Waits up to `grace` for the child's remaining output to reach the client (the child has
    /// exited; its stdout ends unless something it started still holds it), then closes.
    pub(super) async fn drain(mut self, grace: Duration) {
        let until_down_done = async {
            while !self.down_done {
                match self.reports.recv().await {
                    Some((Direction::Down, _)) | None => self.down_done = true,
                    Some((Direction::Up, _)) => {}
                }
            }
        };
        let _ = tokio::time::timeout(grace, until_down_done).await;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for pump in &self.pumps {
            pump.abort();
        }
    }
}

async fn report(direction: Direction, tx: mpsc::UnboundedSender<(Direction, End)>, pump: impl Future<Output = End>) {
    let end = pump.await;
    tracing::debug!(?direction, ?end, "relay direction ended");
    // The session may be gone already; then nobody needs the report.
    let _ = tx.send((direction, end));
}

/// Copies bytes from `source` to `sink` until either side ends; at source EOF the sink is shut
/// down (child stdin closed, or the client's read side sees EOF).
async fn pump(mut source: impl AsyncRead + Unpin, mut sink: impl AsyncWrite + Unpin) -> End {
    let mut buf = vec![0u8; PUMP_BUF];
    loop {
        let n = match source.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => return End::SourceFailed(e),
        };
        if let Err(e) = sink.write_all(&buf[..n]).await {
            return End::SinkFailed(e);
        }
    }
    match sink.shutdown().await {
        Ok(()) => End::SourceEof,
        Err(e) => End::SinkFailed(e),
    }
}

/// Tells a client that another one is connected, then closes its connection.
pub(super) async fn refuse(mut client: UnixStream) {
    // Best effort: a client that is already gone needs no explanation.
    let _ = client.write_all(BUSY_REPLY).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_reply_is_one_json_rpc_error_line() {
        let text = std::str::from_utf8(BUSY_REPLY).expect("ASCII");
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        let reply: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
        assert_eq!(reply["jsonrpc"], "2.0");
        assert!(reply["id"].is_null());
        assert_eq!(reply["error"]["code"], -32000);
    }

    #[tokio::test]
    async fn pump_moves_bytes_without_waiting_for_a_newline_and_shuts_the_sink_at_eof() {
        let (mut near, far) = tokio::io::duplex(16);
        let (sink, mut out) = tokio::io::duplex(16);
        let task = tokio::spawn(pump(far, sink));
        near.write_all(b"no newline").await.expect("write");
        let mut got = [0u8; 10];
        tokio::time::timeout(Duration::from_secs(5), out.read_exact(&mut got)).await.expect("in time").expect("read");
        assert_eq!(&got, b"no newline");
        drop(near);
        let end = tokio::time::timeout(Duration::from_secs(5), task).await.expect("in time").expect("join");
        assert!(matches!(end, End::SourceEof), "{end:?}");
        let mut rest = Vec::new();
        out.read_to_end(&mut rest).await.expect("EOF after shutdown");
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn pump_reports_a_failed_sink() {
        let (mut near, far) = tokio::io::duplex(16);
        let (sink, out) = tokio::io::duplex(16);
        drop(out);
        let task = tokio::spawn(pump(far, sink));
        near.write_all(b"x").await.expect("write");
        let end = tokio::time::timeout(Duration::from_secs(5), task).await.expect("in time").expect("join");
        assert!(matches!(end, End::SinkFailed(_)), "{end:?}");
    }
}
