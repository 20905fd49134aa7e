//! What both binaries share for being observed: logging (tracing to stderr, plain or JSON), the
//! OpenTelemetry traces (`otel`, off unless `OTEL_EXPORTER_OTLP_*ENDPOINT` is set), the metrics (built once per process on one `prometheus_client::Registry`) and the admin router
//! that serves health, readiness and metrics.
//!
//! stderr only: an MCP stdio stream (the bridge's stdout) must never carry a log line.
//!
//! Log lines go through a bounded, lossy queue to one writer thread: a stalled stderr (a full
//! pipe nobody reads) must never block the thread that logs, which is the runtime's worker and
//! with it every door and `/healthz`. Lines past the queue are dropped and counted in
//! `spear_log_dropped_lines_total`. The audit writer has its own thread and queue (`agent::audit`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use clap::{Args, ValueEnum};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;

pub mod otel;

/// Default filter when neither `--log-level` nor `SPEAR_LOG` is set. rmcp's transport worker
/// logs an ERROR when a server's transport ends (a connect refused, a stream closed); the pool
/// logs the same failure as a WARN naming the server and what it does next, so the worker's
/// line is only a duplicate without the server id, and a degraded server must not read as an
/// agent error (seen in the first real pod: one ERROR per reconnect to an absent HTTP server).
pub(crate) const DEFAULT_LOG_FILTER: &str = "spear=info,rmcp::transport::worker=off,warn";

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Logging flags shared by every subcommand.
#[derive(Args, Clone, Debug)]
pub(crate) struct LogArgs {
    /// Log filter in `tracing` EnvFilter syntax (for example `spear=debug,warn`).
    #[arg(long, global = true, env = crate::api::keys::ENV_LOG, default_value = DEFAULT_LOG_FILTER)]
    pub(crate) log_level: String,

    /// Log line format.
    #[arg(long, global = true, env = crate::api::keys::ENV_LOG_FORMAT, value_enum, default_value_t = LogFormat::Plain)]
    pub(crate) log_format: LogFormat,
}

/// Log lines waiting for the writer thread; past this, lines are dropped and counted. About a
/// second of the busiest logging seen (a flapping server's stderr at debug level), and a few MiB
/// at most: every line the agent writes is bounded (server stderr comes in capped pieces).
const LOG_QUEUE_LINES: usize = 8_192;

/// The dropped-lines count of the process's log writer, once [`LogArgs::init`] installed it.
static LOG_DROPS: OnceLock<ErrorCounter> = OnceLock::new();

/// Keeps the log writer thread; dropping it writes out what is queued (waiting at most a second:
/// a stalled stderr must not hold the process's exit either).
#[must_use = "dropping the guard ends the log writer"]
pub(crate) struct LogGuard(#[allow(dead_code, reason = "held for its Drop")] WorkerGuard);

impl LogArgs {
    /// Installs the global subscriber. An invalid filter is an error naming the flag.
    /// With an `OTEL_EXPORTER_OTLP_*` endpoint in the environment, also installs the trace
    /// exporter (`otel`), named after the executable (`spearlet`, `spear-operator`) unless
    /// `OTEL_SERVICE_NAME` names it.
    pub(crate) fn init(&self) -> anyhow::Result<LogGuard> {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;

        let filter = EnvFilter::try_new(&self.log_level)
            .map_err(|e| anyhow::anyhow!("--log-level '{}' is not a valid filter: {e}", self.log_level))?
            .add_directive(otel::LOG_FILTER_DIRECTIVE.parse()?);
        // Colors only for a terminal: escape codes in a log file or a collector are noise.
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let executable = std::env::args_os().next().map(std::path::PathBuf::from);
        let service = executable.as_ref().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("spear");
        let (writer, guard) = NonBlockingBuilder::default()
            .lossy(true)
            .buffered_lines_limit(LOG_QUEUE_LINES)
            .thread_name("spear-log")
            .finish(RedactingStderr);
        let _ = LOG_DROPS.set(writer.error_counter());
        let installed = match otel::layer_from_env(service)? {
            // Tracing off: the log subscriber alone, its filter global (no per-layer filtering cost).
            None => {
                let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(ansi);
                match self.log_format {
                    LogFormat::Plain => builder.try_init(),
                    LogFormat::Json => builder.json().try_init(),
                }
            }
            // Each layer filters for itself: the log filter must not hide the trace spans.
            Some(trace) => {
                let fmt = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi);
                let fmt = match self.log_format {
                    LogFormat::Plain => fmt.boxed(),
                    LogFormat::Json => fmt.json().boxed(),
                };
                tracing_subscriber::registry().with(trace).with(fmt.with_filter(filter)).try_init().map_err(Into::into)
            }
        };
        installed.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))?;
        Ok(LogGuard(guard))
    }
}

