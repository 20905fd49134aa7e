#!/usr/bin/env bash
# Builds the four images of the e2e cluster without Docker or a registry, from the Dockerfile
# (the one recipe; hack/oci-image.py interprets it), as tars for `ctr -n k8s.io images import` in
# $HOME/.cache/spear-mcp/images/ (or $SPEAR_CACHE_DIR/images/): the spearlet and operator as
# OCI image layouts, as hack/release.sh builds them for a release; the other two docker-archives.
#
#   spear.local/spearlet:e2e        target spearlet     base + the static spearlet
#   spear.local/spear-operator:e2e  target operator     base + the static spear-operator
#   spear.local/mcp-servers:e2e     target mcp-servers  base + Debian's nodejs 18 + the npm MCP servers
#   spear.local/e2e-app:e2e         target e2e-app      base + Debian's python3.11 + PyPI mcp, openai, authlib
#                                                       + e2e/app + tests/servers/oauth_server.py
#
#   eval "$(hack/images.sh)"        # exports SPEAR_E2E_*_IMAGE and SPEAR_E2E_IMAGE_TARS
#   hack/images.sh rootfs NAME      # only builds (or finds) one rootfs context, prints its directory:
#                                   # NAME is base, mcp-rootfs or app-rootfs (for docker build, see
#                                   # the Dockerfile's header)
#
# The non-binary content of the images comes from rootfs directories built here from Debian
# bookworm packages: `apt-get download` + `dpkg-deb -x`, nothing is installed on the host. apt runs
# with a private configuration and state under images/apt/ (deb.debian.org only, an empty dpkg
# status), so neither the host's other sources (nodesource's nodejs 20) nor its installed packages
# change what is picked. Each rootfs is cached under images/rootfs/<name>-<key>/, the key hashing
# its package list, the npm/PyPI pins and REVISION: a cached one is reused without any network
# access; changing a list (or REVISION, when the layout below changes) builds a new one, with the
# Debian versions current at that time (recorded in <dir>.packages). The binary images are cheap
# and rewritten every run (hack/build-static.sh, cargo's cache). Same inputs, same image IDs.
#
# Prints only `export` lines on stdout; progress goes to stderr. Needs root (chroot, to check that
# node and python run inside their rootfs as a non-root uid), npm and python3 -m pip (host tools,
# used at build time only; the images need no network at run time).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

# Pins. The npm and PyPI versions are hack/mcp-servers.sh's (the versions the Rust tests use).
EVERYTHING_VERSION="2026.8.31" # npm @modelcontextprotocol/server-everything
FILESYSTEM_VERSION="2026.8.31" # npm @modelcontextprotocol/server-filesystem
MCP_VERSION="2.3.0"            # PyPI mcp
OPENAI_VERSION="3.54.0"        # PyPI openai
AUTHLIB_VERSION="1.9.10"       # PyPI authlib (tests/servers/oauth_server.py, the e2e's identity server)
REVISION="r1"
SUITES=(bookworm bookworm-updates bookworm-security)

