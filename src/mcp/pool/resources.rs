//! Every request besides `tools/*`: resources (list, templates, read, subscribe), prompts (list,
//! get), completion and the log level. Each goes through [`Pool::request`], which answers a
//! default when the server's capabilities do not offer the feature; listings follow
//! `nextCursor` up to [`MAX_ITEM_PAGES`] pages and [`MAX_ITEMS`] items.
//!
//! Subscriptions: a 2025 server gets `resources/subscribe`; a 2026-07-28 server gets a
//! `subscriptions/listen` per URI, held on its `Connection`. Updates from every server meet in
//! one broadcast ([`Pool::resource_updates`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    ClientCapabilities, ClientRequest, CompleteRequestParams, CompletionInfo, GetPromptRequest, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, InputRequiredResult, PaginatedRequestParams, Prompt, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResult, Resource, ResourceTemplate, ServerCapabilities, ServerResult,
};
use rmcp::service::ServiceError;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::Pool;
use super::call::{Continuation, caller_meta, input_required, is_modern, send_call};
use super::slot::{Live, Slot};
use crate::mcp::error::{ErrorCode, McpError};
use crate::mcp::output::{self, Truncation};

/// Pages of a resources/prompts listing read from one server; a server paging on forever stops
/// here.
const MAX_ITEM_PAGES: usize = 16;
/// Resources, templates or prompts kept from one server's listing.
const MAX_ITEMS: usize = 1000;

/// Every page of a paginated listing, following `nextCursor`, up to [`MAX_ITEM_PAGES`] pages and
/// [`MAX_ITEMS`] items: a server paging on forever stops there.
async fn all_pages<T>(
    page: impl AsyncFn(PaginatedRequestParams) -> Result<(Vec<T>, Option<String>), ServiceError>,
) -> Result<Vec<T>, ServiceError> {
    let mut all = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_ITEM_PAGES {
        let (items, next) = page(PaginatedRequestParams::default().with_cursor(cursor)).await?;
        all.extend(items);
        cursor = next;
        if cursor.is_none() || all.len() >= MAX_ITEMS {
            break;
        }
    }
    all.truncate(MAX_ITEMS);
    Ok(all)
}

/// A resource read or prompt get as the pool returns it.
#[derive(Clone, Debug)]
pub struct ItemRead<T> {
    /// The result, its parts cut to the output budget.
    pub result: T,
    /// The parts' size before the cap (`output::parts_size`).
    pub bytes: usize,
    /// Set when parts were cut.
    pub truncated: Option<Truncation>,
    /// The server's request for input (2026-07-28 `InputRequiredResult`), for a caller that can
    /// answer it (`result` is then empty); a caller that cannot gets `mcp_approval_required`.
    pub input_required: Option<Arc<InputRequiredResult>>,
}

impl<T: serde::de::DeserializeOwned> ItemRead<T> {
    /// Cuts the array `key` of `json` (a result as JSON) to `limit` bytes and reads it back.
    fn capped(
        mut json: Value,
        key: &str,
        text_pointer: &str,
        limit: usize,
        marker: impl FnOnce(&Truncation) -> Value,
    ) -> Result<Self, McpError> {
        let (bytes, truncated) = match json.get_mut(key).and_then(Value::as_array_mut) {
            Some(parts) => {
                let truncated = output::cap_parts(parts, limit, text_pointer, marker);
                (truncated.map_or_else(|| output::parts_size(parts, text_pointer), |t| t.original_bytes), truncated)
            }
            None => (0, None),
        };
        Ok(ItemRead {
            result: serde_json::from_value(json).map_err(unreadable)?,
            bytes,
            truncated,
            input_required: None,
        })
    }
}

fn unreadable(error: serde_json::Error) -> McpError {
    McpError::new(ErrorCode::McpUnavailable, format!("unreadable server answer: {error}"))
}

