//! Resources and prompts: which of a server's the workload may read and get, and the namespaced
//! identifiers that route back to their server. Pure.
//!
//! - **Layers, as for tools.** The McpServer's `allowedResources`/`deniedResources`
//!   (`allowedPrompts`/`deniedPrompts`): an empty allowlist exposes nothing (deny by default, so
//!   a server registered for its tools exposes no file by accident); then the McpProfile's
//!   `resourceAllowlist`/`resourceDenylist` (`promptAllowlist`/`promptDenylist`), which only
//!   narrow; deny always wins. The server must be in the request's effective set. Resource
//!   patterns match the server's own URI (`file:///srv/docs/*`); prompt patterns match the
//!   prompt's name, or `server/name` in a profile, as tool patterns do. A resource URI is first
//!   held to one spelling (`policy::resource_uri`: no `..`, `//`, `%2e`, `\`), else it is
//!   `unsafe_uri`; the server receives the very string decided on.
//! - **Identifiers.** A resource is `spear://<server id>/<the server's URI>` (a template: the same
//!   prefix on its `uriTemplate`, so its variables still expand): reversible without a table,
//!   since a server id is a DNS label and its first `/` ends it. A prompt is
//!   `mcp__<server part>__<prompt>`, the tool-name scheme ([`super::name`]), resolved by listing
//!   the named server's prompts.

use std::collections::HashMap;

use serde::Serialize;

use super::decision::{Decision, Layer, LayerPatterns, PolicyError, Reason};
use super::pattern::PatternSet;
use super::resource_uri;
use crate::api::{McpProfile, McpServer};

/// The scheme of aggregated resource URIs.
pub const RESOURCE_SCHEME: &str = "spear://";

/// What is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A resource, by its URI on the server.
    Resource,
    /// A prompt, by its name on the server.
    Prompt,
}

impl ItemKind {
    /// The McpServer field whose emptiness denies everything of this kind.
    fn server_field(self) -> &'static str {
        match self {
            ItemKind::Resource => "allowedResources",
            ItemKind::Prompt => "allowedPrompts",
        }
    }
}

#[derive(Debug)]
struct Allowed {
    allowed: PatternSet,
    denied: PatternSet,
}

/// One server's compiled resource and prompt patterns.
#[derive(Debug)]
struct ServerItems {
    resources: Allowed,
    prompts: Allowed,
}

/// A profile's compiled resource and prompt policy over its servers.
#[derive(Debug)]
pub(crate) struct CompiledItems {
    servers: HashMap<String, ServerItems>,
    resource_allow: Option<PatternSet>,
    resource_deny: PatternSet,
    prompt_allow: Option<LayerPatterns>,
    prompt_deny: LayerPatterns,
}

