//! The agent's two entry points: [`run_local`] (`spearlet serve`: the registry is a directory,
//! stdio servers are child processes) and [`run_in_pod`] (`spearlet run`: the registry is the
//! Kubernetes API, stdio servers are reached through their sidecars' bridge sockets). Both end
//! in [`run`], which builds the core and serves the doors ([`super::serve`]).
//!
//! ```text
//! run_in_pod: profile, namespace (set by the injecting webhook)
//!   kubeconfig file(s), else in-cluster, else ~/.kube/config ──▶ kube::Client
//!   ──▶ KubeSource::watch ──▶ wait for the first complete list (cancel still stops the wait)
//!   ──▶ run(.., Mode::Sidecar) until cancel, or until the registry watch dies (an error: never
//!       serve a registry nobody updates any more)
//! run_local: DirSource::watch ──▶ the profile (the only one when not named) ──▶ run(.., Mode::Local)
//! ```
//!
//! In a pod the ports are bound at start but the doors served only after the first list: until
//! then the agent could only answer with an empty registry. Meanwhile the admin port answers
//! `/healthz` ok and everything else 503 (`Listeners::answer_while_starting`): the injected agent
//! has no startup probe (its postStart hook, `spearlet wait-ready`, holds the app back instead),
//! so the kubelet's liveness probe runs from the start and must find the process alive. The wait
//! has no timeout of its own; while the API cannot be listed, the log says why (for example a
//! missing RoleBinding) and the hook's two minutes decide.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::audit::AuditSink;
use super::core::{Agent, AgentOptions};
use super::serve::{AgentConfig, AuditTarget, Listeners, ServeError, serve};
use crate::api::keys;
use crate::egress::AddressDenyList;
use crate::mcp::config::Mode;
use crate::mcp::grant_store::secret::GrantSecrets;
use crate::mcp::{Pool, PoolOptions};
use crate::registry::dir::{DirOptions, DirSource};
use crate::registry::kube::{Error as KubeError, KubeSource};
use crate::registry::view::RegistryView;
use crate::telemetry::{PoolMetrics, RegistryMetrics};

/// `spearlet serve`: the registry from a directory.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// McpServer/McpProfile manifests, re-read on change.
    pub(crate) registry_dir: PathBuf,
    /// The McpProfile to serve; `None` takes the registry's only profile.
    pub(crate) profile: Option<String>,
    pub(crate) agent: AgentConfig,
}

/// `spearlet run`: the registry from the Kubernetes API.
#[derive(Clone, Debug)]
pub struct PodConfig {
    pub profile: Option<String>,
    /// `None` uses the client configuration's namespace.
    pub namespace: Option<String>,
    /// The pod's name, told to approval webhooks; `None` leaves it out.
    pub pod_name: Option<String>,
    /// Where the sidecars' bridge sockets are (`<dir>/<server>/mcp.sock`).
    pub socket_dir: PathBuf,
    /// The stdio servers this pod has sidecars for; `None`: every one is expected to have one.
    pub sidecar_servers: Option<Vec<String>>,
    /// The secret-backed header values delivered to this pod (`<server>/<header>`); `None`:
    /// every `SPEAR_SECRET_*` variable is read.
    pub secret_refs: Option<Vec<String>>,
    /// Where each Streamable HTTP server's delivered credentials were granted to go
    /// (`<server>=<hash>`); `None`: not checked.
    pub granted_destinations: Option<Vec<String>>,
    /// kubeconfig file(s), `:`-separated; `None`: in-cluster, then `~/.kube/config`.
    pub kubeconfig: Option<OsString>,
    pub agent: AgentConfig,
}

/// Why the agent stopped with an error. [`RunError::is_usage`] tells a configuration the user
/// must fix (exit status 2) from a failure at run time (exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad configuration; the message names the flag (and its variable) and the fix.
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Registry(#[from] KubeError),
    /// A task the agent cannot live without ended (the registry watch).
    #[error("{0}")]
    Critical(String),
}

impl RunError {
    pub fn is_usage(&self) -> bool {
        match self {
            RunError::Config(_) => true,
            RunError::Serve(e) => matches!(e, ServeError::Bind { .. } | ServeError::Upstream(_)),
            RunError::Registry(_) | RunError::Critical(_) => false,
        }
    }
}

