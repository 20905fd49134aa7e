#!/usr/bin/env bash
# Builds Ory Hydra, the OAuth 2.1 / OpenID Connect authorization server, from its pinned upstream
# Go module into $HOME/.cache/spear-mcp/hydra/<version>-<build revision>/hydra (or under
# $SPEAR_CACHE_DIR), once per version, for the login tests against an authorization server that is
# not ours (tests/it/oauth_hydra.rs: dynamic client registration, PKCE, refresh-token rotation,
# revocation). A no-op when that binary is already there. Prints its path on stdout; progress goes
# to stderr.
#
# Why not `go install`: Hydra's go.mod has replace directives, which `go install module@version`
# refuses. Its module is copied from the module cache instead, and the one replace that points into
# the repository (./internal/httpclient, its generated API client, not part of the module's zip) is
# dropped for the published hydra-client-go of the same release line. Built with the `sqlite` tag
# and cgo: `DSN=memory` (an in-memory SQLite) is all the tests need.
set -euo pipefail

HYDRA_VERSION="${SPEAR_HYDRA_VERSION:-v2.3.0}"
BUILD_REVISION="b1"

CACHE_ROOT="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
OUT="$CACHE_ROOT/hydra/$HYDRA_VERSION-$BUILD_REVISION"
BIN="$OUT/hydra"

log() { echo "hydra: $*" >&2; }

if [[ -x "$BIN" ]]; then
  log "cached in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is required to build Hydra"; exit 1; }
command -v gcc >/dev/null || { log "gcc is required to build Hydra (cgo, for SQLite)"; exit 1; }
start=$(date +%s)
log "building Hydra $HYDRA_VERSION from its Go module (once; a few minutes)"
module_dir=$(go mod download -json "github.com/ory/hydra/v2@$HYDRA_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d "$module_dir" ]] || { log "go mod download found no directory for github.com/ory/hydra/v2@$HYDRA_VERSION"; exit 1; }
src="$OUT/src.$$"
rm -rf "$src"
mkdir -p "$OUT"
cp -r "$module_dir" "$src"
chmod -R u+w "$src"
sed -i '/^replace github.com\/ory\/hydra-client-go\/v2 => .\/internal\/httpclient/d' "$src/go.mod"
# Into a temporary name, then renamed: an interrupted build never leaves a binary that looks cached.
(cd "$src" && GOTOOLCHAIN=local GOFLAGS="-mod=mod" CGO_ENABLED=1 \
  go build -tags sqlite,sqlite_omit_load_extension -trimpath -ldflags "-s -w" -o "$OUT/hydra.tmp" .) >&2
mv "$OUT/hydra.tmp" "$BIN"
rm -rf "$src"
log "built in $(($(date +%s) - start)) s: $BIN"
echo "$BIN"
