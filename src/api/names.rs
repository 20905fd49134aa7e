//! Names that two parts derive the same way: the webhook writes them into a pod, the agent
//! reads them back. [`keys`](super::keys) holds the fixed names; this file the derived ones.
//!
//! ```text
//! server + field ──secret_env_var──▶ SPEAR_SECRET_<SERVER>_<FIELD>  (env var on the agent)
//! server + field ──secret_ref_id───▶ <server>/<field>               (an entry of SPEAR_SECRET_REFS)
//! server ──────────────────────────▶ <RUN_DIR>/<server>/SOCKET_FILE (the bridge's socket)
//! bytes ─────────short_hash────────▶ 16 hex characters of sha256    (revisions, versions, markers)
//! ```

use std::fmt;

use sha2::{Digest, Sha256};

/// The bridge socket's file name in its server's directory.
pub(crate) const SOCKET_FILE: &str = "mcp.sock";

/// The env var that carries a secret-backed value of `server`'s `field` (an env or header name):
/// `SPEAR_SECRET_<SERVER>_<FIELD>`, upper-cased, other characters as `_`.
pub(crate) fn secret_env_var(server: &str, field: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
    };
    format!("SPEAR_SECRET_{}_{}", clean(server), clean(field))
}

/// How the webhook's `SPEAR_SECRET_REFS` names one delivered header value: `<server>/<header>`
/// (neither part can contain `/` or `,`).
pub(crate) fn secret_ref_id(server: &str, header: &str) -> String {
    format!("{server}/{header}")
}

/// Hex characters kept from a sha256 digest: 64 bits, far beyond any registry's size.
const HASH_HEX_LEN: usize = 16;

/// The first [`HASH_HEX_LEN`] hex characters of the sha256 of `bytes`.
pub(crate) fn short_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(HASH_HEX_LEN);
    for byte in digest.iter().take(HASH_HEX_LEN / 2) {
        // Writing to a String cannot fail.
        let _ = fmt::Write::write_fmt(&mut hex, format_args!("{byte:02x}"));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_env_vars_are_upper_case_with_underscores() {
        assert_eq!(secret_env_var("my-server", "token"), "SPEAR_SECRET_MY_SERVER_TOKEN");
        assert_eq!(secret_env_var("remote", "auth:clientSecret"), "SPEAR_SECRET_REMOTE_AUTH_CLIENTSECRET");
        // Not injective: the agent reads only what SPEAR_SECRET_REFS lists for the server.
        assert_eq!(secret_env_var("my-server", "token"), secret_env_var("my", "server-token"));
    }

    #[test]
    fn secret_ref_ids_keep_server_and_field_apart() {
        assert_eq!(secret_ref_id("my-server", "token"), "my-server/token");
        assert_ne!(secret_ref_id("my-server", "token"), secret_ref_id("my", "server-token"));
    }

    #[test]
    fn short_hashes_are_stable() {
        // Stable across builds and machines: a fixed input has a fixed hash.
        assert_eq!(short_hash(b"abc"), "ba7816bf8f01cfea");
        assert_eq!(short_hash(b"").len(), HASH_HEX_LEN);
    }
}
