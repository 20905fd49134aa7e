"""The MCP server behind spearlet when the official conformance suite runs (hack/conformance.sh).

The suite's server scenarios call tools, prompts and resources by fixed names (`test_simple_text`,
`test://static-text`, ...) and check what comes back. This server offers those names with the
behaviour each scenario checks, written from the scenarios' descriptions (none of the suite's own
fixture code is used). spearlet serves it as the stdio McpServer `conf`, so the suite reaches its
names as `mcp__conf__<name>` and `spear://conf/<uri>` (the name adapter, hack/conformance/adapt.py).

    python conformance_fixture.py          # stdio; logs to stderr

Built on the PyPI `mcp` SDK's low-level `Server`, which speaks 2025-11-25 sessions and
2026-07-28 stateless requests, like tests/servers/fixture_server.py.
"""

import base64
import contextvars
import hashlib
import hmac
import json
import os
import struct
import sys
import warnings
import zlib

import anyio
import mcp.types as types
from mcp.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.subscriptions import PromptsListChanged, ToolsListChanged
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

# Logging, sampling and subscriptions are deprecated by 2026-07-28, yet the 2025 scenarios test
# them: serve them without a warning on every call in spearlet's log.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)


def png_1x1() -> bytes:
    """A valid 1x1 red PNG, built here rather than pasted as a blob."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte, then one red pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def wav_silence() -> bytes:
    """A valid WAV file: PCM 16-bit mono 8 kHz, four silent samples."""
    samples = b"\x00\x00" * 4
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


PNG = base64.b64encode(png_1x1()).decode()
WAV = base64.b64encode(wav_silence()).decode()


def text(value: str) -> types.TextContent:
    return types.TextContent(text=value)


def no_arguments() -> dict:
    return {"type": "object", "properties": {}}


def string_arguments(*names: str) -> dict:
    return {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": list(names)}


# === tools ===


async def simple_text(ctx, arguments):
    return [text("This is a simple text response from the conformance fixture.")]


async def image_content(ctx, arguments):
    return [types.ImageContent(data=PNG, mime_type="image/png")]


async def audio_content(ctx, arguments):
    return [types.AudioContent(data=WAV, mime_type="audio/wav")]


async def embedded_resource(ctx, arguments):
    resource = types.TextResourceContents(uri="test://embedded-resource", mime_type="text/plain", text="Embedded text.")
    return [types.EmbeddedResource(resource=resource)]


async def mixed_content(ctx, arguments):
    resource = types.TextResourceContents(
        uri="test://mixed-content-resource", mime_type="application/json", text=json.dumps({"mixed": True})
    )
    return [text("Text, an image and a resource follow."), types.ImageContent(data=PNG, mime_type="image/png"),
            types.EmbeddedResource(resource=resource)]


async def with_logging(ctx, arguments):
    for step in ("started", "processing", "completed"):
        await ctx.session.send_log_message("info", f"tool execution {step}", logger="conformance",
                                           related_request_id=ctx.request_id)
        await anyio.sleep(0.05)
    return [text("Logged three messages.")]


async def with_progress(ctx, arguments):
    token = (ctx.meta or {}).get("progress_token")
    if token is not None:
        for done in (0, 50, 100):
            await ctx.session.send_progress_notification(token, done, total=100, message=f"{done}%",
                                                         related_request_id=str(ctx.request_id))
            await anyio.sleep(0.05)
    return [text("Progress reported." if token is not None else "No progress token: nothing reported.")]


async def error_handling(ctx, arguments):
    raise ToolFailed("This tool fails on purpose, to show how a tool error looks.")


# The call's request, for the tools that ask a 2026-07-28 client for input with an
# InputRequiredResult (that revision forbids requests from server to client); 2025 sessions are
# asked over the session, as before.
CALL_PARAMS: contextvars.ContextVar = contextvars.ContextVar("call_params")


def asked_before(key: str):
    """The 2026-07-28 client's answer to `key` in this call's retry, if it gave one."""
    return answers_of(CALL_PARAMS.get()).get(key)


async def sampling(ctx, arguments):
    prompt = (arguments or {}).get("prompt", "")
    if is_modern(ctx):
        answer = asked_before("sampling")
        if answer is None:
            return input_required({"sampling": ask_model(prompt, 100)})
        content = getattr(answer, "content", None)
        return [text(f"LLM response: {getattr(content, 'text', content)}")]
    message = types.SamplingMessage(role="user", content=text(prompt))
    try:
        result = await ctx.session.create_message([message], max_tokens=100, related_request_id=ctx.request_id)
    except MCPError as error:
        return [text(f"sampling failed: {error}")]
    content = result.content
    answer = content.text if isinstance(content, types.TextContent) else str(content)
    return [text(f"LLM response: {answer}")]


async def elicit(ctx, arguments, message: str, schema: dict):
    if is_modern(ctx):
        answer = asked_before("elicitation")
        if answer is None:
            params = types.ElicitRequestFormParams(message=message, requested_schema=schema)
            return input_required({"elicitation": types.ElicitRequest(params=params)})
        return [text(f"User response: action={answer.action}, content={json.dumps(answer.content)}")]
    try:
        result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    except MCPError as error:
        return [text(f"elicitation failed: {error}")]
    return [text(f"User response: action={result.action}, content={json.dumps(result.content)}")]


async def elicitation(ctx, arguments):
    schema = {
        "type": "object",
        "properties": {"username": {"type": "string"}, "email": {"type": "string"}},
        "required": ["username", "email"],
    }
    return await elicit(ctx, arguments, (arguments or {}).get("message", "Please provide your details"), schema)


async def elicitation_defaults(ctx, arguments):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "score": {"type": "number", "default": 95.5},
            "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
            "verified": {"type": "boolean", "default": True},
        },
    }
    return await elicit(ctx, arguments, "Defaults for every primitive type (SEP-1034)", schema)


async def elicitation_enums(ctx, arguments):
    titled = [{"const": f"value{i}", "title": f"Value {i}"} for i in (1, 2, 3)]
    schema = {
        "type": "object",
        "properties": {
            "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
            "titledSingle": {"type": "string", "oneOf": titled},
            "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                           "enumNames": ["Option 1", "Option 2", "Option 3"]},
            "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
            "titledMulti": {"type": "array", "items": {"anyOf": titled}},
        },
    }
    return await elicit(ctx, arguments, "Every enum shape (SEP-1330)", schema)


async def echo_arguments(ctx, arguments):
    return [text(json.dumps(arguments or {}, sort_keys=True))]


async def reconnection(ctx, arguments):
    # Over stdio the server cannot close the client's HTTP stream; it just answers.
    return [text("Answered without a reconnection (stdio server).")]


# -32021 (MissingRequiredClientCapability, 2026-07-28): a request whose clientCapabilities lack
# what the tool needs is refused, naming the capability.
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021


async def missing_capability(ctx, arguments):
    capabilities = (ctx.meta or {}).get("io.modelcontextprotocol/clientCapabilities")
    if capabilities is not None and "sampling" not in capabilities:
        raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, "this tool needs the client's sampling capability",
                       data={"requiredCapabilities": {"sampling": {}}})
    return await sampling(ctx, {"prompt": "Answer only if your client can sample."})


async def streaming_elicitation(ctx, arguments):
    return await elicitation(ctx, {"message": "Please provide your details"})


async def logging_tool(ctx, arguments):
    for step in ("first", "second"):
        await ctx.session.send_log_message("info", f"{step} log line", logger="conformance",
                                           related_request_id=ctx.request_id)
    return [text("Logged twice.")]


# 2026-07-28 clients hear of list changes on their `subscriptions/listen` streams, fed by this
# bus; 2025-era sessions by a notification on the session.
BUS = InMemorySubscriptionBus()


def is_modern(ctx) -> bool:
    return str(getattr(ctx, "protocol_version", "") or "") >= "2026-07-28"


async def trigger_tool_change(ctx, arguments):
    name = f"dynamic_tool_{len(TOOLS)}"
    TOOLS[name] = ("A tool added at run time.", no_arguments(), echo_arguments)
    await BUS.publish(ToolsListChanged())
    if not is_modern(ctx):
        await ctx.session.send_tool_list_changed()
    return [text(f"added tool {name}")]


async def trigger_prompt_change(ctx, arguments):
    name = f"dynamic_prompt_{len(PROMPTS)}"
    PROMPTS[name] = ("A prompt added at run time.", [], lambda args: [user(text("A dynamic prompt."))])
    await BUS.publish(PromptsListChanged())
    if not is_modern(ctx):
        await ctx.session.send_prompt_list_changed()
    return [text(f"added prompt {name}")]


# === 2026-07-28 input-required results (SEP-2322) ===
# Each tool asks for input by answering an InputRequiredResult; the client retries the call with
# `inputResponses` (keyed as asked) and the echoed `requestState`. The state is signed with a
# per-process key, so a tampered state is refused with -32602.

STATE_KEY = os.urandom(32)


def sign_state(payload: dict) -> str:
    body = base64.urlsafe_b64encode(json.dumps(payload, sort_keys=True).encode()).decode()
    return body + "." + hmac.new(STATE_KEY, body.encode(), hashlib.sha256).hexdigest()


def verify_state(state) -> dict:
    body, _, mac = (state or "").partition(".")
    expected = hmac.new(STATE_KEY, body.encode(), hashlib.sha256).hexdigest()
    if not body or not hmac.compare_digest(mac, expected):
        raise MCPError(types.INVALID_PARAMS, "requestState failed its integrity check")
    return json.loads(base64.urlsafe_b64decode(body))


def ask_form(message: str, **properties: str) -> types.ElicitRequest:
    schema = {"type": "object", "properties": {n: {"type": k} for n, k in properties.items()},
              "required": list(properties)}
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def ask_model(question: str, max_tokens: int) -> types.CreateMessageRequest:
    message = types.SamplingMessage(role="user", content=text(question))
    return types.CreateMessageRequest(params=types.CreateMessageRequestParams(messages=[message], max_tokens=max_tokens))


def ask_roots() -> types.ListRootsRequest:
    return types.ListRootsRequest()


def input_required(requests: dict, state: dict | None = None) -> types.InputRequiredResult:
    return types.InputRequiredResult(input_requests=requests, request_state=sign_state(state) if state else None)


def answers_of(params) -> dict:
    """The retry's answers by key; a non-object `inputResponses` is the client's protocol error."""
    answers = params.input_responses
    if answers is None and "inputResponses" in (getattr(params, "model_extra", None) or {}):
        raise MCPError(types.INVALID_PARAMS, "inputResponses must be an object")
    return dict(answers or {})


def form_value(answer, field: str) -> str:
    content = getattr(answer, "content", None) or {}
    return str(content.get(field, "")) if isinstance(content, dict) else ""


def declared(params, capability: str) -> bool:
    # `_meta` is a plain dict in this SDK (progress_token snake-cased, other keys as sent).
    capabilities = (params.meta or {}).get("io.modelcontextprotocol/clientCapabilities")
    return capabilities is None or capability in capabilities


async def ir_elicitation(params):
    answers = answers_of(params)
    if "user_name" not in answers:
        return input_required({"user_name": ask_form("What is your name?", name="string")})
    return [text(f"Hello, {form_value(answers['user_name'], 'name')}!")]


async def ir_sampling(params):
    answers = answers_of(params)
    if "capital_question" not in answers:
        return input_required({"capital_question": ask_model("What is the capital of France?", 100)})
    content = getattr(answers["capital_question"], "content", None)
    return [text(f"The model said: {getattr(content, 'text', content)}")]


async def ir_list_roots(params):
    answers = answers_of(params)
    if "client_roots" not in answers:
        return input_required({"client_roots": ask_roots()})
    roots = getattr(answers["client_roots"], "roots", None) or []
    return [text("Roots: " + ", ".join(str(root.uri) for root in roots))]


async def ir_request_state(params):
    answers = answers_of(params)
    if "confirm" not in answers or params.request_state is None:
        return input_required({"confirm": ask_form("Please confirm", ok="boolean")}, {"step": "confirm"})
    state = verify_state(params.request_state)
    return [text(f"state-ok: confirmed at step {state['step']}")]


async def ir_multiple_inputs(params):
    answers = answers_of(params)
    wanted = {"user_name": ask_form("What is your name?", name="string"),
              "greeting": ask_model("Generate a greeting", 50), "client_roots": ask_roots()}
    missing = {key: request for key, request in wanted.items() if key not in answers}
    if missing or params.request_state is None:
        return input_required(missing or wanted, {"step": "all"})
    verify_state(params.request_state)
    return [text(f"Got all three inputs for {form_value(answers['user_name'], 'name')}.")]


async def ir_multi_round(params):
    answers = answers_of(params)
    if params.request_state is None:
        return input_required({"step1": ask_form("Step 1: What is your name?", name="string")}, {"round": 1})
    state = verify_state(params.request_state)
    if state.get("round") == 1 and "step1" in answers:
        name = form_value(answers["step1"], "name")
        return input_required({"step2": ask_form("Step 2: What is your favorite color?", color="string")},
                              {"round": 2, "name": name})
    if state.get("round") == 2 and "step2" in answers:
        return [text(f"{state.get('name')} likes {form_value(answers['step2'], 'color')}.")]
    raise MCPError(types.INVALID_PARAMS, "the answers do not match the round in requestState")


async def ir_tampered_state(params):
    if params.request_state is None:
        return input_required({"confirm": ask_form("Please confirm", ok="boolean")}, {"step": "tamper-proof"})
    state = verify_state(params.request_state)
    return [text(f"state-ok: {state['step']}")]


async def ir_capabilities(params):
    # Asks only for the kinds of input the request's clientCapabilities declare.
    answers = answers_of(params)
    wanted = {}
    if declared(params, "elicitation"):
        wanted["user_name"] = ask_form("What is your name?", name="string")
    if declared(params, "sampling"):
        wanted["greeting"] = ask_model("Generate a greeting", 50)
    missing = {key: request for key, request in wanted.items() if key not in answers}
    if missing:
        return input_required(missing)
    return [text("Asked only for what the client can answer.")]


# name -> handler(params) -> content blocks or an InputRequiredResult
INPUT_REQUIRED_TOOLS = {
    "test_input_required_result_elicitation": ir_elicitation,
    "test_input_required_result_sampling": ir_sampling,
    "test_input_required_result_list_roots": ir_list_roots,
    "test_input_required_result_request_state": ir_request_state,
    "test_input_required_result_multiple_inputs": ir_multiple_inputs,
    "test_input_required_result_multi_round": ir_multi_round,
    "test_input_required_result_tampered_state": ir_tampered_state,
    "test_input_required_result_capabilities": ir_capabilities,
}


class ToolFailed(Exception):
    """A tool's own failure: answered as an `isError` result, not a JSON-RPC error."""


