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
//! clients through `mcp_endpoint::ChangeWatch` (servers' list_changed, registry revisions).

use std::time::{Duration, Instant};

use rmcp::model::{GetPromptResult, Prompt, ReadResourceResult, Resource, ResourceTemplate};
use serde_json::{Map, Value};

use super::audit::{self, AuditLine};
use super::core::{Agent, CallContext};
use crate::mcp::pool::ItemRead;
use crate::mcp::{ErrorCode, McpError};
use crate::policy::EffectiveSet;
use crate::policy::items::{self, ItemKind};
use crate::policy::name;

impl Agent {
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

    /// Reads an aggregated resource URI through the policy; audited.
    pub(crate) async fn read_resource(
        &self,
        set: &EffectiveSet,
        id: &str,
        context: CallContext<'_>,
    ) -> Result<ItemRead<ReadResourceResult>, McpError> {
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
            let timeout = Duration::from_millis(u64::from(budgets.tool_timeout_ms));
            self.pool().read_resource(server, uri, timeout, budgets.max_tool_output_bytes as usize).await
        }
        .await;
        let (server, item) = target.map_or((None, id), |(s, u)| (Some(s), u));
        self.record_item(set, ItemKind::Resource, server, item, id, &result, started, context);
        result
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
            let unknown = || {
                McpError::new(
                    ErrorCode::McpPolicyDenied,
                    format!("'{}' is not a prompt this workload may use", audit::capped(name_asked)),
                )
            };
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
                let cap = server.budgets.max_tool_output_bytes as usize;
                return self.pool().get_prompt(&server.id, &prompt.name, arguments, timeout, cap).await;
            }
            Err(unknown())
        }
        .await;
        let (server, item) = match &target {
            Some((server, prompt)) => (Some(server.as_str()), prompt.as_str()),
            None => (None, name_asked),
        };
        self.record_item(set, ItemKind::Prompt, server, item, name_asked, &result, started, context);
        result
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
            door: context.door,
            profile: &set.profile,
            registry_revision: set.revision.as_str(),
            server_id: server,
            kind: Some(kind),
            tool_name: audit::capped(item),
            called_as: audit::capped(asked_as),
            status: match result {
                Ok(read) if read.truncated.is_some() => ErrorCode::McpOutputTooLarge.as_str(),
                Ok(_) => "ok",
                Err(error) => error.code.as_str(),
            },
            latency_ms: audit::millis(started.elapsed()),
            output_bytes: result.as_ref().ok().map(|read| read.bytes),
            arguments: Value::from("[redacted]"),
        });
    }
}

/// The refusal of an item the policy excludes: `mcp_policy_denied` with the layer's reason.
fn refusal(decision: crate::policy::Decision) -> McpError {
    McpError::new(
        ErrorCode::McpPolicyDenied,
        format!(
            "not allowed: {}{}",
            decision.reason,
            decision.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default()
        ),
    )
}
