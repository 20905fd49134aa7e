//! The pool's rmcp client handler: it identifies the agent, counts list_changed notifications
//! ([`ListChanged`], [`Watchers`]), and passes what a server sends during a call (progress, log
//! messages, sampling and elicitation requests) to that call's relay (`relay.rs`).
//!
//! A 2026-07-28 server sends list_changed only on a `subscriptions/listen` stream, opened here
//! for each session that needs one ([`subscribe_to_list_changes`]).

#![allow(deprecated)] // sampling and logging are deprecated by SEP-2577, yet live in 2025-11-25.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{
    ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
    ElicitResult, Implementation, LoggingMessageNotificationParam, ProgressNotificationParam, ProtocolVersion,
    ServerNotification, SubscriptionFilter,
};
use rmcp::service::{InboundStreamOrigin, NotificationContext, RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, RoleClient};
use tokio::sync::Notify;
use tracing::Instrument;

use crate::mcp::relay::{self, InFlight, Origin};

/// Counts `notifications/tools/list_changed` from one server and wakes whoever waits.
#[derive(Debug, Default)]
pub(crate) struct ListChanged {
    generation: AtomicU64,
    notify: Notify,
}

impl ListChanged {
    /// Notifications received so far.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Waits until a notification arrives after `generation` was read (none is missed, even
    /// one that arrives before this is first polled).
    pub(crate) async fn changed_since(&self, generation: u64) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.generation() > generation {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.notify.notify_waiters();
    }
}

/// Where a session's list-change notifications are counted: its tools' (per server, so the
/// pool re-lists that server), and resources' and prompts' (one count for the whole pool, which
/// `/mcp` relays to its clients).
#[derive(Clone, Debug)]
pub(crate) struct Watchers {
    pub(crate) tools: Arc<ListChanged>,
    pub(crate) items: Arc<ListChanged>,
    /// `notifications/resources/updated`, pool-wide: (server id, the server's URI).
    pub(crate) resource_updates: tokio::sync::broadcast::Sender<(Arc<str>, String)>,
}

impl Default for Watchers {
    /// Watchers nobody reads (the operator's probe): a one-slot update channel.
    fn default() -> Self {
        Watchers {
            tools: Arc::default(),
            items: Arc::default(),
            resource_updates: tokio::sync::broadcast::Sender::new(1),
        }
    }
}

/// The pool's rmcp client handler: identifies the agent, records list_changed, and passes what
/// the server sends during a call to that call's relay (`relay.rs`).
#[derive(Clone, Debug)]
pub(crate) struct PoolHandler {
    pub(super) server_id: Arc<str>,
    pub(super) watchers: Watchers,
    pub(super) calls: Arc<InFlight>,
}

/// Where a server's request came from: the call whose response stream carried it, if any.
fn origin(extensions: &rmcp::model::Extensions) -> Origin<'_> {
    match extensions.get::<InboundStreamOrigin>() {
        Some(InboundStreamOrigin::OutboundRequest(id)) => Origin::Request(id),
        _ => Origin::Unknown,
    }
}

impl ClientHandler for PoolHandler {
    fn get_info(&self) -> ClientConfig {
        // The version offered by `initialize`, the handshake of the revisions before 2026-07-28
        // (rmcp's default, its latest, has no handshake: a 2025 server would be offered a
        // revision it cannot know). `server/discover` offers its own `preferred_versions`.
        ClientConfig::new(relayed_capabilities(), Implementation::new("spear-mcp", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        if let Some(relay) = self.calls.by_progress_token(&params.progress_token) {
            relay.progress(params);
        }
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        match self.calls.attribute(origin(&context.extensions)) {
            Some(relay) => relay.log(params),
            // Not a call's (or not one that can be named): the agent's own log keeps it.
            None => tracing::debug!(server_id = %self.server_id, level = ?params.level, "server log message"),
        }
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        match self.calls.attribute(origin(&context.extensions)) {
            Some(relay) => relay.sample(params).await,
            None => Err(relay::sampling_refused(
                "no single call of this session can be named as the one asking, and the agent has no model of \
                 the server's choosing to offer",
            )),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        match self.calls.attribute(origin(&context.extensions)) {
            Some(relay) => relay.elicit(params).await,
            None => Ok(relay::declined()),
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "tools/list_changed");
        self.watchers.tools.bump();
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "resources/list_changed");
        self.watchers.items.bump();
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // No receiver (no /mcp session subscribed yet) is no error.
        let _ = self.watchers.resource_updates.send((self.server_id.clone(), params.uri));
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server_id = %self.server_id, "prompts/list_changed");
        self.watchers.items.bump();
    }
}

/// The capabilities the pool declares to a 2025 server: sampling and (form) elicitation, which
/// it relays to the caller of the call that asks when that caller can answer (a `/mcp` client
/// that declared them), and declines otherwise (see `relay.rs`).
fn relayed_capabilities() -> ClientCapabilities {
    relay::answering(true, true)
}

/// Protocol versions from this one on deliver list_changed only to a `subscriptions/listen`
/// subscription; older ones send it unscoped to the handler callback. Dates compare as strings.
const SUBSCRIPTIONS_SINCE: &str = "2026-07-28";

/// Opens a list_changed subscription when the server speaks a protocol that needs one and
/// advertises `listChanged` for tools, resources or prompts; the task ends with the session.
pub(super) fn subscribe_to_list_changes(
    server_id: &Arc<str>,
    service: &RunningService<RoleClient, PoolHandler>,
    watchers: &Watchers,
) {
    let Some(peer_info) = service.peer_info() else { return };
    let capabilities = &peer_info.capabilities;
    let tools = capabilities.tools.as_ref().and_then(|t| t.list_changed).unwrap_or(false);
    let resources = capabilities.resources.as_ref().and_then(|r| r.list_changed).unwrap_or(false);
    let prompts = capabilities.prompts.as_ref().and_then(|p| p.list_changed).unwrap_or(false);
    if !(tools || resources || prompts) || peer_info.protocol_version.as_str() < SUBSCRIPTIONS_SINCE {
        return;
    }
    let peer = service.peer().clone();
    let watchers = watchers.clone();
    let span = tracing::debug_span!("mcp_list_changed", server_id = %server_id);
    tokio::spawn(
        async move {
            let mut filter = SubscriptionFilter::new();
            filter.tools_list_changed = tools.then_some(true);
            filter.resources_list_changed = resources.then_some(true);
            filter.prompts_list_changed = prompts.then_some(true);
            let mut subscription = match peer.listen(filter).await {
                Ok(subscription) => subscription,
                Err(e) => {
                    tracing::debug!(error = %e, "no list_changed subscription; relying on TTL");
                    return;
                }
            };
            while let Ok(Some(notification)) = subscription.next().await {
                match notification {
                    ServerNotification::ToolListChangedNotification(_) => watchers.tools.bump(),
                    ServerNotification::ResourceListChangedNotification(_)
                    | ServerNotification::PromptListChangedNotification(_) => watchers.items.bump(),
                    _ => {}
                }
            }
        }
        .instrument(span),
    );
}
