//! The mutating admission webhook: HTTPS `POST /mutate-pods` (`admission.k8s.io/v1`
//! AdmissionReview of a Pod), a thin shell around [`inject::mutate`].
//!
//! ```text
//! API server ──TLS (CertResolver, hot-swapped by certs)──▶ accept loop ──▶ axum /mutate-pods
//!   AdmissionReview<Pod> ──▶ Lookup::fetch(namespace, profile)
//!                              CachedLookup: namespace, McpProfile, McpServers from reflector
//!                              stores (webhook_cache), a miss read through with a bounded GET;
//!                              the metadata of referenced Secrets by bounded GETs ∥
//!                        ──▶ profile_servers (pure: spec.servers ∪ serverSelector)
//!                        ──▶ inject::mutate (pure) ──▶ Skip: allow · Patch: JSON patch + warnings
//!                                                       · Deny: allowed=false + message
//!   a lookup or injection failure ──▶ HTTP 500, so the webhook's failurePolicy decides
//! ```
//!
//! In front of the review, two gates (issue 13, finding 8): with `--webhook-client-ca-file` the
//! TLS handshake requires the API server's client certificate ([`super::client_auth`]), and every
//! request passes a per-source token bucket ([`super::rate_limit`]) that answers 429 before the
//! body is read.
//!
//! Decisions, and why:
//! - **Reads from caches, misses read through** ([`super::webhook_cache`], issue 18). Three
//!   rounds of API reads cost every pod create about 6 ms at p50 and 15 ms at p99; the stores
//!   answer in microseconds. A store can be a moment behind (`kubectl apply -f profile.yaml -f
//!   pod.yaml`), so a profile or named server it lacks is read with a GET before the pod is
//!   judged; the module header there says what a cache can still miss. Each direct read is
//!   bounded by [`DEFAULT_LOOKUP_TIMEOUT`] (3 s), so even three rounds of them stay inside the
//!   API server's 10 s.
//! - **Errors are not denials.** A pod is denied (`allowed: false`, with the message from
//!   `mutate`) only for something wrong with the pod or its profile. When the webhook cannot
//!   decide (API server unreachable, a bug), it answers HTTP 500 and the configuration's
//!   `failurePolicy` decides whether the pod is admitted uninjected or refused.
//! - **Namespace from the request.** A pod created with `generateName` by a controller carries
//!   no `metadata.namespace` in the review's object; `request.namespace` is authoritative.
//! - **Native sidecars** (`--native-sidecars auto`) are decided once at start from the API
//!   server's version (1.29 or later, where `SidecarContainers` is on by default). A control
//!   plane upgraded under a running operator gets native sidecars after the operator restarts.
//! - **TLS handshakes off the accept loop.** Each connection's handshake runs in its own task
//!   with a timeout, so a slow or idle client (a port scanner, a half-open connection) never
//!   holds up the API server's next call. Failed handshakes are logged at debug only (anyone can
//!   cause them) and counted by reason in `tls_handshake_failures_total`, where a refused client
//!   certificate shows up as `client_certificate`: a misconfigured API server, or an attempt.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation, SerializePatchError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::certs::{self, CertError, CertResolver, CertSource};
use super::client_auth::{self, ClientAuth, ClientAuthError};
use super::controller::Scope;
use super::inject::{self, Decision, InjectConfig, InjectError};
use super::rate_limit::{self, Limiting, RateLimit, SourceLimiter};
use super::webhook_cache::CachedLookup;
use crate::api::keys::{ANNOTATION_INJECT, ANNOTATION_PROFILE};
use crate::api::secret_grant::{SecretGrants, profile_secret_ref, server_secret_refs};
use crate::api::{McpProfile, McpServer};
use crate::http_server::ConnectionLimits;
use crate::telemetry::error_chain;

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

/// Why one API read failed.
#[derive(Debug, Error)]
pub enum LookupError {
    /// The API server answered with an error.
    #[error("reading {what} failed")]
    Kube {
        /// What was read.
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer in time.
    #[error("reading {what} took longer than {timeout:?}")]
    Timeout {
        /// What was read.
        what: String,
        timeout: Duration,
    },
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
        }
    }
}

// === metrics ===

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    /// `patch`, `skip`, `deny` or `error`.
    decision: &'static str,
    /// The skip reason or error label; empty for patch and deny.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    /// `Namespace`, `McpProfile` or `McpServer`.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    /// `client_certificate` (missing or refused), `timeout` or `other`.
    reason: &'static str,
}

