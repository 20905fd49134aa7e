#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, from upstream parts, for end-to-end tests:
#
#   hack/cluster.sh up          build what is missing, tear down any earlier run, start everything,
#                               wait for the node to be Ready (about 10 s warm)
#   hack/cluster.sh down        stop everything and put the host back as it was (about 2.5 s)
#   hack/cluster.sh env         print `export KUBECONFIG=...` and friends: eval "$(hack/cluster.sh env)"
#   hack/cluster.sh import T... import docker-archive/OCI tars into containerd's k8s.io namespace
#                               (pods then use them with imagePullPolicy IfNotPresent/Never)
#   hack/cluster.sh selftest    snapshot host state, up, run a pod, down, compare: non-zero on any change
#   hack/cluster.sh snapshot D  write the host state `down` must restore into directory D
#   hack/cluster.sh compare B A compare two snapshots: non-zero, printing the differences, on any
#                               (hack/e2e.sh snapshots before `up` and compares after `down`)
#   hack/cluster.sh build       only build/fetch the parts into the cache
#   (SPEAR_CLUSTER_VERBOSE=1 times the steps of `down`; SPEAR_CACHE_DIR moves every cache)
#
# What it builds (cache: ${SPEAR_CACHE_DIR:-~/.cache/spear-mcp}/cluster/k8s-<version>-<rev>/):
# - kube-apiserver + etcd: hack/control-plane.sh (shared with the Rust tests).
# - kubelet, kube-controller-manager, kube-scheduler and kubectl: upstream's cmd/<name> mains in a
#   wrapper module requiring k8s.io/kubernetes with generated replace lines to the published
#   staging modules, like hack/control-plane.sh; ONE `go build ./cmd/...` so they share compiled
#   packages; CGO off; version stamped with -ldflags (else v0.0.0-master). 179 s on 2 cores with
#   the control plane's Go caches warm (cadvisor, kubectl deps etc. downloaded then), 15 s again
#   with the Go build cache warm; 445 MiB of binaries. A no-op once they are in the cache.
# - containerd 1.6.20, containerd-shim-runc-v2, ctr, runc 1.1.5, the CNI plugins 1.1.1 and nft:
#   Debian 12 packages fetched with `apt-get download` and unpacked with `dpkg-deb -x`, never
#   installed (2.5 s). They link only libc, libseccomp (runc) and, for nft, libs a stock Debian
#   has plus libnftables/libnftnl kept in the cache (nft runs through a wrapper setting
#   LD_LIBRARY_PATH). The build checks `ldd` finds everything.
# - The pause image spear.local/pause:3.10: build/pause/linux/pause.c from the k8s.io/kubernetes
#   module zip, `gcc -Os -static`, written as a docker-archive tar (0.3 s); imported at each `up`.
#
# What `up` runs (all state under $CACHE/cluster/run: PKI from openssl, etcd data, logs, pid
# files, kubeconfigs, containerd root/state/socket, kubelet root dir, CNI config and IPAM):
#   etcd 127.0.0.1:23790 -> kube-apiserver https://10.212.0.1:6443 -> kube-controller-manager,
#   kube-scheduler -> containerd -> kubelet (node spear-node, InternalIP 10.212.0.1).
# Decisions, and why:
# - Nothing leaves the host, nothing listens on its real interfaces. Pods sit on a bridge of
#   their own (spear0, 10.212.0.1/24, created before the kubelet; IPv6 off on it) via the CNI
#   bridge plugin with host-local IPAM, isGateway false, ipMasq false, and ONE route in each pod:
#   the service CIDR 10.213.0.0/24 via 10.212.0.1. No default route, no masquerading,
#   net.ipv4.ip_forward left as found (0). Only host <-> pod and pod <-> pod traffic.
# - No kube-proxy. The API server calls webhook (and aggregated API) Services at their endpoints,
#   i.e. pod IPs on the bridge (--enable-aggregator-routing=true). Pods reach the API server
#   through the `kubernetes` Service (10.213.0.1:443, what in-cluster config uses) by one DNAT
#   rule, bridge -> 10.212.0.1:6443, in an nftables table of our own (`ip spear_cluster`; the
#   host has neither iptables nor nft installed, and a table of our own is removed in one go,
#   leaving the host's own tables untouched). The destination is local: no forwarding needed.
#   Other Services have no ClusterIP routing: use pod IPs / endpoints, or hostNetwork.
# - The API server binds and advertises 10.212.0.1 (so the `kubernetes` endpoints are right); its
#   serving cert carries 10.212.0.1, 10.213.0.1, 127.0.0.1 and the kubernetes.default.svc names.
#   ServiceAccount admission is on (kube-controller-manager creates tokens, the default
#   ServiceAccount and kube-root-ca.crt); RBAC + Node authorization; NodeRestriction;
#   --allow-privileged. The API server presents a client certificate to every webhook
#   (pki/webhook-client.crt, CA pki/webhook-client-ca.crt) as the Rust test control plane does.
# - The kubelet listens on 10.212.0.1:10250 (not 127.0.0.1: a node IP cannot be loopback, and the
#   API server dials the node's InternalIP for logs/exec/port-forward; x509 client CA + webhook
#   authz). It gets no iptables on its PATH, so it creates no KUBE-* chains. cgroup v1 needs
#   failCgroupV1: false; cgroupfs driver; swap allowed; no clusterDNS (pods fall back to the
#   Default DNS policy with an empty resolv.conf); eviction and image GC thresholds at the
#   extremes (no image can be pulled again once collected). containerd 1.6 lacks the
#   RuntimeConfig RPC: the kubelet logs that once and uses cgroupDriver.
# - containerd: restrict_oom_score_adj (the VM lacks CAP_SYS_RESOURCE), disable_apparmor,
#   netns_mounts_under_state_dir, overlayfs, runc with SystemdCgroup=false and its state root
#   under the run dir, CNI bin_dir = the cache's plugins, conf_dir of our own.
# - Processes run detached (setsid), logs in run/logs, pids in run/pids. `down` only signals a
#   process that runs one of our cached binaries with the run dir on its command line.
# What the parts change on the host outside the run dir, and `down` undoes (selftest checks):
#   the kubepods cgroups (every v1 hierarchy, name=systemd, unified), the sysctls the kubelet
#   sets at start (vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1, ...; saved by
#   `up`, restored by `down`), /var/lib/kubelet/device-plugins/kubelet.sock (path hardcoded
#   upstream), /var/log/containers (hardcoded), /var/lib/cni (go-cni's result cache),
#   /run/containerd (shim sockets, hardcoded), the bridge and veths, the nftables table.
#   Host paths are removed only if `up` found them absent. The conntrack entries of pod -> API
#   server connections expire on their own. PID 1 on this VM reaps exited daemons lazily: their
#   zombies can be listed for some seconds after `down`.
# Timings on this machine (2 cores): up 10 s warm (etcd + apiserver ready 3.5 s, containerd +
# pause import 0.3 s, node Ready 5 s after kubelet start), a bridge pod Running 0.6 s after
# creation, down 2.5 s with a pod running, selftest 14 s.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# --- pinned versions and places -------------------------------------------------------------
# K8S_VERSION must match hack/control-plane.sh (the API server and etcd come from there).
# CLUSTER_REVISION changes whenever what `build` produces changes; it names the cache dir.
K8S_VERSION="${SPEAR_K8S_VERSION:-v1.36.3}"
CLUSTER_REVISION="c1"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
CACHE_ROOT="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
OUT="$CACHE_ROOT/cluster/k8s-$K8S_VERSION-$CLUSTER_REVISION"
BIN="$OUT/bin"              # kubelet, kube-controller-manager, kube-scheduler, kubectl, containerd, ctr, runc, nft
CNI_BIN="$OUT/cni"          # bridge, host-local, loopback, ... from containernetworking-plugins
LIB="$OUT/lib"              # libnftables/libnftnl for nft (the only binary needing a lib the host lacks)
PAUSE_TAR="$OUT/images/pause.tar"
PAUSE_IMAGE="spear.local/pause:3.10"
RUN="$CACHE_ROOT/cluster/run"

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }
# A command that fails under `set -e` would otherwise end the script without a word.
trap 'rc=$?; [[ $rc == 0 || $BASH_COMMAND == exit* ]] || log "failed (exit $rc): $BASH_COMMAND"' EXIT
# Runs a chatty tool (openssl) with no stdin, showing its output only when it fails.
quiet() { local out; out=$("$@" 2>&1 </dev/null) || { log "$1 failed: $out"; return 1; }; }
now_ms() { date +%s%3N; }
vlog() { [[ -z "${SPEAR_CLUSTER_VERBOSE:-}" ]] || log "$*"; }
secs_since() { local t=$(( $(now_ms) - $1 )); printf '%d.%01ds' $((t / 1000)) $(( (t % 1000) / 100 )); }

