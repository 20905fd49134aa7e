//! The admin port (4042, all interfaces): `/healthz`, `/readyz`, `/metrics`, and for loopback
//! callers only `/debug/effective` (it shows the whole tool set and its reasons) and
//! `POST /admin/reconnect?server=ID` (`spearlet reconnect`, audited: it restarts a server).
//!
//! Ready means: the profile named by `--profile` exists and compiles, and each of its servers has
//! had a first listing attempt: listed, failed, or still starting after the pool's
//! `startup_wait` (10 s). Waiting for the attempt lets the pod's app (held until then by the
//! agent's postStart hook) find the tools on its first request; not waiting for success or for a
//! slow start keeps one server from holding every other tool back (its calls wait within their
//! budget, then answer retryably). A missing or invalid profile is not ready, with the reason in the 503 body. The
//! body lists each server's state either way (`fs: starting (npx), 14 s of 120 s`).
//!
//! `/startupz` (what `spearlet wait-ready`, the injected postStart hook, asks, and the startup
//! probe of an agent injected as a plain container) answers as `/readyz` once the agent is ready
//! or cannot become so, holding the request up to [`STARTUP_HOLD`] until then, so a caller that
//! asks again at once sees the answer change within milliseconds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use serde::Deserialize;

use super::core::Agent;
use crate::policy::explain::{ExplainRequest, explain_json, explain_selection};

/// The admin router: health, readiness and metrics as both binaries serve them, plus
/// `/debug/effective`. Serve it with `into_make_service_with_connect_info::<SocketAddr>()` so
/// `/debug/effective` can check the caller is local.
pub(crate) fn router(agent: Agent, metrics: Arc<Registry>) -> Router {
    let ready = agent.clone();
    let ready = move || ready.readiness();
    crate::telemetry::admin_router(ready, metrics).merge(
        Router::new()
            .route("/startupz", get(startupz))
            .route("/debug/effective", get(debug_effective))
            .route("/admin/reconnect", post(reconnect))
            .with_state(agent),
    )
}

/// The admin port while the agent waits for its first registry list (`spearlet run`): alive, not
/// ready, nothing else yet.
pub(crate) fn starting_router() -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).fallback(|| async {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: waiting for the first list of McpServers and the McpProfile\n")
    })
}

/// Under the kubelet's default probe timeout (1 s), so a held probe is not a failed one, and
/// near its period (1 s), so the next probe starts as this one ends.
pub(crate) const STARTUP_HOLD: Duration = Duration::from_millis(900);

async fn startupz(State(agent): State<Agent>) -> Response {
    // Either way the answer is readiness now: a hold that ran out answers "not yet".
    let _settled = tokio::time::timeout(STARTUP_HOLD, agent.settled()).await;
    match agent.readiness() {
        Ok(detail) => (StatusCode::OK, format!("ready\n{detail}")).into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")).into_response(),
    }
}

/// 403 for a caller that is not on loopback (the admin port listens on every interface in a pod).
fn refuse_remote(peer: SocketAddr, path: &str) -> Option<Response> {
    (!peer.ip().is_loopback())
        .then(|| (StatusCode::FORBIDDEN, format!("{path} answers loopback callers only\n")).into_response())
}

#[derive(Deserialize)]
struct ReconnectQuery {
    server: Option<String>,
}

/// The audit line of a manual reconnect.
#[derive(serde::Serialize)]
struct ReconnectLine<'a> {
    ts: String,
    kind: &'static str,
    server_id: &'a str,
    peer: String,
    outcome: &'static str,
}

async fn reconnect(
    State(agent): State<Agent>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<ReconnectQuery>,
) -> Response {
    if let Some(refused) = refuse_remote(peer, "/admin/reconnect") {
        return refused;
    }
    let Some(server) = query.server.filter(|s| !s.is_empty()) else {
        return (StatusCode::BAD_REQUEST, "server: required (POST /admin/reconnect?server=ID)\n").into_response();
    };
    let result = agent.pool().reconnect(&server).await;
    agent.audit().record(&ReconnectLine {
        ts: super::audit::now(),
        kind: "reconnect",
        server_id: super::audit::capped(&server),
        peer: peer.ip().to_string(),
        outcome: if result.is_ok() { "ok" } else { "unknown_server" },
    });
    match result {
        Ok(()) => (StatusCode::ACCEPTED, format!("{server}: reconnecting\n")).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{}\n", e.message)).into_response(),
    }
}

#[derive(Deserialize)]
struct DebugQuery {
    /// A request as JSON, as in `spearlet explain --request` (a scope, `messages`, `max_tools`).
    request: Option<String>,
}

async fn debug_effective(
    State(agent): State<Agent>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<DebugQuery>,
) -> Response {
    if let Some(refused) = refuse_remote(peer, "/debug/effective") {
        return refused;
    }
    let request = match query.request.as_deref().map(ExplainRequest::parse).transpose() {
        Ok(request) => request.unwrap_or_default(),
        Err(e) => {
            return (StatusCode::BAD_REQUEST, format!("request: not a valid request: {e}\n")).into_response();
        }
    };
    let current = agent.state();
    let explained = agent.effective(request.scope.as_ref(), &[]).and_then(|set| {
        let listed = current.catalog.is_some();
        let mut explained = explain_json(&current.snapshot, &set, listed);
        // Why this pod's registry may be behind the cluster's (a failed watch keeps serving the
        // last good objects): `spearlet explain --pod --connect` shows them beside the revisions.
        explained["registryProblems"] = current.snapshot.problems().iter().map(ToString::to_string).collect();
        // What the list caps cut (mcp::limits) is the pool's to know, not the policy's.
        for server in explained["servers"].as_array_mut().into_iter().flatten() {
            let cut = server["id"].as_str().and_then(|id| agent.pool().status(id)).and_then(|s| s.list_cut);
            if let Some(cut) = cut {
                server["listCut"] = cut.to_string().into();
            }
        }
        if let Some(profile) = current.snapshot.profile(agent.profile())
            && let Some(selection) = explain_selection(&profile.object, &set, &request)?
        {
            explained["toolSelection"] = selection;
        }
        Ok(explained)
    });
    match explained {
        Ok(explained) => axum::Json(explained).into_response(),
        Err(e) => (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({"error": {"code": e.code(), "message": e.to_string()}})),
        )
            .into_response(),
    }
}
