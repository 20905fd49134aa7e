//! The operator's admin view (`spear-operator run --admin-view-addr`): one read-only HTML page,
//! and the same data as JSON, for people who would rather look than read YAML.
//!
//! ```text
//! watch McpServers ──┐
//! watch McpProfiles ─┼─▶ reflector stores ─┐
//! watch Namespaces ──┘                     ├─ per request: model::build (pure) ─┬─▶ page::render ─▶ GET /
//! metadata watch Pods ─▶ InjectedPods ─────┘                                    └─▶ JSON ─▶ GET /view.json
//! ```
//!
//! Off by default; every replica serves it from its own watches (pods as metadata only, and only
//! those the webhook injected: [`model::InjectedPods`]). Read-only and inert; a `Host` outside
//! `--admin-view-allowed-hosts` gets 421. Why: `src/operator/README.md`, "Admin view".

pub mod model;
pub mod page;

#[cfg(test)]
mod tests;

use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use self::model::{InjectedPods, Inputs, Replica};
use super::controller::ControllerMetrics;
use super::scope::Scope;
use super::webhook::spawn_stripped_reflector;
use crate::api::{McpProfile, McpServer};
use crate::http_server::ConnectionLimits;

/// Hosts allowed by default: the names a browser uses for a loopback address.
pub const DEFAULT_ALLOWED_HOSTS: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// Everything [`serve`] needs.
#[derive(Clone, Debug)]
pub struct AdminViewConfig {
    /// Listen address (`--admin-view-addr`).
    pub addr: SocketAddr,
    /// `Host` values (without port, case-insensitive) the view answers (`--admin-view-allowed-hosts`).
    pub allowed_hosts: Vec<String>,
    /// Where to watch (the operator's `--watch-namespace`).
    pub scope: Scope,
    /// This replica's identity, shown on the page.
    pub identity: String,
    /// The controllers' metrics: whether this replica leads now.
    pub leader: ControllerMetrics,
}

/// Why the view could not serve.
#[derive(Debug, thiserror::Error)]
pub enum AdminViewError {
    #[error("binding the admin view on {addr} (is --admin-view-addr free?)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A watch's state for the page: listed yet, and its last error.
#[derive(Debug, Default)]
struct WatchState {
    listed: bool,
    error: Option<String>,
}

/// The watches' state, shared by the request handlers.
struct Watches {
    servers: Store<McpServer>,
    profiles: Store<McpProfile>,
    namespaces: Store<Namespace>,
    pods: Arc<Mutex<InjectedPods>>,
    states: Vec<(&'static str, Arc<Mutex<WatchState>>)>,
    replica: Replica,
    leader: ControllerMetrics,
}

impl Watches {
    fn inputs(&self) -> Inputs {
        let problems = self
            .states
            .iter()
            .filter_map(|(kind, state)| {
                let state = state.lock();
                match (&state.error, state.listed) {
                    (Some(error), _) => Some(format!("{kind}: the watch is failing ({error}); retrying")),
                    (None, false) => Some(format!("{kind}: not listed from the Kubernetes API yet")),
                    (None, true) => None,
                }
            })
            .collect();
        Inputs {
            servers: self.servers.state(),
            profiles: self.profiles.state(),
            namespaces: self.namespaces.state(),
            pods: self.pods.lock().pods(),
            replica: Replica { leader: self.leader.is_leader(), ..self.replica.clone() },
            problems,
        }
    }
}

/// Serves the view on `config.addr` until `shutdown`, watching from `client`.
pub async fn serve(client: Client, config: AdminViewConfig, shutdown: CancellationToken) -> Result<(), AdminViewError> {
    let addr = config.addr;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| AdminViewError::Bind { addr, source })?;
    serve_on(listener, client, config, shutdown).await;
    Ok(())
}

/// [`serve`] on a bound listener (`config.addr` is not used).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    client: Client,
    config: AdminViewConfig,
    shutdown: CancellationToken,
) {
    let stop = shutdown.child_token();
    let _stop_guard = stop.clone().drop_guard();
    let mut states = Vec::new();
    let mut state = |kind: &'static str| {
        let state = Arc::new(Mutex::new(WatchState::default()));
        states.push((kind, state.clone()));
        state
    };
    let servers = spawn_reflector(
        config.scope.api::<McpServer>(client.clone()),
        watcher::Config::default(),
        "McpServer",
        state("McpServer"),
        &stop,
    );
    let profiles = spawn_reflector(
        config.scope.api::<McpProfile>(client.clone()),
        watcher::Config::default(),
        "McpProfile",
        state("McpProfile"),
        &stop,
    );
    let namespaces = spawn_reflector(
        Api::<Namespace>::all(client.clone()),
        config.scope.namespaces(),
        "Namespace",
        state("Namespace"),
        &stop,
    );
    let pods = spawn_pod_watch(config.scope.api::<PartialObjectMeta<Pod>>(client), state("Pod"), &stop);
    let watches = Arc::new(Watches {
        servers,
        profiles,
        namespaces,
        pods,
        states,
        replica: Replica { identity: config.identity, leader: false },
        leader: config.leader,
    });
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(addr = %local, allowed_hosts = ?config.allowed_hosts, "serving the admin view (read-only)");
    let app = router(watches, config.allowed_hosts);
    crate::http_server::serve(listener, app, ConnectionLimits::default(), shutdown).await;
}

