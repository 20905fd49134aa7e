//! Asking the API server who a token belongs to (`authentication.k8s.io/v1` TokenReview), through
//! the answer cache of `auth.rs`. The gateway's ServiceAccount needs `create` on `tokenreviews`
//! (the chart binds `system:auth-delegator`).
//!
//! At most [`MAX_REVIEWS_IN_FLIGHT`] reviews run at once; a caller waits for a slot up to
//! [`REVIEW_WAIT`], then gets 503: many distinct bad tokens cost the API server a bounded rate,
//! and a stalled API server holds a bounded number of requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::Api;
use kube::api::PostParams;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use super::auth::{self, AnswerCache, Review, Unauthenticated};
use crate::policy::binding::Caller;

/// Reviews in flight at once.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 32;
/// How long a request waits for a review slot, and for the review.
pub const REVIEW_WAIT: Duration = Duration::from_secs(5);

/// Why a token could not be checked (not the caller's fault: 503).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("too many token reviews at once; retry")]
    Busy,
    #[error("the API server did not answer the token review: {0}")]
    Api(String),
}

/// Authenticates bearer tokens with TokenReviews for one audience.
#[derive(Clone, Debug)]
pub struct TokenReviewer {
    client: crate::agent::approvers::KubeClient,
    audience: Arc<str>,
    cache: Arc<Mutex<AnswerCache>>,
    slots: Arc<Semaphore>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, audience: &str) -> Self {
        TokenReviewer {
            client: crate::agent::approvers::KubeClient(client),
            audience: audience.into(),
            cache: Arc::default(),
            slots: Arc::new(Semaphore::new(MAX_REVIEWS_IN_FLIGHT)),
        }
    }

    /// The audience a caller's token must have.
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The caller `token` authenticates, or why it does not (outer error: it could not be told).
    pub async fn caller(&self, token: &str) -> Result<Result<Caller, Unauthenticated>, ReviewError> {
        let key = auth::token_key(token);
        if let Some(answer) = self.cache.lock().get(&key, Instant::now()) {
            return Ok(answer);
        }
        let _slot = tokio::time::timeout(REVIEW_WAIT, self.slots.acquire())
            .await
            .map_err(|_| ReviewError::Busy)?
            .map_err(|_| ReviewError::Busy)?;
        // Another request may have asked while this one waited.
        if let Some(answer) = self.cache.lock().get(&key, Instant::now()) {
            return Ok(answer);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), audiences: Some(vec![self.audience.to_string()]) },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.0.clone());
        let answered = tokio::time::timeout(REVIEW_WAIT, api.create(&PostParams::default(), &review))
            .await
            .map_err(|_| ReviewError::Api(format!("no answer within {REVIEW_WAIT:?}")))?
            .map_err(|e| ReviewError::Api(e.to_string()))?;
        let status = answered.status.unwrap_or_default();
        if let Some(error) = &status.error {
            tracing::debug!(%error, "token review refused a token");
        }
        let user = status.user.unwrap_or_default();
        let answer = auth::admit(
            Review {
                authenticated: status.authenticated.unwrap_or(false),
                username: user.username,
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
                audiences: status.audiences.unwrap_or_default(),
                error: status.error,
            },
            &self.audience,
        );
        let now_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.cache.lock().put(token, answer.clone(), Instant::now(), now_unix);
        Ok(answer)
    }
}
