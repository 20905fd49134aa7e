//! Model-facing tool names (`mcp__<server>__<tool>`) and the route table that maps them back.
//!
//! ```text
//! (server part, tool name) ──encode──▶ base name  (a pure function of the pair: stable on every
//!                                        │          agent, across restarts, whatever else exists)
//!                 too long ──────────────┤──▶ 55-char prefix + "_" + 8-hex hash of the pair
//!   collides with a caller's tool ───────┘──▶ same shape, hash salted until free
//! ```
//!
//! Encoding of each part: the plain text when it is made of `[A-Za-z0-9_-]`, does not contain
//! `__` and neither starts nor ends with `_` (readable in the common case); otherwise `_`
//! followed by its URL-safe base64 without padding. A plain part never starts with `_` and an
//! encoded one always does, so the two cannot collide, and base64 is injective; the server part
//! never contains `__` (server ids are DNS labels, `toolNamespace` is validated to the plain
//! shape), so the first `__` after `mcp__` always ends it. Distinct (server, tool) pairs thus
//! give distinct base names; only shortened and salted names can collide, and those few are
//! checked against each other.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// Prefix of every model-facing MCP tool name.
pub(crate) const PREFIX: &str = "mcp__";
/// Separator between the server and tool parts.
pub(crate) const SEPARATOR: &str = "__";
/// Longest name OpenAI-style function names allow.
pub(crate) const MAX_NAME_LEN: usize = 64;
/// Hex characters of the hash suffix: 32 bits; real collisions are also checked.
const HASH_LEN: usize = 8;
/// Characters kept from the readable name in front of `_<hash>`.
const KEPT_LEN: usize = MAX_NAME_LEN - HASH_LEN - 1;

/// Whether a part can appear as is.
fn is_plain(part: &str) -> bool {
    !part.is_empty()
        && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !part.contains(SEPARATOR)
        && !part.starts_with('_')
        && !part.ends_with('_')
}

/// Appends `part`, plain or `_`-prefixed base64.
fn push_part(out: &mut String, part: &str) {
    if is_plain(part) {
        out.push_str(part);
    } else {
        out.push('_');
        URL_SAFE_NO_PAD.encode_string(part.as_bytes(), out);
    }
}

/// The name before any shortening: `mcp__<server>__<tool>`, each part encoded.
fn full_name(server_part: &str, tool: &str) -> String {
    let mut out = String::with_capacity(PREFIX.len() + server_part.len() + SEPARATOR.len() + tool.len() + 8);
    out.push_str(PREFIX);
    push_part(&mut out, server_part);
    out.push_str(SEPARATOR);
    push_part(&mut out, tool);
    out
}

/// `prefix(name) + "_" + hash(key, tool, salt)`, exactly [`MAX_NAME_LEN`] characters.
fn hashed_name(full: &str, key: &str, tool: &str, salt: u32) -> String {
    let mut hasher = Sha256::new();
    hasher.update(key.as_bytes());
    hasher.update([0]);
    hasher.update(tool.as_bytes());
    if salt > 0 {
        hasher.update(salt.to_be_bytes());
    }
    let digest = hasher.finalize();
    // `full` is ASCII (plain parts and base64), so byte slicing is on char boundaries.
    let kept = &full[..full.len().min(KEPT_LEN)];
    let mut out = String::with_capacity(MAX_NAME_LEN);
    out.push_str(kept);
    out.push('_');
    for byte in digest.iter().take(HASH_LEN / 2) {
        out.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    out
}

/// The model-facing name of `tool` on the server whose name part is `server_part`, before
/// collision handling. A pure function of the pair.
pub(crate) fn base_name(server_part: &str, tool: &str) -> String {
    let full = full_name(server_part, tool);
    if full.len() <= MAX_NAME_LEN { full } else { hashed_name(&full, server_part, tool, 0) }
}

/// Whether `base_name` may have collided with another pair's (it was shortened, or reached the
/// length where shortened names live). Only these need a uniqueness check.
pub(crate) fn may_collide(name: &str) -> bool {
    name.len() == MAX_NAME_LEN
}

/// A name that is not in `taken`, for `tool` on a server whose name part is `server_part`:
/// `base` itself when `keep_base` and it is free, else hash variants keyed by `hash_key` (the
/// server id, so two servers sharing a name part get different names) and a salt counted up
/// until free. Deterministic: the same inputs and `taken` set give the same name.
pub(crate) fn free_name(
    base: &str,
    server_part: &str,
    hash_key: &str,
    tool: &str,
    keep_base: bool,
    taken: impl Fn(&str) -> bool,
) -> String {
    if keep_base && !taken(base) {
        return base.to_string();
    }
    let full = full_name(server_part, tool);
    let first_salt = u32::from(keep_base);
    (first_salt..)
        .map(|salt| hashed_name(&full, hash_key, tool, salt))
        .find(|candidate| !taken(candidate))
        .unwrap_or_else(|| base.to_string())
}

/// The server a name as a model or client writes it belongs to, read from the name alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    /// `mcp__<part>__…` (also shortened names whose kept prefix holds the whole part).
    ServerPart(&'a str),
    /// The dotted form `mcp.<server id>.<tool>`.
    ServerId(&'a str),
}

impl Target<'_> {
    /// Whether the server with this id and name part is the one named.
    pub(crate) fn names(&self, id: &str, server_part: &str) -> bool {
        match self {
            Target::ServerPart(part) => *part == server_part,
            Target::ServerId(server) => *server == id,
        }
    }
}

/// Which server `name` belongs to, if it has the shape of a model-facing or dotted name. Exact
/// because a server part never contains `__` (see the module header).
pub(crate) fn target(name: &str) -> Option<Target<'_>> {
    if let Some(rest) = name.strip_prefix(PREFIX) {
        let (part, _) = rest.split_once(SEPARATOR)?;
        return is_plain(part).then_some(Target::ServerPart(part));
    }
    let (server, _tool) = name.strip_prefix("mcp.")?.split_once('.')?;
    (!server.is_empty()).then_some(Target::ServerId(server))
}