# --- build ----------------------------------------------------------------------------------

build_k8s() {
  [[ -x "$BIN/kubelet" && -x "$BIN/kube-controller-manager" && -x "$BIN/kube-scheduler" && -x "$BIN/kubectl" ]] && return 0
  command -v go >/dev/null || die "go is required to build the node components"
  local src="$OUT/src/k8s" start ldflags name
  mkdir -p "$src" "$BIN"
  start=$(now_ms)
  export GOFLAGS="${GOFLAGS:-} -mod=mod" CGO_ENABLED=0
  # shellcheck source=hack/k8s-module.sh
  source "$HERE/k8s-module.sh"
  k8s_wrapper_module "$src" spear.dev/testenv/cluster "$K8S_VERSION" || die "the wrapper module failed"
  # Upstream's mains (cmd/<name>/<name>.go in k8s.io/kubernetes), one package each: main
  # packages of another module cannot be imported, and they are a few lines.
  for name in kubelet kube-controller-manager kube-scheduler kubectl; do mkdir -p "$src/cmd/$name"; done
  cat >"$src/cmd/kubelet/main.go" <<'GO'
// Command kubelet is upstream's cmd/kubelet main.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
GO
  cat >"$src/cmd/kube-controller-manager/main.go" <<'GO'
// Command kube-controller-manager is upstream's cmd/kube-controller-manager main.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
GO
  cat >"$src/cmd/kube-scheduler/main.go" <<'GO'
// Command kube-scheduler is upstream's cmd/kube-scheduler main.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
GO
  cat >"$src/cmd/kubectl/main.go" <<'GO'
// Command kubectl is upstream's cmd/kubectl main.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
GO
  ldflags="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=$(sed -E 's/^v([0-9]+)\..*/\1/' <<<"$K8S_VERSION")"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$(sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/' <<<"$K8S_VERSION")"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  log "building kubelet, kube-controller-manager, kube-scheduler, kubectl $K8S_VERSION (one go build; minutes once)"
  mkdir -p "$OUT/bin.tmp"
  (cd "$src" && go mod tidy >&2 && go build -trimpath -ldflags "$ldflags" -o "$OUT/bin.tmp/" ./cmd/... >&2)
  for name in kubelet kube-controller-manager kube-scheduler kubectl; do mv "$OUT/bin.tmp/$name" "$BIN/$name"; done
  rmdir "$OUT/bin.tmp"
  log "built the Kubernetes node components in $(secs_since "$start")"
}

build_debs() {
  [[ -x "$BIN/containerd" && -x "$BIN/runc" && -x "$BIN/nft" && -x "$CNI_BIN/bridge" ]] && return 0
  local debs="$OUT/debs" x="$OUT/debs/x" start
  start=$(now_ms)
  rm -rf "$debs" && mkdir -p "$debs" "$BIN" "$CNI_BIN" "$LIB"
  log "downloading containerd, runc, containernetworking-plugins, nftables from Debian (not installed)"
  # nftables: the host has neither iptables nor nft; the one DNAT rule lives in a table of our own.
  local pkgs=(containerd runc containernetworking-plugins nftables libnftables1 libnftnl11)
  if ! (cd "$debs" && apt-get download "${pkgs[@]}" >&2 2>/dev/null); then
    apt-get update >&2
    (cd "$debs" && apt-get download "${pkgs[@]}" >&2)
  fi
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$x"; done
  cp "$x/usr/bin/containerd" "$x/usr/bin/containerd-shim-runc-v2" "$x/usr/bin/ctr" "$x/usr/sbin/runc" "$BIN/"
  cp "$x"/usr/lib/cni/* "$CNI_BIN/"
  cp -P "$x"/usr/lib/x86_64-linux-gnu/libnftables.so.1* "$x"/usr/lib/x86_64-linux-gnu/libnftnl.so.11* "$LIB/"
  cp "$x/usr/sbin/nft" "$LIB/nft.bin"
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$LIB" "$LIB/nft.bin" >"$BIN/nft"
  chmod +x "$BIN/nft"
  # Everything else they link (libc, libseccomp for runc; libjansson, libgmp, libmnl, libxtables,
  # libedit for nft) is on a stock Debian 12; say so loudly if not.
  local missing
  missing=$( { for f in "$BIN"/containerd* "$BIN/ctr" "$BIN/runc" "$CNI_BIN"/*; do ldd "$f" 2>/dev/null; done
               LD_LIBRARY_PATH="$LIB" ldd "$LIB/nft.bin"; } | grep 'not found' | sort -u || true)
  [[ -z "$missing" ]] || die "libraries missing on this host: $missing"
  (cd "$debs" && ls ./*.deb) >"$OUT/debs.txt"
  rm -rf "$x" "$debs"
  log "unpacked the Debian binaries in $(secs_since "$start")"
}

build_pause() {
  [[ -f "$PAUSE_TAR" ]] && return 0
  local dir="$OUT/images/pause-build" zipdir start
  start=$(now_ms)
  rm -rf "$dir" && mkdir -p "$dir/rootfs"
  zipdir=$(cd "$OUT" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [[ -f "$zipdir/build/pause/linux/pause.c" ]] || die "pause.c not found in k8s.io/kubernetes@$K8S_VERSION"
  gcc -Os -static -Wall -Werror -o "$dir/rootfs/pause" "$zipdir/build/pause/linux/pause.c"
  strip "$dir/rootfs/pause"
  # A docker-archive (what `docker save` writes): one layer, a config naming its diff_id, a
  # manifest naming the tag. Deterministic (fixed mtimes and owners).
  python3 - "$dir" "$PAUSE_IMAGE" "$PAUSE_TAR.tmp" <<'PY'
import hashlib, io, json, sys, tarfile
build, tag, out = sys.argv[1:]
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as t:
    data = open(f"{build}/rootfs/pause", "rb").read()
    info = tarfile.TarInfo("pause"); info.size = len(data); info.mode = 0o755; info.mtime = 0
    t.addfile(info, io.BytesIO(data))
layer = layer.getvalue()
diff_id = hashlib.sha256(layer).hexdigest()
config = json.dumps({
    "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
    "config": {"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"},
    "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "gcc -Os -static build/pause/linux/pause.c"}],
}, separators=(",", ":")).encode()
config_name = hashlib.sha256(config).hexdigest() + ".json"
manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]).encode()
with tarfile.open(out, mode="w", format=tarfile.USTAR_FORMAT) as t:
    for name, body in [(f"{diff_id}/layer.tar", layer), (config_name, config), ("manifest.json", manifest)]:
        info = tarfile.TarInfo(name); info.size = len(body); info.mode = 0o644; info.mtime = 0
        t.addfile(info, io.BytesIO(body))
PY
  mv "$PAUSE_TAR.tmp" "$PAUSE_TAR"
  rm -rf "$dir"
  log "built $PAUSE_IMAGE in $(secs_since "$start")"
}

build_all() {
  CP_BIN=$("$HERE/control-plane.sh")
  build_debs
  build_pause
  build_k8s
}


# --- cluster facts --------------------------------------------------------------------------
NODE_NAME="spear-node"
BRIDGE="spear0"
BRIDGE_IP="10.212.0.1"
POD_CIDR="10.212.0.0/24"
SERVICE_CIDR="10.213.0.0/24"
KUBERNETES_SVC_IP="10.213.0.1"
API_PORT=6443
API_URL="https://$BRIDGE_IP:$API_PORT"
ETCD_CLIENT_URL="http://127.0.0.1:23790"
ETCD_PEER_URL="http://127.0.0.1:23800"
NFT_TABLE="spear_cluster"
PKI="$RUN/pki"
SOCK="$RUN/containerd/containerd.sock"
# sysctls the kubelet sets at start (setupKernelTunables, no "warn" mode exists; `error` mode
# would refuse to start): saved by `up`, restored by `down`.
KUBELET_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
                 kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
# Host paths that the parts create outside --root-dir etc. whatever the flags (hardcoded
# upstream). `up` notes the ones that did not exist; `down` removes exactly those. /run/mount is
# libmount's (util-linux mount/umount, which the kubelet runs for tmpfs volumes): on a machine
# that never ran them, the first mount creates it for its utab lock.
HOST_PATHS=(/var/lib/kubelet /var/lib/cni /run/containerd /var/log/containers /var/log/pods
            /usr/libexec/kubernetes /opt/containerd /etc/cni /opt/cni /run/mount)
CP_BIN=""  # set by build_all: what hack/control-plane.sh prints
CTR=("$BIN/ctr" --address "$SOCK" -n k8s.io)

api() { # GET a path as the admin
  curl -sf --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$API_URL$1"
}

wait_for() { # what timeout-seconds command...
  local what=$1 timeout=$2 deadline; shift 2
  deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    if (( $(date +%s) >= deadline )); then log "timed out after ${timeout}s waiting for $what"; return 1; fi
    sleep 0.2
  done
}

# --- processes ------------------------------------------------------------------------------

start_proc() { # name command... ; detached (own session), logs and pid under $RUN
  local name=$1; shift
  setsid "$@" >"$RUN/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/pids/$name"
}

alive() { # pid: alive and ours: a binary from the cache, with the run dir on its command line
  local exe
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  [[ "$exe" == "$CACHE_ROOT/"* ]] || return 1
  tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$RUN/"
}

stop_proc() { # name [timeout]: SIGTERM, then SIGKILL
  local name=$1 timeout=${2:-10} pidf="$RUN/pids/$1" pid i
  [[ -f "$pidf" ]] || return 0
  pid=$(cat "$pidf")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for (( i = 0; i < timeout * 10; i++ )); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then log "$name did not stop on SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    # Exited once its exe link is gone. Its zombie may linger: PID 1 on this VM reaps slowly.
  fi
  rm -f "$pidf"
}

our_pids() { # every process whose command line names the run dir (shims included)
  local d pid
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    alive "$pid" && echo "$pid"
  done
  return 0
}

cgroup_roots() { # mount points of every cgroup hierarchy (v1 controllers, name=systemd, unified)
  awk '$0 ~ / - cgroup2? / {print $5}' /proc/self/mountinfo
}

cgroup_pids() { # processes in the pod cgroups (the kubelet's kubepods; with cgroupfs and CRI
  # every sandbox and container is below it). Not k8s.io: that is where `ctr run` puts
  # containers, which other work on this machine may run with the same binaries.
  local root
  for root in $(cgroup_roots); do
    if [[ -d "$root/kubepods" ]]; then find "$root/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null || true; fi
  done | sort -un
}

in_use() { # path: a live process has a unix socket bound or a file open below it
  awk -v p="$1/" 'index($8, p) == 1 { found = 1 } END { exit !found }' /proc/net/unix && return 0
  [[ -n "$(find /proc/[0-9]*/fd -maxdepth 1 -lname "$1/*" -print -quit 2>/dev/null)" ]]
}

