//! `McpProfile`: what one workload may use, selected by the pod annotation
//! `mcp.spear.dev/profile`. Every field can only narrow what the McpServers allow.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::core::{Selector, SelectorExt};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{McpServer, schema};

/// Default number of model round trips in one chat completion.
pub const DEFAULT_MAX_ITERATIONS: u32 = 8;
/// Default number of tool calls in one chat completion.
pub const DEFAULT_MAX_TOTAL_TOOL_CALLS: u32 = 32;

/// McpProfile says which McpServers (and which of their tools) a workload may use, which are
/// on when a request names none, the loop budgets, and the upstream model for chat completions.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "mcp.spear.dev",
    version = "v1alpha1",
    kind = "McpProfile",
    plural = "mcpprofiles",
    singular = "mcpprofile",
    shortname = "mcpp",
    category = "spear",
    namespaced,
    status = "McpProfileStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "McpProfile says which McpServers and tools a workload may use; pods select it with the mcp.spear.dev/profile annotation.",
    printcolumn = r#"{"name":"Servers","type":"string","jsonPath":".spec.servers"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("(has(self.servers) && size(self.servers) > 0) || has(self.serverSelector)")
        .message("the profile allows no server: list McpServer names in spec.servers or set spec.serverSelector")
        .field_path(".servers")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("!has(self.defaultServers) || has(self.serverSelector) || self.defaultServers.all(s, s in self.servers)")
        .message("every name in spec.defaultServers must also be in spec.servers (defaults can only narrow the allowed set)")
        .field_path(".defaultServers")
        .reason(Reason::FieldValueInvalid)
)]
#[serde(rename_all = "camelCase")]
pub struct McpProfileSpec {
    /// Names of the McpServers (in this namespace) the workload may use: the upper bound.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub servers: Vec<String>,

    /// McpServers whose labels match are allowed too, in addition to `servers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_selector: Option<LabelSelector>,

    /// Servers enabled when a request names none; must be within the allowed set. Absent means
    /// every allowed server; an empty list means none unless the request asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub default_servers: Option<Vec<String>>,

    /// Glob patterns further narrowing the tools of every server; they match the original tool
    /// name or `<server>/<tool>`. Absent means no narrowing; an empty list exposes no tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub tool_allowlist: Option<Vec<String>>,

    /// Glob patterns of tools never exposed to this workload (a veto over every allowlist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub tool_denylist: Vec<String>,

    /// Glob patterns of resource URIs narrowing every server's `allowedResources`; absent: no
    /// narrowing, `[]`: no resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 1024)))]
    pub resource_allowlist: Option<Vec<String>>,

    /// Glob patterns of resource URIs never exposed to this workload (a veto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 1024)))]
    pub resource_denylist: Vec<String>,

    /// Glob patterns of prompt names (`name` or `server/name`) narrowing every server's
    /// `allowedPrompts`; absent: no narrowing, `[]`: no prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub prompt_allowlist: Option<Vec<String>>,

    /// Glob patterns of prompt names (`name` or `server/name`) never exposed (a veto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub prompt_denylist: Vec<String>,

    /// Loop and call budgets; call budgets can only tighten a server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<ProfileBudgets>,

    /// Calls per tool, per pod, on top of the servers' own limits (which still apply: a profile
    /// can only narrow). Keys are patterns as in `toolAllowlist` (a tool name or
    /// `<server>/<tool>`, `*` and `?`) or over model-facing names (`mcp__github__*`); each tool a
    /// pattern matches gets its own bucket. At most 64.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub rate_limits: super::rate_limit::RateLimits,

    /// Detectors for credentials the agent does not hold (private keys, cloud access keys,
    /// common token formats, JWTs), applied to tool output, resource reads and prompts before a
    /// caller or the model sees them. Off unless listed; at most one entry per detector.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub output_filters: Vec<OutputFilter>,