impl Pool {
    /// Runs one request other than `tools/call` (resources, prompts) on `server`'s session
    /// within `timeout`. `offered` says from the server's capabilities whether it has the
    /// feature at all; without it the answer is `default`, not a request the server would refuse.
    async fn request<T, Fut>(
        &self,
        server: &str,
        what: &str,
        timeout: Duration,
        offered: impl FnOnce(&ServerCapabilities) -> bool,
        default: impl FnOnce() -> T,
        run: impl FnOnce(rmcp::service::Peer<rmcp::RoleClient>) -> Fut,
    ) -> Result<T, McpError>
    where
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        let slot = self.slot(server)?;
        let work = async {
            let live = Slot::session(&slot, &self.inner).await?;
            let peer = live.conn.service.peer().clone();
            let has = peer.peer_info().is_some_and(|info| offered(&info.capabilities));
            let result = if has { Some(run(peer).await) } else { None };
            Ok::<_, McpError>((live, result))
        };
        match tokio::time::timeout(timeout, work).await {
            Err(_) => Err(McpError::new(
                ErrorCode::McpTimeout,
                format!("{what} on '{server}' did not finish within {} ms", timeout.as_millis()),
            )),
            Ok(Err(error)) => Err(error),
            Ok(Ok((_, None))) => Ok(default()),
            Ok(Ok((live, Some(Ok(value))))) => {
                *live.last_used.lock() = Instant::now();
                Ok(value)
            }
            Ok(Ok((live, Some(Err(error))))) => Err(slot.failed(&live, error).await),
        }
    }

    /// Resolves once any server sends `resources/list_changed` or `prompts/list_changed` after
    /// [`Self::items_generation`] was `generation`.
    pub(crate) async fn items_changed_since(&self, generation: u64) {
        self.inner.items_changed.changed_since(generation).await;
    }

    /// Resources/prompts list_changed notifications received so far, from every server.
    pub(crate) fn items_generation(&self) -> u64 {
        self.inner.items_changed.generation()
    }

    /// The server's resources (every page, up to [`MAX_ITEM_PAGES`] and
    /// [`MAX_ITEMS`]); empty when it offers none.
    pub async fn list_resources(&self, server: &str, timeout: Duration) -> Result<Vec<Resource>, McpError> {
        let offered = |c: &ServerCapabilities| c.resources.is_some();
        self.request(server, "resources/list", timeout, offered, Vec::new, |peer| {
            all_pages(async move |params| {
                peer.list_resources(Some(params)).await.map(|page| (page.resources, page.next_cursor))
            })
        })
        .await
    }

    /// The server's resource templates (bounded as [`Self::list_resources`]).
    pub async fn list_resource_templates(
        &self,
        server: &str,
        timeout: Duration,
    ) -> Result<Vec<ResourceTemplate>, McpError> {
        let offered = |c: &ServerCapabilities| c.resources.is_some();
        self.request(server, "resources/templates/list", timeout, offered, Vec::new, |peer| {
            all_pages(async move |params| {
                peer.list_resource_templates(Some(params)).await.map(|page| (page.resource_templates, page.next_cursor))
            })
        })
        .await
    }

    /// `completion/complete` on `server`, `params` naming the server's own prompt or resource
    /// template; no values when the server offers no completions. At most the spec's 100 values
    /// are passed on, whatever the server sends.
    pub async fn complete(
        &self,
        server: &str,
        params: CompleteRequestParams,
        timeout: Duration,
    ) -> Result<CompletionInfo, McpError> {
        let offered = |c: &ServerCapabilities| c.completions.is_some();
        let mut completion = self
            .request(server, "completion/complete", timeout, offered, CompletionInfo::default, |peer| async move {
                peer.complete(params).await.map(|result| result.completion)
            })
            .await?;
        cap_completion(&mut completion);
        Ok(completion)
    }

    /// Sets `server`'s log level (`logging/setLevel`) when it offers logging; else nothing.
    #[allow(deprecated)] // logging is deprecated by SEP-2577, yet lives in 2025-11-25.
    pub async fn set_log_level(
        &self,
        server: &str,
        level: rmcp::model::LoggingLevel,
        timeout: Duration,
    ) -> Result<(), McpError> {
        let offered = |c: &ServerCapabilities| c.logging.is_some();
        self.request(
            server,
            "logging/setLevel",
            timeout,
            offered,
            || (),
            |peer| async move {
                // A 2026-07-28 server has no setLevel: each call asks for its own level.
                match peer.peer_info().is_some_and(|info| is_modern(&info.protocol_version)) {
                    true => Ok(()),
                    false => peer.set_level(rmcp::model::SetLevelRequestParams::new(level)).await,
                }
            },
        )
        .await
    }

    /// Subscribes to (or unsubscribes from) `server`'s resource `uri`; an error when the server
    /// offers no subscriptions.
    #[allow(deprecated)] // resources/subscribe is the 2025 revisions' (2026-07-28 listens).
    pub async fn subscribe_resource(
        &self,
        server: &str,
        uri: &str,
        subscribe: bool,
        timeout: Duration,
    ) -> Result<(), McpError> {
        let offered = |c: &ServerCapabilities| c.resources.as_ref().is_some_and(|r| r.subscribe == Some(true));
        let what = if subscribe { "resources/subscribe" } else { "resources/unsubscribe" };
        let slot = self.slot(server)?;
        let live = tokio::time::timeout(timeout, Slot::session(&slot, &self.inner)).await.map_err(|_| {
            McpError::new(ErrorCode::McpTimeout, format!("{what} on '{server}': the server did not start"))
        })??;
        if is_modern(&live.conn.protocol) {
            return self.listen_to_resource(&live, server, uri, subscribe, timeout).await;
        }
        let uri = uri.to_string();
        let done = self
            .request(
                server,
                what,
                timeout,
                offered,
                || false,
                |peer| async move {
                    if subscribe {
                        peer.subscribe(rmcp::model::SubscribeRequestParams::new(uri)).await
                    } else {
                        peer.unsubscribe(rmcp::model::UnsubscribeRequestParams::new(uri)).await
                    }
                    .map(|()| true)
                },
            )
            .await?;
        if done {
            Ok(())
        } else {
            Err(McpError::new(ErrorCode::McpInvalidArguments, format!("'{server}' offers no resource subscriptions")))
        }
    }

    /// [`Self::subscribe_resource`] on a 2026-07-28 session, which has no `resources/subscribe`:
    /// a `subscriptions/listen` for the one URI, held until unsubscribed or the session ends,
    /// whose updates join every other server's.
    async fn listen_to_resource(
        &self,
        live: &Live,
        server: &str,
        uri: &str,
        subscribe: bool,
        timeout: Duration,
    ) -> Result<(), McpError> {
        if !subscribe {
            live.conn.resource_listens.lock().remove(uri);
            return Ok(());
        }
        let mut filter = rmcp::model::SubscriptionFilter::new();
        filter.resource_subscriptions = Some(vec![uri.to_string()]);
        let peer = live.conn.service.peer();
        let listened = tokio::time::timeout(timeout, peer.listen(filter)).await.map_err(|_| {
            McpError::new(ErrorCode::McpTimeout, format!("subscriptions/listen on '{server}' was not acknowledged"))
        })?;
        let mut subscription = listened.map_err(|e| {
            McpError::new(ErrorCode::McpUnavailable, format!("'{server}' refused to listen to '{uri}': {e}"))
        })?;
        let (ended, updates, server_id) =
            (CancellationToken::new(), self.inner.resource_updates.clone(), Arc::<str>::from(server));
        let until = ended.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = until.cancelled() => return,
                    next = subscription.next() => next,
                };
                match next {
                    Ok(Some(rmcp::model::ServerNotification::ResourceUpdatedNotification(updated))) => {
                        let _ = updates.send((server_id.clone(), updated.params.uri));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return,
                }
            }
        });
        live.conn.resource_listens.lock().insert(uri.to_string(), ended.drop_guard());
        Ok(())
    }

    /// `notifications/resources/updated` from every server, as (server id, the server's URI).
    pub(crate) fn resource_updates(&self) -> tokio::sync::broadcast::Receiver<(Arc<str>, String)> {
        self.inner.resource_updates.subscribe()
    }

    /// The server's prompts (bounded as [`Self::list_resources`]).
    pub async fn list_prompts(&self, server: &str, timeout: Duration) -> Result<Vec<Prompt>, McpError> {
        let offered = |c: &ServerCapabilities| c.prompts.is_some();
        self.request(server, "prompts/list", timeout, offered, Vec::new, |peer| {
            all_pages(async move |params| {
                peer.list_prompts(Some(params)).await.map(|page| (page.prompts, page.next_cursor))
            })
        })
        .await
    }

    /// Reads `uri` on `server` within `timeout`, its contents cut to `max_output_bytes` (with
    /// a marker content saying so).
    pub async fn read_resource(
        &self,
        server: &str,
        uri: &str,
        timeout: Duration,
        max_output_bytes: usize,
    ) -> Result<ItemRead<ReadResourceResult>, McpError> {
        let offered = |c: &ServerCapabilities| c.resources.is_some();
        let none = || ReadResourceResult::new(Vec::new());
        let params = ReadResourceRequestParams::new(uri.to_string());
        let result = self.request(server, "resources/read", timeout, offered, none, |peer| async move {
            peer.read_resource(params).await
        });
        let json = serde_json::to_value(result.await?).map_err(unreadable)?;
        let uri = uri.to_string();
        let marker = |t: &Truncation| serde_json::json!({"uri": uri, "mimeType": "text/plain", "text": t.marker()});
        ItemRead::capped(json, "contents", "/text", max_output_bytes, marker)
    }

    /// Gets prompt `name` with `arguments` on `server` within `timeout`, its messages cut to
    /// `max_output_bytes` (with a marker message saying so).
    pub async fn get_prompt(
        &self,
        server: &str,
        name: &str,
        arguments: Option<Map<String, Value>>,
        limits: (Duration, usize),
        input: Option<&Continuation>,
    ) -> Result<ItemRead<GetPromptResult>, McpError> {
        let (timeout, max_output_bytes) = limits;
        let offered = |c: &ServerCapabilities| c.prompts.is_some();
        let none = || GetPromptResponse::Complete(GetPromptResult::new(Vec::new()));
        let mut params = GetPromptRequestParams::new(name.to_string());
        params.arguments = arguments;
        if let Some(continuation) = input {
            params.input_responses = continuation.input_responses.clone();
            params.request_state = continuation.request_state.clone();
        }
        // One round, as for calls: the server's request for input goes to a caller that can
        // answer it, or ends the get.
        let caller = input.and_then(|c| c.client_capabilities.clone());
        let result = self.request(server, "prompts/get", timeout, offered, none, |peer| async move {
            let per_request = peer
                .peer_info()
                .is_some_and(|info| info.protocol_version.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
            match caller.filter(|_| per_request) {
                Some(capabilities) => {
                    let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
                    match send_as_caller(&peer, request, &capabilities).await? {
                        ServerResult::GetPromptResult(result) => Ok(GetPromptResponse::Complete(result)),
                        ServerResult::InputRequiredResult(asked) => Ok(GetPromptResponse::InputRequired(asked)),
                        _ => Err(ServiceError::UnexpectedResponse),
                    }
                }
                None => peer.get_prompt_once(params).await,
            }
        });
        let result = match result.await? {
            GetPromptResponse::InputRequired(asked) if input.is_some() => {
                let result = GetPromptResult::new(Vec::new());
                return Ok(ItemRead { result, bytes: 0, truncated: None, input_required: Some(Arc::new(asked)) });
            }
            GetPromptResponse::InputRequired(asked) => return Err(input_required(server, name, &asked)),
            GetPromptResponse::Complete(result) => result,
            _ => {
                let what = "an answer to prompts/get that is neither a prompt nor a request for input";
                return Err(McpError::new(ErrorCode::McpUnavailable, format!("unreadable server answer: {what}")));
            }
        };
        let json = serde_json::to_value(result).map_err(unreadable)?;
        let marker =
            |t: &Truncation| serde_json::json!({"role": "user", "content": {"type": "text", "text": t.marker()}});
        ItemRead::capped(json, "messages", "/content/text", max_output_bytes, marker)
    }
}

