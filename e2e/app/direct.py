"""The baseline of the e2e latency figure: the same tools/call as driver.py's /rawbench, made
directly to a stdio server over its bridge socket (newline-delimited JSON-RPC), with no agent.

    python3 direct.py SOCKET N NAME ARGS_JSON     (prints one JSON line: n, p50_us, p99_us)

It runs in a pod of its own that has a bridge sidecar but no agent (e2e/main.rs, measure mode):
the bridge serves one client, and in an injected pod that client is the agent.
"""

import json
import os
import socket
import sys
import time

from common import percentiles


def main():
    path, n, name, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"{path} did not appear")
        time.sleep(0.1)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    stream = sock.makefile("rwb", buffering=0)
    reader = sock.makefile("rb")

    def rpc(body, wait=True):
        stream.write(json.dumps(body).encode() + b"\n")
        if not wait:
            return None
        while True:
            line = reader.readline()
            if not line:
                sys.exit("the bridge closed the connection")
            message = json.loads(line)
            if message.get("id") == body["id"]:
                return message

    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e-direct", "version": "0"}}
    rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init})
    rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, wait=False)
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}}
    rpc(call)
    samples = []
    for i in range(n):
        call["id"] = i + 2
        start = time.perf_counter_ns()
        answer = rpc(call)
        samples.append((time.perf_counter_ns() - start) // 1000)
        if "error" in answer or answer.get("result", {}).get("isError"):
            sys.exit(f"call {i}: {answer}")
    print(json.dumps(percentiles(samples)), flush=True)


if __name__ == "__main__":
    main()