# The Debian packages of each rootfs, by hand: the runtime closure of what the image runs (from
# `apt-cache depends --recurse --no-recommends --no-suggests`), leaving out what only maintainer
# scripts need (dpkg, perl, debconf, tar, install-info, readline-common, ...).
# base: a distroless-equivalent base (distroless `static` holds the same: CA bundle, tzdata,
# passwd/group with nonroot 65532, /tmp 1777, os-release).
BASE_PACKAGES=(
  ca-certificates # /usr/share/ca-certificates/mozilla/*.crt, concatenated into /etc/ssl/certs/ca-certificates.crt
  tzdata          # /usr/share/zoneinfo
  base-files      # only /usr/lib/os-release (+ /etc/os-release)
)
NODE_PACKAGES=(
  nodejs libnode108                              # node 18.20.x: /usr/bin/node, libnode.so.108
  node-acorn node-cjs-module-lexer node-undici   # JS that Debian unbundled from libnode108 (it requires them)
  node-busboy node-xtend                         # node-undici's dependencies
  libc6 libgcc-s1 libstdc++6 zlib1g libssl3      # C/C++ runtime, zlib, OpenSSL 3
  libbrotli1 libc-ares2 libicu72 libnghttp2-14 libuv1 # libnode108's other libraries
)
NODE_PICK=(
  coreutils:usr/bin/env # only env: the servers' bins start with `#!/usr/bin/env node` (no shell needed)
)
PYTHON_PACKAGES=(
  python3.11-minimal libpython3.11-minimal libpython3.11-stdlib # /usr/bin/python3.11 and the stdlib
  libc6 libgcc-s1 zlib1g libssl3 libexpat1 libffi8 libcrypt1     # the interpreter's and ctypes', _ssl's
  libbz2-1.0 liblzma5 libsqlite3-0 libuuid1 libdb5.3             # bz2, lzma, sqlite3, uuid, dbm
  libncursesw6 libtinfo6 libreadline8                            # curses, readline
  libnsl2 libtirpc3 libtirpc-common libgssapi-krb5-2 libkrb5-3   # nis (libnsl2 and its chain)
  libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
  media-types # /etc/mime.types for mimetypes (httpx, starlette)
)
APP_EXTRA_PACKAGES=(
  busybox-static # /bin/busybox and /bin/sh -> busybox: a shell to debug the e2e app (this image only)
)

CACHE_ROOT="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
OUT="$CACHE_ROOT/images"
APT_DIR="$OUT/apt"
ROOTFS_DIR="$OUT/rootfs"
DOCKERFILE="$REPO/Dockerfile"
OCI="$REPO/hack/oci-image.py"
NONROOT_UID=65600 # a sidecar's uid (src/operator/inject.rs), to check the rootfs as non-root
NONROOT_GID=65532
CHROOT=$(PATH="$PATH:/usr/sbin:/sbin" command -v chroot || echo chroot)