/// The values the process's agent holds, redacted from every log line once set.
static LOG_SECRETS: OnceLock<Arc<crate::secrets::HeldSecrets>> = OnceLock::new();

/// From now on, log lines are written without the values `secrets` holds (a server's stderr, a
/// server's error echoed in a warning). The first agent of the process sets it.
pub(crate) fn redact_logs_with(secrets: Arc<crate::secrets::HeldSecrets>) {
    let _ = LOG_SECRETS.set(secrets);
}

/// stderr, behind the log writer thread: each write is one whole line (the writer's unit), so
/// a value is never split across two writes.
struct RedactingStderr;

impl std::io::Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let held = LOG_SECRETS.get().map(|secrets| secrets.redactor()).filter(|held| !held.is_empty());
        let Some(held) = held else {
            std::io::stderr().write_all(buf)?;
            return Ok(buf.len());
        };
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(held.redact(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Registers `spear_log_dropped_lines_total`: log lines dropped because stderr could not take
/// them. Zero until [`LogArgs::init`] ran (tests, library use).
pub(crate) fn register_log_drops(registry: &mut Registry) {
    registry.register_collector(Box::new(LogDrops));
}

#[derive(Debug)]
struct LogDrops;

impl prometheus_client::collector::Collector for LogDrops {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric as _;
        let dropped = LOG_DROPS.get().map_or(0, ErrorCounter::dropped_lines) as u64;
        let counter = prometheus_client::metrics::counter::ConstCounter::new(dropped);
        let metric = encoder.encode_descriptor(
            "spear_log_dropped_lines",
            "Log lines dropped because stderr could not take them (a stalled pipe or collector)",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

// === admin ===

/// Content type of the text prometheus-client writes (OpenMetrics).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The admin routes of both binaries: `/healthz` (the process answers), `/readyz` (`ready`
/// says `Ok` with details to print after `ready`, or why not) and `/metrics` (the Prometheus text of `metrics`). Callers merge their
/// own routes into it.
pub(crate) fn admin_router<R>(ready: R, metrics: Arc<Registry>) -> axum::Router
where
    R: Fn() -> Result<String, String> + Clone + Send + Sync + 'static,
{
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                match ready() {
                    Ok(detail) => (StatusCode::OK, format!("ready\n{detail}")),
                    Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
                }
            }),
        )
        .route(
            "/metrics",
            get(move || async move {
                let mut text = String::new();
                match prometheus_client::encoding::text::encode(&mut text, &metrics) {
                    Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}\n")).into_response(),
                }
            }),
        )
}

// === metrics ===

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    server_id: String,
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApprovalLabels {
    server_id: String,
    /// `caller` or `webhook`.
    approver: String,
    /// `allow`, `deny`, `timeout` or `error` (every one but `allow` denies the call).
    decision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApproverLabels {
    approver: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    server_id: String,
    /// `initial`, `expiry` (a renewal before it expires) or `rejected` (after a 401).
    reason: String,
    /// `ok` or `error`.
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    server_id: String,
    tool: String,
    code: String,
}

/// A refusal's reason is one of a fixed set (`McpError::reason`), never the caller's text.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeniedLabels {
    server_id: String,
    reason: &'static str,
}

/// `offered` (a server's tools were offered to a chat request or listed to a session) or why
/// they were left out (`not_listed`, `not_wanted`, `none_allowed`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InjectionLabels {
    server_id: String,
    status: &'static str,
}

/// Which loop budget a chat request used up: `max_iterations` or `max_total_tool_calls`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    budget: &'static str,
}

