"""What a server sends during a call, through spearlet's /mcp, with a real MCP client (the PyPI
`mcp` SDK, a 2025-11-25 session that declares sampling and elicitation). Used by tests/it/serve.rs.

    python mcp_relay_client.py --url http://127.0.0.1:<port>/mcp [--log-level LEVEL]
        [--subscribe URI ...] --call NAME[=JSON] ...

The calls run one after another. Sampling requests are answered "sampled: <the request's first
text>", elicitation requests are accepted with {"name": "Ada", "email": "ada@example.org"} (with
--accept-as-shown: with no field filled in, as a person submitting the form as shown).
Prints one JSON object on stdout: the capabilities the agent declared; for each call its result
texts (or its JSON-RPC error), the progress values and messages seen during it, the log messages
seen during it, and the sampling and elicitation messages the client was asked; and the error of
each --subscribe, or null. With --during NAME[=JSON], see `during`.
"""

import argparse
import json

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


async def run(args):
    seen = {"logs": [], "asked": []}

    async def on_sampling(context, params):
        first = params.messages[0].content
        prompt = getattr(first, "text", str(first))
        seen["asked"].append({"sampling": prompt})
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text=f"sampled: {prompt}"),
                                         model="test-double", stop_reason="endTurn")

    async def on_elicitation(context, params):
        seen["asked"].append({"elicitation": params.message})
        if args.accept_as_shown:
            return types.ElicitResult(action="accept", content={})
        return types.ElicitResult(action="accept", content={"name": "Ada", "email": "ada@example.org"})

    async def on_log(params):
        seen["logs"].append({"level": params.level, "data": params.data})

    out = {"calls": {}, "subscribe": {}}
    if args.during:
        out["during"] = await during(args, on_sampling, on_elicitation, seen)
        print(json.dumps(out), flush=True)
        return
    async with streamable_http_client(args.url) as (read, write, *_):
        async with ClientSession(read, write, sampling_callback=on_sampling, elicitation_callback=on_elicitation,
                                 logging_callback=on_log) as session:
            init = await session.initialize()
            out["capabilities"] = init.capabilities.model_dump(exclude_none=True, by_alias=True)
            if args.log_level:
                await session.set_logging_level(args.log_level)
            for uri in args.subscribe:
                try:
                    await session.subscribe_resource(uri)
                    out["subscribe"][uri] = None
                except MCPError as error:
                    out["subscribe"][uri] = {"code": error.error.code, "message": error.error.message}
            for spec in args.call:
                name, _, raw = spec.partition("=")
                seen["logs"], seen["asked"] = [], []
                progress = []

                async def on_progress(value, total, message):
                    progress.append({"progress": value, "total": total, "message": message})

                entry = {}
                try:
                    result = await session.call_tool(name, json.loads(raw) if raw else {}, progress_callback=on_progress)
                    entry["texts"] = [getattr(c, "text", f"<{c.type}>") for c in result.content]
                    entry["isError"] = result.is_error
                except MCPError as error:
                    entry["error"] = {"code": error.error.code, "message": error.error.message}
                # Notifications sent just before the answer may be handled just after it.
                await anyio.sleep(0.3)
                entry.update(progress=progress, logs=list(seen["logs"]), asked=list(seen["asked"]))
                out["calls"][spec] = entry
    print(json.dumps(out), flush=True)


async def during(args, on_sampling, on_elicitation, seen):
    """--during: a first session runs that call; once its first progress notification arrived
    (so it is in flight), a second session runs the --call list. Both declare sampling and
    elicitation. Returns what each session was asked, and the second's results."""
    asked_first = []

    async def first_elicitation(context, params):
        asked_first.append({"elicitation": params.message})
        return types.ElicitResult(action="accept", content={"name": "Mallory", "email": "m@example.org"})

    async def first_sampling(context, params):
        asked_first.append({"sampling": "asked"})
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="mallory"),
                                         model="test-double", stop_reason="endTurn")

    in_flight = anyio.Event()
    name, _, raw = args.during.partition("=")
    result = {"first_asked": asked_first, "second": {}}

    async def on_progress(value, total, message):
        in_flight.set()

    async with streamable_http_client(args.url) as (read1, write1, *_):
        async with ClientSession(read1, write1, sampling_callback=first_sampling,
                                 elicitation_callback=first_elicitation) as first:
            await first.initialize()
            async with streamable_http_client(args.url) as (read2, write2, *_):
                async with ClientSession(read2, write2, sampling_callback=on_sampling,
                                         elicitation_callback=on_elicitation) as second:
                    await second.initialize()
                    async with anyio.create_task_group() as group:
                        group.start_soon(lambda: first.call_tool(name, json.loads(raw) if raw else {},
                                                                 progress_callback=on_progress))
                        with anyio.fail_after(30):
                            await in_flight.wait()
                        for spec in args.call:
                            call, _, call_raw = spec.partition("=")
                            seen["asked"] = []
                            called = await second.call_tool(call, json.loads(call_raw) if call_raw else {})
                            result["second"][spec] = {
                                "texts": [getattr(c, "text", f"<{c.type}>") for c in called.content],
                                "asked": list(seen["asked"]),
                            }
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--log-level")
    parser.add_argument("--subscribe", action="append", default=[])
    parser.add_argument("--call", action="append", default=[])
    parser.add_argument("--during")
    parser.add_argument("--accept-as-shown", action="store_true")
    args = parser.parse_args()
    anyio.run(run, args)


if __name__ == "__main__":
    main()
