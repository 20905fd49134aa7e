#!/usr/bin/env bash
# The release recipe: what .github/workflows/release.yml runs on a version tag, and what anyone
# runs here to get and check the same artifacts without a registry or a signing identity.
#
#   hack/release.sh build   [--out DIR]                  # everything below into DIR
#   hack/release.sh dry-run [--out DIR]                  # build, then push to a loopback registry
#                                                        # (`crane registry serve`) and read it back
#   hack/release.sh push    [--out DIR] --registry REG   # push a built DIR (the workflow, logged in)
#   hack/release.sh sign    [--out DIR]                  # cosign: sign what push pushed, attach
#                                                        # the SBOMs (the workflow's OIDC identity)
#
# `build` writes (DIR defaults to $HOME/.cache/spear-mcp/release/<version>, emptied first):
#   bin/linux-{amd64,arm64}/spearlet, spear-operator   static binaries (hack/build-static.sh)
#   spear-mcp-<v>-linux-{amd64,arm64}.tar.gz           them with LICENSE, README.md, CHANGELOG.md
#   images/spearlet, images/spear-operator             OCI image layouts, each one multi-arch
#                                                      index (hack/oci-image.py, the Dockerfile)
#   sbom/<image>-<v>-linux-<arch>.cdx.json             CycloneDX: every crate linked into the
#                                                      binaries for that target + the base image's
#                                                      Debian packages (hack/release/sbom.py)
#   chart/spear-mcp-<v>.tgz                            `helm package` of charts/spear-mcp
#   release-notes.md                                   CHANGELOG.md's section of <v>
#   SHA256SUMS                                         of every file above but the layouts
# and smoke-tests both architectures' binaries: `--version`, `validate examples/registry`, and a
# `/mcp` call and a gRPC call through `spearlet serve` on the example registry; the arm64 binary
# under Debian's qemu-user (qemu-aarch64-static), the stdio servers it starts native.
#
# The version is Cargo.toml's; the chart's version and appVersion must equal it, and on a tag
# build (GITHUB_REF_TYPE=tag) so must the tag (v<version>). Image references are
# $SPEAR_RELEASE_REGISTRY/{spearlet,spear-operator}:<version> (default ghcr.io/spear-dev, what
# the chart's values name). Timestamps come from the commit (SOURCE_DATE_EPOCH), so a clean tree
# gives the same digests on every run. SPEAR_STATIC_PROFILE picks the cargo profile as in
# hack/build-static.sh (CI's dry run: `ci-static`; what is released: `release`).
#
# Signing (cosign, keyless) and provenance attestations need the workflow's OIDC identity: `sign`
# and the workflow's provenance steps run there, on the digests `push` writes to DIR/digests.txt;
# the dry run prints the cosign commands instead. docs/releasing.md says how users verify them.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

log() { echo "release: $* ($(date -u +%H:%M:%S))" >&2; }
die() { log "error: $*"; exit 1; }

command=${1:-}
[[ "$command" =~ ^(build|dry-run|push|sign)$ ]] ||
  die "usage: hack/release.sh build|dry-run|push|sign [--out DIR] [--registry REG]"
shift
out="" registry=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --registry) registry=${2:?--registry needs a registry/namespace}; shift 2 ;;
    *) die "unknown argument '$1'" ;;
  esac
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
[[ -n "$version" ]] || die "no version in Cargo.toml"
chart_version=$(sed -n 's/^version: //p' charts/spear-mcp/Chart.yaml)
app_version=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' charts/spear-mcp/Chart.yaml)
[[ "$chart_version" == "$version" && "$app_version" == "$version" ]] ||
  die "charts/spear-mcp/Chart.yaml has version $chart_version and appVersion $app_version; both must be Cargo.toml's $version"
if [[ "${GITHUB_REF_TYPE:-}" == tag && "${GITHUB_REF_NAME:-}" != "v$version" ]]; then
  die "the tag ${GITHUB_REF_NAME:-} is not v$version (Cargo.toml's version)"
