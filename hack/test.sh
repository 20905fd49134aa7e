#!/usr/bin/env bash
# Runs the whole test suite: builds (or reuses) the test control plane, then `cargo test`.
# Extra arguments go to `cargo test` (for example `hack/test.sh --test it registry`).
set -euo pipefail
cd "$(dirname "$0")/.."

SPEAR_CONTROL_PLANE_BIN="$(hack/control-plane.sh)"
export SPEAR_CONTROL_PLANE_BIN

cargo test --all-targets "$@"
