//! Resources and prompts through the agent: the effective servers' lists aggregated under
//! namespaced identifiers, reads and gets routed back through the policy, with the server's call
//! budgets (time limit, output cap with marker) and one audit line each, as a tool call has.
//!
//! ```text
//! list_resources / list_resource_templates / list_prompts
//!     every server of the set, concurrently, each within its toolTimeoutMs; a server that fails
//!     is left out of the answer (logged), the others still answer
//!     items the policy refuses are left out (policy::items, the same layers as tools)
//! read_resource(spear://<server>/<uri>) ─ parse ─ EffectiveSet::item_decision ─ Pool::read_resource
//! get_prompt(mcp__<part>__<prompt>) ─ the named server's prompts ─ item_decision ─ Pool::get_prompt
//! ```
//!
//! Lists are fetched from the servers for every request (rmcp's client honours a server's
//! `ttlMs`); they are not cached by the agent as tool lists are. Their changes reach `/mcp`
//! clients through `doors::mcp::endpoint::ChangeWatch` (servers' list_changed, registry revisions).

use std::time::{Duration, Instant};

use rmcp::model::{
    CompleteRequestParams, CompletionInfo, GetPromptResult, Prompt, ReadResourceResult, Reference, Resource,
    ResourceTemplate, ServerCapabilities,
};
use serde_json::{Map, Value};

use super::audit::{self, AuditLine};
use super::core::{Agent, CallContext};
use crate::mcp::pool::ItemRead;
use crate::mcp::{ErrorCode, McpError};
use crate::policy::EffectiveSet;
use crate::policy::groups::{GROUPS_RESOURCE_URI, ServerBlurb, ToolGroup};
use crate::policy::items::{self, ItemKind};
use crate::policy::name;

/// What `/mcp` declares beyond tools: a feature is declared when some server of the set may
/// expose it under the policy and has it, or is not connected yet (so its capabilities are
/// unknown: declaring what turns out empty costs a client an empty list, not declaring what
/// exists would hide it). Undeclared features answer -32601.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ItemCapabilities {
    pub(crate) resources: bool,
    pub(crate) prompts: bool,
    pub(crate) completions: bool,
    /// A server of the set offers logging (`logging/setLevel` is fanned out to those).
    pub(crate) logging: bool,
    /// A server whose resources the set may expose offers resource subscriptions.
    pub(crate) subscribe: bool,
}

impl ItemCapabilities {
    /// Folds each server's policy and capabilities (`None`: not connected) into the declaration.
    pub(crate) fn of<'a>(servers: impl IntoIterator<Item = (bool, bool, Option<&'a ServerCapabilities>)>) -> Self {
        let mut declared = ItemCapabilities::default();
        for (resources_allowed, prompts_allowed, capabilities) in servers {
            let has = |feature: fn(&ServerCapabilities) -> bool| capabilities.is_none_or(feature);
            let resources = resources_allowed && has(|c| c.resources.is_some());
            let prompts = prompts_allowed && has(|c| c.prompts.is_some());
            declared.resources |= resources;
            declared.prompts |= prompts;
            // Completions complete a prompt's or a resource template's arguments.
            declared.completions |= (resources || prompts) && has(|c| c.completions.is_some());
            declared.logging |= has(|c| c.logging.is_some());
            declared.subscribe |= resources && has(|c| c.resources.as_ref().is_some_and(|r| r.subscribe == Some(true)));
        }
        declared
    }
}

impl Agent {
    /// What `/mcp` declares for `set` now ([`ItemCapabilities`]).
    pub(crate) fn item_capabilities(&self, set: &EffectiveSet) -> ItemCapabilities {
        let known: Vec<_> = set
            .servers
            .iter()
            .map(|server| {
                (
                    set.exposes_items(&server.id, ItemKind::Resource),
                    set.exposes_items(&server.id, ItemKind::Prompt),
                    self.pool().server_capabilities(&server.id),
                )
            })
            .collect();
        let mut declared = ItemCapabilities::of(known.iter().map(|(r, p, c)| (*r, *p, c.as_ref())));
        // The agent's own resource, the tool groups.
        declared.resources |= set.tools().next().is_some();
        declared
    }

