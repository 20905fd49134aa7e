//! `McpServer`: one MCP server the platform team allows workloads to use.
//!
//! The Rust type is the source of truth: `crds/` is generated from it, and the doc comments
//! below become the `kubectl explain` text. Schema rules (enums, bounds, patterns, CEL) are the
//! ones a real API server enforces by itself; [`super::validate`] adds what a schema cannot say.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;

/// Default per-call timeout when `budgets.toolTimeoutMs` is not set.
pub const DEFAULT_TOOL_TIMEOUT_MS: u32 = 30_000;
/// Default startup budget when `budgets.startupTimeoutMs` is not set: spawn, `initialize` and
/// the first `tools/list` together. 120 s because a stdio server started with `npx -y` or `uvx`
/// downloads its package first, which takes tens of seconds on a cold cache or a busy machine.
pub const DEFAULT_STARTUP_TIMEOUT_MS: u32 = 120_000;
/// Default number of concurrent calls to one server.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 8;
/// Default cap on one tool result, in bytes.
pub const DEFAULT_MAX_TOOL_OUTPUT_BYTES: u32 = 65_536;
/// Upper bound on `status.tools`; `status.toolCount` keeps the real count.
pub const MAX_STATUS_TOOLS: usize = 256;

/// McpServer declares one MCP tool server that workloads may use: how to reach it (a stdio
/// command run as a sidecar, or a Streamable HTTP URL), which of its tools are exposed (none
/// unless allowed), and the budgets every call to it gets. `metadata.name` is the server id and
/// must be a DNS-1123 label.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "mcp.spear.dev",
    version = "v1alpha1",
    kind = "McpServer",
    plural = "mcpservers",
    singular = "mcpserver",
    shortname = "mcps",
    category = "spear",
    namespaced,
    status = "McpServerStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "McpServer declares one MCP tool server that workloads may use. metadata.name is the server id (a DNS-1123 label).",
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters): it is the server id used in tool names"),
    printcolumn = r#"{"name":"Transport","type":"string","jsonPath":".spec.transport"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Tools","type":"integer","jsonPath":".status.toolCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("self.transport != 'stdio' || has(self.stdio)")
        .message("spec.stdio is required when spec.transport is stdio")
        .field_path(".stdio")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("self.transport != 'stdio' || !has(self.http)")
        .message("spec.http must not be set when spec.transport is stdio")
        .field_path(".http")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("self.transport != 'streamableHttp' || has(self.http)")
        .message("spec.http.url is required when spec.transport is streamableHttp")
        .field_path(".http")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("self.transport != 'streamableHttp' || !has(self.stdio)")
        .message("spec.stdio must not be set when spec.transport is streamableHttp")
        .field_path(".stdio")
        .reason(Reason::FieldValueForbidden)
)]
#[serde(rename_all = "camelCase")]
pub struct McpServerSpec {
    /// Human-readable title shown in status, `explain` output and tool descriptions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub display_name: Option<String>,

    /// How the agent reaches the server: `stdio` (a command run as a sidecar in Kubernetes, as a
    /// child process in local mode) or `streamableHttp` (an MCP Streamable HTTP endpoint).
    pub transport: Transport,

    /// The command to run for a stdio server. Required when transport is stdio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdio: Option<StdioSpec>,

    /// The endpoint of a Streamable HTTP server. Required when transport is streamableHttp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSpec>,

    /// Overrides the server part of model-facing tool names (`mcp__<toolNamespace>__<tool>`).
    /// Defaults to `metadata.name`. Letters, digits, '-' and '_', without '__', not starting or
    /// ending with '_' (so the part boundary in tool names is never ambiguous).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[A-Za-z0-9-]([A-Za-z0-9_-]*[A-Za-z0-9-])?$"))]
    #[x_kube(validation = Rule::new("!self.contains('__')").message("toolNamespace must not contain '__' (it separates the parts of tool names)"))]
    pub tool_namespace: Option<String>,

    /// Glob patterns (`*` any run of characters, `?` one character, everything else literal) of
    /// the tools exposed. Empty means no tool is exposed: deny by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 256)))]
    pub allowed_tools: Vec<String>,

