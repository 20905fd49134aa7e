//! The audit log: one JSON line per tool call, whichever door it came through. Arguments are redacted unless the operator turns them on.
//!
//! Lines go through a queue to a writer thread, bounded by bytes rather than lines so that a
//! burst is absorbed whole. When the queue is full (stderr or the disk stalled), a line is dropped
//! and counted in `mcp_audit_dropped_lines_total` rather than waited for: waiting would block the
//! runtime's only worker thread, so a stalled log would stop every door and `/healthz` with it.
//! Alert on the counter where lost lines matter.

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
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
    /// The authenticated caller (the gateway's); absent in a pod, whose caller is the pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) caller: Option<&'a str>,
    pub(crate) door: Door,
    /// The McpProfile in force.
    pub(crate) profile: &'a str,
    /// The registry revision the decision used.
    pub(crate) registry_revision: &'a str,
    /// The server called (absent when the name did not route anywhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_id: Option<&'a str>,
    /// `resource` or `prompt` for a read or a get; absent for a tool call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<crate::policy::items::ItemKind>,
    /// The tool's name on its server (a resource's URI, a prompt's name), or the name as asked
    /// for when it did not route.
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
    /// The approver's decision, for a call that needed approval and reached one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) approval: Option<&'a ApprovalRecord>,
    /// Why governance refused the call (`not_in_profile`, `denied_by:<layer>`, `env_missing`,
    /// `rate_limited`, `pin_mismatch`, `secret_in_arguments`, ...): one of a fixed set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<&'static str>,
}

/// An approver's decision on a call, as its audit line records it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ApprovalRecord {
    /// `caller` or `webhook`.
    pub(crate) approver: &'static str,
    /// `allow`, `deny`, `timeout` or `error`.
    pub(crate) decision: &'static str,
    /// How long the approver took.
    pub(crate) latency_ms: f64,
    /// The approver's reason (bounded, one line) or the agent's account.
    pub(crate) reason: String,
}

/// Bytes of lines waiting for the writer thread; past this, lines are dropped and counted
/// (about 64,000 lines: many seconds of a busy agent's calls, enough to ride out a slow disk).
const QUEUE_BYTES: usize = 32 << 20;

enum Message {
    Line(Vec<u8>),
    /// Write out everything queued so far, then answer.
    Flush(mpsc::Sender<()>),
}

/// Where audit lines go. Lines are handed to a writer thread, so a call never waits for the
/// disk; the thread flushes whenever the queue is drained (one syscall for a burst of lines, at
/// once when traffic is light).
pub struct AuditSink {
    queue: Option<Sender<Message>>,
    /// Bytes queued and not yet written.
    queued: Arc<AtomicUsize>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    include_arguments: bool,
    /// Lines dropped because the queue was full.
    dropped: Counter,
    /// The values redacted from every line (see [`AuditSink::redact_with`]).
    secrets: Option<Arc<crate::secrets::HeldSecrets>>,
}

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSink")
            .field("enabled", &self.queue.is_some())
            .field("include_arguments", &self.include_arguments)
            .finish()
    }
}

/// How long the writer rests after a flush before it waits for lines again. Lines queued
/// meanwhile wait for it, but no call wakes it: waking a parked thread is a syscall on the
/// call's path and a context switch on its core, about a tenth of a sequential `/mcp` call's
/// time in the agent (`../shared/bench/side-by-side`, `perf sched`). Under load the writer wakes
/// 500 times a second instead of once per call; a line reaches the log at most this much later.
const WRITER_LINGER: Duration = Duration::from_millis(2);

/// The writer thread: write what comes, flush when nothing more is waiting, then rest.
fn write_lines(queue: Receiver<Message>, writer: Box<dyn Write + Send>, queued: Arc<AtomicUsize>) {
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
                Message::Line(line) => {
                    report(writer.write_all(&line), &mut failed);
                    queued.fetch_sub(line.len(), Ordering::Relaxed);
                }
                Message::Flush(done) => {
                    report(writer.flush(), &mut failed);
                    let _ = done.send(());
                }
            }
            next = queue.try_recv().ok();
        }
        report(writer.flush(), &mut failed);
        std::thread::sleep(WRITER_LINGER);
    }
    report(writer.flush(), &mut failed);
}

impl AuditSink {
    /// Audit lines to `writer`, with arguments when `include_arguments`.
    pub fn new(writer: Box<dyn Write + Send>, include_arguments: bool) -> Self {
        let (queue, lines) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let counted = queued.clone();
        let thread =
            std::thread::Builder::new().name("spear-audit".into()).spawn(move || write_lines(lines, writer, counted));
        match thread {
            Ok(handle) => AuditSink {
                queue: Some(queue),
                queued,
                writer: Mutex::new(Some(handle)),
                include_arguments,
                dropped: Counter::default(),
                secrets: None,
            },
            Err(e) => {
                tracing::error!(error = %e, "cannot start the audit writer thread: audit is off");
                AuditSink::disabled()
            }
        }
    }

    pub fn disabled() -> Self {
        AuditSink {
            queue: None,
            queued: Arc::default(),
            writer: Mutex::new(None),
            include_arguments: false,
            dropped: Counter::default(),
            secrets: None,
        }
    }

