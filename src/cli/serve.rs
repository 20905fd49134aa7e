//! `spearlet serve`: flags → config → [`crate::agent::serve::serve`]. Thin.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::{EXIT_USAGE, shutdown_signal, usage_error};
use crate::agent::serve::{ExtraDoor, Listeners, ServeConfig, serve};
use crate::agent::{Agent, AgentOptions, AuditSink};
use crate::chat::{self, ChatService, UpstreamOverride, UpstreamTimeouts};
use crate::mcp::{Pool, PoolOptions};
use crate::registry::dir::{DirOptions, DirSource};
use crate::registry::view::RegistryView;
use crate::telemetry::{PoolMetrics, RegistryMetrics};

/// Where audit lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditTarget {
    /// stderr, beside the logs.
    Stderr,
    /// No audit.
    Off,
    /// Appended to a file.
    File(PathBuf),
}

impl std::str::FromStr for AuditTarget {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "stderr" | "-" => AuditTarget::Stderr,
            "off" | "none" => AuditTarget::Off,
            path => AuditTarget::File(PathBuf::from(path)),
        })
    }
}

/// Flags of `spearlet serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Directory of McpServer/McpProfile manifests (local mode; re-read on change).
    #[arg(long, env = "SPEAR_REGISTRY_DIR", value_name = "DIR")]
    pub registry_dir: PathBuf,
    /// The McpProfile to serve. May be omitted when the registry has exactly one profile.
    #[arg(long, env = "SPEAR_PROFILE")]
    pub profile: Option<String>,
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
    /// OpenAI-compatible upstream base URL (overrides the profile's chat.upstream.url), for
    /// example https://api.openai.com/v1.
    #[arg(long, env = "SPEAR_UPSTREAM_URL", value_name = "URL")]
    pub upstream_url: Option<String>,
    /// Name of the env var holding the upstream API key (its value is never logged).
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
    /// Runtime threads serving the doors. 1 (the default) runs everything on one thread: a pod's
    /// agent is I/O-bound and usually has a fraction of a core, and one thread means no cross-thread
    /// wake-ups and less memory. More threads help only with several dedicated cores.
    #[arg(long, env = "SPEAR_WORKER_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub worker_threads: u16,
    /// `Host` header values /mcp accepts (DNS-rebinding protection), repeatable.
    #[arg(long = "allowed-host", env = "SPEAR_ALLOWED_HOSTS", value_delimiter = ',', default_values_t = ["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])]
    pub allowed_hosts: Vec<String>,
}

impl ServeArgs {
    /// Runs the agent until SIGINT/SIGTERM. Exit status: 0 after a clean shutdown, 1 when a
    /// server fails, 2 on a usage error (bad directory, taken port, unknown profile).
    pub fn run(self) -> ExitCode {
        let runtime = if self.worker_threads == 1 {
            tokio::runtime::Builder::new_current_thread().enable_all().build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(usize::from(self.worker_threads))
                .enable_all()
                .build()
        };
        let runtime = match runtime {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: starting the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        runtime.block_on(self.run_async())
    }

    async fn run_async(self) -> ExitCode {
        crate::install_crypto_provider();
        let cancel = CancellationToken::new();
        let watch = match DirSource::watch_until(&self.registry_dir, DirOptions::default(), &cancel) {
            Ok(watch) => Arc::new(watch),
            Err(e) => return usage_error(format!("--registry-dir: {e}")),
        };
        let profile = match self.profile.clone() {
            Some(profile) => profile,
            None => {
                let snapshot = watch.snapshot();
                let names: Vec<&String> = snapshot.profiles().keys().collect();
                match names.as_slice() {
                    [only] => (*only).clone(),
                    [] => {
                        return usage_error(format!(
                            "--profile: {} has no McpProfile; add one or pass --profile",
                            self.registry_dir.display()
                        ));
                    }
                    many => {
                        let list: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
                        return usage_error(format!(
                            "--profile: the registry has several profiles ({}); pick one",
                            list.join(", ")
                        ));
                    }
                }
            }
        };
        let audit = match &self.audit_log {
            AuditTarget::Stderr => AuditSink::stderr(self.audit_arguments),
            AuditTarget::Off => AuditSink::disabled(),
            AuditTarget::File(path) => match std::fs::OpenOptions::new().create(true).append(true).open(path) {
                Ok(file) => AuditSink::new(Box::new(file), self.audit_arguments),
                Err(e) => return usage_error(format!("--audit-log {}: {e}", path.display())),
            },
        };
        let config = ServeConfig {
            http_addr: self.http_addr,
            grpc_addr: self.grpc_addr,
            admin_addr: self.admin_addr,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_seconds),
            allowed_hosts: self.allowed_hosts.clone(),
        };
        let listeners = match Listeners::bind(&config).await {
            Ok(listeners) => listeners,
            Err(e) => return usage_error(e),
        };

        let mut metrics = Registry::default();
        let pool_metrics = PoolMetrics::register(&mut metrics);
        let registry_metrics = RegistryMetrics::register(&mut metrics);
        // The agent keeps its sessions: a pod's servers stay connected while the pod lives.
        let pool =
            Pool::new(PoolOptions { idle_timeout: None, metrics: pool_metrics.clone(), ..PoolOptions::default() });
        let mut options = AgentOptions::new(profile);
        options.audit = audit;
        options.registry_metrics = registry_metrics;
        options.pool_metrics = pool_metrics;
        let agent = Agent::new(options, watch.clone(), pool);

        if let Some(var) = self.upstream_api_key_env.as_deref()
            && std::env::var(var).map_or(true, |v| v.is_empty())
        {
            return usage_error(format!(
                "--upstream-api-key-env: the env var {var} is not set (export it, or drop the flag)"
            ));
        }
        let overrides = UpstreamOverride::from_flags(self.upstream_url.clone(), self.upstream_api_key_env.as_deref());
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
        let signal = cancel.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            signal.cancel();
        });
        match serve(&config, agent, listeners, Arc::new(metrics), chat, grpc, cancel).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e @ crate::agent::serve::ServeError::Bind { .. }) => {
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
