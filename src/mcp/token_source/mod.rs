//! The bearer tokens one Streamable HTTP server gets (`http.auth`): fetched, cached, renewed.
//!
//! ```text
//! request ──current()──▶ cached token (OAuth modes; renewed past its renewal time)
//!                        | the service-account token file, read on every use (the kubelet rotates it)
//!   401 + WWW-Authenticate ──renew(rejected, challenge)──▶ (once per configuration) discovery:
//!        protected-resource metadata (RFC 9728) from the server, authorization-server metadata
//!        (RFC 8414) from the pinned issuer
//!        ──▶ client credentials | RFC 8693 token exchange | RFC 7523 JWT-bearer
//!            | a person's stored grant: its access token, else its refresh token (`grant.rs`)
//!        ──▶ the request is sent again, once
//! ```
//!
//! - **Single flight.** One async mutex per server is held across a fetch: concurrent 401s
//!   wait for the one fetch, and a task whose rejected token was already replaced takes the
//!   new one instead of fetching again.
//! - **The authorization server is the McpServer's, not the MCP server's.** With
//!   `auth.issuer` (required wherever a client secret or the pod's token is sent) the metadata
//!   is read from that issuer only; a server whose metadata names another authorization server
//!   is refused, lasting, before any request reaches it (`oauth::foreign_authorization_server`).
//! - **Discovery once.** What discovery found, or the lasting refusal it ended in, is kept for
//!   the life of this source (a configuration change makes a new one): a 401 does not make the
//!   agent discover again, so a server cannot move the credential by changing its metadata.
//! - **Budget.** Token requests caused by 401s draw on `oauth::RequestBudget`; renewals at
//!   expiry do not.
//! - **One HTTP client** (`outbound_http`) for discovery and every token request: its address
//!   policy refuses link-local and metadata addresses, and it follows no redirect.
//! - **Secrets** (client secrets, keys, tokens) never reach a log, an error or a metric: errors
//!   carry what the authorization server said and which endpoint, never a request body.

use std::path::Path;
use std::sync::Arc;

use tokio::time::Instant;

use super::config::{AuthEndpoint, AuthMode};
use super::discovery;
use super::grant_store::secret::GrantSecrets;
use super::oauth::{self, IssuedToken, RequestBudget, TokenError};
use super::outbound_http::OutboundHttp;
use crate::api::{JwtAlgorithm, TokenGrant};
use crate::telemetry::PoolMetrics;

mod grant;

/// Bytes read of a service-account token file (a JWT is a few KiB).
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

const GRANT_CLIENT_CREDENTIALS: &str = "client_credentials";
const GRANT_REFRESH_TOKEN: &str = "refresh_token";
const GRANT_TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const GRANT_JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const TOKEN_TYPE_JWT: &str = "urn:ietf:params:oauth:token-type:jwt";
const TOKEN_TYPE_ACCESS: &str = "urn:ietf:params:oauth:token-type:access_token";

/// Why a token was fetched, for the metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FetchReason {
    /// None cached yet.
    Initial,
    /// The cached one is due.
    Expiry,
    /// The server rejected the one sent.
    Rejected,
}

impl FetchReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FetchReason::Initial => "initial",
            FetchReason::Expiry => "expiry",
            FetchReason::Rejected => "rejected",
        }
    }
}

struct Cached {
    token: String,
    renew_at: Option<Instant>,
}

/// What discovery found: the authorization server and what its metadata says.
struct Discovered {
    /// Its issuer identifier (the audience of a `private_key_jwt` assertion).
    issuer: String,
    token_endpoint: url::Url,
    grant_types_supported: Option<serde_json::Value>,
    auth_methods: Option<Vec<String>>,
    signing_algs: Option<Vec<String>>,
    /// The authorization server's `scopes_supported` (asked for when the server names none).
    server_scopes: Vec<String>,
    /// The protected-resource metadata's `scopes_supported`.
    resource_scopes: Vec<String>,
}

