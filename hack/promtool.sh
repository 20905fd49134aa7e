#!/usr/bin/env bash
# Builds `promtool` (Prometheus's rule checker and rule unit-test runner) from its pinned upstream
# Go module (github.com/prometheus/prometheus; no GitHub release download, only the Go module
# proxy) into $HOME/.cache/spear-mcp/promtool/<version>-<build revision>/bin/promtool (or
# $SPEAR_CACHE_DIR/promtool/...), once per version. A no-op when that binary is already there.
# Progress goes to stderr. The chart's PrometheusRule is checked with it (tests/it/alerts.rs).
#
# Usage:
#   hack/promtool.sh           build (or reuse) promtool; print its path on stdout, so
#                              export SPEAR_PROMTOOL=$(hack/promtool.sh) is all a shell needs
#                              (tests/it/alerts.rs finds the same path on its own)
#   hack/promtool.sh -- ARGS   run the pinned promtool with ARGS (e.g. `-- test rules FILE`)
set -euo pipefail

# Pinned version: the Go module tags Prometheus 3.x.y as v0.30x.y (v0.315.1 is Prometheus
# 3.15.1). Changing it (or BUILD_REVISION, when the build below changes) triggers a rebuild;
# tests/it/alerts.rs names the same values to find the binary.
PROMETHEUS_MODULE_VERSION="${SPEAR_PROMETHEUS_MODULE_VERSION:-v0.315.1}"
PROMETHEUS_VERSION="${SPEAR_PROMETHEUS_VERSION:-3.15.1}"
BUILD_REVISION="b2"

CACHE_ROOT="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
OUT="$CACHE_ROOT/promtool/$PROMETHEUS_MODULE_VERSION-$BUILD_REVISION"
BIN="$OUT/bin"
PROMTOOL="$BIN/promtool"

log() { echo "promtool: $*" >&2; }

build() {
  if [[ -x "$PROMTOOL" ]]; then
    log "cached in $PROMTOOL"
    return 0
  fi
  command -v go >/dev/null || { log "go is required to build promtool"; exit 1; }
  mkdir -p "$BIN"
  local start dir
  start=$(date +%s)
  # prometheus's go.mod has a replace directive, which `go install module@version` refuses; so
  # the module is downloaded (checked against the checksum database) and built in its own
  # directory of the module cache, with its own go.mod and go.sum: exactly the pinned
  # dependencies (-mod=readonly: nothing may be re-resolved; the cache directory is read-only;
  # GOWORK=off: the module ships a go.work naming directories its zip leaves out).
  log "downloading github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION"
  dir=$(cd "$OUT" && GOFLAGS=-mod=mod go mod download -json "github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  if [[ ! -d "$dir/cmd/promtool" ]]; then
    log "could not download github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION"
    exit 1
  fi
  # The version stamp prometheus's own build sets (promu), so `promtool --version` names the pin.
  local ldflags="-w -s -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"
  ldflags+=" -X github.com/prometheus/common/version.Branch=module"
  ldflags+=" -X github.com/prometheus/common/version.Revision=$PROMETHEUS_MODULE_VERSION"
  log "building promtool $PROMETHEUS_VERSION from $dir/cmd/promtool; this takes a few minutes once"
  # Into a temporary name, then rename: an interrupted build never leaves a binary that looks cached.
  # remove_all_sd: prometheus's own build tag that leaves out every service-discovery plugin (the
  # AWS, Azure, GCE, Kubernetes... SDKs: most of the build); rule checks and rule tests use none.
  (cd "$dir" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 \
    go build -trimpath -tags remove_all_sd -ldflags "$ldflags" -o "$PROMTOOL.tmp.$$" ./cmd/promtool >&2)
  mv "$PROMTOOL.tmp.$$" "$PROMTOOL"
  log "built in $(($(date +%s) - start))s into $PROMTOOL"
}

build
case "${1:-}" in
  "")
    echo "$PROMTOOL"
    ;;
  --)
    shift
    exec "$PROMTOOL" "$@"
    ;;
  *)
    log "unknown command '$1' (usage: hack/promtool.sh [-- PROMTOOL-ARGS])"
    exit 2
    ;;
esac
