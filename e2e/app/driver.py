"""The e2e app: a workload that uses the spearlet agent injected into its pod, driven by the test.

It runs in the app container of an annotated pod (image `e2e-app`, see the Dockerfile) and serves
a small JSON API on :8080 that `e2e/main.rs` reaches through the API server's pod proxy
(`/api/v1/namespaces/NS/pods/NAME:8080/proxy/...`), so the test needs no `exec` and no network
route of its own into the pod. Every MCP operation is made by the real PyPI `mcp` client against
`$SPEAR_MCP_URL`, and every chat completion by the real PyPI `openai` client against
`$SPEAR_CHAT_URL`: the agent is reached exactly as a workload reaches it.

    GET /healthz                        200 "ok"
    GET /tools                          {"names": [...]}
    GET /call?name=N&args=JSON          {"is_error": bool, "text": "..."}
    GET /chat?content=TEXT              {"content": "...", "spear": {...}}
    GET /bench?name=N&args=JSON&n=K     {"n": K, "p50_us": ..., "p99_us": ..., "errors": [...]}
                                        (K sequential calls in one session, after one warm-up)
    GET /watch?name=N&timeout=S[&absent=1]
                                        {"seen_after_ms": ...} polls tools/list every 20 ms until N
                                        is listed (absent=1: until it is not; 504 after S seconds)
    GET /rawbench?n=K&name=N&args=JSON  {"n": K, "p50_us": ..., "p99_us": ...}: K sequential
                                        tools/call as raw JSON-RPC over one keep-alive connection
                                        and one session (no SDK), comparable with e2e/app/direct.py
    GET /probe                          what this container can see of the agent's private parts
    GET /nokey                          {"mcp": status, "chat": status}: the doors asked without
                                        the pod's key, as a sidecar would ask them (401 expected)
    GET /discover                       what the SDK's OAuth discovery finds at $SPEAR_MCP_URL
                                        without a token: {"status", "challenge", "metadata_url",
                                        "resource", "authorization_servers", "resource_allowed"}

With E2E_TOKEN_FILE set (a pod calling spearlet gateway, not its own agent), the MCP calls send
that file's token (a projected ServiceAccount token, read again for each session) as the bearer.

Errors answer 500 with {"error": "..."}; the test prints them. On SIGTERM the driver stops taking
requests, lets the ones in flight finish (the test deletes the pod during a long tool call and
expects its answer) and exits 0.
"""

import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from common import percentiles, send_json

MCP_URL = os.environ.get("SPEAR_MCP_URL", "")
CHAT_URL = os.environ.get("SPEAR_CHAT_URL", "")
# The pod's key for the agent's doors (set by the webhook in the app containers only).
API_KEY = os.environ.get("SPEAR_API_KEY", "")
AUTH = {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}
# A projected token for spearlet gateway, instead of the pod's key.
TOKEN_FILE = os.environ.get("E2E_TOKEN_FILE", "")
PORT = int(os.environ.get("E2E_DRIVER_PORT", "8080"))


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def auth_headers():
    if TOKEN_FILE:
        with open(TOKEN_FILE) as f:
            return {"Authorization": f"Bearer {f.read().strip()}"}
    return AUTH


