"""Validates CycloneDX 1.5 JSON SBOMs against the specification's schema (strict: no properties
the schema does not define), with CycloneDX's own Python library. hack/release.sh runs it in a
cached virtualenv (pinned: SBOM_LIB below is its requirement).

    python3 hack/release/sbom_validate.py FILE...
"""

import sys

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

SBOM_LIB = "cyclonedx-python-lib[json-validation]==11.12.0"


def main():
    validator = JsonStrictValidator(SchemaVersion.V1_5)
    failed = False
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            error = validator.validate_str(f.read())
        print(f"sbom_validate: {path}: {'valid CycloneDX 1.5' if error is None else error}")
        failed |= error is not None
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
