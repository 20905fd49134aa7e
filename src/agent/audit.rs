//! The audit log: one JSON line per tool call, whichever door it came through. Arguments are redacted unless the operator turns them on.

use parking_lot::Mutex;
use std::io::{BufWriter, Write};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

/// Which door a call came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Door {
    /// `POST /v1/chat/completions` (the tool loop).
    Chat,
    /// The aggregated `/mcp` endpoint.
    Mcp,
    /// The gRPC `McpSessions` service.
    Grpc,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct AuditLine<'a> {
    /// When the call finished (RFC 3339).
    pub(crate) ts: String,
    /// The chat completion, MCP request or gRPC call this belongs to.
    pub(crate) request_id: &'a str,
    /// The `/mcp` or gRPC session, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) session_id: Option<&'a str>,
    pub(crate) door: Door,
    /// The McpProfile in force.
    pub(crate) profile: &'a str,
    /// The registry revision the decision used.
    pub(crate) registry_revision: &'a str,
    /// The server called (absent when the name did not route anywhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_id: Option<&'a str>,
    /// The tool's name on its server, or the name as asked for when it did not route.
    pub(crate) tool_name: &'a str,
    /// The model-facing name the caller used.
    pub(crate) called_as: &'a str,
    /// `ok`, or the error code.
    pub(crate) status: &'a str,
    /// Wall time of the call in milliseconds.
    pub(crate) latency_ms: f64,
    /// Size of the result before any cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output_bytes: Option<usize>,
    /// The arguments when the audit includes them; `"[redacted]"` otherwise.
    pub(crate) arguments: Value,
}

/// Lines waiting for the writer thread; past this, a call waits (audit lines are never dropped).
const QUEUE_LINES: usize = 4096;

enum Message {
    Line(Vec<u8>),
    /// Write out everything queued so far, then answer.
    Flush(mpsc::Sender<()>),
}

/// Where audit lines go. Lines are handed to a writer thread, so a call never waits for the
/// disk; the thread flushes whenever the queue is drained (one syscall for a burst of lines, at
/// once when traffic is light).
pub struct AuditSink {
    queue: Option<SyncSender<Message>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    include_arguments: bool,
}

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSink")
            .field("enabled", &self.queue.is_some())
            .field("include_arguments", &self.include_arguments)
            .finish()
    }
}

/// The writer thread: write what comes, flush when nothing more is waiting.
fn write_lines(queue: Receiver<Message>, writer: Box<dyn Write + Send>) {
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    let mut failed = false;
    let report = |result: std::io::Result<()>, failed: &mut bool| {
        // One warning per failure streak, not one per line.
        match result {
            Err(e) if !*failed => {
                tracing::warn!(error = %e, "audit lines not written");
                *failed = true;
            }
            Err(_) => {}
            Ok(()) => *failed = false,
        }
    };
    while let Ok(message) = queue.recv() {
        let mut next = Some(message);
        while let Some(message) = next.take() {
            match message {
                Message::Line(line) => report(writer.write_all(&line), &mut failed),
                Message::Flush(done) => {
                    report(writer.flush(), &mut failed);
                    let _ = done.send(());
                }
            }
            next = queue.try_recv().ok();
        }
        report(writer.flush(), &mut failed);
    }
    report(writer.flush(), &mut failed);
}

impl AuditSink {
    /// Audit lines to `writer`, with arguments when `include_arguments`.
    pub(crate) fn new(writer: Box<dyn Write + Send>, include_arguments: bool) -> Self {
        let (queue, lines) = mpsc::sync_channel(QUEUE_LINES);
        let thread = std::thread::Builder::new().name("spear-audit".into()).spawn(move || write_lines(lines, writer));
        match thread {
            Ok(handle) => AuditSink { queue: Some(queue), writer: Mutex::new(Some(handle)), include_arguments },
            Err(e) => {
                tracing::error!(error = %e, "cannot start the audit writer thread: audit is off");
                AuditSink::disabled()
            }
        }
    }

    pub fn disabled() -> Self {
        AuditSink { queue: None, writer: Mutex::new(None), include_arguments: false }
    }

    /// Lines go to stderr, beside the logs.
    pub(crate) fn stderr(include_arguments: bool) -> Self {
        AuditSink::new(Box::new(std::io::stderr()), include_arguments)
    }

