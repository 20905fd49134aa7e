//! The registry revision an HTTP answer used, in `x-spear-registry-revision`: the chat door
//! stamps the revision of the tool set it used ([`stamp_revision`]); the router's layer
//! ([`revision_layer`]) stamps the current one on every other answer of port 4040.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use super::core::Agent;

/// The response header naming the registry revision an answer used.
pub(crate) const REVISION_HEADER: HeaderName = HeaderName::from_static(crate::api::keys::HEADER_REGISTRY_REVISION);

/// Names the registry revision an answer used: the chat door stamps the revision of the tool set
/// it used, the HTTP router's layer the current one on every answer that has none yet.
pub(crate) fn stamp_revision(headers: &mut HeaderMap, revision: &str) {
    if let Ok(value) = HeaderValue::from_str(revision) {
        headers.insert(REVISION_HEADER, value);
    }
}

/// The HTTP router's layer: the current revision on every answer that names none yet.
pub(crate) async fn revision_layer(State(agent): State<Agent>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if !response.headers().contains_key(REVISION_HEADER) {
        stamp_revision(response.headers_mut(), agent.state().snapshot.revision().as_str());
    }
    response
}
