#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver + etcd) from pinned upstream Go modules into
# $HOME/.cache/spear-mcp/control-plane/<versions>/bin, once per version pair. A no-op when the
# binaries for the pinned versions are already there. Prints the bin directory on stdout, so
#   export SPEAR_CONTROL_PLANE_BIN=$(hack/control-plane.sh)
# is all a shell needs; the Rust tests find the same directory on their own.
set -euo pipefail

# Pinned versions. Changing one of these (or WRAPPER_REVISION, when the Go mains below change) is
# what triggers a rebuild. The Rust launcher (src/testing/control_plane.rs) names the same values.
K8S_VERSION="${SPEAR_K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${SPEAR_ETCD_VERSION:-v3.6.16}"
WRAPPER_REVISION="w2"

# The staging modules (k8s.io/api, k8s.io/apiserver, ...) are versioned v0.<minor>.<patch>.
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
CACHE_ROOT="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
OUT="$CACHE_ROOT/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-$WRAPPER_REVISION"
BIN="$OUT/bin"

log() { echo "control-plane: $*" >&2; }

if [[ -x "$BIN/kube-apiserver" && -x "$BIN/etcd" ]]; then
  log "cached in $BIN"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { log "go is required to build the control plane"; exit 1; }
mkdir -p "$BIN"
start=$(date +%s)
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

# --- kube-apiserver -------------------------------------------------------------------------
# The wrapper module around upstream's main (hack/k8s-module.sh says why it is needed).
kdir="$OUT/src/kube-apiserver"
# shellcheck source=hack/k8s-module.sh
source "$(dirname "$0")/k8s-module.sh"
k8s_wrapper_module "$kdir" spear.dev/testenv/kube-apiserver "$K8S_VERSION" || exit 1
cat >"$kdir/main.go" <<'GO'
// Command kube-apiserver is upstream's kube-apiserver main, built from the pinned module.
package main

import (
	"io"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	exitWhenParentGone()
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}

// exitWhenParentGone ends the process when its stdin reaches EOF, if SPEAR_EXIT_ON_STDIN_EOF is
// set. The test launcher holds the write end of that pipe, so when a test binary exits for any
// reason (success, panic, abort, SIGKILL) the kernel closes it and no process is left behind.
// SPEAR_REMOVE_ON_EXIT names a directory (data, certificates) removed on the way out.
func exitWhenParentGone() {
	if os.Getenv("SPEAR_EXIT_ON_STDIN_EOF") == "" {
		return
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		if dir := os.Getenv("SPEAR_REMOVE_ON_EXIT"); dir != "" {
			_ = os.RemoveAll(dir)
		}
		os.Exit(0)
	}()
}
GO
log "building kube-apiserver $K8S_VERSION (staging $STAGING_VERSION); this takes a few minutes once"
# Without the version stamped in, the server reports v0.0.0-master: kubectl warns and Helm refuses
# charts with a `kubeVersion` constraint. (w2: adds these ldflags.)
version_ldflags="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
version_ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "$K8S_VERSION" | sed -E 's/^v([0-9]+)\..*/\1/')"
version_ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')"
(cd "$kdir" && go mod tidy >&2 && go build -trimpath -ldflags "$version_ldflags" -o "$BIN/kube-apiserver.tmp" . >&2)
mv "$BIN/kube-apiserver.tmp" "$BIN/kube-apiserver"

# --- etcd -----------------------------------------------------------------------------------
edir="$OUT/src/etcd"
mkdir -p "$edir"
cat >"$edir/go.mod" <<GOMOD
module spear.dev/testenv/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
cat >"$edir/main.go" <<'GO'
// Command etcd runs etcd's own main from the pinned server module.
package main

import (
	"io"
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	exitWhenParentGone()
	etcdmain.Main(os.Args)
}

// exitWhenParentGone ends the process when its stdin reaches EOF, if SPEAR_EXIT_ON_STDIN_EOF is
// set. The test launcher holds the write end of that pipe, so when a test binary exits for any
// reason (success, panic, abort, SIGKILL) the kernel closes it and no process is left behind.
// SPEAR_REMOVE_ON_EXIT names a directory (data, certificates) removed on the way out.
func exitWhenParentGone() {
	if os.Getenv("SPEAR_EXIT_ON_STDIN_EOF") == "" {
		return
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		if dir := os.Getenv("SPEAR_REMOVE_ON_EXIT"); dir != "" {
			_ = os.RemoveAll(dir)
		}
		os.Exit(0)
	}()
}
GO
log "building etcd $ETCD_VERSION"
(cd "$edir" && go mod tidy >&2 && go build -trimpath -o "$BIN/etcd.tmp" . >&2)
mv "$BIN/etcd.tmp" "$BIN/etcd"

log "built in $(( $(date +%s) - start ))s into $BIN"
echo "$BIN"