log() { echo "images: $*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$OUT" "$ROOTFS_DIR"
# Leftovers of interrupted runs (.tmp-*.<pid>) whose run is gone.
for stale in "$ROOTFS_DIR"/.tmp-*.* "$OUT"/.tmp-*.*; do
  [[ -e "$stale" ]] || continue
  kill -0 "${stale##*.}" 2>/dev/null || rm -rf "$stale"
done

# --- apt, private -----------------------------------------------------------------------------
APT_OPTS=(
  -o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o "Dir::Etc::SourceParts=$APT_DIR/sources.list.d"
  -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$APT_DIR/preferences.d"
  -o "Dir::State=$APT_DIR/state" -o "Dir::State::status=$APT_DIR/state/status"
  -o "Dir::Cache=$APT_DIR/cache" -o "APT::Architecture=amd64" -o "APT::Architectures::=amd64"
  -o "Acquire::Languages=none" -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1"
)
APT_READY=""
apt_ready() {
  [[ -n "$APT_READY" ]] && return
  mkdir -p "$APT_DIR"/{sources.list.d,preferences.d,state/lists/partial,cache/archives/partial,debs}
  : >"$APT_DIR/state/status"
  local suite list=""
  for suite in "${SUITES[@]}"; do
    local uri=http://deb.debian.org/debian
    [[ "$suite" == *-security ]] && uri=http://deb.debian.org/debian-security
    list+="deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main"$'\n'
  done
  printf '%s' "$list" >"$APT_DIR/sources.list"
  [[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] || die "needs debian-archive-keyring"
  log "apt-get update (private lists in $APT_DIR)"
  apt-get "${APT_OPTS[@]}" -qq update >&2
  APT_READY=1
}

# Downloads the packages (into images/apt/debs, kept) and prints the .deb paths, one per line.
apt_download() {
  apt_ready
  local pkg
  (cd "$APT_DIR/debs" && apt-get "${APT_OPTS[@]}" -qq download "$@" >&2)
  for pkg in "$@"; do
    local version file
    version=$(apt-cache "${APT_OPTS[@]}" policy "$pkg" | awk '/Candidate:/ {print $2}')
    [[ -n "$version" && "$version" != "(none)" ]] || die "no candidate for $pkg"
    # apt-get download names files <pkg>_<version with : as %3a>_<arch>.deb
    file=$(ls "$APT_DIR/debs/${pkg}_${version//:/%3a}_"*.deb 2>/dev/null | head -1)
    [[ -n "$file" ]] || die "apt-get download left no .deb for $pkg $version"
    echo "$file"
  done
}

# extract_packages DIR PKG... : dpkg-deb -x every package into DIR; records "pkg version" lines.
extract_packages() {
  local dir=$1 debs deb
  shift
  debs=$(apt_download "$@")
  for deb in $debs; do
    dpkg-deb -x "$deb" "$dir"
    dpkg-deb --showformat='${Package} ${Version}\n' -W "$deb" >>"$dir.packages"
  done
}

# pick_files DIR PKG:PATH... : only PATH of PKG into DIR.
pick_files() {
  local dir=$1 spec
  shift
  for spec in "$@"; do
    local pkg=${spec%%:*} path=${spec#*:} tmp deb
    deb=$(apt_download "$pkg")
    tmp=$(mktemp -d)
    dpkg-deb -x "$deb" "$tmp"
    mkdir -p "$dir/$(dirname "$path")"
    cp -a "$tmp/$path" "$dir/$path"
    rm -rf "$tmp"
    echo "$(dpkg-deb --showformat='${Package} ${Version}' -W "$deb") (only /$path)" >>"$dir.packages"
  done
}

# Drops what no image needs, then makes everything readable by any uid: directories 0755,
# files 0755 when executable by anyone, else 0644 (no setuid/setgid anywhere).
finish_rootfs() {
  local dir=$1
  # gconv: glibc iconv modules, which neither node nor python loads.
  rm -rf "$dir"/usr/share/{doc,man,info,lintian,bug,locale,gdb} "$dir"/etc/{cron.daily,logrotate.d} \
    "$dir"/usr/lib/x86_64-linux-gnu/gconv
  find "$dir" -type d -exec chmod 0755 {} +
  find "$dir" -type f -perm /0111 -exec chmod 0755 {} +
  find "$dir" -type f ! -perm /0111 -exec chmod 0644 {} +
  if find "$dir" ! -type d ! -type f ! -type l | grep -q .; then
    die "$dir holds special files: $(find "$dir" ! -type d ! -type f ! -type l | head -3)"
  fi
}

# in_chroot DIR CMD... : runs CMD in DIR as a server sidecar's uid, with a clean environment and
# nothing mounted (node, python and busybox need neither /dev nor /proc to start), for 60 s at most.
in_chroot() {
  local dir=$1
  shift
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp TMPDIR=/tmp \
    timeout 60 "$CHROOT" --userspec="$NONROOT_UID:$NONROOT_GID" "$dir" "$@"
}

# --- the rootfs contexts ----------------------------------------------------------------------
rootfs_key() {
  local name=$1
  {
    echo "$REVISION ${SUITES[*]}"
    case "$name" in
      base) echo "${BASE_PACKAGES[*]}" ;;
      mcp-rootfs) echo "${NODE_PACKAGES[*]} ${NODE_PICK[*]} $EVERYTHING_VERSION $FILESYSTEM_VERSION" ;;
      app-rootfs) echo "${PYTHON_PACKAGES[*]} ${APP_EXTRA_PACKAGES[*]} $MCP_VERSION $OPENAI_VERSION $AUTHLIB_VERSION" ;;
    esac
  } | sha256sum | cut -c1-16
}