impl CompiledItems {
    /// Compiles the patterns of `profile` and of `servers` (the ones it allows).
    pub(crate) fn compile<'a>(
        profile: &McpProfile,
        servers: impl Iterator<Item = (&'a str, &'a McpServer)>,
    ) -> Result<Self, PolicyError> {
        let set = |patterns: &[String], layer: Layer| {
            PatternSet::new(patterns).map_err(|source| PolicyError::InvalidPattern { layer, source })
        };
        let mut compiled = HashMap::new();
        for (id, server) in servers {
            let s = &server.spec;
            compiled.insert(
                id.to_string(),
                ServerItems {
                    resources: Allowed {
                        allowed: set(&s.allowed_resources, Layer::Server)?,
                        denied: set(&s.denied_resources, Layer::Server)?,
                    },
                    prompts: Allowed {
                        allowed: set(&s.allowed_prompts, Layer::Server)?,
                        denied: set(&s.denied_prompts, Layer::Server)?,
                    },
                },
            );
        }
        let p = &profile.spec;
        Ok(CompiledItems {
            servers: compiled,
            resource_allow: p.resource_allowlist.as_deref().map(|a| set(a, Layer::Profile)).transpose()?,
            resource_deny: set(&p.resource_denylist, Layer::Profile)?,
            prompt_allow: p.prompt_allowlist.as_deref().map(|a| LayerPatterns::new(a, Layer::Profile)).transpose()?,
            prompt_deny: LayerPatterns::new(&p.prompt_denylist, Layer::Profile)?,
        })
    }

    /// Whether the server and profile layers could let any item of `kind` of `server` through:
    /// its McpServer allowlist of that kind is not empty, nor an empty profile allowlist. What
    /// the agent declares to MCP clients (`resources`, `prompts`) follows this.
    pub(crate) fn exposes(&self, server: &str, kind: ItemKind) -> bool {
        let Some(patterns) = self.servers.get(server) else { return false };
        match kind {
            ItemKind::Resource => {
                !patterns.resources.allowed.is_empty() && self.resource_allow.as_ref().is_none_or(|a| !a.is_empty())
            }
            ItemKind::Prompt => {
                !patterns.prompts.allowed.is_empty() && self.prompt_allow.as_ref().is_none_or(|a| !a.is_empty())
            }
        }
    }

    /// Whether the server and profile layers let `item` of `server` through; the exclusion
    /// otherwise. A server the profile does not allow is `not_in_profile`.
    pub(crate) fn decide(&self, server: &str, kind: ItemKind, item: &str) -> Result<(), Decision> {
        let refuse = |reason: Reason, detail: Option<String>| {
            Err(Decision { server: server.to_string(), tool: Some(item.to_string()), reason, detail })
        };
        let Some(patterns) = self.servers.get(server) else { return refuse(Reason::NotInProfile, None) };
        // Patterns only mean something on the one spelling the server resolves as written.
        if kind == ItemKind::Resource
            && let Err(problem) = resource_uri::check(item)
        {
            return refuse(Reason::UnsafeUri, Some(problem.detail()));
        }
        let own = match kind {
            ItemKind::Resource => &patterns.resources,
            ItemKind::Prompt => &patterns.prompts,
        };
        if own.allowed.is_empty() {
            let detail = format!("the McpServer's {} is empty: nothing is exposed", kind.server_field());
            return refuse(Reason::NotAllowedBy(Layer::Server), Some(detail));
        }
        if !own.allowed.is_match(item) {
            return refuse(Reason::NotAllowedBy(Layer::Server), None);
        }
        if own.denied.is_match(item) {
            return refuse(Reason::DeniedBy(Layer::Server), None);
        }
        let mut buffer = String::new();
        let (allowed, denied) = match kind {
            ItemKind::Resource => {
                (self.resource_allow.as_ref().is_none_or(|a| a.is_match(item)), self.resource_deny.is_match(item))
            }
            ItemKind::Prompt => (
                self.prompt_allow.as_ref().is_none_or(|a| a.is_match(server, item, &mut buffer)),
                self.prompt_deny.is_match(server, item, &mut buffer),
            ),
        };
        if !allowed {
            return refuse(Reason::NotAllowedBy(Layer::Profile), None);
        }
        if denied {
            return refuse(Reason::DeniedBy(Layer::Profile), None);
        }
        Ok(())
    }
}

/// The aggregated URI of `uri` on `server` (also for a template's `uriTemplate`).
pub fn resource_id(server: &str, uri: &str) -> String {
    format!("{RESOURCE_SCHEME}{server}/{uri}")
}

/// The server and its own URI of an aggregated resource URI; `None` when it is not one.
pub fn parse_resource_id(id: &str) -> Option<(&str, &str)> {
    let (server, uri) = id.strip_prefix(RESOURCE_SCHEME)?.split_once('/')?;
    let label = !server.is_empty()
        && server.len() <= 63
        && server.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    (label && !uri.is_empty()).then_some((server, uri))
}

