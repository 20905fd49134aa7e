"""The PyPI `mcp` SDK against `spearlet gateway` (tests/it/cluster/gateway.rs).

Discovers the gateway's protected-resource metadata from a 401 with the SDK's own OAuth helpers
(what its OAuth provider does on a 401: the WWW-Authenticate `resource_metadata`, then the
well-known fallbacks), then, with a token, opens a session with it as the bearer and lists tools.

usage: gateway_client.py URL [TOKEN]
Prints one JSON object: {"status", "metadata_url", "resource", "authorization_servers",
"resource_allowed", "tools" (with TOKEN)}.
"""

import json
import sys

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.auth.utils import (
    build_protected_resource_metadata_discovery_urls,
    extract_resource_metadata_from_www_auth,
    handle_protected_resource_response,
)
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "gw-test", "version": "1"}},
}


async def main(url, token):
    out = {}
    async with httpx2.AsyncClient() as http:
        answer = await http.post(url, json=INITIALIZE, headers={"accept": "application/json, text/event-stream"})
        out["status"] = answer.status_code
        www = extract_resource_metadata_from_www_auth(answer)
        out["metadata_url"] = www
        metadata = None
        for candidate in build_protected_resource_metadata_discovery_urls(www, url):
            metadata = await handle_protected_resource_response(await http.get(candidate))
            if metadata is not None:
                break
        if metadata is None:
            sys.exit("no protected-resource metadata found")
        out["resource"] = str(metadata.resource)
        out["authorization_servers"] = [str(a) for a in metadata.authorization_servers]
        out["resource_allowed"] = check_resource_allowed(resource_url_from_server_url(url), str(metadata.resource))
    if token:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    tools = await session.list_tools()
                    out["tools"] = sorted(t.name for t in tools.tools)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
