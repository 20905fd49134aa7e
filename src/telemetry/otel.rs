//! OpenTelemetry traces: the OTLP exporter (configured by the standard `OTEL_*` variables), the
//! span target the doors and the pool instrument, and W3C trace-context propagation in and out.
//!
//! Decisions and why:
//! - **Off unless an endpoint is set** (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//!   `OTEL_EXPORTER_OTLP_ENDPOINT`). The SDK's own default (export to localhost:4318) would make
//!   every agent try a collector that is usually not there. Off means no OTel layer at all: the
//!   trace spans use their own target, [`TARGET`], which the log filter always turns off, so their
//!   callsites are disabled once and cost a cached check; header extraction returns at once.
//! - **The spans are our own**, on [`TARGET`], not the log spans: a trace has the same shape
//!   whatever `--log-level` says, and log lines carry no span context they did not before.
//! - **Attributes name what the call was, never what it carried**: server id, tool, registry
//!   revision, result code. No arguments, no header values, no results (tool arguments may hold
//!   secrets, and a trace backend is read by more people than the audit log).
//! - **Propagation**: a `traceparent` (and `tracestate`) on the chat, `/mcp` and gRPC doors
//!   becomes the parent of the door's span; every tool call carries the pool span's context in
//!   its `_meta` (SEP-414 reserves `traceparent`/`tracestate` there), which reaches stdio and
//!   socket servers, and a Streamable HTTP server also gets it as headers (`mcp/connect/http.rs`).
//! - **Protocols**: `grpc` (tonic) and `http/protobuf` (the spec's default). `http/json` is
//!   refused with the fix; TLS to the collector is not built in (a collector is a loopback or
//!   in-cluster hop; put a local collector in front of a remote one).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

/// The `tracing` target of every span meant for the trace (and of nothing else).
pub(crate) const TARGET: &str = "spear_trace";

/// Appended to every log filter: trace spans never reach the log lines.
pub(crate) const LOG_FILTER_DIRECTIVE: &str = "spear_trace=off";

/// The W3C header and `_meta` key names (lower case: HTTP/2 and gRPC metadata need it).
const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// Set once the OTel layer is installed; every propagation helper returns at once without it.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The provider, for [`shutdown`] to flush what is still batched.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Why the `OTEL_*` variables could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("{variable}='{value}' is not supported: {fix}")]
    Unsupported { variable: &'static str, value: String, fix: &'static str },
    #[error("building the OTLP span exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("starting the OTLP gRPC exporter's runtime thread: {0}")]
    Runtime(std::io::Error),
}

/// How spans leave the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// What the environment asks for: `None` is tracing off. Pure (`lookup` reads a variable), so
/// every combination is unit-tested; the exporter itself reads the endpoint, headers, timeout
/// and compression from the same variables.
pub(crate) fn protocol_from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Protocol>, OtelError> {
    let get = |name: &str| lookup(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match get("OTEL_TRACES_EXPORTER").as_deref() {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(OtelError::Unsupported {
                variable: "OTEL_TRACES_EXPORTER",
                value: other.to_string(),
                fix: "use otlp (with OTEL_EXPORTER_OTLP_ENDPOINT) or none",
            });
        }
    }
    if get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none() && get("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() {
        return Ok(None);
    }
    let (variable, value) = match get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
        Some(value) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", value),
        None => ("OTEL_EXPORTER_OTLP_PROTOCOL", get("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or_default()),
    };
    match value.as_str() {
        "" | "http/protobuf" => Ok(Some(Protocol::HttpProtobuf)),
        "grpc" => Ok(Some(Protocol::Grpc)),
        _ => Err(OtelError::Unsupported { variable, value, fix: "use grpc or http/protobuf" }),
    }
}

/// The OTel layer when the environment turns tracing on (`None` otherwise: install nothing).
/// `service` names the process unless `OTEL_SERVICE_NAME` does.
pub(crate) fn layer_from_env<S>(service: &str) -> Result<Option<Box<dyn Layer<S> + Send + Sync>>, OtelError>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let Some(protocol) = protocol_from_env(|name| std::env::var(name).ok())? else {
        return Ok(None);
    };
    // reqwest is built with rustls and no provider of its own (rmcp's feature choice).
    crate::install_crypto_provider();
    let exporter = match protocol {
        // tonic's channel lives on a tokio runtime, and the CLI builds its own only later, per
        // subcommand: the exporter gets a one-thread runtime of its own for the process's life.
        Protocol::Grpc => {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(OtelError::Runtime)?;
            let exporter = {
                let _entered = runtime.enter();
                opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?
            };
            std::thread::Builder::new()
                .name("otlp-grpc".into())
                .spawn(move || runtime.block_on(std::future::pending::<()>()))
                .map_err(OtelError::Runtime)?;
            exporter
        }
        // Blocking reqwest: the SDK's batch processor exports from its own thread.
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder().with_http().build()?,
    };
    // The SDK's resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself.
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service.to_string());
    }
    // Batched on the SDK's own thread (OTEL_BSP_* tune it); the sampler follows OTEL_TRACES_SAMPLER.
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
    let tracer = provider.tracer("spear");
    let _ = PROVIDER.set(provider);
    ACTIVE.store(true, Ordering::Release);
    let only_trace_spans = Targets::new().with_target(TARGET, tracing::Level::TRACE);
    // Only what the spans are about: no target (always TARGET), no source location, thread or
    // busy/idle timing attributes.
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_target(false)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false);
    Ok(Some(layer.with_filter(only_trace_spans).boxed()))
}

