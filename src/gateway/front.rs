//! The gateway's front: every `/mcp` request is authenticated, given its caller's profile, and
//! handed to that profile's door with its session id opened; nothing reaches a door otherwise.
//!
//! ```text
//! request ─▶ Host/Origin guard ─▶ bearer token ─401 + challenge─▶
//!   ─▶ TokenReview (cached) ─401 / 503─▶ binding decision (+ Spear-Profile) ─403─▶
//!   ─▶ Mcp-Session-Id opened for this caller ─404─▶ the profile's /mcp door
//!   ◀─ Mcp-Session-Id sealed for this caller ◀─
//! ```
//!
//! The token never travels on: the door gets the request without `Authorization`, and the
//! caller's name in an extension (audited with each call).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use tokio::sync::watch;
use tower::ServiceExt as _;

use super::auth::{self, Unauthenticated};
use super::bindings::Bindings;
use super::profiles::ProfileDoors;
use super::resource_metadata::{self as metadata, ResourceMetadata, WELL_KNOWN};
use super::session_seal::SessionSeal;
use super::token_review::{ReviewError, TokenReviewer};
use crate::agent::CallerName;
use crate::agent::http_guard::{self, Allowed};
use crate::policy::binding::{self, Refusal};

/// The header a caller bound to several profiles names one with.
pub const PROFILE_HEADER: &str = "spear-profile";

/// `mcp_gateway_requests_total`'s label: how the front answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// The front's state.
#[derive(Clone, Debug)]
pub struct Front {
    inner: Arc<FrontParts>,
}

/// What the front is built from.
#[derive(Debug)]
pub struct FrontParts {
    pub reviewer: TokenReviewer,
    pub bindings: watch::Receiver<Bindings>,
    pub profiles: Arc<ProfileDoors>,
    pub seal: SessionSeal,
    pub namespace: String,
    pub public_url: Option<String>,
    pub authorization_servers: Vec<String>,
    pub outcomes: Family<OutcomeLabel, Counter>,
}

impl Front {
    pub fn new(parts: FrontParts) -> Self {
        Front { inner: Arc::new(parts) }
    }

    /// Port 4040's router: the metadata documents and `/mcp`, behind the Host/Origin guard.
    pub fn router(self, allowed: Allowed) -> Router {
        Router::new()
            .route(WELL_KNOWN, get(resource_metadata))
            .route(&format!("{WELL_KNOWN}/{{*path}}"), get(resource_metadata))
            .route("/mcp", any(mcp))
            .route("/mcp/{*rest}", any(mcp))
            .with_state(self)
            .layer(middleware::from_fn_with_state(allowed, http_guard::guard))
    }

    fn count(&self, outcome: &'static str) {
        self.inner.outcomes.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// The URL the caller reached: `Host` (HTTP/1.1), else the request's authority (HTTP/2's
    /// `:authority`, which carries no `Host` header).
    fn base_url(&self, request: &Request) -> String {
        let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok());
        let host = host.or_else(|| request.uri().authority().map(|a| a.as_str()));
        metadata::base_url(self.inner.public_url.as_deref(), host)
    }
}

/// `GET /.well-known/oauth-protected-resource[/mcp]`: the resource's metadata (RFC 9728).
async fn resource_metadata(State(front): State<Front>, request: Request) -> Response {
    let suffix = request.uri().path().strip_prefix(WELL_KNOWN).unwrap_or_default();
    if !suffix.is_empty() && metadata::resource_path(suffix) != suffix {
        return (StatusCode::NOT_FOUND, "no protected resource at this path\n").into_response();
    }
    let document = ResourceMetadata {
        resource: format!("{}{suffix}", front.base_url(&request)),
        authorization_servers: front.inner.authorization_servers.clone(),
        bearer_methods_supported: vec!["header"],
        resource_name: "spear-mcp gateway",
        audience: front.inner.reviewer.audience().to_string(),
    };
    axum::Json(document).into_response()
}

