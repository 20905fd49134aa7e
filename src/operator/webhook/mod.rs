//! The mutating admission webhook: HTTPS `POST /mutate-pods` (`admission.k8s.io/v1`
//! AdmissionReview of a Pod), a thin shell around [`inject::mutate`].
//!
//! ```text
//! API server ──TLS (CertResolver, hot-swapped by certs)──▶ accept loop ──▶ axum /mutate-pods
//!   AdmissionReview<Pod> ──▶ namespace and profile annotation checked (Deny, before any read)
//!                        ──▶ Lookup::fetch(namespace, profile)
//!                              CachedLookup: namespace, McpProfile, McpServers from reflector
//!                              stores (cache.rs), a miss read through with a bounded GET;
//!                              the metadata of referenced Secrets by bounded GETs ∥
//!                        ──▶ profile_servers (pure: spec.servers ∪ serverSelector)
//!                        ──▶ inject::mutate (pure) ──▶ Skip: allow · Patch: JSON patch + warnings
//!                                                       · Deny: allowed=false + message
//!   a lookup or injection failure ──▶ HTTP 500, so the webhook's failurePolicy decides
//! ```
//!
//! In front of the review, two gates: with `--webhook-client-ca-file` the TLS handshake requires
//! the API server's client certificate ([`client_auth`]), and every request passes a per-source
//! token bucket ([`rate_limit`]) that answers 429 before the body is read. `lookup.rs` (what a
//! review reads) and `metrics.rs` are leaves; [`certs`] keeps the serving certificate.
//!
//! Errors are not denials: a pod is denied only for something wrong with it or its profile. Why,
//! and the other decisions: `src/operator/README.md`, "Webhook".

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::Client;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation, SerializePatchError};
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use self::certs::{CertError, CertResolver, CertSource};
use self::client_auth::{ClientAuth, ClientAuthError};
use self::rate_limit::{Limiting, RateLimit, SourceLimiter};
use super::inject::{self, Decision, InjectConfig, InjectError};
use super::scope::Scope;
use crate::api::api_key::ApiKey;
use crate::api::validate::is_dns1123_label;
use crate::http_server::ConnectionLimits;
use crate::telemetry::error_chain;

mod cache;
pub mod certs;
pub mod client_auth;
mod lookup;
mod metrics;
pub mod rate_limit;

pub use cache::CachedLookup;
pub(crate) use cache::spawn_stripped_reflector;
pub use lookup::{Inputs, KubeLookup, Lookup, LookupError};
pub(crate) use lookup::{profile_servers, wanted_profile};
pub use metrics::WebhookMetrics;

/// Path the MutatingWebhookConfiguration calls.
pub const MUTATE_PATH: &str = "/mutate-pods";
/// Liveness path (plain `ok` over the same TLS port; kubelet HTTPS probes skip verification).
pub(crate) const HEALTH_PATH: &str = "/healthz";
/// Default bound of each API read: three rounds of reads stay inside the API server's 10 s webhook
/// timeout, leaving room for the TLS handshake.
pub(crate) const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// Default time in-flight reviews get to finish after shutdown: an admission call takes
/// milliseconds, and the API server retries elsewhere once the endpoint is gone.
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// First Kubernetes minor version (of major 1) with native sidecars on by default.
pub(crate) const NATIVE_SIDECARS_MINOR: u32 = 29;
/// A TLS handshake that takes longer is dropped (the API server's whole call has 10 s).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshakes in progress at once: the API server opens a handful of connections and
/// reuses them; 128 leaves room for a control plane of several replicas restarting together.
const MAX_HANDSHAKES: usize = 128;
/// Handshaken connections waiting for the HTTP server; a burst beyond this waits in the
/// handshake tasks, which is back-pressure, not loss.
const ACCEPT_QUEUE: usize = 64;
/// Pause after a failed `accept` (out of file descriptors): retrying at once would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

// === config ===

/// Whether injected sidecars are native (`--native-sidecars auto|true|false`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NativeSidecars {
    /// Native when the API server is 1.29 or later.
    #[default]
    Auto,
    /// Always native (`initContainers` with `restartPolicy: Always`).
    #[value(name = "true")]
    Enabled,
    /// Always classic containers.
    #[value(name = "false")]
    Disabled,
}