struct State {
    token: Option<Cached>,
    /// What discovery found, or the lasting refusal it ended in: kept for the life of the
    /// source (module header).
    discovery: Option<Result<Arc<Discovered>, TokenError>>,
    /// The server's last challenge.
    challenge: Option<String>,
    /// Token requests the server's 401s may still cause.
    budget: RequestBudget,
}

/// The tokens of one server. Shared by its sessions: a reconnect keeps the cached token.
pub(crate) struct TokenSource {
    server: Arc<str>,
    url: String,
    auth: AuthEndpoint,
    http: OutboundHttp,
    metrics: PoolMetrics,
    /// Where the tokens it gets are held (for redaction).
    secrets: Arc<crate::secrets::HeldSecrets>,
    /// The grant Secrets of the pod's namespace (cluster mode).
    grant_secrets: Option<GrantSecrets>,
    state: tokio::sync::Mutex<State>,
}

impl TokenSource {
    pub(crate) fn new(
        server: Arc<str>,
        url: String,
        auth: AuthEndpoint,
        metrics: PoolMetrics,
        egress: &crate::egress::AddressDenyList,
        secrets: Arc<crate::secrets::HeldSecrets>,
        grant_secrets: Option<GrantSecrets>,
    ) -> Self {
        let http = OutboundHttp::new(&url, egress);
        let state = State {
            token: None,
            discovery: None,
            challenge: None,
            budget: RequestBudget::new(std::time::Instant::now()),
        };
        TokenSource { server, url, auth, http, metrics, secrets, grant_secrets, state: tokio::sync::Mutex::new(state) }
    }

    /// What this source was built from: a source is reused while its config is unchanged.
    pub(crate) fn auth(&self) -> &AuthEndpoint {
        &self.auth
    }

    /// The server URL this source gets tokens for.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The token to send now; `None` before the first challenge of an OAuth mode (the request
    /// goes out without one, and the server's 401 says where to get one).
    pub(crate) async fn current(&self) -> Result<Option<String>, TokenError> {
        if let AuthMode::ServiceAccountToken { file, grant: None } = &self.auth.mode {
            return self.read_token_file(file).await.map(Some);
        }
        let mut state = self.state.lock().await;
        if let Some(Err(refusal)) = &state.discovery {
            return Err(refusal.clone());
        }
        match &state.token {
            None => Ok(None),
            Some(cached) if cached.renew_at.is_none_or(|at| Instant::now() < at) => Ok(Some(cached.token.clone())),
            Some(_) => {
                let challenge = state.challenge.clone();
                self.fetch(&mut state, challenge.as_deref(), FetchReason::Expiry).await.map(Some)
            }
        }
    }

    /// A token to replace `rejected` (`None`: none was sent), after the server answered 401
    /// with `challenge`.
    pub(crate) async fn renew(&self, rejected: Option<&str>, challenge: &str) -> Result<String, TokenError> {
        if let AuthMode::ServiceAccountToken { file, grant: None } = &self.auth.mode {
            // The kubelet may have rotated it since; if not, the server does not accept it.
            let token = self.read_token_file(file).await?;
            if Some(token.as_str()) == rejected {
                return Err(TokenError::lasting(format!(
                    "the server rejected the pod's service-account token (WWW-Authenticate: {}); check that it \
                     trusts the cluster's issuer and expects the audience in spec.http.auth.serviceAccountToken",
                    oauth::quote(challenge)
                )));
            }
            return Ok(token);
        }
        let mut state = self.state.lock().await;
        if let Some(cached) = &state.token
            && Some(cached.token.as_str()) != rejected
        {
            // Another request renewed it while this one waited.
            return Ok(cached.token.clone());
        }
        // The challenge's scope is used; the authorization server found before is kept.
        state.challenge = Some(challenge.to_string());
        let reason =
            if state.token.is_some() || rejected.is_some() { FetchReason::Rejected } else { FetchReason::Initial };
        self.fetch(&mut state, Some(challenge), reason).await
    }