/// `error: cause: cause…` on one line, so a log line or a status message says what failed
/// underneath (the API server's reason, the OS error). A cause whose text the line already holds is
/// skipped: error types often repeat their source in their own message.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Milliseconds: 0.25 ms to about 16 s in doublings (tool calls range from an in-process echo to
/// a slow remote search).
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.25, 2.0, 17))
}

/// Milliseconds: 10 ms to about 30 minutes in triplings (a program answers in milliseconds, a
/// person in seconds to minutes; the longest approval timeout is an hour).
fn approval_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10.0, 3.0, 12))
}

/// Bytes: 64 B to 16 MiB in quadruplings (the output cap's range).
/// Seconds: 1 ms to about 2 minutes in doublings (a warm server lists in milliseconds, a cold
/// `npx` start in tens of seconds).
fn list_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

/// Counts per chat request: 1 to 256 in doublings (iterations and tool calls are budgeted, the
/// largest budgets are in the hundreds).
fn count_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 9))
}

fn output_histogram() -> Histogram {
    Histogram::new(exponential_buckets(64.0, 4.0, 10))
}

/// The client pool's metrics. Cheap to clone; clones share the series. `Default` gives metrics
/// registered nowhere (they count, nobody scrapes them).
#[derive(Clone, Debug)]
pub struct PoolMetrics {
    connects: Family<ServerLabels, Counter>,
    calls: Family<ToolLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    latency: Family<ToolLabels, Histogram, fn() -> Histogram>,
    output_bytes: Family<ToolLabels, Histogram, fn() -> Histogram>,
    token_fetches: Family<TokenLabels, Counter>,
    approvals: Family<ApprovalLabels, Counter>,
    approval_latency: Family<ApproverLabels, Histogram, fn() -> Histogram>,
    denied: Family<DeniedLabels, Counter>,
    injections: Family<InjectionLabels, Counter>,
    list_tools: Family<ServerLabels, Histogram, fn() -> Histogram>,
    chat_iterations: Histogram,
    chat_tool_calls: Histogram,
    chat_budget_hits: Family<BudgetLabels, Counter>,
}

impl Default for PoolMetrics {
    fn default() -> Self {
        PoolMetrics {
            connects: Family::default(),
            calls: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            output_bytes: Family::new_with_constructor(output_histogram),
            token_fetches: Family::default(),
            approvals: Family::default(),
            approval_latency: Family::new_with_constructor(approval_histogram),
            denied: Family::default(),
            injections: Family::default(),
            list_tools: Family::new_with_constructor(list_histogram),
            chat_iterations: count_histogram(),
            chat_tool_calls: count_histogram(),
            chat_budget_hits: Family::default(),
        }
    }
}

