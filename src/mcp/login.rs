//! `spearlet auth login`: a person's consent to one Streamable HTTP server, as the MCP
//! authorization spec's authorization-code flow, ending in a grant the agent uses without them.
//!
//! ```text
//! probe the server ──401 challenge──▶ protected-resource metadata (RFC 9728) ──▶ its resource
//!   must cover the server URL; its authorization servers must include the pinned issuer
//! ──▶ authorization-server metadata from the pinned issuer (RFC 8414 / OpenID; the 2025-03-26
//!   defaults when the server publishes no metadata at all) ──▶ the client: pre-registered,
//!   client ID metadata document, or dynamic registration (RFC 7591)
//! ──▶ loopback listener + PKCE + state ──▶ the URL printed (and opened) ──▶ the redirect
//!   (state, iss: `oauth::authorization_code`) ──▶ code for tokens at the token endpoint
//! ──▶ StoredGrant (the caller stores it)
//! ```
//!
//! - **Pinned.** Every request that carries something of the person's (the code, the verifier,
//!   a client secret) goes to the endpoints of the McpServer's `auth.issuer` only, and only
//!   after its metadata names that issuer: a server or its metadata cannot choose where the
//!   consent goes. A refusal happens before the step it protects (no authorization request
//!   for a resource mismatch; no registration, authorization or token request for an issuer
//!   mismatch; no token request for a redirect with a wrong `iss`).
//! - **Scopes**: the server's challenge, else its metadata's `scopes_supported`, else none,
//!   narrowed to the McpServer's `auth.scopes`; plus `offline_access` where the authorization
//!   server lists it (the refresh token is what makes the grant outlive the person's session).
//! - **The listener** binds loopback only, answers only `/callback`, and ignores redirects
//!   that are not this flow's (`Redirect::Stray`) until the timeout.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::response::Html;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::discovery::{self, Document};
use super::oauth::authorization_code::{self as code_flow, AuthorizationRequest, ExpectedRedirect, Pkce, Redirect};
use super::oauth::grant::{ClientAuthMethod, GRANT_FORMAT, GrantClient, StoredGrant, unix_now};
use super::oauth::{self, TokenError};
use super::outbound_http::OutboundHttp;
use crate::egress::AddressDenyList;

/// Why a login did not end in a grant. The text names what the server or the authorization
/// server said and the fix, never a token or secret.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct LoginError(String);

impl From<TokenError> for LoginError {
    fn from(e: TokenError) -> Self {
        LoginError(e.message)
    }
}

fn refuse(message: impl Into<String>) -> LoginError {
    LoginError(message.into())
}

/// The McpServer's client configuration (`auth.authorizationCode`), secrets resolved.
#[derive(Clone, Default)]
pub(crate) struct LoginClient {
    pub(crate) client_id: Option<String>,
    pub(crate) client_secret: Option<String>,
    pub(crate) metadata_url: Option<String>,
}

/// What one login needs.
#[derive(Clone)]
pub(crate) struct LoginRequest {
    /// The McpServer's name.
    pub(crate) server: String,
    /// Its `spec.http.url`.
    pub(crate) url: String,
    /// Its `spec.http.auth.issuer`, exactly as written.
    pub(crate) issuer: String,
    pub(crate) client: LoginClient,
    /// Its `spec.http.auth.scopes` (empty: whatever the server asks for).
    pub(crate) allowed_scopes: Vec<String>,
    /// Scopes asked for on top (the server demanded them of a stored grant: step-up).
    pub(crate) extra_scopes: Vec<String>,
    /// The loopback port of the redirect URI (0: any free one).
    pub(crate) redirect_port: u16,
    /// How long to wait for the person.
    pub(crate) timeout: Duration,
}

impl std::fmt::Debug for LoginRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginRequest").field("server", &self.server).field("url", &self.url).finish_non_exhaustive()
    }
}

