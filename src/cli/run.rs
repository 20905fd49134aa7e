//! `spearlet run`: the in-pod agent. The registry is the Kubernetes API (the pod's McpProfile and
//! its namespace's McpServers, through [`KubeSource`]); stdio servers are reached through the
//! bridge sockets of their sidecars; the doors are the same as `spearlet serve`'s.
//!
//! ```text
//! --profile/SPEAR_PROFILE, --namespace/POD_NAMESPACE   (set by the injecting webhook)
//! --kubeconfig/KUBECONFIG, else in-cluster, else ~/.kube/config ──▶ kube::Client
//!   ──▶ KubeSource::watch ──▶ wait for the first complete list (SIGTERM still stops the wait)
//!   ──▶ bind 4040 / 4041 / 4042 ──▶ Agent (Pool in Mode::Sidecar{socket_dir}) ──▶ doors
//!   ──▶ until SIGTERM, or until the registry watch task dies (exit 1: never serve a registry
//!       nobody updates any more)
//! ```
//!
//! The ports open only after the first list: until then the agent could only answer with an
//! empty registry, and "not listening" is what a startup probe should see. The wait has no
//! timeout of its own; while the API cannot be listed, the log says why (for example a missing
//! RoleBinding) and the pod's probes decide.
//!
//! The door flags ([`AgentArgs`]) and their wiring are the same as `spearlet serve`'s and are kept
//! here as one flattenable group so that `serve` can share them.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::serve::AuditTarget;
use super::{EXIT_USAGE, shutdown_signal, usage_error};
use crate::agent::serve::{ExtraDoor, Listeners, ServeConfig, ServeError, serve};
use crate::agent::{Agent, AgentOptions, AuditSink};
use crate::chat::{self, ChatService, UpstreamOverride, UpstreamTimeouts};
use crate::mcp::config::Mode;
use crate::mcp::{Pool, PoolOptions};
use crate::registry::kube::{Error as KubeError, KubeSource};
use crate::registry::view::RegistryView;
use crate::telemetry::{PoolMetrics, RegistryMetrics};

/// Flags of `spearlet run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The McpProfile this pod uses (the webhook sets it from the pod's `mcp.spear.dev/profile`
    /// annotation).
    #[arg(long, env = "SPEAR_PROFILE")]
    pub profile: Option<String>,
    /// The pod's namespace: the profile and the McpServers are read there (the webhook sets it
    /// from the downward API). Defaults to the service account's namespace in a pod, or the
    /// kubeconfig context's.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Directory of the stdio servers' bridge sockets (`<dir>/<server>.sock`), shared with their
    /// sidecars.
    #[arg(long, env = "SPEAR_SOCKET_DIR", value_name = "DIR", default_value = "/spear/run")]
    pub socket_dir: PathBuf,
    /// The stdio servers this pod has sidecars for, comma-separated (the webhook sets it). A
    /// stdio server of the profile outside the list joined it after the pod started: the agent
    /// reports it (log and `mcp_server_restart_required`) and its calls say to restart the pod.
    /// Unset: every stdio server is expected to have a sidecar.
    #[arg(long, env = "SPEAR_SIDECAR_SERVERS", value_name = "IDS", value_delimiter = ',')]
    pub sidecar_servers: Option<Vec<String>>,
    /// kubeconfig file(s), `:`-separated, for running outside a cluster. Without it the pod's
    /// service account is used, falling back to `~/.kube/config`.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<OsString>,
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// The agent's doors and what they need, shared by every mode that serves them.
#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// Chat completions and /mcp (loopback: only the pod itself may use its tools).
    #[arg(long, env = "SPEAR_HTTP_ADDR", default_value = "127.0.0.1:4040")]
    pub http_addr: SocketAddr,
    /// gRPC (McpSessions, McpRegistry).
    #[arg(long, env = "SPEAR_GRPC_ADDR", default_value = "127.0.0.1:4041")]
    pub grpc_addr: SocketAddr,
    /// /healthz, /readyz, /metrics (all interfaces, for probes and scrapers); /debug/effective
    /// answers loopback callers only.
    #[arg(long, env = "SPEAR_ADMIN_ADDR", default_value = "0.0.0.0:4042")]
    pub admin_addr: SocketAddr,
    /// OpenAI-compatible upstream base URL (overrides the profile's chat.upstream.url).
    #[arg(long, env = "SPEAR_UPSTREAM_URL", value_name = "URL")]
    pub upstream_url: Option<String>,
    /// Name of the env var holding the upstream API key (its value is never logged); by default
    /// SPEAR_UPSTREAM_API_KEY, which the webhook sets from the profile's apiKeySecretRef.
    #[arg(long, env = "SPEAR_UPSTREAM_API_KEY_ENV", value_name = "VAR")]
    pub upstream_api_key_env: Option<String>,
    /// Audit log: `stderr`, `off`, or a file path (appended).
    #[arg(long, env = "SPEAR_AUDIT_LOG", default_value = "stderr")]
    pub audit_log: AuditTarget,
    /// Include tool-call arguments in audit lines (redacted by default: they may hold secrets).
    #[arg(long, env = "SPEAR_AUDIT_ARGUMENTS")]
    pub audit_arguments: bool,
    /// Seconds in-flight requests may take to finish after SIGTERM.
    #[arg(long, env = "SPEAR_SHUTDOWN_GRACE_SECONDS", default_value_t = 10)]
    pub shutdown_grace_seconds: u64,
    /// Runtime threads. 1 (the default) runs everything on one thread: a pod's agent is I/O-bound
    /// and usually has a fraction of a core.
    #[arg(long, env = "SPEAR_WORKER_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub worker_threads: u16,
    /// `Host` header values /mcp accepts (DNS-rebinding protection), repeatable.
    #[arg(long = "allowed-host", env = "SPEAR_ALLOWED_HOSTS", value_delimiter = ',', default_values_t = ["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])]
    pub allowed_hosts: Vec<String>,
}

