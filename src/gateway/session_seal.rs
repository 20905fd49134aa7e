//! `/mcp` session ids bound to their caller. A profile's door keeps the sessions of every caller
//! bound to that profile in one table, so the gateway seals each id it hands out with the
//! caller's name: `<id>.<mac>`, the MAC (HMAC-SHA256, a key drawn at start) over the caller, the
//! profile and the id. A request whose session id does not open for its own caller is answered
//! 404, as an unknown session is: another caller's id, even leaked, is no way into its session,
//! its relayed sampling or elicitation, or its audit identity. Stateless: nothing to sweep, and a
//! restarted or other replica (another key) answers 404 as it would for an id it never issued.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Bytes of the MAC kept in the id (128 bits), hex-encoded.
const MAC_BYTES: usize = 16;

/// The sealing key of one gateway process.
#[derive(Clone)]
pub struct SessionSeal([u8; 32]);

impl std::fmt::Debug for SessionSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSeal(..)")
    }
}

impl SessionSeal {
    /// A key drawn from the OS.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)?;
        Ok(SessionSeal(key))
    }

    /// A fixed key (tests and fuzzing).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn from_bytes(key: [u8; 32]) -> Self {
        SessionSeal(key)
    }

    fn mac(&self, caller: &str, profile: &str, id: &str) -> [u8; MAC_BYTES] {
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
        // Lengths first, so no two (caller, profile, id) triples feed the same bytes.
        for part in [caller, profile, id] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&full[..MAC_BYTES]);
        out
    }

    /// The id `caller` sees for the door's session `id` of `profile`.
    pub fn seal(&self, caller: &str, profile: &str, id: &str) -> String {
        let mac = self.mac(caller, profile, id);
        let mut sealed = String::with_capacity(id.len() + 1 + 2 * MAC_BYTES);
        sealed.push_str(id);
        sealed.push('.');
        for byte in mac {
            sealed.push_str(&format!("{byte:02x}"));
        }
        sealed
    }

    /// The door's session id inside `sealed`, when `caller` was given it for `profile`.
    pub fn open<'a>(&self, caller: &str, profile: &str, sealed: &'a str) -> Option<&'a str> {
        let (id, mac_hex) = sealed.rsplit_once('.')?;
        if mac_hex.len() != 2 * MAC_BYTES || id.is_empty() {
            return None;
        }
        let mut given = [0u8; MAC_BYTES];
        for (i, byte) in given.iter_mut().enumerate() {
            let pair = mac_hex.get(2 * i..2 * i + 2)?;
            // Lower-case hex only: one spelling per id.
            if pair.bytes().any(|b| !matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return None;
            }
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        bool::from(self.mac(caller, profile, id).ct_eq(&given)).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_opens_for_its_caller_and_profile_only() {
        let seal = SessionSeal::from_bytes([7; 32]);
        let sealed = seal.seal("system:serviceaccount:team:app", "reader", "abc-123");
        assert_eq!(seal.open("system:serviceaccount:team:app", "reader", &sealed), Some("abc-123"));
        assert_eq!(seal.open("system:serviceaccount:team:other", "reader", &sealed), None);
        assert_eq!(seal.open("system:serviceaccount:team:app", "writer", &sealed), None);
        assert_eq!(SessionSeal::from_bytes([8; 32]).open("system:serviceaccount:team:app", "reader", &sealed), None);
    }

    #[test]
    fn no_other_spelling_opens() {
        let seal = SessionSeal::from_bytes([7; 32]);
        let sealed = seal.seal("alice", "reader", "abc");
        let (id, mac) = sealed.rsplit_once('.').expect("sealed");
        for spelling in [
            format!("{id}.{}", mac.to_uppercase()),
            format!("{id}.{}", &mac[..30]),
            format!("{id}.{mac}0"),
            format!("{id}x.{mac}"),
            format!(".{mac}"),
            id.to_string(),
            format!("{id}.{mac}.{mac}"),
        ] {
            assert_eq!(seal.open("alice", "reader", &spelling), None, "{spelling}");
        }
        // Caller and profile cannot trade characters.
        assert_eq!(seal.open("alicer", "eader", &sealed), None);
    }
}
