//! The admin port (4042, all interfaces): `/healthz`, `/readyz`, `/metrics`, and
//! `/debug/effective` for loopback callers only (it shows the whole tool set and its reasons).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use serde::Deserialize;

use super::core::Agent;
use crate::policy::RequestScope;
use crate::policy::explain::explain_json;

/// Content type of the Prometheus text format prometheus-client writes (OpenMetrics).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct AdminState {
    agent: Agent,
    metrics: Arc<Registry>,
}

/// The admin router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()` so
/// `/debug/effective` can check the caller is local.
pub fn router(agent: Agent, metrics: Arc<Registry>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/debug/effective", get(debug_effective))
        .with_state(AdminState { agent, metrics })
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AdminState>) -> Response {
    if state.agent.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: the first registry snapshot is not loaded yet\n").into_response()
    }
}

async fn metrics_text(State(state): State<AdminState>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.metrics) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}\n")).into_response(),
    }
}

#[derive(Deserialize)]
struct DebugQuery {
    /// A request scope as JSON, as in `spearlet explain --request`.
    request: Option<String>,
}

async fn debug_effective(
    State(state): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<DebugQuery>,
) -> Response {
    if !peer.ip().is_loopback() {
        return (StatusCode::FORBIDDEN, "/debug/effective answers loopback callers only\n").into_response();
    }
    let scope: Option<RequestScope> = match query.request.as_deref().map(serde_json::from_str).transpose() {
        Ok(scope) => scope,
        Err(e) => {
            return (StatusCode::BAD_REQUEST, format!("request: not a valid request scope: {e}\n")).into_response();
        }
    };
    let current = state.agent.state();
    match state.agent.effective(scope.as_ref(), &[]) {
        Ok(set) => {
            let listed = current.catalog.is_some();
            axum::Json(explain_json(&current.snapshot, &set, listed)).into_response()
        }
        Err(e) => (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({"error": {"code": e.code(), "message": e.to_string()}})),
        )
            .into_response(),
    }
}
