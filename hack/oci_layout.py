"""OCI image layouts for hack/oci-image.py: multi-platform images as a registry stores them.

    hack/oci-image.py --target spearlet --platform linux/arm64 ... --oci-layout DIR --tag REF
    hack/oci-image.py --verify DIR...

A layout (https://github.com/opencontainers/image-spec/blob/main/image-layout.md) holds one
image: `index.json` names one image index (annotated with REF as `org.opencontainers.image.ref.name`
and `io.containerd.image.name`), which names one manifest per platform. Building a platform into
an existing layout replaces that platform's manifest and keeps the others, so the release recipe
builds the platforms one after the other into one directory. `crane push DIR REF` pushes it as is;
`ctr images import` reads it tarred.

Layers are gzip-compressed (what registries serve) without a name or time in the gzip header, so
the same inputs give the same digests, down to the index's. Python 3.11 standard library only.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import zlib

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"
# Go's names (GOARCH), as the OCI platform and image config use them; arm64's variant as Docker
# and containerd record it.
PLATFORMS = {
    "linux/amd64": {"os": "linux", "architecture": "amd64"},
    "linux/arm64": {"os": "linux", "architecture": "arm64", "variant": "v8"},
}


class LayoutError(Exception):
    pass


def platform(name: str) -> dict:
    if name not in PLATFORMS:
        raise LayoutError(f"--platform {name} is not supported (one of {', '.join(PLATFORMS)})")
    return dict(PLATFORMS[name])


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Layout:
    def __init__(self, root: str):
        self.root = root
        self.blobs = os.path.join(root, "blobs", "sha256")

    def blob_path(self, digest: str) -> str:
        algorithm, _, hex_digest = digest.partition(":")
        if algorithm != "sha256" or len(hex_digest) != 64 or not all(c in "0123456789abcdef" for c in hex_digest):
            raise LayoutError(f"{self.root}: unsupported digest {digest!r}")
        return os.path.join(self.blobs, hex_digest)

    def put_bytes(self, media_type: str, data: bytes, **extra) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        path = os.path.join(self.blobs, digest)
        if not os.path.exists(path):
            with open(f"{path}.tmp", "wb") as f:
                f.write(data)
            os.replace(f"{path}.tmp", path)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data), **extra}

    def put_file(self, media_type: str, path: str) -> dict:
        digest = sha256_file(path)
        size = os.path.getsize(path)
        dest = os.path.join(self.blobs, digest)
        if os.path.exists(dest):
            os.remove(path)
        else:
            os.replace(path, dest)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": size}

    def read_json(self, descriptor: dict):
        with open(self.blob_path(descriptor["digest"]), "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != descriptor["digest"].split(":", 1)[1] or len(data) != descriptor["size"]:
            raise LayoutError(f"{self.root}: blob {descriptor['digest']} does not match its descriptor")
        return json.loads(data)

    def index(self) -> dict:
        path = os.path.join(self.root, "index.json")
        if not os.path.exists(path):
            return {"schemaVersion": 2, "mediaType": INDEX, "manifests": []}
        with open(path, encoding="utf-8") as f:
            return json.load(f)


def write_tar(root: str, out: str) -> None:
    """The layout as one tar (what `ctr images import` reads): entries sorted, owner 0, mtime 0."""
    with tarfile.open(out + ".tmp", "w", format=tarfile.PAX_FORMAT) as tar:
        for directory, dirs, files in sorted(os.walk(root)):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(dirs) + sorted(f for f in files if not f.startswith(".")):
                path = os.path.join(directory, name)
                info = tar.gettarinfo(path, os.path.relpath(path, root))
                info.uid = info.gid = info.mtime = 0
                info.uname = info.gname = ""
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    os.replace(out + ".tmp", out)


def gzip_layer(tar_path: str, out_path: str) -> None:
    """Deterministic gzip: no file name, mtime 0, fixed level."""
    with open(tar_path, "rb") as src, open(out_path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
            shutil.copyfileobj(src, gz, 1 << 20)


def write_platform(root: str, ref: str, platform_name: str, config: dict, layer_tars: list[tuple[str, str]],
                   annotations: dict[str, str]) -> str:
    """Adds one platform's image to the layout at `root`, under the image index named `ref`.
    `config` is the image config without rootfs; `layer_tars` are (path, diff_id) pairs, consumed.
    Returns the platform manifest's digest."""
    plat = platform(platform_name)
    layout = Layout(root)
    os.makedirs(layout.blobs, exist_ok=True)
    with open(os.path.join(root, "oci-layout"), "w", encoding="utf-8") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    layers = []
    with tempfile.TemporaryDirectory(dir=root, prefix=".tmp-") as tmp:
        for i, (tar_path, _) in enumerate(layer_tars):
            gz = os.path.join(tmp, f"{i}.tar.gz")
            gzip_layer(tar_path, gz)
            layers.append(layout.put_file(LAYER_GZIP, gz))
    config = dict(config, **plat)
    config["rootfs"] = {"type": "layers", "diff_ids": [diff_id for _, diff_id in layer_tars]}
    config_desc = layout.put_bytes(CONFIG, _canonical(config))
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": config_desc, "layers": layers}
    if annotations:
        manifest["annotations"] = dict(annotations)
    manifest_desc = layout.put_bytes(MANIFEST, _canonical(manifest), platform=plat)

    top = layout.index()
    others = [d for d in top.get("manifests", []) if d.get("annotations", {}).get(REF_NAME) != ref]
    nested = {"schemaVersion": 2, "mediaType": INDEX, "manifests": []}
    if len(others) != len(top.get("manifests", [])):
        (current,) = [d for d in top["manifests"] if d.get("annotations", {}).get(REF_NAME) == ref]
        if current.get("mediaType") != INDEX:
            raise LayoutError(f"{root}: {ref} names a {current.get('mediaType')}, not an image index")
        nested = layout.read_json(current)
    platforms = [d for d in nested["manifests"] if d.get("platform") != plat] + [manifest_desc]
    platforms.sort(key=lambda d: (d["platform"]["os"], d["platform"]["architecture"], d["platform"].get("variant", "")))
    nested["manifests"] = platforms
    if annotations:
        nested["annotations"] = dict(annotations)
    index_desc = layout.put_bytes(INDEX, _canonical(nested), annotations={REF_NAME: ref, CONTAINERD_NAME: ref})
    top["manifests"] = others + [index_desc]
    with open(os.path.join(root, "index.json.tmp"), "wb") as f:
        f.write(_canonical(top))
    os.replace(os.path.join(root, "index.json.tmp"), os.path.join(root, "index.json"))
    return manifest_desc["digest"]