fn router(watches: Arc<Watches>, allowed_hosts: Vec<String>) -> Router {
    let allowed: Arc<[String]> = allowed_hosts.into();
    Router::new()
        .route("/", get(page_handler))
        .route(page::JSON_PATH, get(json_handler))
        .route(page::STYLESHEET_PATH, get(stylesheet))
        .with_state(watches)
        .layer(middleware::from_fn(security_headers))
        .layer(middleware::from_fn_with_state(allowed, check_host))
}

async fn page_handler(State(watches): State<Arc<Watches>>) -> Response {
    let view = model::build(watches.inputs());
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page::render(&view)).into_response()
}

async fn json_handler(State(watches): State<Arc<Watches>>) -> Response {
    axum::Json(model::build(watches.inputs())).into_response()
}

async fn stylesheet() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], page::STYLESHEET).into_response()
}

async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(page::CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn check_host(State(allowed): State<Arc<[String]>>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if host_allowed(host, &allowed) {
        return next.run(request).await;
    }
    let message = format!(
        "Host {host:?} is not one the admin view answers; add it to --admin-view-allowed-hosts \
         (chart: adminView.allowedHosts) if this is how you reach it\n"
    );
    (StatusCode::MISDIRECTED_REQUEST, message).into_response()
}

/// Whether a `Host` header value names an allowed host (pure): the port is ignored, names
/// compare case-insensitively, IPv6 literals may be bracketed either side.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let host = host.trim();
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        // A bare IPv6 literal has several colons and no port.
        None if host.matches(':').count() > 1 => host,
        None => host.split(':').next().unwrap_or_default(),
    };
    !name.is_empty()
        && allowed.iter().any(|a| a.trim().trim_start_matches('[').trim_end_matches(']').eq_ignore_ascii_case(name))
}

/// Runs a reflector of `api` until `stop` (retrying with backoff; the store keeps its last state
/// meanwhile), recording its state for the page, and returns its store.
fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    state: Arc<Mutex<WatchState>>,
    stop: &CancellationToken,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let span = tracing::info_span!("admin_view_watch", kind);
    spawn_stripped_reflector(api, config, span, stop, move |event| {
        record(&state, kind, event.as_ref().map(|e| matches!(e, Event::InitDone)));
    })
}

/// Watches pods' metadata until `stop`, keeping only injected pods.
fn spawn_pod_watch(
    api: Api<PartialObjectMeta<Pod>>,
    state: Arc<Mutex<WatchState>>,
    stop: &CancellationToken,
) -> Arc<Mutex<InjectedPods>> {
    let pods = Arc::new(Mutex::new(InjectedPods::default()));
    let index = pods.clone();
    let events =
        watcher::watcher(api, watcher::Config::default()).default_backoff().take_until(stop.clone().cancelled_owned());
    let task = async move {
        tokio::pin!(events);
        while let Some(event) = events.next().await {
            if let Ok(event) = &event {
                let mut pods = index.lock();
                match event {
                    Event::Init => pods.init(),
                    Event::InitApply(pod) => pods.init_apply(&pod.metadata),
                    Event::InitDone => pods.init_done(),
                    Event::Apply(pod) => pods.apply(&pod.metadata),
                    Event::Delete(pod) => pods.delete(&pod.metadata),
                }
            }
            record(&state, "Pod", event.as_ref().map(|e| matches!(e, Event::InitDone)));
        }
    };
    tokio::spawn(task.instrument(tracing::info_span!("admin_view_watch", kind = "Pod")));
    pods
}

/// Records one watch step: a completed list clears the error; a failure is kept until then.
fn record(state: &Mutex<WatchState>, kind: &str, step: Result<bool, &watcher::Error>) {
    let mut state = state.lock();
    match step {
        Ok(true) => {
            state.listed = true;
            state.error = None;
        }
        Ok(false) => {}
        Err(error) => {
            let line = crate::telemetry::error_chain(error);
            if state.error.as_deref() != Some(line.as_str()) {
                tracing::warn!(kind, error = %line, "admin view watch failed; retrying");
            }
            state.error = Some(line);
        }
    }
}
