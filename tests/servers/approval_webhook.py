"""An approval webhook, as a platform team would write one, for tests/it/approval.rs.

    python approval_webhook.py [--key-file FILE] --log FILE

Prints its port on stdout, then serves POSTs on 127.0.0.1. With --key-file, each request's
signature (`X-Spear-Signature-256: sha256=<hex>` of HMAC-SHA256 over the body) is checked against
the key in the file, read on every request so a test can change it; a missing or wrong signature
gets 401. Without, requests are not checked (`signed` is logged as null). The decision comes from the request's arguments (sent with includeArguments):
`{"text": "allow"}` allows, `"deny"` denies with a reason, `"slow"` answers (allow) after 5 s,
`"slower"` after 14 s,
`"garbage"` answers 200 with a body that is not a decision, `"error"` answers 500. Every request
is appended to --log as one JSON line: its path, its body, whether its signature held, and its
content type. A POST to /redirect is answered 302 to /approve (which would allow).
"""

import argparse
import hashlib
import hmac
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def handler(args):
    class Approver(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            signed = None
            if args.key_file:
                with open(args.key_file, "rb") as f:
                    key = f.read()
                expected = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
                signed = hmac.compare_digest(expected, self.headers.get("X-Spear-Signature-256", ""))
            request = json.loads(body)
            with open(args.log, "a") as log:
                log.write(json.dumps({"path": self.path, "request": request, "signed": signed,
                                      "content_type": self.headers.get("Content-Type")}) + "\n")
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/approve")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if signed is False:
                return self.answer(401, {"error": "bad signature"})
            text = (request.get("arguments") or {}).get("text", "")
            if text == "allow":
                return self.answer(200, {"decision": "allow", "reason": "fine by the webhook"})
            if text in ("slow", "slower"):
                time.sleep(5 if text == "slow" else 14)
                return self.answer(200, {"decision": "allow"})
            if text == "garbage":
                return self.answer(200, "yes please")
            if text == "error":
                return self.answer(500, {"error": "approver broke"})
            return self.answer(200, {"decision": "deny", "reason": "not\nthis one"})

        def answer(self, status, value):
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except BrokenPipeError:
                pass  # the agent stopped waiting (the "slow" case)

    return Approver


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--key-file")
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(args))
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
