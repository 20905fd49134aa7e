"""Prints the digests of the image in an OCI layout (hack/oci_layout.py's shape), as the release's
digests.txt lists them: `REF@<index digest>`, then `REF@<manifest digest> <os>/<arch>` per platform.

    python3 hack/release/layout_digests.py LAYOUT REF
"""

import json
import os
import sys


def main():
    layout, ref = sys.argv[1], sys.argv[2]
    with open(os.path.join(layout, "index.json"), encoding="utf-8") as f:
        (image,) = json.load(f)["manifests"]
    print(f"{ref}@{image['digest']}")
    with open(os.path.join(layout, "blobs", "sha256", image["digest"].split(":", 1)[1]), encoding="utf-8") as f:
        for manifest in json.load(f)["manifests"]:
            platform = manifest["platform"]
            print(f"{ref}@{manifest['digest']} {platform['os']}/{platform['architecture']}")


if __name__ == "__main__":
    main()
