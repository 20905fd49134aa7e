#!/usr/bin/env bash
# Builds the static `spearlet` that the injected init container copies into every pod, where it
# must run in any image (distroless, Alpine, scratch-based): glibc linked in with `crt-static`
# (static-pie), as no musl target can be installed here. The same cargo invocation builds the
# static `spear-operator` next to it (the operator image's binary; see the Dockerfile), so the
# directory of the printed path holds both. Prints only the spearlet's path on stdout (tests and
# hack/images.sh read it); cargo's progress goes to stderr.
#
#   hack/build-static.sh            # x86_64-unknown-linux-gnu
#   hack/build-static.sh aarch64    # aarch64-unknown-linux-gnu (Debian's cross gcc and libc)
#
# `--target` keeps RUSTFLAGS away from build scripts and proc macros (host programs, dynamic as
# usual) and puts the result under target/<triple>/, so this build and the regular one never
# invalidate each other's cache.
#
# aarch64 is cross-built with Debian's gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (the
# static glibc to link in, and ring's C compiler), installed by apt-get on first use like
# hack/chromium.sh; zig (cargo-zigbuild) cannot link glibc statically. The rustup target is
# added when missing. Same crates, same Cargo.lock, same profile as x86_64.
#
# glibc's warning that getaddrinfo "in statically linked applications requires at runtime the
# shared libraries from the glibc version used for linking" (hidden by rustc's allow-by-default
# `linker_messages` lint) concerns NSS sources other than `files` and `dns`, which glibc >= 2.34
# builds into the static libc too. The bridge resolves no names; see src/bridge/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

arch="${1:-x86_64}"
case "$arch" in
  x86_64 | amd64) target=x86_64-unknown-linux-gnu ;;
  aarch64 | arm64) target=aarch64-unknown-linux-gnu ;;
  *) echo "error: unknown architecture '$arch' (x86_64/amd64 or aarch64/arm64)" >&2; exit 1 ;;
esac

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$target"; then
  if [[ "$target" == x86_64-* ]]; then
    echo "error: the Rust target $target is not installed (rustup target add $target)" >&2
    exit 1
  fi
  rustup target add "$target" >&2
fi

if [[ "$target" == aarch64-* && "$(uname -m)" != aarch64 ]]; then
  if ! command -v aarch64-linux-gnu-gcc >/dev/null || [[ ! -e /usr/aarch64-linux-gnu/lib/libc.a ]]; then
    if [[ "$(id -u)" == 0 ]]; then sudo=(); elif sudo -n true 2>/dev/null; then sudo=(sudo -n); else
      echo "error: cross-building for aarch64 needs Debian's gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (apt-get install them as root)" >&2
      exit 1
    fi
    echo "build-static: installing Debian's aarch64 cross toolchain (apt-get; about 40 MB)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-cache show gcc-aarch64-linux-gnu >/dev/null 2>&1 || "${sudo[@]}" apt-get update -qq >&2
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross >&2
  fi
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
fi

# SPEAR_STATIC_PROFILE picks the cargo profile: `release` (default; what images ship) or CI's
# quicker `ci-static` (Cargo.toml says why).
profile="${SPEAR_STATIC_PROFILE:-release}"
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static" \
  cargo build --locked --profile "$profile" --target "$target" --bin spearlet --bin spear-operator >&2

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
echo "$target_dir/$target/$profile/spearlet"
