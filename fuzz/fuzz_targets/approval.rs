//! Approvers' answers and the agent's sealed round state (`src/approval/`): everything an
//! approver or a caller sends back is untrusted.
//!
//! Properties:
//! - a webhook's answer allows exactly when the status is 200 and the body is a JSON object
//!   whose `decision` is the string `"allow"`; a reason passed on is at most 256 characters
//!   with no control character;
//! - a caller's answer allows only when it is `{"action": "accept", "content": {"approve":
//!   true}}` (other keys aside);
//! - a state opens only as what it was sealed as, for its call, before it expires; any other
//!   string opens as nothing under a key it was not sealed with, and changing one byte of a
//!   sealed state never makes it open as approved when it was sealed as asked.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use spear::fuzzing::{approval_input_answer, approval_round_open, approval_round_seal, approval_webhook_answer};

#[derive(Arbitrary, Debug)]
enum Input {
    Webhook {
        status: u16,
        body: Vec<u8>,
    },
    Caller {
        answer: Vec<u8>,
    },
    Round {
        name: String,
        digest: String,
        expires: i64,
        now: i64,
        server_state: Option<String>,
        approved: bool,
        flip: usize,
        junk: String,
    },
}

fn clean(reason: &str) {
    assert!(reason.chars().count() <= 256, "{reason:?}");
    assert!(!reason.chars().any(char::is_control), "{reason:?}");
}

fuzz_target!(|input: Input| {
    match input {
        Input::Webhook { status, body } => {
            let (decision, reason) = approval_webhook_answer(status, &body);
            let parsed: Option<Value> = serde_json::from_slice(&body).ok();
            let says_allow = parsed.as_ref().and_then(|v| v.as_object()).and_then(|o| o.get("decision"))
                == Some(&Value::from("allow"));
            let allows = status == 200 && body.len() <= 16 * 1024 && says_allow;
            assert_eq!(decision == "allow", allows, "status {status}, body {:?}", String::from_utf8_lossy(&body));
            clean(&reason);
        }
        Input::Caller { answer } => {
            let Ok(value) = serde_json::from_slice::<Value>(&answer) else { return };
            let (decision, reason) = approval_input_answer(Some(&value));
            let allows = value.get("action") == Some(&Value::from("accept"))
                && value.get("content").and_then(|c| c.get("approve")) == Some(&Value::Bool(true));
            // Only that form allows; a form rmcp cannot read (a malformed `_meta`) denies too.
            assert!(decision != "allow" || allows, "{value}");
            assert!(matches!(decision, "allow" | "deny"), "{decision}");
            clean(&reason);
        }
        Input::Round { name, digest, expires, now, server_state, approved, flip, junk } => {
            let key = [7u8; 32];
            let call = (name.as_str(), digest.as_str());
            let sealed = approval_round_seal(key, call, expires, approved.then(|| server_state.clone()));
            let opened = approval_round_open(key, &sealed, call, now);
            let want = (now < expires).then(|| approved.then(|| server_state.clone()));
            assert_eq!(opened, want, "round trip");
            assert_eq!(approval_round_open([8u8; 32], &sealed, call, i64::MIN), None, "another key");
            assert_eq!(approval_round_open(key, &junk, call, i64::MIN), None, "unsealed: {junk:?}");
            if !approved && !sealed.is_empty() {
                let mut bytes = sealed.into_bytes();
                let at = flip % bytes.len();
                bytes[at] ^= 1;
                if let Ok(changed) = String::from_utf8(bytes) {
                    let reopened = approval_round_open(key, &changed, call, i64::MIN);
                    assert!(!matches!(reopened, Some(Some(_))), "a changed byte made an asked state approved");
                }
            }
        }
    }
});