# Keywords of JSON Schema 2020-12 an aggregator must pass through untouched (SEP-2106):
# $schema, $defs with an $anchor, $ref, composition (an anyOf inside allOf), conditionals (if/then/else).
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "address",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "allOf": [{"required": ["name"]}, {"anyOf": [{"properties": {"name": {"minLength": 1}}}, {"required": ["address"]}]}],
    "if": {"properties": {"name": {"const": "home"}}},
    "then": {"required": ["address"]},
    "else": {"properties": {"address": {"type": "object"}}},
    "additionalProperties": False,
}

# name -> (description, input schema, handler(ctx, arguments) -> content blocks)
TOOLS = {
    "test_simple_text": ("Answers one text block.", no_arguments(), simple_text),
    "test_image_content": ("Answers one PNG image block.", no_arguments(), image_content),
    "test_audio_content": ("Answers one WAV audio block.", no_arguments(), audio_content),
    "test_embedded_resource": ("Answers one embedded text resource.", no_arguments(), embedded_resource),
    "test_multiple_content_types": ("Answers text, an image and a resource.", no_arguments(), mixed_content),
    "test_tool_with_logging": ("Sends three log messages while it runs.", no_arguments(), with_logging),
    "test_tool_with_progress": ("Reports progress 0, 50 and 100 of 100.", no_arguments(), with_progress),
    "test_error_handling": ("Always fails with a tool error.", no_arguments(), error_handling),
    "test_sampling": ("Asks the client's model to answer the prompt.", string_arguments("prompt"), sampling),
    "test_elicitation": ("Asks the user for a username and an email.", string_arguments("message"), elicitation),
    "test_elicitation_sep1034_defaults": ("Asks with defaults for every type.", no_arguments(), elicitation_defaults),
    "test_elicitation_sep1330_enums": ("Asks with every enum schema shape.", no_arguments(), elicitation_enums),
    "json_schema_2020_12_tool": ("Echoes arguments; its schema is JSON Schema 2020-12.", JSON_SCHEMA_2020_12,
                                 echo_arguments),
    "test_reconnection": ("Answers (a stdio server cannot close the client's stream).", no_arguments(), reconnection),
    "test_missing_capability": ("Asks for sampling, which the client may lack.", no_arguments(), missing_capability),
    "test_streaming_elicitation": ("Asks for input while it runs.", no_arguments(), streaming_elicitation),
    "test_logging_tool": ("Logs twice, then answers.", no_arguments(), logging_tool),
    "test_trigger_tool_change": ("Adds a tool and says the tool list changed.", no_arguments(), trigger_tool_change),
    "test_trigger_prompt_change": ("Adds a prompt and says the prompt list changed.", no_arguments(),
                                   trigger_prompt_change),
}