kill_pods() { # SIGKILL every container process, until none is left
  local i pids
  for (( i = 0; i < 50; i++ )); do
    pids=$(cgroup_pids)
    [[ -z "$pids" ]] && return 0
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  log "container processes still alive: $pids"
}

# --- mounts, cgroups, network ---------------------------------------------------------------

mounts_under() { # mount points at or below $1, deepest first (mountinfo escapes spaces as \040)
  awk -v p="$1" '{ m = $5; gsub(/\\040/, " ", m); if (m == p || index(m, p "/") == 1) print length(m) "\t" m }' \
    /proc/self/mountinfo | sort -rn | cut -f2-
}

unmount_all() { # everything mounted under the given dirs, repeatedly (propagation, stacking)
  local dir m i
  for dir in "$@"; do
    for (( i = 0; i < 20; i++ )); do
      [[ -z "$(mounts_under "$dir")" ]] && break
      while IFS= read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
      done < <(mounts_under "$dir")
    done
  done
}

remove_cgroups() { # kubepods under every hierarchy, bottom-up; k8s.io too if `up` found none
  local root dir dirs=(kubepods)
  if [[ -f "$RUN/host-paths" ]] && grep -qx k8s.io-cgroup "$RUN/host-paths"; then dirs+=(k8s.io); fi
  for root in $(cgroup_roots); do
    for dir in "${dirs[@]/#/$root/}"; do
      [[ -d "$dir" ]] || continue
      find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
      # (rmdir only removes empty cgroups: one in use by someone else stays)
      [[ ! -d "$dir" || "$dir" == */k8s.io ]] || log "could not remove cgroup $dir"
    done
  done
  return 0
}

