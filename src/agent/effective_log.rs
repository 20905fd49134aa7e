//! What each caller is served, on the record: an audit line of kind `effective_set` when a
//! session's set is first used and whenever its digest changes, `mcp_injection_total` for each
//! server offered or left out, and a warning when a set offers no tool at all.
//!
//! - A session is a `/mcp` or gRPC session; requests without one (stateless `/mcp`) share one
//!   entry per door. A chat completion is its own scope: each logs its set.
//! - The check is on the call path, so it costs one lock and one map lookup: a set is known by
//!   its catalog (rebuilt whenever the registry or a tool list changes), and only a new catalog
//!   pays for the digest over the tools. A new catalog with the same tools logs nothing.
//! - Memory is bounded: past [`MAX_SCOPES`] entries the map is cleared, which costs at most one
//!   repeated line per live session.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use parking_lot::Mutex;
use serde::Serialize;

use super::audit::{self, Door};
use crate::policy::EffectiveSet;

/// Sessions remembered at once.
const MAX_SCOPES: usize = 4096;
/// Most tool names one line lists; the count says how many there were.
const MAX_NAMES: usize = 1024;

/// Per scope (door and session): the catalog last seen and the digest of its set.
#[derive(Debug, Default)]
pub(crate) struct SetLog {
    seen: Mutex<HashMap<u64, (usize, u64)>>,
}

/// The `effective_set` audit line.
#[derive(Serialize)]
struct SetLine<'a> {
    ts: String,
    kind: &'static str,
    request_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    door: Door,
    profile: &'a str,
    registry_revision: &'a str,
    /// Hex digest of the tools as a caller sees them (names, descriptions, schemas).
    digest: String,
    servers: Vec<SetServer<'a>>,
    tool_count: usize,
    /// `empty`: the set offers no tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    warning: Option<&'static str>,
}

#[derive(Serialize)]
struct SetServer<'a> {
    server_id: &'a str,
    tools: Vec<&'a str>,
}

impl SetLog {
    /// Whether `set` is new for the scope (`door`, `session`): first used, or its digest moved.
    /// Returns the digest to log, or `None` when the scope already logged this set.
    pub(crate) fn is_new(&self, door: Door, session: Option<&str>, set: &EffectiveSet) -> Option<u64> {
        let mut scope = std::collections::hash_map::DefaultHasher::new();
        (door as u8, session).hash(&mut scope);
        let scope = scope.finish();
        let catalog = set.catalog_id();
        let mut seen = self.seen.lock();
        let previous = seen.get(&scope).copied();
        if previous.is_some_and(|(seen_catalog, _)| seen_catalog == catalog) && door != Door::Chat {
            return None;
        }
        let digest = super::core::fingerprint(set);
        if seen.len() >= MAX_SCOPES {
            seen.clear();
        }
        seen.insert(scope, (catalog, digest));
        let unchanged = previous.is_some_and(|(_, d)| d == digest) && door != Door::Chat;
        (!unchanged).then_some(digest)
    }
}

/// Writes the audit line of `set` as first used by `request_id` in `session`.
pub(crate) fn record(
    sink: &audit::AuditSink,
    set: &EffectiveSet,
    digest: u64,
    door: Door,
    request_id: &str,
    session: Option<&str>,
) {
    let mut names = 0;
    let servers = set
        .servers
        .iter()
        .map(|s| {
            let tools: Vec<&str> = s.tools.iter().flat_map(|t| t.iter()).map(|t| &*t.name).collect();
            let room = MAX_NAMES.saturating_sub(names);
            names += tools.len().min(room);
            SetServer { server_id: &s.id, tools: tools.into_iter().take(room).collect() }
        })
        .collect();
    let tool_count = set.tools().count();
    let line = SetLine {
        ts: audit::now(),
        kind: "effective_set",
        request_id: audit::capped(request_id),
        session_id: session.map(audit::capped),
        door,
        profile: &set.profile,
        registry_revision: set.revision.as_str(),
        digest: format!("{digest:016x}"),
        servers,
        tool_count,
        warning: (tool_count == 0).then_some("empty"),
    };
    sink.record(&line);
}