async def list_tools(ctx, params) -> types.ListToolsResult:
    tools = [types.Tool(name=n, description=d, input_schema=s) for n, (d, s, _) in TOOLS.items()]
    tools += [
        types.Tool(name=n, description="Asks for input with an InputRequiredResult (2026-07-28).",
                   input_schema=no_arguments())
        for n in INPUT_REQUIRED_TOOLS
    ]
    return types.ListToolsResult(tools=tools)


async def call_tool(ctx, params: types.CallToolRequestParams):
    if params.name in INPUT_REQUIRED_TOOLS:
        result = await INPUT_REQUIRED_TOOLS[params.name](params)
        return result if isinstance(result, types.InputRequiredResult) else types.CallToolResult(content=result)
    if params.name not in TOOLS:
        raise MCPError(types.INVALID_PARAMS, f"unknown tool: {params.name}")
    _, _, handler = TOOLS[params.name]
    CALL_PARAMS.set(params)
    try:
        content = await handler(ctx, params.arguments or {})
    except ToolFailed as failure:
        return types.CallToolResult(content=[text(str(failure))], is_error=True)
    if isinstance(content, types.InputRequiredResult):
        return content
    return types.CallToolResult(content=content)


# === resources ===

WATCHED = "test://watched-resource"
subscribed: set[str] = set()