/// The authorization server's endpoints and what its metadata says.
pub(crate) struct AuthorizationServer {
    pub(crate) authorization_endpoint: url::Url,
    pub(crate) token_endpoint: url::Url,
    pub(crate) registration_endpoint: Option<url::Url>,
    pub(crate) iss_supported: bool,
    cimd_supported: bool,
    auth_methods: Option<Vec<String>>,
    scopes_supported: Vec<String>,
}

/// The MCP protocol revision the probe speaks.
const PROBE_PROTOCOL_VERSION: &str = "2025-11-25";
/// A probe request's time to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs the flow (module header); `show` is given the authorization URL once the listener is up.
pub(crate) async fn login(request: &LoginRequest, show: impl FnOnce(&url::Url)) -> Result<StoredGrant, LoginError> {
    let server_url = url::Url::parse(&request.url).map_err(|e| refuse(format!("spec.http.url: {e}")))?;
    let http = OutboundHttp::anchored(&request.url, "OAuth requests", &AddressDenyList::none());
    let challenge = probe(&http, &server_url).await?;

    // The protected-resource metadata: any document is read, then judged (a mismatch stops here).
    let found = discovery::resource_metadata(&http, &server_url, challenge.as_deref(), |_| true).await?;
    let (resource, resource_scopes) = match &found {
        Some((at, document)) => {
            let resource = document.get("resource").and_then(|r| r.as_str()).unwrap_or(&request.url).to_string();
            if !resource_covers(&resource, &server_url) {
                return Err(refuse(format!(
                    "the protected-resource metadata at {at} is for {}, not {}: it speaks for another resource \
                     (RFC 9728 section 3.3), so no authorization was asked for",
                    oauth::origin_of(&resource),
                    request.url
                )));
            }
            let named = oauth::strings(document.get("authorization_servers")).unwrap_or_default();
            if let Some(why) = oauth::foreign_authorization_server(&named, &request.issuer) {
                return Err(refuse(why));
            }
            (resource, oauth::strings(document.get("scopes_supported")).unwrap_or_default())
        }
        None => (request.url.clone(), Vec::new()),
    };

    let issuer_url = url::Url::parse(&request.issuer).map_err(|e| refuse(format!("spec.http.auth.issuer: {e}")))?;
    let metadata = discovery::server_metadata(&http, &issuer_url).await?;
    let server = match metadata {
        Some(document) => {
            if let Some(why) =
                oauth::issuer_refusal(&request.issuer, document.get("issuer").and_then(|v| v.as_str()), true)
            {
                return Err(refuse(why));
            }
            authorization_server(&document, &server_url)?
        }
        // A 2025-03-26 server: no metadata anywhere, the endpoints at the issuer's root.
        None if found.is_none() => legacy_authorization_server(&issuer_url)?,
        None => return Err(discovery::no_server_metadata(&issuer_url).into()),
    };

    // Loopback only (RFC 8252 section 7.3): the port is free, the path fixed.
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, request.redirect_port)))
        .await
        .map_err(|e| refuse(format!("listening for the redirect on 127.0.0.1:{}: {e}", request.redirect_port)))?;
    let port = listener.local_addr().map_err(|e| refuse(format!("the redirect listener: {e}")))?.port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");

    let scope = scopes(request, challenge.as_deref(), &resource_scopes, &server.scopes_supported).join(" ");
    let client = client(&http, request, &server, &redirect_uri, &scope).await?;
    let pkce = Pkce::random().map_err(|e| refuse(format!("randomness for PKCE: {e}")))?;
    let state = code_flow::random_state().map_err(|e| refuse(format!("randomness for state: {e}")))?;
    let authorize = code_flow::authorization_url(
        &server.authorization_endpoint,
        &AuthorizationRequest {
            client_id: &client.client_id,
            redirect_uri: &redirect_uri,
            code_challenge: &pkce.challenge,
            state: &state,
            scope: &scope,
            resource: &resource,
        },
    );

    let expected = ExpectedRedirect { state: &state, issuer: &request.issuer, iss_supported: server.iss_supported };
    let code = wait_for_redirect(listener, &expected, request.timeout, || show(&authorize)).await?;

    let form = [
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("redirect_uri", redirect_uri.as_str()),
        ("code_verifier", pkce.verifier.as_str()),
        ("resource", resource.as_str()),
    ];
    let answer = http
        .post_form_as_client(
            &server.token_endpoint,
            &form,
            &client.client_id,
            client.client_secret.as_deref(),
            client.auth_method,
        )
        .await?;
    let issued = oauth::parse_token_response(answer.status, &answer.body)?;
    let now = unix_now();
    Ok(StoredGrant {
        format: GRANT_FORMAT,
        server: request.server.clone(),
        server_url: request.url.clone(),
        resource,
        issuer: request.issuer.clone(),
        client,
        scope: issued.scope.clone().unwrap_or(scope),
        refresh_token: issued.refresh_token,
        access_token: Some(issued.access_token),
        access_token_expires_at: issued.expires_in.map(|d| now.saturating_add(d.as_secs())),
        obtained_at: now,
        refreshed_at: None,
        step_up_scopes: Vec::new(),
    })
}

