#!/usr/bin/env bash
# Installs Debian's `chromium` package when /usr/bin/chromium is missing, then prints its path on
# stdout, so `export SPEAR_CHROMIUM=$(hack/chromium.sh)` is all a shell needs. The admin view's
# test (tests/it/cluster/admin_view.rs) drives it headless (--dump-dom, --screenshot); nothing
# else uses it. Progress goes to stderr.
#
# Debian's package rather than a downloaded browser: the machine reaches Debian's mirrors but no
# CDN, and apt verifies what it installs. It installs system-wide (apt-get needs root, or
# passwordless sudo), so it is not cached under ~/.cache/spear-mcp like the Go tools; a second run
# is a no-op. SPEAR_CHROMIUM set to an executable skips everything (another browser build).
# Cold install measured on Debian 12, 2 cores: see docs/kubernetes.md "Admin view".
set -euo pipefail

CHROMIUM="${SPEAR_CHROMIUM:-/usr/bin/chromium}"
log() { echo "chromium: $*" >&2; }

if [[ -x "$CHROMIUM" ]]; then
  log "installed at $CHROMIUM"
  echo "$CHROMIUM"
  exit 0
fi
if [[ -n "${SPEAR_CHROMIUM:-}" ]]; then
  log "SPEAR_CHROMIUM=$SPEAR_CHROMIUM is not an executable; unset it to install Debian's chromium"
  exit 1
fi

if [[ "$(id -u)" == 0 ]]; then
  SUDO=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  log "/usr/bin/chromium is missing and installing it needs root: run 'apt-get install chromium' as root"
  exit 1
fi

log "installing Debian's chromium package (apt-get; about 100 MB)"
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
# The package lists may be absent on a fresh image (Docker images ship without them).
if ! apt-cache show chromium >/dev/null 2>&1; then
  "${SUDO[@]}" apt-get update -q >&2
fi
"${SUDO[@]}" apt-get install -y -q --no-install-recommends chromium >&2
log "installed in $((SECONDS - start)) s"
if [[ ! -x /usr/bin/chromium ]]; then
  log "apt-get installed chromium but /usr/bin/chromium is not there"
  exit 1
fi
echo /usr/bin/chromium
