# syntax=docker/dockerfile:1
#
# The images of spear-mcp: the two product images (spearlet, operator) and the two the e2e run
# adds (mcp-servers, e2e-app). Nothing is compiled or installed here: every stage is `FROM scratch`
# plus COPYs of prepared directories (named build contexts), so two builders read this one recipe:
#
# - `docker build` (BuildKit), where there is a Docker engine (CI, release jobs, kind):
#
#     bin=$(dirname "$(hack/build-static.sh)")  # static spearlet and spear-operator (crt-static)
#     base=$(hack/images.sh rootfs base)         # passwd/group (nonroot 65532), CA bundle, tzdata, /tmp
#     docker build --build-context base="$base" --build-context bin="$bin" \
#       --target spearlet -t ghcr.io/spear-dev/spearlet:0.1.0 .
#     docker build --build-context base="$base" --build-context bin="$bin" \
#       --target operator -t ghcr.io/spear-dev/spear-operator:0.1.0 .
#     # the e2e images (see e2e/README.md):
#     docker build --build-context base="$base" --build-context mcp-rootfs="$(hack/images.sh rootfs mcp-rootfs)" \
#       --target mcp-servers -t spear.local/mcp-servers:e2e .
#     docker build --build-context base="$base" --build-context app-rootfs="$(hack/images.sh rootfs app-rootfs)" \
#       --build-context app-src=e2e/app --build-context servers-src=tests/servers --target e2e-app \
#       -t spear.local/e2e-app:e2e .
#
# - hack/oci-image.py, without Docker or a registry (the development machines): it interprets
#   this file (only the instructions used here: FROM scratch, COPY [--from --chown --chmod], USER,
#   ENTRYPOINT/CMD in exec form, ENV, WORKDIR of an existing directory, LABEL; it refuses anything
#   else) and writes docker-archive tars with deterministic layers. `hack/images.sh` does all of
#   the above that way and writes the four e2e images to $HOME/.cache/spear-mcp/images/:
#
#     eval "$(hack/images.sh)"    # SPEAR_E2E_*_IMAGE and SPEAR_E2E_IMAGE_TARS
#
#   With `--oci-layout DIR --platform linux/arm64` it adds a platform to a multi-arch OCI image
#   layout instead: hack/release.sh builds the released images that way, one `bin` context per
#   architecture (docs/releasing.md).
#
# Keep it to that subset (hack/oci-image.py fails loudly otherwise): no RUN (the images have no
# shell), no base image (nothing can be pulled on the development machines).
#
# The rootfs contexts are built by `hack/images.sh rootfs NAME` from Debian bookworm packages
# (apt-get download + dpkg-deb -x, nothing installed on the host; readable by any uid): `base` is a
# distroless `static` equivalent; `mcp-rootfs` and `app-rootfs` are listed in that script.
# `--build-context bin=DIR` replaces the `bin` stage below, so the binaries may live anywhere
# (CI sets CARGO_TARGET_DIR outside the checkout); without it they are taken from ./target.
#
# All images run as uid/gid 65532 (distroless `nonroot`), the user the webhook gives every
# injected container and the chart gives the operator; the server sidecars run the mcp-servers
# image as uids 65600+ with gid 65532, which it allows (everything is world-readable).

# --- bin: the static binaries ---------------------------------------------------------------
FROM scratch AS bin
COPY target/x86_64-unknown-linux-gnu/release/spearlet target/x86_64-unknown-linux-gnu/release/spear-operator /

# --- spearlet: the injected init container's image, and the default agent image -------------
# The image contract (src/operator/inject.rs): the static binary at /spearlet, nothing else.
# The init container runs `/spearlet install --to /spear/bin/spearlet`: the spearlet copies
# itself into an emptyDir that the agent and every server sidecar then run, so the image needs
# no `cp` and holds no shell or busybox (a process that gets into the container finds nothing
# to run but the spearlet). The base brings CA certificates and tzdata for the agent's HTTPS
# upstreams. The operator injects `install`, which older spearlets lack: build and deploy both
# images from the same version (the chart pins both to its appVersion).
FROM scratch AS spearlet
COPY --from=base / /
COPY --from=bin --chown=0:0 --chmod=0755 /spearlet /spearlet
USER 65532:65532
ENTRYPOINT ["/spearlet"]

# --- operator: spear-operator ----------------------------------------------------------------
# The chart runs it as `spear-operator run ...` (the image's entrypoint plus the chart's args).
FROM scratch AS operator
COPY --from=base / /
COPY --from=bin --chown=0:0 --chmod=0755 /spear-operator /spear-operator
USER 65532:65532
ENTRYPOINT ["/spear-operator"]

# --- mcp-servers (e2e): the npm MCP servers, for McpServer `stdio.image` ---------------------
# Debian's nodejs 18 (/usr/bin/node) and its libraries, /usr/bin/env (the bins' shebang is
# `#!/usr/bin/env node`), and under /opt/mcp the npm packages @modelcontextprotocol/server-everything
# and server-filesystem with all their dependencies: nothing is fetched at run time, no shell.
# Entry points (McpServer stdio.command and args):
#   /usr/local/bin/mcp-server-everything  stdio
#   /usr/local/bin/mcp-server-filesystem  <allowed directory>...
# The sidecar replaces the entrypoint with the bridge; CMD only serves `docker run -i`.
FROM scratch AS mcp-servers
COPY --from=base / /
COPY --from=mcp-rootfs / /
USER 65532:65532
CMD ["/usr/local/bin/mcp-server-everything", "stdio"]

# --- e2e-app (e2e): the test workload and the scripted chat upstream ---------------------------
# Debian's python3.11 (minimal + stdlib), PyPI mcp and openai (with httpx, pydantic, ...) in
# /usr/local/lib/python3.11/dist-packages, busybox's /bin/sh for debugging, and e2e/app/ at /e2e/
# with tests/servers/oauth_server.py (and PyPI authlib) and fixture_server.py. Pods run `python3 /e2e/driver.py` (the
# default), `python3 /e2e/upstream.py`, `python3 /e2e/oauth_server.py` or `python3 /e2e/fixture_server.py`.
FROM scratch AS e2e-app
COPY --from=base / /
COPY --from=app-rootfs / /
COPY --from=app-src / /e2e/
COPY --from=servers-src /oauth_server.py /e2e/oauth_server.py
COPY --from=servers-src /fixture_server.py /e2e/fixture_server.py
WORKDIR /e2e
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
CMD ["python3", "/e2e/driver.py"]
