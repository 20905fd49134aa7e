//! OpenAI chat completion types, typed only as far as the agent reads them. Every other field
//! (and every field of a future API version) rides along in an `extra` map, so what the caller
//! sends reaches the upstream unchanged and what the upstream answers reaches the caller.
//!
//! ```text
//! caller JSON ──ChatRequest (mcp split off)──▶ upstream JSON ──ChatCompletion──▶ caller JSON
//!                 └─ McpOptions (never forwarded)
//! ```

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::error::ChatError;
use crate::api::ToolChoice as ProfileToolChoice;
use crate::mcp::arguments::{arguments_from_json, arguments_from_value, json_kind};
use crate::policy::RequestScope;

// === request ===

/// A `POST /v1/chat/completions` body.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ChatRequest {
    /// The model; the profile's `chat.upstream.model` fills it when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    /// The conversation, forwarded as sent.
    #[serde(default)]
    pub(crate) messages: Vec<Value>,
    /// The caller's own tools; the agent appends the MCP tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tools: Option<Vec<ToolDef>>,
    /// `none`, `auto`, `required` or a forced function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tool_choice: Option<ToolChoice>,
    /// Whether the caller wants SSE chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stream: Option<bool>,
    /// Streaming options (`include_usage`); only valid upstream with `stream: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stream_options: Option<Value>,
    /// The agent's extension object; read by the agent, never serialized (never forwarded).
    #[serde(default, skip_serializing)]
    pub(crate) mcp: Option<Value>,
    /// Every other field, forwarded as is.
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

impl ChatRequest {
    /// Parses a request body; the error names the field that is wrong.
    pub(crate) fn from_slice(body: &[u8]) -> Result<Self, ChatError> {
        let de = &mut serde_json::Deserializer::from_slice(body);
        serde_path_to_error::deserialize(de).map_err(|e| ChatError::InvalidBody { message: e.to_string() })
    }

    /// Names of the caller's own tools.
    pub(crate) fn caller_tool_names(&self) -> Vec<&str> {
        self.tools.iter().flatten().filter_map(ToolDef::name).collect()
    }

    /// Whether the caller asked for `stream_options.include_usage`.
    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.get("include_usage")).and_then(Value::as_bool) == Some(true)
    }
}

/// A tool offered to the model (`{"type": "function", "function": {...}}`, or another type,
/// kept as is).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ToolDef {
    /// `function`, or another tool type passed through.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// The function, for `type: function`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) function: Option<FunctionDef>,
    /// Other fields (for example `custom: {name, ...}`).
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

impl ToolDef {
    /// A function tool.
    pub(crate) fn function(name: impl Into<String>, description: Option<String>, parameters: Value) -> Self {
        ToolDef {
            kind: "function".to_string(),
            function: Some(FunctionDef {
                name: name.into(),
                description,
                parameters: Some(parameters),
                extra: Map::new(),
            }),
            extra: Map::new(),
        }
    }

    /// The tool's name: the function's, or `<type>.name` for other tool types.
    pub(crate) fn name(&self) -> Option<&str> {
        match &self.function {
            Some(f) => Some(f.name.as_str()),
            None => self.extra.get(&self.kind).and_then(|t| t.get("name")).and_then(Value::as_str),
        }
    }
}

/// A function tool's definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct FunctionDef {
    /// The name the model calls.
    pub(crate) name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) description: Option<String>,
    /// JSON Schema of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parameters: Option<Value>,
    /// Other fields (`strict`, ...).
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

/// `tool_choice`, kept as the JSON the caller sent so nothing is lost when forwarding.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToolChoice(Value);

/// What a [`ToolChoice`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChoiceKind<'a> {
    /// `"none"`: no tool calls.
    None,
    /// `"auto"`: the model decides.
    Auto,
    /// `"required"`: some tool must be called.
    Required,
    /// `{"type": "function", "function": {"name"}}`: this function must be called.
    Function(&'a str),
    /// Anything else (newer forms), passed through.
    Other,
}

impl ToolChoice {
    /// `"auto"`.
    pub(crate) fn auto() -> Self {
        ToolChoice(Value::from("auto"))
    }

    #[cfg(test)]
    /// `{"type": "function", "function": {"name": name}}`.
    pub(crate) fn function(name: &str) -> Self {
        ToolChoice(serde_json::json!({"type": "function", "function": {"name": name}}))
    }

    /// What it asks for.
    pub(crate) fn kind(&self) -> ChoiceKind<'_> {
        match &self.0 {
            Value::String(s) => match s.as_str() {
                "none" => ChoiceKind::None,
                "auto" => ChoiceKind::Auto,
                "required" => ChoiceKind::Required,
                _ => ChoiceKind::Other,
            },
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                    Some(name) => ChoiceKind::Function(name),
                    None => ChoiceKind::Other,
                }
            }
            _ => ChoiceKind::Other,
        }
    }

    #[cfg(test)]
    /// The JSON form.
    pub(crate) fn as_value(&self) -> &Value {
        &self.0
    }
}