build_base() {
  local dir=$1 tmp
  tmp=$(mktemp -d)
  extract_packages "$tmp" ca-certificates tzdata
  mv "$tmp.packages" "$dir.packages"
  mkdir -p "$dir"/etc/ssl/certs "$dir"/usr/share "$dir"/usr/lib "$dir"/tmp
  # What update-ca-certificates would write with the default configuration (every Mozilla CA).
  (cd "$tmp/usr/share/ca-certificates" && find mozilla -name '*.crt' | LC_ALL=C sort | xargs cat) \
    >"$dir/etc/ssl/certs/ca-certificates.crt"
  cp -a "$tmp/usr/share/zoneinfo" "$dir/usr/share/zoneinfo"
  rm -rf "$tmp"
  pick_files "$dir" base-files:usr/lib/os-release
  ln -s ../usr/lib/os-release "$dir/etc/os-release"
  # distroless' users and groups (root, nobody, nonroot 65532).
  cat >"$dir/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat >"$dir/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
  printf 'hosts: files dns\n' >"$dir/etc/nsswitch.conf"
  # OpenSSL's default CA paths (Debian's `openssl` package links them so): python's ssl reads them.
  mkdir -p "$dir/usr/lib/ssl"
  ln -s /etc/ssl/certs/ca-certificates.crt "$dir/usr/lib/ssl/cert.pem"
  ln -s /etc/ssl/certs "$dir/usr/lib/ssl/certs"
  finish_rootfs "$dir"
  chmod 1777 "$dir/tmp"
  local n
  n=$(grep -c 'BEGIN CERTIFICATE' "$dir/etc/ssl/certs/ca-certificates.crt")
  ((n > 100)) || die "only $n CA certificates"
  [[ -f "$dir/usr/share/zoneinfo/Europe/Paris" ]] || die "no zoneinfo"
}

# The npm packages, installed as hack/mcp-servers.sh installs them, under /opt/mcp.
NPM_DIR=/opt/mcp
build_mcp() {
  local dir=$1 pkg
  extract_packages "$dir" "${NODE_PACKAGES[@]}"
  pick_files "$dir" "${NODE_PICK[@]}"
  log "npm: @modelcontextprotocol/server-everything@$EVERYTHING_VERSION, server-filesystem@$FILESYSTEM_VERSION"
  npm install --prefix "$dir$NPM_DIR" --no-audit --no-fund --omit=dev --loglevel=error \
    "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" \
    "@modelcontextprotocol/server-filesystem@$FILESYSTEM_VERSION" >&2
  rm -rf "$dir$NPM_DIR/node_modules/.bin" "$dir$NPM_DIR/node_modules/.package-lock.json"
  mkdir -p "$dir/usr/local/bin"
  for pkg in everything filesystem; do
    # The packages' `bin` (mcp-server-<pkg> -> dist/index.js, `#!/usr/bin/env node`).
    local bin
    bin=$(cd "$dir$NPM_DIR/node_modules/@modelcontextprotocol/server-$pkg" &&
      python3 -c "import json; print(json.load(open('package.json'))['bin']['mcp-server-$pkg'])")
    ln -s "$NPM_DIR/node_modules/@modelcontextprotocol/server-$pkg/${bin#./}" "$dir/usr/local/bin/mcp-server-$pkg"
  done
  finish_rootfs "$dir"
  check_mcp "$dir"
}

