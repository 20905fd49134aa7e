//! The webhook approver's request and the reading of its answer.
//!
//! The request is one JSON object (see [`Request`]); with a signing key, the header
//! [`SIGNATURE_HEADER`] carries `sha256=<hex>` of HMAC-SHA256 over the exact body bytes (GitHub's
//! webhook convention, so existing verifiers work). `sentAt` and `expiresAt` are in the signed
//! body, so a receiver can refuse a replayed request; `id` is unique per question.
//!
//! The answer is untrusted: only status 200 with a JSON object whose `decision` is exactly
//! `"allow"` allows; `"deny"` denies with the `reason` (cleaned); anything else, at most
//! [`MAX_ANSWER_BYTES`] read, is an error that denies.

use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::Sha256;

use super::{Subject, Verdict, clean_reason};

/// The header carrying the body's signature.
pub const SIGNATURE_HEADER: &str = "X-Spear-Signature-256";
/// Bytes of an answer read; a longer one is an error.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024;

/// The approval request a webhook receives.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    /// Unique per question.
    pub id: String,
    /// The pod's namespace and name (absent in local mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<&'a str>,
    pub profile: &'a str,
    pub server: &'a str,
    pub tool: &'a str,
    /// The model-facing name the caller used.
    pub name: &'a str,
    /// The tool's annotations as its server lists them (the server's claims, not facts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<&'a Value>,
    pub registry_revision: &'a str,
    /// `sha256:<hex>` of the arguments' RFC 8785 form.
    pub arguments_digest: String,
    /// The arguments, only with `includeArguments`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<&'a Map<String, Value>>,
    /// `mcp`, `chat` or `grpc`.
    pub door: &'a str,
    /// RFC 3339.
    pub sent_at: String,
    /// RFC 3339: the agent stops waiting then, and an answer after it is not read.
    pub expires_at: String,
}

/// Who and where the agent is, for [`Request`].
#[derive(Clone, Debug, Default)]
pub struct Origin {
    pub namespace: Option<String>,
    pub pod: Option<String>,
}

impl<'a> Request<'a> {
    /// The request for `subject`, asked through `door` at `now`, expiring after `wait`.
    pub fn new(
        subject: &Subject<'a>,
        origin: &'a Origin,
        door: &'a str,
        include_arguments: bool,
        now: jiff::Timestamp,
        wait: std::time::Duration,
    ) -> Self {
        let expires = jiff::SignedDuration::try_from(wait).ok().and_then(|w| now.checked_add(w).ok()).unwrap_or(now);
        Request {
            id: uuid::Uuid::new_v4().to_string(),
            namespace: origin.namespace.as_deref(),
            pod: origin.pod.as_deref(),
            profile: subject.profile,
            server: subject.server,
            tool: subject.tool,
            name: subject.name,
            annotations: subject.annotations,
            registry_revision: subject.revision,
            arguments_digest: super::argument_digest(subject.arguments),
            arguments: if include_arguments { subject.arguments } else { None },
            door,
            sent_at: now.to_string(),
            expires_at: expires.to_string(),
        }
    }
}

/// `sha256=<hex>` of HMAC-SHA256 over `body` under `key`.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// What a webhook's answer (`status`, the first bytes of `body`) decides.
pub fn read_answer(status: u16, body: &[u8]) -> Verdict {
    if status != 200 {
        return Verdict::error(format!("the approval webhook answered HTTP {status}"));
    }
    if body.len() > MAX_ANSWER_BYTES {
        return Verdict::error(format!("the approval webhook's answer is larger than {MAX_ANSWER_BYTES} bytes"));
    }
    // An object, read by key: serde would also read a struct from an array (`["allow"]`).
    let answer = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(answer)) if answer.contains_key("decision") => answer,
        _ => {
            return Verdict::error(
                "the approval webhook's answer is not a JSON object with a decision (expected {\"decision\": \"allow\"|\"deny\", \"reason\": \"...\"})",
            );
        }
    };
    let reason = answer.get("reason").and_then(Value::as_str).map(clean_reason).unwrap_or_default();
    let said = |default: &str| if reason.is_empty() { default.to_string() } else { reason.clone() };
    match answer.get("decision").and_then(Value::as_str) {
        Some("allow") => Verdict::allow(said("the approval webhook allowed")),
        Some("deny") => Verdict::deny(said("the approval webhook denied (no reason given)")),
        _ => Verdict::error("the approval webhook's decision is neither \"allow\" nor \"deny\""),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::Decision::{Allow, Deny, Error};
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_the_body_in_hex() {
        // RFC 4231 test case 2.
        let sig = signature(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(sig, "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn only_a_200_with_decision_allow_allows() {
        let read = |status, body: &str| read_answer(status, body.as_bytes());
        assert_eq!(read(200, r#"{"decision": "allow"}"#).decision, Allow);
        let denied = read(200, r#"{"decision": "deny", "reason": "not\non Fridays"}"#);
        assert_eq!((denied.decision, denied.reason.as_str()), (Deny, "not on Fridays"));
        for (status, body) in [
            (201, r#"{"decision": "allow"}"#),
            (500, r#"{"decision": "allow"}"#),
            (200, r#"{"decision": "Allow"}"#),
            (200, r#"{"decision": "allow "}"#),
            (200, r#"{"decision": true}"#),
            (200, r#"{"allow": true}"#),
            (200, r#"["allow"]"#),
            (200, "allow"),
            (200, ""),
        ] {
            assert_eq!(read(status, body).decision, Error, "{status} {body}");
        }
        let big = format!(r#"{{"decision": "allow", "pad": "{}"}}"#, "x".repeat(MAX_ANSWER_BYTES));
        assert_eq!(read(200, &big).decision, Error);
    }

    #[test]
    fn the_request_carries_a_digest_and_arguments_only_when_asked() {
        let arguments = json!({"path": "/x"}).as_object().cloned().expect("object");
        let subject = Subject {
            profile: "dev",
            server: "files",
            tool: "delete",
            name: "files__delete",
            annotations: None,
            arguments: Some(&arguments),
            revision: "7",
        };
        let origin = Origin { namespace: Some("team-a".into()), pod: Some("agent-0".into()) };
        let now = jiff::Timestamp::from_second(1_800_000_000).expect("time");
        let wait = std::time::Duration::from_secs(60);
        let without = serde_json::to_value(Request::new(&subject, &origin, "mcp", false, now, wait)).expect("json");
        assert!(without.get("arguments").is_none());
        assert_eq!(without["argumentsDigest"], json!(super::super::argument_digest(Some(&arguments))));
        assert_eq!(without["namespace"], "team-a");
        assert_eq!(without["expiresAt"], "2027-01-15T08:01:00Z");
        let with = serde_json::to_value(Request::new(&subject, &origin, "mcp", true, now, wait)).expect("json");
        assert_eq!(with["arguments"], json!({"path": "/x"}));
    }
}