impl From<ProfileToolChoice> for ToolChoice {
    fn from(choice: ProfileToolChoice) -> Self {
        ToolChoice(Value::from(match choice {
            ProfileToolChoice::Auto => "auto",
            ProfileToolChoice::None => "none",
            ProfileToolChoice::Required => "required",
        }))
    }
}

impl Serialize for ToolChoice {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(ToolChoice)
    }
}

// === the mcp extension ===

/// The request's `mcp` object: `{enabled, max_tools, server_ids, tool_allowlist, tool_denylist,
/// budgets}`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct McpOptions {
    /// `false` makes the agent a plain proxy: nothing injected, nothing executed.
    pub(crate) enabled: bool,
    /// Tools ranked in per round (`chat.toolSelection`); lowers the profile's `maxTools`.
    pub(crate) max_tools: Option<u32>,
    /// Resources (`spear://...` URIs) to read and attach to the conversation.
    pub(crate) resources: Vec<String>,
    /// The narrowing (every other key); `None` when the object names nothing to narrow.
    pub(crate) scope: Option<RequestScope>,
}

impl Default for McpOptions {
    fn default() -> Self {
        McpOptions { enabled: true, max_tools: None, resources: Vec::new(), scope: None }
    }
}

/// The largest `max_tools`: OpenAI's API takes at most 128 tools per request.
const MAX_TOOLS_LIMIT: u32 = 128;
/// Resources one request may attach; each is read from its server before the model is asked.
const MAX_RESOURCES: usize = 16;
const MAX_RESOURCE_URI_BYTES: usize = 2048;

impl McpOptions {
    /// Reads the `mcp` object; unknown keys are refused, naming the key.
    pub(crate) fn parse(value: Option<Value>) -> Result<Self, ChatError> {
        let mut object = match value {
            None | Some(Value::Null) => return Ok(McpOptions::default()),
            Some(Value::Object(o)) => o,
            Some(other) => {
                return Err(ChatError::InvalidMcp {
                    message: format!("expected an object, got {}", json_kind(&other)),
                });
            }
        };
        let enabled = match object.remove("enabled") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => b,
            Some(other) => {
                return Err(ChatError::InvalidMcp {
                    message: format!("enabled: expected a boolean, got {}", json_kind(&other)),
                });
            }
        };
        let max_tools = match object.remove("max_tools") {
            None | Some(Value::Null) => None,
            Some(value) => match value.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if (1..=MAX_TOOLS_LIMIT).contains(&n) => Some(n),
                _ => {
                    return Err(ChatError::InvalidMcp {
                        message: format!("max_tools: expected an integer from 1 to {MAX_TOOLS_LIMIT}, got {value}"),
                    });
                }
            },
        };
        let resources = match object.remove("resources") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) if items.len() <= MAX_RESOURCES => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(uri) if !uri.is_empty() && uri.len() <= MAX_RESOURCE_URI_BYTES => Ok(uri),
                    other => Err(ChatError::InvalidMcp {
                        message: format!(
                            "resources[{i}]: expected a resource URI (spear://<server>/<uri>, at most \
                             {MAX_RESOURCE_URI_BYTES} bytes), got {}",
                            json_kind(&other)
                        ),
                    }),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(ChatError::InvalidMcp {
                    message: format!(
                        "resources: expected an array of at most {MAX_RESOURCES} resource URIs, got {}",
                        json_kind(&other)
                    ),
                });
            }
        };
        if object.is_empty() {
            return Ok(McpOptions { enabled, max_tools, resources, scope: None });
        }
        let scope: RequestScope = serde_path_to_error::deserialize(Value::Object(object))
            .map_err(|e| ChatError::InvalidMcp { message: e.to_string() })?;
        Ok(McpOptions { enabled, max_tools, resources, scope: Some(scope) })
    }
}

// === response ===

/// A `chat.completion` object as the upstream returns it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ChatCompletion {
    /// `chatcmpl-...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    /// The answers (the loop follows the first).
    #[serde(default)]
    pub(crate) choices: Vec<Choice>,
    /// `object`, `created`, `model`, `usage`, ... and the agent's `spear` extension.
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

/// One answer of a completion.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Choice {
    /// Position among the choices.
    #[serde(default)]
    pub(crate) index: u32,
    /// The assistant message.
    #[serde(default)]
    pub(crate) message: Message,
    /// `stop`, `tool_calls`, `length`, ...
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
    /// `logprobs` and anything newer.
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