# Both servers answer initialize + tools/list over stdio, as the sidecar uid, through the
# /usr/local/bin entry points (so the shebang, env and PATH are exercised too).
check_mcp() {
  local dir=$1 version out
  version=$(in_chroot "$dir" /usr/bin/node --version) || die "node does not run in the rootfs"
  log "node in the rootfs: $version"
  [[ "$version" == v18.* ]] || die "node is $version, expected v18"
  local req='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"images.sh","version":"0"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/list"}'
  local check
  for check in "everything stdio:echo" "filesystem /opt/mcp:list_directory"; do
    local server=${check%% *} rest=${check#* } arg tool
    arg=${rest%%:*} tool=${rest#*:}
    out=$( (printf '%s\n' "$req"; sleep 4) | in_chroot "$dir" "mcp-server-$server" "$arg" 2>/dev/null || true)
    grep -q '"id":2' <<<"$out" && grep -q "\"name\":\"$tool\"" <<<"$out" ||
      die "mcp-server-$server did not answer tools/list with $tool in the rootfs: $out"
    log "mcp-server-$server answers tools/list in the rootfs ($(grep -o '"name":"[^"]*"' <<<"$out" | wc -l) names)"
  done
}

SITE=/usr/local/lib/python3.11/dist-packages # on Debian's sys.path (site.py) before /usr/lib/python3
build_app() {
  local dir=$1
  extract_packages "$dir" "${PYTHON_PACKAGES[@]}" "${APP_EXTRA_PACKAGES[@]}"
  ln -s python3.11 "$dir/usr/bin/python3"
  ln -s busybox "$dir/bin/sh"
  # Wheels only, for Debian's CPython 3.11 on glibc 2.36, whatever the host's python is (listing
  # the manylinux tags: pip 23 does not widen a `--platform` to older glibc versions by itself).
  log "pip: mcp==$MCP_VERSION openai==$OPENAI_VERSION authlib==$AUTHLIB_VERSION (wheels for CPython 3.11, manylinux <= glibc 2.36)"
  local platforms=() tag
  for tag in manylinux2014 manylinux_2_17 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35 manylinux_2_36; do
    platforms+=(--platform "${tag}_x86_64")
  done
  python3 -m pip install --quiet --disable-pip-version-check --no-input --no-compile \
    --no-warn-conflicts --root-user-action=ignore \
    --target "$dir$SITE" --only-binary=:all: --implementation cp --python-version 3.11 \
    --abi cp311 --abi abi3 --abi none "${platforms[@]}" \
    "mcp==$MCP_VERSION" "openai==$OPENAI_VERSION" "authlib==$AUTHLIB_VERSION" >&2
  rm -rf "$dir$SITE/bin" # console scripts with the host's interpreter in their shebang
  (cd "$dir$SITE" && ls -d *.dist-info | sed 's/\.dist-info$//' | LC_ALL=C sort) |
    sed 's/^/pypi /' >>"$dir.packages"
  finish_rootfs "$dir"
  # Bytecode for the stdlib and the packages (Debian compiles it in postinst), as unchecked-hash
  # pycs: valid whatever the layer mtimes (0), never rewritten (read-only root filesystem).
  log "compileall (unchecked-hash) in the rootfs"
  env -i PATH=/usr/bin:/bin "$CHROOT" "$dir" /usr/bin/python3 -m compileall -q \
    --invalidation-mode unchecked-hash /usr/lib/python3.11 "$SITE" >/dev/null || die "compileall failed"
  finish_rootfs "$dir"
  in_chroot "$dir" /usr/bin/python3 -c 'import mcp, mcp.client.streamable_http, openai, httpx2, ssl, sqlite3, json, zoneinfo; print("python", __import__("sys").version.split()[0], "mcp", __import__("importlib.metadata").metadata.version("mcp"), "openai", openai.__version__)' >&2 ||
    die "python in the rootfs cannot import mcp/openai/httpx2"
  in_chroot "$dir" /bin/sh -c 'echo busybox sh works' >&2 || die "/bin/sh does not run"
}

# rootfs NAME: prints the directory of that rootfs context, building it on a cache miss.
rootfs() {
  local name=$1 key dir tmp start
  key=$(rootfs_key "$name")
  dir="$ROOTFS_DIR/$name-$key"
  if [[ -d "$dir" ]]; then
    log "$name: cached in $dir"
    echo "$dir"
    return
  fi
  start=$(date +%s)
  tmp="$ROOTFS_DIR/.tmp-$name-$key.$$"
  rm -rf "$tmp" "$tmp.packages"
  mkdir -p "$tmp"
  log "$name: building $dir"
  apt_ready # here, not in the $(...) subshells that download
  case "$name" in
    base) build_base "$tmp" ;;
    mcp-rootfs) build_mcp "$tmp" ;;
    app-rootfs) build_app "$tmp" ;;
    *) die "no rootfs named $name (base, mcp-rootfs, app-rootfs)" ;;
  esac
  mv "$tmp.packages" "$dir.packages"
  mv -T "$tmp" "$dir"
  log "$name: built in $(($(date +%s) - start))s ($(du -sh "$dir" | cut -f1))"
  echo "$dir"
}

