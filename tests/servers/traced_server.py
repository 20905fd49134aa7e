"""A real MCP server instrumented with the OpenTelemetry Python SDK, for tests/it/tracing.rs.

Streamable HTTP at `/mcp` (PyPI `mcp`, low-level `Server`), one tool, `echo {text}`. Each call is
a SERVER span `traced_server.echo` that continues the caller's trace from the W3C `traceparent`
header, or from the request's `_meta` (SEP-414) when the header is missing; the span says which
carriers held a trace context and whether they agreed, so the test proves both propagations.
Spans go out over OTLP/HTTP as configured by the standard `OTEL_EXPORTER_OTLP_ENDPOINT`, one by
one (a simple processor: the test reads them at once).

    python traced_server.py --port 8931 [--host 127.0.0.1]
"""

import argparse
import sys

import mcp.types as types
import uvicorn
from mcp.server import Server
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

provider = TracerProvider(resource=Resource.create({"service.name": "traced-mcp-server"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
tracer = provider.get_tracer("traced_server")
propagator = TraceContextTextMapPropagator()


def carriers(ctx) -> tuple[dict, dict]:
    """The trace-context entries of the HTTP headers and of the request's `_meta`."""
    headers = {}
    request = getattr(ctx, "request", None)
    if request is not None:
        headers = {k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")}
    meta = {k: v for k, v in dict(ctx.meta or {}).items() if k in ("traceparent", "tracestate")}
    return headers, meta


async def list_tools(ctx, params) -> types.ListToolsResult:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    return types.ListToolsResult(tools=[types.Tool(name="echo", description="Echoes text", input_schema=schema)])


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    headers, meta = carriers(ctx)
    parent = propagator.extract(headers if "traceparent" in headers else meta)
    with tracer.start_as_current_span(f"traced_server.{params.name}", context=parent, kind=trace.SpanKind.SERVER) as span:
        # What the test checks; never the arguments.
        span.set_attribute("test.traceparent_in_header", "traceparent" in headers)
        span.set_attribute("test.traceparent_in_meta", "traceparent" in meta)
        span.set_attribute("test.carriers_agree", headers.get("traceparent") == meta.get("traceparent"))
        text = (params.arguments or {}).get("text", "")
        return types.CallToolResult(content=[types.TextContent(text=str(text))])


server = Server("traced-server", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8931)
    args = parser.parse_args()
    print(f"traced_server: starting on {args.host}:{args.port}", file=sys.stderr, flush=True)
    app = server.streamable_http_app(streamable_http_path="/mcp", host=args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