/// An assistant message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Message {
    /// `assistant`.
    #[serde(default = "assistant")]
    pub(crate) role: String,
    /// Tool calls, if the model made any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tool_calls: Option<Vec<ToolCallItem>>,
    /// `content`, `refusal`, `annotations`, ... kept as sent (`content: null` stays null).
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

fn assistant() -> String {
    "assistant".to_string()
}

impl Default for Message {
    fn default() -> Self {
        Message { role: assistant(), tool_calls: None, extra: Map::new() }
    }
}

impl Message {
    /// The text content, when it is a string.
    pub(crate) fn content(&self) -> Option<&str> {
        self.extra.get("content").and_then(Value::as_str)
    }

    /// The tool calls (empty when there are none).
    pub(crate) fn calls(&self) -> &[ToolCallItem] {
        self.tool_calls.as_deref().unwrap_or_default()
    }
}

/// One tool call in an assistant message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ToolCallItem {
    /// `call_...`: the `tool_call_id` of the answering `role=tool` message.
    #[serde(default)]
    pub(crate) id: String,
    /// `function` (other types are kept but never routed to MCP).
    #[serde(rename = "type", default = "function_kind")]
    pub(crate) kind: String,
    /// The function called, for `type: function`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) function: Option<FunctionCall>,
    /// Other fields (for example `custom: {name, input}`).
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

fn function_kind() -> String {
    "function".to_string()
}

impl ToolCallItem {
    #[cfg(test)]
    /// A function call (tests and fixtures).
    pub(crate) fn function(id: &str, name: &str, arguments: &str) -> Self {
        ToolCallItem {
            id: id.to_string(),
            kind: function_kind(),
            function: Some(FunctionCall {
                name: name.to_string(),
                arguments: Value::from(arguments),
                extra: Map::new(),
            }),
            extra: Map::new(),
        }
    }

    /// The name called: the function's, or `<type>.name` for other call types.
    pub(crate) fn name(&self) -> &str {
        match &self.function {
            Some(f) => &f.name,
            None => self.extra.get(&self.kind).and_then(|t| t.get("name")).and_then(Value::as_str).unwrap_or_default(),
        }
    }

    /// Whether it is a function call (the only kind an MCP tool can be).
    pub(crate) fn is_function(&self) -> bool {
        self.kind == "function" && self.function.is_some()
    }

    /// The arguments as a JSON string, as OpenAI sends them.
    pub(crate) fn arguments_string(&self) -> String {
        match self.function.as_ref().map(|f| &f.arguments) {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            Some(other) => other.to_string(),
        }
    }

