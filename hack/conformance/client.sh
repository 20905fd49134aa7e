#!/usr/bin/env bash
# The client under test in hack/conformance.sh's client legs: what `conformance client --command`
# runs for a scenario, with the scenario's test server URL as the last argument. spearlet is
# started with that server as its only McpServer (`sut`, Streamable HTTP), so its pool is the
# MCP client the suite judges; then every tool the server lists is called once through spearlet's
# /mcp by one session of tests/servers/mcp_relay_client.py (arguments from the scenario's
# MCP_CONFORMANCE_CONTEXT `toolCalls` when it gives them; `add_numbers` gets a=5, b=3), and
# spearlet is stopped.
#   SPEARLET=path/to/spearlet hack/conformance/client.sh http://localhost:PORT/mcp
set -euo pipefail
URL="${*: -1}"
: "${SPEARLET:?SPEARLET must name the spearlet binary (hack/conformance.sh sets it)}"
WORK="$(mktemp -d)"
SPEARLET_PID=""
cleanup() {
  [[ -z "$SPEARLET_PID" ]] || { kill "$SPEARLET_PID" 2>/dev/null; wait "$SPEARLET_PID" 2>/dev/null || true; }
  # What spearlet said about the server: the suite keeps this script's stderr with the results.
  [[ ! -f "$WORK/spearlet.log" ]] || grep -E "WARN|ERROR|session established|session failed" "$WORK/spearlet.log" >&2 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/registry" "$WORK/tokens"
# An auth scenario's credentials (its MCP_CONFORMANCE_CONTEXT) become the McpServer's
# http.auth, the secrets the env vars local mode reads for them (what the webhook sets in a pod),
# a workload JWT the token file of the server (what the webhook's projected volume holds). The
# authorization server is pinned (http.auth.issuer) to the one the scenario's server names in its
# protected-resource metadata: the harness plays the platform team that looked it up once. An
# authorization-code scenario gets http.auth.authorizationCode, and `spearlet auth login` runs
# before spearlet starts (below).
AUTH_YAML="$(python3 - "$WORK/tokens" "$URL" <<'PY'
import json, os, re, sys, urllib.error, urllib.parse, urllib.request
ctx = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
ref = '{secretKeyRef: {name: sut, key: value}}'
# The authorization-code scenarios: every auth/ one but the headless grants' (a1's first three),
# enterprise-managed authorization and DPoP (not implemented; expected.txt says why).
headless = ("client-credentials", "wif-", "enterprise-", "dpop")
code_flow = scenario.startswith("auth/") and not any(scenario[5:].startswith(h) for h in headless)

def challenge_metadata(url):
    """The resource_metadata URL of the server's 401 challenge, if it sends one."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    request = urllib.request.Request(url, data=body, headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-11-25"})
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except urllib.error.HTTPError as e:
        found = re.search(r'resource_metadata="([^"]+)"', e.headers.get("www-authenticate") or "")
        return found.group(1) if found else None
    except Exception:
        pass
    return None

def issuer_of(url):
    u = urllib.parse.urlsplit(url)
    candidates = [f"{u.scheme}://{u.netloc}{p}" for p in
                  (f"/.well-known/oauth-protected-resource{u.path}", "/.well-known/oauth-protected-resource")]
    if code_flow:
        candidates.insert(0, challenge_metadata(url))
    for candidate in filter(None, candidates):
        try:
            with urllib.request.urlopen(candidate, timeout=5) as answer:
                servers = json.load(answer).get("authorization_servers") or []
        except Exception:
            continue
        if servers:
            return servers[0]
    # No protected-resource metadata (a 2025-03-26 server): its origin is its authorization server.
    return f"{u.scheme}://{u.netloc}" if code_flow else None

issuer = issuer_of(sys.argv[2]) if ctx or code_flow else None
pin = f'issuer: {json.dumps(issuer)}, ' if issuer else ''
if code_flow and "client_id" in ctx:
    client = f'clientId: {json.dumps(ctx["client_id"])}, clientSecret: {ref}'
    print(f'    auth: {{{pin}authorizationCode: {{{client}}}}}')
elif code_flow:
    # The client ID metadata document the suite's CIMD scenario expects (it serves none; used
    # only where the authorization server advertises the support, else dynamic registration).
    cimd = json.dumps("https://conformance-test.local/client-metadata.json")
    print(f'    auth: {{{pin}authorizationCode: {{clientIdMetadataUrl: {cimd}}}}}')
elif "private_key_pem" in ctx:
    alg = ctx.get("signing_algorithm", "ES256")
    print(f'    auth: {{clientCredentials: {{clientId: {json.dumps(ctx["client_id"])}, privateKey: {{secretKeyRef: {{name: sut, key: value}}, algorithm: {alg}}}}}}}')
elif "client_secret" in ctx and "idp_client_id" not in ctx:
    print(f'    auth: {{{pin}clientCredentials: {{clientId: {json.dumps(ctx["client_id"])}, clientSecret: {ref}}}}}')
elif "valid_jwt" in ctx:
    with open(os.path.join(sys.argv[1], "sut"), "w") as f:
        f.write(ctx["valid_jwt"])
    print(f'    auth: {{{pin}tokenExchange: {{audience: conformance, grant: jwtBearer, clientId: {json.dumps(ctx["client_id"])}}}}}')
PY
)"
CTX_SECRET="$(python3 -c 'import json, os; c = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}"); print(c.get("private_key_pem") or c.get("client_secret") or "")')"
[[ -z "$CTX_SECRET" ]] || export SPEAR_SECRET_SUT_AUTH_CLIENTSECRET="$CTX_SECRET" SPEAR_SECRET_SUT_AUTH_PRIVATEKEY="$CTX_SECRET"
export SPEAR_AUTH_TOKEN_DIR="$WORK/tokens"
cat >"$WORK/registry/sut.yaml" <<YAML
apiVersion: mcp.spear.dev/v1alpha1
kind: McpServer
metadata:
  name: sut
spec:
  transport: streamableHttp
  http:
    url: "$URL"
$AUTH_YAML
  allowedTools: ["*"]
YAML
source "$(dirname "$0")/lib.sh"
write_profile "$WORK/registry/sut.yaml" sut
export SPEAR_GRANT_DIR="$WORK/grants"
# The person's part: `spearlet auth login --no-browser` prints the authorization URL, and the
# browser is python's urllib, which follows the suite's (auto-approving) authorization server
# back to the login's loopback listener, as the suite's own headless clients do.
login() {
  "$SPEARLET" auth login --server sut --registry-dir "$WORK/registry" --no-browser --timeout 20 \
    >"$WORK/login.url" 2>"$WORK/login.log" &
  local pid=$! _
  for _ in $(seq 1 80); do
    [[ -s "$WORK/login.url" ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  if [[ -s "$WORK/login.url" ]]; then
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10).read()' \
      "$(head -n 1 "$WORK/login.url")" >/dev/null 2>&1 || true
  fi
  wait "$pid" || { cat "$WORK/login.log" >&2; return 1; }
}
CODE_FLOW=""
if grep -q authorizationCode "$WORK/registry/sut.yaml"; then
  CODE_FLOW=1
  login || exit 1
fi
start_spearlet "$WORK"
# Not ready is no reason to stop: some scenarios' servers refuse the first connection on purpose.
wait_ready 15 || true
GRPC="127.0.0.1:$GRPC_PORT"
# NAME is the first column of the table; the header and the `sut` server's failures are skipped.
mapfile -t TOOLS < <("$SPEARLET" tools list --grpc-addr "$GRPC" 2>/dev/null | awk 'NR > 1 && $1 ~ /^mcp__sut__/ { print $1 }')
CALLS=()
for tool in "${TOOLS[@]}"; do
  own="${tool#mcp__sut__}"
  args="$(python3 - "$own" <<'PY'
import json, os, sys
name = sys.argv[1]
calls = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}").get("toolCalls") or []
given = [c.get("arguments", {}) for c in calls if c.get("name") == name]
print(json.dumps(given[0] if given else {"a": 5, "b": 3} if name == "add_numbers" else {}))
PY
)"
  CALLS+=(--call "$tool=$args")
done
# One /mcp session calls them in turn, declaring sampling and elicitation: what the test server
# asks of the pool reaches it through the relay (a 2026-07-28 server's input rounds through the
# bridge), and it accepts every form as shown (--accept-as-shown: the fields the server pre-fills
# with defaults are the pool's to send, SEP-1034). It stands for the person the agent lacks.
[[ ${#CALLS[@]} -eq 0 ]] || "${PYTHON:-python3}" "$(dirname "$0")/../../tests/servers/mcp_relay_client.py" \
  --url "http://127.0.0.1:$HTTP_PORT/mcp" --accept-as-shown "${CALLS[@]}" >/dev/null || true
# A call the grant's scopes do not cover (403 insufficient_scope) notes the demanded scopes in the
# grant and says to log in again: the person does, and the calls are made again.
if [[ -n "$CODE_FLOW" && ${#CALLS[@]} -gt 0 ]] && grep -q step_up_scopes "$WORK/grants/sut.json" 2>/dev/null; then
  login || exit 1
  "${PYTHON:-python3}" "$(dirname "$0")/../../tests/servers/mcp_relay_client.py" \
    --url "http://127.0.0.1:$HTTP_PORT/mcp" --accept-as-shown "${CALLS[@]}" >/dev/null || true
fi
