"""Resources and prompts through spearlet's /mcp with a real MCP client (the PyPI `mcp` SDK, a
2025-11-25 session). Used by tests/it/serve.rs.

    python mcp_items_client.py --url http://127.0.0.1:<port>/mcp [--read URI ...] [--get NAME[=JSON] ...]
        [--complete PROMPT:ARGUMENT=VALUE ...]
    python mcp_items_client.py --url ... --wait-items-changed [--timeout SECONDS]

Prints one JSON object on stdout: the capabilities the agent declared, the resource URIs,
template URIs and prompt names it lists (or the error of a list it does not declare), its tools
(without input schemas), the values of each --complete, and for each --read / --get either the result (texts) or
the JSON-RPC error (code, message, data). With --wait-items-changed it prints {"event": "waiting"}
once listed, then {"event": "items_changed", "kinds": [...], "resources": [...]} when both
notifications/resources/list_changed and notifications/prompts/list_changed have arrived, or
fails after --timeout.
"""

import argparse
import json

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def texts_of_resource(result):
    return [getattr(c, "text", None) or f"<blob {len(getattr(c, 'blob', ''))}>" for c in result.contents]


def texts_of_prompt(result):
    return [getattr(m.content, "text", None) or f"<{m.content.type}>" for m in result.messages]


async def attempt(action):
    try:
        return {"ok": await action()}
    except MCPError as error:
        data = error.error.data if hasattr(error, "error") else None
        return {"error": {"code": error.error.code, "message": error.error.message, "data": data}}


async def wait_items_changed(args):
    kinds = set()
    both = anyio.Event()

    async def on_message(message):
        if isinstance(message, types.ResourceListChangedNotification):
            kinds.add("resources")
        elif isinstance(message, types.PromptListChangedNotification):
            kinds.add("prompts")
        if kinds == {"resources", "prompts"}:
            both.set()

    async with streamable_http_client(args.url) as (read, write, *_):
        async with ClientSession(read, write, message_handler=on_message) as session:
            await session.initialize()
            await session.list_resources()
            print(json.dumps({"event": "waiting"}), flush=True)
            with anyio.fail_after(args.timeout):
                await both.wait()
            resources = [str(r.uri) for r in (await session.list_resources()).resources]
            print(json.dumps({"event": "items_changed", "kinds": sorted(kinds), "resources": resources}), flush=True)


async def main(args):
    if args.wait_items_changed:
        return await wait_items_changed(args)
    async with streamable_http_client(args.url) as (read, write, *_):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            caps = init.capabilities
            # A list the agent does not declare is asked for anyway: its JSON-RPC error is the answer.
            async def listed(declared, action):
                return await action() if declared else await attempt(action)

            async def resources():
                return [str(r.uri) for r in (await session.list_resources()).resources]

            async def templates():
                return [t.uri_template for t in (await session.list_resource_templates()).resource_templates]

            async def prompts():
                return [p.name for p in (await session.list_prompts()).prompts]

            out = {
                "capabilities": {
                    "resources": caps.resources is not None,
                    "prompts": caps.prompts is not None,
                    "completions": caps.completions is not None,
                },
                "resources": await listed(caps.resources is not None, resources),
                "templates": await listed(caps.resources is not None, templates),
                "prompts": await listed(caps.prompts is not None, prompts),
                # Each tool as listed, minus its input schema: name, title, annotations, outputSchema.
                "tools": {
                    t.name: t.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"input_schema"})
                    for t in (await session.list_tools()).tools
                },
                "reads": {},
                "gets": {},
                "completions": {},
            }
            for uri in args.read:
                out["reads"][uri] = await attempt(lambda: _read(session, uri))
            for spec in args.get:
                name, _, raw = spec.partition("=")
                arguments = json.loads(raw) if raw else None
                out["gets"][name] = await attempt(lambda: _get(session, name, arguments))
            for spec in args.complete:
                out["completions"][spec] = await attempt(lambda: _complete(session, spec))
            print(json.dumps(out))


async def _read(session, uri):
    return texts_of_resource(await session.read_resource(uri))


async def _get(session, name, arguments):
    return texts_of_prompt(await session.get_prompt(name, arguments))


async def _complete(session, spec):
    """`PROMPT:ARGUMENT=VALUE`: the values offered for that argument of that prompt."""
    prompt, _, rest = spec.partition(":")
    argument, _, value = rest.partition("=")
    result = await session.complete(types.PromptReference(name=prompt), {"name": argument, "value": value})
    return result.completion.values


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--read", action="append", default=[])
    parser.add_argument("--get", action="append", default=[])
    parser.add_argument("--complete", action="append", default=[], help="PROMPT:ARGUMENT=VALUE")
    parser.add_argument("--wait-items-changed", action="store_true")
    parser.add_argument("--timeout", type=float, default=20)
    anyio.run(main, parser.parse_args())