fi
out=${out:-${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}/release/$version}
case "$out" in /*) ;; *) out="$repo/$out" ;; esac
image_registry=${SPEAR_RELEASE_REGISTRY:-ghcr.io/spear-dev}
revision=$(git rev-parse HEAD)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
ARCHES=(amd64 arm64)
IMAGES=(spearlet:spearlet operator:spear-operator) # Dockerfile target : image name

# cargo-cyclonedx (CycloneDX's own cargo plugin), pinned, built once into the cache.
CYCLONEDX_VERSION=0.5.9
cyclonedx_tool() {
  local root="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}/cargo-tools/cargo-cyclonedx-$CYCLONEDX_VERSION"
  if [[ ! -x "$root/bin/cargo-cyclonedx" ]]; then
    log "building cargo-cyclonedx $CYCLONEDX_VERSION (once)"
    local tmp
    tmp=$(mktemp -d)
    CARGO_TARGET_DIR="$tmp" cargo install --locked --quiet --root "$root" "cargo-cyclonedx@$CYCLONEDX_VERSION" >&2
    rm -rf "$tmp"
  fi
  echo "$root/bin/cargo-cyclonedx"
}

# The crates linked into the binaries for one target triple, as CycloneDX JSON; prints its path.
crates_sbom() {
  local tool=$1 triple=$2 dir
  dir=$(mktemp -d)
  # cargo-cyclonedx writes next to the manifest, under the name given; moved out at once.
  # --no-build-deps: build scripts' dependencies run on the build machine and are not linked in.
  "$tool" cyclonedx --manifest-path "$repo/Cargo.toml" --format json --spec-version 1.5 --target "$triple" \
    --no-build-deps --override-filename "spear-mcp-$triple" -q >&2
  mv "$repo/spear-mcp-$triple.json" "$dir/crates.cdx.json"
  echo "$dir/crates.cdx.json"
}

# A virtualenv with CycloneDX's Python library (the pin is in sbom_validate.py), cached; prints
# its python.
sbom_validator() {
  local requirement venv
  requirement=$(sed -n 's/^SBOM_LIB = "\(.*\)"$/\1/p' hack/release/sbom_validate.py)
  venv="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}/release-tools/$(echo "$requirement" | tr -c 'a-zA-Z0-9.\n' _)"
  if [[ ! -x "$venv/bin/python" ]]; then
    log "installing $requirement (PyPI, once)"
    rm -rf "$venv.tmp"
    python3 -m venv "$venv.tmp" >&2
    "$venv.tmp/bin/pip" install -q "$requirement" >&2
    mv "$venv.tmp" "$venv"
  fi
  echo "$venv/bin/python"
}

static_triple() { case $1 in amd64) echo x86_64-unknown-linux-gnu ;; arm64) echo aarch64-unknown-linux-gnu ;; esac; }

# Runs a binary of architecture $1 on this machine: natively, or under qemu-user.
runner() {
  local arch=$1
  if [[ "$arch" == amd64 && "$(uname -m)" == x86_64 ]] || [[ "$arch" == arm64 && "$(uname -m)" == aarch64 ]]; then
    return 0
  fi
  [[ "$arch" == arm64 ]] || die "cannot run $arch binaries on $(uname -m)"
  if ! command -v qemu-aarch64-static >/dev/null; then
    [[ "$(id -u)" == 0 ]] || die "the arm64 smoke needs Debian's qemu-user-static (apt-get install qemu-user-static as root)"
    log "installing Debian's qemu-user-static (apt-get)"
    apt-cache show qemu-user-static >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user-static >&2
  fi
  echo qemu-aarch64-static
}

# --version, validate, and one call through each of /mcp and gRPC of `spearlet serve`.
smoke() {
  local arch=$1 bin=$2 run port_base
  run=$(runner "$arch")
  log "smoke linux/$arch${run:+ (under $run)}"
  local expect="spearlet $version"
  local got
  got=$($run "$bin/spearlet" --version)
  [[ "$got" == "$expect"* ]] || die "linux/$arch: spearlet --version printed '$got', not '$expect...'"
  got=$($run "$bin/spear-operator" --version)
  [[ "$got" == "spear-operator $version"* ]] || die "linux/$arch: spear-operator --version printed '$got'"
  $run "$bin/spearlet" validate examples/registry >&2 || die "linux/$arch: validate examples/registry failed"
  port_base=$((20000 + RANDOM % 20000))
  local http=127.0.0.1:$port_base grpc=127.0.0.1:$((port_base + 1)) admin=127.0.0.1:$((port_base + 2))
  local logfile="$out/logs/smoke-$arch.log"
  $run "$bin/spearlet" serve --registry-dir examples/registry --profile developer \
    --http-addr "$http" --grpc-addr "$grpc" --admin-addr "$admin" >"$logfile" 2>&1 &
  local pid=$!
  # shellcheck disable=SC2064 # expand now: the pid of this run
  trap "kill $pid 2>/dev/null || true" EXIT
  local status=0
  python3 hack/release/smoke_mcp.py "http://$http/mcp" "http://$admin/readyz" >&2 || status=$?
  if [[ $status -eq 0 ]]; then
    got=$($run "$bin/spearlet" tools call everything/echo --grpc-addr "$grpc" --args '{"message": "smoke '"$arch"'"}') || status=$?
    [[ "$got" == *"smoke $arch"* ]] || { log "gRPC tools call printed '$got'"; status=1; }
  fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  trap - EXIT
  if [[ $status -ne 0 ]]; then
    tail -20 "$logfile" >&2
    die "linux/$arch: the serve smoke failed (log: $logfile)"
  fi
  log "smoke linux/$arch: OK"
}

build() {
  # Emptied first, so only a directory this script made (or an empty one) is accepted.
  if [[ -d "$out" && -n "$(ls -A "$out")" && ! -d "$out/logs" ]]; then
    die "$out is not empty and not a release directory; choose another --out"
  fi
  rm -rf "$out"
  mkdir -p "$out"/{bin,images,sbom,chart,logs}
  log "$version ($revision) into $out"
  if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
    log "warning: the work tree has changes; the artifacts are not those of $revision"
  fi

  local arch
  for arch in "${ARCHES[@]}"; do
    local built dest="$out/bin/linux-$arch"
    log "static binaries linux/$arch (hack/build-static.sh)"
    # Without SOURCE_DATE_EPOCH (set above for the packaging): the build scripts of `cc` users
    # (ring, psm) rerun when it changes, so the binaries would not reuse the builds of the tests
    # and the e2e (a cold CI run lost 3 min 20 s to that), and it changes with every commit.
    built=$(dirname "$(env -u SOURCE_DATE_EPOCH hack/build-static.sh "$arch")")
    mkdir -p "$dest"
    cp "$built/spearlet" "$built/spear-operator" "$dest/"
    python3 hack/release/elf_check.py "$arch" "$dest/spearlet" "$dest/spear-operator" >&2
  done
  for arch in "${ARCHES[@]}"; do smoke "$arch" "$out/bin/linux-$arch"; done

  log "tarballs"
  for arch in "${ARCHES[@]}"; do
    python3 hack/release/tarball.py "$out/spear-mcp-$version-linux-$arch.tar.gz" \
      "spear-mcp-$version-linux-$arch" "$out/bin/linux-$arch/spearlet" "$out/bin/linux-$arch/spear-operator" \
      LICENSE README.md CHANGELOG.md
  done

  log "images"
  local base
  base=$(hack/images.sh rootfs base)
  local labels=(
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.revision=$revision"
    --label "org.opencontainers.image.source=https://github.com/spear-dev/spear-mcp"
    --label "org.opencontainers.image.licenses=Apache-2.0"
  )
  local spec target name
  for spec in "${IMAGES[@]}"; do
    target=${spec%%:*} name=${spec#*:}
    for arch in "${ARCHES[@]}"; do
      python3 hack/oci-image.py --target "$target" --platform "linux/$arch" \
        --context base="$base" --context bin="$out/bin/linux-$arch" \
        --tag "$image_registry/$name:$version" --label "org.opencontainers.image.title=$name" "${labels[@]}" \
        --oci-layout "$out/images/$name" >/dev/null
    done
  done
  python3 hack/oci-image.py --verify "$out"/images/* >&2

  log "SBOMs"
  local cyclonedx
  cyclonedx=$(cyclonedx_tool)
  for arch in "${ARCHES[@]}"; do
    local triple crates tree
    triple=$(static_triple "$arch")
    crates=$(crates_sbom "$cyclonedx" "$triple")
    tree="$out/sbom/.tree-$arch"
    cargo tree --locked -e normal --target "$triple" --prefix none --format '{p}' >"$tree"
    for spec in "${IMAGES[@]}"; do
      name=${spec#*:}
      python3 hack/release/sbom.py --crates "$crates" --debian "$base.packages" --image "$out/images/$name" \
        --platform "linux/$arch" --name "$image_registry/$name" --version "$version" \
        --check-lock Cargo.lock --check-tree "$tree" --source-dir "$repo" --output "$out/sbom/$name-$version-linux-$arch.cdx.json" >&2
    done
    rm -rf "$(dirname "$crates")" "$tree"
  done
  "$(sbom_validator)" hack/release/sbom_validate.py "$out"/sbom/*.cdx.json >&2

  log "chart"
  hack/helm.sh -- package charts/spear-mcp --destination "$out/chart" >&2

  log "release notes"
  python3 hack/release/notes.py CHANGELOG.md "$version" >"$out/release-notes.md"

  local sums
  sums=$(cd "$out" && find . -type f ! -path './images/*' ! -path './logs/*' | LC_ALL=C sort | sed 's|^\./||' |
    xargs sha256sum)
  echo "$sums" >"$out/SHA256SUMS"
  log "built $version: $(du -sh "$out" | cut -f1) in $out"
}

# Pushes DIR's layouts and chart to $1 (registry/namespace); writes DIR/digests.txt:
# one `<ref>@<digest>` per image index, per platform manifest and for the chart.
push() {
  local to=$1 crane helm_flags=("${@:2}")
  crane=$(hack/go-tool.sh crane)
  : >"$out/digests.txt"
  local dir name digest
  for dir in "$out"/images/*; do
    name=$(basename "$dir")
    "$crane" push "${CRANE_FLAGS[@]}" "$dir" "$to/$name:$version" >&2
    local lines
    lines=$(python3 hack/release/layout_digests.py "$dir" "$to/$name")
    digest=$("$crane" digest "${CRANE_FLAGS[@]}" "$to/$name:$version")
    [[ "$to/$name@$digest" == "$(head -1 <<<"$lines")" ]] ||
      die "$to/$name:$version has digest $digest after the push, the layout $(head -1 <<<"$lines")"
    echo "$lines" >>"$out/digests.txt"
  done
  local chart="$out/chart/spear-mcp-$version.tgz"
  # Captured, then shown: `tee /dev/stderr` would reopen stderr, which truncates a log file that
  # stderr is redirected to (a CI log lost everything before this step that way).
  local pushed
  pushed=$(hack/helm.sh -- push "$chart" "oci://$to/charts" "${helm_flags[@]}" 2>&1) ||
    { echo "$pushed" >&2; die "helm push failed"; }
  echo "$pushed" >&2
  digest=$(sed -n 's/^Digest: //p' <<<"$pushed")
  [[ -n "$digest" ]] || die "helm push printed no digest"
  echo "$to/charts/spear-mcp@$digest" >>"$out/digests.txt"
  log "pushed; digests in $out/digests.txt:"
  cat "$out/digests.txt" >&2
  # The workflow's provenance steps read the index digests as step outputs.
  if [[ -n "${GITHUB_OUTPUT:-}" ]]; then
    awk 'NF == 1 { split($1, a, "@"); n = a[1]; sub(".*/", "", n); print n "-digest=" a[2] }' \
      "$out/digests.txt" >>"$GITHUB_OUTPUT"
  fi
}

