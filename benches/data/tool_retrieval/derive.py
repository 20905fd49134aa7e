#!/usr/bin/env python3
"""Derive the tool-retrieval evaluation set from the Berkeley Function Calling
Leaderboard (BFCL) data shipped in the PyPI package ``bfcl-eval``.

Writes, next to this script (or into --out):
  catalog.jsonl  one tool per line: {"server", "name", "description", "parameters"}
  queries.jsonl  one query per line: {"id", "query", "gold", "gold_equiv", "split"}
                 gold_equiv[i] lists every catalog tool with the same name and the
                 same parameter shape as gold[i] (itself included), i.e. upstream
                 re-wordings of one tool, for an optional lenient metric.

Python 3.11, standard library only. The wheel is downloaded from PyPI by exact
version and verified against a pinned sha256 (or read from --wheel PATH).
Re-running reproduces both files byte for byte.

Usage:
  python3 derive.py                      # download wheel, write files here
  python3 derive.py --wheel /path/to/bfcl_eval-2026.3.23-py3-none-any.whl
  python3 derive.py --check              # rebuild in memory, compare with files on disk
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import sys
import urllib.request
import zipfile
from collections import defaultdict

# ---- pinned upstream -------------------------------------------------------
PACKAGE = "bfcl-eval"
VERSION = "2026.3.23"
WHEEL_NAME = "bfcl_eval-2026.3.23-py3-none-any.whl"
WHEEL_URL = (
    "https://files.pythonhosted.org/packages/ba/41/"
    "ed458527c770c50225b60bae3b0c3444b26804ee455fa2d8f187018d2cb2/"
    "bfcl_eval-2026.3.23-py3-none-any.whl"
)
WHEEL_SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
DATA_DIR = "bfcl_eval/data/"

# ---- derivation parameters -------------------------------------------------
# Catalog: every function document of every BFCL "live" single-turn category
# (user-contributed tools), including the relevance/irrelevance categories,
# whose tools act as distractors only.
CATALOG_CATEGORIES = [
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_relevance",
    "live_irrelevance",
]
# Queries: the live categories that have a possible_answer (gold) file.
QUERY_CATEGORIES = [
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
]
MAX_QUERIES_PER_GOLD_SET = 5  # cap near-duplicate templated queries per identical gold set
TUNE_PERCENT = 30  # split: sha256("split:" + id) mod 100 < 30 -> tune
MAX_DESC_CHARS = 1000  # longer descriptions would be cut (none are, in this version)

TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array"}
ID_RE = re.compile(r"^(?P<cat>[a-z_]+)_(?P<idx>\d+)-(?P<group>\d+)-(?P<sub>\d+)$")


def fetch_wheel(path: str | None) -> bytes:
    if path:
        with open(path, "rb") as f:
            data = f.read()
    else:
        with urllib.request.urlopen(WHEEL_URL, timeout=180) as r:
            data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != WHEEL_SHA256:
        sys.exit(f"sha256 mismatch for {WHEEL_NAME}: got {digest}, want {WHEEL_SHA256}")
    return data


def load_jsonl(zf: zipfile.ZipFile, name: str) -> list[dict]:
    text = zf.read(DATA_DIR + name).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def trim(s: str) -> str:
    s = s.strip()
    return s if len(s) <= MAX_DESC_CHARS else s[:MAX_DESC_CHARS]


def normalize_schema(node):
    """Map BFCL's pseudo types onto JSON Schema (dict->object, float->number,
    tuple->array, any->no type); keep every other key and the key order."""
    if isinstance(node, list):
        return [normalize_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, str):
            if v == "any":
                continue
            out[k] = TYPE_MAP.get(v, v)
        elif k == "properties" and isinstance(v, dict):
            out[k] = {pk: normalize_schema(pv) for pk, pv in v.items()}
        elif k == "description" and isinstance(v, str):
            out[k] = trim(v)
        elif k in ("items", "additionalProperties"):
            out[k] = normalize_schema(v)
        else:
            out[k] = v
    return out


def tool_params(fn: dict) -> dict:
    p = normalize_schema(fn.get("parameters") or {})
    p["type"] = "object"
    p.setdefault("properties", {})
    # put "type" first for readability, keep the rest in upstream order
    return {"type": "object", **{k: v for k, v in p.items() if k != "type"}}


def schema_shape(node):
    """The schema with every schema-level "description" removed (property names,
    types, enums, defaults and required lists stay): two same-named tools with the
    same shape differ only in wording."""
    if isinstance(node, list):
        return [schema_shape(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "description":
            continue
        if k == "properties" and isinstance(v, dict):
            out[k] = {pk: schema_shape(pv) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties"):
            out[k] = schema_shape(v)
        else:
            out[k] = v
    return out


def h(salt: str, s: str) -> str:
    return hashlib.sha256(f"{salt}:{s}".encode("utf-8")).hexdigest()


def derive(wheel: bytes) -> tuple[str, str, dict]:
    zf = zipfile.ZipFile(io.BytesIO(wheel))

    # ---- catalog -----------------------------------------------------------
    catalog: list[dict] = []
    by_key: dict[tuple[str, str], str] = {}  # (name, description) -> "server/name"
    taken: set[str] = set()
    rows_by_cat: dict[str, list[dict]] = {}
    for cat in CATALOG_CATEGORIES:
        rows = load_jsonl(zf, f"BFCL_v4_{cat}.json")
        rows_by_cat[cat] = rows
        for row in rows:
            m = ID_RE.match(row["id"])
            assert m and m.group("cat") == cat, row["id"]
            for fn in row["function"]:
                name = fn["name"].strip()
                desc = trim(fn.get("description", ""))
                key = (name, desc)
                if key in by_key:
                    continue
                # server = the BFCL tool set (category + group) where the tool first
                # appears; if that group already has a different tool of the same
                # name, fall back to the question-specific set.
                server = f"{cat}_g{m.group('group')}"
                if f"{server}/{name}" in taken:
                    server = f"{cat}_q{m.group('idx')}"
                tid = f"{server}/{name}"
                assert tid not in taken, tid
                taken.add(tid)
                by_key[key] = tid
                catalog.append(
                    {
                        "server": server,
                        "name": name,
                        "description": desc,
                        "parameters": tool_params(fn),
                    }
                )

    # equivalence classes: same name + same parameter shape (wording differs only)
    shape_of = {}
    members = defaultdict(list)
    for t in catalog:
        tid = f"{t['server']}/{t['name']}"
        key = (t["name"], json.dumps(schema_shape(t["parameters"]), sort_keys=True, ensure_ascii=False))
        shape_of[tid] = key
        members[key].append(tid)

    # ---- queries -----------------------------------------------------------
    candidates = []
    seen_text: set[str] = set()
    stats = defaultdict(int)
    for cat in QUERY_CATEGORIES:
        answers = {a["id"]: a for a in load_jsonl(zf, f"possible_answer/BFCL_v4_{cat}.json")}
        for row in rows_by_cat[cat]:
            stats["upstream"] += 1
            turns = row["question"]
            if len(turns) != 1:
                stats["skip_multi_turn"] += 1
                continue
            users = [m["content"] for m in turns[0] if m["role"] == "user"]
            others = [m for m in turns[0] if m["role"] not in ("user", "system")]
            if len(users) != 1 or others:
                stats["skip_not_single_user_message"] += 1
                continue
            text = users[0].strip()
            if any(m["role"] == "system" for m in turns[0]):
                stats["system_prompt_dropped"] += 1
            if text in seen_text:
                stats["skip_duplicate_text"] += 1
                continue
            fmap = {}
            for fn in row["function"]:
                fmap.setdefault(fn["name"].strip(), by_key[(fn["name"].strip(), trim(fn.get("description", "")))])
            gold: list[str] = []
            ok = True
            for call in answers[row["id"]]["ground_truth"]:
                for fname in call:
                    tid = fmap.get(fname.strip())
                    if tid is None:
                        ok = False
                    elif tid not in gold:
                        gold.append(tid)
            if not ok or not gold:
                stats["skip_gold_not_in_function_list"] += 1
                continue
            seen_text.add(text)
            candidates.append({"id": row["id"], "query": text, "gold": gold})

    # cap the number of queries per identical gold set (deterministic by hash)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for q in candidates:
        groups[tuple(sorted(q["gold"]))].append(q)
    keep: set[str] = set()
    for qs in groups.values():
        for q in sorted(qs, key=lambda q: h("select", q["id"]))[:MAX_QUERIES_PER_GOLD_SET]:
            keep.add(q["id"])
    stats["dropped_by_cap"] = len(candidates) - len(keep)

    queries = []
    for q in candidates:
        if q["id"] not in keep:
            continue
        split = "tune" if int(h("split", q["id"])[:8], 16) % 100 < TUNE_PERCENT else "heldout"
        equiv = [sorted(members[shape_of[g]]) for g in q["gold"]]
        queries.append(
            {"id": q["id"], "query": q["query"], "gold": q["gold"], "gold_equiv": equiv, "split": split}
        )

    cat_text = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in catalog)
    q_text = "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries)
    stats["catalog"] = len(catalog)
    stats["queries"] = len(queries)
    stats["tune"] = sum(q["split"] == "tune" for q in queries)
    stats["heldout"] = sum(q["split"] == "heldout" for q in queries)
    stats["multi_gold"] = sum(len(q["gold"]) > 1 for q in queries)
    stats["queries_with_equivalent_variants"] = sum(
        any(len(e) > 1 for e in q["gold_equiv"]) for q in queries
    )
    return cat_text, q_text, dict(stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help=f"local copy of {WHEEL_NAME} (sha256 still checked)")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--check", action="store_true", help="compare with existing files instead of writing")
    args = ap.parse_args()

    cat_text, q_text, stats = derive(fetch_wheel(args.wheel))
    outputs = {"catalog.jsonl": cat_text, "queries.jsonl": q_text}
    if args.check:
        bad = []
        for fname, text in outputs.items():
            with open(os.path.join(args.out, fname), "rb") as f:
                if f.read() != text.encode("utf-8"):
                    bad.append(fname)
        if bad:
            sys.exit(f"differs from derivation: {', '.join(bad)}")
        print("ok: files match the derivation")
    else:
        for fname, text in outputs.items():
            with open(os.path.join(args.out, fname), "wb") as f:
                f.write(text.encode("utf-8"))
    print(json.dumps(stats, sort_keys=True))


if __name__ == "__main__":
    main()
