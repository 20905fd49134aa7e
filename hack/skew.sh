#!/usr/bin/env bash
# Builds the previous release the e2e upgrades from (e2e/previous-release names its commit): the
# commit's tree exported with `git archive` (no worktree: the clone may be a temporary one), its
# static spearlet and spear-operator built by its own hack/build-static.sh, and its two images
# built from its own Dockerfile by this tree's hack/oci-image.py, as OCI layouts tarred for
# `ctr images import`. Everything is cached under $HOME/.cache/spear-mcp/skew/<commit>-<profile>/,
# so CI builds it once per pin. Prints `export` lines on stdout; progress goes to stderr.
#
# The old tree builds in this tree's target dir, so the dependencies both lock to the same
# version compile once (a target dir of its own cost a cold CI run ~400 crates). Two things make
# that safe: the exported Cargo.toml's version gets `+previous.<commit>`, because cargo's unit hash
# of a path package does not depend on where the tree is (without it, cargo would find this tree's
# spear-mcp "fresh" and hand it back as the previous release); and both trees write the same binary
# names at the top of the profile dir, so this tree's hack/build-static.sh runs again afterwards
# (a no-op build that links its binaries back into place).
#
#   eval "$(hack/skew.sh)"   # SPEAR_E2E_PREVIOUS_{COMMIT,OPERATOR_IMAGE,SPEARLET_IMAGE,CHART,IMAGE_TARS}
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

log() { echo "skew: $*" >&2; }
die() { log "error: $*"; exit 1; }

commit=$(grep -v '^#' e2e/previous-release | tr -d '[:space:]')
[[ "$commit" =~ ^[0-9a-f]{40}$ ]] || die "e2e/previous-release must name one full commit id"
git cat-file -e "$commit^{commit}" 2>/dev/null ||
  die "commit $commit (e2e/previous-release) is not in this clone (a shallow clone? git fetch --unshallow)"

profile="${SPEAR_STATIC_PROFILE:-release}"
cache="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}/skew"
dir="$cache/$commit-$profile"
src="$dir/src"
if [[ ! -x "$dir/bin/spearlet" || ! -x "$dir/bin/spear-operator" ]]; then
  start=$SECONDS
  rm -rf "${src:?}" "${dir:?}/bin"
  mkdir -p "$src" "$dir/bin"
  # Fresh mtimes: `git archive` gives every file the commit's time, and cargo's freshness check is
  # by mtime, so a build of another pin in the same target dir could look up to date.
  git archive "$commit" | tar -x -m -C "$src"
  sed -i "0,/^version = \"\([^\"]*\)\"/s//version = \"\1+previous.${commit:0:12}\"/" "$src/Cargo.toml"
  grep -q "^version = \".*+previous.${commit:0:12}\"" "$src/Cargo.toml" ||
    die "could not mark the version in $src/Cargo.toml (its [package] version line)"
  log "building the static binaries of ${commit:0:12} ($profile; once per pin)"
  target_dir="${CARGO_TARGET_DIR:-$repo/target}"
  built=$(cd "$src" && CARGO_TARGET_DIR="$target_dir" SPEAR_STATIC_PROFILE="$profile" hack/build-static.sh)
  cp "$(dirname "$built")/spearlet" "$(dirname "$built")/spear-operator" "$dir/bin/"
  log "linking this tree's static binaries back into $(dirname "$built")"
  CARGO_TARGET_DIR="$target_dir" SPEAR_STATIC_PROFILE="$profile" hack/build-static.sh >/dev/null
  cmp -s "$dir/bin/spearlet" "$(dirname "$built")/spearlet" &&
    die "the previous release's spearlet is byte-identical to this tree's: the build did not separate them"
  python3 hack/release/elf_check.py amd64 "$dir/bin/spearlet" "$dir/bin/spear-operator" >&2
  log "built in $((SECONDS - start)) s"
fi

base=$(hack/images.sh rootfs base)
tars=()
for spec in operator:spear-operator spearlet:spearlet; do
  target=${spec%%:*} name=${spec#*:}
  layout="$dir/$name.oci" tar="$dir/$name.tar"
  if [[ ! -f "$tar" ]]; then
    rm -rf "$layout"
    python3 "$repo/hack/oci-image.py" --file "$src/Dockerfile" --target "$target" --tag "spear.local/$name:previous" \
      --platform linux/amd64 --context base="$base" --context bin="$dir/bin" --oci-layout "$layout" \
      --oci-archive "$tar" >&2
    python3 "$repo/hack/oci-image.py" --verify "$layout" >&2
  fi
  tars+=("$tar")
done
log "previous release ${commit:0:12}: $("$dir/bin/spearlet" --version)"

echo "export SPEAR_E2E_PREVIOUS_COMMIT=$commit"
echo "export SPEAR_E2E_PREVIOUS_OPERATOR_IMAGE=spear.local/spear-operator:previous"
echo "export SPEAR_E2E_PREVIOUS_SPEARLET_IMAGE=spear.local/spearlet:previous"
echo "export SPEAR_E2E_PREVIOUS_CHART=$src/charts/spear-mcp"
echo "export SPEAR_E2E_PREVIOUS_IMAGE_TARS='${tars[*]}'"
