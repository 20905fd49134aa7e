"""Prints the release notes of VERSION: its section of the changelog (`## VERSION ...` or
`## Unreleased (VERSION)`), without the heading, up to the next `## `. Fails when there is none,
so a release cannot go out without its notes.

    python3 hack/release/notes.py CHANGELOG.md VERSION
"""

import re
import sys


def main():
    path, version = sys.argv[1], sys.argv[2]
    heading = re.compile(rf"^## (\[?{re.escape(version)}\]?(\s|$)|Unreleased \({re.escape(version)}\))")
    lines, inside = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                if inside:
                    break
                inside = bool(heading.match(line))
                continue
            if inside:
                lines.append(line)
    if not inside and not lines:
        sys.exit(f"notes: {path} has no section for {version} (`## {version} - DATE`)")
    sys.stdout.write("".join(lines).strip() + "\n")


if __name__ == "__main__":
    main()