    /// `completion/complete` for an aggregated prompt name or resource template, routed to the
    /// server that owns it, through the same policy as a get or a read of it.
    pub(crate) async fn complete(
        &self,
        set: &EffectiveSet,
        mut params: CompleteRequestParams,
    ) -> Result<CompletionInfo, McpError> {
        let budget = |server: &str| {
            set.servers
                .iter()
                .find(|s| &*s.id == server)
                .map(|s| Duration::from_millis(u64::from(s.budgets.tool_timeout_ms)))
        };
        match &mut params.r#ref {
            Reference::Prompt(prompt) => {
                let asked = prompt.name.clone();
                let named = name::target(&asked).ok_or_else(|| unknown_prompt(&asked))?;
                for server in set.servers.iter().filter(|s| named.names(&s.id, &s.server_part)) {
                    let timeout = Duration::from_millis(u64::from(server.budgets.tool_timeout_ms));
                    let prompts = self.pool().list_prompts(&server.id, timeout).await?;
                    let Some(own) = prompts.iter().find(|p| items::prompt_name(&server.server_part, &p.name) == asked)
                    else {
                        continue;
                    };
                    set.item_decision(&server.id, ItemKind::Prompt, &own.name).map_err(refusal)?;
                    prompt.name = own.name.clone();
                    return self.pool().complete(&server.id, params, timeout).await;
                }
                Err(unknown_prompt(&asked))
            }
            Reference::Resource(resource) => {
                let asked = resource.uri.clone();
                let (server, uri) = items::parse_resource_id(&asked).ok_or_else(|| {
                    McpError::new(
                        ErrorCode::McpInvalidArguments,
                        format!("'{}' is not a resource of this agent (spear://<server>/<uri>)", audit::capped(&asked)),
                    )
                })?;
                set.item_decision(server, ItemKind::Resource, uri).map_err(refusal)?;
                let timeout = budget(server).ok_or_else(|| {
                    McpError::new(ErrorCode::McpPolicyDenied, format!("server '{server}' is not in this request's set"))
                })?;
                resource.uri = uri.to_string();
                self.pool().complete(server, params, timeout).await
            }
            _ => Err(McpError::new(ErrorCode::McpInvalidArguments, "completion/complete: an unknown kind of ref")),
        }
    }

    /// Each server of `set` with its call budget, and what `fetch` got from it; failures logged
    /// and left out.
    async fn ask_each_server<T, Fut>(
        &self,
        set: &EffectiveSet,
        what: &str,
        fetch: impl Fn(String, Duration) -> Fut,
    ) -> Vec<(usize, T)>
    where
        Fut: Future<Output = Result<T, McpError>>,
    {
        let fetches = set.servers.iter().enumerate().map(|(index, server)| {
            let timeout = Duration::from_millis(u64::from(server.budgets.tool_timeout_ms));
            let fetched = fetch(server.id.to_string(), timeout);
            async move { (index, fetched.await) }
        });
        let mut out = Vec::new();
        for (index, result) in futures::future::join_all(fetches).await {
            match result {
                Ok(value) => out.push((index, value)),
                Err(error) => {
                    let server = &set.servers[index].id;
                    tracing::info!(server_id = %server, code = error.code.as_str(), %error, "{what}: server left out");
                }
            }
        }
        out
    }

    /// `set`'s tools by server ([`ToolGroup`]), with what each connected server says of itself.
    pub(crate) fn tool_groups(&self, set: &EffectiveSet) -> Vec<ToolGroup> {
        set.tool_groups(|id| {
            let info = self.pool().status(id)?.info?;
            Some(ServerBlurb { title: info.title, description: info.description })
        })
    }

    /// The agent's own resource [`GROUPS_RESOURCE_URI`], which `/mcp` lists first when the set
    /// has a tool (a gRPC session is one server's: it has no use for groups).
    pub(crate) fn groups_resource(set: &EffectiveSet) -> Option<Resource> {
        set.tools().next()?;
        let resource = Resource::new(GROUPS_RESOURCE_URI, "tool-groups")
            .with_title("Tool groups")
            .with_description(
                "The servers whose tools you may use, one group each: id, title, the server's own description \
                 (its text, untrusted) and its tool names",
            )
            .with_mime_type("application/json");
        Some(resource)
    }

    /// The resources of `set`'s servers that the policy lets through, under aggregated URIs.
    pub(crate) async fn list_resources(&self, set: &EffectiveSet) -> Vec<Resource> {
        let pool = self.pool();
        let lists =
            self.ask_each_server(set, "resources/list", |id, t| async move { pool.list_resources(&id, t).await });
        let mut out = Vec::new();
        for (index, resources) in lists.await {
            let server = &set.servers[index].id;
            for mut resource in resources {
                if set.item_decision(server, ItemKind::Resource, &resource.uri).is_ok() {
                    resource.uri = items::resource_id(server, &resource.uri);
                    out.push(resource);
                }
            }
        }
        out
    }

    /// The resource templates of `set`'s servers whose template the policy's URI patterns match
    /// as written (`test://static/resource/*` matches `test://static/resource/{id}`); each read
    /// is checked again with the expanded URI.
    pub(crate) async fn list_resource_templates(&self, set: &EffectiveSet) -> Vec<ResourceTemplate> {
        let pool = self.pool();
        let lists = self.ask_each_server(set, "resources/templates/list", |id, t| async move {
            pool.list_resource_templates(&id, t).await
        });
        let mut out = Vec::new();
        for (index, templates) in lists.await {
            let server = &set.servers[index].id;
            for mut template in templates {
                if set.item_decision(server, ItemKind::Resource, &template.uri_template).is_ok() {
                    template.uri_template = items::resource_id(server, &template.uri_template);
                    out.push(template);
                }
            }
        }
        out
    }

    /// The prompts of `set`'s servers that the policy lets through, under aggregated names.
    pub(crate) async fn list_prompts(&self, set: &EffectiveSet) -> Vec<Prompt> {
        self.list_prompts_named(set).await.into_iter().map(|(_, prompt)| prompt).collect()
    }

    /// [`Self::list_prompts`], each with its name on the server.
    pub(crate) async fn list_prompts_named(&self, set: &EffectiveSet) -> Vec<(String, Prompt)> {
        let pool = self.pool();
        let lists = self.ask_each_server(set, "prompts/list", |id, t| async move { pool.list_prompts(&id, t).await });
        let mut out = Vec::new();
        for (index, prompts) in lists.await {
            let server = &set.servers[index];
            for mut prompt in prompts {
                if set.item_decision(&server.id, ItemKind::Prompt, &prompt.name).is_ok() {
                    let aggregated = items::prompt_name(&server.server_part, &prompt.name);
                    let own = std::mem::replace(&mut prompt.name, aggregated);
                    out.push((own, prompt));
                }
            }
        }
        out
    }

    /// `logging/setLevel` to every server of `set` that offers logging, at once; a server that
    /// fails is logged and skipped (the level is a preference, not a call).
    #[allow(deprecated)] // logging is deprecated by SEP-2577, yet lives in 2025-11-25.
    pub(crate) async fn set_log_level(&self, set: &EffectiveSet, level: rmcp::model::LoggingLevel) {
        let sets = set.servers.iter().map(|server| async move {
            let timeout = Duration::from_millis(u64::from(server.budgets.tool_timeout_ms));
            if let Err(error) = self.pool().set_log_level(&server.id, level, timeout).await {
                tracing::warn!(server_id = %server.id, error = %error, "logging/setLevel failed");
            }
        });
        futures::future::join_all(sets).await;
    }

    /// Subscribes to (or unsubscribes from) an aggregated resource through the policy: the
    /// owning server's subscription, which the caller's session then hears of.
    pub(crate) async fn subscribe_resource(
        &self,
        set: &EffectiveSet,
        id: &str,
        subscribe: bool,
    ) -> Result<(), McpError> {
        let (server, uri) = items::parse_resource_id(id).ok_or_else(|| {
            McpError::new(
                ErrorCode::McpInvalidArguments,
                format!("'{}' is not a resource of this agent (spear://<server>/<uri>)", audit::capped(id)),
            )
        })?;
        set.item_decision(server, ItemKind::Resource, uri).map_err(refusal)?;
        let budgets = set.servers.iter().find(|s| &*s.id == server).map(|s| s.budgets).ok_or_else(|| {
            McpError::new(ErrorCode::McpPolicyDenied, format!("server '{server}' is not in this request's set"))
        })?;
        let timeout = Duration::from_millis(u64::from(budgets.tool_timeout_ms));
        self.pool().subscribe_resource(server, uri, subscribe, timeout).await
    }

    /// Reads an aggregated resource URI through the policy; audited.
    pub(crate) async fn read_resource(
        &self,
        set: &EffectiveSet,
        id: &str,
        context: CallContext<'_>,
    ) -> Result<ItemRead<ReadResourceResult>, McpError> {
        if id == GROUPS_RESOURCE_URI {
            return Ok(self.groups_read(set));
        }
        let started = Instant::now();
        let mut target = None;
        let result = async {
            let (server, uri) = items::parse_resource_id(id).ok_or_else(|| {
                McpError::new(
                    ErrorCode::McpInvalidArguments,
                    format!("'{}' is not a resource of this agent (spear://<server>/<uri>)", audit::capped(id)),
                )
            })?;
            target = Some((server, uri));
            set.item_decision(server, ItemKind::Resource, uri).map_err(refusal)?;
            let budgets = set.servers.iter().find(|s| &*s.id == server).map(|s| s.budgets).ok_or_else(|| {
                McpError::new(ErrorCode::McpPolicyDenied, format!("server '{server}' is not in this request's set"))
            })?;
            if let Some(origin) = self.foreign_secret_in(uri, server) {
                return Err(secret_in_request(&origin, server));
            }
            let timeout = Duration::from_millis(u64::from(budgets.tool_timeout_ms));
            let mut read =
                self.pool().read_resource(server, uri, timeout, budgets.max_tool_output_bytes as usize).await?;
            self.guard_item(set, &mut read)?;
            Ok(read)
        }
        .await;
        let result = self.guard_error(set, result);
        let (server, item) = target.map_or((None, id), |(s, u)| (Some(s), u));
        self.record_item(set, ItemKind::Resource, server, item, id, &result, started, context);
        result
    }

    /// [`GROUPS_RESOURCE_URI`] as read: the set's groups as JSON. The agent's own catalogue of
    /// what the caller already sees, so no server is asked and nothing is audited.
    fn groups_read(&self, set: &EffectiveSet) -> ItemRead<ReadResourceResult> {
        let text = serde_json::json!({"groups": self.tool_groups(set)}).to_string();
        let bytes = text.len();
        let contents = rmcp::model::ResourceContents::TextResourceContents {
            uri: GROUPS_RESOURCE_URI.to_string(),
            mime_type: Some("application/json".to_string()),
            text,
            meta: None,
        };
        ItemRead { bytes, result: ReadResourceResult::new(vec![contents]), truncated: None, input_required: None }
    }

    /// Gets an aggregated prompt through the policy; audited.
    pub(crate) async fn get_prompt(
        &self,
        set: &EffectiveSet,
        name_asked: &str,
        arguments: Option<Map<String, Value>>,
        context: CallContext<'_>,
    ) -> Result<ItemRead<GetPromptResult>, McpError> {
        let started = Instant::now();
        let mut target: Option<(String, String)> = None;
        let result = async {
            let unknown = || unknown_prompt(name_asked);
            let named = name::target(name_asked).ok_or_else(unknown)?;
            // Servers sharing the name part (a toolNamespace) are asked in turn.
            for server in set.servers.iter().filter(|s| named.names(&s.id, &s.server_part)) {
                let timeout = Duration::from_millis(u64::from(server.budgets.tool_timeout_ms));
                let prompts = self.pool().list_prompts(&server.id, timeout).await?;
                let Some(prompt) =
                    prompts.iter().find(|p| items::prompt_name(&server.server_part, &p.name) == name_asked)
                else {
                    continue;
                };
                target = Some((server.id.to_string(), prompt.name.clone()));
                set.item_decision(&server.id, ItemKind::Prompt, &prompt.name).map_err(refusal)?;
                let text = arguments.as_ref().map(|a| Value::Object(a.clone()).to_string()).unwrap_or_default();
                if let Some(origin) = self.foreign_secret_in(&text, &server.id) {
                    return Err(secret_in_request(&origin, &server.id));
                }
                let cap = server.budgets.max_tool_output_bytes as usize;
                let limits = (timeout, cap);
                let mut got =
                    self.pool().get_prompt(&server.id, &prompt.name, arguments, limits, context.input).await?;
                self.guard_item(set, &mut got)?;
                return Ok(got);
            }
            Err(unknown())
        }
        .await;
        let result = self.guard_error(set, result);
        let (server, item) = match &target {
            Some((server, prompt)) => (Some(server.as_str()), prompt.as_str()),
            None => (None, name_asked),
        };
        self.record_item(set, ItemKind::Prompt, server, item, name_asked, &result, started, context);
        result
    }

    /// A held value in `text` that `server` was not given: where it came from.
    fn foreign_secret_in(&self, text: &str, server: &str) -> Option<String> {
        let held = self.pool().secrets().redactor();
        if !held.holds_foreign_to(server) {
            return None;
        }
        held.foreign_in(text, server).map(str::to_string)
    }

    /// A read's or get's result cleaned of held values and filter findings (see
    /// `agent::redaction`); a `block` finding refuses it.
    fn guard_item<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        set: &EffectiveSet,
        read: &mut ItemRead<T>,
    ) -> Result<(), McpError> {
        let held = self.pool().secrets().redactor();
        let guard = super::redaction::OutputGuard { held: &held, filters: set.output_filters() };
        guard.item(&mut read.result, read.truncated.is_some())
    }

    /// An error's message cleaned the same way (a server's error text is its output too).
    fn guard_error<T>(&self, set: &EffectiveSet, result: Result<T, McpError>) -> Result<T, McpError> {
        result.map_err(|mut error| {
            let held = self.pool().secrets().redactor();
            super::redaction::OutputGuard { held: &held, filters: set.output_filters() }.error(&mut error);
            error
        })
    }

    /// The audit line of a resource read or prompt get.
    #[allow(clippy::too_many_arguments)]
    fn record_item<T>(
        &self,
        set: &EffectiveSet,
        kind: ItemKind,
        server: Option<&str>,
        item: &str,
        asked_as: &str,
        result: &Result<ItemRead<T>, McpError>,
        started: Instant,
        context: CallContext<'_>,
    ) {
        self.audit().record(&AuditLine {
            ts: audit::now(),
            request_id: context.request_id,
            session_id: context.session_id,
            caller: context.caller,
            door: context.door,
            profile: &set.profile,
            registry_revision: set.revision.as_str(),
            server_id: server,
            kind: Some(kind),
            tool_name: audit::capped(item),
            called_as: audit::capped(asked_as),
            status: match result {
                Ok(read) if read.input_required.is_some() => "input_required",
                Ok(read) if read.truncated.is_some() => ErrorCode::McpOutputTooLarge.as_str(),
                Ok(_) => "ok",
                Err(error) => error.code.as_str(),
            },
            latency_ms: audit::millis(started.elapsed()),
            output_bytes: result.as_ref().ok().map(|read| read.bytes),
            arguments: Value::from("[redacted]"),
            approval: None,
            reason: result.as_ref().err().and_then(|e| e.reason),
        });
        if let Err(McpError { reason: Some(reason), .. }) = result {
            self.denied_metric(server.unwrap_or_default(), reason);
        }
    }
}

