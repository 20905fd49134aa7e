//! A person's stored grant (`authorizationCode`): the access token it holds while fresh, else one
//! for its refresh token, the grant written back with what the authorization server returned (a
//! rotated refresh token replaces the old one). In a file (local mode) or in the Secret
//! `tokenSecretRef` names (a pod), which every pod of the workload shares.
//!
//! - **A token someone else got is taken, not renewed again**: a fresh access token in the store
//!   that is not the one this agent just had (the login's, or another pod's renewal) is used as
//!   is. With a rotating refresh token, a second renewal would spend a token already spent.
//! - **Pods renew one at a time** (`oauth::grant_secret`): the renewal is claimed on the Secret
//!   under its `resourceVersion` first; a pod that finds a live claim waits for its result, up to
//!   the claim's lifetime.
//! - **A refusal that needs a person is recorded** on the Secret (`grant-login-required`, a fixed
//!   reason, never the authorization server's text), so the McpServer's condition shows it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use tokio::time::Instant;

use super::{Cached, FetchReason, GRANT_REFRESH_TOKEN, State, TokenSource, challenge_scope};
use crate::mcp::config::{AuthMode, GrantLocation};
use crate::mcp::grant_store::{
    self,
    secret::{GrantSecrets, UpdateError},
};
use crate::mcp::oauth::grant::{self, StoredGrant};
use crate::mcp::oauth::{self, IssuedToken, TokenError, grant_secret};

/// What a fetch knows: the server's challenge, why it fetches, and the token it had (which a
/// token found in the store must differ from).
pub(super) struct Fetch<'a> {
    pub(super) challenge: Option<&'a str>,
    pub(super) reason: FetchReason,
    pub(super) previous: Option<&'a str>,
}

/// Where a grant was read from, to write it back there.
enum Origin {
    File(PathBuf),
    /// The Secret as read (its `resourceVersion` guards the write).
    Secret(Box<Secret>),
}

/// How often a pod waiting for another's renewal looks at the Secret again.
const CLAIM_POLL: Duration = Duration::from_millis(500);

const REFUSED_GRANT: &str = "the authorization server refused the grant (invalid_grant)";
const NO_REFRESH_TOKEN: &str = "the access token expired and the grant has no refresh token";

impl TokenSource {
    /// A token from the stored grant (module header).
    pub(super) async fn token_from_grant(
        &self,
        state: &mut State,
        fetch: Fetch<'_>,
        location: &GrantLocation,
        client_secret: Option<&str>,
    ) -> Result<IssuedToken, TokenError> {
        let login = self.login_hint();
        let deadline = Instant::now() + grant_secret::CLAIM_TTL + CLAIM_POLL;
        loop {
            let (mut grant, origin) = self.load(location).await?;
            let now = grant::unix_now();
            if let Some(token) = grant.fresh_access_token(now).filter(|t| Some(*t) != fetch.previous) {
                let expires_in = grant.access_token_expires_at.map(|at| Duration::from_secs(at.saturating_sub(now)));
                return Ok(IssuedToken {
                    access_token: token.to_string(),
                    expires_in,
                    refresh_token: None,
                    scope: None,
                });
            }
            let Some(refresh_token) = grant.refresh_token.clone() else {
                self.mark_login_required(origin, NO_REFRESH_TOKEN).await;
                return Err(TokenError::lasting(format!(
                    "the stored access token {} and the grant has no refresh token (the authorization server issued \
                     none): {login}",
                    if fetch.reason == FetchReason::Rejected { "was rejected" } else { "expired" }
                )));
            };
            let origin = match origin {
                Origin::Secret(secret) => {
                    let store = self.secret_store()?;
                    if let Some(by) = grant_secret::claimed_by_other(&secret, store.holder(), now) {
                        if Instant::now() >= deadline {
                            return Err(TokenError::transient(format!(
                                "{by} has been renewing the shared grant for {} s without a result; the next call \
                                 tries again",
                                grant_secret::CLAIM_TTL.as_secs()
                            )));
                        }
                        tokio::time::sleep(CLAIM_POLL).await;
                        continue;
                    }
                    match store.update(&grant_secret::claimed(*secret, store.holder(), now), &self.server).await {
                        Ok(claimed) => Origin::Secret(Box::new(claimed)),
                        // Someone wrote it meanwhile (a renewal, a login): look again.
                        Err(UpdateError::Conflict) if Instant::now() < deadline => continue,
                        Err(UpdateError::Conflict) => {
                            return Err(TokenError::transient("the shared grant kept changing while renewing it"));
                        }
                        Err(UpdateError::Failed(e)) => return Err(e),
                    }
                }
                file => file,
            };
            let result = self.refresh_grant(state, fetch.challenge, &mut grant, &refresh_token, client_secret).await;
            match &result {
                Ok(_) => {
                    if let Err(e) = self.save(origin, &grant, true).await {
                        // The new access token still works; a rotated refresh token that could not
                        // be kept fails the next renewal, which then says to log in again.
                        tracing::warn!(server_id = %self.server, error = %e, "the renewed grant was not written back");
                    }
                }
                Err(e) if e.lasting => self.mark_login_required(origin, REFUSED_GRANT).await,
                Err(_) => self.release(origin).await,
            }
            return result;
        }
    }