remove_network() {
  local link
  if [[ -x "$BIN/nft" ]]; then "$BIN/nft" delete table ip "$NFT_TABLE" 2>/dev/null || true; fi
  # The kubelet's own chains: it creates them only if an iptables binary is on its PATH, which on
  # this host there is not; removed anyway in case the host gains one.
  local ipt table chain
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for table in filter nat mangle; do
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        while "$ipt" -w -t "$table" -S 2>/dev/null | grep -- "-j $chain\b" | grep -q '^-A'; do
          rule=$("$ipt" -w -t "$table" -S | grep -- "-j $chain\b" | grep '^-A' | head -n1 | sed 's/^-A/-D/')
          eval "$ipt -w -t $table $rule" || break
        done
        "$ipt" -w -t "$table" -F "$chain" 2>/dev/null && "$ipt" -w -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
  for link in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

# --- down -----------------------------------------------------------------------------------

cluster_down() {
  local start pid
  start=$(now_ms)
  stop_proc kubelet 15
  vlog "down: kubelet stopped at $(secs_since "$start")"
  # Pods: with containerd still up, kill and delete every task so the shims unmount rootfs and
  # exit; then SIGKILL whatever is left in the pod cgroups.
  if [[ -S "$SOCK" ]] && "${CTR[@]}" version >/dev/null 2>&1; then
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
      timeout 10 "${CTR[@]}" tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
    kill_pods
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
      timeout 10 "${CTR[@]}" tasks delete -f "$t" >/dev/null 2>&1 || true
    done
  fi
  kill_pods
  vlog "down: pods killed at $(secs_since "$start")"
  stop_proc containerd 10
  stop_proc kube-scheduler
  stop_proc kube-controller-manager
  stop_proc kube-apiserver
  stop_proc etcd
  vlog "down: processes stopped at $(secs_since "$start")"
  # Anything else naming the run dir (shims, a process of a crashed run whose pid file is gone).
  for pid in $(our_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  for (( i = 0; i < 50; i++ )); do [[ -z "$(our_pids)" ]] && break; sleep 0.1; done
  kill_pods
  unmount_all "$RUN"
  # A shim killed rather than deleted leaves its socket, /run/containerd/s/sha256(<containerd
  # address>/<namespace>/<id>) (a path hardcoded in containerd 1.6): remove ours.
  local id
  for id in $(ls "$RUN/containerd/state/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null); do
    rm -f "/run/containerd/s/$(printf '%s' "$SOCK/k8s.io/$id" | sha256sum | cut -d' ' -f1)"
  done
  vlog "down: unmounted at $(secs_since "$start")"
  remove_cgroups
  remove_network
  vlog "down: cgroups and network removed at $(secs_since "$start")"
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  if [[ -f "$RUN/host-paths" ]]; then
    while IFS= read -r path; do
      [[ "$path" == /* && -e "$path" ]] || continue
      # Other work may have started using it meanwhile (e.g. another containerd's shim sockets
      # in /run/containerd): then it stays.
      if [[ -n "$(mounts_under "$path")" ]] || in_use "$path"; then log "leaving $path: in use"; continue; fi
      rm -rf --one-file-system -- "$path"
    done <"$RUN/host-paths"
  fi
  rmdir /var/lib/kubelet/device-plugins 2>/dev/null || true
  # /var/log/containers may pre-exist: remove only our symlinks there.
  find /var/log/containers -maxdepth 1 -type l -lname "$RUN/*" -delete 2>/dev/null || true
  if [[ -f "$RUN/sysctls" ]]; then
    while read -r key value; do echo "$value" >"/proc/sys/$key" 2>/dev/null || log "could not restore $key"; done <"$RUN/sysctls"
  fi
  if [[ -d "$RUN" ]]; then
    # Never rm -rf across a mount (a hostPath volume's bind mount of / would be emptied).
    [[ -z "$(mounts_under "$RUN")" ]] || die "mounts left under $RUN, not removing it: $(mounts_under "$RUN" | head -n3)"
    rm -rf --one-file-system -- "$RUN"
  fi
  log "down in $(secs_since "$start")"
}

# --- up -------------------------------------------------------------------------------------

pki_ca() { # name common-name
  quiet openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -sha256 -days 3650 \
    -keyout "$PKI/$1.key" -out "$PKI/$1.crt" -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
}

pki_cert() { # name ca subject extendedKeyUsage [subjectAltName]
  local ext="basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=$4\n"
  [[ -n "${5:-}" ]] && ext+="subjectAltName=$5\n"
  quiet openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$PKI/$1.key" \
    -out "$PKI/$1.csr" -subj "$3"
  quiet openssl x509 -req -sha256 -days 3650 -in "$PKI/$1.csr" -CA "$PKI/$2.crt" -CAkey "$PKI/$2.key" \
    -set_serial "0x$(openssl rand -hex 16)" -out "$PKI/$1.crt" -extfile <(printf "$ext")
  rm -f "$PKI/$1.csr"
}

write_pki() {
  mkdir -p "$PKI" && chmod 700 "$PKI"
  pki_ca ca spear-cluster-ca
  pki_ca front-proxy-ca spear-cluster-front-proxy-ca
  pki_ca webhook-client-ca spear-cluster-webhook-client-ca
  pki_cert apiserver ca /CN=kube-apiserver serverAuth \
    "IP:$BRIDGE_IP,IP:$KUBERNETES_SVC_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
  pki_cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  pki_cert admin ca "/O=system:masters/CN=spear-cluster-admin" clientAuth
  pki_cert kube-controller-manager ca /CN=system:kube-controller-manager clientAuth
  pki_cert kube-scheduler ca /CN=system:kube-scheduler clientAuth
  pki_cert kubelet-client ca "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  pki_cert kubelet-serving ca "/CN=$NODE_NAME" serverAuth "IP:$BRIDGE_IP,IP:127.0.0.1,DNS:$NODE_NAME,DNS:localhost"
  pki_cert front-proxy-client front-proxy-ca /CN=front-proxy-client clientAuth
  pki_cert webhook-client webhook-client-ca /CN=kube-apiserver-webhook-client clientAuth
  quiet openssl genrsa -out "$PKI/service-account.key" 2048
  quiet openssl rsa -in "$PKI/service-account.key" -pubout -out "$PKI/service-account.pub"
  # The API server's client certificate towards every webhook (user "*"), as the Rust test
  # control plane does: what `spear-operator run --webhook-client-ca-file` checks.
  cat >"$PKI/webhook-kubeconfig.yaml" <<EOF
apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: $PKI/webhook-client.crt
    client-key: $PKI/webhook-client.key
EOF
  cat >"$PKI/admission.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $PKI/webhook-kubeconfig.yaml
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $PKI/webhook-kubeconfig.yaml
EOF
}

write_kubeconfig() { # file pki-name
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: spear
  cluster:
    server: $API_URL
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: spear
  context:
    cluster: spear
    user: $2
current-context: spear
EOF
}

write_containerd_config() {
  mkdir -p "$RUN/containerd" "$RUN/cni/net.d" "$RUN/cni/networks"
  cat >"$RUN/containerd/config.toml" <<EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$RUN/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # The VM lacks CAP_SYS_RESOURCE: the sandbox's -998 oom_score_adj would be refused.
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$BIN/runc"
        Root = "$RUN/containerd/runc"
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$RUN/cni/net.d"
    max_conf_num = 1
EOF
  # Pods get an address on the bridge and ONE route, to the service CIDR via the host: no
  # default route, no masquerading, no forwarding. Only host <-> pod and pod <-> pod traffic.
  cat >"$RUN/cni/net.d/10-spear.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "spear",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$RUN/cni/networks",
        "ranges": [[{ "subnet": "$POD_CIDR", "rangeStart": "10.212.0.10", "rangeEnd": "10.212.0.250", "gateway": "$BRIDGE_IP" }]],
        "routes": [{ "dst": "$SERVICE_CIDR", "gw": "$BRIDGE_IP" }]
      }
    }
  ]
}
EOF
}

write_kubelet_config() {
  mkdir -p "$RUN/kubelet" "$RUN/pod-logs" "$RUN/volume-plugins"
  cat >"$RUN/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The API server reaches the kubelet at the node's InternalIP, the bridge address (a node IP
# cannot be loopback): logs, exec, port-forward. Nothing listens on the host's real interfaces.
address: $BRIDGE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
podLogsDir: $RUN/pod-logs
volumePluginDir: $RUN/volume-plugins
resolvConf: ""
# A build machine's disk is shared and often fuller than a node's: never evict or collect
# images (every image is imported by hand and cannot be pulled again), and never report
# DiskPressure (it taints the node and the chart's pods stay Pending; a 1% threshold still
# tripped on a 252 GB build disk with 2.2 GB free). "0%" is the kubelet's "no threshold".
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
}

save_host_state() {
  : >"$RUN/host-paths"
  for path in "${HOST_PATHS[@]}"; do [[ -e "$path" ]] || echo "$path" >>"$RUN/host-paths"; done
  [[ -e /sys/fs/cgroup/pids/k8s.io ]] || echo k8s.io-cgroup >>"$RUN/host-paths"
  : >"$RUN/sysctls"
  for key in "${KUBELET_SYSCTLS[@]}"; do echo "$key $(cat "/proc/sys/$key")" >>"$RUN/sysctls"; done
}

setup_network() {
  ip link add "$BRIDGE" type bridge
  # IPv6 off on the bridge: no router solicitations, no link-local chatter, IPv4 only.
  echo 1 >"/proc/sys/net/ipv6/conf/$BRIDGE/disable_ipv6" 2>/dev/null || true
  ip addr add "$BRIDGE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Pods reach the API server through the `kubernetes` Service's ClusterIP without kube-proxy:
  # one DNAT, in a table of our own, to the API server on the bridge address (a local address:
  # no forwarding involved).
  "$BIN/nft" -f - <<EOF
table ip $NFT_TABLE {
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    iifname "$BRIDGE" ip daddr $KUBERNETES_SVC_IP tcp dport 443 dnat to $BRIDGE_IP:$API_PORT
  }
}
EOF
}

cluster_up() {
  local start t
  start=$(now_ms)
  [[ $(id -u) == 0 ]] || die "up needs root (bridge, mounts, cgroups)"
  build_all
  cluster_down
  mkdir -p "$RUN/logs" "$RUN/pids"
  local free_kib
  free_kib=$(df -Pk "$RUN" | awk 'NR == 2 { print $4 }')
  # Images are unpacked here and etcd writes here: below this, the run fails on ENOSPC somewhere.
  (( free_kib >= 4 * 1024 * 1024 )) \
    || log "warning: $((free_kib / 1024)) MiB free under $RUN; the node needs about 4 GiB"
  save_host_state
  write_pki
  for who in admin kube-controller-manager kube-scheduler kubelet-client; do
    write_kubeconfig "$RUN/$who.kubeconfig" "$who"
  done
  mv "$RUN/admin.kubeconfig" "$RUN/kubeconfig"
  setup_network

  t=$(now_ms)
  start_proc etcd "$CP_BIN/etcd" --name=spear-cluster --data-dir="$RUN/etcd" \
    --listen-client-urls="$ETCD_CLIENT_URL" --advertise-client-urls="$ETCD_CLIENT_URL" \
    --listen-peer-urls="$ETCD_PEER_URL" --initial-advertise-peer-urls="$ETCD_PEER_URL" \
    --initial-cluster="spear-cluster=$ETCD_PEER_URL" --listen-metrics-urls="" --unsafe-no-fsync
  wait_for etcd 30 curl -sf "$ETCD_CLIENT_URL/health" || die "etcd did not start: $RUN/logs/etcd.log"

  start_proc kube-apiserver "$CP_BIN/kube-apiserver" \
    --etcd-servers="$ETCD_CLIENT_URL" \
    --bind-address="$BRIDGE_IP" --advertise-address="$BRIDGE_IP" --secure-port="$API_PORT" \
    --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --service-account-key-file="$PKI/service-account.pub" \
    --service-account-signing-key-file="$PKI/service-account.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --admission-control-config-file="$PKI/admission.yaml" \
    --allow-privileged=true \
    --enable-aggregator-routing=true \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
    --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --profiling=false
  wait_for kube-apiserver 90 bash -c "[[ \$(curl -sf --max-time 5 --cacert '$PKI/ca.crt' --cert '$PKI/admin.crt' --key '$PKI/admin.key' '$API_URL/readyz') == ok ]]" \
    || die "kube-apiserver did not get ready: $RUN/logs/kube-apiserver.log"
  log "etcd + kube-apiserver ready in $(secs_since "$t")"

  start_proc kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$RUN/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$RUN/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$RUN/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --controllers='*' \
    --service-account-private-key-file="$PKI/service-account.key" --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --profiling=false \
    --flex-volume-plugin-dir="$RUN/volume-plugins"
  start_proc kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$RUN/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$RUN/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$RUN/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false

  t=$(now_ms)
  write_containerd_config
  # The cache's bin dir first: containerd finds containerd-shim-runc-v2 there, the shim runc.
  start_proc containerd env PATH="$BIN:/usr/sbin:/usr/bin:/sbin:/bin" \
    "$BIN/containerd" --config "$RUN/containerd/config.toml"
  wait_for containerd 30 "${CTR[@]}" version || die "containerd did not start: $RUN/logs/containerd.log"
  import_images "$PAUSE_TAR" || die "importing the pause image failed"
  log "containerd up, pause image imported in $(secs_since "$t")"

  t=$(now_ms)
  write_kubelet_config
  # No iptables on the PATH: the kubelet then skips its KUBE-FIREWALL/canary chains (it logs
  # that once); nothing here needs them.
  start_proc kubelet env PATH="$BIN:/usr/sbin:/usr/bin:/sbin:/bin" "$BIN/kubelet" \
    --config="$RUN/kubelet-config.yaml" --kubeconfig="$RUN/kubelet-client.kubeconfig" \
    --root-dir="$RUN/kubelet" --cert-dir="$RUN/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$BRIDGE_IP"
  wait_for "node $NODE_NAME Ready and untainted" 90 node_ready || die "the node did not get Ready: $RUN/logs/kubelet.log"
  log "node Ready $(secs_since "$t") after the kubelet started"
  wait_for "ServiceAccount default/default" 60 api /api/v1/namespaces/default/serviceaccounts/default \
    || die "no default ServiceAccount: $RUN/logs/kube-controller-manager.log"
  wait_for "ConfigMap default/kube-root-ca.crt" 60 api /api/v1/namespaces/default/configmaps/kube-root-ca.crt \
    || die "no kube-root-ca.crt ConfigMap: $RUN/logs/kube-controller-manager.log"
  log "up in $(secs_since "$start"); use it with: eval \"\$($0 env)\""
}

node_ready() {
  api "/api/v1/nodes/$NODE_NAME" | jq -e \
    '([.status.conditions[] | select(.type == "Ready" and .status == "True")] | length == 1) and ((.spec.taints // []) | length == 0)'
}

import_images() { # docker-archive (or OCI) tars into the k8s.io namespace, unpacked for overlayfs
  local tar
  for tar in "$@"; do
    "${CTR[@]}" images import --snapshotter overlayfs "$tar" >&2 || return 1
  done
}

cluster_env() {
  cat <<EOF
export KUBECONFIG="$RUN/kubeconfig"
export SPEAR_CLUSTER_API="$API_URL"
export SPEAR_CLUSTER_NODE="$NODE_NAME"
export SPEAR_CLUSTER_KUBECTL="$BIN/kubectl"
export SPEAR_CLUSTER_CTR="$BIN/ctr --address $SOCK -n k8s.io"
export SPEAR_CLUSTER_PKI="$PKI"
export SPEAR_CLUSTER_WEBHOOK_CLIENT_CA="$PKI/webhook-client-ca.crt"
export SPEAR_CLUSTER_LOGS="$RUN/logs"
EOF
}

# --- selftest -------------------------------------------------------------------------------

snapshot() { # dir: the host state `up` + `down` must leave as found
  local out=$1 root key ipt
  mkdir -p "$out"
  # Processes: ours (the run dir on the command line, or in a pod cgroup) must be none. All
  # process names are kept for information: other work runs on this machine meanwhile, some of
  # it with the same cached binaries (e.g. a containerd of its own, `ctr run` in k8s.io).
  { for d in /proc/[0-9]*; do
      exe=$(readlink "$d/exe" 2>/dev/null) || continue
      if tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -qF -- "$RUN/" || grep -q ':/kubepods' "$d/cgroup" 2>/dev/null; then
        echo "$(cat "$d/comm" 2>/dev/null) $exe"
      fi
    done; } | grep -v "^$(basename "$0") " | sort >"$out/our-processes" || true
  ps -e -o comm= | sort -u >"$out/process-names.info"
  # Mounts without their ids (fields 1-2 change with every remount elsewhere). We never mount
  # under /tmp; other work does (another containerd's snapshots): information only.
  cut -d' ' -f3- /proc/self/mountinfo | awk '$3 !~ "^/tmp/"' | sort >"$out/mounts"
  cut -d' ' -f3- /proc/self/mountinfo | awk '$3 ~ "^/tmp/"' | sort >"$out/mounts-under-tmp.info"
  ip -o link | sed -E 's/^[0-9]+: //; s/ +/ /g' | sort >"$out/links"
  ip -o addr | sed -E 's/^[0-9]+: //; s/ +/ /g; s/valid_lft .*//' | sort >"$out/addresses"
  { ip -4 route show table all; ip -6 route show table all; } 2>/dev/null | sort >"$out/routes"
  "$BIN/nft" list ruleset 2>&1 | sed -E 's/counter packets [0-9]+ bytes [0-9]+/counter/' >"$out/nftables"
  for ipt in iptables-save ip6tables-save; do
    if command -v "$ipt" >/dev/null; then "$ipt" | grep -v '^#' | sed -E 's/\[[0-9]+:[0-9]+\]/[0:0]/'; fi
  done >"$out/iptables" 2>&1
  cat /proc/net/ip_tables_names /proc/net/ip6_tables_names 2>/dev/null | sort >"$out/legacy-xtables"
  # Cgroups: each hierarchy's top level, and any kubepods/k8s.io at any depth.
  # k8s.io (where `ctr run` puts containers; other work may run some): information only.
  for root in $(cgroup_roots); do
    find "$root" -mindepth 1 -maxdepth 1 -type d
    find "$root" -maxdepth 4 -type d \( -name kubepods -o -name k8s.io \) 2>/dev/null
  done | sort -u >"$out/cgroups.all"
  grep -v '/k8s\.io$' "$out/cgroups.all" >"$out/cgroups" || true
  grep '/k8s\.io$' "$out/cgroups.all" >"$out/cgroups-k8s.io.info" || true
  rm "$out/cgroups.all"
  for key in "${KUBELET_SYSCTLS[@]}" net/ipv4/ip_forward net/ipv6/conf/all/forwarding \
             net/ipv4/conf/all/route_localnet net/bridge/bridge-nf-call-iptables; do
    if [[ -e "/proc/sys/$key" ]]; then echo "$key $(cat "/proc/sys/$key")"; fi
  done >"$out/sysctls"
  # Paths another process uses (e.g. /run/containerd of another containerd) are noted: the
  # comparison leaves them (and what is below them) out if in use in either snapshot.
  : >"$out/known-paths-in-use.info"
  for p in "${HOST_PATHS[@]}" /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/containerd /etc/containerd; do
    if [[ -e "$p" ]]; then echo "$p"; if in_use "$p"; then echo "$p" >>"$out/known-paths-in-use.info"; fi; fi
  done >"$out/known-paths"
  if [[ -e "$RUN" ]]; then echo "$RUN" >>"$out/known-paths"; fi
  find /run /var/run /var/lib /var/log /etc /opt /usr/libexec /usr/local -xdev -maxdepth 2 2>/dev/null \
    | grep -vE '^/var/lib/(apt|dpkg)|^/var/log/apt|^/var/cache' | sort >"$out/host-paths"
}

cluster_selftest() {
  local dir before after failed=0 start t pod_uid pid name reply ip
  [[ $(id -u) == 0 ]] || die "selftest needs root"
  build_all
  cluster_down
  dir=$(mktemp -d /tmp/spear-cluster-selftest.XXXXXX)
  before="$dir/before" after="$dir/after"
  snapshot "$before"
  start=$(now_ms)
  cluster_up

  t=$(now_ms)
  api_post /api/v1/namespaces/default/pods '{
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "selftest"},
    "spec": {"terminationGracePeriodSeconds": 0,
             "containers": [{"name": "pause", "image": "'"$PAUSE_IMAGE"'", "imagePullPolicy": "IfNotPresent"}]}}' >/dev/null \
    || die "creating the test pod failed"
  wait_for "pod default/selftest Running and Ready" 60 bash -c "$(declare -f api); $(declare -p PKI API_URL); api /api/v1/namespaces/default/pods/selftest | jq -e '.status.phase == \"Running\" and ([.status.conditions[] | select(.type == \"Ready\" and .status == \"True\")] | length == 1)'" \
    || { api /api/v1/namespaces/default/pods/selftest | jq .status >&2; failed=1; }
  ip=$(api /api/v1/namespaces/default/pods/selftest | jq -r '.status.podIP // empty')
  log "test pod Running (IP ${ip:-none}) $(secs_since "$t") after its creation"
  [[ "$ip" == 10.212.0.* ]] || { log "FAIL: the pod has no address on the bridge network"; failed=1; }
  # From inside the pod's network namespace: the kubernetes Service, via the DNAT.
  pod_uid=$(api /api/v1/namespaces/default/pods/selftest | jq -r .metadata.uid)
  # (`|| true`: under pipefail, `head` closing the pipe early fails the pipeline, which would end
  # the script here without a word.)
  pid=$(find /sys/fs/cgroup/pids/kubepods -path "*pod$pod_uid*" -name cgroup.procs -exec cat {} + 2>/dev/null \
        | head -n1 || true)
  if [[ -n "$pid" ]]; then
    reply=$(nsenter --net="/proc/$pid/ns/net" curl -s --max-time 5 --cacert "$PKI/ca.crt" \
            "https://$KUBERNETES_SVC_IP:443/healthz" || true)
    log "pod netns -> https://$KUBERNETES_SVC_IP:443/healthz: ${reply:-no answer}"
    [[ "$reply" == ok ]] || { log "FAIL: the kubernetes Service is not reachable from the pod"; failed=1; }
    nsenter --net="/proc/$pid/ns/net" ip route | sed 's/^/cluster:   pod route: /' >&2
    if nsenter --net="/proc/$pid/ns/net" ip route | grep -q '^default'; then log "FAIL: the pod has a default route"; failed=1; fi
  else
    log "FAIL: no process of the test pod found in its cgroup"; failed=1
  fi

  cluster_down
  snapshot "$after"
  compare_snapshots "$before" "$after" "$dir" || failed=1
  if (( failed )); then log "selftest FAILED (snapshots in $dir)"; exit 1; fi
  rm -rf "$dir"
  log "selftest passed in $(secs_since "$start"): the host is as it was"
}

compare_snapshots() { # before after workdir: 0 when the host is as it was (prints what differs)
  local before=$1 after=$2 dir=$3 failed=0 snap name
  cat "$before/known-paths-in-use.info" "$after/known-paths-in-use.info" | sort -u >"$dir/in-use"
  for snap in "$before" "$after"; do
    for name in host-paths known-paths; do
      awk -v used="$dir/in-use" 'BEGIN { while ((getline u < used) > 0) if (u != "") skip[u] = 1 }
        { for (u in skip) if ($0 == u || index($0, u "/") == 1) next; print }' "$snap/$name" >"$snap/$name.own"
    done
  done
  for name in our-processes mounts links addresses routes nftables iptables legacy-xtables cgroups sysctls \
              host-paths.own known-paths.own; do
    if ! diff -u "$before/$name" "$after/$name" >"$dir/$name.diff"; then
      log "FAIL: $name differs after up + down:"; cat "$dir/$name.diff" >&2; failed=1
    fi
  done
  for name in process-names mounts-under-tmp cgroups-k8s.io known-paths-in-use; do
    if ! diff -u "$before/$name.info" "$after/$name.info" >"$dir/$name.diff"; then
      log "(information only: other work runs here too) $name changed: $(grep -E '^[-+][^-+]' "$dir/$name.diff" | tr '\n' ' ')"
    fi
  done
  return "$failed"
}

api_post() { # path json: POST as the admin
  curl -sf --max-time 10 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    -H 'Content-Type: application/json' -X POST --data "$2" "$API_URL$1"
}

# --- main ---------------------------------------------------------------------------------

case "${1:-}" in
  build) build_all; echo "$BIN" ;;
  up) cluster_up ;;
  down) cluster_down ;;
  env) cluster_env ;;
  import)
    shift
    (( $# > 0 )) || die "usage: $0 import TAR..."
    "${CTR[@]}" version >/dev/null 2>&1 || die "containerd is not running: $0 up first"
    import_images "$@"
    ;;
  selftest) cluster_selftest ;;
  snapshot) (( $# == 2 )) || die "usage: $0 snapshot DIR"; snapshot "$2" ;;
  compare)
    (( $# == 3 )) || die "usage: $0 compare BEFORE AFTER"
    if compare_snapshots "$2" "$3" "$(dirname "$3")"; then log "the host is as it was"; else exit 1; fi
    ;;
  *) die "usage: $0 up|down|env|import TAR...|selftest|snapshot DIR|compare BEFORE AFTER|build" ;;
esac
