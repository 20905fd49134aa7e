//! A Streamable HTTP server: rmcp's client transport over [`PoolHttp`], which adds a call's
//! trace context as headers and the server's bearer token (`http.auth`: renewed and sent again
//! once on a 401), and turns a 401 without `http.auth` into an error saying to set it.
//!
//! Configured header values may be secrets: errors name the header, never its value.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::ClientLifecycleMode;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};

use super::{Service, Start, unavailable};
use crate::mcp::error::McpError;
use crate::mcp::oauth;
use crate::mcp::token_source::TokenSource;
use crate::telemetry::otel;

/// What a Streamable HTTP session uses besides its endpoint.
#[derive(Default)]
pub(crate) struct HttpParts {
    /// The client; `None`: rmcp's default one.
    pub(crate) client: Option<reqwest::Client>,
    /// The server's tokens (`http.auth`).
    pub(crate) auth: Option<Arc<TokenSource>>,
    /// Where to note the server's `WWW-Authenticate` challenge when it answers 401 and there is
    /// no `auth` (the operator's probe reports it).
    pub(crate) challenge: Option<ChallengeSlot>,
    /// Addresses never dialled (`--egress-deny-cidrs`, or the probe's list).
    pub(crate) deny: crate::egress::AddressDenyList,
}

/// The last 401 challenge a server sent.
pub(crate) type ChallengeSlot = Arc<parking_lot::Mutex<Option<String>>>;

/// Why a session's authorization failed for good (an [`oauth::TokenError`] that is `lasting`,
/// or a 401 with no `http.auth`): a start that failed for it is not retryable.
pub(super) type RefusalSlot = Arc<parking_lot::Mutex<Option<String>>>;

impl HttpParts {
    /// The agent's: rmcp's client under the deny list, with the server's tokens if it has any.
    pub(crate) fn agent(auth: Option<&Arc<TokenSource>>, deny: &crate::egress::AddressDenyList) -> Self {
        HttpParts { client: None, auth: auth.cloned(), challenge: None, deny: deny.clone() }
    }
}

/// Speaks `lifecycle` with the server at `url`, sending `headers` (expanded) with every request.
pub(super) async fn open(
    start: &Start<'_>,
    url: &str,
    headers: &[(String, String)],
    lifecycle: ClientLifecycleMode,
) -> Result<Service, McpError> {
    let http_client = start.http.client.clone();
    let deny = &start.http.deny;
    if deny.denies_literal(url) {
        let message = format!("{url} is an address the agent {} ({DENIED_HINT})", crate::egress::DENIED);
        return Err(McpError { retryable: false, ..unavailable(message) });
    }
    let mut custom = HashMap::new();
    for (name, value) in headers {
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| unavailable(format!("header name '{name}': {e}")))?;
        // The value may be a secret: the error names the header, never the value.
        let value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| unavailable(format!("header '{name}' has a value that is not valid in HTTP")))?;
        custom.insert(name, value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    config.custom_headers = custom;
    config.max_sse_event_size = start.frame_limit;
    config.reinit_on_expired_session = true;
    let client = match http_client {
        Some(client) => client,
        None => rmcp_default_client(deny)
            .map_err(|e| unavailable(format!("building the HTTP client: {}", crate::telemetry::error_chain(&e))))?,
    };
    let client = PoolHttp {
        client,
        trace: otel::active(),
        auth: start.http.auth.clone(),
        challenge: start.http.challenge.clone(),
        refusal: start.refusal.clone(),
    };
    let transport = StreamableHttpClientTransport::with_client(client, config);
    start.handshake(transport, lifecycle).await
}

/// The pool's Streamable HTTP client: rmcp's reqwest client, plus
/// - with tracing on, a call's W3C trace context (the `traceparent` and `tracestate` of its
///   `_meta`, set by the pool) as headers, so a server whose HTTP stack is instrumented
///   continues the trace without reading `_meta`;
/// - with `http.auth`, the bearer token of the server's [`TokenSource`]: on a 401 the source
///   renews it (following the server's challenge) and the request is sent again, once;
/// - without `http.auth`, a 401 becomes an error that says how to configure auth.
#[derive(Clone)]
struct PoolHttp {
    client: reqwest::Client,
    trace: bool,
    auth: Option<Arc<TokenSource>>,
    challenge: Option<ChallengeSlot>,
    refusal: RefusalSlot,
}

type HeaderMapOf = HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>;
/// rmcp's SSE event cap for the calls that name none (its constant is crate-private).
const RMCP_DEFAULT_MAX_SSE_EVENT_SIZE: usize = 16 * 1024 * 1024;
type HttpResult<T> = Result<T, StreamableHttpError<reqwest::Error>>;

/// Adds the trace-context entries of `message`'s `_meta` (a `tools/call` only) to `headers`.
fn add_trace_headers(message: &rmcp::model::ClientJsonRpcMessage, headers: &mut HeaderMapOf) {
    let rmcp::model::JsonRpcMessage::Request(request) = message else { return };
    let rmcp::model::ClientRequest::CallToolRequest(call) = &request.request else { return };
    for (name, value) in otel::meta_headers(call.params.meta.as_ref()) {
        if let Ok(value) = reqwest::header::HeaderValue::from_str(value) {
            headers.insert(reqwest::header::HeaderName::from_static(name), value);
        }
    }
}

fn auth_failed(message: String) -> StreamableHttpError<reqwest::Error> {
    StreamableHttpError::Auth(rmcp::transport::auth::AuthError::AuthorizationFailed(message))
}

