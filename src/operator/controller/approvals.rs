//! Deletes McpApprovals that are done: decided ones after people had time to see them, expired
//! ones shortly after their agent stopped waiting (`approval::kubernetes::should_delete`). A list
//! every [`SWEEP_EVERY`] rather than a controller: approvals are few, short-lived, and nothing
//! waits on their deletion.

use std::time::Duration;

use kube::api::{DeleteParams, ListParams};
use kube::{Client, ResourceExt as _};
use tokio_util::sync::CancellationToken;

use crate::api::McpApproval;
use crate::approval::kubernetes::should_delete;
use crate::operator::scope::Scope;

/// How often the operator looks for McpApprovals to delete.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Sweeps until `token` is cancelled.
pub(super) async fn sweep_approvals(client: Client, scope: Scope, token: CancellationToken) {
    let api = scope.api::<McpApproval>(client.clone());
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        let listed = match api.list(&ListParams::default()).await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::debug!(error = %e, "McpApprovals not listed (the CRD may not be installed)");
                continue;
            }
        };
        let now = jiff::Timestamp::now();
        for approval in listed.items.iter().filter(|a| should_delete(a, now)) {
            let (namespace, name) = (approval.namespace().unwrap_or_default(), approval.name_any());
            let api: kube::Api<McpApproval> = kube::Api::namespaced(client.clone(), &namespace);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::debug!(%namespace, %name, "McpApproval deleted (decided or expired)"),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => tracing::warn!(error = %e, %namespace, %name, "McpApproval not deleted"),
            }
        }
    }
}