impl PoolMetrics {
    /// Metrics registered under their documented `mcp_*` names (counters get `_total` on the wire:
    /// dashboards and alerts depend on them).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = PoolMetrics::default();
        registry.register("mcp_server_connect", "Sessions established with an MCP server", metrics.connects.clone());
        registry.register("mcp_tool_call", "Tool calls made, whatever their outcome", metrics.calls.clone());
        registry.register("mcp_tool_call_error", "Tool calls that failed, by error code", metrics.errors.clone());
        registry.register("mcp_tool_call_latency_ms", "Tool call latency in milliseconds", metrics.latency.clone());
        registry.register("mcp_tool_call_output_bytes", "Size of tool results in bytes", metrics.output_bytes.clone());
        registry.register(
            "mcp_auth_token_fetch",
            "Access-token requests for servers with http.auth, by reason (initial, expiry, rejected) and outcome",
            metrics.token_fetches.clone(),
        );
        registry.register(
            "mcp_approval",
            "Approval decisions of calls that needed approval, by server, approver (caller, webhook) and decision (allow, deny, timeout, error)",
            metrics.approvals.clone(),
        );
        registry.register(
            "mcp_approval_latency_ms",
            "Time an approver took to decide, in milliseconds",
            metrics.approval_latency.clone(),
        );
        registry.register(
            "mcp_denied",
            "Calls, resource reads and prompt gets refused by governance, by server and reason (not_in_profile, denied_by:<layer>, env_missing, rate_limited, pin_mismatch, secret_in_arguments, ...)",
            metrics.denied.clone(),
        );
        registry.register(
            "mcp_injection",
            "Servers whose tools were offered to a chat request or listed to an MCP session (status offered), or left out and why",
            metrics.injections.clone(),
        );
        registry.register(
            "mcp_list_tools_duration_seconds",
            "Time a server took to answer tools/list (all pages), in seconds",
            metrics.list_tools.clone(),
        );
        registry.register(
            "mcp_chat_iterations",
            "Model round trips per chat completion",
            metrics.chat_iterations.clone(),
        );
        registry.register("mcp_chat_tool_calls", "Tool calls per chat completion", metrics.chat_tool_calls.clone());
        registry.register(
            "mcp_chat_budget_exceeded",
            "Chat completions that used up a loop budget, by budget (max_iterations, max_total_tool_calls)",
            metrics.chat_budget_hits.clone(),
        );
        // Both budgets' series from the start: a rate over an absent series is no data, not zero.
        for budget in ["max_iterations", "max_total_tool_calls"] {
            drop(metrics.chat_budget_hits.get_or_create(&BudgetLabels { budget }));
        }
        metrics
    }

    /// A call, read or get of `server` (empty: none named) refused for `reason`.
    pub(crate) fn denied(&self, server: &str, reason: &'static str) {
        self.denied.get_or_create(&DeniedLabels { server_id: server.to_string(), reason }).inc();
    }

    /// A server's tools offered to a chat request or listed to a session (`offered`), or left out.
    pub(crate) fn injection(&self, server: &str, status: &'static str) {
        self.injections.get_or_create(&InjectionLabels { server_id: server.to_string(), status }).inc();
    }

    /// A `tools/list` of `server` (every page) took `took`.
    pub(crate) fn listed(&self, server: &str, took: Duration) {
        self.list_tools.get_or_create(&ServerLabels { server_id: server.to_string() }).observe(took.as_secs_f64());
    }

    /// A chat completion's tool loop ended after `iterations` model round trips and `tool_calls`
    /// calls; `budget` names the loop budget it used up, if any.
    pub(crate) fn chat_loop(&self, iterations: u32, tool_calls: u32, budget: Option<&'static str>) {
        self.chat_iterations.observe(f64::from(iterations));
        self.chat_tool_calls.observe(f64::from(tool_calls));
        if let Some(budget) = budget {
            self.chat_budget_hits.get_or_create(&BudgetLabels { budget }).inc();
        }
    }

    /// An approver decided on a call of `server`.
    pub(crate) fn approval(&self, server: &str, approver: &str, decision: &str, latency_ms: f64) {
        let labels = ApprovalLabels {
            server_id: server.to_string(),
            approver: approver.to_string(),
            decision: decision.to_string(),
        };
        self.approvals.get_or_create(&labels).inc();
        let labels = ApproverLabels { approver: approver.to_string() };
        self.approval_latency.get_or_create(&labels).observe(latency_ms);
    }

    /// An access token for `server` was requested (`reason`: see `TokenLabels`).
    pub(crate) fn token_fetch(&self, server: &str, reason: &str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" }.to_string();
        let labels = TokenLabels { server_id: server.to_string(), reason: reason.to_string(), outcome };
        self.token_fetches.get_or_create(&labels).inc();
    }

    /// A session with `server` was established.
    pub(crate) fn connected(&self, server: &str) {
        self.connects.get_or_create(&ServerLabels { server_id: server.to_string() }).inc();
    }

    /// A call finished, with the size of its result (when there was one) and its error code
    /// (when it failed, or its output was truncated: `mcp_output_too_large`).
    pub(crate) fn call(&self, server: &str, tool: &str, latency: Duration, bytes: Option<usize>, error: Option<&str>) {
        let labels = ToolLabels { server_id: server.to_string(), tool: tool.to_string() };
        self.calls.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(latency.as_secs_f64() * 1000.0);
        if let Some(bytes) = bytes {
            self.output_bytes.get_or_create(&labels).observe(bytes as f64);
        }
        if let Some(code) = error {
            let labels = ErrorLabels { server_id: labels.server_id, tool: labels.tool, code: code.to_string() };
            self.errors.get_or_create(&labels).inc();
        }
    }

    /// A call refused before any tool was chosen (the name routes nowhere, the profile is
    /// missing): counted under `code` with an empty tool, and an empty server when none is named.
    pub(crate) fn refused(&self, server: &str, code: &str) {
        let labels = ErrorLabels { server_id: server.to_string(), tool: String::new(), code: code.to_string() };
        self.errors.get_or_create(&labels).inc();
    }
}