/// A task whose end must stop the agent (the registry watch); resolves with the reason.
type CriticalTask = std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>>;

/// Runs the agent in local mode until `cancel`.
pub async fn run_local(config: LocalConfig, cancel: CancellationToken) -> Result<(), RunError> {
    crate::install_crypto_provider();
    let watch = DirSource::watch_until(&config.registry_dir, DirOptions::default(), &cancel)
        .map_err(|e| RunError::Config(format!("--registry-dir: {e}")))?;
    let watch = Arc::new(watch);
    let profile = match config.profile {
        Some(profile) => profile,
        None => only_profile(&watch.snapshot(), &config.registry_dir)?,
    };
    let origin = crate::approval::webhook::Origin::default();
    let listeners = Listeners::bind(&config.agent).await?;
    run(config.agent, profile, watch, Mode::Local, None, cancel, (origin, None), listeners).await
}

/// The registry's only profile, or an error saying to pick one.
fn only_profile(snapshot: &crate::registry::snapshot::Snapshot, dir: &std::path::Path) -> Result<String, RunError> {
    let names: Vec<&str> = snapshot.profiles().keys().map(String::as_str).collect();
    match names.as_slice() {
        [only] => Ok((*only).to_string()),
        [] => {
            Err(RunError::Config(format!("--profile: {} has no McpProfile; add one or pass --profile", dir.display())))
        }
        many => Err(RunError::Config(format!(
            "--profile: the registry has several profiles ({}); pick one",
            many.join(", ")
        ))),
    }
}

/// Runs the in-pod agent until `cancel`, or until the registry watch dies.
pub async fn run_in_pod(config: PodConfig, cancel: CancellationToken) -> Result<(), RunError> {
    let PodConfig {
        profile,
        namespace,
        pod_name,
        socket_dir,
        sidecar_servers,
        secret_refs,
        granted_destinations,
        kubeconfig,
        agent,
    } = config;
    crate::install_crypto_provider();
    let Some(profile) = profile.filter(|p| !p.is_empty()) else {
        return Err(RunError::Config(format!(
            "--profile (env {}) is required: the McpProfile this pod uses (the webhook sets it from the pod's {} \
             annotation)",
            keys::ENV_PROFILE,
            keys::ANNOTATION_PROFILE
        )));
    };
    if agent.api_key.is_none() {
        // A pod injected by an operator older than the key, or an agent run by hand.
        tracing::warn!(
            "{} is not set: chat completions, /mcp and gRPC take any caller in the pod, its MCP server sidecars \
             included; recreate the pod to get a key from the webhook",
            keys::ENV_API_KEY
        );
    }
    let listeners = Listeners::bind(&agent).await?.answer_while_starting(&agent)?;
    let client_config = client_config(kubeconfig).await.map_err(RunError::Config)?;
    let namespace = match namespace.filter(|n| !n.is_empty()) {
        Some(namespace) => namespace,
        None => {
            tracing::info!(namespace = %client_config.default_namespace, "{} is not set; using the client configuration's namespace", keys::ENV_POD_NAMESPACE);
            client_config.default_namespace.clone()
        }
    };
    let client = crate::kube_client::client(client_config)
        .map_err(|e| RunError::Config(format!("cannot build a Kubernetes client from the configuration: {e}")))?;
    // The same client (a clone shares its connections) asks the kubernetes approver's McpApprovals.
    let approvals_client = client.clone();
    let mut watch = KubeSource::watch(client, &namespace, &profile, &cancel).map_err(|e| match e {
        KubeError::InvalidNamespace { .. } => {
            RunError::Config(format!("--namespace (env {}): {e}", keys::ENV_POD_NAMESPACE))
        }
        KubeError::InvalidProfile { .. } => RunError::Config(format!("--profile (env {}): {e}", keys::ENV_PROFILE)),
        e => RunError::Registry(e),
    })?;
    tracing::info!(%namespace, %profile, "waiting for the first list of McpServers and the McpProfile");
    tokio::select! {
        () = cancel.cancelled() => return Ok(()),
        ready = watch.ready() => ready?,
    }
    let registry = watch.view();
    let critical: CriticalTask = Box::pin(async move {
        match watch.finished().await {
            Ok(()) => "the registry watch stopped".to_string(),
            Err(e) => e.to_string(),
        }
    });
    // An empty value (a pod whose profile had no stdio servers) is an empty list, not unset.
    let set = |ids: Vec<String>| -> BTreeSet<String> {
        ids.into_iter().map(|id| id.trim().to_string()).filter(|id| !id.is_empty()).collect()
    };
    let (sidecars, peer_uids) = match sidecar_servers.map(set) {
        Some(entries) => {
            let (sidecars, peer_uids) = sidecar_entries(entries).map_err(RunError::Config)?;
            (Some(sidecars), peer_uids)
        }
        None => (None, BTreeMap::new()),
    };
    let destinations = granted_destinations.map(destination_entries).transpose().map_err(RunError::Config)?;
    let mode = Mode::Sidecar { socket_dir, sidecars, secret_refs: secret_refs.map(set), peer_uids, destinations };
    let origin =
        crate::approval::webhook::Origin { namespace: Some(namespace), pod: pod_name.filter(|p| !p.is_empty()) };
    run(agent, profile, registry, mode, Some(critical), cancel, (origin, Some(approvals_client)), listeners).await
}