#[cfg(test)]
/// Whether `name` has the shape every model-facing name has: `^[a-zA-Z0-9_-]{1,64}$`.
pub(crate) fn is_valid_function_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

// === impl RouteTable ===

/// Where a model-facing name goes: the server id and the tool's original name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The McpServer's `metadata.name`.
    pub(crate) server: Arc<str>,
    /// The tool name as the server lists it.
    pub(crate) tool: Arc<str>,
}

/// Maps model-facing names (and the dotted `mcp.<server>.<tool>` form) back to routes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RouteTable {
    by_name: HashMap<Arc<str>, Route>,
    /// server → tool → model-facing name, for the dotted form.
    by_tool: HashMap<Arc<str>, HashMap<Arc<str>, Arc<str>>>,
}

impl RouteTable {
    /// Records that `name` routes to `route`.
    pub(crate) fn insert(&mut self, name: Arc<str>, route: Route) {
        self.by_tool.entry(route.server.clone()).or_default().insert(route.tool.clone(), name.clone());
        self.by_name.insert(name, route);
    }

    /// Whether `name` is a model-facing name in the table.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The model-facing name and route of a name as a model or client writes it: a model-facing
    /// name, or the dotted form `mcp.<server>.<tool>` (server id, original tool name; the tool
    /// may contain dots).
    pub(crate) fn lookup(&self, name: &str) -> Option<(&Arc<str>, &Route)> {
        if let Some(found) = self.by_name.get_key_value(name) {
            return Some(found);
        }
        let (server, tool) = name.strip_prefix("mcp.")?.split_once('.')?;
        let model_name = self.by_tool.get(server)?.get(tool)?;
        self.by_name.get_key_value(&**model_name)
    }

    #[cfg(test)]
    /// The route of a name (see [`RouteTable::lookup`]).
    pub(crate) fn resolve(&self, name: &str) -> Option<&Route> {
        self.lookup(name).map(|(_, route)| route)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_parts_stay_readable() {
        assert_eq!(base_name("filesystem", "read_file"), "mcp__filesystem__read_file");
        assert_eq!(base_name("everything", "get-sum"), "mcp__everything__get-sum");
    }

    #[test]
    fn unsafe_parts_are_base64_with_a_leading_underscore() {
        assert_eq!(base_name("fs", "read.file"), "mcp__fs___cmVhZC5maWxl");
        assert_eq!(base_name("fs", "a__b"), format!("mcp__fs___{}", URL_SAFE_NO_PAD.encode("a__b")));
        assert_eq!(base_name("fs", "_x"), format!("mcp__fs___{}", URL_SAFE_NO_PAD.encode("_x")));
        assert_eq!(base_name("fs", ""), "mcp__fs___");
        assert_ne!(base_name("fs", "cmVhZC5maWxl"), base_name("fs", "read.file"), "plain vs encoded");
    }

    #[test]
    fn long_names_are_shortened_with_a_stable_hash() {
        let tool = "t".repeat(200);
        let name = base_name("fs", &tool);
        assert_eq!(name.len(), MAX_NAME_LEN);
        assert!(is_valid_function_name(&name));
        assert_eq!(name, base_name("fs", &tool), "stable");
        assert_ne!(name, base_name("fs", &"t".repeat(201)));
        assert!(may_collide(&name));
    }

    #[test]
    fn free_name_salts_until_free() {
        let base = base_name("fs", "read_file");
        let renamed = free_name(&base, "fs", "fs", "read_file", true, |n| n == base);
        assert_ne!(renamed, base);
        assert!(is_valid_function_name(&renamed));
        assert_eq!(renamed, free_name(&base, "fs", "fs", "read_file", true, |n| n == base), "deterministic");
        let other = free_name(&base, "fs", "other-server", "read_file", false, |_| false);
        assert_ne!(other, renamed, "keyed by server id");
        assert_eq!(free_name(&base, "fs", "fs", "read_file", true, |_| false), base);
    }

    #[test]
    fn target_reads_the_server_from_every_name_shape() {
        assert_eq!(target(&base_name("fs", "read_file")), Some(Target::ServerPart("fs")));
        assert_eq!(target(&base_name("fs", "read.file")), Some(Target::ServerPart("fs")));
        let shortened = base_name("fs", &"t".repeat(200));
        assert_eq!(target(&shortened), Some(Target::ServerPart("fs")), "{shortened}");
        assert_eq!(target("mcp.fs.read.file"), Some(Target::ServerId("fs")));
        for not_a_tool in ["read_file", "mcp__fs", "mcp___Zm9v__x", "mcp..x", "mcp.fs", "mcp____x"] {
            assert_eq!(target(not_a_tool), None, "{not_a_tool}");
        }
    }

    #[test]
    fn dotted_form_resolves_with_dots_in_the_tool() {
        let mut table = RouteTable::default();
        let route = Route { server: "fs".into(), tool: "read.file".into() };
        table.insert(base_name("fs", "read.file").into(), route.clone());
        assert_eq!(table.resolve("mcp.fs.read.file"), Some(&route));
        assert_eq!(table.resolve(&base_name("fs", "read.file")), Some(&route));
        assert_eq!(table.resolve("mcp.fs.write"), None);
        assert_eq!(table.resolve("mcp__fs__read"), None);
    }
}