/// The server's challenge: an `initialize` without a token, then (a server that lets
/// `initialize` through) a `tools/list` in its session. `None`: it asked for nothing.
async fn probe(http: &OutboundHttp, server: &url::Url) -> Result<Option<String>, LoginError> {
    let initialize = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": PROBE_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "spearlet-auth-login", "version": env!("CARGO_PKG_VERSION")}
        }
    });
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    let mut session = None;
    for body in [initialize, list] {
        let mut headers = vec![("mcp-protocol-version", PROBE_PROTOCOL_VERSION.to_string())];
        if let Some(id) = &session {
            headers.push(("mcp-session-id", String::clone(id)));
        }
        let answer = http.post_json(server, body.to_string().into_bytes(), &headers, PROBE_TIMEOUT).await?;
        if matches!(answer.status, 401 | 403) {
            return Ok(answer.www_authenticate);
        }
        if answer.status >= 500 {
            return Err(refuse(format!("the server answered HTTP {} to the probe; try again later", answer.status)));
        }
        session = answer.session_id.or(session);
    }
    Ok(None)
}

/// Whether the protected-resource metadata's `resource` covers the server URL: the same origin,
/// and its path a prefix of the server's at a `/` boundary (the MCP spec's canonical server URI
/// may leave the path out).
pub(crate) fn resource_covers(resource: &str, server: &url::Url) -> bool {
    let Ok(resource) = url::Url::parse(resource) else { return false };
    if resource.origin() != server.origin() || resource.fragment().is_some() {
        return false;
    }
    let prefix = resource.path().trim_end_matches('/');
    let path = server.path();
    path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

/// An endpoint named by metadata: parsed, and refused unless it may receive the person's
/// credentials (https, or loopback next to a loopback server).
fn endpoint(document: &Document, key: &str, server: &url::Url) -> Result<Option<url::Url>, LoginError> {
    let Some(raw) = document.get(key).and_then(|v| v.as_str()) else { return Ok(None) };
    let url = url::Url::parse(raw).map_err(|e| refuse(format!("the metadata's {key} {}: {e}", oauth::quote(raw))))?;
    if !oauth::may_receive_credential(server, &url) {
        return Err(refuse(format!(
            "the metadata's {key} {url} is not https: the person's credentials are not sent in clear text (only \
             loopback servers may use http)"
        )));
    }
    Ok(Some(url))
}

pub(crate) fn authorization_server(document: &Document, server: &url::Url) -> Result<AuthorizationServer, LoginError> {
    if let Some(why) = oauth::grant_refusal(document.get("grant_types_supported"), "authorization_code") {
        return Err(refuse(why));
    }
    let methods = oauth::strings(document.get("code_challenge_methods_supported"));
    if let Some(why) = code_flow::pkce_refusal(methods.as_deref()) {
        return Err(refuse(why));
    }
    let required = |key: &str| {
        endpoint(document, key, server)?
            .ok_or_else(|| refuse(format!("the authorization-server metadata has no {key}")))
    };
    let flag = |key: &str| document.get(key).and_then(|v| v.as_bool()).unwrap_or(false);
    Ok(AuthorizationServer {
        authorization_endpoint: required("authorization_endpoint")?,
        token_endpoint: required("token_endpoint")?,
        registration_endpoint: endpoint(document, "registration_endpoint", server)?,
        iss_supported: flag("authorization_response_iss_parameter_supported"),
        cimd_supported: flag("client_id_metadata_document_supported"),
        auth_methods: oauth::strings(document.get("token_endpoint_auth_methods_supported")),
        scopes_supported: oauth::strings(document.get("scopes_supported")).unwrap_or_default(),
    })
}

/// The 2025-03-26 revision's defaults for a server that publishes no metadata: `/authorize`,
/// `/token` and `/register` at the issuer's origin.
fn legacy_authorization_server(issuer: &url::Url) -> Result<AuthorizationServer, LoginError> {
    let at = |path: &str| issuer.join(path).map_err(|e| refuse(format!("spec.http.auth.issuer: {e}")));
    Ok(AuthorizationServer {
        authorization_endpoint: at("/authorize")?,
        token_endpoint: at("/token")?,
        registration_endpoint: Some(at("/register")?),
        iss_supported: false,
        cimd_supported: false,
        auth_methods: None,
        scopes_supported: Vec::new(),
    })
}

/// The scopes of the authorization request (module header).
fn scopes(
    request: &LoginRequest,
    challenge: Option<&str>,
    resource_scopes: &[String],
    offered: &[String],
) -> Vec<String> {
    let from_challenge = super::token_source::challenge_scope(challenge, &request.url)
        .map(|s| s.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut asked = if from_challenge.is_empty() { resource_scopes.to_vec() } else { from_challenge };
    asked.extend(request.extra_scopes.iter().cloned());
    let mut scopes = oauth::request_scopes(&asked, &request.allowed_scopes);
    // With nothing else asked for, the parameter stays out (the authorization server's default).
    let offline = "offline_access".to_string();
    if offered.contains(&offline) && !scopes.is_empty() {
        scopes.push(offline);
    }
    scopes
}

/// The client this login uses: pre-registered, a metadata document, or registered now.
async fn client(
    http: &OutboundHttp,
    request: &LoginRequest,
    server: &AuthorizationServer,
    redirect_uri: &str,
    scope: &str,
) -> Result<GrantClient, LoginError> {
    let auth_methods = server.auth_methods.as_deref();
    if let Some(client_id) = &request.client.client_id {
        let secret = request.client.client_secret.clone();
        return Ok(GrantClient {
            client_id: client_id.clone(),
            auth_method: ClientAuthMethod::choose(secret.is_some(), auth_methods, None),
            client_secret: secret,
            registration: "preRegistered".to_string(),
        });
    }
    if let Some(url) = request.client.metadata_url.as_ref().filter(|_| server.cimd_supported) {
        return Ok(GrantClient {
            client_id: url.clone(),
            client_secret: None,
            auth_method: ClientAuthMethod::None,
            registration: "metadataDocument".to_string(),
        });
    }
    let Some(endpoint) = &server.registration_endpoint else {
        return Err(refuse(
            "the authorization server offers no dynamic client registration (no registration_endpoint) and no \
             client ID metadata documents: register a client there with the redirect URI \
             http://127.0.0.1/callback (any port) and set spec.http.auth.authorizationCode.clientId",
        ));
    };
    let offered = |m: &str| auth_methods.is_none_or(|all| all.iter().any(|x| x == m));
    let method =
        ["none", "client_secret_basic", "client_secret_post"].into_iter().find(|m| offered(m)).unwrap_or("none");
    let mut body = serde_json::json!({
        "client_name": format!("spearlet (McpServer {})", request.server),
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": method,
        "application_type": "native",
    });
    // The scopes the login asks for (RFC 7591 section 2): an authorization server that limits a
    // client to its registered scopes (Hydra does) refuses the others.
    if !scope.is_empty() {
        body["scope"] = scope.into();
    }
    let answer = http.post_json(endpoint, body.to_string().into_bytes(), &[], PROBE_TIMEOUT).await?;
    if !(200..300).contains(&answer.status) {
        let said = serde_json::from_slice::<serde_json::Value>(&answer.body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(oauth::quote))
            .unwrap_or_default();
        return Err(refuse(format!(
            "the authorization server refused to register a client (HTTP {} {said}): register one by hand and set \
             spec.http.auth.authorizationCode.clientId",
            answer.status
        )));
    }
    let registered: serde_json::Value = serde_json::from_slice(&answer.body)
        .map_err(|e| refuse(format!("the registration answer is not JSON ({e})")))?;
    let text = |key: &str| registered.get(key).and_then(|v| v.as_str()).filter(|s| !s.is_empty()).map(str::to_string);
    let client_id = text("client_id").ok_or_else(|| refuse("the registration answer has no client_id"))?;
    let secret = text("client_secret");
    let registered_method = text("token_endpoint_auth_method");
    Ok(GrantClient {
        client_id,
        auth_method: ClientAuthMethod::choose(secret.is_some(), auth_methods, registered_method.as_deref()),
        client_secret: secret,
        registration: "dynamic".to_string(),
    })
}

/// What the listener's handler shares with the flow.
struct Waiting {
    state: String,
    issuer: String,
    iss_supported: bool,
    outcome: Mutex<Option<tokio::sync::oneshot::Sender<Result<String, String>>>>,
}

/// Serves `/callback` on `listener` until this flow's redirect arrives (or `timeout`); `ready`
/// runs once the listener accepts.
async fn wait_for_redirect(
    listener: tokio::net::TcpListener,
    expected: &ExpectedRedirect<'_>,
    timeout: Duration,
    ready: impl FnOnce(),
) -> Result<String, LoginError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let waiting = Arc::new(Waiting {
        state: expected.state.to_string(),
        issuer: expected.issuer.to_string(),
        iss_supported: expected.iss_supported,
        outcome: Mutex::new(Some(tx)),
    });
    let router = axum::Router::new().route("/callback", axum::routing::get(callback)).with_state(waiting);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(crate::http_server::serve(
        listener,
        router,
        crate::http_server::ConnectionLimits::default(),
        shutdown.clone(),
    ));
    ready();
    let outcome = tokio::time::timeout(timeout, rx).await;
    shutdown.cancel();
    // The page the browser is shown has been sent; the server ends with its connections.
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    match outcome {
        Ok(Ok(Ok(code))) => Ok(code),
        Ok(Ok(Err(why))) => Err(refuse(why)),
        Ok(Err(_)) => Err(refuse("the redirect listener stopped")),
        Err(_) => Err(refuse(format!(
            "no authorization came back within {} s: open the URL in a browser on this machine (the redirect goes \
             to 127.0.0.1), or run again with a longer --timeout",
            timeout.as_secs()
        ))),
    }
}

async fn callback(
    State(waiting): State<Arc<Waiting>>,
    RawQuery(query): RawQuery,
) -> (axum::http::StatusCode, Html<&'static str>) {
    let expected =
        ExpectedRedirect { state: &waiting.state, issuer: &waiting.issuer, iss_supported: waiting.iss_supported };
    let outcome = match code_flow::read_redirect(query.as_deref().unwrap_or(""), &expected) {
        Redirect::Stray => {
            return (axum::http::StatusCode::BAD_REQUEST, Html(PAGE_STRAY));
        }
        Redirect::Code(code) => Ok(code),
        Redirect::Refused(why) => Err(why),
    };
    let page = if outcome.is_ok() { PAGE_DONE } else { PAGE_REFUSED };
    if let Some(tx) = waiting.outcome.lock().take() {
        let _ = tx.send(outcome);
    }
    (axum::http::StatusCode::OK, Html(page))
}

const PAGE_DONE: &str = "<!doctype html><title>spearlet</title><p>Authorized. You can close this window; \
                         spearlet stores the grant.</p>";
const PAGE_REFUSED: &str = "<!doctype html><title>spearlet</title><p>The authorization was not used; spearlet says \
                            why in the terminal.</p>";
const PAGE_STRAY: &str = "<!doctype html><title>spearlet</title><p>This is not the answer to the login spearlet is \
                          waiting for.</p>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_must_be_the_server_or_a_path_prefix_of_it() {
        let server = url::Url::parse("http://localhost:3000/mcp").expect("url");
        for ok in [
            "http://localhost:3000/mcp",
            "http://localhost:3000",
            "http://localhost:3000/",
            "http://localhost:3000/mcp/",
        ] {
            assert!(resource_covers(ok, &server), "{ok}");
        }
        for refused in [
            "https://evil.example.com/mcp",
            "http://localhost:3001/mcp",
            "https://localhost:3000/mcp",
            "http://localhost:3000/mc",
            "http://localhost:3000/mcp/more",
            "http://localhost:3000/mcp#x",
            "not a url",
        ] {
            assert!(!resource_covers(refused, &server), "{refused}");
        }
    }

    fn request(allowed: &[&str]) -> LoginRequest {
        LoginRequest {
            server: "s".into(),
            url: "https://mcp.example.com/mcp".into(),
            issuer: "https://as.example.com".into(),
            client: LoginClient::default(),
            allowed_scopes: allowed.iter().map(|s| s.to_string()).collect(),
            extra_scopes: Vec::new(),
            redirect_port: 0,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn scopes_follow_the_challenge_then_the_metadata_and_add_offline_access_where_offered() {
        let v = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let challenge = Some(r#"Bearer scope="mcp:basic", resource_metadata="https://mcp.example.com/prm""#);
        assert_eq!(scopes(&request(&[]), challenge, &v(&["mcp:profile"]), &[]), v(&["mcp:basic"]));
        assert_eq!(scopes(&request(&[]), None, &v(&["a", "b"]), &[]), v(&["a", "b"]));
        assert_eq!(scopes(&request(&[]), None, &[], &v(&["x", "offline_access"])), Vec::<String>::new());
        assert_eq!(
            scopes(&request(&[]), None, &v(&["mcp:basic"]), &v(&["mcp:basic", "offline_access"])),
            v(&["mcp:basic", "offline_access"])
        );
        assert_eq!(scopes(&request(&["b"]), None, &v(&["a", "b"]), &[]), v(&["b"]));
        let mut step_up = request(&[]);
        step_up.extra_scopes = v(&["mcp:write"]);
        assert_eq!(scopes(&step_up, challenge, &[], &[]), v(&["mcp:basic", "mcp:write"]));
    }

    #[tokio::test]
    async fn the_listener_ignores_strays_and_returns_this_flows_code() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let expected = ExpectedRedirect { state: "st", issuer: "https://as.example.com", iss_supported: true };
        let browser = async move {
            let get = |query: &'static str| async move {
                let url = format!("http://127.0.0.1:{port}/callback?{query}");
                reqwest::get(url).await.map(|r| r.status().as_u16()).unwrap_or(0)
            };
            // Retry until the listener serves.
            let mut status = 0;
            for _ in 0..50 {
                status = get("code=x&state=other").await;
                if status != 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(status, 400, "a stray redirect is refused and the flow keeps waiting");
            assert_eq!(get("code=c-1&state=st&iss=https%3A%2F%2Fas.example.com").await, 200);
        };
        let (code, ()) = tokio::join!(wait_for_redirect(listener, &expected, Duration::from_secs(10), || {}), browser);
        assert_eq!(code.expect("code"), "c-1");
    }
}