    /// Registers the dropped-lines counter as `mcp_audit_dropped_lines`.
    /// A second handle on this sink's writer (the gateway's agents, one per profile, write one
    /// log). The writer thread stays with the original, which flushes and joins it when dropped.
    pub(crate) fn handle(&self) -> Self {
        AuditSink {
            queue: self.queue.clone(),
            queued: self.queued.clone(),
            writer: Mutex::new(None),
            include_arguments: self.include_arguments,
            dropped: self.dropped.clone(),
            secrets: None,
        }
    }

    pub(crate) fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "mcp_audit_dropped_lines",
            "Audit lines dropped because the audit writer could not keep up (stalled stderr or disk)",
            self.dropped.clone(),
        );
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

    /// Lines are redacted of the values `secrets` holds (in their JSON spelling too) before
    /// they are queued: arguments, when included, and names come from callers and models.
    pub(crate) fn redact_with(&mut self, secrets: Arc<crate::secrets::HeldSecrets>) {
        self.secrets = Some(secrets);
    }

    /// Queues one line without waiting: a full queue drops it (counted). A failing sink is
    /// logged, never fails the call.
    pub(crate) fn record<T: Serialize>(&self, line: &T) {
        let Some(queue) = &self.queue else { return };
        let mut bytes = match serde_json::to_vec(line) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(error = %e, "audit line not serializable");
                return;
            }
        };
        if let Some(secrets) = &self.secrets {
            let held = secrets.redactor();
            if !held.is_empty()
                && let Ok(text) = std::str::from_utf8(&bytes)
                && let std::borrow::Cow::Owned(clean) = held.redact(text)
            {
                bytes = clean.into_bytes();
            }
        }
        bytes.push(b'\n');
        // The writer is stalled: waiting here would block the runtime's worker, and with it
        // every door. One warning per power of two dropped, not one per line.
        let len = bytes.len();
        if self.queued.fetch_add(len, Ordering::Relaxed) + len > QUEUE_BYTES {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            let dropped = self.dropped.inc() + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(dropped, "audit writer stalled: audit lines dropped (mcp_audit_dropped_lines_total)");
            }
            return;
        }
        if queue.send(Message::Line(bytes)).is_err() {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            tracing::warn!("audit writer gone: line not written");
        }
    }

    /// Waits until every line queued so far is written and flushed (before the process exits).
    pub(crate) fn flush(&self) {
        let Some(queue) = &self.queue else { return };
        // Bounded: a stalled writer must not hold the process's exit either.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let (done, written) = mpsc::channel();
        if queue.send(Message::Flush(done)).is_err() {
            return;
        }
        let _ = written.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
    }
}

/// Longest name copied into a line: names come from callers and models, unbounded.
const MAX_NAME_BYTES: usize = 256;

/// `name` cut to [`MAX_NAME_BYTES`] on a character boundary.
pub(crate) fn capped(name: &str) -> &str {
    &name[..name.floor_char_boundary(MAX_NAME_BYTES)]
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
        // Closing the queue ends the thread after it wrote everything; a stalled writer is left
        // behind (bounded by `flush`) rather than holding the process's exit.
        self.flush();
        let drained = self.queued.load(Ordering::Relaxed) == 0;
        self.queue.take();
        let handle = self.writer.lock().take();
        // The thread ends when the last handle's queue closes: with other handles alive (one
        // holds `queued` besides this sink and the thread), joining would wait for them.
        let last = Arc::strong_count(&self.queued) <= 2;
        if let Some(handle) = handle.filter(|_| drained && last) {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
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
            caller: None,
            door: Door::Chat,
            profile: "default",
            registry_revision: "abc",
            server_id: Some("fs"),
            kind: None,
            tool_name: "read_file",
            called_as: "mcp__fs__read_file",
            status: "ok",
            latency_ms: 1.5,
            output_bytes: Some(10),
            arguments,
            approval: None,
            reason: None,
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

    /// A writer that blocks until released, as a stalled stderr pipe or disk does.
    struct Stalled(Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>);

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (released, wake) = &*self.0;
            let mut released = released.lock();
            while !*released {
                wake.wait(&mut released);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The attack (or accident): a stalled audit sink. Recording must never wait on it; lines
    /// past the queue are dropped and counted.
    #[test]
    fn a_stalled_writer_never_blocks_a_call_and_drops_are_counted() {
        let gate = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let sink = Arc::new(AuditSink::new(Box::new(Stalled(gate.clone())), false));
        let recorder = sink.clone();
        // Twice what the queue holds (a line here is about 300 bytes).
        const LINES: usize = 2 * QUEUE_BYTES / 300;
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            // BufWriter holds 64 KiB before the writer is reached; the queue then fills.
            for _ in 0..LINES {
                recorder.record(&line(Value::Null));
            }
            let _ = done.send(());
        });
        finished.recv_timeout(Duration::from_secs(20)).expect("recording returned while the writer was stalled");
        let dropped = sink.dropped.get();
        assert!(dropped > 0 && dropped < LINES as u64, "dropped {dropped}");
        let (released, wake) = &*gate;
        *released.lock() = true;
        wake.notify_all();
    }

    #[test]
    fn names_are_capped_on_a_character_boundary() {
        assert_eq!(capped("mcp__fs__read"), "mcp__fs__read");
        let long = "é".repeat(1000);
        let cut = capped(&long);
        assert!(cut.len() <= MAX_NAME_BYTES && cut.len() >= MAX_NAME_BYTES - 1 && cut.chars().all(|c| c == 'é'));
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
