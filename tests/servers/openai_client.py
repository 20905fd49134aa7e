"""Drives spearlet's chat door with the official OpenAI Python SDK (PyPI `openai`).

    python openai_client.py http://127.0.0.1:<port>/v1 [selection]

Used by tests/it/chat.rs, whose scripted upstream stands behind the agent. Three completions:
non-streaming (the agent runs an MCP tool round), streaming with `include_usage` (the same, then
SSE chunks), and the SDK's `stream()` helper on an answer calling the caller's own tool (the
tool-call deltas must accumulate into a complete call). With `selection`, one completion with a
caller tool under the profile's relevance tool selection, with the `spear` extension printed. With
`approval`, one streamed and one plain completion whose tool calls wait for an approver, with the
`spear` extension of the plain one. Prints
one JSON object on stdout; any SDK error fails the script with a traceback on stderr.
"""

import json
import sys

from openai import OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def selection(client: OpenAI) -> None:
    messages = [{"role": "user", "content": "Get me the details of user 7890 from the database"}]
    completion = client.chat.completions.create(model="test-model", messages=messages, tools=[WEATHER])
    out = {
        "content": completion.choices[0].message.content,
        "spear": (completion.model_extra or {}).get("spear"),
    }
    print(json.dumps(out))


def approval(client: OpenAI) -> None:
    messages = [{"role": "user", "content": "echo something"}]
    stream = client.chat.completions.create(model="test-model", messages=messages, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    completion = client.chat.completions.create(model="test-model", messages=messages)
    out = {
        "streamed": streamed,
        "content": completion.choices[0].message.content,
        "spear": (completion.model_extra or {}).get("spear"),
    }
    print(json.dumps(out))


def main() -> None:
    client = OpenAI(base_url=sys.argv[1], api_key="sk-sdk", max_retries=0, timeout=60)
    if sys.argv[2:] == ["selection"]:
        selection(client)
        return
    if sys.argv[2:] == ["approval"]:
        approval(client)
        return
    messages = [{"role": "user", "content": "use the echo tool"}]
    out = {}

    raw = client.chat.completions.with_raw_response.create(
        model="test-model", messages=messages, extra_body={"mcp": {"server_ids": ["fx"]}}
    )
    completion = raw.parse()
    out["plain"] = {
        "revision": raw.headers.get("x-spear-registry-revision"),
        "content": completion.choices[0].message.content,
        "finish_reason": completion.choices[0].finish_reason,
        # Unknown response fields land in the pydantic model's extras.
        "spear": (completion.model_extra or {}).get("spear"),
    }

    content, finish_reason, usage = [], None, None
    stream = client.chat.completions.create(
        model="test-model", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.total_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            if choice.finish_reason:
                finish_reason = choice.finish_reason
    out["stream"] = {"content": "".join(content), "finish_reason": finish_reason, "usage_total_tokens": usage}

    with client.chat.completions.stream(model="test-model", messages=messages, tools=[WEATHER]) as helper:
        final = helper.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    out["stream_helper"] = {
        "tool_call": {"id": call.id, "name": call.function.name, "arguments": json.loads(call.function.arguments)},
        "finish_reason": final.choices[0].finish_reason,
    }

    print(json.dumps(out))


if __name__ == "__main__":
    main()