    /// Chat completion settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<ChatSpec>,

    /// Default `tool_choice` for chat completions that do not set one (default `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,

    /// Which of the profile's McpServers may act as the pod's ServiceAccount: receive a projected
    /// token of it (`http.auth.serviceAccountToken`, `tokenExchange`), or mount its Kubernetes
    /// API token into their sidecar (`stdio.mountServiceAccountToken`). Absent: none may. Written
    /// by whoever owns the profile, not by the servers' authors: a server the grant does not cover
    /// gets no token (the webhook leaves it out with a warning, and this profile's `ResolvedRefs`
    /// condition says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityGrant>,

    /// Who approves this workload's calls that need approval (the McpServers'
    /// `approvalPolicy`), tried in order. Absent: nobody, and such calls end with
    /// `mcp_approval_required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<super::ProfileApproval>,
}

/// A detector and what to do with what it finds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutputFilter {
    /// `privateKey`, `awsAccessKey`, `gcpApiKey`, `githubToken`, `gitlabToken`, `slackToken`,
    /// `stripeKey`, `openaiKey` or `jwt`.
    pub detector: Detector,

    /// `redact` (default) replaces each finding with `[redacted: detector <name>]`; `block`
    /// fails the call, read or get with `mcp_policy_denied` (reason `secret_in_output`).
    #[serde(default)]
    pub action: FilterAction,
}

/// A credential shape the agent can look for in text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Detector {
    /// A PEM (RFC 7468) or OpenPGP armored private key block, through its END line.
    PrivateKey,
    /// An AWS access key id (`AKIA…`, `ASIA…`, `ABIA…`, `ACCA…`).
    AwsAccessKey,
    /// A Google Cloud API key (`AIza…`).
    GcpApiKey,
    /// A GitHub token (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`).
    GithubToken,
    /// A GitLab token (`glpat-` and the other documented `gl…-` prefixes).
    GitlabToken,
    /// A Slack token (`xoxb-`, `xoxa-`, `xoxp-`, `xoxr-`, `xoxs-`).
    SlackToken,
    /// A Stripe secret or restricted key (`sk_live_`, `sk_test_`, `rk_live_`, `rk_test_`).
    StripeKey,
    /// An OpenAI API key (`sk-…`, `sk-proj-…`).
    OpenaiKey,
    /// A JSON Web Token (JWS compact form whose header and payload are JSON objects).
    Jwt,
}

/// What an output filter does with a finding.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FilterAction {
    /// Replace it.
    #[default]
    Redact,
    /// Refuse the whole output.
    Block,
}

/// The McpServers of a profile that may use the pod's ServiceAccount identity.
///
/// A projected token goes to a server only when `servers` names it and `audiences` allows the
/// audience it asks for. `*` in `audiences` allows any audience except the forbidden ones (the
/// Kubernetes API server's, such as `https://kubernetes.default.svc` and the cluster's issuer,
/// and cloud STSs' such as `sts.amazonaws.com`; the operator's `--forbidden-token-audiences`):
/// those are allowed only when listed literally, because their token lets the server act as the
/// workload on the Kubernetes API or in the cloud account.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityGrant {
    /// McpServers (names in this namespace, or `*` for every server of the profile, now and
    /// later) that may receive a projected token of the pod's ServiceAccount for
    /// `spec.http.auth.serviceAccountToken` or `spec.http.auth.tokenExchange`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 63), regex(pattern = r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$")),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub servers: Vec<String>,

    /// Audiences those tokens may carry, exactly as the McpServer's `audience` spells them. `*`
    /// allows any audience except the forbidden ones: the Kubernetes API server's (such as
    /// `https://kubernetes.default.svc`), the cluster's issuer, and cloud STSs' (such as
    /// `sts.amazonaws.com`), set by the operator's `--forbidden-token-audiences`. A token for one
    /// of those lets the server act as the workload there; list it literally to allow it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 1024)), extend("x-kubernetes-list-type" = "set"))]
    pub audiences: Vec<String>,

    /// stdio McpServers (names, or `*`) whose sidecar may mount the pod's Kubernetes API token
    /// (`spec.stdio.mountServiceAccountToken: true`). Any other sidecar gets an empty directory
    /// over the token path, whatever its McpServer says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 63), regex(pattern = r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$")),
        extend("x-kubernetes-list-type" = "set")
    )]
    pub mount_service_account_token: Vec<String>,
}