/// `SPEAR_GRANTED_DESTINATIONS` entries, `<server>=<hash>` (empty ones skipped).
fn destination_entries(entries: Vec<String>) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let Some((server, hash)) = entry.split_once('=').filter(|(s, h)| !s.is_empty() && !h.is_empty()) else {
            return Err(format!(
                "--granted-destinations (env {}): {entry:?} is not <server>=<hash>: the webhook sets this; unset it to \
                 skip the check",
                keys::ENV_GRANTED_DESTINATIONS
            ));
        };
        map.insert(server.to_string(), hash.to_string());
    }
    Ok(map)
}

/// `SPEAR_SIDECAR_SERVERS` entries, `<server>` or `<server>=<uid>`: the servers with a sidecar,
/// and the uid each sidecar's bridge runs as.
fn sidecar_entries(entries: BTreeSet<String>) -> Result<(BTreeSet<String>, BTreeMap<String, u32>), String> {
    let mut sidecars = BTreeSet::new();
    let mut uids = BTreeMap::new();
    for entry in entries {
        match entry.split_once('=') {
            None => {
                sidecars.insert(entry);
            }
            Some((server, uid)) => {
                let uid = uid.parse().map_err(|_| {
                    format!(
                        "--sidecar-servers: {entry:?} is not <server>=<uid> with a numeric uid (the webhook writes it)"
                    )
                })?;
                uids.insert(server.to_string(), uid);
                sidecars.insert(server.to_string());
            }
        }
    }
    Ok((sidecars, uids))
}

