"""A protected MCP server and its OAuth authorization server, for the agent's OAuth client tests.

- Authorization server: authlib's `AuthorizationServer` (PyPI `authlib`) with its
  client-credentials grant, client_secret_basic / client_secret_post client authentication and
  its bearer token generator; plus the RFC 8693 token-exchange grant, whose subject token is a
  Kubernetes service-account token verified with `authlib.jose` against the cluster's JWKS
  (`--jwks FILE`, `--sa-issuer`, `--sa-audience`). Metadata at
  /.well-known/oauth-authorization-server (RFC 8414).
- Protected resource: the PyPI `mcp` SDK's MCPServer with auth settings: protected-resource
  metadata (RFC 9728), 401 challenges, bearer verification against the tokens issued here
  (unknown, expired, revoked or issued for another resource: refused). One tool, `whoami`.
- For the test: POST /admin/revoke revokes every token issued so far; GET /admin/requests lists
  the token requests (grant type, client, how it authenticated, scope, resource, subject, outcome);
  GET /admin/tokens the tokens issued (so the test can look for them where they must not be).
- `--sa-direct-audience AUD`: the MCP server also accepts the cluster's service-account tokens
  with that audience as they are (verified against `--jwks`, `--sa-issuer`).

`--tls-ca DIR` serves HTTPS: a certificate for the host of `--public-url`, issued at start by
the CA in DIR (`ca.crt`, `ca.key`), so a test or a pod need not know the address in advance.

`--interactive-only` advertises only the authorization-code grant (and refuses others), as a
server built for people at browsers does.

`--authorization-code` serves that grant for real: authlib's authorization-code grant with PKCE
(RFC 7636, S256 required) for the public client `--login-client` (redirect URIs on loopback),
whose /authorize approves at once as the person `person` (the test plays the browser) and adds
the RFC 9207 `iss`; and its refresh-token grant with rotation (each refresh revokes the old
refresh token and issues a new one). POST /admin/revoke then revokes the refresh tokens too.

    python oauth_server.py --port P [--host H --public-url URL] --client-id ID --client-secret S [--token-lifetime SECONDS]
        [--interactive-only] [--jwks FILE --sa-issuer ISS --sa-audience AUD --exchange-client ID] [--tls-ca DIR]
"""

import argparse
import json
import os
import secrets
import time

# authlib refuses http URLs unless told: this server listens on loopback only.
os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"

import warnings

import uvicorn

with warnings.catch_warnings():
    # authlib.jose points to joserfc for new code; it is authlib's own and fine here.
    warnings.simplefilter("ignore")
    from authlib.jose import JsonWebKey, JsonWebToken
from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Request
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6749 import grants
from authlib.oauth2.rfc6749.errors import InvalidGrantError, InvalidRequestError, UnsupportedGrantTypeError
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7636 import CodeChallenge
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SCOPES = ["mcp:tools", "mcp:admin"]
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"


class FormRequest(OAuth2Request):
    """A token request as authlib reads it (what its Flask and Django integrations build)."""

    def __init__(self, url, headers, form):
        super().__init__("POST", url, headers=headers)
        self.payload = BasicOAuth2Payload(form)
        self._form = form

    @property
    def form(self):
        return self._form

    @property
    def args(self):
        return {}


class QueryRequest(OAuth2Request):
    """An authorization request as authlib reads it: the query's parameters."""

    def __init__(self, url, headers, query):
        super().__init__("GET", url, headers=headers)
        self.payload = BasicOAuth2Payload(query)

    @property
    def form(self):
        return {}

    @property
    def args(self):
        return self.payload.data


class Client(ClientMixin):
    def __init__(self, client_id, secret, methods, grant_types, loopback_redirects=False):
        self.client_id, self.secret, self.methods, self.grant_types = client_id, secret, methods, grant_types
        self.loopback_redirects = loopback_redirects

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None

    def get_allowed_scope(self, scope):
        return " ".join(s for s in (scope or "").split() if s in SCOPES)

    def check_redirect_uri(self, redirect_uri):
        # RFC 8252 section 7.3: any port of a loopback redirect URI.
        return self.loopback_redirects and redirect_uri.startswith("http://127.0.0.1:")

    def check_client_secret(self, client_secret):
        return self.secret is not None and secrets.compare_digest(self.secret, client_secret)

    def check_endpoint_auth_method(self, method, endpoint):
        return method in self.methods

    def check_response_type(self, response_type):
        return self.loopback_redirects and response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type in self.grant_types