/// Loop budgets and call limits of a profile.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileBudgets {
    /// Model round trips in one chat completion (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_iterations: Option<u32>,

    /// Tool calls in one chat completion, all iterations together (default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_total_tool_calls: Option<u32>,

    /// Cap on one tool result in bytes; applies only where lower than the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16_777_216))]
    pub max_tool_output_bytes: Option<u32>,

    /// Time limit of one tool call in milliseconds; applies only where lower than the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3_600_000))]
    pub tool_timeout_ms: Option<u32>,
}

impl ProfileBudgets {
    /// Iterations in force, with the default applied.
    pub fn max_iterations(&self) -> u32 {
        self.max_iterations.unwrap_or(DEFAULT_MAX_ITERATIONS)
    }
    /// Total tool calls in force, with the default applied.
    pub fn max_total_tool_calls(&self) -> u32 {
        self.max_total_tool_calls.unwrap_or(DEFAULT_MAX_TOTAL_TOOL_CALLS)
    }
}

/// Chat completion settings of a profile.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatSpec {
    /// The OpenAI-compatible model API the agent forwards completions to. Absent: the agent's
    /// `--upstream-url` flag, or the request is refused with 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamSpec>,

    /// Which of the workload's tools are offered to the model each round (default: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_selection: Option<ToolSelection>,
}

/// Default number of tools offered per round under `toolSelection.mode: relevance`.
pub const DEFAULT_MAX_TOOLS: u32 = 20;

/// Which tools a chat completion offers the model each round.
///
/// With `mode: relevance`, a round whose effective set has more than `maxTools` tools offers the
/// `maxTools` most relevant to the conversation (ranked offline in the agent: the latest user
/// turn weighs most), plus every tool already called in the conversation, plus the tools
/// `alwaysInclude` matches, plus the built-in `mcp__spear__find_tools`, with which the model
/// searches the rest. The caller's own tools are always offered. Selection never adds a tool the
/// profile does not allow.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolSelection {
    /// `all` (default): every tool of the effective set, every round. `relevance`: the most
    /// relevant `maxTools`.
    #[serde(default)]
    pub mode: ToolSelectionMode,

    /// Tools offered per round under `relevance` (default 20), not counting tools already called,
    /// `alwaysInclude` and the caller's own. A request's `mcp.max_tools` can only lower it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 128))]
    pub max_tools: Option<u32>,

    /// Glob patterns (tool name, or `server/tool`) of tools offered every round under
    /// `relevance`, ranked or not. They select among allowed tools only; they never allow one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 256)))]
    pub always_include: Vec<String>,
}

impl ToolSelection {
    /// `maxTools` with the default applied.
    pub fn max_tools(&self) -> u32 {
        self.max_tools.unwrap_or(DEFAULT_MAX_TOOLS)
    }
}

/// How a chat completion picks the tools it offers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum ToolSelectionMode {
    /// Every tool of the effective set.
    #[default]
    All,
    /// The tools most relevant to the conversation, up to `maxTools`.
    Relevance,
}

/// An OpenAI-compatible upstream.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamSpec {
    /// Base URL of the API (for example `https://api.openai.com/v1`), http or https.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub url: String,

    /// The Secret key holding the API key; the webhook gives it to the agent as an env var when
    /// the Secret allows this profile (annotation `mcp.spear.dev/allowed-profiles`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeyRef>,

    /// Model used when a request names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub model: Option<String>,
}