impl NativeSidecars {
    /// The decision, asking the API server's version for `Auto`.
    pub(crate) async fn resolve(self, client: &Client) -> Result<bool, WebhookError> {
        match self {
            NativeSidecars::Enabled => Ok(true),
            NativeSidecars::Disabled => Ok(false),
            NativeSidecars::Auto => {
                let info = client.apiserver_version().await.map_err(WebhookError::Version)?;
                let native = supports_native_sidecars(&info);
                info!(version = %info.git_version, native, "decided native sidecars from the API server version");
                Ok(native)
            }
        }
    }
}

/// Whether a cluster of this version runs native sidecars by default (1.29 or later). Managed
/// clusters spell minors like `29+`; an unreadable version means classic sidecars, which work
/// everywhere.
pub(crate) fn supports_native_sidecars(info: &Info) -> bool {
    let number = |s: &str| s.trim_end_matches('+').parse::<u32>().ok();
    match (number(&info.major), number(&info.minor)) {
        (Some(major), _) if major > 1 => true,
        (Some(1), Some(minor)) => minor >= NATIVE_SIDECARS_MINOR,
        _ => false,
    }
}

/// Everything [`serve`] needs.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Listen address (`--webhook-addr`).
    pub(crate) addr: SocketAddr,
    /// What to inject. Its `native_sidecars` is replaced by the decision of `native_sidecars`.
    pub(crate) inject: InjectConfig,
    /// How to decide native sidecars.
    pub(crate) native_sidecars: NativeSidecars,
    /// Where the serving certificate comes from.
    pub(crate) cert: CertSource,
    /// Bound of each API read of one review.
    pub(crate) lookup_timeout: Duration,
    /// Where the webhook's caches watch (the operator's `--watch-namespace`); pods elsewhere
    /// are looked up by direct reads.
    pub cache_scope: Scope,
    /// Time in-flight reviews get after shutdown.
    pub(crate) shutdown_grace: Duration,
    /// Require the API server's client certificate (`--webhook-client-ca-file`); `None`: any
    /// client that reaches the port is served.
    pub client_auth: Option<ClientAuth>,
    /// Per-source rate limit of requests.
    pub rate_limit: RateLimit,
    /// Admission counters and latency.
    pub metrics: WebhookMetrics,
}

impl WebhookConfig {
    /// A config with the default timeouts and unregistered metrics.
    pub fn new(addr: SocketAddr, inject: InjectConfig, native_sidecars: NativeSidecars, cert: CertSource) -> Self {
        WebhookConfig {
            addr,
            inject,
            native_sidecars,
            cert,
            lookup_timeout: DEFAULT_LOOKUP_TIMEOUT,
            cache_scope: Scope::Cluster,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            client_auth: None,
            rate_limit: RateLimit::default(),
            metrics: WebhookMetrics::default(),
        }
    }
}

// === errors ===