/// Serves `profile` over `registry` on the three doors until `cancel`, or until `critical` ends
/// first (then everything shuts down in order and the reason is the error).
#[allow(clippy::too_many_arguments)] // the two modes' parts, passed once
async fn run(
    config: AgentConfig,
    profile: String,
    registry: Arc<dyn RegistryView>,
    mode: Mode,
    critical: Option<CriticalTask>,
    cancel: CancellationToken,
    (origin, kube): (crate::approval::webhook::Origin, Option<kube::Client>),
    listeners: Listeners,
) -> Result<(), RunError> {
    let audit = open_audit(&config)?;
    let mut metrics = Registry::default();
    let pool_metrics = PoolMetrics::register(&mut metrics);
    let registry_metrics = RegistryMetrics::register(&mut metrics);
    audit.register(&mut metrics);
    crate::telemetry::register_log_drops(&mut metrics);
    let default_egress = match mode {
        Mode::Local => AddressDenyList::AGENT_LOCAL,
        Mode::Sidecar { .. } => AddressDenyList::AGENT_POD,
    };
    let egress = match &config.egress {
        Some(egress) => egress.clone(),
        None => default_egress.parse().map_err(|e| RunError::Config(format!("--egress-deny-cidrs: {e}")))?,
    };
    // The Secrets of persons' grants are read and renewed through the same client, one pod at a
    // time: the claim names the pod.
    let grant_secrets = match (&kube, &origin.namespace) {
        (Some(client), Some(namespace)) => {
            let holder = origin.pod.clone().unwrap_or_else(|| format!("spearlet-{}", std::process::id()));
            Some(GrantSecrets::new(client.clone(), namespace, &holder))
        }
        _ => None,
    };
    let pool = Pool::new(PoolOptions {
        mode,
        egress: egress.clone(),
        tools_ttl: config.pool.tools_ttl,
        max_concurrent_calls: config.pool.max_concurrent_calls,
        max_children: config.pool.max_children,
        idle_timeout: config.pool.server_idle,
        check_arguments: config.pool.check_arguments,
        metrics: pool_metrics.clone(),
        hidden_env: config.upstream.api_key_env.iter().cloned().collect(),
        ..PoolOptions::default()
    });
    if let Some(grant_secrets) = grant_secrets {
        pool.use_grant_secrets(grant_secrets);
    }
    let mut options = AgentOptions::new(profile);
    options.audit = audit;
    options.registry_metrics = registry_metrics;
    options.pool_metrics = pool_metrics;
    options.origin = origin;
    options.kube = kube.map(super::approvers::KubeClient);
    options.egress = egress;
    // The agent's own secrets, given to no server: its API key and the upstream model's key.
    let secrets = pool.secrets().clone();
    if let Some(key) = &config.api_key {
        secrets.hold("the agent's API key", key.expose(), None);
    }
    let upstream_key = config.upstream.api_key.clone().or_else(|| std::env::var(keys::ENV_UPSTREAM_API_KEY).ok());
    if let Some(key) = upstream_key {
        secrets.hold("the upstream API key", &key, None);
    }
    crate::telemetry::redact_logs_with(secrets);
    let agent = Agent::new(options, registry, pool);
    metrics.register_collector(Box::new(super::server_state::ServerStateCollector::new(agent.clone())));

    let serving = serve(&config, agent, listeners, Arc::new(metrics), cancel.clone());
    let Some(critical) = critical else { return Ok(serving.await?) };
    tokio::pin!(serving);
    tokio::select! {
        result = &mut serving => Ok(result?),
        reason = critical => {
            // On shutdown the critical task ends with everything else; only an early end fails.
            if cancel.is_cancelled() {
                return Ok(serving.await?);
            }
            tracing::error!(%reason, "a critical task ended; shutting down");
            cancel.cancel();
            let _ = serving.await;
            Err(RunError::Critical(reason))
        }
    }
}

/// The audit sink `--audit-log` names.
pub(crate) fn open_audit(config: &AgentConfig) -> Result<AuditSink, RunError> {
    Ok(match &config.audit {
        AuditTarget::Stderr => AuditSink::stderr(config.audit_arguments),
        AuditTarget::Off => AuditSink::disabled(),
        // 0600: audit lines name the workload's calls (and, with --audit-arguments, their arguments).
        AuditTarget::File(path) => match std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path) {
            Ok(file) => AuditSink::new(Box::new(file), config.audit_arguments),
            Err(e) => return Err(RunError::Config(format!("--audit-log {}: {e}", path.display()))),
        },
    })
}

/// The client configuration: the kubeconfig file(s) if given, else the pod's service account,
/// else the local kubeconfig (`kube::Config::infer`). Errors name the flag or say what to set.
pub(crate) async fn client_config(kubeconfig: Option<OsString>) -> Result<kube::Config, String> {
    let flag = format!("--kubeconfig (env {})", keys::ENV_KUBECONFIG);
    let Some(paths) = kubeconfig.filter(|p| !p.is_empty()) else {
        return match kube::Config::incluster() {
            Ok(config) => Ok(config),
            Err(in_cluster) => kube::Config::infer().await.map_err(|e| {
                format!(
                    "no Kubernetes API configuration: not in a pod ({in_cluster}) and no usable kubeconfig ({e}); pass \
                     --kubeconfig or set {}",
                    keys::ENV_KUBECONFIG
                )
            }),
        };
    };
    let mut merged: Option<Kubeconfig> = None;
    // KUBECONFIG is a list, as kubectl reads it: the first file to set a value wins.
    for path in std::env::split_paths(&paths).filter(|p| !p.as_os_str().is_empty()) {
        let file = Kubeconfig::read_from(&path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
        merged = Some(match merged {
            None => file,
            Some(earlier) => earlier.merge(file).map_err(|e| format!("{flag} {}: {e}", path.display()))?,
        });
    }
    let merged = merged.ok_or_else(|| format!("{flag} names no file"))?;
    kube::Config::from_custom_kubeconfig(merged, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("{flag}: {e}"))
}