async def with_session(work):
    # The MCP SDK's own timeouts (30 s, 300 s for a held stream), plus the pod's key or token.
    async with httpx2.AsyncClient(headers=auth_headers(), timeout=httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(MCP_URL, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                return await work(session)


async def tools(_q):
    async def work(session):
        listed = await session.list_tools()
        return {"names": sorted(t.name for t in listed.tools)}

    return await with_session(work)


async def call(q):
    name, args = q["name"], json.loads(q.get("args", "{}"))

    async def work(session):
        result = await session.call_tool(name, args)
        return {"is_error": bool(result.is_error), "text": text_of(result)}

    return await with_session(work)


async def bench(q):
    name, args, n = q["name"], json.loads(q.get("args", "{}")), int(q.get("n", "100"))

    async def work(session):
        await session.call_tool(name, args)
        samples, errors = [], []
        for i in range(n):
            start = time.perf_counter_ns()
            result = await session.call_tool(name, args)
            samples.append((time.perf_counter_ns() - start) // 1000)
            if result.is_error and len(errors) < 5:
                errors.append(f"call {i}: {text_of(result)}")
        return {**percentiles(samples), "errors": errors}

    return await with_session(work)


async def watch(q):
    name, timeout, want = q["name"], float(q.get("timeout", "10")), q.get("absent") != "1"
    start = time.monotonic()

    async def work(session):
        while time.monotonic() - start < timeout:
            listed = await session.list_tools()
            if any(t.name == name for t in listed.tools) == want:
                return {"seen_after_ms": int((time.monotonic() - start) * 1000)}
            await anyio.sleep(0.02)
        raise TimeoutError(f"{name} {'not listed' if want else 'still listed'} within {timeout} s")

    return await with_session(work)


async def chat(q):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=CHAT_URL, api_key=API_KEY, max_retries=0, timeout=60)
    completion = await client.chat.completions.create(
        model="e2e-model", messages=[{"role": "user", "content": q.get("content", "echo something")}]
    )
    return {
        "content": completion.choices[0].message.content,
        "spear": (completion.model_extra or {}).get("spear"),
    }


def rawbench(q):
    """tools/call as raw JSON-RPC over HTTP/1.1 keep-alive: the client's own cost stays as small
    as direct.py's over the bridge socket, so the two figures compare the paths, not the SDKs."""
    import http.client

    name, args, n = q["name"], json.loads(q.get("args", "{}")), int(q.get("n", "1000"))
    url = urlparse(MCP_URL)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **AUTH}

    def rpc(body):
        conn.request("POST", url.path, json.dumps(body), headers)
        response = conn.getresponse()
        data = response.read().decode()
        if response.status >= 300:
            raise RuntimeError(f"HTTP {response.status}: {data}")
        return response, data

    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e-rawbench", "version": "0"}}
    response, _ = rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
    session = response.getheader("Mcp-Session-Id")
    if session:
        headers["Mcp-Session-Id"] = session
    headers["MCP-Protocol-Version"] = "2025-11-25"
    rpc({"jsonrpc": "2.0", "method": "notifications/initialized"})
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}
    rpc(call)
    samples = []
    for i in range(n):
        call["id"] = i + 2
        start = time.perf_counter_ns()
        _, data = rpc(call)
        samples.append((time.perf_counter_ns() - start) // 1000)
        if '"isError":true' in data.replace(" ", ""):
            raise RuntimeError(f"call {i}: {data}")
    conn.close()
    return percentiles(samples)


def nokey(_q):
    """The doors asked without the key: what a server's sidecar, on the same loopback, gets."""
    import http.client

    statuses = {}
    for door, url in (("mcp", MCP_URL), ("chat", CHAT_URL + "/chat/completions")):
        url = urlparse(url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"} if door == "mcp" else {"model": "m", "messages": []}
        conn.request("POST", url.path, json.dumps(body), {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
        statuses[door] = conn.getresponse().status
        conn.close()
    return statuses


async def discover(_q):
    """The SDK's OAuth discovery, as its provider runs it on a 401 (no token sent)."""
    from mcp.client.auth.utils import (
        build_protected_resource_metadata_discovery_urls,
        extract_resource_metadata_from_www_auth,
        handle_protected_resource_response,
    )
    from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "0"}}}
    async with httpx2.AsyncClient(timeout=30) as http:
        answer = await http.post(MCP_URL, json=init, headers={"Accept": "application/json, text/event-stream"})
        www = extract_resource_metadata_from_www_auth(answer)
        metadata = None
        for candidate in build_protected_resource_metadata_discovery_urls(www, MCP_URL):
            metadata = await handle_protected_resource_response(await http.get(candidate))
            if metadata is not None:
                break
    if metadata is None:
        raise RuntimeError("no protected-resource metadata found")
    return {
        "status": answer.status_code,
        "challenge": answer.headers.get("www-authenticate", ""),
        "metadata_url": www,
        "resource": str(metadata.resource),
        "authorization_servers": [str(a) for a in metadata.authorization_servers],
        "resource_allowed": check_resource_allowed(resource_url_from_server_url(MCP_URL), str(metadata.resource)),
    }


def probe(_q):
    """What the app container can reach of the agent's and the servers' private parts."""
    found = []
    for root in ("/spear", "/spear/run"):
        if os.path.exists(root):
            for dirpath, _dirs, files in os.walk(root):
                found.extend(os.path.join(dirpath, f) for f in files)
    sockets = []
    for path in found:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            sockets.append({"path": path, "connected": True})
        except OSError as e:
            sockets.append({"path": path, "connected": False, "error": str(e)})
        finally:
            s.close()
    return {"uid": os.getuid(), "spear_paths": found, "sockets": sockets}


ROUTES = {"/tools": tools, "/call": call, "/bench": bench, "/watch": watch, "/chat": chat, "/discover": discover}


IN_FLIGHT = 0
IN_FLIGHT_LOCK = threading.Condition()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        global IN_FLIGHT
        with IN_FLIGHT_LOCK:
            IN_FLIGHT += 1
        try:
            self.route()
        finally:
            with IN_FLIGHT_LOCK:
                IN_FLIGHT -= 1
                IN_FLIGHT_LOCK.notify_all()

    def route(self):
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            if url.path == "/healthz":
                return self.answer(200, "ok")
            if url.path == "/probe":
                return self.answer(200, probe(q))
            if url.path == "/nokey":
                return self.answer(200, nokey(q))
            if url.path == "/rawbench":
                return self.answer(200, rawbench(q))
            route = ROUTES.get(url.path)
            if route is None:
                return self.answer(404, {"error": f"no route {url.path}"})
            return self.answer(200, anyio.run(route, q))
        except TimeoutError as e:
            return self.answer(504, {"error": str(e)})
        except BaseException as e:  # noqa: BLE001 - the test prints it; the driver keeps serving
            return self.answer(500, {"error": f"{type(e).__name__}: {e}"})

    def answer(self, status, body):
        send_json(self, status, body)

    def log_message(self, fmt, *args):
        print(f"driver: {self.address_string()} {fmt % args}", file=sys.stderr, flush=True)


def main():
    if not MCP_URL:
        print("driver: SPEAR_MCP_URL is not set: this pod was not injected", file=sys.stderr, flush=True)
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    print(f"driver: serving on :{PORT}, agent at {MCP_URL}", flush=True)
    stop = threading.Event()
    # PID 1 gets no default action for SIGTERM: without this handler the kubelet would wait out
    # the whole grace period.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while not stop.wait(1):
        pass
    with IN_FLIGHT_LOCK:
        print(f"driver: SIGTERM; {IN_FLIGHT} request(s) in flight", flush=True)
        IN_FLIGHT_LOCK.wait_for(lambda: IN_FLIGHT == 0, timeout=60)
    print("driver: stopped", flush=True)


if __name__ == "__main__":
    main()