    /// After the server refused `rejected` for insufficient scope (`403`, `challenge`): a token
    /// of a newer grant (someone logged in again since), else the refusal that says what to
    /// consent to, with the demanded scopes noted in the grant for the next login.
    pub(crate) async fn step_up(&self, rejected: Option<&str>, challenge: &str) -> Result<String, TokenError> {
        let demanded: Vec<String> = challenge_scope(Some(challenge), &self.url)
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let AuthMode::AuthorizationCode { grant: location, .. } = &self.auth.mode else {
            return Err(TokenError::transient(format!(
                "the server refused the call for insufficient scope (WWW-Authenticate: {}); check the scopes \
                 spec.http.auth.scopes allows and the client is granted",
                oauth::quote(challenge)
            )));
        };
        let mut state = self.state.lock().await;
        let (mut grant, origin) = self.load(location).await?;
        let now = grant::unix_now();
        if let Some(token) = grant.usable_access_token(now, 0).filter(|t| Some(*t) != rejected) {
            let renew_at = grant
                .access_token_expires_at
                .and_then(|at| oauth::renew_after(Some(Duration::from_secs(at.saturating_sub(now)))))
                .map(|after| Instant::now() + after);
            self.secrets.hold(&format!("access token of {}", self.server), token, Some(&self.server));
            state.token = Some(Cached { token: token.to_string(), renew_at });
            return Ok(token.to_string());
        }
        let missing = match grant::step_up(&grant.scope, &demanded, &self.auth.scopes) {
            grant::StepUp::Futile(why) => return Err(TokenError::transient(why)),
            grant::StepUp::Login(missing) => missing,
        };
        for scope in &missing {
            if !grant.step_up_scopes.contains(scope) {
                grant.step_up_scopes.push(scope.clone());
            }
        }
        let shown = missing.iter().map(|s| oauth::quote(s)).collect::<Vec<_>>().join(" ");
        if let Err(e) = self.save(origin, &grant, false).await {
            tracing::warn!(server_id = %self.server, error = %e, "the demanded scopes were not noted");
        }
        tracing::info!(server_id = %self.server, scopes = %shown, "the server asks for more scopes than the grant has");
        Err(TokenError::transient(format!(
            "the server asks for scope(s) {shown} for this call, which the person's grant does not have: {} (the \
             login asks for them too)",
            self.login_hint().replace("consent again", "consent to them")
        )))
    }

    /// One token for the grant's refresh token; `grant` updated with what was issued.
    async fn refresh_grant(
        &self,
        state: &mut State,
        challenge: Option<&str>,
        grant: &mut StoredGrant,
        refresh_token: &str,
        client_secret: Option<&str>,
    ) -> Result<IssuedToken, TokenError> {
        // The refresh token was held for redaction when the grant was loaded.
        let found = self.discovered(state, challenge).await?;
        if let Some(why) = oauth::grant_refusal(found.grant_types_supported.as_ref(), GRANT_REFRESH_TOKEN) {
            return Err(TokenError::lasting(why));
        }
        let secret = client_secret.map(str::to_string).or_else(|| grant.client.client_secret.clone());
        if let Some(secret) = &secret {
            self.secrets.hold(&format!("client secret of {}", self.server), secret, Some(&self.server));
        }
        let form =
            [("grant_type", GRANT_REFRESH_TOKEN), ("refresh_token", refresh_token), ("resource", &grant.resource)];
        let answer = self
            .http
            .post_form_as_client(
                &found.token_endpoint,
                &form,
                &grant.client.client_id,
                secret.as_deref(),
                grant.client.auth_method,
            )
            .await?;
        let issued = oauth::parse_token_response(answer.status, &answer.body).map_err(|e| {
            // The refresh token itself is refused: revoked, expired, or rotated by another user.
            if e.message.contains("\"invalid_grant\"") {
                TokenError::lasting(format!("the stored grant was refused ({}): {}", e.message, self.login_hint()))
            } else {
                e
            }
        })?;
        let now = grant::unix_now();
        if let Some(rotated) = &issued.refresh_token {
            self.secrets.hold(&format!("refresh token of {}", self.server), rotated, Some(&self.server));
            grant.refresh_token = Some(rotated.clone());
        }
        grant.access_token = Some(issued.access_token.clone());
        grant.access_token_expires_at = issued.expires_in.map(|d| now.saturating_add(d.as_secs()));
        grant.refreshed_at = Some(now);
        if let Some(scope) = &issued.scope {
            grant.scope = scope.clone();
        }
        Ok(issued)
    }