/// At most the spec's 100 completion values, whatever a server sends; more is said by `hasMore`.
fn cap_completion(completion: &mut CompletionInfo) {
    if completion.values.len() > CompletionInfo::MAX_VALUES {
        completion.values.truncate(CompletionInfo::MAX_VALUES);
        completion.has_more = Some(true);
    }
}

/// Sends `request` with `capabilities` as its `clientCapabilities` (2026-07-28 per-request
/// `_meta`; rmcp would send the pool's own), and tells the server when the answer is no longer
/// awaited (the caller went away, the budget ran out), as rmcp's own `*_once` calls do.
async fn send_as_caller(
    peer: &rmcp::service::Peer<rmcp::RoleClient>,
    request: ClientRequest,
    capabilities: &ClientCapabilities,
) -> Result<ServerResult, ServiceError> {
    send_call(peer, request, Some(caller_meta(capabilities)), None).await
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;

    /// A server answering ten thousand completions gets the spec's hundred through.
    #[test]
    fn a_flood_of_completion_values_is_cut_to_the_specs_limit() {
        let mut completion = CompletionInfo::default();
        completion.values = (0..10_000).map(|i| i.to_string()).collect();
        cap_completion(&mut completion);
        assert_eq!((completion.values.len(), completion.has_more), (CompletionInfo::MAX_VALUES, Some(true)));
    }

    /// The attack: a server that pages forever, or sends pages of thousands of items.
    #[tokio::test]
    async fn listings_stop_at_the_page_and_item_caps() {
        let pages = std::sync::atomic::AtomicUsize::new(0);
        let endless = all_pages(async |_params| {
            pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok((vec![0u8; 3], Some("more".to_string())))
        });
        assert_eq!(endless.await.expect("pages").len(), 3 * MAX_ITEM_PAGES);
        assert_eq!(pages.load(std::sync::atomic::Ordering::Relaxed), MAX_ITEM_PAGES);
        let huge = all_pages(async |_params| Ok((vec![0u8; MAX_ITEMS + 5], Some("more".to_string()))));
        assert_eq!(huge.await.expect("pages").len(), MAX_ITEMS, "one page past the cap is cut to it");
        let cursors = Mutex::new(Vec::new());
        let two = all_pages(async |params: PaginatedRequestParams| {
            let mut seen = cursors.lock();
            seen.push(params.cursor.clone());
            Ok((vec![1u8], (seen.len() < 2).then(|| "page-2".to_string())))
        });
        assert_eq!(two.await.expect("pages"), [1, 1]);
        assert_eq!(*cursors.lock(), [None, Some("page-2".to_string())], "the next cursor is passed on");
    }
}
