#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each for SECONDS (default 20) on a copy of its
# committed seed corpus; fails if any target crashes, and prints each target's executions per
# second. CI runs `hack/fuzz.sh 20`; a longer hunt is `hack/fuzz.sh 600` (10 minutes a target).
#
#   hack/fuzz.sh [SECONDS] [TARGET...]     (no TARGET: every target in fuzz/fuzz_targets/)
#
# cargo-fuzz is installed once under $HOME/.cache/spear-mcp/cargo-fuzz ($SPEAR_CACHE_DIR overrides
# $HOME/.cache/spear-mcp, as for every hack/ script), the targets are built
# with nightly (AddressSanitizer and debug assertions) into $HOME/.cache/spear-mcp/fuzz-target.
# The committed corpus is only read: libFuzzer writes what it finds into a temporary directory,
# and a crash's input into fuzz/artifacts/<target>/ (fuzz/README.md: from a crash to a test).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-20}"
shift || true
CACHE="${SPEAR_CACHE_DIR:-$HOME/.cache/spear-mcp}"
CARGO_FUZZ_VERSION="0.13.2"
CARGO_FUZZ_ROOT="$CACHE/cargo-fuzz"
# Its own target dir: nightly and sanitizer builds never disturb the stable one CI uses.
export CARGO_TARGET_DIR="${SPEAR_FUZZ_TARGET_DIR:-$CACHE/fuzz-target}"
export PATH="$CARGO_FUZZ_ROOT/bin:$PATH"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz: installing the nightly toolchain (cargo fuzz needs it)" >&2
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION into $CARGO_FUZZ_ROOT" >&2
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$CARGO_FUZZ_ROOT"
fi

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

# Short runs (CI's 20 s) build unoptimized without a sanitizer: a cold release + AddressSanitizer
# build of the whole dependency tree takes about 34 minutes on 2 cores, more than 20 s of fuzzing
# per target is worth in CI (the crate has no unsafe code of its own; panics and the targets'
# assertions are what the short run catches). Long runs (over 60 s a target) build release with
# AddressSanitizer and debug assertions, for speed and depth. SPEAR_FUZZ_PROFILE=release|dev
# overrides.
profile="${SPEAR_FUZZ_PROFILE:-$([ "$SECONDS_PER_TARGET" -gt 60 ] && echo release || echo dev)}"
if [ "$profile" = dev ]; then
  build_flags=(--dev --sanitizer none)
  profile_dir=debug
else
  build_flags=(--debug-assertions)
  profile_dir=release
fi
echo "fuzz: building ${#targets[@]} targets (nightly, ${profile}: ${build_flags[*]})" >&2
build_started=$(date +%s)
if [ "$#" -gt 0 ]; then
  # `cargo fuzz build` takes one target, or none for all of them.
  for target in "${targets[@]}"; do cargo +nightly fuzz build "${build_flags[@]}" "$target" >&2; done
else
  cargo +nightly fuzz build "${build_flags[@]}" >&2
fi
echo "fuzz: built in $(( $(date +%s) - build_started )) s" >&2

triple="$(rustc +nightly -vV | sed -n 's/^host: //p')"
bin_dir="$CARGO_TARGET_DIR/$triple/$profile_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# libFuzzer runs one target on one core: targets run side by side, one per core
# (SPEAR_FUZZ_JOBS overrides), so every target still gets its SECONDS of a core and the step
# takes half the time on CI's 2 cores.
jobs="${SPEAR_FUZZ_JOBS:-$(nproc)}"
run_target() { # target: runs it, leaves its exit status in $work/$target.rc
  local target=$1 seeds="fuzz/corpus/$1" corpus="$work/corpus-$1" rc
  mkdir -p "$corpus" "fuzz/artifacts/$target"
  # The temporary corpus comes first: libFuzzer writes new inputs only into the first directory.
  set +e
  "$bin_dir/$target" "$corpus" "$seeds" \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$target/" >"$work/$target.log" 2>&1
  rc=$?
  set -e
  echo "$rc" >"$work/$target.rc"
}
echo "fuzz: ${#targets[@]} targets for ${SECONDS_PER_TARGET} s each, $jobs at a time" >&2
running=0
for target in "${targets[@]}"; do
  if (( running >= jobs )); then wait -n || true; running=$((running - 1)); fi
  echo "fuzz: $target" >&2
  run_target "$target" &
  running=$((running + 1))
done
wait

failed=()
summary=()
for target in "${targets[@]}"; do
  log="$work/$target.log"
  rc="$(cat "$work/$target.rc" 2>/dev/null || echo '?')"
  execs="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  if [ "$rc" != 0 ]; then
    failed+=("$target")
    tail -n 60 "$log" >&2
    summary+=("$(printf '%-16s FAILED (exit %s): see fuzz/artifacts/%s/' "$target" "$rc" "$target")")
  else
    summary+=("$(printf '%-16s %8s exec/s  %10s runs in %s s' "$target" "${execs:-?}" "${runs:-?}" "$SECONDS_PER_TARGET")")
  fi
done

echo "fuzz: results"
printf '  %s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (crash inputs in fuzz/artifacts/; fuzz/README.md says how to reproduce)" >&2
  exit 1
fi
