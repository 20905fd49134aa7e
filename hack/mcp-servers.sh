#!/usr/bin/env bash
# Installs the real MCP servers the tests talk to, once per pinned version set, into
# $HOME/.cache/spear-mcp/mcp-servers/<key>/ (or $SPEAR_CACHE_DIR/mcp-servers/<key>/):
#   node/  npm packages @modelcontextprotocol/server-everything and server-filesystem
#          (a local `npm install --prefix`, run with `node` at test time: no global install, no npx)
#   venv/  a Python venv with the PyPI `mcp` SDK (runs tests/servers/fixture_server.py), `openai`, and the
#          OpenTelemetry SDK with its OTLP/HTTP exporter (tests/servers/traced_server.py; REVISION r2),
#          and authlib, the OAuth authorization server of tests/servers/oauth_server.py (REVISION r3)
# A no-op when that directory exists and its python runs. Prints shell `export` lines on stdout:
#   eval "$(hack/mcp-servers.sh)"
# sets SPEAR_MCP_SERVERS_DIR; the Rust tests (src/testing/mcp_servers.rs) also find the default
# directory on their own. Progress goes to stderr.
set -euo pipefail

# Pinned versions. Changing one of these (or REVISION, when the layout below changes) is what
# triggers a new install; src/testing/mcp_servers.rs names the same values to find the directory.
EVERYTHING_VERSION="2026.8.31" # npm @modelcontextprotocol/server-everything
FILESYSTEM_VERSION="2026.8.31" # npm @modelcontextprotocol/server-filesystem
MCP_VERSION="2.3.0"            # PyPI mcp (the Python SDK; brings httpx2, starlette, uvicorn)
OPENAI_VERSION="3.54.0"        # PyPI openai
OTEL_PY_VERSION="1.45.2"       # PyPI opentelemetry-sdk + opentelemetry-exporter-otlp-proto-http (tests/servers/traced_server.py)
AUTHLIB_VERSION="1.9.10"       # PyPI authlib (tests/servers/oauth_server.py)
REVISION="r3"

CACHE_ROOT="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
KEY="everything-$EVERYTHING_VERSION-filesystem-$FILESYSTEM_VERSION-mcp-$MCP_VERSION-openai-$OPENAI_VERSION-$REVISION"
OUT="$CACHE_ROOT/mcp-servers/$KEY"
PYTHON="${SPEAR_PYTHON:-python3}"

log() { echo "mcp-servers: $*" >&2; }
emit() { printf 'export SPEAR_MCP_SERVERS_DIR=%q\n' "$OUT"; }

# Leftovers of interrupted runs (.tmp-<key>.<pid>, see below) whose run is gone.
for stale in "$CACHE_ROOT/mcp-servers"/.tmp-*.*; do
  [[ -d "$stale" ]] || continue
  kill -0 "${stale##*.}" 2>/dev/null || rm -rf "$stale"
done

# The directory only ever appears by a rename of a finished install, so its presence means
# complete; the python check catches a venv whose base interpreter has since gone away.
if [[ -d "$OUT" ]]; then
  if "$OUT/venv/bin/python" -c '' 2>/dev/null; then
    log "cached in $OUT"
    emit
    exit 0
  fi
  log "$OUT/venv/bin/python no longer runs (base interpreter gone?); reinstalling"
  stale="$OUT.stale.$$"
  mv "$OUT" "$stale"
  rm -rf "$stale"
fi

command -v node >/dev/null || { log "node is required (the npm MCP servers run on it)"; exit 1; }
command -v npm >/dev/null || { log "npm is required to install the npm MCP servers"; exit 1; }
command -v "$PYTHON" >/dev/null || { log "$PYTHON is required (set SPEAR_PYTHON to another interpreter)"; exit 1; }
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { log "$PYTHON is $("$PYTHON" -V 2>&1); mcp $MCP_VERSION needs Python >= 3.10"; exit 1; }

# Install into a temporary sibling, then rename: an interrupted run leaves only a .tmp directory
# (removed on exit, else by a later run once that pid is gone), never a half-filled $OUT. The
# venv keeps working after the rename because bin/python is a symlink to the base interpreter and
# sys.prefix follows pyvenv.cfg; only its console-script shebangs (pip, uvicorn) would name the old
# path, and nothing here uses them.
mkdir -p "$CACHE_ROOT/mcp-servers"
TMP="$CACHE_ROOT/mcp-servers/.tmp-$KEY.$$"
rm -rf "$TMP"
mkdir "$TMP"
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)

log "npm: @modelcontextprotocol/server-everything@$EVERYTHING_VERSION, server-filesystem@$FILESYSTEM_VERSION"
npm install --prefix "$TMP/node" --no-audit --no-fund --omit=dev --loglevel=error \
  "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" \
  "@modelcontextprotocol/server-filesystem@$FILESYSTEM_VERSION" >&2

log "python: venv ($("$PYTHON" -V 2>&1)) with mcp==$MCP_VERSION openai==$OPENAI_VERSION opentelemetry-sdk==$OTEL_PY_VERSION authlib==$AUTHLIB_VERSION"
"$PYTHON" -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  "mcp==$MCP_VERSION" "openai==$OPENAI_VERSION" \
  "opentelemetry-sdk==$OTEL_PY_VERSION" "opentelemetry-exporter-otlp-proto-http==$OTEL_PY_VERSION" \
  "authlib==$AUTHLIB_VERSION" >&2

# Prove the install before publishing it.
for pkg in server-everything server-filesystem; do
  [[ -f "$TMP/node/node_modules/@modelcontextprotocol/$pkg/package.json" ]] \
    || { log "npm did not install @modelcontextprotocol/$pkg"; exit 1; }
done
"$TMP/venv/bin/python" -c 'import mcp.server, openai, uvicorn, opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter, authlib.oauth2.rfc6749' \
  || { log "the venv cannot import mcp/openai/uvicorn/opentelemetry"; exit 1; }

if mv -T "$TMP" "$OUT" 2>/dev/null; then
  trap - EXIT
  log "installed in $(($(date +%s) - start))s into $OUT"
else
  # Another run published the same key first; its install is as good as ours.
  log "another run installed $OUT first; using it"
fi
emit