/// Why the webhook server could not start or stopped.
#[derive(Debug, Error)]
pub enum WebhookError {
    /// The listen address could not be bound.
    #[error("binding the webhook on {addr} failed (is --webhook-addr free?)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// `GET /version` failed (needed for `--native-sidecars auto`).
    #[error(
        "asking the API server for its version (for --native-sidecars auto) failed; set --native-sidecars true or false to skip it"
    )]
    Version(#[source] kube::Error),
    /// No serving certificate.
    #[error("the webhook has no serving certificate")]
    Certs(#[from] CertError),
    /// Client authentication was asked for and cannot be set up.
    #[error("the webhook cannot authenticate its callers")]
    ClientAuth(#[from] ClientAuthError),
    /// The certificate task ended before shutdown (it only ends by panicking).
    #[error("the webhook certificate task ended unexpectedly")]
    CertTask(#[source] tokio::task::JoinError),
}

/// Why one review could not be answered (HTTP 500; the failure policy decides).
#[derive(Debug, Error)]
pub(crate) enum ReviewError {
    /// The request names no namespace (pods are namespaced, so the API server always does).
    #[error("the admission request names no namespace")]
    NoNamespace,
    /// An API read failed.
    #[error("looking up the pod's namespace, profile or servers failed")]
    Lookup(#[from] LookupError),
    /// The mutation failed (a bug).
    #[error("computing the injection failed")]
    Inject(#[from] InjectError),
    /// The patch could not be serialized.
    #[error("serializing the injection patch failed")]
    Patch(#[from] SerializePatchError),
    /// The OS gave no randomness for the pod's API key.
    #[error("drawing the pod's API key from the OS failed: {0}")]
    Randomness(getrandom::Error),
}

impl ReviewError {
    /// A short, stable label for metrics.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            ReviewError::NoNamespace => "no_namespace",
            ReviewError::Lookup(LookupError::Timeout { .. }) => "lookup_timeout",
            ReviewError::Lookup(LookupError::Kube { .. }) => "lookup_failed",
            ReviewError::Inject(_) => "inject_failed",
            ReviewError::Patch(_) => "patch_failed",
            ReviewError::Randomness(_) => "randomness_failed",
        }
    }
}

// === review ===

/// What the webhook did with one pod (the `decision` label of `admission_total`; a review that
/// fails is counted as `error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Admitted unchanged.
    Skip,
    /// Admitted with the injection patch.
    Patch,
    /// Refused.
    Deny,
}

impl Admission {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Admission::Skip => "skip",
            Admission::Patch => "patch",
            Admission::Deny => "deny",
        }
    }
}

/// The answer to one admission request, and a label for logs and metrics.
#[derive(Debug)]
pub(crate) struct Reviewed {
    /// What the API server gets.
    pub(crate) response: AdmissionResponse,
    pub(crate) decision: Admission,
    /// The skip reason; empty otherwise.
    pub(crate) reason: &'static str,
}

/// Decides on one admission request: reads what the pod needs through `lookup`, runs
/// [`inject::mutate`], and turns its decision into a response.
#[tracing::instrument(target = "spear_trace", name = "operator.admission_review", skip_all, fields(namespace = request.namespace.as_deref().unwrap_or_default()))]
pub(crate) async fn review<L: Lookup>(
    lookup: &L,
    config: &InjectConfig,
    request: AdmissionRequest<Pod>,
) -> Result<Reviewed, ReviewError> {
    let response = AdmissionResponse::from(&request);
    let allow = |reason| Reviewed { response: response.clone(), decision: Admission::Skip, reason };
    let deny = |message: String| {
        let mut response = response.clone().deny(message);
        // 403 Forbidden, as built-in admission plugins answer; unset, the API server says 400.
        response.result.code = 403;
        response.result.reason = "Forbidden".to_string();
        Reviewed { response, decision: Admission::Deny, reason: "" }
    };
    // The configuration registers CREATE only; anything else passes untouched.
    if request.operation != Operation::Create {
        return Ok(allow("not_create"));
    }
    let Some(mut pod) = request.object else { return Ok(allow("no_object")) };
    let namespace = request
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| pod.metadata.namespace.clone().filter(|n| !n.is_empty()))
        .ok_or(ReviewError::NoNamespace)?;
    pod.metadata.namespace = Some(namespace.clone());

    // Before any read: the request's text (its namespace with a default-open webhook, the pod's
    // annotation always) must not choose what the lookup asks the API server for.
    if !is_dns1123_label(&namespace) {
        let shown: String = namespace.chars().take(64).collect();
        return Ok(deny(format!("the admission request's namespace {shown:?} is not a valid namespace name")));
    }
    let wanted = wanted_profile(&pod);
    if let Some(message) = wanted.and_then(|name| inject::invalid_profile_annotation(name, &namespace)) {
        return Ok(deny(message));
    }
    let inputs = lookup.fetch(&namespace, wanted).await?;
    let servers = match &inputs.profile {
        Some(profile) => profile_servers(profile, inputs.servers),
        None => Vec::new(),
    };
    let api_key = ApiKey::random().map_err(ReviewError::Randomness)?;
    // The trust bundle as it is now: a rotated --extra-ca-file reaches the next pod.
    let rotated;
    let config = match crate::trust::pem() {
        current if !same_bundle(current.as_ref(), config.extra_ca_pem.as_ref()) => {
            rotated = InjectConfig { extra_ca_pem: current, ..config.clone() };
            &rotated
        }
        _ => config,
    };
    let decision = inject::mutate(
        &pod,
        &inputs.namespace_labels,
        inputs.profile.as_ref(),
        &servers,
        &inputs.secrets,
        config,
        &api_key,
    )?;
    Ok(match decision {
        Decision::Skip { reason } => allow(reason.as_str()),
        Decision::Patch { patch, warnings, .. } => {
            let mut response = response.with_patch(patch)?;
            if !warnings.is_empty() {
                response.warnings = Some(warnings);
            }
            Reviewed { response, decision: Admission::Patch, reason: "" }
        }
        Decision::Deny { message } => deny(message),
    })
}