/// A key of a Secret in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Default tool choice, as OpenAI's `tool_choice`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tools are offered to the model.
    None,
    /// The model must call a tool.
    Required,
}

/// Observed state of an McpProfile, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpProfileStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Accepted` (the spec is valid) and `ResolvedRefs` (every named server exists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Servers the profile allows that exist (from `servers` and `serverSelector`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolved_servers: Vec<String>,

    /// Servers named in `servers` that do not exist in the namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_servers: Vec<String>,

    /// Model-facing tool names the profile exposes, where the servers' tools are known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_preview: Vec<String>,
}

impl McpProfile {
    /// Whether the profile allows `server`: named in `spec.servers` or matched by
    /// `spec.serverSelector` (Kubernetes label-selector semantics, by kube's own `Selector`).
    /// Namespaces are the caller's business: every caller already holds one namespace's servers,
    /// and local mode ignores `metadata.namespace`. A selector that does not parse (an unknown
    /// operator, `In` without values) selects nothing: deny by default; validation reports it with
    /// the field.
    pub fn selects(&self, server: &McpServer) -> bool {
        let Some(name) = server.metadata.name.as_deref() else { return false };
        if self.spec.servers.iter().any(|s| s == name) {
            return true;
        }
        let Some(selector) = &self.spec.server_selector else { return false };
        let Ok(selector) = Selector::try_from(selector.clone()) else { return false };
        let empty = BTreeMap::new();
        selector.matches(server.metadata.labels.as_ref().unwrap_or(&empty))
    }
}

#[cfg(test)]
mod selects_tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use kube::core::ObjectMeta;

    use super::*;
    use crate::api::McpServerSpec;

    fn server(name: &str, namespace: &str, labels: &[(&str, &str)]) -> McpServer {
        let mut s = McpServer::new(name, McpServerSpec::default());
        s.metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..ObjectMeta::default()
        };
        s
    }

    fn profile(servers: &[&str], selector: Option<LabelSelector>) -> McpProfile {
        let mut p = McpProfile::new(
            "dev",
            McpProfileSpec {
                servers: servers.iter().map(|s| s.to_string()).collect(),
                server_selector: selector,
                ..McpProfileSpec::default()
            },
        );
        p.metadata.namespace = Some("team-a".into());
        p
    }

    fn requirement(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn named_servers_are_selected() {
        let p = profile(&["fs"], None);
        assert!(p.selects(&server("fs", "team-a", &[])));
        assert!(!p.selects(&server("git", "team-a", &[])));
    }

    #[test]
    fn selector_uses_label_semantics() {
        let selector = LabelSelector {
            match_labels: Some(BTreeMap::from([("tier".into(), "public".into())])),
            match_expressions: Some(vec![
                requirement("team", "In", Some(&["a", "b"])),
                requirement("legacy", "DoesNotExist", None),
            ]),
        };
        let p = profile(&[], Some(selector));
        assert!(p.selects(&server("x", "team-a", &[("tier", "public"), ("team", "a")])));
        assert!(!p.selects(&server("x", "team-a", &[("tier", "public"), ("team", "c")])));
        assert!(!p.selects(&server("x", "team-a", &[("tier", "public"), ("team", "a"), ("legacy", "1")])));
        assert!(!p.selects(&server("x", "team-a", &[("team", "a")])));
    }

    #[test]
    fn a_selector_that_does_not_parse_selects_nothing() {
        let broken =
            LabelSelector { match_expressions: Some(vec![requirement("team", "Near", None)]), ..Default::default() };
        assert!(!profile(&[], Some(broken)).selects(&server("x", "team-a", &[("team", "a")])));
        let in_without_values =
            LabelSelector { match_expressions: Some(vec![requirement("team", "In", None)]), ..Default::default() };
        assert!(!profile(&[], Some(in_without_values)).selects(&server("x", "team-a", &[("team", "a")])));
    }
}