def verify(root: str) -> str:
    """Checks every blob the layout names: digests, sizes, each layer's diff_id, each config's
    platform against its descriptor, and the layer tars' hygiene. Returns a summary."""
    layout = Layout(root)
    with open(os.path.join(root, "oci-layout"), encoding="utf-8") as f:
        if json.load(f).get("imageLayoutVersion") != "1.0.0":
            raise LayoutError(f"{root}: oci-layout is not version 1.0.0")
    top = layout.index()
    lines = []
    for image in top["manifests"]:
        ref = image.get("annotations", {}).get(REF_NAME)
        if image.get("mediaType") != INDEX or not ref:
            raise LayoutError(f"{root}: index.json entry {image.get('digest')} is not a named image index")
        nested = layout.read_json(image)
        seen = []
        for desc in nested["manifests"]:
            plat = desc.get("platform") or {}
            manifest = layout.read_json(desc)
            config = layout.read_json(manifest["config"])
            for key in ("os", "architecture", "variant"):
                if config.get(key) != plat.get(key):
                    raise LayoutError(f"{root}: {ref}: the config's {key} {config.get(key)!r} is not the index's {plat.get(key)!r}")
            diff_ids = config["rootfs"]["diff_ids"]
            if len(diff_ids) != len(manifest["layers"]):
                raise LayoutError(f"{root}: {ref}: {len(manifest['layers'])} layers but {len(diff_ids)} diff_ids")
            entries = 0
            for layer, diff_id in zip(manifest["layers"], diff_ids):
                path = layout.blob_path(layer["digest"])
                if sha256_file(path) != layer["digest"].split(":", 1)[1] or os.path.getsize(path) != layer["size"]:
                    raise LayoutError(f"{root}: {ref}: layer {layer['digest']} does not match its descriptor")
                h = hashlib.sha256()
                with gzip.open(path, "rb") as gz:
                    for chunk in iter(lambda: gz.read(1 << 20), b""):
                        h.update(chunk)
                if f"sha256:{h.hexdigest()}" != diff_id:
                    raise LayoutError(f"{root}: {ref}: layer {layer['digest']} unpacks to sha256:{h.hexdigest()}, config says {diff_id}")
                try:
                    with tarfile.open(path, "r:gz") as tar:
                        names = [m.name for m in tar.getmembers()]
                except (tarfile.TarError, zlib.error, OSError) as e:
                    raise LayoutError(f"{root}: {ref}: layer {layer['digest']}: {e}") from e
                if names != sorted(names) or any(n.startswith(("/", "./")) or ".." in n.split("/") for n in names):
                    raise LayoutError(f"{root}: {ref}: layer {layer['digest']} has unsorted or unsafe entries")
                entries += len(names)
            seen.append(f"{plat['os']}/{plat['architecture']}{'/' + plat['variant'] if plat.get('variant') else ''} "
                        f"{desc['digest'][:19]} ({len(diff_ids)} layers, {entries} entries)")
        lines.append(f"{root}: OK {ref} index {image['digest'][:19]}: " + "; ".join(seen))
    if not lines:
        raise LayoutError(f"{root}: index.json names no image")
    return "\n".join(lines)