class ClientCredentialsGrant(grants.ClientCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]


class TokenExchangeGrant(grants.BaseGrant, grants.TokenEndpointMixin):
    """RFC 8693 with a service-account token as the subject (the client is public: the subject
    token is the credential)."""

    GRANT_TYPE = TOKEN_EXCHANGE
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]

    def validate_token_request(self):
        form = self.request.payload.data
        if form.get("subject_token_type") != JWT_TOKEN_TYPE or not form.get("subject_token"):
            raise InvalidRequestError("subject_token of type jwt is required")
        client = self.authenticate_token_endpoint_client()
        if not client.check_grant_type(self.GRANT_TYPE):
            raise UnsupportedGrantTypeError(self.GRANT_TYPE)
        state = self.server.state
        try:
            claims = JsonWebToken(["ES256", "RS256"]).decode(
                form["subject_token"],
                state["jwks"],
                claims_options={
                    "iss": {"essential": True, "value": state["sa_issuer"]},
                    "aud": {"essential": True, "value": state["sa_audience"]},
                    "exp": {"essential": True},
                },
            )
            claims.validate()
        except Exception as error:  # authlib raises several JoseError kinds
            raise InvalidGrantError(f"subject_token: {type(error).__name__}") from error
        self.request.client = client
        self.request.user = claims["sub"]

    def create_token_response(self):
        scope = self.request.client.get_allowed_scope(self.request.payload.scope)
        token = self.generate_token(user=self.request.user, scope=scope, include_refresh_token=False)
        self.save_token(token)
        return 200, token, self.TOKEN_RESPONSE_HEADER