/// Whether two bundles are the same one (the trust module shares a bundle until it changes).
fn same_bundle(a: Option<&Arc<str>>, b: Option<&Arc<str>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (None, None) => true,
        _ => false,
    }
}

// === HTTP ===

struct Handler<L> {
    lookup: L,
    inject: InjectConfig,
    metrics: WebhookMetrics,
}

/// The webhook's routes: `POST /mutate-pods` and `GET /healthz`. [`serve`] puts them behind
/// TLS; benches and tests may drive them directly.
pub fn router<L: Lookup>(lookup: L, inject: InjectConfig, metrics: WebhookMetrics) -> Router {
    let handler = Arc::new(Handler { lookup, inject, metrics });
    Router::new().route(MUTATE_PATH, post(mutate_pods::<L>)).route(HEALTH_PATH, get(healthz)).with_state(handler)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn mutate_pods<L: Lookup>(
    State(handler): State<Arc<Handler<L>>>,
    body: axum::body::Bytes,
) -> Result<Response, Infallible> {
    let started = Instant::now();
    let incoming: AdmissionReview<Pod> = match serde_json::from_slice(&body) {
        Ok(incoming) => incoming,
        Err(error) => {
            handler.metrics.record("error", "bad_request", started.elapsed());
            warn!(%error, "the request is not an AdmissionReview of a Pod");
            return Ok((
                StatusCode::BAD_REQUEST,
                format!("not an admission.k8s.io/v1 AdmissionReview of a Pod: {error}\n"),
            )
                .into_response());
        }
    };
    let request: AdmissionRequest<Pod> = match incoming.try_into() {
        Ok(request) => request,
        Err(_) => {
            handler.metrics.record("error", "bad_request", started.elapsed());
            return Ok((StatusCode::BAD_REQUEST, "the AdmissionReview has no request\n").into_response());
        }
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    // The name is empty for generateName pods; the prefix is what a reader recognizes.
    let pod = request
        .object
        .as_ref()
        .and_then(|p| p.metadata.name.clone().or_else(|| p.metadata.generate_name.clone()))
        .unwrap_or_default();
    let span = info_span!("admission", uid = %request.uid, %namespace, %pod);
    match review(&handler.lookup, &handler.inject, request).instrument(span.clone()).await {
        Ok(reviewed) => {
            let elapsed = started.elapsed();
            handler.metrics.record(reviewed.decision.as_str(), reviewed.reason, elapsed);
            span.in_scope(|| match reviewed.decision {
                Admission::Skip => debug!(reason = reviewed.reason, ?elapsed, "admitted unchanged"),
                Admission::Deny => info!(message = %reviewed.response.result.message, ?elapsed, "denied"),
                Admission::Patch => {
                    info!(warnings = reviewed.response.warnings.as_ref().map_or(0, Vec::len), ?elapsed, "injected")
                }
            });
            let answer: AdmissionReview<DynamicObject> = reviewed.response.into_review();
            Ok(axum::Json(answer).into_response())
        }
        Err(error) => {
            handler.metrics.record("error", error.metric_label(), started.elapsed());
            span.in_scope(|| warn!(error = %error_chain(&error), "could not decide; the failure policy applies"));
            Ok((StatusCode::INTERNAL_SERVER_ERROR, format!("spear webhook: {}\n", error_chain(&error))).into_response())
        }
    }
}

// === TLS listener ===

/// Handshaken TLS connections for `axum::serve`; the accept loop runs in its own task.
struct TlsListener {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    fn spawn(
        listener: TcpListener,
        acceptor: TlsAcceptor,
        metrics: WebhookMetrics,
        shutdown: CancellationToken,
    ) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        let accept = async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    () = shutdown.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            warn!(%error, "accepting a webhook connection failed");
                            tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                            continue;
                        }
                    },
                };
                // Without it, Nagle holds the response's last TLS record until the API server's
                // delayed ACK (40 ms on Linux): measured as +90 ms per pod create.
                if let Err(error) = tcp.set_nodelay(true) {
                    debug!(%error, %peer, "setting TCP_NODELAY failed");
                }
                // Bounded like the connections behind it (http_server): past the cap a new
                // connection is closed at once instead of adding a task.
                let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                    debug!(%peer, "too many TLS handshakes in progress; connection closed");
                    continue;
                };
                let (acceptor, tx, metrics) = (acceptor.clone(), tx.clone(), metrics.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        // A closed channel means the server is shutting down: drop the connection.
                        Ok(Ok(tls)) => drop(tx.send((tls, peer)).await),
                        Ok(Err(error)) => {
                            let reason = handshake_failure_reason(&error);
                            metrics.handshake_failed(reason);
                            debug!(%error, %peer, reason, "TLS handshake failed");
                        }
                        Err(_) => {
                            metrics.handshake_failed("timeout");
                            debug!(%peer, "TLS handshake timed out");
                        }
                    }
                });
            }
        };
        tokio::spawn(accept.instrument(info_span!("webhook_accept", %local)));
        Ok(TlsListener { connections: rx, local })
    }
}