    /// Glob patterns of tools never exposed, whatever any allowlist says (a final veto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 256)))]
    pub denied_tools: Vec<String>,

    /// Glob patterns of the resource URIs exposed (`*` matches any run of characters, `/`
    /// included: `file:///srv/docs/*`). Empty means no resource is exposed: deny by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 1024)))]
    pub allowed_resources: Vec<String>,

    /// Glob patterns of resource URIs never exposed (a final veto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 1024)))]
    pub denied_resources: Vec<String>,

    /// Glob patterns of the prompt names exposed. Empty means no prompt is exposed: deny by
    /// default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 256)))]
    pub allowed_prompts: Vec<String>,

    /// Glob patterns of prompt names never exposed (a final veto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 256)))]
    pub denied_prompts: Vec<String>,

    /// Whether a call needs human approval. Without an approver configured, a call that needs
    /// approval is denied with `mcp_approval_required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_policy: Option<ApprovalPolicy>,

    /// Limits applied to every call to this server. A profile can tighten them, never loosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<ServerBudgets>,
}

/// How the agent talks to the server.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, Default)]
pub enum Transport {
    /// Newline-delimited JSON-RPC over a child process's stdin/stdout.
    #[default]
    #[serde(rename = "stdio")]
    Stdio,
    /// MCP Streamable HTTP.
    #[serde(rename = "streamableHttp")]
    StreamableHttp,
}

impl Transport {
    /// The spelling used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::StreamableHttp => "streamableHttp",
        }
    }
}

/// A stdio server: an argv run without a shell.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StdioSpec {
    /// Container image of the sidecar that runs the command in Kubernetes (the agent's bridge is
    /// copied into it). Required in Kubernetes mode, ignored in local mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// The executable (argv[0]). Never run through a shell: no globbing, pipes or `$VAR`.
    #[schemars(length(min = 1, max = 4096))]
    pub command: String,

    /// Arguments passed to the command, one item per argv entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    pub args: Vec<String>,

    /// Environment of the server process, as in a container; names may not start with `SPEAR_`.
    /// `value` may reference `${ENV:NAME}` or `${ENV:NAME:-default}`: in a pod a variable defined
    /// before it in this list, in local mode the agent's environment, never `SPEAR_*`,
    /// `POD_NAME`, `POD_NAMESPACE` or `KUBECONFIG`; `$${` writes a literal `${`. Secret- and
    /// ConfigMap-backed values are set on the sidecar by the webhook; a Secret must allow this
    /// server in its `mcp.spear.dev/allowed-servers` annotation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), schema_with = "schema::env_list")]
    pub env: Vec<EnvVar>,

    /// Working directory of the server process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub working_dir: Option<String>,

    /// Compute resources of the sidecar, as in a container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Mount the pod's service-account token into the sidecar (default false: the server cannot
    /// call the Kubernetes API as the pod). Set it only for a server that needs the API.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mount_service_account_token: bool,
}

/// A Streamable HTTP server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpSpec {
    /// The MCP endpoint, an absolute `http://` or `https://` URL.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub url: String,

    /// Headers sent with every request (for example `Authorization`). Names are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub headers: Vec<HttpHeader>,
}

/// One HTTP header: a literal value (which may use `${ENV:NAME}` references) or a Secret key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[x_kube(
    validation = Rule::new("has(self.value) != has(self.valueFrom)")
        .message("set exactly one of value and valueFrom")
)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Header name (an HTTP token, for example `Authorization`).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"))]
    pub name: String,

    /// Literal value. `${ENV:NAME}` / `${ENV:NAME:-default}` read the agent's environment in
    /// local mode only (never `SPEAR_*`); in a pod only the default applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8192))]
    pub value: Option<String>,

    /// Value from a Secret key. The webhook sets it as an env var on the agent when the Secret
    /// allows this server (annotation `mcp.spear.dev/allowed-servers`); the agent never reads
    /// Secrets itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<HeaderValueSource>,
}

