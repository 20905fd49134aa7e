//! The kubernetes approver's question (an `McpApproval` in the pod's namespace) and the reading of
//! its answer; when the operator deletes one.
//!
//! - The question carries the call, never its arguments: their digest, as for a webhook without
//!   `includeArguments` (an McpApproval is readable by everyone who may list them).
//! - Only a status with a decision and a `decidedBy` is an answer. The chart's admission policy
//!   makes `decidedBy` the writer's own user name and a decision final; the agent still refuses
//!   an answer without one, so a cluster without the policy does not turn an anonymous status
//!   write into an approval.
//! - Decided approvals are kept [`KEEP_DECIDED`] for people to see, expired ones
//!   [`KEEP_EXPIRED`]; then the operator deletes them.

use std::time::Duration;

use kube::core::ObjectMeta;

use super::{Subject, Verdict, clean_reason, webhook::Origin};
use crate::api::{ApprovalDecision, McpApproval, McpApprovalSpec};

/// How long a decided McpApproval stays for `kubectl get mcpapprovals`.
pub const KEEP_DECIDED: Duration = Duration::from_secs(600);
/// How long an undecided one stays after it expired.
pub const KEEP_EXPIRED: Duration = Duration::from_secs(60);
/// Label naming the profile of the pod that asks.
pub const LABEL_PROFILE: &str = "mcp.spear.dev/profile";
/// Label naming the McpServer of the call.
pub const LABEL_SERVER: &str = "mcp.spear.dev/server";
/// Longest annotations text stored in the question.
const MAX_ANNOTATIONS_CHARS: usize = 4096;

