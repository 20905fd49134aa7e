"""Ory Hydra's counterpart for the login tests: its login and consent app, a protected MCP server
that trusts Hydra, and the person's browser.

Hydra (built from its Go module, `hack/hydra.sh`) is the authorization server; it leaves who the
person is and what they consent to to a login and consent app it redirects the browser to. This
script is that app (it signs everyone in as `person` and grants what the client asked for, through
Hydra's admin API) and the resource server: the PyPI `mcp` SDK's MCPServer with auth settings
naming Hydra as its authorization server (RFC 9728 metadata, 401 challenges), verifying tokens
with Hydra's admin introspection endpoint. One tool, `whoami`.

    python hydra_app.py serve --port P --hydra-public URL --hydra-admin URL
    python hydra_app.py browse URL     # follows an authorization URL as a browser (cookies kept)
"""

import argparse
import http.cookiejar
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import uvicorn
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def admin_call(admin, method, path, body=None, form=None):
    """One call to Hydra's admin API: its JSON answer."""
    data, headers = None, {}
    if body is not None:
        data, headers = json.dumps(body).encode(), {"Content-Type": "application/json"}
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
    request = urllib.request.Request(f"{admin}{path}", data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read() or b"{}")


class Introspection:
    """What the MCP server accepts: a token Hydra says is active, with its subject and scopes."""

    def __init__(self, admin):
        self.admin = admin

    async def verify_token(self, token):
        found = admin_call(self.admin, "POST", "/admin/oauth2/introspect", form={"token": token})
        if not found.get("active") or found.get("token_use", "access_token") != "access_token":
            return None
        return AccessToken(
            token=token,
            client_id=found.get("client_id", ""),
            scopes=found.get("scope", "").split(),
            expires_at=found.get("exp"),
            subject=found.get("sub"),
        )


def serve(args):
    admin = args.hydra_admin.rstrip("/")
    base = f"http://127.0.0.1:{args.port}"

    async def login(request: Request):
        challenge = request.query_params["login_challenge"]
        accepted = admin_call(
            admin,
            "PUT",
            f"/admin/oauth2/auth/requests/login/accept?login_challenge={urllib.parse.quote(challenge)}",
            body={"subject": "person", "remember": False},
        )
        return Response(status_code=302, headers={"location": accepted["redirect_to"]})

    async def consent(request: Request):
        challenge = urllib.parse.quote(request.query_params["consent_challenge"])
        asked = admin_call(admin, "GET", f"/admin/oauth2/auth/requests/consent?consent_challenge={challenge}")
        accepted = admin_call(
            admin,
            "PUT",
            f"/admin/oauth2/auth/requests/consent/accept?consent_challenge={challenge}",
            body={
                "grant_scope": asked.get("requested_scope") or [],
                "grant_access_token_audience": asked.get("requested_access_token_audience") or [],
                "remember": False,
            },
        )
        return Response(status_code=302, headers={"location": accepted["redirect_to"]})

    async def health(_request: Request):
        return JSONResponse({"ok": True})

    mcp = MCPServer(
        "hydra-protected",
        token_verifier=Introspection(admin),
        auth=AuthSettings(
            issuer_url=args.hydra_public.rstrip("/"),
            resource_server_url=f"{base}/mcp",
            required_scopes=["mcp:tools"],
        ),
    )

    @mcp.tool()
    def whoami() -> str:
        """Who the server thinks the caller is."""
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        return json.dumps({"client_id": token.client_id, "subject": token.subject, "scopes": token.scopes})

    app = mcp.streamable_http_app(host="127.0.0.1")
    app.router.routes.extend(
        [
            Route("/login", login, methods=["GET"]),
            Route("/consent", consent, methods=["GET"]),
            Route("/healthz", health, methods=["GET"]),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def browse(url):
    """Follows `url` and its redirects with a cookie jar (Hydra's CSRF cookies), to the end: the
    login's loopback redirect listener. Prints the final status."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    for attempt in range(3):
        try:
            with opener.open(url, timeout=20) as answer:
                print(answer.status)
                return 0
        except urllib.error.HTTPError as e:
            print(e.code, e.read().decode(errors="replace")[:500], file=sys.stderr)
            return 1
        except urllib.error.URLError as e:
            if attempt == 2:
                print(e, file=sys.stderr)
                return 1
            time.sleep(0.5)
    return 1


def main():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    serve_args = commands.add_parser("serve")
    serve_args.add_argument("--port", type=int, required=True)
    serve_args.add_argument("--hydra-public", required=True)
    serve_args.add_argument("--hydra-admin", required=True)
    browse_args = commands.add_parser("browse")
    browse_args.add_argument("url")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args)
        return 0
    return browse(args.url)


if __name__ == "__main__":
    sys.exit(main())