/// Every `/mcp` request: see the module doc.
async fn mcp(State(front): State<Front>, mut request: Request) -> Response {
    let inner = &front.inner;
    let authorization = request.headers().get(header::AUTHORIZATION).map(HeaderValue::as_bytes);
    let caller = match auth::bearer(authorization) {
        Err(why) => return unauthenticated(&front, &request, &why),
        Ok(token) => match inner.reviewer.caller(token).await {
            Ok(Ok(caller)) => caller,
            Ok(Err(why)) => return unauthenticated(&front, &request, &why),
            Err(e) => {
                // The API server's words stay in the log: they describe the gateway's own rights
                // and state, nothing an unauthenticated caller needs.
                tracing::warn!(error = %e, "gateway: cannot check a token now");
                front.count("unavailable");
                let message = match e {
                    ReviewError::Busy => "too many token checks at once; retry",
                    ReviewError::Api(_) => "the gateway cannot check tokens now; retry",
                };
                let mut response = refusal(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", message);
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return response;
            }
        },
    };
    let requested = match request.headers().get(PROFILE_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(name)) if crate::api::validate::is_dns1123_subdomain(name) => Some(name.to_string()),
        Some(_) => {
            front.count("bad_request");
            let message = "the Spear-Profile header is not an McpProfile name (a DNS-1123 subdomain)";
            return refusal(StatusCode::BAD_REQUEST, "invalid_request", message);
        }
    };
    let bindings = inner.bindings.borrow().valid.clone();
    let bound = match binding::decide(&caller, &inner.namespace, bindings.iter(), requested.as_deref()) {
        Ok(bound) => bound,
        Err(refused) => {
            tracing::info!(caller = %caller, reason = %refused, "gateway: caller refused");
            front.count("forbidden");
            let code = match refused {
                Refusal::NotBound { .. } => "not_bound",
                Refusal::Ambiguous { .. } => "profile_choice_required",
                Refusal::NotBoundTo { .. } => "not_bound_to_profile",
            };
            return refusal(StatusCode::FORBIDDEN, code, &refused.to_string());
        }
    };
    let profile = bound.profile;
    let headers = request.headers_mut();
    headers.remove(header::AUTHORIZATION);
    if let Some(sealed) = headers.get(HEADER_SESSION_ID) {
        let opened = sealed
            .to_str()
            .ok()
            .and_then(|sealed| inner.seal.open(&caller.username, &profile, sealed))
            .and_then(|id| HeaderValue::from_str(id).ok());
        match opened {
            Some(id) => {
                headers.insert(HEADER_SESSION_ID, id);
            }
            None => {
                front.count("unknown_session");
                return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
            }
        }
    }
    let name: Arc<str> = caller.username.as_str().into();
    request.extensions_mut().insert(CallerName(name));
    let door = inner.profiles.get(&profile).await;
    let mut response = match door.router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    if let Some(id) = response.headers().get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok()) {
        match HeaderValue::from_str(&inner.seal.seal(&caller.username, &profile, id)) {
            Ok(sealed) => {
                response.headers_mut().insert(HEADER_SESSION_ID, sealed);
            }
            Err(_) => return refusal(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "session id not sealable"),
        }
    }
    front.count("admitted");
    response
}

/// 401 with the RFC 9728 challenge naming the metadata of the resource `path` belongs to.
fn unauthenticated(front: &Front, request: &Request, why: &Unauthenticated) -> Response {
    front.count("unauthenticated");
    let url = metadata::metadata_url(&front.base_url(request), metadata::resource_path(request.uri().path()));
    let description = matches!(why, Unauthenticated::Refused(_)).then(|| why.to_string());
    let challenge = metadata::challenge(&url, why.error_code(), description.as_deref());
    let mut response = refusal(StatusCode::UNAUTHORIZED, "unauthenticated", &why.to_string());
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// A JSON refusal: `{"error": {"code", "message"}}`.
fn refusal(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}