/// The McpApproval asking about `subject`, created at `now`, expiring after `wait`.
pub fn question(
    subject: &Subject<'_>,
    origin: &Origin,
    door: &str,
    now: jiff::Timestamp,
    wait: Duration,
) -> McpApproval {
    let expires = jiff::SignedDuration::try_from(wait).ok().and_then(|w| now.checked_add(w).ok()).unwrap_or(now);
    let asker = origin.pod.as_deref().unwrap_or(subject.profile);
    // generateName: the API server appends five characters; names stay well under 253.
    let prefix: String = asker.chars().take(57).collect();
    let annotations = subject.annotations.map(|a| {
        let text = a.to_string();
        text.chars().take(MAX_ANNOTATIONS_CHARS).collect::<String>()
    });
    McpApproval {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", prefix.trim_end_matches(['-', '.']))),
            namespace: origin.namespace.clone(),
            labels: Some(
                [(LABEL_PROFILE, subject.profile), (LABEL_SERVER, subject.server)]
                    .into_iter()
                    .filter(|(_, v)| crate::api::validate::is_dns1123_label(v))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: McpApprovalSpec {
            pod: origin.pod.clone().unwrap_or_default(),
            profile: subject.profile.to_string(),
            server: subject.server.to_string(),
            tool: subject.tool.chars().take(1024).collect(),
            name: subject.name.chars().take(1024).collect(),
            arguments_digest: super::argument_digest(subject.arguments),
            annotations,
            door: door.to_string(),
            expires_at: expires.to_string(),
        },
        status: None,
    }
}

/// What an McpApproval says now: `None` while it is undecided.
pub fn read(approval: &McpApproval) -> Option<Verdict> {
    let status = approval.status.as_ref()?;
    let decision = status.decision?;
    let by = status.decided_by.as_deref().map(clean_reason).filter(|b| !b.is_empty());
    let Some(by) = by else {
        return Some(Verdict::error(
            "the McpApproval has a decision but no decidedBy (is the chart's admission policy installed?)",
        ));
    };
    let reason = status.reason.as_deref().map(clean_reason).filter(|r| !r.is_empty());
    let said = |verb: &str| match &reason {
        Some(reason) => clean_reason(&format!("{verb} by {by}: {reason}")),
        None => clean_reason(&format!("{verb} by {by}")),
    };
    Some(match decision {
        ApprovalDecision::Allow => Verdict::allow(said("approved")),
        ApprovalDecision::Deny => Verdict::deny(said("denied")),
    })
}

/// Whether the operator deletes `approval` at `now`: decided more than [`KEEP_DECIDED`] ago, or
/// expired more than [`KEEP_EXPIRED`] ago (an unreadable time counts as long past).
pub fn should_delete(approval: &McpApproval, now: jiff::Timestamp) -> bool {
    let past = |at: Option<&str>, keep: Duration| {
        let at = at.and_then(|t| t.parse::<jiff::Timestamp>().ok());
        let keep = jiff::SignedDuration::try_from(keep).unwrap_or_default();
        at.and_then(|t| t.checked_add(keep).ok()).is_none_or(|until| until <= now)
    };
    let decided = approval.status.as_ref().and_then(|s| s.decision.map(|_| s.decided_at.as_deref()));
    match decided {
        Some(decided_at) => past(decided_at, KEEP_DECIDED),
        None => past(Some(&approval.spec.expires_at), KEEP_EXPIRED),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::Decision;
    use super::*;
    use crate::api::McpApprovalStatus;

    fn subject(arguments: &serde_json::Map<String, serde_json::Value>) -> Subject<'_> {
        Subject {
            profile: "dev",
            server: "files",
            tool: "delete",
            name: "files__delete",
            annotations: None,
            arguments: Some(arguments),
            revision: "1",
        }
    }

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(seconds).expect("time")
    }

    #[test]
    fn the_question_names_the_call_by_digest_and_expires_with_the_wait() {
        let arguments = json!({"path": "/etc/passwd"}).as_object().cloned().expect("object");
        let origin = Origin { namespace: Some("team-a".into()), pod: Some("agent-7c9f".into()) };
        let asked = question(&subject(&arguments), &origin, "grpc", at(1_800_000_000), Duration::from_secs(60));
        assert_eq!(asked.metadata.generate_name.as_deref(), Some("agent-7c9f-"));
        assert_eq!(asked.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(asked.spec.expires_at, "2027-01-15T08:01:00Z");
        assert_eq!(asked.spec.arguments_digest, super::super::argument_digest(Some(&arguments)));
        let text = serde_json::to_string(&asked).expect("json");
        assert!(!text.contains("/etc/passwd"), "the arguments are never stored: {text}");
    }

    fn decided(decision: Option<ApprovalDecision>, by: Option<&str>, at: Option<&str>) -> McpApproval {
        let mut approval =
            McpApproval::new("a", McpApprovalSpec { expires_at: "2027-01-15T08:01:00Z".into(), ..Default::default() });
        approval.status = Some(McpApprovalStatus {
            decision,
            decided_by: by.map(str::to_string),
            reason: Some("looks\nfine".into()),
            decided_at: at.map(str::to_string),
        });
        approval
    }

    #[test]
    fn only_a_decision_with_its_decider_is_an_answer() {
        assert_eq!(read(&decided(None, Some("ada"), None)), None);
        let allowed = read(&decided(Some(ApprovalDecision::Allow), Some("ada"), None)).expect("decided");
        assert_eq!((allowed.decision, allowed.reason.as_str()), (Decision::Allow, "approved by ada: looks fine"));
        let denied = read(&decided(Some(ApprovalDecision::Deny), Some("bob"), None)).expect("decided");
        assert_eq!(denied.decision, Decision::Deny);
        let anonymous = read(&decided(Some(ApprovalDecision::Allow), Some(" "), None)).expect("read");
        assert_eq!(anonymous.decision, Decision::Error, "no decider, no approval");
    }

    #[test]
    fn decided_and_expired_approvals_are_deleted_after_their_grace() {
        let expires = at(1_800_000_060);
        let pending = decided(None, None, None);
        assert!(!should_delete(&pending, expires));
        assert!(should_delete(&pending, at(1_800_000_060 + 60)));
        let done = decided(Some(ApprovalDecision::Allow), Some("ada"), Some("2027-01-15T08:00:30Z"));
        assert!(!should_delete(&done, at(1_800_000_030 + 599)));
        assert!(should_delete(&done, at(1_800_000_030 + 600)));
        let garbled = decided(Some(ApprovalDecision::Deny), Some("ada"), Some("yesterday"));
        assert!(should_delete(&garbled, at(0)));
    }
}