class Issued:
    """An authorization code or a refresh token, as the grants below read it."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def check_client(self, client):
        return self.client_id == client.get_client_id()

    def get_scope(self):
        return self.scope

    def get_redirect_uri(self):
        return self.redirect_uri


class AuthorizationCodeGrant(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]

    def save_authorization_code(self, code, request):
        data = request.payload.data
        self.server.state["codes"][code] = Issued(
            client_id=request.client.get_client_id(),
            redirect_uri=data.get("redirect_uri"),
            scope=request.scope,
            user=request.user,
            code_challenge=data.get("code_challenge"),
            code_challenge_method=data.get("code_challenge_method"),
        )

    def query_authorization_code(self, code, client):
        found = self.server.state["codes"].get(code)
        return found if found is not None and found.check_client(client) else None

    def delete_authorization_code(self, authorization_code):
        codes = self.server.state["codes"]
        for code in [c for c, v in codes.items() if v is authorization_code]:
            del codes[code]

    def authenticate_user(self, authorization_code):
        return authorization_code.user


class RefreshTokenGrant(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token):
        state = self.server.state
        if refresh_token in state["revoked_refresh"]:
            return None
        return state["refresh"].get(refresh_token)

    def authenticate_user(self, refresh_token):
        return refresh_token.user

    def revoke_old_credential(self, refresh_token):
        state = self.server.state
        state["revoked_refresh"].update(t for t, v in state["refresh"].items() if v is refresh_token)


class Server(AuthorizationServer):
    def __init__(self, state):
        super().__init__(scopes_supported=SCOPES)
        self.state = state

    def query_client(self, client_id):
        return self.state["clients"].get(client_id)

    def save_token(self, token, request):
        user = request.user if isinstance(request.user, str) else None
        self.state["tokens"][token["access_token"]] = {
            "client_id": request.client.get_client_id(),
            "scopes": (token.get("scope") or "").split(),
            "expires_at": int(time.time()) + int(token.get("expires_in", 0)),
            "resource": request.payload.data.get("resource"),
            "subject": user,
        }
        if token.get("refresh_token"):
            self.state["refresh"][token["refresh_token"]] = Issued(
                client_id=request.client.get_client_id(), scope=token.get("scope"), user=user, redirect_uri=None
            )

    def send_signal(self, name, *args, **kwargs):
        pass

    def create_oauth2_request(self, request):
        return request

    def handle_response(self, status, body, headers):
        return JSONResponse(body, status_code=status, headers=dict(headers))


class Verifier:
    """What the MCP server accepts: a token issued here, unexpired, unrevoked."""

    def __init__(self, state):
        self.state = state

    async def verify_token(self, token):
        issued = self.state["tokens"].get(token)
        if issued is None and self.state["direct_audience"]:
            return self.service_account_token(token)
        if issued is None or token in self.state["revoked"] or issued["expires_at"] <= time.time():
            return None
        return AccessToken(
            token=token,
            client_id=issued["client_id"],
            scopes=issued["scopes"],
            expires_at=issued["expires_at"],
            resource=issued["resource"],
            subject=issued["subject"],
        )


    def service_account_token(self, token):
        """`--sa-direct-audience`: a service-account token of the cluster, sent as is."""
        try:
            claims = JsonWebToken(["ES256", "RS256"]).decode(
                token,
                self.state["jwks"],
                claims_options={
                    "iss": {"essential": True, "value": self.state["sa_issuer"]},
                    "aud": {"essential": True, "value": self.state["direct_audience"]},
                    "exp": {"essential": True},
                },
            )
            claims.validate()
        except Exception:
            return None
        self.state["direct"].append(claims["sub"])
        return AccessToken(
            token=token,
            client_id="kubernetes",
            scopes=["mcp:tools"],
            expires_at=int(claims["exp"]),
            resource=self.state["resource"],
            subject=claims["sub"],
        )


def issue_certificate(ca_dir, host):
    """A server certificate for `host` (a name or an IP address) signed by the CA in `ca_dir`;
    returns the paths of the certificate and its key."""
    import datetime
    import ipaddress
    import tempfile

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_cert = x509.load_pem_x509_certificate(open(os.path.join(ca_dir, "ca.crt"), "rb").read())
    ca_key = serialization.load_pem_private_key(open(os.path.join(ca_dir, "ca.key"), "rb").read(), password=None)
    try:
        san = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out = tempfile.mkdtemp(prefix="oauth-server-tls-")
    cert_path, key_path = os.path.join(out, "tls.crt"), os.path.join(out, "tls.key")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return cert_path, key_path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--public-url", help="the base URL clients use (default http://127.0.0.1:PORT)")
    parser.add_argument("--client-id", default="spear")
    parser.add_argument("--client-secret", required=True)
    parser.add_argument("--token-lifetime", type=int, default=3600)
    parser.add_argument("--interactive-only", action="store_true")
    parser.add_argument("--authorization-code", action="store_true")
    parser.add_argument("--login-client", default="spear-login")
    parser.add_argument("--jwks")
    parser.add_argument("--sa-issuer")
    parser.add_argument("--sa-audience")
    parser.add_argument("--exchange-client", default="spear-exchange")
    parser.add_argument("--sa-direct-audience")
    parser.add_argument("--tls-ca", help="serve HTTPS with a certificate issued by the CA in this directory")
    args = parser.parse_args()

    base = (args.public_url or f"http://127.0.0.1:{args.port}").rstrip("/")
    state = {
        "clients": {
            args.client_id: Client(
                args.client_id, args.client_secret, ["client_secret_basic", "client_secret_post"], ["client_credentials"]
            ),
            args.exchange_client: Client(args.exchange_client, None, ["none"], [TOKEN_EXCHANGE]),
            args.login_client: Client(
                args.login_client, None, ["none"], ["authorization_code", "refresh_token"], loopback_redirects=True
            ),
        },
        "tokens": {},
        "revoked": set(),
        "codes": {},
        "refresh": {},
        "revoked_refresh": set(),
        "requests": [],
        "jwks": JsonWebKey.import_key_set(json.load(open(args.jwks))) if args.jwks else None,
        "sa_issuer": args.sa_issuer,
        "sa_audience": args.sa_audience,
        "direct_audience": args.sa_direct_audience,
        "direct": [],
        "resource": f"{base}/mcp",
    }
    server = Server(state)
    server.register_token_generator(
        "default",
        BearerTokenGenerator(
            access_token_generator=lambda **_: secrets.token_urlsafe(32),
            refresh_token_generator=lambda **_: secrets.token_urlsafe(32),
            expires_generator=lambda client, grant_type: args.token_lifetime,
        ),
    )
    if not args.interactive_only:
        server.register_grant(ClientCredentialsGrant)
        if state["jwks"] is not None:
            server.register_grant(TokenExchangeGrant)
    if args.authorization_code:
        server.register_grant(AuthorizationCodeGrant, [CodeChallenge(required=True)])
        server.register_grant(RefreshTokenGrant)

    grant_types = ["authorization_code", "refresh_token"] if args.interactive_only else ["client_credentials", TOKEN_EXCHANGE]
    if args.authorization_code and not args.interactive_only:
        grant_types += ["authorization_code", "refresh_token"]

    async def as_metadata(_request: Request):
        return JSONResponse(
            {
                "issuer": base,
                "authorization_endpoint": f"{base}/authorize",
                "token_endpoint": f"{base}/token",
                "grant_types_supported": grant_types,
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
                "scopes_supported": SCOPES,
                "response_types_supported": ["code"],
                "code_challenge_methods_supported": ["S256"],
                "authorization_response_iss_parameter_supported": args.authorization_code,
            }
        )

    async def token(request: Request):
        form = dict(await request.form())
        # Starlette's headers: case-insensitive, as authlib's lookups expect.
        oauth_request = FormRequest(str(request.url), request.headers, form)
        response = server.create_token_response(oauth_request)
        entry = {
            "grant_type": form.get("grant_type"),
            "client_id": oauth_request.client.get_client_id() if oauth_request.client else None,
            "auth_method": oauth_request.auth_method,
            "scope": form.get("scope"),
            "resource": form.get("resource"),
            "subject": oauth_request.user if isinstance(oauth_request.user, str) else None,
            "status": response.status_code,
        }
        state["requests"].append(entry)
        return response

    async def revoke(_request: Request):
        state["revoked"].update(state["tokens"].keys())
        state["revoked_refresh"].update(state["refresh"].keys())
        return JSONResponse({"revoked": len(state["revoked"])})

    async def requests(_request: Request):
        return JSONResponse(state["requests"])

    async def issued(_request: Request):
        return JSONResponse({"tokens": list(state["tokens"].keys()), "direct_subjects": state["direct"]})

    async def authorize(request: Request):
        if not args.authorization_code:
            return Response("a person would sign in here", status_code=200)
        query = dict(request.query_params)
        oauth_request = QueryRequest(str(request.url), request.headers, query)
        grant = server.get_authorization_grant(oauth_request)
        response = server.create_authorization_response(oauth_request, grant_user="person", grant=grant)
        location = response.headers.get("location")
        state["requests"].append({"authorize": query, "status": response.status_code})
        if response.status_code == 302 and location and "code=" in location:
            return Response(status_code=302, headers={"location": f"{location}&iss={base}"})
        return response

    mcp = MCPServer(
        "oauth-protected",
        token_verifier=Verifier(state),
        auth=AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}/mcp",
            required_scopes=["mcp:tools"],
            validate_token_resource=True,
        ),
    )

    @mcp.tool()
    def whoami() -> str:
        """Who the server thinks the caller is."""
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        return json.dumps({"client_id": token.client_id, "subject": token.subject, "scopes": token.scopes})

    # Bound to loopback, the SDK also checks Host and Origin (DNS rebinding); in a pod it is
    # reached by its IP.
    app = mcp.streamable_http_app(host=args.host)
    app.router.routes.extend(
        [
            Route("/.well-known/oauth-authorization-server", as_metadata, methods=["GET"]),
            Route("/token", token, methods=["POST"]),
            Route("/authorize", authorize, methods=["GET"]),
            Route("/admin/revoke", revoke, methods=["POST"]),
            Route("/admin/requests", requests, methods=["GET"]),
            Route("/admin/tokens", issued, methods=["GET"]),
        ]
    )
    tls = {}
    if args.tls_ca:
        from urllib.parse import urlsplit

        cert, key = issue_certificate(args.tls_ca, urlsplit(base).hostname)
        tls = {"ssl_certfile": cert, "ssl_keyfile": key}
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", **tls)


if __name__ == "__main__":
    main()
