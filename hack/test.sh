#!/usr/bin/env bash
# Runs the whole test suite: builds (or reuses) the test control plane, then `cargo test`.
# Extra arguments go to `cargo test` (for example `hack/test.sh --test it registry`).
set -euo pipefail
cd "$(dirname "$0")/.."

SPEAR_CONTROL_PLANE_BIN="$(hack/control-plane.sh)"
export SPEAR_CONTROL_PLANE_BIN
# The real MCP servers the tests talk to (npm + PyPI, cached); exports SPEAR_MCP_SERVERS_DIR.
# (`|| echo exit 1`: set -e does not see a failure inside eval's command substitution.)
eval "$(hack/mcp-servers.sh || echo exit 1)"
# The static spearlet the init container copies into pods (release, crt-static; cached in the
# target dir); tests/it/static_binary.rs checks it has no dynamic dependencies.
SPEAR_STATIC_SPEARLET="$(hack/build-static.sh)"
export SPEAR_STATIC_SPEARLET
# The pinned helm CLI (built from its Go module, cached); tests/it/chart.rs lints and renders the chart.
SPEAR_HELM="$(hack/helm.sh)"
export SPEAR_HELM
# The pinned promtool (built from the prometheus Go module, cached); tests/it/alerts.rs checks and
# unit-tests the chart's PrometheusRule with it.
SPEAR_PROMTOOL="$(hack/promtool.sh)"
export SPEAR_PROMTOOL
# The OpenTelemetry Collector (built from its Go modules, cached); tests/it/tracing.rs exports to it.
SPEAR_OTELCOL="$(hack/otelcol.sh)"
export SPEAR_OTELCOL
# Ory Hydra (built from its Go module, cached); tests/it/oauth_hydra.rs logs in at it.
SPEAR_HYDRA="$(hack/hydra.sh)"
export SPEAR_HYDRA
# Debian's chromium (apt-get, once); tests/it/cluster/admin_view.rs loads the admin view in it.
SPEAR_CHROMIUM="$(hack/chromium.sh)"
export SPEAR_CHROMIUM

cargo test --all-targets "$@"
