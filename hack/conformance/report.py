"""The conformance suite's results as one table, compared with the committed expectations.

    python3 report.py RESULTS_DIR EXPECTED_FILE LEG...

RESULTS_DIR/<leg>/ holds the suite's output for that leg: one directory per scenario
(`[server-]<scenario>-<timestamp>/checks.json`, a list of checks with a `status`). A scenario is
FAIL when a check failed, WARN when a check warned, else PASS (SKIPPED and INFO checks pass).

EXPECTED_FILE lists every scenario that does not pass, one per line:

    <leg> <scenario> <FAIL|WARN> <reason>

Exit 1 when a scenario does worse than listed (a regression), or better (the list is stale:
delete the line, so the gain is kept), or when a listed scenario did not run at all.
"""

import json
import re
import sys
from pathlib import Path

RANK = {"PASS": 0, "WARN": 1, "FAIL": 2}
# Server scenarios are saved as `server-<scenario>-<timestamp>`, client ones as `<scenario>-<timestamp>`.
SCENARIO_DIR = re.compile(r"^(?:server-)?(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


def scenario_status(checks: list[dict]) -> tuple[str, list[str]]:
    failed = [c["id"] for c in checks if c.get("status") == "FAILURE"]
    warned = [c["id"] for c in checks if c.get("status") == "WARNING"]
    if failed:
        return "FAIL", failed
    if warned:
        return "WARN", warned
    return "PASS", []


def results(leg_dir: Path) -> dict[str, tuple[str, list[str]]]:
    found = {}
    # Auth scenarios are named auth/<name>: their results are a directory further down.
    for checks_file in sorted([*leg_dir.glob("*/checks.json"), *leg_dir.glob("*/*/checks.json")]):
        match = SCENARIO_DIR.match(checks_file.parent.name)
        if not match:
            continue
        group = checks_file.parent.parent
        scenario = match["scenario"] if group == leg_dir else f"{group.name}/{match['scenario']}"
        checks = json.loads(checks_file.read_text(encoding="utf-8"))
        found[scenario] = scenario_status(checks)
    return found


def expectations(path: Path) -> dict[tuple[str, str], tuple[str, str]]:
    expected = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(maxsplit=3)
        if len(fields) < 4 or fields[2] not in ("FAIL", "WARN"):
            raise SystemExit(f"{path}:{number}: want '<leg> <scenario> <FAIL|WARN> <reason>', got {line!r}")
        expected[(fields[0], fields[1])] = (fields[2], fields[3])
    return expected


def main() -> int:
    out, expected_file, legs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    expected = expectations(expected_file)
    problems = []
    print(f"{'leg':<4} {'scenario':<52} {'result':<6} {'expected':<8} failing checks")
    for leg in legs:
        observed = results(out / leg)
        if not observed:
            problems.append(f"{leg}: no scenario results (see {out / leg}.log)")
        counts = {"PASS": 0, "WARN": 0, "FAIL": 0}
        for scenario, (status, checks) in sorted(observed.items()):
            counts[status] += 1
            want = expected.get((leg, scenario), ("PASS", ""))[0]
            mark = "" if status == want else ("  <- regression" if RANK[status] > RANK[want] else "  <- better")
            print(f"{leg:<4} {scenario:<52} {status:<6} {want:<8} {', '.join(checks)[:120]}{mark}")
            if RANK[status] > RANK[want]:
                problems.append(f"{leg} {scenario}: {status}, expected {want}")
            elif RANK[status] < RANK[want]:
                problems.append(f"{leg} {scenario}: now {status}; remove or lower its line in {expected_file}")
        for (expected_leg, scenario), (want, _) in expected.items():
            if expected_leg == leg and scenario not in observed:
                problems.append(f"{leg} {scenario}: listed as {want} but did not run")
        print(f"{leg}: {counts['PASS']} pass, {counts['WARN']} warn, {counts['FAIL']} fail")
    for problem in problems:
        print(f"conformance: {problem}", file=sys.stderr)
    if problems:
        print(f"conformance: {len(problems)} difference(s) from {expected_file}", file=sys.stderr)
        return 1
    print(f"conformance: as expected ({expected_file})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