    /// What the `arguments` field of a line holds for these arguments.
    pub(crate) fn arguments(&self, arguments: Option<&Map<String, Value>>) -> Value {
        match (self.include_arguments, arguments) {
            (true, Some(args)) => Value::Object(args.clone()),
            (true, None) => Value::Null,
            (false, _) => Value::String("[redacted]".into()),
        }
    }

    /// Queues one line. A failing sink is logged, never fails the call.
    pub(crate) fn record(&self, line: &AuditLine<'_>) {
        let Some(queue) = &self.queue else { return };
        let mut bytes = match serde_json::to_vec(line) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(error = %e, "audit line not serializable");
                return;
            }
        };
        bytes.push(b'\n');
        match queue.try_send(Message::Line(bytes)) {
            Ok(()) => {}
            // A full queue means the disk is slower than the calls: wait rather than lose lines.
            Err(TrySendError::Full(message)) => {
                let _ = queue.send(message);
            }
            Err(TrySendError::Disconnected(_)) => tracing::warn!("audit writer gone: line not written"),
        }
    }

    /// Waits until every line queued so far is written and flushed (before the process exits).
    pub(crate) fn flush(&self) {
        let Some(queue) = &self.queue else { return };
        let (done, written) = mpsc::channel();
        if queue.send(Message::Flush(done)).is_ok() {
            let _ = written.recv_timeout(Duration::from_secs(5));
        }
    }
}

/// The current time as RFC 3339 (UTC).
pub(crate) fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// Milliseconds as a float with microsecond precision.
pub(crate) fn millis(latency: Duration) -> f64 {
    (latency.as_micros() as f64) / 1000.0
}

impl Drop for AuditSink {
    fn drop(&mut self) {
        // Closing the queue ends the thread after it wrote everything.
        self.queue.take();
        let handle = self.writer.lock().take();
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line<'a>(arguments: Value) -> AuditLine<'a> {
        AuditLine {
            ts: now(),
            request_id: "req-1",
            session_id: None,
            door: Door::Chat,
            profile: "default",
            registry_revision: "abc",
            server_id: Some("fs"),
            tool_name: "read_file",
            called_as: "mcp__fs__read_file",
            status: "ok",
            latency_ms: 1.5,
            output_bytes: Some(10),
            arguments,
        }
    }

    #[test]
    fn arguments_are_redacted_by_default() {
        let shared = Shared::default();
        let sink = AuditSink::new(Box::new(shared.clone()), false);
        let args: Map<String, Value> = serde_json::from_str(r#"{"token": "s3cret"}"#).expect("json");
        sink.record(&line(sink.arguments(Some(&args))));
        sink.flush();
        let text = String::from_utf8(shared.0.lock().clone()).expect("utf8");
        assert!(!text.contains("s3cret"), "{text}");
        let parsed: Value = serde_json::from_str(text.trim_end()).expect("one JSON line");
        assert_eq!(parsed["arguments"], "[redacted]");
        assert_eq!(parsed["server_id"], "fs");
        assert_eq!(parsed["request_id"], "req-1");
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
    }

    #[test]
    fn a_burst_of_lines_from_many_threads_arrives_whole_and_in_full() {
        let shared = Shared::default();
        let sink = std::sync::Arc::new(AuditSink::new(Box::new(shared.clone()), false));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        sink.record(&line(Value::Null));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        drop(std::sync::Arc::into_inner(sink));
        let text = String::from_utf8(shared.0.lock().clone()).expect("utf8");
        assert_eq!(text.lines().count(), 8000);
        for l in text.lines() {
            serde_json::from_str::<Value>(l).expect("every line is one whole JSON object");
        }
    }

    #[test]
    fn arguments_are_kept_when_enabled() {
        let shared = Shared::default();
        let sink = AuditSink::new(Box::new(shared.clone()), true);
        let args: Map<String, Value> = serde_json::from_str(r#"{"path": "/tmp"}"#).expect("json");
        sink.record(&line(sink.arguments(Some(&args))));
        sink.flush();
        let text = String::from_utf8(shared.0.lock().clone()).expect("utf8");
        let parsed: Value = serde_json::from_str(text.trim_end()).expect("one JSON line");
        assert_eq!(parsed["arguments"]["path"], "/tmp");
    }
}