/// The registry's metrics: which revision is served and whether the source is degraded.
#[derive(Clone, Debug, Default)]
pub struct RegistryMetrics {
    /// Snapshots served so far (1 after the first): a number that moves on every new revision,
    /// since revisions themselves are opaque hashes.
    revision: Gauge,
    degraded: Gauge,
    restart_required: Family<ServerLabels, Gauge>,
    pin_findings: Family<PinLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PinLabels {
    server_id: String,
    /// `pin_mismatch` or `not_pinned`.
    reason: String,
}

impl RegistryMetrics {
    /// Metrics registered as `mcp_registry_revision`, `mcp_registry_degraded`,
    /// `mcp_server_restart_required` and `mcp_tool_pin_mismatch`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = RegistryMetrics::default();
        registry.register(
            "mcp_registry_revision",
            "Registry snapshots served by this process (increments on every new revision)",
            metrics.revision.clone(),
        );
        registry.register(
            "mcp_registry_degraded",
            "1 while the registry source has problems (the last good objects keep serving)",
            metrics.degraded.clone(),
        );
        registry.register(
            "mcp_server_restart_required",
            "1 for each stdio server of the profile this pod has no sidecar for (added after the pod started: restart the pod)",
            metrics.restart_required.clone(),
        );
        registry.register(
            "mcp_tool_pin_mismatch",
            "Listed tools that do not match their pin (spec.pinning), by server and reason: withheld under enforce, served under warn",
            metrics.pin_findings.clone(),
        );
        metrics
    }

    /// How many listed tools of each server do not match their pins now, by reason.
    pub(crate) fn pin_findings<'a>(&self, findings: impl IntoIterator<Item = (&'a str, String)>) {
        self.pin_findings.clear();
        for (server_id, reason) in findings {
            self.pin_findings.get_or_create(&PinLabels { server_id: server_id.to_string(), reason }).inc();
        }
    }

    /// The profile's stdio servers that need a pod restart now (all others read 0 or vanish).
    pub(crate) fn restart_required<'a>(&self, servers: impl IntoIterator<Item = &'a str>) {
        self.restart_required.clear();
        for server_id in servers {
            self.restart_required.get_or_create(&ServerLabels { server_id: server_id.to_string() }).set(1);
        }
    }

    /// A state is now served; `new_revision` when its snapshot's revision differs from the last
    /// one served (tool list changes and partial states do not count).
    pub(crate) fn served(&self, new_revision: bool, degraded: bool) {
        if new_revision {
            self.revision.inc();
        }
        self.degraded.set(i64::from(degraded));
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn restart_required_lists_only_the_current_servers() {
        let mut registry = Registry::default();
        let metrics = RegistryMetrics::register(&mut registry);
        metrics.restart_required(["late", "later"]);
        metrics.restart_required(["later"]);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        assert!(text.contains("mcp_server_restart_required{server_id=\"later\"} 1"), "{text}");
        assert!(!text.contains("server_id=\"late\""), "{text}");
    }

    #[test]
    fn pool_metrics_use_the_design_names() {
        let mut registry = Registry::default();
        let metrics = PoolMetrics::register(&mut registry);
        metrics.connected("fs");
        metrics.call("fs", "read", Duration::from_millis(3), Some(120), None);
        metrics.call("fs", "read", Duration::from_millis(5000), None, Some("mcp_timeout"));
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        for line in [
            "mcp_server_connect_total{server_id=\"fs\"} 1",
            "mcp_tool_call_total{server_id=\"fs\",tool=\"read\"} 2",
            "mcp_tool_call_error_total{server_id=\"fs\",tool=\"read\",code=\"mcp_timeout\"} 1",
            "mcp_tool_call_latency_ms_count{server_id=\"fs\",tool=\"read\"} 2",
            "mcp_tool_call_output_bytes_count{server_id=\"fs\",tool=\"read\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
    }
}