    /// The pod's service-account token at `file`, held for redaction as it is read.
    async fn read_token_file(&self, file: &Path) -> Result<String, TokenError> {
        let token = read_token_file(file).await?;
        self.secrets.hold(&format!("service-account token of {}", self.server), &token, Some(&self.server));
        Ok(token)
    }

    async fn fetch(
        &self,
        state: &mut State,
        challenge: Option<&str>,
        reason: FetchReason,
    ) -> Result<String, TokenError> {
        if let Some(Err(refusal)) = &state.discovery {
            return Err(refusal.clone());
        }
        if reason != FetchReason::Expiry
            && let Err(wait) = state.budget.take(std::time::Instant::now())
        {
            let error = TokenError::transient(format!(
                "the server keeps rejecting access tokens: the agent asks the authorization server at most {} times \
                 at once, then once every {} s, for one server (next in {} s)",
                oauth::TOKEN_REQUEST_BURST,
                oauth::TOKEN_REQUEST_REFILL.as_secs(),
                wait.as_secs().max(1)
            ));
            tracing::warn!(server_id = %self.server, reason = reason.as_str(), error = %error, "access token request not sent");
            return Err(error);
        }
        let previous = state.token.take().map(|cached| cached.token);
        let result = self.fetch_inner(state, challenge, reason, previous).await;
        self.metrics.token_fetch(&self.server, reason.as_str(), result.is_ok());
        match result {
            Ok(issued) => {
                tracing::info!(
                    server_id = %self.server,
                    reason = reason.as_str(),
                    expires_in_s = issued.expires_in.map(|d| d.as_secs()),
                    "access token obtained"
                );
                self.secrets.hold(
                    &format!("access token of {}", self.server),
                    &issued.access_token,
                    Some(&self.server),
                );
                let renew_at = oauth::renew_after(issued.expires_in).map(|after| Instant::now() + after);
                state.token = Some(Cached { token: issued.access_token.clone(), renew_at });
                Ok(issued.access_token)
            }
            Err(e) => {
                tracing::warn!(server_id = %self.server, reason = reason.as_str(), error = %e, "access token request failed");
                Err(e)
            }
        }
    }

    /// The authorization server, discovered once (module header).
    async fn discovered(&self, state: &mut State, challenge: Option<&str>) -> Result<Arc<Discovered>, TokenError> {
        match &state.discovery {
            Some(Ok(found)) => return Ok(found.clone()),
            Some(Err(refusal)) => return Err(refusal.clone()),
            None => {}
        }
        match self.discover(challenge).await {
            Ok(found) => {
                let found = Arc::new(found);
                state.discovery = Some(Ok(found.clone()));
                Ok(found)
            }
            Err(e) => {
                if e.lasting {
                    state.discovery = Some(Err(e.clone()));
                }
                Err(e)
            }
        }
    }

