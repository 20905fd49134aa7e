"""`spearlet auth login --no-browser` inside a pod, with this script as the person's browser.

The e2e's grant step runs it in a pod of its own, so the login reaches the authorization server
at its pod address wherever the test runs (no route into the pod network from the test's host is
needed) and the redirect reaches the login's loopback listener in the same pod. It starts the
login, reads the authorization URL from the one line the login prints, follows it (the test
authorization server approves at once and answers with a redirect to the loopback URI), follows
that redirect, and exits with the login's status after echoing its output.

    python3 login.py --ca FILE -- /spear/bin/spearlet auth login --server NAME -n NS --no-browser
"""

import argparse
import http.client
import ssl
import subprocess
import sys
import urllib.parse


def get(url, context):
    """One GET, redirects not followed: (status, Location)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port or 443, context=context, timeout=30)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
    path = parts.path + ("?" + parts.query if parts.query else "")
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    return response.status, response.getheader("location")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ca", required=True, help="the CA the authorization server's certificate chains to")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    context = ssl.create_default_context(cafile=args.ca)

    login = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    followed = False
    for line in login.stdout:
        print(f"login: {line.rstrip()}", flush=True)
        if not followed and line.startswith("https://"):
            followed = True
            status, location = get(line.strip(), context)
            print(f"browser: authorization endpoint answered {status}", flush=True)
            if status in (302, 303) and location:
                status, _ = get(location, context)
                print(f"browser: the redirect to the login's listener answered {status}", flush=True)
    code = login.wait()
    print(f"login exited {code}", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