/// Admission metrics: `admission_total{decision,reason}`, `admission_latency_ms`,
/// `rate_limited_total` (requests answered 429 before any parsing),
/// `tls_handshake_failures_total{reason}` and `cache_read_through_total{kind}` (objects a
/// review needed that the caches did not hold yet, read with a GET), `caches_synced` and
/// `certificate_expiry_timestamp_seconds` (the served certificate's not-after).
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    admissions: Family<AdmissionLabels, Counter>,
    latency_ms: Histogram,
    rate_limited: Counter,
    handshake_failures: Family<HandshakeLabels, Counter>,
    read_through: Family<KindLabels, Counter>,
    caches_synced: Gauge,
    /// The served certificate's not-after, unix seconds (kept by `certs::CertResolver`).
    certificate_expiry: Gauge,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        // 1 ms to ~4 s: a review is a few API reads; past 4 s the API server's timeout is near.
        WebhookMetrics {
            admissions: Family::default(),
            latency_ms: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            rate_limited: Counter::default(),
            handshake_failures: Family::default(),
            read_through: Family::default(),
            caches_synced: Gauge::default(),
            certificate_expiry: Gauge::default(),
        }
    }
}

impl WebhookMetrics {
    /// Metrics registered on `registry` (give it a `webhook` prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = WebhookMetrics::default();
        registry.register("admission", "Pod admission reviews by decision", metrics.admissions.clone());
        registry.register("admission_latency_ms", "Time to answer one review", metrics.latency_ms.clone());
        registry.register(
            "rate_limited",
            "Requests answered 429 by the per-source rate limit, before any parsing",
            metrics.rate_limited.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed, by reason (client_certificate: missing or refused)",
            metrics.handshake_failures.clone(),
        );
        registry.register(
            "cache_read_through",
            "Objects a review needed that the webhook's caches did not hold (yet), read with a GET",
            metrics.read_through.clone(),
        );
        registry.register(
            "caches_synced",
            "1 once the webhook's caches have listed (reviews answered from memory), 0 before",
            metrics.caches_synced.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the webhook's serving certificate expires (its not-after), unix seconds; 0 before the first",
            metrics.certificate_expiry.clone(),
        );
        // Every known series from 0, so a first failure shows in rate() (the alerts read it).
        for reason in ["client_certificate", "timeout", "other"] {
            metrics.handshake_failures.get_or_create_owned(&HandshakeLabels { reason });
        }
        for kind in ["Namespace", "McpProfile", "McpServer"] {
            metrics.read_through.get_or_create_owned(&KindLabels { kind });
        }
        metrics
    }

    pub(crate) fn caches_synced_now(&self) {
        self.caches_synced.set(1);
    }

    /// Whether the webhook's caches have listed.
    pub fn caches_synced(&self) -> bool {
        self.caches_synced.get() == 1
    }

    /// One object of `kind` read through a cache miss.
    pub(crate) fn read_through(&self, kind: &'static str) {
        self.read_through.get_or_create(&KindLabels { kind }).inc();
    }

    /// Objects of `kind` (`Namespace`, `McpProfile`, `McpServer`) read through so far.
    pub fn read_through_count(&self, kind: &'static str) -> u64 {
        self.read_through.get_or_create(&KindLabels { kind }).get()
    }

    /// One request refused by the rate limit.
    pub(crate) fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    /// Requests refused by the rate limit so far.
    pub fn rate_limited_count(&self) -> u64 {
        self.rate_limited.get()
    }

    /// TLS handshakes that failed for `reason` so far (`client_certificate`, `timeout`, `other`).
    pub fn handshake_failures(&self, reason: &'static str) -> u64 {
        self.handshake_failures.get_or_create(&HandshakeLabels { reason }).get()
    }

    fn handshake_failed(&self, reason: &'static str) {
        self.handshake_failures.get_or_create(&HandshakeLabels { reason }).inc();
    }

    fn record(&self, decision: &'static str, reason: &'static str, elapsed: Duration) {
        self.admissions.get_or_create(&AdmissionLabels { decision, reason }).inc();
        self.latency_ms.observe(elapsed.as_secs_f64() * 1000.0);
    }
}

// === lookup ===

/// What one review needs from the API server.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub namespace_labels: BTreeMap<String, String>,
    /// The profile the pod names, `None` when it does not exist (or none was asked for).
    pub profile: Option<McpProfile>,
    /// McpServers of the namespace, at least those the profile resolves to (empty when no
    /// profile was asked for or it does not exist); [`profile_servers`] picks the profile's.
    pub servers: Vec<McpServer>,
    /// The annotations of the Secrets the profile and its servers reference (metadata only).
    pub secrets: SecretGrants,
}