    async fn discover(&self, challenge: Option<&str>) -> Result<Discovered, TokenError> {
        let resource = url::Url::parse(&self.url).map_err(|e| TokenError::lasting(format!("the server URL: {e}")))?;
        let prm = self.resource_metadata(&resource, challenge).await?;
        let named = oauth::strings(prm.as_ref().and_then(|m| m.get("authorization_servers"))).unwrap_or_default();
        let resource_scopes = oauth::strings(prm.as_ref().and_then(|m| m.get("scopes_supported"))).unwrap_or_default();
        let (issuer, pinned) = match &self.auth.issuer {
            Some(pinned) => {
                if let Some(why) = oauth::foreign_authorization_server(&named, pinned) {
                    return Err(TokenError::lasting(why));
                }
                (pinned.clone(), true)
            }
            // Only private_key_jwt: its assertion is bound to the issuer it is sent to.
            None => (named.first().cloned().unwrap_or_else(|| resource.origin().ascii_serialization()), false),
        };
        let issuer_url = url::Url::parse(&issuer)
            .map_err(|e| TokenError::lasting(format!("the authorization server {}: {e}", oauth::origin_of(&issuer))))?;
        if !matches!(issuer_url.scheme(), "http" | "https") {
            return Err(TokenError::lasting(format!("the authorization server {issuer_url} is not an http(s) URL")));
        }
        let metadata = self.server_metadata(&issuer_url).await?;
        if let Some(why) = oauth::issuer_refusal(&issuer, metadata.get("issuer").and_then(|v| v.as_str()), pinned) {
            return Err(TokenError::lasting(why));
        }
        let raw_endpoint = metadata.get("token_endpoint").and_then(|v| v.as_str()).ok_or_else(|| {
            TokenError::lasting(format!("the authorization-server metadata of {issuer_url} has no token_endpoint"))
        })?;
        let token_endpoint = url::Url::parse(raw_endpoint)
            .map_err(|e| TokenError::lasting(format!("the token endpoint {}: {e}", oauth::quote(raw_endpoint))))?;
        if !oauth::may_receive_credential(&resource, &token_endpoint) {
            return Err(TokenError::lasting(format!(
                "the token endpoint {token_endpoint} is not https: the credential is not sent in clear text \
                 (only loopback servers may use http)"
            )));
        }
        self.http.check_literal(&token_endpoint)?;
        Ok(Discovered {
            issuer,
            token_endpoint,
            grant_types_supported: metadata.get("grant_types_supported").cloned(),
            auth_methods: oauth::strings(metadata.get("token_endpoint_auth_methods_supported")),
            signing_algs: oauth::strings(metadata.get("token_endpoint_auth_signing_alg_values_supported")),
            server_scopes: oauth::strings(metadata.get("scopes_supported")).unwrap_or_default(),
            resource_scopes,
        })
    }

