//! `spearlet approve NAME` / `spearlet deny NAME --reason ...` (also `kubectl spear approve` and
//! `deny`): a person's decision on an McpApproval, written to its status under their own RBAC
//! (update on `mcpapprovals/status`, the chart's `spear-mcp-approver` ClusterRole).
//!
//! `decidedBy` is the caller's own user name as the API server sees it (a SelfSubjectReview),
//! which is what the chart's admission policy requires; an approval already decided or expired is
//! refused here with what it says, before anything is written.

use std::process::ExitCode;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::explain::cluster::{self, ClusterError, KubeArgs, api_error};
use crate::api::validate::is_dns1123_subdomain;
use crate::api::{ApprovalDecision, McpApproval};
use crate::cli::{block_on, tell};

/// Approve an McpApproval: the pod's call it asks about runs.
#[derive(clap::Args, Debug)]
pub(crate) struct ApproveArgs {
    /// The McpApproval (`kubectl get mcpapprovals` lists the pending ones).
    name: String,
    /// Why (recorded in its status and the call's audit line).
    #[arg(long)]
    reason: Option<String>,
    #[command(flatten)]
    kube: KubeArgs,
}

/// Deny an McpApproval: the pod's call it asks about is refused with `mcp_approval_denied`.
#[derive(clap::Args, Debug)]
pub(crate) struct DenyArgs {
    /// The McpApproval (`kubectl get mcpapprovals` lists the pending ones).
    name: String,
    /// Why (the caller and the model see it).
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    kube: KubeArgs,
}

impl ApproveArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        decide(&self.name, ApprovalDecision::Allow, self.reason.as_deref(), &self.kube)
    }
}

impl DenyArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        decide(&self.name, ApprovalDecision::Deny, Some(&self.reason), &self.kube)
    }
}

fn decide(name: &str, decision: ApprovalDecision, reason: Option<&str>, kube: &KubeArgs) -> anyhow::Result<ExitCode> {
    if !is_dns1123_subdomain(name) {
        tell(format_args!("error: '{name}' is not an McpApproval name (`kubectl get mcpapprovals` lists them)"));
        return Ok(ExitCode::from(2));
    }
    let said = block_on(async {
        let (client, namespace) = cluster::client_for(kube).await?;
        Ok::<_, anyhow::Error>(write_decision(client, &namespace, name, decision, reason).await?)
    })?;
    match said {
        Ok(done) => {
            tell(format_args!("{done}"));
            Ok(ExitCode::SUCCESS)
        }
        Err(refused) => {
            tell(format_args!("error: {refused}"));
            Ok(ExitCode::from(1))
        }
    }
}

/// Writes the decision; `Ok(Err(why))` when the approval cannot take one (decided, expired, gone).
async fn write_decision(
    client: kube::Client,
    namespace: &str,
    name: &str,
    decision: ApprovalDecision,
    reason: Option<&str>,
) -> Result<Result<String, String>, ClusterError> {
    const RESOURCE: &str = "mcpapprovals.mcp.spear.dev";
    let api: Api<McpApproval> = Api::namespaced(client.clone(), namespace);
    let approval = match api.get_opt(name).await.map_err(|e| api_error(e, "get", RESOURCE, namespace))? {
        Some(approval) => approval,
        None => {
            return Ok(Err(format!(
                "McpApproval {namespace}/{name} not found (decided and expired ones are deleted after a while): \
                 `kubectl get mcpapprovals -n {namespace}` lists the pending ones"
            )));
        }
    };
    if let Some(decided) = approval.status.as_ref().and_then(|s| s.decision) {
        let by = approval.status.as_ref().and_then(|s| s.decided_by.clone()).unwrap_or_default();
        return Ok(Err(format!(
            "McpApproval {namespace}/{name} is decided already ({decided:?} by {by}); a decision is final"
        )));
    }
    let now = jiff::Timestamp::now();
    if approval.spec.expires_at.parse::<jiff::Timestamp>().is_ok_and(|expires| expires <= now) {
        return Ok(Err(format!(
            "McpApproval {namespace}/{name} expired at {}: the agent stopped waiting and denied the call",
            approval.spec.expires_at
        )));
    }
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| api_error(e, "create", "selfsubjectreviews.authentication.k8s.io", namespace))?;
    let user = review.status.and_then(|s| s.user_info).and_then(|u| u.username).unwrap_or_default();
    let status = json!({"status": {
        "decision": decision,
        "decidedBy": user,
        "reason": reason,
        "decidedAt": now.to_string(),
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| api_error(e, "update", "mcpapprovals/status", namespace))?;
    let verb = match decision {
        ApprovalDecision::Allow => "approved",
        ApprovalDecision::Deny => "denied",
    };
    let spec = &approval.spec;
    Ok(Ok(format!(
        "{verb} McpApproval {namespace}/{name}: '{}' on '{}' for pod {} (as {user})",
        spec.tool, spec.server, spec.pod
    )))
}
