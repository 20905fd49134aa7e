"""A deterministic .tar.gz of release files: one top directory, entries sorted, mtime
SOURCE_DATE_EPOCH, owner 0:0 without names, modes 0755 for executables and 0644 otherwise.

    python3 hack/release/tarball.py OUT.tar.gz TOPDIR FILE...
"""

import gzip
import os
import sys
import tarfile


def main():
    out, top, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    with open(out + ".tmp", "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files, key=os.path.basename):
            info = tar.gettarinfo(path, f"{top}/{os.path.basename(path)}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)
    os.replace(out + ".tmp", out)
    print(f"tarball: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
