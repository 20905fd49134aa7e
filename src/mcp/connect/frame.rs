//! The read side's guard on a byte-stream transport (stdio, the bridge socket).
//!
//! rmcp drops an over-long line and keeps waiting, which would leave the call pending until its
//! timeout and report the wrong error. The guard ends the stream instead and flags it; the pool
//! answers that call with `mcp_output_too_large` and starts a fresh session for the next one. It
//! also counts the lines that are not JSON-RPC (a server printing to stdout).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// An `AsyncRead` that fails once a line (one JSON-RPC message) grows past `limit` bytes, and
/// records that it did.
pub(crate) struct FrameGuard<R> {
    inner: R,
    limit: usize,
    line: usize,
    tripped: Arc<AtomicBool>,
    /// Whether the current line's first non-blank byte was seen yet.
    classified: bool,
    /// Lines that did not start like JSON (`{` or `[`): a server printing to stdout.
    garbage: Arc<AtomicU64>,
    server_id: Arc<str>,
}

impl<R> FrameGuard<R> {
    /// Guards `inner`; `tripped` is set when a frame is too large.
    pub(crate) fn new(inner: R, limit: usize, tripped: Arc<AtomicBool>) -> Self {
        FrameGuard {
            inner,
            limit,
            line: 0,
            tripped,
            classified: false,
            garbage: Arc::new(AtomicU64::new(0)),
            server_id: Arc::from(""),
        }
    }

    /// Names the server in the warning about non-JSON lines, counted in `garbage`.
    pub(crate) fn reporting(mut self, server_id: Arc<str>, garbage: Arc<AtomicU64>) -> Self {
        self.server_id = server_id;
        self.garbage = garbage;
        self
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for FrameGuard<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.tripped.load(Ordering::Relaxed) {
            return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "frame too large")));
        }
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll {
            let mut line = self.line;
            let mut classified = self.classified;
            let mut garbage = 0;
            for &byte in &buf.filled()[before..] {
                if byte == b'\n' {
                    classified = false;
                } else if !classified && !byte.is_ascii_whitespace() {
                    classified = true;
                    garbage += u64::from(byte != b'{' && byte != b'[');
                }
                line = if byte == b'\n' { 0 } else { line + 1 };
                if line > self.limit {
                    self.tripped.store(true, Ordering::Relaxed);
                    // An error must come with no bytes read (AsyncRead's contract); the stream
                    // is over anyway, so this read's bytes are dropped with it.
                    buf.set_filled(before);
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("a message exceeded the {}-byte frame limit", self.limit),
                    )));
                }
            }
            self.line = line;
            self.classified = classified;
            if garbage > 0 {
                self.garbage.fetch_add(garbage, Ordering::Relaxed);
                // The content is not logged: it is the server's, and may be anything.
                tracing::warn!(
                    server_id = %self.server_id,
                    lines = garbage,
                    "server wrote output that is not JSON-RPC to stdout (ignored); MCP stdio servers must log to stderr"
                );
            }
        }
        poll
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn frame_guard_passes_lines_within_the_limit_and_trips_past_it() {
        let tripped = Arc::new(AtomicBool::new(false));
        let data = b"1234\n12345\n".to_vec();
        let mut guard = FrameGuard::new(&data[..], 5, tripped.clone());
        let mut out = Vec::new();
        guard.read_to_end(&mut out).await.expect("within the limit");
        assert_eq!(out, data);
        assert!(!tripped.load(Ordering::Relaxed));

        let data = b"ok\n123456".to_vec();
        let mut guard = FrameGuard::new(&data[..], 5, tripped.clone());
        let err = guard.read_to_end(&mut Vec::new()).await.expect_err("too long");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(tripped.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn lines_that_are_not_json_are_counted_and_still_passed_on() {
        let garbage = Arc::new(AtomicU64::new(0));
        let data = b"starting server...\n{\"jsonrpc\":\"2.0\"}\n  [1]\n\nnot json\n".to_vec();
        let guard = FrameGuard::new(&data[..], 1024, Arc::new(AtomicBool::new(false)));
        let mut guard = guard.reporting("fx".into(), garbage.clone());
        let mut out = Vec::new();
        guard.read_to_end(&mut out).await.expect("read");
        assert_eq!(out, data, "rmcp decides what to do with the lines; the guard only counts");
        assert_eq!(garbage.load(Ordering::Relaxed), 2);
    }
}