/// The webhook's read access to the API server, a trait so the handler can run without one:
/// the Kubernetes implementation is [`KubeLookup`]; tests and benches pass fixed inputs.
pub trait Lookup: Send + Sync + 'static {
    /// The namespace's labels and, when `profile` is given, that McpProfile and the namespace's
    /// McpServers.
    fn fetch(&self, namespace: &str, profile: Option<&str>)
    -> impl Future<Output = Result<Inputs, LookupError>> + Send;
}

/// [`Lookup`] by direct, bounded reads: [`super::webhook_cache::CachedLookup`] falls back to it
/// on a miss and before its stores have listed.
#[derive(Clone)]
pub struct KubeLookup {
    client: Client,
    timeout: Duration,
}

impl KubeLookup {
    /// Reads through `client`, each read bounded by `timeout`.
    pub fn new(client: Client, timeout: Duration) -> Self {
        KubeLookup { client, timeout }
    }

    async fn bounded<T>(
        &self,
        what: impl Fn() -> String,
        read: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LookupError> {
        match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(LookupError::Kube { what: what(), source }),
            Err(_) => Err(LookupError::Timeout { what: what(), timeout: self.timeout }),
        }
    }
}

impl Lookup for KubeLookup {
    async fn fetch(&self, namespace: &str, profile: Option<&str>) -> Result<Inputs, LookupError> {
        let labels = self.namespace_labels(namespace);
        let Some(name) = profile else {
            return Ok(Inputs { namespace_labels: labels.await?, ..Inputs::default() });
        };
        let (namespace_labels, profile) = tokio::try_join!(labels, self.profile(namespace, name))?;
        let (servers, secrets) = match &profile {
            Some(profile) => {
                let servers = self.servers(namespace, profile).await?;
                let secrets = self.secrets(namespace, profile, &servers).await?;
                (servers, secrets)
            }
            None => Default::default(),
        };
        Ok(Inputs { namespace_labels, profile, servers, secrets })
    }
}

impl KubeLookup {
    /// The namespace's labels (metadata GET).
    pub(crate) async fn namespace_labels(&self, namespace: &str) -> Result<BTreeMap<String, String>, LookupError> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let meta = self.bounded(|| format!("Namespace {namespace}"), namespaces.get_metadata(namespace)).await?;
        Ok(meta.metadata.labels.unwrap_or_default())
    }

    /// The McpProfile, `None` when it does not exist.
    pub(crate) async fn profile(&self, namespace: &str, name: &str) -> Result<Option<McpProfile>, LookupError> {
        let profiles: Api<McpProfile> = Api::namespaced(self.client.clone(), namespace);
        self.bounded(|| format!("McpProfile {namespace}/{name}"), profiles.get_opt(name)).await
    }

    /// The McpServers `profile` may resolve to. Named servers are read with GETs in parallel,
    /// not a LIST: a GET is a quorum read from etcd (about 2 ms), while a consistent LIST is
    /// served from the watch cache only once that cache has caught up with etcd, which right
    /// after other writes (pods being created) took 60-90 ms on the test control plane. A
    /// `serverSelector` needs the LIST; it covers the named servers too.
    pub(crate) async fn servers(&self, namespace: &str, profile: &McpProfile) -> Result<Vec<McpServer>, LookupError> {
        if profile.spec.server_selector.is_some() {
            let api: Api<McpServer> = Api::namespaced(self.client.clone(), namespace);
            let all = ListParams::default();
            return Ok(self.bounded(|| format!("McpServers in {namespace}"), api.list(&all)).await?.items);
        }
        let names: Vec<&str> = profile.spec.servers.iter().map(String::as_str).collect();
        self.servers_named(namespace, &names).await
    }

    /// The named McpServers that exist (GETs in parallel).
    pub(crate) async fn servers_named(&self, namespace: &str, names: &[&str]) -> Result<Vec<McpServer>, LookupError> {
        let api: Api<McpServer> = Api::namespaced(self.client.clone(), namespace);
        let reads = names.iter().map(|name| {
            let api = api.clone();
            async move { self.bounded(|| format!("McpServer {namespace}/{name}"), api.get_opt(name)).await }
        });
        Ok(futures::future::try_join_all(reads).await?.into_iter().flatten().collect())
    }

    /// The annotations of every Secret `profile` and the servers it selects among `servers`
    /// reference: metadata GETs in parallel (never the data, which the operator does not need).
    pub(crate) async fn secrets(
        &self,
        namespace: &str,
        profile: &McpProfile,
        servers: &[McpServer],
    ) -> Result<SecretGrants, LookupError> {
        let mut names: BTreeSet<String> = profile_secret_ref(profile).map(|r| r.secret).into_iter().collect();
        for server in servers.iter().filter(|s| profile.selects(s)) {
            names.extend(server_secret_refs(server).into_iter().map(|r| r.secret));
        }
        let mut grants = SecretGrants::default();
        if names.is_empty() {
            return Ok(grants);
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let reads = names.into_iter().map(|name| {
            let api = api.clone();
            async move {
                let meta = self.bounded(|| format!("Secret {namespace}/{name}"), api.get_metadata_opt(&name)).await?;
                Ok::<_, LookupError>((name, meta.map(|m| m.metadata.annotations.unwrap_or_default())))
            }
        });
        for (name, annotations) in futures::future::try_join_all(reads).await? {
            grants.insert(name, annotations);
        }
        Ok(grants)
    }
}

