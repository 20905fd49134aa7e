"""The name adapter: the conformance suite's server scenarios, with the fixture's names namespaced.

The suite calls its fixture's tools and prompts by their plain names (`test_simple_text`) and
reads resources by their plain URIs (`test://static-text`). Behind spearlet every name is
namespaced by the McpServer that serves it (`mcp__conf__test_simple_text`,
`spear://conf/test://static-text`), by design. This script writes a copy of the suite's bundle
(`dist/index.js` -> `dist/index.adapted.js`, next to it so its imports resolve) in which those
literals, where the scenario code sends or expects them, carry the namespaced form. Nothing
else in the suite changes; the suite then sends the adapted names in bodies and in `Mcp-Name`
headers alike, so no answer needs rewriting.

    python3 adapt.py PACKAGE_DIR VERSION

A literal is rewritten only as a whole backquoted string (not inside a scenario's escaped
description text) right after one of CODE_CONTEXTS (a call's `{name:`, a read's `{uri:`,
`.includes(`, ...); the suite's own test servers for the client scenarios (their tool lists
`tools:[{name:`) keep their names. How often each literal is rewritten is pinned per suite
version in EXPECTED: a different count aborts, so a new suite version needs a deliberate look
at this table rather than a silent partial mapping.
"""

import re
import sys
from pathlib import Path

SERVER = "conf"

TOOLS = [
    "test_simple_text", "test_image_content", "test_audio_content", "test_embedded_resource",
    "test_multiple_content_types", "test_tool_with_logging", "test_tool_with_progress",
    "test_error_handling", "test_sampling", "test_elicitation", "test_elicitation_sep1034_defaults",
    "test_elicitation_sep1330_enums", "json_schema_2020_12_tool", "test_reconnection",
    "test_missing_capability", "test_streaming_elicitation", "test_logging_tool",
    "test_trigger_tool_change", "test_trigger_prompt_change",
    "test_input_required_result_elicitation", "test_input_required_result_sampling",
    "test_input_required_result_list_roots", "test_input_required_result_request_state",
    "test_input_required_result_multiple_inputs", "test_input_required_result_multi_round",
    "test_input_required_result_tampered_state", "test_input_required_result_capabilities",
]
PROMPTS = [
    "test_simple_prompt", "test_prompt_with_arguments", "test_prompt_with_embedded_resource",
    "test_prompt_with_image", "test_input_required_result_prompt",
]
RESOURCES = [
    "test://static-text", "test://static-binary", "test://template/123/data", "test://watched-resource",
    "test://nonexistent-resource-for-conformance-testing",
]

# What precedes a literal the scenario code sends or looks for (the bundle is minified: the
# single-letter names vary between versions, hence the \w+ parts).
CODE_CONTEXTS = [
    r"callTool\(\{name:",
    r"getPrompt\(\{name:",
    r"`(?:tools/call|prompts/get)`,\{name:",
    r"`tools/call`,params:\{name:",
    r"`ref/prompt`,name:",
    r"\.includes\(",
    r"\w+\.name===",
    r"const \w+=",
    r"(?:readResource|subscribeResource|unsubscribeResource)\(\{uri:",
    r"`resources/(?:read|subscribe|unsubscribe)`,\{uri:",
    r"let \w+=\[\],\w+=",
]

# version -> literal -> rewrites. Names a version does not use are absent.
EXPECTED = {
    "0.1.16": {
        "test_simple_text": 1, "test_image_content": 1, "test_audio_content": 1, "test_embedded_resource": 1,
        "test_multiple_content_types": 1, "test_tool_with_logging": 1, "test_tool_with_progress": 1,
        "test_error_handling": 1, "test_sampling": 1, "test_elicitation": 1,
        "test_elicitation_sep1034_defaults": 1, "test_elicitation_sep1330_enums": 1,
        "json_schema_2020_12_tool": 1, "test_reconnection": 1,
        "test_simple_prompt": 1, "test_prompt_with_arguments": 2, "test_prompt_with_embedded_resource": 1,
        "test_prompt_with_image": 1,
        "test://static-text": 1, "test://static-binary": 1, "test://template/123/data": 1,
        "test://watched-resource": 3,
    },
    "0.2.0-alpha.12": {
        "test_simple_text": 1, "test_image_content": 1, "test_audio_content": 1, "test_embedded_resource": 1,
        "test_multiple_content_types": 1, "test_tool_with_logging": 1, "test_tool_with_progress": 1,
        "test_error_handling": 1, "test_sampling": 1, "test_elicitation": 1,
        "test_elicitation_sep1034_defaults": 1, "test_elicitation_sep1330_enums": 1,
        "json_schema_2020_12_tool": 2, "test_reconnection": 1,
        "test_missing_capability": 2, "test_streaming_elicitation": 2, "test_logging_tool": 2,
        "test_trigger_tool_change": 3, "test_trigger_prompt_change": 1,
        "test_simple_prompt": 1, "test_prompt_with_arguments": 2, "test_prompt_with_embedded_resource": 1,
        "test_prompt_with_image": 1,
        "test://static-text": 1, "test://static-binary": 1, "test://template/123/data": 1,
        "test://watched-resource": 3, "test://nonexistent-resource-for-conformance-testing": 1,
        "test_input_required_result_elicitation": 7, "test_input_required_result_sampling": 2,
        "test_input_required_result_list_roots": 2, "test_input_required_result_request_state": 2,
        "test_input_required_result_multiple_inputs": 2, "test_input_required_result_multi_round": 3,
        "test_input_required_result_tampered_state": 2, "test_input_required_result_capabilities": 1,
        "test_input_required_result_prompt": 2,
    },
}


def namespaced(literal: str) -> str:
    if literal.startswith("test://"):
        return f"spear://{SERVER}/{literal}"
    return f"mcp__{SERVER}__{literal}"


def adapt(source: str) -> tuple[str, dict[str, int]]:
    literals = "|".join(re.escape(n) for n in TOOLS + PROMPTS + RESOURCES)
    contexts = "|".join(CODE_CONTEXTS)
    pattern = re.compile(rf"((?:{contexts}))`({literals})`")
    counts: dict[str, int] = {}

    def rewrite(match: re.Match) -> str:
        counts[match.group(2)] = counts.get(match.group(2), 0) + 1
        return f"{match.group(1)}`{namespaced(match.group(2))}`"

    return pattern.sub(rewrite, source), counts


def main() -> int:
    package, version = Path(sys.argv[1]), sys.argv[2]
    if version not in EXPECTED:
        print(f"adapt: no rewrite table for suite version {version} (known: {', '.join(EXPECTED)})", file=sys.stderr)
        return 1
    adapted, counts = adapt((package / "dist" / "index.js").read_text(encoding="utf-8"))
    if counts != EXPECTED[version]:
        names = sorted(set(counts) | set(EXPECTED[version]))
        for name in names:
            got, want = counts.get(name, 0), EXPECTED[version].get(name, 0)
            if got != want:
                print(f"adapt: {version}: {name}: {got} rewrites, the table says {want}", file=sys.stderr)
        return 1
    (package / "dist" / "index.adapted.js").write_text(adapted, encoding="utf-8")
    print(f"adapt: {version}: {sum(counts.values())} literals namespaced ({len(counts)} names)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
