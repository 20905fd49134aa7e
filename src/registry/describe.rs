//! A registry snapshot for people: the table `spearlet registry` prints, and one line per new
//! revision for `--watch`. Pure.

use std::path::Path;

use super::snapshot::Snapshot;

fn join_or_dash(items: &[String]) -> String {
    if items.is_empty() { "-".into() } else { items.join(",") }
}

/// A human-readable table of a snapshot.
pub(crate) fn describe(dir: &Path, snapshot: &Snapshot) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let servers = snapshot.servers();
    let profiles = snapshot.profiles();
    let _ = writeln!(
        out,
        "registry {}: revision {}, {} server(s), {} profile(s){}",
        dir.display(),
        snapshot.revision(),
        servers.len(),
        profiles.len(),
        if snapshot.is_degraded() { ", DEGRADED" } else { "" }
    );
    let _ = writeln!(out, "{:<24} {:<15} {:<16} ALLOWED TOOLS", "SERVER", "TRANSPORT", "VERSION");
    for (name, server) in servers {
        let spec = &server.object.spec;
        let _ = writeln!(
            out,
            "{name:<24} {:<15} {:<16} {}",
            spec.transport.as_str(),
            server.resource_version,
            join_or_dash(&spec.allowed_tools)
        );
    }
    let _ = writeln!(out, "{:<24} {:<40} DEFAULT SERVERS", "PROFILE", "SERVERS");
    for (name, profile) in profiles {
        let spec = &profile.object.spec;
        let defaults = spec.default_servers.as_deref().map_or_else(|| "(all allowed)".to_string(), join_or_dash);
        let _ = writeln!(out, "{name:<24} {:<40} {defaults}", join_or_dash(&spec.servers));
    }
    for problem in snapshot.problems() {
        let _ = writeln!(out, "problem: {problem}");
    }
    out
}

/// One line per new revision, then its problems.
pub(crate) fn describe_change(old: &Snapshot, new: &Snapshot) -> String {
    use std::fmt::Write as _;
    let changes = old.changes(new);
    let mut parts: Vec<String> = changes.upserts.iter().map(|(k, n)| format!("~{k}/{n}")).collect();
    parts.extend(changes.deletes.iter().map(|(k, n)| format!("-{k}/{n}")));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "revision {} -> {}: {}{}",
        old.revision(),
        new.revision(),
        if parts.is_empty() { "no object changed".to_string() } else { parts.join(" ") },
        if new.is_degraded() { format!(" (DEGRADED: {} problem(s))", new.problems().len()) } else { String::new() }
    );
    for problem in new.problems() {
        let _ = writeln!(out, "problem: {problem}");
    }
    out
}
