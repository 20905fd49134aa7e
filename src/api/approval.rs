//! Who approves a call that needs approval (`McpProfile.spec.approval`). A McpServer's
//! `approvalPolicy` says which calls need approval; the profile of the workload says who may give
//! it, because the same server serves workloads with different people (or programs) behind them.
//!
//! Approvers are tried in order and the first that can be asked decides: a caller approver is
//! skipped when the call's session cannot answer a form (another door, or a client that did not
//! declare elicitation); a kubernetes approver in local mode (no cluster); a webhook can always be
//! asked. No answer within `timeoutSeconds` denies.
//!
//! A webhook's signing key comes from a Secret key. In a pod the webhook gives it to the agent as
//! the env var [`WebhookApprover::signing_key_env`] when the Secret grants this profile (the
//! annotation `mcp.spear.dev/allowed-profiles`, as for the upstream API key); in local mode the
//! agent reads the same env var, which whoever starts it sets.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::mcp_profile::SecretKeyRef;

/// Default wait for a decision, in seconds.
pub const DEFAULT_APPROVAL_TIMEOUT_SECONDS: u32 = 60;
/// Longest wait the schema accepts, in seconds.
pub const MAX_APPROVAL_TIMEOUT_SECONDS: u32 = 3600;
/// Most approvers in one chain.
pub const MAX_APPROVERS: usize = 8;

/// Who may approve this workload's calls that need approval (the McpServer's `approvalPolicy`
/// says which calls do). Absent: nobody, and such calls end with `mcp_approval_required`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileApproval {
    /// Seconds to wait for a decision (default 60). No decision in time denies the call. The wait
    /// counts against the call's `toolTimeoutMs`, which ends it first when it is shorter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<u32>,

    /// Approvers, tried in order: the first that can be asked decides. A caller approver is
    /// skipped when the call's session cannot answer; a webhook can always be asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub approvers: Vec<Approver>,
}

impl ProfileApproval {
    /// The wait for a decision, with the default applied.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.timeout_seconds.unwrap_or(DEFAULT_APPROVAL_TIMEOUT_SECONDS)))
    }
}

/// One approver; set exactly one field.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[x_kube(
    validation = Rule::new("[has(self.caller), has(self.webhook), has(self.kubernetes)].exists_one(x, x)")
        .message("set exactly one of caller, webhook and kubernetes in each approver")
)]
#[serde(rename_all = "camelCase")]
pub struct Approver {
    /// The `/mcp` caller, asked with a form (2025-11-25 sessions that declared `elicitation`) or
    /// an input round (2026-07-28 requests that declare it). Skipped for callers that cannot
    /// answer, and for the chat and gRPC doors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<CallerApprover>,

    /// A program, asked with a signed HTTP POST.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookApprover>,

    /// A person in the cluster: the agent creates an McpApproval in the pod's namespace and
    /// waits for `kubectl spear approve` or `deny`. Skipped in local mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesApprover>,
}

impl Approver {
    /// Which kind this approver is, when exactly one is set.
    pub fn kind(&self) -> Option<ApproverKind> {
        match (&self.caller, &self.webhook, &self.kubernetes) {
            (Some(_), None, None) => Some(ApproverKind::Caller),
            (None, Some(_), None) => Some(ApproverKind::Webhook),
            (None, None, Some(_)) => Some(ApproverKind::Kubernetes),
            _ => None,
        }
    }
}

/// The kinds of approver, as metrics and audit lines name them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ApproverKind {
    Caller,
    Webhook,
    Kubernetes,
}

impl ApproverKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ApproverKind::Caller => "caller",
            ApproverKind::Webhook => "webhook",
            ApproverKind::Kubernetes => "kubernetes",
        }
    }
}

/// The caller approver takes no settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct CallerApprover {}

/// The kubernetes approver takes no settings: the McpApproval goes to the pod's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct KubernetesApprover {}

/// An approval service: the agent POSTs a JSON approval request and the service answers
/// `{"decision": "allow" | "deny", "reason": "..."}` with status 200. Anything else denies.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookApprover {
    /// Where the request goes, http or https. The agent follows no redirect and never sends it to
    /// a link-local or cloud metadata address, nor to loopback unless the URL names loopback.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub url: String,

    /// The Secret key holding the HMAC-SHA256 key that signs each request (header
    /// `X-Spear-Signature-256: sha256=<hex>` over the body). The Secret must allow this profile
    /// (annotation `mcp.spear.dev/allowed-profiles`). Local mode reads the key from the env var
    /// `SPEAR_APPROVAL_KEY_<NAME>_<KEY>` (upper case, other characters as `_`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_secret_ref: Option<SecretKeyRef>,

    /// Send the call's arguments in the request (default false: only their SHA-256 digest).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_arguments: bool,
}

impl WebhookApprover {
    /// The env var that holds the signing key, when one is set.
    pub fn signing_key_env(&self) -> Option<String> {
        self.signing_secret_ref.as_ref().map(|s| super::names::approval_key_env_var(&s.name, &s.key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signing_key_env_var_is_upper_case_with_underscores() {
        let secret = SecretKeyRef { name: "approver-key".into(), key: "hmac.v1".into() };
        let webhook = WebhookApprover { signing_secret_ref: Some(secret), ..WebhookApprover::default() };
        assert_eq!(webhook.signing_key_env().as_deref(), Some("SPEAR_APPROVAL_KEY_APPROVER_KEY_HMAC_V1"));
    }

    #[test]
    fn an_approver_has_a_kind_only_when_exactly_one_field_is_set() {
        let caller = Approver { caller: Some(CallerApprover {}), ..Approver::default() };
        assert_eq!(caller.kind(), Some(ApproverKind::Caller));
        assert_eq!(Approver::default().kind(), None);
        let both = Approver { webhook: Some(WebhookApprover::default()), ..caller };
        assert_eq!(both.kind(), None);
    }

    #[test]
    fn the_timeout_defaults_to_sixty_seconds() {
        assert_eq!(ProfileApproval::default().timeout().as_secs(), 60);
        let set = ProfileApproval { timeout_seconds: Some(5), ..ProfileApproval::default() };
        assert_eq!(set.timeout().as_secs(), 5);
    }
}