/// The refusal of an item the policy excludes: `mcp_policy_denied` with the layer's reason.
fn refusal(decision: crate::policy::Decision) -> McpError {
    McpError::denied(
        ErrorCode::McpPolicyDenied,
        decision.reason.label(),
        format!(
            "not allowed: {}{}",
            decision.reason,
            decision.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default()
        ),
    )
}

/// A read or get refused because what it sends holds a value another server was given.
fn secret_in_request(origin: &str, server: &str) -> McpError {
    McpError::denied(
        ErrorCode::McpPolicyDenied,
        "secret_in_arguments",
        format!(
            "the request holds a secret the agent holds ([redacted: {origin}]) that server '{server}' was not given; it was not sent"
        ),
    )
}

/// A prompt name that names nothing this workload may use.
fn unknown_prompt(asked: &str) -> McpError {
    McpError::denied(
        ErrorCode::McpPolicyDenied,
        "unknown_prompt",
        format!("'{}' is not a prompt this workload may use", audit::capped(asked)),
    )
}

#[cfg(test)]
mod tests {
    use rmcp::model::{PromptsCapability, ResourcesCapability};

    use super::*;

    fn capabilities(resources: bool, prompts: bool, completions: bool) -> ServerCapabilities {
        let mut c = ServerCapabilities::default();
        c.resources = resources.then(ResourcesCapability::default);
        c.prompts = prompts.then(PromptsCapability::default);
        c.completions = completions.then(Default::default);
        c
    }

