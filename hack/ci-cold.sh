#!/usr/bin/env bash
# CI from empty caches, without emptying yours: clones this repository's HEAD into a temporary
# directory and runs `CI=true .ci/run` there with every cache the run fills pointed at an empty
# directory (the hack/ scripts' cache, cargo's target dir and registry, Go's module and build
# caches, npm's and pip's). What the machine itself has stays: rustup's toolchains (stable and
# nightly) and Debian packages already installed. BENCHMARKS.md "CI from empty caches" is its figure.
#
#   hack/ci-cold.sh            # about 35 minutes on 2 cores; needs about 25 GB under $TMPDIR
#   SPEAR_CI_COLD_KEEP=1 hack/ci-cold.sh   # keep the clone and the caches (their path is printed)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="$(mktemp -d "${TMPDIR:-/tmp}/spear-ci-cold.XXXXXX")"
if [[ "${SPEAR_CI_COLD_KEEP:-}" != 1 ]]; then trap 'rm -rf "$root"' EXIT; fi
git clone -q "$repo" "$root/clone"
cd "$root/clone"
echo "ci-cold: $(git rev-parse --short HEAD) in $root, from $(date -u +%H:%M:%S)" >&2
export CI=true SPEAR_CACHE_DIR="$root/cache/spear" CARGO_TARGET_DIR="$root/cache/spear/target" \
  CARGO_HOME="$root/cache/cargo" GOPATH="$root/cache/go" GOCACHE="$root/cache/go-build" \
  GOMODCACHE="$root/cache/go/pkg/mod" npm_config_cache="$root/cache/npm" PIP_CACHE_DIR="$root/cache/pip"
start=$(date +%s)
status=0
.ci/run || status=$?
echo "ci-cold: .ci/run exited $status after $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s" >&2
exit "$status"
