//! The caller approver for a 2026-07-28 caller: the approval form goes out as an input request
//! (key [`INPUT_KEY`]) of an `InputRequiredResult`, and the caller's retry carries the answer. The
//! revision is stateless, so what the agent must remember between the two requests travels in
//! `requestState`, sealed by the agent:
//!
//! - **Bound to the call**: the model-facing name and the argument digest. An answer given for
//!   one call cannot be replayed onto another, nor onto the same tool with other arguments.
//! - **Expiring**: the approval timeout for a question, the call's budget for a later round.
//! - **Carrying an approval across the server's own rounds**: once approved, a server that asks
//!   for input gets its `requestState` wrapped in a sealed state that says "approved", so the
//!   caller's next retry is not asked again, and cannot claim an approval without one.
//!
//! The seal is HMAC-SHA256 under a key drawn when the agent starts: an agent restart (or a state
//! from another agent) just asks again. A state that is not the agent's, forged, expired or for
//! another call opens as nothing, and the caller is asked afresh; nothing in it is trusted
//! before the seal is checked.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The key of the approval question among a round's input requests and responses.
pub const INPUT_KEY: &str = "spear.approval";
/// How a state sealed by the agent begins.
const PREFIX: &str = "spear-approval.v1.";

/// The agent's sealing key.
#[derive(Clone)]
pub struct RoundKey([u8; 32]);

impl std::fmt::Debug for RoundKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoundKey(..)")
    }
}

impl RoundKey {
    /// A key drawn from the OS.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)?;
        Ok(RoundKey(key))
    }

    /// A fixed key (tests and fuzzing).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn from_bytes(key: [u8; 32]) -> Self {
        RoundKey(key)
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes any key"))
    }
}

/// What the sealed state says.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct Sealed {
    /// Model-facing name.
    n: String,
    /// Argument digest.
    d: String,
    /// Expiry, Unix seconds.
    e: i64,
    /// Approved (a later round) or only asked.
    a: bool,
    /// When the question was asked, Unix milliseconds (the approval's latency).
    #[serde(default)]
    t: i64,
    /// The server's own state, passed back to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    s: Option<String>,
}

/// A sealed state that opened for this call.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// The approval question was asked at `asked_at` (Unix milliseconds); the answer is in this
    /// retry's input responses.
    Asked { asked_at: i64 },
    /// Approved earlier in this call; `server_state` is the server's own for its round.
    Approved { server_state: Option<String> },
}

/// The call a state is for.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub name: &'a str,
    pub digest: &'a str,
}

/// A sealed state for `call`, valid until `expires` (Unix seconds).
pub fn seal(key: &RoundKey, call: Call<'_>, expires: i64, opened: &Opened) -> String {
    let (a, t, s) = match opened {
        Opened::Asked { asked_at } => (false, *asked_at, None),
        Opened::Approved { server_state } => (true, 0, server_state.clone()),
    };
    let sealed = Sealed { n: call.name.to_string(), d: call.digest.to_string(), e: expires, a, t, s };
    let payload = serde_json::to_vec(&sealed).unwrap_or_default();
    let mut mac = key.mac();
    mac.update(&payload);
    let tag = mac.finalize().into_bytes();
    format!("{PREFIX}{}.{}", URL_SAFE_NO_PAD.encode(&payload), URL_SAFE_NO_PAD.encode(tag))
}

/// Opens `state` for `call` at `now` (Unix seconds); `None` when it is not the agent's, was not
/// sealed by `key`, has expired, or is for another call.
pub fn open(key: &RoundKey, state: &str, call: Call<'_>, now: i64) -> Option<Opened> {
    let rest = state.strip_prefix(PREFIX)?;
    let (payload, tag) = rest.split_once('.')?;
    let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
    let mut mac = key.mac();
    mac.update(&payload);
    mac.verify_slice(&tag).ok()?;
    let sealed: Sealed = serde_json::from_slice(&payload).ok()?;
    if sealed.n != call.name || sealed.d != call.digest || now >= sealed.e {
        return None;
    }
    Some(if sealed.a { Opened::Approved { server_state: sealed.s } } else { Opened::Asked { asked_at: sealed.t } })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: Call<'static> = Call { name: "files__delete", digest: "sha256:00" };

    #[test]
    fn a_sealed_state_opens_only_for_its_call_before_it_expires() {
        let key = RoundKey::from_bytes([7; 32]);
        let asked = seal(&key, CALL, 100, &Opened::Asked { asked_at: 5 });
        assert_eq!(open(&key, &asked, CALL, 99), Some(Opened::Asked { asked_at: 5 }));
        assert_eq!(open(&key, &asked, CALL, 100), None, "expired");
        assert_eq!(open(&key, &asked, Call { name: "files__read", ..CALL }, 99), None, "another tool");
        assert_eq!(open(&key, &asked, Call { digest: "sha256:01", ..CALL }, 99), None, "other arguments");
        let approved = Opened::Approved { server_state: Some("server's own".into()) };
        let state = seal(&key, CALL, 100, &approved);
        assert_eq!(open(&key, &state, CALL, 1), Some(approved));
    }

    #[test]
    fn a_forged_or_foreign_state_opens_as_nothing() {
        let key = RoundKey::from_bytes([7; 32]);
        let other = RoundKey::from_bytes([8; 32]);
        let asked = seal(&key, CALL, 100, &Opened::Asked { asked_at: 5 });
        assert_eq!(open(&other, &asked, CALL, 1), None, "another agent's key");
        // The caller flips "asked" to "approved" and keeps the tag.
        let (payload, tag) = asked.strip_prefix(PREFIX).and_then(|r| r.split_once('.')).expect("sealed");
        let flipped = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).expect("b64"))
            .expect("utf8")
            .replace("\"a\":false", "\"a\":true");
        let forged = format!("{PREFIX}{}.{tag}", URL_SAFE_NO_PAD.encode(flipped));
        assert_eq!(open(&key, &forged, CALL, 1), None);
        for junk in ["", "server-state", PREFIX, "spear-approval.v1..", "spear-approval.v1.e30.AAAA"] {
            assert_eq!(open(&key, junk, CALL, 1), None, "{junk:?}");
        }
    }
}