STATIC = {
    "test://static-text": lambda uri: types.TextResourceContents(
        uri=uri, mime_type="text/plain", text="This is the content of the static text resource."
    ),
    "test://static-binary": lambda uri: types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG),
    WATCHED: lambda uri: types.TextResourceContents(uri=uri, mime_type="text/plain", text="Watched content."),
}
TEMPLATE = "test://template/{id}/data"


async def list_resources(ctx, params) -> types.ListResourcesResult:
    resources = [
        types.Resource(uri=uri, name=uri.removeprefix("test://"), description=f"The fixture's {uri}")
        for uri in STATIC
    ]
    return types.ListResourcesResult(resources=resources)


async def list_templates(ctx, params) -> types.ListResourceTemplatesResult:
    template = types.ResourceTemplate(
        uri_template=TEMPLATE, name="template-data", description="Data for an id", mime_type="application/json"
    )
    return types.ListResourceTemplatesResult(resource_templates=[template])


async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    uri = str(params.uri)
    if uri in STATIC:
        return types.ReadResourceResult(contents=[STATIC[uri](uri)])
    prefix, suffix = TEMPLATE.split("{id}")
    if uri.startswith(prefix) and uri.endswith(suffix) and len(uri) > len(prefix) + len(suffix):
        item = uri[len(prefix) : -len(suffix)]
        body = json.dumps({"id": item, "templateTest": True, "data": f"Data for id {item}"})
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type="application/json",
                                                                             text=body)])
    raise MCPError(types.RESOURCE_NOT_FOUND if hasattr(types, "RESOURCE_NOT_FOUND") else types.INVALID_PARAMS,
                   f"Resource not found: {uri}", data={"uri": uri})