/// The aggregated name of `prompt` on the server whose name part is `server_part`.
pub fn prompt_name(server_part: &str, prompt: &str) -> String {
    super::name::base_name(server_part, prompt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixtures::NO_ARGS;

    /// The review's server: `files` exposes `file:///D/srv/docs/*` but not its `private/`.
    fn files(profile_deny: &[&str]) -> CompiledItems {
        let mut server = McpServer::test("files").stdio("server", NO_ARGS);
        server.spec.allowed_resources = vec!["file:///D/srv/docs/*".to_string()];
        server.spec.denied_resources = vec!["file:///D/srv/docs/private/*".to_string()];
        let mut profile = McpProfile::test("p").servers(["files"]);
        profile.spec.resource_denylist = profile_deny.iter().map(|p| p.to_string()).collect();
        CompiledItems::compile(&profile, [("files", &server)].into_iter()).expect("patterns compile")
    }

    fn reason(items: &CompiledItems, uri: &str) -> Option<String> {
        items.decide("files", ItemKind::Resource, uri).err().map(|d| d.reason.to_string())
    }

    /// The review's table, row by row, and the other spellings of the same reads: each one that
    /// a path-resolving server would read outside `allowedResources` or inside `deniedResources`
    /// is `unsafe_uri`, whatever the patterns say, with the problem and the fix in the detail.
    #[test]
    fn traversal_spellings_are_refused_before_any_pattern() {
        let items = files(&[]);
        assert_eq!(reason(&items, "file:///D/srv/docs/a.md"), None);
        assert_eq!(reason(&items, "file:///D/secret.txt").as_deref(), Some("not_allowed_by:server"));
        assert_eq!(reason(&items, "file:///D/srv/docs/private/key.txt").as_deref(), Some("denied_by:server"));
        for uri in [
            "file:///D/srv/docs/../../secret.txt",
            "file:///D/srv/docs/%2e%2e/%2e%2e/secret.txt",
            "file:///D/srv/docs/%2E%2e/%2e%2E/secret.txt",
            "file:///D/srv/docs//private/key.txt",
            "file:///D/srv/docs/./private/key.txt",
            "file:///D/srv/docs/%70rivate/key.txt",
            "file:///D/srv/docs/..%2F..%2Fsecret.txt",
            "file:///D/srv/docs/private%2Fkey.txt",
            "file:///D/srv/docs/..%5C..%5Csecret.txt",
            "file:///D/srv/docs/..\\..\\secret.txt",
            "file:///D/srv/docs/%252e%252e/secret.txt",
            "file:///D/srv/docs/a.md?path=../../secret.txt",
            "file:///D/srv/docs/a.md#../../secret.txt",
            "file://localhost/D/srv/docs/private/key.txt",
            "FILE:///D/srv/docs/private/key.txt",
        ] {
            let refused = items.decide("files", ItemKind::Resource, uri).expect_err(uri);
            assert_eq!(refused.reason, Reason::UnsafeUri, "{uri}");
            let detail = refused.detail.unwrap_or_default();
            assert!(detail.contains("the URI") && detail.contains("resources/list"), "{uri}: {detail}");
        }
        // The profile's layer sees the same single spelling.
        let items = files(&["file:///D/srv/docs/drafts/*"]);
        assert_eq!(reason(&items, "file:///D/srv/docs/drafts/x.md").as_deref(), Some("denied_by:profile"));
        assert_eq!(reason(&items, "file:///D/srv/docs/./drafts/x.md").as_deref(), Some("unsafe_uri"));
        // Prompt names are not URIs: a prompt called `..` is a name like any other.
        let mut server = McpServer::test("files").stdio("server", NO_ARGS);
        server.spec.allowed_prompts = vec!["*".to_string()];
        let profile = McpProfile::test("p").servers(["files"]);
        let items = CompiledItems::compile(&profile, [("files", &server)].into_iter()).expect("compiles");
        assert!(items.decide("files", ItemKind::Prompt, "..").is_ok());
    }

    #[test]
    fn resource_ids_route_back_and_refuse_other_shapes() {
        let id = resource_id("fs", "file:///srv/docs/a b.md");
        assert_eq!(id, "spear://fs/file:///srv/docs/a b.md");
        assert_eq!(parse_resource_id(&id), Some(("fs", "file:///srv/docs/a b.md")));
        let template = resource_id("everything", "test://static/resource/{id}");
        assert_eq!(parse_resource_id(&template), Some(("everything", "test://static/resource/{id}")));
        for bad in ["file:///etc/passwd", "spear://", "spear://fs", "spear://fs/", "spear://Fs/x", "spear://f_s/x"] {
            assert_eq!(parse_resource_id(bad), None, "{bad}");
        }
    }
}
