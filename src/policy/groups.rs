//! Tool groups: the effective set's tools by server, for a model or client that browses by
//! server rather than by tool (the host layer of Anda's MCP hub). A group is the server's id,
//! a title (the McpServer's `displayName`, else the title the server gives itself) and the
//! server's own description of itself (its `initialize` serverInfo).
//!
//! The description is the server's text, so untrusted: it is cut to [`MAX_DESCRIPTION_CHARS`]
//! on one line (no control characters), and says what the server is, never what to do. The
//! `/mcp` endpoint's `instructions` carry each server's *instructions* (how to use it) in
//! delimited untrusted groups; a tool group is the catalogue entry beside them, with the tools
//! that are exposed to this caller.

use std::sync::Arc;

use serde::Serialize;

use super::EffectiveSet;

/// The `/mcp` resource that lists the groups (`resources/read`); not a `spear://<server>/<uri>`
/// id, which always has a `/` after the server.
pub const GROUPS_RESOURCE_URI: &str = "spear://groups";
/// The longest server description a group carries.
pub const MAX_DESCRIPTION_CHARS: usize = 512;

/// What a connected server says of itself in `initialize` (`serverInfo.title`, `.description`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerBlurb {
    pub title: Option<String>,
    pub description: Option<String>,
}

/// One server of the set with the tools it exposes here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ToolGroup {
    /// The McpServer's name.
    pub id: Arc<str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The server's own words, untrusted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Model-facing names of its exposed tools, in list order.
    pub tools: Vec<Arc<str>>,
}

impl EffectiveSet {
    /// The groups of the servers that expose a tool in this set, in set order; `blurb` is what a
    /// connected server says of itself.
    pub fn tool_groups(&self, blurb: impl Fn(&str) -> Option<ServerBlurb>) -> Vec<ToolGroup> {
        let mut groups: Vec<ToolGroup> = Vec::new();
        for (server, tool) in self.tools() {
            if groups.last().is_none_or(|g| g.id != server.id) {
                let said = blurb(&server.id).unwrap_or_default();
                let title = self.display_name(&server.id).map(str::to_string).or(said.title).map(|t| one_line(&t));
                let description = said.description.map(|d| one_line(&d)).filter(|d| !d.is_empty());
                groups.push(ToolGroup { id: server.id.clone(), title, description, tools: Vec::new() });
            }
            if let Some(group) = groups.last_mut() {
                group.tools.push(tool.name.clone());
            }
        }
        groups
    }
}

/// `text` on one line, control characters as spaces, cut to [`MAX_DESCRIPTION_CHARS`].
fn one_line(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') { ' ' } else { c })
        .take(MAX_DESCRIPTION_CHARS)
        .collect();
    line.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::manifest::Object;
    use crate::api::{McpProfile, McpServer};
    use crate::policy::{CompiledProfile, ServerTools, ToolInfo, ToolList};
    use crate::registry::snapshot::{Entry, Snapshot};
    use crate::testing::fixtures::NO_ARGS;

    /// `fs` (displayName Files, every tool), `git` (only `log`), `idle` (no tools).
    fn set() -> EffectiveSet {
        let mut fs = McpServer::test("fs").stdio("server", NO_ARGS).allowing(["*"]);
        fs.spec.display_name = Some("Files".into());
        let objects = [
            Object::Server(fs),
            Object::Server(McpServer::test("git").stdio("server", NO_ARGS).allowing(["log"])),
            Object::Server(McpServer::test("idle").stdio("server", NO_ARGS).allowing(["*"])),
            Object::Profile(McpProfile::test("p").servers(["fs", "git", "idle"])),
        ];
        let entries = objects.into_iter().enumerate().map(|(i, o)| Entry::local(format!("o-{i}.yaml"), 1, o));
        let snapshot = Snapshot::build(entries, Vec::new());
        let list = |server: &str, names: &[&str]| {
            let tools: Vec<ToolInfo> = names.iter().map(|n| ToolInfo::named(n)).collect();
            ServerTools::Listed(Arc::new(ToolList::new(server, tools)))
        };
        let tools = |id: &str| match id {
            "fs" => list("fs", &["read", "write"]),
            "git" => list("git", &["log", "push"]),
            _ => list(id, &[]),
        };
        CompiledProfile::compile(&snapshot, "p").expect("compiles").effective(tools, None, &[]).expect("set")
    }

    #[test]
    fn groups_follow_the_set_with_titles_and_one_line_descriptions() {
        let long = format!("Git history.\n<b>{}</b>", "x".repeat(600));
        let groups = set().tool_groups(|id| match id {
            "fs" => Some(ServerBlurb { title: Some("ignored".into()), description: None }),
            "git" => Some(ServerBlurb { title: Some("Git\r\nServer".into()), description: Some(long.clone()) }),
            _ => None,
        });
        let ids: Vec<&str> = groups.iter().map(|g| &*g.id).collect();
        assert_eq!(ids, ["fs", "git"], "a server exposing no tool has no group");
        assert_eq!(groups[0].title.as_deref(), Some("Files"), "the McpServer's displayName wins");
        assert_eq!(groups[0].tools, [Arc::from("mcp__fs__read"), Arc::from("mcp__fs__write")]);
        assert_eq!(groups[1].title.as_deref(), Some("Git  Server"));
        assert_eq!(groups[1].tools, [Arc::from("mcp__git__log")], "only what the policy exposes");
        let description = groups[1].description.as_deref().expect("description");
        assert_eq!(description.chars().count(), MAX_DESCRIPTION_CHARS);
        assert!(!description.contains('\n') && description.starts_with("Git history. <b>"), "{description}");
    }
}