/// The McpServers `profile` resolves to among `servers`: those named in `spec.servers` plus
/// those `spec.serverSelector` matches. Named servers that do not exist are simply absent
/// (the profile's status reports them).
pub(crate) fn profile_servers(profile: &McpProfile, servers: Vec<McpServer>) -> Vec<McpServer> {
    servers.into_iter().filter(|s| profile.selects(s)).collect()
}

/// The profile a pod asks for, unless it opted out (then nothing beyond the namespace is read).
fn wanted_profile(pod: &Pod) -> Option<&str> {
    let annotations = pod.metadata.annotations.as_ref()?;
    if annotations.get(ANNOTATION_INJECT).is_some_and(|v| v.eq_ignore_ascii_case("false")) {
        return None;
    }
    annotations.get(ANNOTATION_PROFILE).map(String::as_str)
}

// === review ===

/// The answer to one admission request, and a label for logs and metrics.
#[derive(Debug)]
pub(crate) struct Reviewed {
    /// What the API server gets.
    pub(crate) response: AdmissionResponse,
    /// `patch`, `skip` or `deny`.
    pub(crate) decision: &'static str,
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
    let allow = |reason| Reviewed { response: response.clone(), decision: "skip", reason };
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

    let inputs = lookup.fetch(&namespace, wanted_profile(&pod)).await?;
    let servers = match &inputs.profile {
        Some(profile) => profile_servers(profile, inputs.servers),
        None => Vec::new(),
    };
    let decision =
        inject::mutate(&pod, &inputs.namespace_labels, inputs.profile.as_ref(), &servers, &inputs.secrets, config)?;
    Ok(match decision {
        Decision::Skip { reason } => allow(reason.as_str()),
        Decision::Patch { patch, warnings, .. } => {
            let mut response = response.with_patch(patch)?;
            if !warnings.is_empty() {
                response.warnings = Some(warnings);
            }
            Reviewed { response, decision: "patch", reason: "" }
        }
        Decision::Deny { message } => {
            let mut response = response.deny(message);
            // 403 Forbidden, as built-in admission plugins answer; unset, the API server says 400.
            response.result.code = 403;
            response.result.reason = "Forbidden".to_string();
            Reviewed { response, decision: "deny", reason: "" }
        }
    })
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
            handler.metrics.record(reviewed.decision, reviewed.reason, elapsed);
            span.in_scope(|| match reviewed.decision {
                "skip" => debug!(reason = reviewed.reason, ?elapsed, "admitted unchanged"),
                "deny" => info!(message = %reviewed.response.result.message, ?elapsed, "denied"),
                _ => info!(warnings = reviewed.response.warnings.as_ref().map_or(0, Vec::len), ?elapsed, "injected"),
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
    use super::*;

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

    #[test]
    fn profile_servers_are_the_named_plus_the_selected() {
        let profile = McpProfile::test("dev").servers(["a", "gone"]).selecting("team", "x");
        let all = vec![
            McpServer::test("a"),
            McpServer::test("b").label("team", "x"),
            McpServer::test("c").label("team", "y"),
        ];
        let names: Vec<_> = profile_servers(&profile, all).into_iter().filter_map(|s| s.metadata.name).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn without_a_selector_only_named_servers() {
        let profile = McpProfile::test("dev").servers(["b"]);
        let all = vec![McpServer::test("a"), McpServer::test("b").label("team", "x")];
        let names: Vec<_> = profile_servers(&profile, all).into_iter().filter_map(|s| s.metadata.name).collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn opted_out_pods_need_no_profile() {
        let mut pod = Pod::default();
        assert_eq!(wanted_profile(&pod), None);
        pod.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_PROFILE.to_string(), "dev".to_string())]));
        assert_eq!(wanted_profile(&pod), Some("dev"));
        pod.metadata.annotations.get_or_insert_default().insert(ANNOTATION_INJECT.to_string(), "False".to_string());
        assert_eq!(wanted_profile(&pod), None);
    }
}
