"""One image's CycloneDX SBOM for one platform: the crates cargo-cyclonedx found linked into the
binaries for that target, plus the Debian packages the base image's files come from, described as
the container image (its platform manifest digest from the OCI layout). Checks, failing loudly:
every crate `cargo tree` resolves for the target's normal dependencies is listed with its version,
and every listed crate is in Cargo.lock (with its checksum as the component's hash).

    python3 hack/release/sbom.py --crates CDX.json --debian BASE.packages --image LAYOUT \\
        --platform linux/arm64 --name REPO --version V --check-lock Cargo.lock --check-tree TREE \\
        --source-dir REPO_DIR --output OUT.cdx.json

TREE is `cargo tree -e normal --target TRIPLE --prefix none --format '{p}'` (hack/release.sh).
Deterministic: the serial number is derived from the content, the timestamp is SOURCE_DATE_EPOCH.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import sys
import tomllib
import uuid


def layout_manifest(layout, platform):
    os_name, arch = platform.split("/")[:2]
    with open(os.path.join(layout, "index.json"), encoding="utf-8") as f:
        index_digest = json.load(f)["manifests"][0]["digest"]
    with open(os.path.join(layout, "blobs", "sha256", index_digest.split(":")[1]), encoding="utf-8") as f:
        for manifest in json.load(f)["manifests"]:
            if (manifest["platform"]["os"], manifest["platform"]["architecture"]) == (os_name, arch):
                return manifest["digest"]
    sys.exit(f"sbom: {layout} has no {platform} manifest")


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--crates", "--debian", "--image", "--platform", "--name", "--version", "--check-lock",
                 "--check-tree", "--source-dir", "--output"):
        ap.add_argument(flag, required=True)
    args = ap.parse_args()

    with open(args.crates, encoding="utf-8") as f:
        # cargo-cyclonedx names the workspace by its path on the build machine: not part of the
        # artifact, and it would make two builds of one commit differ.
        bom = json.loads(f.read().replace(f"path+file://{args.source_dir}", "path+file://."))
    with open(args.check_lock, "rb") as f:
        lock = {(p["name"], p["version"]): p.get("checksum") for p in tomllib.load(f)["package"]}

    components = []
    listed = set()
    for component in bom.get("components", []):
        key = (component["name"], component.get("version"))
        if key not in lock:
            sys.exit(f"sbom: {key[0]} {key[1]} is in the SBOM but not in Cargo.lock")
        checksum = lock[key]
        if checksum and not component.get("hashes"):
            component["hashes"] = [{"alg": "SHA-256", "content": checksum}]
        listed.add(key)
        components.append(component)

    missing = []
    with open(args.check_tree, encoding="utf-8") as f:
        for line in f:
            match = re.match(r"^(\S+) v(\S+)", line.strip())
            if not match:
                continue
            key = (match.group(1), match.group(2))
            if key not in listed and key != (bom["metadata"]["component"]["name"], bom["metadata"]["component"].get("version")):
                missing.append(f"{key[0]} {key[1]}")
    if missing:
        sys.exit(f"sbom: cargo tree resolves {len(missing)} crates the SBOM does not list: {', '.join(sorted(set(missing))[:20])}")

    root = bom["metadata"]["component"]
    root["type"] = "application"
    components.insert(0, root)

    with open(args.debian, encoding="utf-8") as f:
        for line in f:
            words = line.split()
            if len(words) < 2:
                continue
            name, version = words[0], words[1]
            components.append({
                "type": "library", "bom-ref": f"pkg:deb/debian/{name}@{version}?distro=debian-12",
                "name": name, "version": version, "purl": f"pkg:deb/debian/{name}@{version}?distro=debian-12",
                "supplier": {"name": "Debian"},
                **({"description": " ".join(words[2:]).strip("()")} if len(words) > 2 else {}),
            })

    digest = layout_manifest(args.image, args.platform)
    os_name, arch = args.platform.split("/")[:2]
    repository, _, image = args.name.rpartition("/")
    image_ref = f"pkg:oci/{image}@{digest.replace(':', '%3A')}?arch={arch}&repository_url={repository}/{image}"
    bom["metadata"]["component"] = {
        "type": "container", "bom-ref": image_ref, "name": args.name, "version": args.version,
        "purl": image_ref, "hashes": [{"alg": "SHA-256", "content": digest.split(":")[1]}],
        "properties": [{"name": "oci:platform", "value": args.platform}],
    }
    bom["metadata"]["timestamp"] = datetime.datetime.fromtimestamp(
        int(os.environ.get("SOURCE_DATE_EPOCH", "0")), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    bom["components"] = components
    deps = bom.get("dependencies", [])
    deps.append({"ref": image_ref, "dependsOn": [c["bom-ref"] for c in components if c is root or c.get("supplier", {}).get("name") == "Debian"]})
    bom["dependencies"] = deps
    bom.pop("serialNumber", None)
    content = json.dumps(bom, sort_keys=True).encode()
    bom["serialNumber"] = f"urn:uuid:{uuid.UUID(hashlib.sha256(content).hexdigest()[:32], version=5)}"
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(bom, f, indent=1, sort_keys=True)
        f.write("\n")
    crates = sum(1 for c in components if c.get("purl", "").startswith("pkg:cargo/"))
    print(f"sbom: {args.output}: {crates} crates (of {len(lock)} in Cargo.lock: the rest are dev, build or "
          f"other-platform dependencies), {len(components) - crates} other components, image {digest[:19]}")


if __name__ == "__main__":
    main()