# Keyless signatures (cosign, the workflow's OIDC identity) of every pushed index, platform
# manifest and the chart, and each platform's SBOM as a CycloneDX attestation on its manifest.
# With SPEAR_RELEASE_COSIGN=echo (the dry run) it prints the commands instead.
sign() {
  local cosign=${SPEAR_RELEASE_COSIGN:-cosign} ref platform name arch sbom signed=0 attested=0
  [[ -s "$out/digests.txt" ]] || die "$out/digests.txt is missing or empty (run push first)"
  while read -r ref platform; do
    $cosign sign --yes "$ref" >&2
    signed=$((signed + 1))
    [[ -n "$platform" ]] || continue
    name=${ref%@*} name=${name##*/} arch=${platform#*/}
    sbom="$out/sbom/$name-$version-linux-$arch.cdx.json"
    [[ -f "$sbom" ]] || die "no SBOM for $ref ($sbom)"
    $cosign attest --yes --type cyclonedx --predicate "$sbom" "$ref" >&2
    attested=$((attested + 1))
  done <"$out/digests.txt"
  # What users run (docs/releasing.md): each signature checks against this workflow's identity.
  local identity="${GITHUB_SERVER_URL:-https://github.com}/${GITHUB_WORKFLOW_REF:-spear-dev/spear-mcp/.github/workflows/release.yml@refs/tags/v$version}"
  while read -r ref _; do
    $cosign verify --certificate-identity "$identity" \
      --certificate-oidc-issuer https://token.actions.githubusercontent.com "$ref" >/dev/null
  done <"$out/digests.txt"
  log "signed $signed artifacts and verified their signatures, attached $attested SBOMs"
}

CRANE_FLAGS=()
case "$command" in
  build) build ;;
  push)
    [[ -n "$registry" ]] || die "push needs --registry REGISTRY/NAMESPACE (for example ghcr.io/spear-dev)"
    [[ -f "$out/SHA256SUMS" ]] || die "$out holds no build (run hack/release.sh build --out $out first)"
    push "$registry"
    ;;
  sign) sign ;;
  dry-run)
    build
    crane=$(hack/go-tool.sh crane)
    port=$((40000 + RANDOM % 20000))
    log "dry run: pushing to a loopback registry (crane registry serve on 127.0.0.1:$port)"
    "$crane" registry serve --address "127.0.0.1:$port" >"$out/logs/registry.log" 2>&1 &
    registry_pid=$!
    trap 'kill $registry_pid 2>/dev/null || true' EXIT
    for _ in $(seq 50); do
      curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break
      sleep 0.1
    done
    CRANE_FLAGS=(--insecure)
    push "127.0.0.1:$port/spear-dev" --plain-http
    # Read back what a user pulls: each platform's config names its architecture, and the chart
    # pulled from the registry is the packaged one.
    for spec in "${IMAGES[@]}"; do
      name=${spec#*:}
      for arch in "${ARCHES[@]}"; do
        got=$("$crane" config --insecure --platform "linux/$arch" "127.0.0.1:$port/spear-dev/$name:$version" |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["architecture"])')
        [[ "$got" == "$arch" ]] || die "$name:$version for linux/$arch pulled a $got config"
      done
    done
    pulled=$(mktemp -d)
    hack/helm.sh -- pull "oci://127.0.0.1:$port/spear-dev/charts/spear-mcp" --version "$version" --plain-http \
      --destination "$pulled" >&2
    cmp "$pulled/spear-mcp-$version.tgz" "$out/chart/spear-mcp-$version.tgz" || die "the pulled chart is not the packaged one"
    rm -rf "$pulled"
    SPEAR_RELEASE_COSIGN="echo cosign" sign
    log "dry run: OK (everything but signing; docs/releasing.md)"
    ;;
esac
