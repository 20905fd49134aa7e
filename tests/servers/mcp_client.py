"""A real MCP client (the PyPI `mcp` SDK) driven by tests/it/serve.rs against spearlet's /mcp.

Prints one JSON object per line on stdout so the test can follow along:
  {"event": "initialized", "instructions": ..., "version": ...}
  {"event": "tools", "names": [...]}
  {"event": "call", "name": ..., "is_error": ..., "text": ...}      (one per --call)
  {"event": "calls", "count": N, "errors": [...]}   (instead, with --call-every: the --calls
                                                      repeated every SECONDS for --call-for)
  {"event": "waiting"}                                              (then the test edits the registry)
  {"event": "list_changed"}
  {"event": "tools", "names": [...]}
Exits non-zero with a message on stderr if list_changed does not arrive within --timeout.

--mode legacy (the default) drives the 2025-11-25 session protocol with the low-level
ClientSession (initialize, then notifications/tools/list_changed on the session's stream);
--mode 2026-07-28 drives the stateless revision with the SDK's high-level Client
(server/discover, per-request _meta, and subscriptions/listen for the change).

--approve yes|no|decline|silent answers spearlet's own approval form ("Approve the call of tool
..."), emitting {"event": "approval", "message": ...} first: `approve: true`, `approve: false`,
decline, or no answer at all. The legacy session declares elicitation only with --approve.
"""

import argparse
import json
import sys

import anyio
import mcp.types as types
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client


def emit(**event):
    print(json.dumps(event), flush=True)


async def call_all(client, calls):
    for call in calls:
        name, _, raw = call.partition("=")
        result = await client.call_tool(name, json.loads(raw or "{}"))
        text = "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")
        emit(event="call", name=name, is_error=bool(result.is_error), text=text)


APPROVE = None


async def confirm(context, params):
    if params.message.startswith("Approve the call of tool") and APPROVE is not None:
        emit(event="approval", message=params.message)
        if APPROVE == "silent":
            await anyio.sleep_forever()
        if APPROVE == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"approve": APPROVE == "yes"})
    # A person at the client would answer the server's question; this one accepts.
    emit(event="elicitation", message=params.message)
    return types.ElicitResult(action="accept", content={"ok": True})


async def modern(args):
    async with Client(args.url, mode=args.mode, elicitation_callback=confirm) as client:
        emit(event="initialized", instructions=None, version=client.session.protocol_version)
        tools = await client.list_tools()
        emit(event="tools", names=sorted(t.name for t in tools.tools), ttl_ms=tools.ttl_ms, cache_scope=tools.cache_scope)
        await call_all(client, args.call)
        if not args.wait_list_changed:
            return
        async with client.listen(tools_list_changed=True) as subscription:
            emit(event="waiting")
            with anyio.fail_after(args.timeout):
                async for _ in subscription:
                    break
        emit(event="list_changed")
        tools = await client.list_tools(cache_mode="bypass")
        emit(event="tools", names=sorted(t.name for t in tools.tools))


async def repeat_calls(session, args):
    """Only tool calls, every --call-every seconds for --call-for seconds; one summary event.
    A call that fails (a 404 for the session surfaces as "Session terminated") ends the loop."""
    count, errors = 0, []
    deadline = anyio.current_time() + args.call_for
    while anyio.current_time() < deadline and not errors:
        for call in args.call:
            name, _, raw = call.partition("=")
            try:
                result = await session.call_tool(name, json.loads(raw or "{}"))
            except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
                errors.append(f"call {count + 1}: {e!r}")
                break
            count += 1
            if result.is_error:
                errors.append(f"call {count}: tool error {result.content!r}")
        await anyio.sleep(args.call_every)
    emit(event="calls", count=count, errors=errors)


async def main(args):
    global APPROVE
    APPROVE = args.approve
    if args.mode != "legacy":
        return await modern(args)
    changed = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()
        elif isinstance(message, Exception):
            print(f"transport error: {message!r}", file=sys.stderr, flush=True)

    async with streamable_http_client(args.url) as streams:
        read, write = streams[0], streams[1]
        callback = confirm if args.approve else None
        async with ClientSession(read, write, message_handler=on_message, elicitation_callback=callback) as session:
            init = await session.initialize()
            emit(event="initialized", instructions=init.instructions, version=init.protocol_version)
            tools = await session.list_tools()
            emit(event="tools", names=sorted(t.name for t in tools.tools))
            if args.call_every is None:
                await call_all(session, args.call)
            else:
                await repeat_calls(session, args)
            if not args.wait_list_changed:
                return
            emit(event="waiting")
            with anyio.fail_after(args.timeout):
                await changed.wait()
            emit(event="list_changed")
            tools = await session.list_tools()
            emit(event="tools", names=sorted(t.name for t in tools.tools))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--call", action="append", default=[], help="NAME=JSON_ARGS")
    parser.add_argument("--wait-list-changed", action="store_true")
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--mode", default="legacy", help="legacy | 2026-07-28")
    parser.add_argument("--call-every", type=float, help="repeat the --calls every SECONDS")
    parser.add_argument("--call-for", type=float, default=10.0, help="for SECONDS (with --call-every)")
    parser.add_argument("--approve", choices=["yes", "no", "decline", "silent"])
    try:
        anyio.run(main, parser.parse_args())
    except TimeoutError:
        print("list_changed did not arrive in time", file=sys.stderr)
        sys.exit(3)