/// Whether spans are exported (the doors skip all propagation work otherwise).
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Flushes and stops the exporter (at the end of `main`; spans still batched are sent).
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.shutdown()
    {
        tracing::warn!(error = %e, "flushing the trace exporter");
    }
}

/// The two trace-context values a door found, for the propagator to read.
struct Carrier<'a> {
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.traceparent,
            TRACESTATE => self.tracestate,
            _ => None,
        }
    }
    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// Makes the caller's trace (a W3C `traceparent`, with its `tracestate`, read by `get`) the
/// parent of `span`. Nothing when tracing is off or there is no valid `traceparent`.
pub(crate) fn continue_trace<'a>(span: &tracing::Span, get: impl Fn(&str) -> Option<&'a str>) {
    if !active() {
        return;
    }
    let carrier = Carrier { traceparent: get(TRACEPARENT), tracestate: get(TRACESTATE) };
    let parent = TraceContextPropagator::new().extract(&carrier);
    if opentelemetry::trace::TraceContextExt::span(&parent).span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// [`continue_trace`] from HTTP headers (the chat and `/mcp` doors).
pub(crate) fn continue_from_headers(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    if active() {
        continue_trace(span, |name| headers.get(name).and_then(|v| v.to_str().ok()));
    }
}

/// The `OTEL_*` variables an injected agent gets from the operator's environment: where and how
/// to export traces, and the sampler; nothing when the operator's tracing is off. Not the
/// service name or resource attributes (those name the operator), and never headers (they may
/// hold a collector's token, and a pod spec is no place for one) or certificate paths (files the
/// agent's pod does not have).
pub(crate) fn agent_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    const PASSED: [&str; 12] = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SDK_DISABLED",
    ];
    let mut passed: Vec<(String, String)> = vars.into_iter().filter(|(k, _)| PASSED.contains(&k.as_str())).collect();
    let on = protocol_from_env(|name| passed.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()));
    if !matches!(on, Ok(Some(_))) {
        return Vec::new();
    }
    passed.sort();
    passed
}

struct MetaInjector<'a>(&'a mut rmcp::model::RequestMetaObject);

impl Injector for MetaInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        match key {
            TRACEPARENT => self.0.set_traceparent(value),
            TRACESTATE => self.0.set_tracestate(value),
            _ => {}
        }
    }
}

/// Puts `span`'s context into a request's `_meta` (`traceparent`, `tracestate`), so the server
/// continues the trace. Nothing when tracing is off.
pub(crate) fn inject_meta(span: &tracing::Span, meta: &mut Option<rmcp::model::RequestMetaObject>) {
    if !active() {
        return;
    }
    let context = span.context();
    let meta = meta.get_or_insert_with(rmcp::model::RequestMetaObject::new);
    TraceContextPropagator::new().inject_context(&context, &mut MetaInjector(meta));
}

/// The trace-context entries of a request's `_meta`, as (header name, value) pairs, for a
/// Streamable HTTP request to carry them as headers too.
pub(crate) fn meta_headers(
    meta: Option<&rmcp::model::RequestMetaObject>,
) -> impl Iterator<Item = (&'static str, &str)> {
    let traceparent = meta.and_then(|m| m.get_traceparent()).map(|v| (TRACEPARENT, v));
    let tracestate = meta.and_then(|m| m.get_tracestate()).map(|v| (TRACESTATE, v));
    traceparent.into_iter().chain(tracestate)
}

#[cfg(test)]
mod tests;
