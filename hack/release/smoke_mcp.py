"""One MCP tool call through `spearlet serve`'s /mcp, with the standard library only (the release
recipe must not need the PyPI `mcp` package): waits for /readyz, then a 2025-11-25 session:
initialize, notifications/initialized, tools/list, tools/call of mcp__everything__echo.

    python3 hack/release/smoke_mcp.py http://127.0.0.1:PORT/mcp http://127.0.0.1:ADMIN/readyz
"""

import json
import sys
import time
import urllib.error
import urllib.request

READY_TIMEOUT_S = 180  # the first start fetches server-everything through npx


def post(url, body, session=None):
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    if session:
        headers["Mcp-Session-Id"] = session
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read().decode()
        session = response.headers.get("Mcp-Session-Id", session)
        if "id" not in body:
            return None, session
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            for line in raw.splitlines():
                if line.startswith("data:") and line[5:].strip():
                    message = json.loads(line[5:])
                    if message.get("id") == body["id"]:
                        return message, session
            raise SystemExit(f"smoke: no answer to {body['method']} in the event stream: {raw[:500]}")
        return json.loads(raw), session


def main():
    mcp_url, ready_url = sys.argv[1], sys.argv[2]
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(ready_url, timeout=5) as response:
                if response.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"smoke: {ready_url} not ready after {READY_TIMEOUT_S}s")
        time.sleep(0.5)
    answer, session = post(mcp_url, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "release-smoke", "version": "1"}}})
    if "result" not in answer or not session:
        raise SystemExit(f"smoke: initialize failed: {answer}")
    post(mcp_url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    answer, _ = post(mcp_url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session)
    names = [tool["name"] for tool in answer.get("result", {}).get("tools", [])]
    if "mcp__everything__echo" not in names:
        raise SystemExit(f"smoke: tools/list has no mcp__everything__echo: {names}")
    answer, _ = post(mcp_url, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "mcp__everything__echo", "arguments": {"message": "release smoke"}}}, session)
    text = " ".join(c.get("text", "") for c in answer.get("result", {}).get("content", []))
    if answer.get("result", {}).get("isError") or "release smoke" not in text:
        raise SystemExit(f"smoke: tools/call answered {answer}")
    print(f"smoke: /mcp OK ({len(names)} tools; echo answered {text!r})")


if __name__ == "__main__":
    main()
