//! The bearer tokens one Streamable HTTP server gets (`http.auth`): fetched, cached, renewed.
//!
//! ```text
//! request ──current()──▶ cached token (OAuth modes; renewed past its renewal time)
//!                        | the service-account token file, read on every use (the kubelet rotates it)
//!   401 + WWW-Authenticate ──renew(rejected, challenge)──▶ discovery (rmcp: RFC 9728 + RFC 8414)
//!        ──▶ client credentials (rmcp) | RFC 8693 token exchange | RFC 7523 JWT-bearer (here)
//!        ──▶ the request is sent again, once
//! ```
//!
//! - **Single flight.** One async mutex per server is held across a fetch: concurrent 401s
//!   wait for the one fetch, and a task whose rejected token was already replaced takes the
//!   new one instead of fetching again.
//! - **Discovery** follows the server's challenge (its `resource_metadata`, else the
//!   well-known locations) on every 401, since the server may have moved to another
//!   authorization server; an expiry renewal reuses what was found.
//! - **Secrets** (client secrets, keys, tokens) never reach a log, an error or a metric: errors
//!   carry what the authorization server said and which endpoint, never a request body.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::auth::{AuthorizationManager, AuthorizationMetadata, ClientCredentialsConfig};
use tokio::time::Instant;

use super::config::{AuthEndpoint, AuthMode};
use super::oauth::{self, IssuedToken, TokenError};
use crate::api::{JwtAlgorithm, TokenGrant};
use crate::telemetry::PoolMetrics;

/// A token endpoint gets this long to answer.
const TOKEN_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes read of a token endpoint's answer.
const MAX_TOKEN_RESPONSE_BYTES: usize = 64 * 1024;
/// Bytes read of a service-account token file (a JWT is a few KiB).
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

const GRANT_CLIENT_CREDENTIALS: &str = "client_credentials";
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

#[derive(Default)]
struct State {
    token: Option<Cached>,
    /// The authorization server found last time, and its metadata (reused by an expiry
    /// renewal).
    manager: Option<(AuthorizationManager, AuthorizationMetadata)>,
    /// The server's last challenge.
    challenge: Option<String>,
}

/// The tokens of one server. Shared by its sessions: a reconnect keeps the cached token.
pub(crate) struct TokenSource {
    server: Arc<str>,
    url: String,
    auth: AuthEndpoint,
    /// Token requests follow no redirect (one would carry the credential elsewhere); an
    /// error here (the TLS backend could not start) fails each request rather than falling back
    /// to a client that follows redirects.
    http: Result<reqwest::Client, String>,
    metrics: PoolMetrics,
    state: tokio::sync::Mutex<State>,
}

impl TokenSource {
    pub(crate) fn new(server: Arc<str>, url: String, auth: AuthEndpoint, metrics: PoolMetrics) -> Self {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(TOKEN_REQUEST_TIMEOUT)
            .build()
            .map_err(|e| crate::telemetry::error_chain(&e));
        TokenSource { server, url, auth, http, metrics, state: tokio::sync::Mutex::default() }
    }

    /// What this source was built from: a source is reused while its config is unchanged.
    pub(crate) fn auth(&self) -> &AuthEndpoint {
        &self.auth
    }

    /// The token to send now; `None` before the first challenge of an OAuth mode (the request
    /// goes out without one, and the server's 401 says where to get one).
    pub(crate) async fn current(&self) -> Result<Option<String>, TokenError> {
        if let AuthMode::ServiceAccountToken { file, grant: None } = &self.auth.mode {
            return read_token_file(file).await.map(Some);
        }
        let mut state = self.state.lock().await;
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
            let token = read_token_file(file).await?;
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
        state.challenge = Some(challenge.to_string());
        // Follow the challenge: the server may point to another authorization server now.
        state.manager = None;
        let reason =
            if state.token.is_some() || rejected.is_some() { FetchReason::Rejected } else { FetchReason::Initial };
        self.fetch(&mut state, Some(challenge), reason).await
    }