    /// The grant where `location` says, when it is this server's (URL and issuer).
    async fn load(&self, location: &GrantLocation) -> Result<(StoredGrant, Origin), TokenError> {
        let login = self.login_hint();
        let (grant, origin) = match location {
            GrantLocation::Unavailable(why) => return Err(TokenError::lasting(why.clone())),
            GrantLocation::File(path) => {
                let grant = read_grant(path)
                    .await
                    .map_err(|e| TokenError { message: format!("{}: {login}", e.message), ..e })?;
                (grant, Origin::File(path.clone()))
            }
            GrantLocation::Secret(name) => {
                let secret = self.secret_store()?.get(name, &self.server).await?;
                if let Some(why) = grant_secret::refused(&secret) {
                    return Err(TokenError::lasting(format!(
                        "the grant in Secret {name:?} was refused ({why}): {login}"
                    )));
                }
                let grant = grant_secret::grant_of(&secret, &self.server)
                    .map_err(|e| TokenError::lasting(format!("{e}: {login}")))?;
                (grant, Origin::Secret(Box::new(secret)))
            }
        };
        let issuer = self.auth.issuer.as_deref().unwrap_or_default();
        if let Some(why) = grant.mismatch(&self.url, issuer) {
            return Err(TokenError::lasting(format!("{why}: {login}")));
        }
        if let Some(token) = &grant.refresh_token {
            self.secrets.hold(&format!("refresh token of {}", self.server), token, Some(&self.server));
        }
        Ok((grant, origin))
    }

    /// Writes `grant` back where it came from; `renewed`: a renewal (the Secret records when).
    async fn save(&self, origin: Origin, grant: &StoredGrant, renewed: bool) -> Result<(), String> {
        match origin {
            Origin::File(path) => {
                let grant = grant.clone();
                match tokio::task::spawn_blocking(move || grant_store::write(&path, &grant)).await {
                    Ok(written) => written.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            Origin::Secret(secret) => {
                let secret = if renewed {
                    grant_secret::with_grant(*secret, grant, grant::unix_now())
                } else {
                    grant_secret::with_data(*secret, grant)
                };
                self.update_secret(&secret).await
            }
        }
    }

    /// Records on the Secret that a person must log in (files say nothing: the error does).
    async fn mark_login_required(&self, origin: Origin, reason: &str) {
        if let Origin::Secret(secret) = origin
            && let Err(e) = self.update_secret(&grant_secret::login_required(*secret, reason, grant::unix_now())).await
        {
            tracing::warn!(server_id = %self.server, error = %e, "the refused grant was not marked on its Secret");
        }
    }

    /// Gives up this agent's renewal claim after a failure that may pass.
    async fn release(&self, origin: Origin) {
        if let Origin::Secret(mut secret) = origin {
            if let Some(annotations) = secret.metadata.annotations.as_mut() {
                annotations.remove(crate::api::keys::ANNOTATION_GRANT_RENEWING);
            }
            if let Err(e) = self.update_secret(&secret).await {
                tracing::warn!(server_id = %self.server, error = %e, "the renewal claim was not released (it lapses)");
            }
        }
    }

    async fn update_secret(&self, secret: &Secret) -> Result<(), String> {
        match self.secret_store().map_err(|e| e.message)?.update(secret, &self.server).await {
            Ok(_) => Ok(()),
            Err(UpdateError::Conflict) => Err("the Secret changed meanwhile (a login or another pod)".to_string()),
            Err(UpdateError::Failed(e)) => Err(e.message),
        }
    }

    fn secret_store(&self) -> Result<&GrantSecrets, TokenError> {
        self.grant_secrets.as_ref().ok_or_else(|| {
            TokenError::lasting("the grant is kept in a Secret and this agent has no Kubernetes client to read it")
        })
    }

    /// The command that stores a new grant, for refusals.
    fn login_hint(&self) -> String {
        match (&self.auth.mode, &self.grant_secrets) {
            (AuthMode::AuthorizationCode { grant: GrantLocation::Secret(_), .. }, Some(store)) => {
                format!("run `spearlet auth login --server {} -n {}` to consent again", self.server, store.namespace())
            }
            _ => format!("run `spearlet auth login --server {}` (with this registry) to consent again", self.server),
        }
    }
}

/// The stored grant at `path`, read off the runtime's threads. A missing or unreadable one is a
/// lasting refusal (a person must log in).
async fn read_grant(path: &Path) -> Result<StoredGrant, TokenError> {
    let read = tokio::task::spawn_blocking({
        let path = path.to_path_buf();
        move || grant_store::read(&path)
    });
    match read.await {
        Ok(Ok(grant)) => Ok(grant),
        Ok(Err(grant_store::GrantStoreError::Missing { .. })) => Err(TokenError::lasting(format!(
            "the server needs a person's consent and none is stored ({})",
            path.display()
        ))),
        Ok(Err(e)) => Err(TokenError::lasting(e.to_string())),
        Err(e) => Err(TokenError::transient(format!("reading the grant: {e}"))),
    }
}