/// The metric label of a failed handshake: `client_certificate` when the client sent no
/// certificate or one the verifier refused, else `other`.
fn handshake_failure_reason(error: &io::Error) -> &'static str {
    match error.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_)) => "client_certificate",
        _ => "other",
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept loop stopped (shutdown): no more connections, ever.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

// === serve ===

/// Runs the webhook until `shutdown`: decides native sidecars, loads the serving certificate
/// (and keeps it current), then serves `POST /mutate-pods` and `GET /healthz` over TLS on
/// `config.addr`. In-flight reviews get `config.shutdown_grace` to finish.
pub async fn serve(client: Client, config: WebhookConfig, shutdown: CancellationToken) -> Result<(), WebhookError> {
    crate::install_crypto_provider();
    let WebhookConfig {
        addr,
        mut inject,
        native_sidecars,
        cert,
        lookup_timeout,
        cache_scope,
        shutdown_grace,
        client_auth,
        rate_limit,
        metrics,
    } = config;
    inject.native_sidecars = native_sidecars.resolve(&client).await?;

    // Child tokens: the background tasks stop when serve returns, however it returns.
    let stop_background = shutdown.child_token();
    let stop_guard = stop_background.clone().drop_guard();
    // Before the certificate: a CA file that does not load is a configuration error to report
    // at once, not after the certificate's retries.
    let authenticated = client_auth.is_some();
    let verifier = match client_auth {
        Some(auth) => Some(client_auth::start(auth, stop_background.clone()).await?.0),
        None => None,
    };
    let resolver = Arc::new(CertResolver::with_expiry_gauge(metrics.certificate_expiry.clone()));
    let mut cert_task = certs::start(client.clone(), cert, resolver.clone(), stop_background.clone()).await?;
    let limiter = Arc::new(SourceLimiter::new(rate_limit));
    tokio::spawn(rate_limit::sweep(limiter.clone(), stop_background.clone()));
    let result = async {
        let builder = rustls::ServerConfig::builder();
        let mut tls = match verifier {
            Some(verifier) => builder.with_client_cert_verifier(verifier).with_cert_resolver(resolver),
            None => builder.with_no_client_auth().with_cert_resolver(resolver),
        };
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let listener = TcpListener::bind(addr).await.map_err(|source| WebhookError::Bind { addr, source })?;
        let listener =
            TlsListener::spawn(listener, TlsAcceptor::from(Arc::new(tls)), metrics.clone(), shutdown.clone())
                .map_err(|source| WebhookError::Bind { addr, source })?;
        info!(
            addr = %listener.local,
            native_sidecars = inject.native_sidecars,
            client_auth = authenticated,
            rate_limit_per_second = rate_limit.per_second,
            rate_limit_burst = rate_limit.burst,
            "serving the pod webhook"
        );

        let limiting = Limiting { limiter, metrics: metrics.clone() };
        let direct = KubeLookup::new(client.clone(), lookup_timeout);
        let lookup = CachedLookup::start(client, &cache_scope, direct, metrics.clone(), stop_background.clone());
        let app = router(lookup, inject, metrics)
            .layer(axum::middleware::from_fn_with_state(limiting, rate_limit::limit_sources));
        // The API server keeps a few connections; the cap and header timeout stop anyone else
        // who reaches the port from holding it.
        let server = crate::http_server::serve(listener, app, ConnectionLimits::default(), shutdown.clone());
        let grace = async {
            shutdown.cancelled().await;
            tokio::time::sleep(shutdown_grace).await;
        };
        tokio::select! {
            () = server => Ok(()),
            () = grace => {
                warn!(?shutdown_grace, "webhook connections still open after the grace period; closing them");
                Ok(())
            }
            // The certificate task only ends at shutdown; earlier means it panicked.
            ended = &mut cert_task => match ended {
                Err(e) => Err(WebhookError::CertTask(e)),
                Ok(()) => Ok(()),
            },
        }
    }
    .await;
    drop(stop_guard);
    result
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::api::keys::ANNOTATION_PROFILE;
    use crate::testing::fixtures;

    /// A lookup that counts its calls and finds nothing.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Lookup for Counting {
        async fn fetch(&self, _namespace: &str, _profile: Option<&str>) -> Result<Inputs, LookupError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(Inputs::default())
        }
    }

    fn request(namespace: &str, profile: &str) -> AdmissionRequest<Pod> {
        let pod = fixtures::app_pod(&[(ANNOTATION_PROFILE, profile)]);
        let body = fixtures::pod_create_review("uid-1", namespace, "alice", &pod);
        let review: AdmissionReview<Pod> = serde_json::from_slice(&body).expect("a review parses");
        review.try_into().expect("the review has a request")
    }

    /// Security review F17: the annotation (and the request's namespace, caller-chosen when the
    /// webhook is open) is checked before the lookup, so no text of the caller reaches a read.
    #[test]
    fn a_profile_annotation_that_is_no_object_name_is_denied_before_any_api_read() {
        let long = "a".repeat(254);
        let config = InjectConfig::new("agent:1", "spearlet:1");
        for (namespace, profile, says) in [
            ("team-a", "../../../api/v1/namespaces/kube-system/secrets", "not a valid McpProfile name"),
            ("team-a", long.as_str(), "at most 253 characters"),
            ("team-a", "Dev", "not a valid McpProfile name"),
            ("../kube-system", "dev", "not a valid namespace name"),
        ] {
            let lookup = Counting::default();
            let reviewed =
                futures::executor::block_on(review(&lookup, &config, request(namespace, profile))).expect("answers");
            assert_eq!(lookup.0.load(Ordering::SeqCst), 0, "{profile:?} in {namespace:?} was looked up");
            assert_eq!(reviewed.decision, Admission::Deny, "{profile:?}");
            assert_eq!(reviewed.response.result.code, 403);
            assert!(reviewed.response.result.message.contains(says), "{}", reviewed.response.result.message);
        }
        // A valid name is looked up (and, absent, denied by the mutation as before).
        let lookup = Counting::default();
        let reviewed =
            futures::executor::block_on(review(&lookup, &config, request("team-a", "dev"))).expect("answers");
        assert_eq!(lookup.0.load(Ordering::SeqCst), 1);
        assert_eq!(reviewed.decision, Admission::Skip, "Inputs::default() is a namespace without the label");
    }

    fn version(major: &str, minor: &str) -> Info {
        Info { major: major.into(), minor: minor.into(), ..Info::default() }
    }

    #[test]
    fn native_sidecars_from_1_29() {
        assert!(!supports_native_sidecars(&version("1", "28")));
        assert!(supports_native_sidecars(&version("1", "29")));
        assert!(supports_native_sidecars(&version("1", "36")));
        assert!(supports_native_sidecars(&version("1", "30+")), "managed clusters append +");
        assert!(supports_native_sidecars(&version("2", "0")));
        assert!(!supports_native_sidecars(&version("", "")), "unknown means classic");
    }
}
