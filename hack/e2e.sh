#!/usr/bin/env bash
# The e2e run in real pods on this machine: builds the images (hack/images.sh) and those of the
# previous release (hack/skew.sh), brings up the local one-node cluster (hack/cluster.sh), imports
# the images into its containerd, runs `cargo test --test e2e` (installs the previous release's
# chart, starts a pod under it, upgrades to this tree's chart, then e2e/main.rs) and takes the
# cluster down again, whatever the outcome.
#
#   hack/e2e.sh                          # what CI runs
#   SPEAR_E2E_KEEP=1 hack/e2e.sh         # keep the cluster, the release and the test namespaces
#   SPEAR_E2E_MEASURE=1 hack/e2e.sh      # plus the figures of BENCHMARKS.md "e2e in real pods"
#
# With SPEAR_E2E_KEEP=1 the cluster stays up: `eval "$(hack/cluster.sh env)"` gives a shell its
# KUBECONFIG (and kubectl); `hack/cluster.sh down` removes it. Needs root (containerd, kubelet,
# a bridge and one iptables rule; see hack/cluster.sh). On kind instead: e2e/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "e2e.sh: $* ($(date -u +%H:%M:%S))" >&2; }
start=$(date +%s)

# Everything that compiles comes first, so the cluster is up only while the test runs.
step "images (hack/images.sh)"
eval "$(hack/images.sh || echo exit 1)"
step "the previous release, for the upgrade check (hack/skew.sh)"
eval "$(hack/skew.sh || echo exit 1)"
step "helm (hack/helm.sh)"
SPEAR_HELM="$(hack/helm.sh)"
export SPEAR_HELM
step "the e2e test binary"
cargo test --test e2e --no-run
step "cluster parts (hack/cluster.sh build)"
hack/cluster.sh build >/dev/null
# The host's state before `up`: after `down` it must be the same (processes, mounts, links,
# addresses, routes, nftables/iptables, cgroups, sysctls, host paths; hack/cluster.sh snapshot).
host_state=$(mktemp -d /tmp/spear-e2e-host.XXXXXX)
hack/cluster.sh snapshot "$host_state/before"

down() {
  status=$?
  if [[ "${SPEAR_E2E_KEEP:-}" == 1 ]]; then
    step "SPEAR_E2E_KEEP=1: the cluster stays up (hack/cluster.sh down removes it)"
  else
    step "cluster down"
    hack/cluster.sh down || status=1
    hack/cluster.sh snapshot "$host_state/after"
    if hack/cluster.sh compare "$host_state/before" "$host_state/after"; then
      rm -rf "$host_state"
    else
      step "the host is not as it was before the run (snapshots in $host_state)"
      status=1
    fi
  fi
  step "finished in $(( $(date +%s) - start )) s, exit $status"
  exit "$status"
}
trap down EXIT

step "cluster up (hack/cluster.sh)"
hack/cluster.sh up
eval "$(hack/cluster.sh env)"
step "import images"
# shellcheck disable=SC2086 # a space-separated list of paths without spaces
hack/cluster.sh import $SPEAR_E2E_IMAGE_TARS $SPEAR_E2E_PREVIOUS_IMAGE_TARS
step "e2e (cargo test --test e2e)"
cargo test --test e2e