async def subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    subscribed.add(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    subscribed.discard(str(params.uri))
    return types.EmptyResult()


# === prompts ===


def user(content) -> types.PromptMessage:
    return types.PromptMessage(role="user", content=content)


PROMPTS = {
    "test_simple_prompt": ("A prompt without arguments.", [], lambda args: [user(text("This is a simple prompt."))]),
    "test_prompt_with_arguments": (
        "A prompt that uses two arguments.",
        [types.PromptArgument(name="arg1", required=True, description="first"),
         types.PromptArgument(name="arg2", required=True, description="second")],
        lambda args: [user(text(f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"))],
    ),
    "test_prompt_with_embedded_resource": (
        "A prompt that embeds the resource it is given.",
        [types.PromptArgument(name="resourceUri", required=True, description="the resource to embed")],
        lambda args: [
            user(types.EmbeddedResource(resource=types.TextResourceContents(
                uri=args.get("resourceUri", "test://example-resource"), mime_type="text/plain",
                text="Embedded resource content."))),
            user(text("Please use the resource above.")),
        ],
    ),
    "test_prompt_with_image": (
        "A prompt with an image.",
        [],
        lambda args: [user(types.ImageContent(data=PNG, mime_type="image/png")), user(text("Describe this image."))],
    ),
}


INPUT_REQUIRED_PROMPT = "test_input_required_result_prompt"


async def list_prompts(ctx, params) -> types.ListPromptsResult:
    prompts = [types.Prompt(name=n, description=d, arguments=a) for n, (d, a, _) in PROMPTS.items()]
    prompts.append(types.Prompt(name=INPUT_REQUIRED_PROMPT, description="Asks for context first (2026-07-28)."))
    return types.ListPromptsResult(prompts=prompts)


async def get_prompt(ctx, params: types.GetPromptRequestParams):
    if params.name == INPUT_REQUIRED_PROMPT:
        answers = answers_of(params)
        if "user_context" not in answers:
            return input_required({"user_context": ask_form("What context should the prompt use?", context="string")})
        context = form_value(answers["user_context"], "context")
        return types.GetPromptResult(description="A prompt built from the user's answer",
                                     messages=[user(text(f"Use this context: {context}"))])
    if params.name not in PROMPTS:
        raise MCPError(types.INVALID_PARAMS, f"unknown prompt: {params.name}")
    description, _, render = PROMPTS[params.name]
    return types.GetPromptResult(description=description, messages=render(params.arguments or {}))


# === completion and logging ===

COMPLETIONS = ["paris", "park", "parse", "test", "testing", "value"]


async def complete(ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
    prefix = params.argument.value
    values = [v for v in COMPLETIONS if v.startswith(prefix)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))


async def set_level(ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


class ConformanceServer(Server):
    """Advertises every list_changed notification it sends and resource subscriptions."""

    def create_initialization_options(self, notification_options=None, *args, **kwargs):
        options = notification_options or NotificationOptions(
            tools_changed=True, prompts_changed=True, resources_changed=True
        )
        return super().create_initialization_options(options, *args, **kwargs)


server = ConformanceServer(
    "spear-conformance-fixture",
    version="1.0.0",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
    on_list_prompts=list_prompts,
    on_get_prompt=get_prompt,
    on_completion=complete,
    on_set_logging_level=set_level,
    on_subscriptions_listen=ListenHandler(BUS),
)


async def serve_stdio() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    print("conformance fixture: starting (stdio)", file=sys.stderr, flush=True)
    anyio.run(serve_stdio)


if __name__ == "__main__":
    main()