    async fn fetch(
        &self,
        state: &mut State,
        challenge: Option<&str>,
        reason: FetchReason,
    ) -> Result<String, TokenError> {
        state.token = None;
        let result = self.fetch_inner(state, challenge).await;
        self.metrics.token_fetch(&self.server, reason.as_str(), result.is_ok());
        match result {
            Ok(issued) => {
                tracing::info!(
                    server_id = %self.server,
                    reason = reason.as_str(),
                    expires_in_s = issued.expires_in.map(|d| d.as_secs()),
                    "access token obtained"
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

    async fn fetch_inner(&self, state: &mut State, challenge: Option<&str>) -> Result<IssuedToken, TokenError> {
        if state.manager.is_none() {
            let manager = AuthorizationManager::new_allowing_private_addresses(self.url.as_str())
                .await
                .map_err(|e| TokenError::transient(format!("OAuth discovery for {}: {e}", self.url)))?;
            let resolution = manager.resolve_metadata_from_challenge(challenge).await.map_err(|e| {
                TokenError::transient(format!(
                    "OAuth discovery (protected-resource and authorization-server metadata): {e}"
                ))
            })?;
            let mut manager = manager;
            manager.set_metadata(resolution.metadata.clone());
            state.manager = Some((manager, resolution.metadata));
        }
        let Some((manager, metadata)) = state.manager.as_mut() else {
            return Err(TokenError::lasting("no authorization server was found"));
        };
        let grant_type = match &self.auth.mode {
            AuthMode::ClientSecret { .. } | AuthMode::PrivateKeyJwt { .. } => GRANT_CLIENT_CREDENTIALS,
            AuthMode::ServiceAccountToken { grant: Some((TokenGrant::JwtBearer, _)), .. } => GRANT_JWT_BEARER,
            AuthMode::ServiceAccountToken { .. } => GRANT_TOKEN_EXCHANGE,
        };
        if let Some(why) = oauth::grant_refusal(metadata.additional_fields.get("grant_types_supported"), grant_type) {
            return Err(TokenError::lasting(why));
        }
        let resource = url::Url::parse(&self.url).map_err(|e| TokenError::lasting(format!("the server URL: {e}")))?;
        let token_endpoint = url::Url::parse(&metadata.token_endpoint).map_err(|e| {
            TokenError::lasting(format!("the token endpoint {}: {e}", oauth::quote(&metadata.token_endpoint)))
        })?;
        if !oauth::may_receive_credential(&resource, &token_endpoint) {
            return Err(TokenError::lasting(format!(
                "the token endpoint {token_endpoint} is not https: the credential is not sent in clear text \
                 (only loopback servers may use http)"
            )));
        }
        let asked = manager.select_scopes(challenge_scope(challenge).as_deref(), &[]);
        let scopes = oauth::request_scopes(&asked, &self.auth.scopes);
        let scope = scopes.join(" ");
        match &self.auth.mode {
            AuthMode::ClientSecret { client_id, secret } => {
                let config = ClientCredentialsConfig::ClientSecret {
                    client_id: client_id.clone(),
                    client_secret: secret.clone(),
                    scopes,
                    resource: Some(self.url.clone()),
                };
                self.client_credentials(manager, &config).await
            }
            AuthMode::PrivateKeyJwt { client_id, key_pem, algorithm } => {
                if let Some(why) = private_key_jwt_refusal(metadata, *algorithm) {
                    return Err(TokenError::lasting(why));
                }
                // RFC 7523 section 3: the audience is the authorization server (its issuer).
                let audience = metadata.issuer.clone().unwrap_or_else(|| token_endpoint.to_string());
                let assertion = client_assertion(client_id, &audience, key_pem, *algorithm)?;
                let mut form: Vec<(&str, &str)> = vec![
                    ("grant_type", GRANT_CLIENT_CREDENTIALS),
                    ("client_assertion_type", ASSERTION_TYPE_JWT_BEARER),
                    ("client_assertion", &assertion),
                    ("resource", &self.url),
                ];
                if !scope.is_empty() {
                    form.push(("scope", &scope));
                }
                self.post_token_request(&token_endpoint, &form).await
            }
            AuthMode::ServiceAccountToken { file, grant } => {
                let subject = read_token_file(file).await?;
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
                self.post_token_request(&token_endpoint, &form).await
            }
        }
    }

    async fn client_credentials(
        &self,
        manager: &mut AuthorizationManager,
        config: &ClientCredentialsConfig,
    ) -> Result<IssuedToken, TokenError> {
        manager.validate_client_credentials_metadata(config).map_err(|e| TokenError::lasting(e.to_string()))?;
        manager.configure_client_credentials(config).map_err(|e| TokenError::lasting(e.to_string()))?;
        let response =
            manager.exchange_client_credentials(config).await.map_err(|e| oauth::refusal_in_text(e.to_string()))?;
        use oauth2::TokenResponse as _;
        Ok(IssuedToken { access_token: response.access_token().secret().clone(), expires_in: response.expires_in() })
    }

    async fn post_token_request(&self, endpoint: &url::Url, form: &[(&str, &str)]) -> Result<IssuedToken, TokenError> {
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
        let response = self
            .http
            .as_ref()
            .map_err(|e| TokenError::transient(format!("building the HTTP client for token requests: {e}")))?
            .post(endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                TokenError::transient(format!(
                    "the token request to {endpoint} failed: {}",
                    crate::telemetry::error_chain(&e)
                ))
            })?;
        let status = response.status().as_u16();
        let bytes = read_capped(response, MAX_TOKEN_RESPONSE_BYTES).await?;
        oauth::parse_token_response(status, &bytes)
    }
}

/// Why the authorization server will not take a `private_key_jwt` assertion signed with
/// `algorithm` (absent lists allow it).
fn private_key_jwt_refusal(metadata: &AuthorizationMetadata, algorithm: JwtAlgorithm) -> Option<String> {
    let listed = |field: &str| -> Option<Vec<String>> {
        let values = metadata.additional_fields.get(field)?.as_array()?;
        Some(values.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
    };
    if let Some(methods) = listed("token_endpoint_auth_methods_supported")
        && !methods.iter().any(|m| m == "private_key_jwt")
    {
        return Some(format!(
            "the authorization server does not accept private_key_jwt client authentication (it accepts {})",
            methods.join(", ")
        ));
    }
    let name = format!("{algorithm:?}");
    match listed("token_endpoint_auth_signing_alg_values_supported") {
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

/// The `scope` parameter of a Bearer challenge.
fn challenge_scope(challenge: Option<&str>) -> Option<String> {
    let base = url::Url::parse("http://challenge.invalid/").ok()?;
    rmcp::transport::auth::WWWAuthenticateParams::parse(challenge?, &base).scope
}

async fn read_capped(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, TokenError> {
    let mut body = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|e| TokenError::transient(format!("reading the token response: {e}")))?
    {
        if body.len() + chunk.len() > max {
            return Err(TokenError::transient(format!("the token response is larger than {max} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
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