    /// The arguments as an object for `tools/call`: `Err` with the reason when they are not a
    /// JSON object. Empty or `null` arguments mean none (models send `""` for argument-less
    /// tools); some OpenAI-compatible servers send an object instead of a string, accepted too.
    pub(crate) fn arguments_object(&self) -> Result<Option<Map<String, Value>>, String> {
        match self.function.as_ref().map(|f| &f.arguments) {
            None => Ok(None),
            Some(Value::String(s)) => arguments_from_json(s),
            Some(other) => arguments_from_value(other.clone()),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct FunctionCall {
    /// The tool name the model used.
    #[serde(default)]
    pub(crate) name: String,
    /// The arguments: a JSON string in OpenAI's API.
    #[serde(default)]
    pub(crate) arguments: Value,
    /// Anything newer.
    #[serde(flatten)]
    pub(crate) extra: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_request_fields_survive_a_round_trip_and_mcp_is_never_serialized() {
        let body = json!({
            "model": "m", "messages": [{"role": "user", "content": "hi", "x": 1}], "temperature": 0.2,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}, "strict": true}, "y": 2}],
            "tool_choice": {"type": "function", "function": {"name": "f"}, "z": 3},
            "mcp": {"server_ids": ["a"]},
        });
        let request = ChatRequest::from_slice(body.to_string().as_bytes()).expect("parses");
        assert_eq!(request.caller_tool_names(), ["f"]);
        assert_eq!(request.tool_choice.as_ref().map(ToolChoice::kind), Some(ChoiceKind::Function("f")));
        assert!(request.mcp.is_some());
        let mut expected = body.clone();
        expected.as_object_mut().expect("object").remove("mcp");
        assert_eq!(serde_json::to_value(&request).expect("serializes"), expected);
    }

    #[test]
    fn a_bad_body_names_the_field() {
        let error = ChatRequest::from_slice(br#"{"messages": 3}"#).expect_err("refused");
        assert!(error.to_string().contains("messages"), "{error}");
    }

    #[test]
    fn mcp_options_default_to_enabled_and_refuse_unknown_keys_by_name() {
        assert_eq!(McpOptions::parse(None).expect("ok"), McpOptions::default());
        let off = McpOptions::parse(Some(json!({"enabled": false}))).expect("ok");
        assert!(!off.enabled && off.scope.is_none());
        let scoped = McpOptions::parse(Some(json!({"server_ids": ["fx"], "tool_denylist": ["pid"]}))).expect("ok");
        let scope = scoped.scope.expect("scope");
        assert_eq!(scope.servers, Some(vec!["fx".to_string()]));
        assert_eq!(scope.tool_denylist, ["pid"]);

        let error = McpOptions::parse(Some(json!({"server_id": ["fx"]}))).expect_err("refused");
        assert!(error.to_string().contains("server_id"), "{error}");
        let error = McpOptions::parse(Some(json!({"budgets": {"maxIterations": 2}}))).expect_err("refused");
        assert!(error.to_string().contains("budgets") && error.to_string().contains("maxIterations"), "{error}");
        let attach = McpOptions::parse(Some(json!({"resources": ["spear://fs/file:///a"]}))).expect("ok");
        assert_eq!(attach.resources, ["spear://fs/file:///a"]);
        for bad in [json!("spear://fs/x"), json!([1]), json!([""]), json!(vec!["spear://fs/x"; 17])] {
            let error = McpOptions::parse(Some(json!({"resources": bad}))).expect_err("refused");
            assert!(error.to_string().contains("resources"), "{error}");
        }
        let tight = McpOptions::parse(Some(json!({"max_tools": 5}))).expect("ok");
        assert_eq!((tight.max_tools, tight.scope), (Some(5), None));
        for bad in [json!(0), json!(129), json!(2.5), json!("5")] {
            let error = McpOptions::parse(Some(json!({"max_tools": bad}))).expect_err("refused");
            assert!(error.to_string().contains("max_tools"), "{error}");
        }
        let error = McpOptions::parse(Some(json!({"enabled": "yes"}))).expect_err("refused");
        assert!(error.to_string().contains("enabled"), "{error}");
        assert!(McpOptions::parse(Some(json!([1]))).is_err());
    }

    #[test]
    fn tool_choice_kinds() {
        let parse = |v: Value| serde_json::from_value::<ToolChoice>(v).expect("parses");
        assert_eq!(parse(json!("none")).kind(), ChoiceKind::None);
        assert_eq!(parse(json!("auto")).kind(), ChoiceKind::Auto);
        assert_eq!(parse(json!("required")).kind(), ChoiceKind::Required);
        let forced = parse(json!({"type": "function", "function": {"name": "f"}}));
        assert_eq!(forced.kind(), ChoiceKind::Function("f"));
        assert_eq!(parse(json!({"type": "allowed_tools", "allowed_tools": {}})).kind(), ChoiceKind::Other);
        assert_eq!(ToolChoice::from(ProfileToolChoice::Required).kind(), ChoiceKind::Required);
    }

    #[test]
    fn completions_keep_null_content_and_unknown_fields() {
        let body = json!({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "logprobs": null, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "refusal": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            }}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        });
        let completion: ChatCompletion = serde_json::from_value(body.clone()).expect("parses");
        assert_eq!(completion.choices[0].message.calls()[0].name(), "f");
        assert_eq!(serde_json::to_value(&completion).expect("serializes"), body);
    }

    #[test]
    fn arguments_parse_to_an_object_or_a_reason() {
        let call = |args: Value| ToolCallItem {
            function: Some(FunctionCall { name: "f".into(), arguments: args, extra: Map::new() }),
            ..ToolCallItem::default()
        };
        assert_eq!(call(json!("{\"a\": 1}")).arguments_object(), Ok(json!({"a": 1}).as_object().cloned()));
        assert_eq!(call(json!("")).arguments_object(), Ok(None));
        assert_eq!(call(json!(null)).arguments_object(), Ok(None));
        assert_eq!(call(json!({"a": 1})).arguments_object(), Ok(json!({"a": 1}).as_object().cloned()));
        assert!(call(json!("{not json")).arguments_object().is_err());
        let error = call(json!("[1]")).arguments_object().expect_err("not an object");
        assert!(error.contains("array"), "{error}");
        assert_eq!(call(json!({"a": 1})).arguments_string(), "{\"a\":1}");
    }

    #[test]
    fn custom_tools_are_named_by_their_type_object() {
        let tool: ToolDef = serde_json::from_value(json!({"type": "custom", "custom": {"name": "grep"}})).expect("ok");
        assert_eq!(tool.name(), Some("grep"));
        let call: ToolCallItem =
            serde_json::from_value(json!({"id": "c", "type": "custom", "custom": {"name": "grep", "input": "x"}}))
                .expect("ok");
        assert_eq!(call.name(), "grep");
        assert!(!call.is_function());
    }
}
