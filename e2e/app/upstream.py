"""A scripted OpenAI-compatible chat upstream for the e2e cluster: the one test double of the e2e
run, standing in for a hosted model API (which this machine cannot reach).

It runs as its own pod (image `e2e-app`, `python3 /e2e/upstream.py`) and the test profile's
`chat.upstream.url` points at it, so the agent's chat door runs a real tool loop across the pod
network. Its script, per request to POST /v1/chat/completions:
  - the last message is a tool result  -> answer "the tool said: <that result>" (finish: stop)
  - else, if mcp__everything__echo is offered -> call it with the last user message
  - else -> answer "no echo tool offered"
Each request is logged as one JSON line (`{"round": ..., "tools": [...], "last_role": ...}`), and
the bearer token it saw is checked against $E2E_EXPECTED_KEY (401 otherwise): the agent must
send the key from the profile's Secret, which the app never sees.
"""

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common import send_json

ECHO = "mcp__everything__echo"
EXPECTED_KEY = os.environ.get("E2E_EXPECTED_KEY", "")
ROUNDS = 0
LOCK = threading.Lock()


def completion(message, finish_reason):
    return {
        "id": "chatcmpl-e2e",
        "object": "chat.completion",
        "created": 0,
        "model": "e2e-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def answer(body):
    messages = body.get("messages", [])
    last = messages[-1] if messages else {}
    offered = [t.get("function", {}).get("name") for t in body.get("tools", []) or []]
    if last.get("role") == "tool":
        content = last.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return offered, completion({"role": "assistant", "content": f"the tool said: {content}"}, "stop")
    if ECHO in offered:
        said = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
        call = {"id": "call_e2e_1", "type": "function", "function": {"name": ECHO, "arguments": json.dumps({"message": said})}}
        return offered, completion({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls")
    return offered, completion({"role": "assistant", "content": "no echo tool offered"}, "stop")


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        global ROUNDS
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self.reply(404, {"error": {"message": f"no route {self.path}"}})
        if EXPECTED_KEY and self.headers.get("Authorization") != f"Bearer {EXPECTED_KEY}":
            return self.reply(401, {"error": {"message": "wrong or missing API key"}})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        offered, reply = answer(body)
        with LOCK:
            ROUNDS += 1
            n = ROUNDS
        last_role = (body.get("messages") or [{}])[-1].get("role")
        print(json.dumps({"round": n, "tools": offered, "last_role": last_role}), flush=True)
        self.reply(200, reply)

    def do_GET(self):  # noqa: N802
        self.reply(200, {"ok": True}) if self.path == "/healthz" else self.reply(404, {})

    def reply(self, status, body):
        send_json(self, status, body)

    def log_message(self, fmt, *args):
        print(f"upstream: {fmt % args}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("E2E_UPSTREAM_PORT", "8000"))), Handler)
    print("upstream: serving", flush=True)
    server.serve_forever()
