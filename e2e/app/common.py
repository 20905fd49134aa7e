"""What the e2e programs share: a JSON answer from an http.server handler, and percentiles."""

import json


def send_json(handler, status, body):
    """Answers `body` (JSON, or a string as is) with `status` on an http.server handler."""
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def percentiles(samples):
    """p50 and p99 of latency samples in microseconds (sorts them in place)."""
    samples.sort()
    return {
        "n": len(samples),
        "p50_us": samples[len(samples) // 2],
        "p99_us": samples[min(len(samples) - 1, (len(samples) * 99) // 100)],
    }