cleanup_tmp() { rm -rf "$ROOTFS_DIR"/.tmp-*."$$" "$ROOTFS_DIR"/.tmp-*."$$".packages; }
trap cleanup_tmp EXIT

if [[ "${1:-}" == rootfs ]]; then
  [[ $# -eq 2 ]] || die "usage: $0 rootfs base|mcp-rootfs|app-rootfs"
  rootfs "$2"
  exit 0
fi
[[ $# -eq 0 ]] || die "usage: $0 [rootfs NAME]"
[[ $(id -u) -eq 0 ]] || die "needs root (chroot checks of the rootfs)"

start=$(date +%s)
for name in base mcp-rootfs app-rootfs; do
  [[ -d "$ROOTFS_DIR/$name-$(rootfs_key "$name")" ]] || apt_ready # once, for all that are missing
done
base=$(rootfs base)
mcp=$(rootfs mcp-rootfs)
app=$(rootfs app-rootfs)
[[ -d "$REPO/e2e/app" ]] || die "e2e/app/ is missing"

log "static binaries (hack/build-static.sh)"
bin=$(dirname "$(hack/build-static.sh)")
for b in spearlet spear-operator; do
  [[ -x "$bin/$b" ]] || die "$bin/$b is missing"
  file -b "$bin/$b" | grep -q 'static' || die "$bin/$b is not statically linked: $(file -b "$bin/$b")"
done

tars=()
build_image() {
  local target=$1 tag=$2 tar="$OUT/$3.tar"
  shift 3
  log "image $tag (target $target)"
  python3 "$OCI" --file "$DOCKERFILE" --target "$target" --tag "$tag" --output "$tar" "$@" >&2
  tars+=("$tar")
}
# The two product images the way hack/release.sh builds them for a release: an OCI image layout
# (gzip layers, an index per image), here for linux/amd64 only, tarred for `ctr images import`.
layouts=()
build_layout() {
  local target=$1 tag=$2 layout="$OUT/$3.oci" tar="$OUT/$3.tar"
  shift 3
  log "image $tag (target $target, OCI layout as released)"
  rm -rf "$layout"
  python3 "$OCI" --file "$DOCKERFILE" --target "$target" --tag "$tag" --platform linux/amd64 \
    --oci-layout "$layout" --oci-archive "$tar" "$@" >&2
  layouts+=("$layout")
  tars+=("$tar")
}
build_layout operator spear.local/spear-operator:e2e spear-operator --context base="$base" --context bin="$bin"
build_layout spearlet spear.local/spearlet:e2e spearlet --context base="$base" --context bin="$bin"
build_image mcp-servers spear.local/mcp-servers:e2e mcp-servers --context base="$base" --context mcp-rootfs="$mcp"
build_image e2e-app spear.local/e2e-app:e2e e2e-app --context base="$base" --context app-rootfs="$app" \
  --context app-src="$REPO/e2e/app" --context servers-src="$REPO/tests/servers"
python3 "$OCI" --verify "${layouts[@]}" "${tars[@]:2}" >&2
for tar in "${tars[@]}"; do log "$(du -h "$tar" | cut -f1) $tar"; done
log "done in $(($(date +%s) - start))s"

echo "export SPEAR_E2E_OPERATOR_IMAGE=spear.local/spear-operator:e2e"
echo "export SPEAR_E2E_SPEARLET_IMAGE=spear.local/spearlet:e2e"
echo "export SPEAR_E2E_MCP_SERVERS_IMAGE=spear.local/mcp-servers:e2e"
echo "export SPEAR_E2E_APP_IMAGE=spear.local/e2e-app:e2e"
echo "export SPEAR_E2E_IMAGE_TARS='${tars[*]}'"