/// Where a header value comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderValueSource {
    /// A key of a Secret in the server's namespace.
    pub secret_key_ref: SecretKeySelector,
}

/// Whether calls need a human approval.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalPolicy {
    /// Mode for tools no pattern in `tools` matches. Defaults to `never`.
    #[serde(default)]
    pub default: ApprovalMode,

    /// Per-tool modes keyed by glob pattern; the most specific matching pattern wins (an exact
    /// name beats any pattern; otherwise the pattern with more literal characters).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 128))]
    pub tools: BTreeMap<String, ApprovalMode>,
}

/// Approval mode of a tool.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum ApprovalMode {
    /// Calls run without approval.
    #[default]
    Never,
    /// Every call needs approval.
    Always,
    /// A call needs approval unless the tool's own annotations say it changes nothing
    /// (`readOnlyHint: true`) or nothing irreversibly (`destructiveHint: false`); a tool without
    /// annotations needs approval (MCP's defaults: not read-only, destructive). The annotations
    /// are the server's claims: use `always` for a server you do not trust to make them honestly.
    DestructiveHint,
}

/// Per-call limits of a server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerBudgets {
    /// Time limit of one tool call in milliseconds (default 30000, at most one hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3_600_000))]
    pub tool_timeout_ms: Option<u32>,

    /// Calls to this server running at once per agent; more wait (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_concurrency: Option<u32>,

    /// Largest tool result passed on, in bytes; longer output is truncated with a marker and
    /// `mcp_output_too_large` (default 65536, at most 16 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16_777_216))]
    pub max_tool_output_bytes: Option<u32>,

    /// Time allowed for the server to start, in milliseconds: spawning it (a stdio command such
    /// as `npx -y`, which may download its package first) or connecting, `initialize`, and the
    /// first `tools/list`, together (default 120000, 1000 to 900000). Past it the server's
    /// process group is stopped (SIGTERM, then SIGKILL) and the start is retried later. Calls
    /// keep `toolTimeoutMs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1000, max = 900_000))]
    pub startup_timeout_ms: Option<u32>,
}

impl ServerBudgets {
    /// The timeout in force, with the default applied.
    pub fn tool_timeout_ms(&self) -> u32 {
        self.tool_timeout_ms.unwrap_or(DEFAULT_TOOL_TIMEOUT_MS)
    }
    /// The concurrency limit in force, with the default applied.
    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY)
    }
    /// The output cap in force, with the default applied.
    pub fn max_tool_output_bytes(&self) -> u32 {
        self.max_tool_output_bytes.unwrap_or(DEFAULT_MAX_TOOL_OUTPUT_BYTES)
    }
    /// The startup budget in force, with the default applied.
    pub fn startup_timeout_ms(&self) -> u32 {
        self.startup_timeout_ms.unwrap_or(DEFAULT_STARTUP_TIMEOUT_MS)
    }
}

/// Observed state of an McpServer, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpServerStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Accepted` (the spec is valid) and `Ready` (the last probe succeeded; `Unknown` with
    /// reason `RunsAsSidecar` for stdio servers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Tool names the server listed at the last probe (at most 256; see `toolCount`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub tools: Vec<String>,

    /// Number of tools the server listed at the last probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_count: Option<u32>,

    /// What the server said about itself in `initialize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_info: Option<ServerInfo>,

    /// When the operator last probed the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,

    /// The last probe's error, if it failed (never contains secret values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The `initialize` answer of a server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerInfo {
    /// Server implementation name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Server implementation version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Usage instructions the server gives to clients (untrusted text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

impl McpServerSpec {
    /// Budgets with defaults applied where unset.
    pub fn budgets(&self) -> ServerBudgets {
        let b = self.budgets.clone().unwrap_or_default();
        ServerBudgets {
            tool_timeout_ms: Some(b.tool_timeout_ms()),
            max_concurrency: Some(b.max_concurrency()),
            max_tool_output_bytes: Some(b.max_tool_output_bytes()),
            startup_timeout_ms: Some(b.startup_timeout_ms()),
        }
    }
}
