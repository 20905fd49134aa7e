# syntax=docker/dockerfile:1
#
# The two images of spear-mcp. They package the static binaries CI builds; nothing is compiled
# here. This file cannot be built on the development machines (they have no Docker engine);
# CI and release jobs build it with BuildKit:
#
#   hack/build-static.sh                       # static spearlet (crt-static, no ELF interpreter)
#   RUSTFLAGS="-C target-feature=+crt-static" \
#     cargo build --release --target x86_64-unknown-linux-gnu --bin spear-operator
#   bin=$(dirname "$(hack/build-static.sh)")   # the directory holding both binaries
#   docker build --build-context bin="$bin" --target spearlet -t ghcr.io/spear-dev/spearlet:0.1.0 .
#   docker build --build-context bin="$bin" --target operator -t ghcr.io/spear-dev/spear-operator:0.1.0 .
#
# `--build-context bin=DIR` replaces the `bin` stage below, so the binaries may live anywhere
# (CI sets CARGO_TARGET_DIR outside the checkout); without it they are taken from ./target.
#
# Both images run as uid/gid 65532 (distroless `nonroot`), the user the webhook gives every
# injected container and the chart gives the operator.

# --- bin: the static binaries ---------------------------------------------------------------
FROM scratch AS bin
COPY target/x86_64-unknown-linux-gnu/release/spearlet target/x86_64-unknown-linux-gnu/release/spear-operator /

# --- spearlet: the injected init container's image, and the default agent image -------------
# The image contract (src/operator/inject.rs): the static binary at /spearlet, nothing else.
# The init container runs `/spearlet install --to /spear/bin/spearlet`: the spearlet copies
# itself into an emptyDir that the agent and every server sidecar then run, so the image needs
# no `cp` and holds no shell or busybox (a process that gets into the container finds nothing
# to run but the spearlet). distroless `static` brings CA certificates and tzdata for the
# agent's HTTPS upstreams. The operator injects `install`, which older spearlets lack: build
# and deploy both images from the same version (the chart pins both to its appVersion).
FROM gcr.io/distroless/static-debian12:nonroot AS spearlet
COPY --from=bin --chown=0:0 --chmod=0755 /spearlet /spearlet
USER 65532:65532
ENTRYPOINT ["/spearlet"]

# --- operator: spear-operator ----------------------------------------------------------------
# The chart runs it as `spear-operator run ...` (the image's entrypoint plus the chart's args).
FROM gcr.io/distroless/static-debian12:nonroot AS operator
COPY --from=bin --chown=0:0 --chmod=0755 /spear-operator /spear-operator
USER 65532:65532
ENTRYPOINT ["/spear-operator"]