    /// The server's protected-resource metadata for this server (see
    /// [`discovery::resource_metadata`]); one for another resource is not this server's (RFC
    /// 9728 section 3.3).
    async fn resource_metadata(
        &self,
        resource: &url::Url,
        challenge: Option<&str>,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>, TokenError> {
        let for_this = |document: &serde_json::Map<String, serde_json::Value>| {
            document.get("resource").and_then(|r| r.as_str()).is_none_or(|r| oauth::same_url(r, &self.url))
        };
        Ok(discovery::resource_metadata(&self.http, resource, challenge, for_this).await?.map(|(_, doc)| doc))
    }

    /// The authorization-server metadata at `issuer`'s well-known locations.
    async fn server_metadata(
        &self,
        issuer: &url::Url,
    ) -> Result<serde_json::Map<String, serde_json::Value>, TokenError> {
        discovery::server_metadata(&self.http, issuer).await?.ok_or_else(|| discovery::no_server_metadata(issuer))
    }

    async fn fetch_inner(
        &self,
        state: &mut State,
        challenge: Option<&str>,
        reason: FetchReason,
        previous: Option<String>,
    ) -> Result<IssuedToken, TokenError> {
        if let AuthMode::AuthorizationCode { grant, client_secret } = &self.auth.mode {
            let fetch = grant::Fetch { challenge, reason, previous: previous.as_deref() };
            return self.token_from_grant(state, fetch, grant, client_secret.as_deref()).await;
        }
        let found = self.discovered(state, challenge).await?;
        let grant_type = match &self.auth.mode {
            AuthMode::AuthorizationCode { .. } => GRANT_REFRESH_TOKEN,
            AuthMode::ClientSecret { .. } | AuthMode::PrivateKeyJwt { .. } => GRANT_CLIENT_CREDENTIALS,
            AuthMode::ServiceAccountToken { grant: Some((TokenGrant::JwtBearer, _)), .. } => GRANT_JWT_BEARER,
            AuthMode::ServiceAccountToken { .. } => GRANT_TOKEN_EXCHANGE,
        };
        if let Some(why) = oauth::grant_refusal(found.grant_types_supported.as_ref(), grant_type) {
            return Err(TokenError::lasting(why));
        }
        // What the server asks for now (its challenge, its metadata), else what the
        // authorization server offers; narrowed to the McpServer's scopes.
        let mut asked: Vec<String> = challenge_scope(challenge, &self.url)
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        asked.extend(found.resource_scopes.iter().cloned());
        if asked.is_empty() {
            asked = found.server_scopes.clone();
        }
        let scopes = oauth::request_scopes(&asked, &self.auth.scopes);
        let scope = scopes.join(" ");
        let token_endpoint = &found.token_endpoint;
        let answer = match &self.auth.mode {
            AuthMode::ClientSecret { client_id, secret } => {
                // client_secret_basic only when it is the only one of the two advertised.
                let basic = found.auth_methods.as_ref().is_some_and(|m| {
                    m.iter().any(|x| x == "client_secret_basic") && !m.iter().any(|x| x == "client_secret_post")
                });
                let mut form: Vec<(&str, &str)> =
                    vec![("grant_type", GRANT_CLIENT_CREDENTIALS), ("resource", &self.url)];
                if !scope.is_empty() {
                    form.push(("scope", &scope));
                }
                if basic {
                    self.http.post_form(token_endpoint, &form, Some((client_id.as_str(), secret.as_str()))).await?
                } else {
                    form.extend([("client_id", client_id.as_str()), ("client_secret", secret.as_str())]);
                    self.http.post_form(token_endpoint, &form, None).await?
                }
            }
            AuthMode::PrivateKeyJwt { client_id, key_pem, algorithm } => {
                if let Some(why) = private_key_jwt_refusal(&found, *algorithm) {
                    return Err(TokenError::lasting(why));
                }
                // RFC 7523 section 3: the audience is the authorization server (its issuer).
                let assertion = client_assertion(client_id, &found.issuer, key_pem, *algorithm)?;
                let mut form: Vec<(&str, &str)> = vec![
                    ("grant_type", GRANT_CLIENT_CREDENTIALS),
                    ("client_assertion_type", ASSERTION_TYPE_JWT_BEARER),
                    ("client_assertion", &assertion),
                    ("resource", &self.url),
                ];
                if !scope.is_empty() {
                    form.push(("scope", &scope));
                }
                self.http.post_form(token_endpoint, &form, None).await?
            }
            AuthMode::AuthorizationCode { .. } => {
                return Err(TokenError::lasting("a stored grant is renewed with its refresh token"));
            }
            AuthMode::ServiceAccountToken { file, grant } => {
                let subject = self.read_token_file(file).await?;
                let client_id = grant.as_ref().and_then(|(_, id)| id.as_deref());
                let mut form: Vec<(&str, &str)> = vec![("grant_type", grant_type)];
                if grant_type == GRANT_JWT_BEARER {
                    form.push(("assertion", &subject));
                } else {
                    form.extend([
                        ("subject_token", subject.as_str()),
                        ("subject_token_type", TOKEN_TYPE_JWT),
                        ("requested_token_type", TOKEN_TYPE_ACCESS),
                    ]);
                }
                form.push(("resource", &self.url));
                if !scope.is_empty() {
                    form.push(("scope", &scope));
                }
                if let Some(id) = client_id {
                    form.push(("client_id", id));
                }
                self.http.post_form(token_endpoint, &form, None).await?
            }
        };
        oauth::parse_token_response(answer.status, &answer.body)
    }
}

/// Why the authorization server will not take a `private_key_jwt` assertion signed with
/// `algorithm` (absent lists allow it).
fn private_key_jwt_refusal(found: &Discovered, algorithm: JwtAlgorithm) -> Option<String> {
    if let Some(methods) = &found.auth_methods
        && !methods.iter().any(|m| m == "private_key_jwt")
    {
        return Some(format!(
            "the authorization server does not accept private_key_jwt client authentication (it accepts {})",
            methods.join(", ")
        ));
    }
    let name = format!("{algorithm:?}");
    match &found.signing_algs {
        Some(algs) if !algs.contains(&name) => Some(format!(
            "the authorization server does not accept {name} client assertions (it accepts {}): set \
             spec.http.auth.clientCredentials.privateKey.algorithm",
            algs.join(", ")
        )),
        _ => None,
    }
}

/// Lifetime of a client assertion: one request's worth.
const ASSERTION_LIFETIME_SECS: u64 = 300;
const ASSERTION_TYPE_JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// A signed `private_key_jwt` client assertion (RFC 7523 section 2.2) for `audience`.
fn client_assertion(
    client_id: &str,
    audience: &str,
    key_pem: &str,
    algorithm: JwtAlgorithm,
) -> Result<String, TokenError> {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let (alg, key) = match algorithm {
        JwtAlgorithm::ES256 => (Algorithm::ES256, EncodingKey::from_ec_pem(key_pem.as_bytes())),
        JwtAlgorithm::ES384 => (Algorithm::ES384, EncodingKey::from_ec_pem(key_pem.as_bytes())),
        JwtAlgorithm::RS256 => (Algorithm::RS256, EncodingKey::from_rsa_pem(key_pem.as_bytes())),
        JwtAlgorithm::RS384 => (Algorithm::RS384, EncodingKey::from_rsa_pem(key_pem.as_bytes())),
        JwtAlgorithm::RS512 => (Algorithm::RS512, EncodingKey::from_rsa_pem(key_pem.as_bytes())),
    };
    // The key's parse error says nothing of the key itself.
    let key = key.map_err(|e| {
        TokenError::lasting(format!(
            "spec.http.auth.clientCredentials.privateKey is not a PEM {algorithm:?} key ({e}): store a PKCS#8 \
             PEM of the algorithm's type in the Secret, or set privateKey.algorithm"
        ))
    })?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let claims = serde_json::json!({
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": now,
        "exp": now + ASSERTION_LIFETIME_SECS,
        "jti": uuid::Uuid::new_v4().to_string(),
    });
    jsonwebtoken::encode(&Header::new(alg), &claims, &key)
        .map_err(|e| TokenError::lasting(format!("signing the client assertion: {e}")))
}

/// The `scope` parameter of a Bearer challenge from the server at `server_url` (its origin is the
/// base the challenge's `resource_metadata` is judged against).
pub(crate) fn challenge_scope(challenge: Option<&str>, server_url: &str) -> Option<String> {
    let base = url::Url::parse(server_url).ok()?;
    rmcp::transport::auth::WWWAuthenticateParams::parse(challenge?, &base).scope
}

/// The projected service-account token at `file`, read now (the kubelet replaces it atomically
/// when it rotates it).
async fn read_token_file(file: &Path) -> Result<String, TokenError> {
    use tokio::io::AsyncReadExt as _;
    let missing = |e: std::io::Error| {
        TokenError::lasting(format!(
            "cannot read the service-account token at {} ({e}); in a pod the webhook mounts it when the \
             McpProfile's spec.identity grants this server and its audience (the pod's admission warnings and \
             the profile's ResolvedRefs condition say why not), and the pod must be injected after spec.http.auth \
             was set (restart it); in local mode set SPEAR_AUTH_TOKEN_DIR to a directory with a token file named \
             after the server",
            file.display()
        ))
    };
    let handle = tokio::fs::File::open(file).await.map_err(missing)?;
    let mut text = String::new();
    handle.take(MAX_TOKEN_FILE_BYTES).read_to_string(&mut text).await.map_err(missing)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenError::transient(format!("the service-account token at {} is empty", file.display())));
    }
    Ok(token.to_string())
}
