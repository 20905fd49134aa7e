#!/usr/bin/env bash
# Builds a minimal OpenTelemetry Collector from its pinned upstream Go modules into
# $HOME/.cache/spear-mcp/otelcol/<version>-<build revision>/bin/otelcol (or $SPEAR_CACHE_DIR/otelcol/...),
# once per version: the OTLP receiver (gRPC and HTTP) and the OTLP/HTTP exporter, nothing else.
# A no-op when that binary is already there. Prints its path on stdout, so
#   export SPEAR_OTELCOL=$(hack/otelcol.sh)
# is all a shell needs; tests/it/tracing.rs finds the same path on its own. Progress goes to stderr.
#
# Why a generated main module: `go install go.opentelemetry.io/collector/cmd/otelcorecol@v` refuses
# a module with replace directives, and otelcorecol carries many components the tests do not use.
# The main below is what the collector builder (ocb) generates for these two components.
set -euo pipefail

# Pinned version of the collector's v0 modules (otelcol, otlpreceiver, otlphttpexporter; the v1
# modules they need are resolved by `go mod tidy` from their requirements). Changing it (or
# BUILD_REVISION, when the main below changes) triggers a rebuild; tests/it/tracing.rs names the same.
OTELCOL_VERSION="${SPEAR_OTELCOL_VERSION:-v0.165.0}"
BUILD_REVISION="b3"

CACHE_ROOT="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
OUT="$CACHE_ROOT/otelcol/$OTELCOL_VERSION-$BUILD_REVISION"
BIN="$OUT/bin/otelcol"

log() { echo "otelcol: $*" >&2; }

if [[ -x "$BIN" ]]; then
  log "cached in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is required to build the collector"; exit 1; }
start=$(date +%s)
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0
src="$OUT/src"
mkdir -p "$src" "$OUT/bin"
cat >"$src/go.mod" <<GOMOD
module spear.dev/testenv/otelcol

go 1.25

require (
	go.opentelemetry.io/collector/exporter/otlphttpexporter $OTELCOL_VERSION
	go.opentelemetry.io/collector/otelcol $OTELCOL_VERSION
	go.opentelemetry.io/collector/receiver/otlpreceiver $OTELCOL_VERSION
	go.opentelemetry.io/collector/service $OTELCOL_VERSION
)
GOMOD
cat >"$src/main.go" <<'GO'
// Command otelcol is an OpenTelemetry Collector with the OTLP receiver and the OTLP/HTTP exporter
// only, as the collector builder (ocb) would generate it; its config comes from --config FILE.
package main

import (
	"log"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var err error
	factories := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if factories.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if factories.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](otlphttpexporter.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	return factories, nil
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol", Description: "spear-mcp test collector", Version: "spear"},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
				DefaultScheme:     "file",
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
GO
log "building the collector $OTELCOL_VERSION (otlpreceiver + otlphttpexporter) from its Go modules; a few minutes once"
(cd "$src" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" . >&2)
# Renamed only once built: an interrupted build never leaves a binary that looks cached.
mv "$BIN.tmp" "$BIN"
log "built in $(($(date +%s) - start))s into $BIN"
echo "$BIN"
