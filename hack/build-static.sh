#!/usr/bin/env bash
# Builds the static `spearlet` that the injected init container copies into every pod, where it
# must run in any image (distroless, Alpine, scratch-based): glibc linked in with `crt-static`
# (static-pie), as no musl target can be installed here. The same cargo invocation builds the
# static `spear-operator` next to it (the operator image's binary; see the Dockerfile), so the
# directory of the printed path holds both. Prints only the spearlet's path on stdout (tests and
# hack/images.sh read it); cargo's progress goes to stderr.
#
# `--target` keeps RUSTFLAGS away from build scripts and proc macros (host programs, dynamic as
# usual) and puts the result under target/x86_64-unknown-linux-gnu/, so this build and the
# regular one never invalidate each other's cache.
#
# glibc's warning that getaddrinfo "in statically linked applications requires at runtime the
# shared libraries from the glibc version used for linking" (hidden by rustc's allow-by-default
# `linker_messages` lint) concerns NSS sources other than `files` and `dns`, which glibc >= 2.34
# builds into the static libc too. The bridge resolves no names; see src/bridge/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-gnu
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$target"; then
  echo "error: the Rust target $target is not installed (rustup target add $target)" >&2
  exit 1
fi

# SPEAR_STATIC_PROFILE picks the cargo profile: `release` (default; what images ship) or CI's
# quicker `ci-static` (Cargo.toml says why).
profile="${SPEAR_STATIC_PROFILE:-release}"
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static" \
  cargo build --profile "$profile" --target "$target" --bin spearlet --bin spear-operator >&2

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
echo "$target_dir/$target/$profile/spearlet"
