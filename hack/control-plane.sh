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
WRAPPER_REVISION="w1"

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
# k8s.io/kubernetes pins its staging modules as v0.0.0 with ./staging replace lines, which do not
# resolve outside its own tree; our wrapper module replaces each with the published v0.X.Y.
kdir="$OUT/src/kube-apiserver"
mkdir -p "$kdir"
gomod_path=$(cd "$kdir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[[ -f "$gomod_path" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
go_directive=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod_path" | head -n1)
{
  echo "module spear.dev/testenv/kube-apiserver"
  echo
  echo "go ${go_directive:-1.24}"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod_path" \
    | awk -v v="$STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} >"$kdir/go.mod"
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
(cd "$kdir" && go mod tidy >&2 && go build -trimpath -o "$BIN/kube-apiserver.tmp" . >&2)
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