impl PoolHttp {
    /// A 401 to a request sent without auth: noted, and the error that says to configure it.
    fn unauthorized(&self, challenge: &str) -> StreamableHttpError<reqwest::Error> {
        if let Some(slot) = &self.challenge {
            *slot.lock() = Some(challenge.to_string());
        }
        self.refused(oauth::unconfigured_auth_message(challenge))
    }

    /// An authorization failure that repeats until the configuration changes: noted for the
    /// start's error (see [`RefusalSlot`]).
    fn refused(&self, message: String) -> StreamableHttpError<reqwest::Error> {
        *self.refusal.lock() = Some(message.clone());
        auth_failed(message)
    }

    fn token_failed(&self, error: oauth::TokenError) -> StreamableHttpError<reqwest::Error> {
        if error.lasting { self.refused(error.message) } else { auth_failed(error.message) }
    }

    /// Runs `call` with the server's token, renewing it and calling again once on a 401.
    async fn authorized<T, F, Fut>(&self, call: F) -> HttpResult<T>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = HttpResult<T>>,
    {
        let Some(source) = &self.auth else {
            return match call(None).await {
                Err(StreamableHttpError::AuthRequired(c)) => Err(self.unauthorized(&c.www_authenticate_header)),
                other => other,
            };
        };
        let token = source.current().await.map_err(|e| self.token_failed(e))?;
        match call(token.clone()).await {
            // 403 insufficient_scope: a newer grant's token, sent again once, or why not.
            Err(StreamableHttpError::InsufficientScope(e)) => {
                let fresh = source
                    .step_up(token.as_deref(), &e.www_authenticate_header)
                    .await
                    .map_err(|e| self.token_failed(e))?;
                call(Some(fresh)).await
            }
            Err(StreamableHttpError::AuthRequired(c)) => {
                let fresh = source
                    .renew(token.as_deref(), &c.www_authenticate_header)
                    .await
                    .map_err(|e| self.token_failed(e))?;
                match call(Some(fresh)).await {
                    Err(StreamableHttpError::AuthRequired(c)) => Err(self.refused(format!(
                        "the server rejected a freshly issued access token too (WWW-Authenticate: {}); check the \
                         scopes and audience the authorization server grants this client",
                        oauth::quote(&c.www_authenticate_header)
                    ))),
                    other => other,
                }
            }
            other => other,
        }
    }
}

impl StreamableHttpClient for PoolHttp {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: rmcp::model::ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HeaderMapOf,
    ) -> impl Future<Output = HttpResult<StreamableHttpPostResponse>> + Send + '_ {
        self.post_message_with_max_sse_event_size(
            uri,
            message,
            session_id,
            None,
            custom_headers,
            RMCP_DEFAULT_MAX_SSE_EVENT_SIZE,
        )
    }

    fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: rmcp::model::ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        mut custom_headers: HeaderMapOf,
        max_sse_event_size: usize,
    ) -> impl Future<Output = HttpResult<StreamableHttpPostResponse>> + Send + '_ {
        if self.trace {
            add_trace_headers(&message, &mut custom_headers);
        }
        async move {
            if self.auth.is_none() {
                // No token, no retry: the message is moved, not copied.
                let sent = self.client.post_message_with_max_sse_event_size(
                    uri,
                    message,
                    session_id,
                    None,
                    custom_headers,
                    max_sse_event_size,
                );
                return match sent.await {
                    Err(StreamableHttpError::AuthRequired(c)) => Err(self.unauthorized(&c.www_authenticate_header)),
                    other => other,
                };
            }
            self.authorized(|token| {
                self.client.post_message_with_max_sse_event_size(
                    uri.clone(),
                    message.clone(),
                    session_id.clone(),
                    token,
                    custom_headers.clone(),
                    max_sse_event_size,
                )
            })
            .await
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HeaderMapOf,
    ) -> HttpResult<()> {
        self.authorized(|token| {
            self.client.delete_session(uri.clone(), session_id.clone(), token, custom_headers.clone())
        })
        .await
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HeaderMapOf,
    ) -> impl Future<Output = HttpResult<SseStream>> + Send + '_ {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            None,
            custom_headers,
            RMCP_DEFAULT_MAX_SSE_EVENT_SIZE,
        )
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HeaderMapOf,
        max_sse_event_size: usize,
    ) -> HttpResult<SseStream> {
        self.authorized(|token| {
            self.client.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }
}

/// Where the deny list is set, for a refused server's error.
const DENIED_HINT: &str = "--egress-deny-cidrs: link-local, cloud metadata and 0.0.0.0/8 always, loopback in a pod";
/// The resolver's error for a name that resolves only into denied ranges.
const DENIED_BY_NAME: &str = "the server's name resolves only to addresses the agent does not connect to \
     (--egress-deny-cidrs: link-local, cloud metadata and 0.0.0.0/8 always, loopback in a pod)";
const _: () = assert!(crate::egress::is_denial(DENIED_BY_NAME));

/// What `StreamableHttpClientTransport::from_config` builds (rmcp keeps it private): no idle
/// pooling (rmcp's fix for delayed-ACK stalls), and only same-origin 307/308 redirects, up to 10,
/// since another status loses the POST body and another origin would get the session id and
/// the configured headers.
fn rmcp_default_client(deny: &crate::egress::AddressDenyList) -> Result<reqwest::Client, reqwest::Error> {
    const MAX_REDIRECTS: usize = 10;
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt.previous().first().is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("exceeded {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    let builder = crate::trust::client_builder().pool_max_idle_per_host(0).redirect(policy);
    deny.apply(builder, DENIED_BY_NAME).build()
}

type SseStream = futures::stream::BoxStream<'static, Result<sse_stream::Sse, SseError>>;
