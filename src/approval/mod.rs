//! Approval of a call that needs it: the question each kind of approver is asked and how its
//! answer is read. Pure: the agent (`crate::agent::approvers`) does the asking.
//!
//! ```text
//! approvalPolicy says "needs approval" ─▶ McpProfile.spec.approval.approvers, in order
//!   caller  ─ 2025-11-25 session with elicitation ─▶ form (form.rs) ─▶ accept + approve: true
//!           ─ 2026-07-28 request declaring it ─────▶ the same form as an input round, its state
//!                                                    sealed by the agent (round.rs)
//!   webhook ─ signed POST (webhook.rs) ─────────────▶ 200 {"decision": "allow"}
//!   kubernetes ─ McpApproval in the pod's namespace (kubernetes.rs) ─▶ kubectl spear approve
//! first that can be asked decides; no answer, a bad answer, an unreachable approver: denied
//! ```
//!
//! Decisions:
//! - Everything that is not an explicit allow denies (fail closed): a declined or cancelled form,
//!   a form without `approve: true`, a webhook's non-200, malformed or oversized answer, a
//!   timeout, a refused connection.
//! - An approver's reason is untrusted text that reaches the caller, the model, the audit log and
//!   logs: [`clean_reason`] bounds it and strips control characters.
//! - The question names the call by a digest of its arguments ([`argument_digest`], SHA-256 over
//!   their RFC 8785 form), so an approval can be tied to exactly these arguments without sending
//!   them; the webhook gets them only with `includeArguments`.

pub(crate) mod form;
pub(crate) mod kubernetes;
pub(crate) mod round;
pub(crate) mod webhook;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use crate::api::ApproverKind;

/// Longest approver reason passed on, in characters.
pub const MAX_REASON_CHARS: usize = 256;

/// The call an approver is asked about.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    pub profile: &'a str,
    pub server: &'a str,
    /// The tool's name on its server.
    pub tool: &'a str,
    /// The name the caller used (model-facing).
    pub name: &'a str,
    /// The tool's annotations as its server lists them.
    pub annotations: Option<&'a Value>,
    pub arguments: Option<&'a Map<String, Value>>,
    /// The registry revision the decision to ask used.
    pub revision: &'a str,
}

/// An approver's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// The approver said no.
    Deny,
    /// No answer in time.
    Timeout,
    /// The approver could not be asked or gave no answer that can be read (denies).
    Error,
}

impl Decision {
    /// As `mcp_approval_total`'s `decision` label and the audit line spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Deny => "deny",
            Decision::Timeout => "timeout",
            Decision::Error => "error",
        }
    }
}

/// A decision and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    /// The approver's reason (cleaned) or the agent's account of what happened.
    pub reason: String,
}

impl Verdict {
    pub fn allow(reason: impl Into<String>) -> Self {
        Verdict { decision: Decision::Allow, reason: reason.into() }
    }

    pub fn deny(reason: impl Into<String>) -> Self {
        Verdict { decision: Decision::Deny, reason: reason.into() }
    }

    pub fn error(reason: impl Into<String>) -> Self {
        Verdict { decision: Decision::Error, reason: reason.into() }
    }
}

/// The approval chain of a profile as `spearlet explain` shows it: one entry per approver, in
/// order (a webhook by its URL's origin and path: a query may carry a credential).
pub fn chain(approval: Option<&crate::api::ProfileApproval>) -> Vec<String> {
    let approvers = approval.map(|a| a.approvers.as_slice()).unwrap_or_default();
    approvers
        .iter()
        .map(|approver| match (&approver.caller, &approver.webhook) {
            (Some(_), None) if approver.kubernetes.is_none() => {
                "caller (the /mcp session, when it can answer a form)".to_string()
            }
            (None, None) if approver.kubernetes.is_some() => {
                "kubernetes (an McpApproval in the pod's namespace: kubectl spear approve / deny)".to_string()
            }
            (None, Some(hook)) if approver.kubernetes.is_none() => {
                let at = url::Url::parse(&hook.url)
                    .map(|u| format!("{}{}", u.origin().ascii_serialization(), u.path()))
                    .unwrap_or_else(|_| "an invalid URL".to_string());
                let signed = if hook.signing_secret_ref.is_some() { "signed" } else { "unsigned" };
                let sends = if hook.include_arguments { "arguments" } else { "argument digest" };
                format!("webhook {at} ({signed}, {sends})")
            }
            _ => "invalid approver".to_string(),
        })
        .collect()
}

/// `sha256:<hex>` of the arguments' RFC 8785 form (`{}` when there are none).
pub fn argument_digest(arguments: Option<&Map<String, Value>>) -> String {
    let empty = Map::new();
    let arguments = arguments.unwrap_or(&empty);
    // JCS fails only on numbers JSON cannot write, which a parsed `Value` never holds.
    let canonical = serde_json_canonicalizer::to_vec(arguments).unwrap_or_default();
    crate::api::pinning::format_digest(&Sha256::digest(&canonical).into())
}

/// An approver's reason as it may be passed on: at most [`MAX_REASON_CHARS`] characters, control
/// characters (newlines included: one audit or log line stays one line) as spaces, trimmed.
pub fn clean_reason(reason: &str) -> String {
    let cleaned: String = reason.chars().take(MAX_REASON_CHARS).map(|c| if c.is_control() { ' ' } else { c }).collect();
    cleaned.trim().to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_argument_digest_ignores_key_order_and_sees_every_value() {
        let a = json!({"path": "/tmp/x", "force": true});
        let b: Map<String, Value> = serde_json::from_str(r#"{ "force" : true, "path":"/tmp/x" }"#).expect("json");
        assert_eq!(argument_digest(a.as_object()), argument_digest(Some(&b)));
        let c = json!({"path": "/tmp/y", "force": true});
        assert_ne!(argument_digest(a.as_object()), argument_digest(c.as_object()));
        assert_eq!(argument_digest(None), argument_digest(json!({}).as_object()));
        assert!(argument_digest(None).starts_with("sha256:"));
    }

    #[test]
    fn the_chain_names_each_approver_without_a_urls_query() {
        let approval: crate::api::ProfileApproval = serde_json::from_value(json!({
            "approvers": [{"caller": {}}, {"webhook": {"url": "https://ok.example/approve?token=s3cret",
                "signingSecretRef": {"name": "k", "key": "hmac"}}}]
        }))
        .expect("approval");
        let chain = chain(Some(&approval));
        assert_eq!(chain.len(), 2);
        assert!(chain[0].starts_with("caller"));
        assert_eq!(chain[1], "webhook https://ok.example/approve (signed, argument digest)");
        assert!(super::chain(None).is_empty());
    }

    #[test]
    fn a_reason_is_one_bounded_line() {
        assert_eq!(clean_reason("  no:\nnot on Fridays\u{1b}[31m "), "no: not on Fridays [31m");
        assert_eq!(clean_reason(&"x".repeat(10_000)).chars().count(), MAX_REASON_CHARS);
    }
}
