#!/usr/bin/env bash
# Builds a pinned Go command-line tool the release recipe uses from its upstream Go module (no
# GitHub release download, only the Go module proxy; `go install module@version` checks it against
# the checksum database) into $HOME/.cache/spear-mcp/go-tools/<name>-<version>/<name> (or under
# $SPEAR_CACHE_DIR), once per version. Prints its path on stdout; progress goes to stderr.
#
#   hack/go-tool.sh actionlint          # the GitHub Actions workflow linter (CI checks .github/)
#   hack/go-tool.sh crane               # go-containerregistry's crane: pushes and checks the
#                                       # OCI layouts hack/release.sh writes (also its own
#                                       # in-memory registry, `crane registry serve`, for the dry run)
#   hack/go-tool.sh NAME -- ARGS        # run it with ARGS
#
# helm, promtool and otelcol have scripts of their own (their builds need more than this).
set -euo pipefail

name="${1:-}"
case "$name" in
  actionlint) module=github.com/rhysd/actionlint/cmd/actionlint version="${SPEAR_ACTIONLINT_VERSION:-v1.7.12}"
    ldflags="-s -w -X github.com/rhysd/actionlint.version=$version" ;;
  crane) module=github.com/google/go-containerregistry/cmd/crane version="${SPEAR_CRANE_VERSION:-v0.22.1}"
    ldflags="-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$version" ;;
  *) echo "go-tool: unknown tool '$name' (actionlint or crane)" >&2; exit 2 ;;
esac
shift

out="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}/go-tools/$name-$version"
bin="$out/$name"
if [[ ! -x "$bin" ]]; then
  command -v go >/dev/null || { echo "go-tool: go is required to build $name" >&2; exit 1; }
  echo "go-tool: building $name $version from $module (once)" >&2
  start=$SECONDS
  mkdir -p "$out"
  # `go install` refuses -mod flags in GOFLAGS; into a temporary GOBIN, then rename, so an
  # interrupted build never leaves a binary that looks cached.
  goflags=""
  for flag in ${GOFLAGS:-}; do [[ "$flag" == -mod=* ]] || goflags+=" $flag"; done
  tmp="$out/tmp.$$"
  rm -rf "$tmp"
  GOFLAGS="$goflags" GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -ldflags "$ldflags" "$module@$version" >&2
  mv "$tmp/$name" "$bin"
  rm -rf "$tmp"
  echo "go-tool: built $name in $((SECONDS - start))s" >&2
fi

case "${1:-}" in
  "") echo "$bin" ;;
  --) shift; exec "$bin" "$@" ;;
  *) echo "go-tool: unknown argument '$1' (usage: hack/go-tool.sh NAME [-- ARGS])" >&2; exit 2 ;;
esac