    #[test]
    fn a_feature_is_declared_when_an_allowed_server_has_it_or_is_not_known_yet() {
        let tools_only = capabilities(false, false, false);
        let everything = capabilities(true, true, true);
        let declared = |servers: &[(bool, bool, Option<&ServerCapabilities>)]| ItemCapabilities::of(servers.to_vec());
        assert_eq!(declared(&[]), ItemCapabilities::default(), "no server, tools only");
        assert_eq!(declared(&[(true, true, Some(&tools_only))]), ItemCapabilities::default(), "nothing to relay");
        assert_eq!(
            declared(&[(false, false, Some(&everything))]),
            ItemCapabilities::default(),
            "the policy exposes none of the server's items: nothing is declared"
        );
        assert_eq!(
            declared(&[(true, false, Some(&everything))]),
            ItemCapabilities { resources: true, prompts: false, completions: true, ..Default::default() }
        );
        assert_eq!(
            declared(&[(false, true, None)]),
            ItemCapabilities { resources: false, prompts: true, completions: true, logging: true, subscribe: false },
            "a server not connected yet may have them (but its resources are not exposed: no subscribe)"
        );
        let prompts_no_completions = capabilities(false, true, false);
        assert_eq!(
            declared(&[(true, true, Some(&prompts_no_completions)), (true, true, Some(&tools_only))]),
            ItemCapabilities { resources: false, prompts: true, completions: false, ..Default::default() }
        );
        let mut logs_and_subscriptions = capabilities(true, false, false);
        logs_and_subscriptions.logging = Some(Default::default());
        if let Some(resources) = logs_and_subscriptions.resources.as_mut() {
            resources.subscribe = Some(true);
        }
        let declared_now = declared(&[(true, false, Some(&logs_and_subscriptions))]);
        assert!(declared_now.logging && declared_now.subscribe, "{declared_now:?}");
        let hidden = declared(&[(false, false, Some(&logs_and_subscriptions))]);
        assert!(hidden.logging && !hidden.subscribe, "resources not exposed: no subscriptions; {hidden:?}");
    }
}