/// A task whose end must stop the agent (the registry watch); resolves with the reason.
pub type CriticalTask = Pin<Box<dyn Future<Output = String> + Send>>;

impl RunArgs {
    /// Runs the agent until SIGINT/SIGTERM. Exit status: 0 after a clean shutdown, 1 when a
    /// server or the registry watch fails, 2 on a usage error (missing profile, bad kubeconfig,
    /// taken port).
    pub fn run(self) -> ExitCode {
        let runtime = match self.agent.runtime() {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("error: starting the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        runtime.block_on(async {
            let cancel = CancellationToken::new();
            let signal = cancel.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                signal.cancel();
            });
            self.run_until(cancel).await
        })
    }

    /// Runs the agent until `cancel` (no signal handling: [`RunArgs::run`] adds it; tests call
    /// this in-process).
    pub async fn run_until(self, cancel: CancellationToken) -> ExitCode {
        let RunArgs { profile, namespace, socket_dir, sidecar_servers, kubeconfig, agent } = self;
        crate::install_crypto_provider();
        let Some(profile) = profile.filter(|p| !p.is_empty()) else {
            return usage_error(
                "--profile (env SPEAR_PROFILE) is required: the McpProfile this pod uses (the webhook sets it from \
                 the pod's mcp.spear.dev/profile annotation)",
            );
        };
        let config = match kube_config(kubeconfig.as_deref()).await {
            Ok(config) => config,
            Err(e) => return usage_error(e),
        };
        let namespace = match namespace.filter(|n| !n.is_empty()) {
            Some(namespace) => namespace,
            None => {
                tracing::info!(namespace = %config.default_namespace, "POD_NAMESPACE is not set; using the client configuration's namespace");
                config.default_namespace.clone()
            }
        };
        let client = match kube::Client::try_from(config) {
            Ok(client) => client,
            Err(e) => return usage_error(format!("cannot build a Kubernetes client from the configuration: {e}")),
        };
        let mut watch = match KubeSource::watch(client, &namespace, &profile, &cancel) {
            Ok(watch) => watch,
            Err(e @ KubeError::InvalidNamespace { .. }) => {
                return usage_error(format!("--namespace (env POD_NAMESPACE): {e}"));
            }
            Err(e @ KubeError::InvalidProfile { .. }) => {
                return usage_error(format!("--profile (env SPEAR_PROFILE): {e}"));
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(%namespace, %profile, "waiting for the first list of McpServers and the McpProfile");
        tokio::select! {
            () = cancel.cancelled() => return ExitCode::SUCCESS,
            ready = watch.ready() => {
                if let Err(e) = ready {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        let registry = watch.view();
        let critical: CriticalTask = Box::pin(async move {
            match watch.finished().await {
                Ok(()) => "the registry watch stopped".to_string(),
                Err(e) => e.to_string(),
            }
        });
        // An empty value (a pod whose profile had no stdio servers) is an empty list, not unset.
        let sidecars = sidecar_servers
            .map(|ids| ids.into_iter().map(|id| id.trim().to_string()).filter(|id| !id.is_empty()).collect());
        agent.serve(profile, registry, Mode::Sidecar { socket_dir, sidecars }, cancel, Some(critical)).await
    }
}

/// The client configuration: the `--kubeconfig` file(s) if given, else the pod's service account,
/// else the local kubeconfig (`kube::Config::infer`). Errors name the flag or say what to set.
async fn kube_config(kubeconfig: Option<&OsStr>) -> Result<kube::Config, String> {
    let Some(paths) = kubeconfig.filter(|p| !p.is_empty()) else {
        return match kube::Config::incluster() {
            Ok(config) => Ok(config),
            Err(in_cluster) => kube::Config::infer().await.map_err(|e| {
                format!(
                    "no Kubernetes API configuration: not in a pod ({in_cluster}) and no usable kubeconfig ({e}); pass \
                     --kubeconfig or set KUBECONFIG"
                )
            }),
        };
    };
    let mut merged: Option<Kubeconfig> = None;
    // KUBECONFIG is a list, as kubectl reads it: the first file to set a value wins.
    for path in std::env::split_paths(paths).filter(|p| !p.as_os_str().is_empty()) {
        let file = Kubeconfig::read_from(&path)
            .map_err(|e| format!("--kubeconfig (env KUBECONFIG) {}: {e}", path.display()))?;
        merged = Some(match merged {
            None => file,
            Some(earlier) => {
                earlier.merge(file).map_err(|e| format!("--kubeconfig (env KUBECONFIG) {}: {e}", path.display()))?
            }
        });
    }
    let merged = merged.ok_or_else(|| "--kubeconfig (env KUBECONFIG) names no file".to_string())?;
    kube::Config::from_custom_kubeconfig(merged, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("--kubeconfig (env KUBECONFIG): {e}"))
}

// === impl AgentArgs ===

impl AgentArgs {
    /// The Tokio runtime `--worker-threads` asks for.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        if self.worker_threads == 1 {
            tokio::runtime::Builder::new_current_thread().enable_all().build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(usize::from(self.worker_threads))
                .enable_all()
                .build()
        }
    }

    /// Serves `profile` over `registry` on the three doors until `cancel`, or until `critical`
    /// ends first (then everything shuts down in order and the exit status is 1). Exit status 2
    /// for a usage error (an audit file or a port that cannot be used, an unset key variable).
    pub async fn serve(
        self,
        profile: String,
        registry: Arc<dyn RegistryView>,
        mode: Mode,
        cancel: CancellationToken,
        critical: Option<CriticalTask>,
    ) -> ExitCode {
        let AgentArgs {
            http_addr,
            grpc_addr,
            admin_addr,
            upstream_url,
            upstream_api_key_env,
            audit_log,
            audit_arguments,
            shutdown_grace_seconds,
            worker_threads: _,
            allowed_hosts,
        } = self;
        let audit = match &audit_log {
            AuditTarget::Stderr => AuditSink::stderr(audit_arguments),
            AuditTarget::Off => AuditSink::disabled(),
            AuditTarget::File(path) => match std::fs::OpenOptions::new().create(true).append(true).open(path) {
                Ok(file) => AuditSink::new(Box::new(file), audit_arguments),
                Err(e) => return usage_error(format!("--audit-log {}: {e}", path.display())),
            },
        };
        if let Some(var) = upstream_api_key_env.as_deref()
            && std::env::var(var).map_or(true, |v| v.is_empty())
        {
            return usage_error(format!(
                "--upstream-api-key-env: the env var {var} is not set (export it, or drop the flag)"
            ));
        }
        let config = ServeConfig {
            http_addr,
            grpc_addr,
            admin_addr,
            shutdown_grace: Duration::from_secs(shutdown_grace_seconds),
            allowed_hosts,
        };
        let listeners = match Listeners::bind(&config).await {
            Ok(listeners) => listeners,
            Err(e) => return usage_error(e),
        };

        let mut metrics = Registry::default();
        let pool_metrics = PoolMetrics::register(&mut metrics);
        let registry_metrics = RegistryMetrics::register(&mut metrics);
        // The agent keeps its sessions: a pod's servers stay connected while the pod lives.
        let pool = Pool::new(PoolOptions {
            mode,
            idle_timeout: None,
            metrics: pool_metrics.clone(),
            ..PoolOptions::default()
        });
        let mut options = AgentOptions::new(profile);
        options.audit = audit;
        options.registry_metrics = registry_metrics;
        options.pool_metrics = pool_metrics;
        let agent = Agent::new(options, registry, pool);

        let overrides = UpstreamOverride::from_flags(upstream_url, upstream_api_key_env.as_deref());
        let chat = match ChatService::new(agent.clone(), overrides, UpstreamTimeouts::default()) {
            Ok(service) => chat::router(service),
            Err(e) => return usage_error(format!("chat upstream client: {e}")),
        };
        let grpc_agent = agent.clone();
        let grpc: ExtraDoor = Box::new(move |listener, stop| {
            Box::pin(
                async move { crate::agent::grpc::serve(grpc_agent, listener, stop).await.map_err(|e| e.to_string()) },
            )
        });

        let serving = serve(&config, agent, listeners, Arc::new(metrics), chat, grpc, cancel.clone());
        let result = match critical {
            None => serving.await,
            Some(critical) => {
                tokio::pin!(serving);
                tokio::select! {
                    result = &mut serving => result,
                    reason = critical => {
                        // On shutdown the critical task ends with everything else; only an early
                        // end is a failure.
                        if !cancel.is_cancelled() {
                            tracing::error!(%reason, "a critical task ended; shutting down");
                            eprintln!("error: {reason}");
                            cancel.cancel();
                            let _ = serving.await;
                            return ExitCode::FAILURE;
                        }
                        serving.await
                    }
                }
            }
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e @ ServeError::Bind { .. }) => {
                eprintln!("error: {e}");
                ExitCode::from(EXIT_USAGE)
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    }
}
