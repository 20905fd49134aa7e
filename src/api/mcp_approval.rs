//! `McpApproval`: one question to a person, asked by a pod's agent for a call that needs
//! approval (the profile's `kubernetes: {}` approver), answered with `kubectl spear approve` or
//! `deny`. The agent creates it and watches it; a person sets its status under their own RBAC
//! (update on `mcpapprovals/status`); the chart's ValidatingAdmissionPolicy makes `decidedBy` the
//! person who wrote the decision and a decision final; the operator deletes decided and expired
//! ones.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// McpApproval asks a person to approve or deny one tool call of a pod; `kubectl spear approve`
/// and `kubectl spear deny` answer it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "mcp.spear.dev",
    version = "v1alpha1",
    kind = "McpApproval",
    plural = "mcpapprovals",
    singular = "mcpapproval",
    shortname = "mcpa",
    category = "spear",
    namespaced,
    status = "McpApprovalStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "McpApproval asks a person to approve or deny one tool call of a pod; kubectl spear approve and deny answer it.",
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".spec.pod"}"#,
    printcolumn = r#"{"name":"Server","type":"string","jsonPath":".spec.server"}"#,
    printcolumn = r#"{"name":"Tool","type":"string","jsonPath":".spec.tool"}"#,
    printcolumn = r#"{"name":"Decision","type":"string","jsonPath":".status.decision"}"#,
    printcolumn = r#"{"name":"Decided-By","type":"string","jsonPath":".status.decidedBy"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".spec.expiresAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct McpApprovalSpec {
    /// The pod whose agent asks.
    #[schemars(length(max = 253))]
    pub pod: String,
    /// The pod's McpProfile.
    #[schemars(length(max = 253))]
    pub profile: String,
    /// The McpServer the call goes to.
    #[schemars(length(max = 253))]
    pub server: String,
    /// The tool's name on its server.
    #[schemars(length(max = 1024))]
    pub tool: String,
    /// The name the caller used (model-facing).
    #[schemars(length(max = 1024))]
    pub name: String,
    /// `sha256:<hex>` of the arguments' RFC 8785 form; the arguments themselves are not stored.
    #[schemars(length(max = 80))]
    pub arguments_digest: String,
    /// The tool's annotations as its server lists them (the server's claims), as JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub annotations: Option<String>,
    /// `mcp`, `chat` or `grpc`.
    #[schemars(length(max = 16))]
    pub door: String,
    /// RFC 3339: the agent stops waiting then, and a decision after it is not read.
    #[schemars(length(max = 64))]
    pub expires_at: String,
}

/// The decision, written by the person who decides (`kubectl spear approve` / `deny`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpApprovalStatus {
    /// `Allow` or `Deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ApprovalDecision>,
    /// Who decided: the chart's admission policy requires the writer's own user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub decided_by: Option<String>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub decided_at: Option<String>,
}

/// A person's decision on an McpApproval.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ApprovalDecision {
    Allow,
    Deny,
}
