"""A naive file server over stdio, for spear-mcp's resource-policy tests (tests/it/attacks.rs).

It resolves a resource URI the way careless servers do, so that every spelling which reaches it
has its effect: the path of the URI (`urlparse(uri).path`: query and fragment dropped),
percent-decoded, backslashes taken as separators, then `..` and `//` resolved by the file
system. It trusts the agent's policy entirely and checks nothing itself.

    python path_resolving_server.py LOG [--list URI]... [--template URI_TEMPLATE]...

LOG gets one JSON line per request that names a URI (`resources/read`, `resources/subscribe`,
`resources/unsubscribe`, `completion/complete`), before it is served: `{"method", "uri",
"opened"}`, `opened` being the absolute path a read opened (reads only). `resources/list` and
`resources/templates/list` answer the `--list` URIs and `--template`s as given. Plain stdlib,
one JSON-RPC message per line.
"""

import argparse
import json
import os
import sys
from urllib.parse import unquote, urlparse


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def resolve(uri: str) -> str:
    return os.path.realpath(unquote(urlparse(uri).path).replace("\\", "/"))


def log(log_path: str, entry: dict) -> None:
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--list", action="append", default=[])
    parser.add_argument("--template", action="append", default=[])
    args = parser.parse_args()
    log_path, listed, templates = args.log, args.list, args.template
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        method, request_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if request_id is None:
            continue
        result = None
        error = None
        if method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"resources": {"subscribe": True}, "completions": {}},
                "serverInfo": {"name": "path-resolving", "version": "0"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": []}
        elif method == "resources/list":
            result = {"resources": [{"uri": u, "name": os.path.basename(u) or u} for u in listed]}
        elif method == "resources/templates/list":
            result = {"resourceTemplates": [{"uriTemplate": t, "name": "template"} for t in templates]}
        elif method == "resources/read":
            uri = params.get("uri", "")
            opened = resolve(uri)
            log(log_path, {"method": method, "uri": uri, "opened": opened})
            try:
                with open(opened, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                result = {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}
            except OSError as e:
                error = {"code": -32002, "message": f"cannot read: {e.strerror}"}
        elif method in ("resources/subscribe", "resources/unsubscribe"):
            log(log_path, {"method": method, "uri": params.get("uri", "")})
            result = {}
        elif method == "completion/complete":
            log(log_path, {"method": method, "uri": (params.get("ref") or {}).get("uri", "")})
            result = {"completion": {"values": [], "hasMore": False}}
        else:
            error = {"code": -32601, "message": f"method not found: {method}"}
        if error is not None:
            send({"jsonrpc": "2.0", "id": request_id, "error": error})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "result": result})


if __name__ == "__main__":
    main()
