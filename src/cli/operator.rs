//! `spear-operator` subcommands: `crds` prints the CRDs; `run` runs the controllers (on the
//! leader only), the admin server (`/healthz`, `/readyz`, `/metrics`) and, once wired, the
//! webhook (on every replica).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgAction, Parser, Subcommand, ValueEnum};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::api::crd;
use crate::operator::controller::{self, ControllerConfig, ControllerMetrics, Scope};
use crate::operator::leader::{self, LeaderConfig};
use crate::operator::probe::ProbeConfig;
use crate::operator::rbac;
use crate::operator::webhook::NativeSidecars;
use crate::telemetry::LogArgs;

/// Time the controllers get to finish running reconciles and release the Lease after SIGTERM
/// (Kubernetes' default termination grace period is 30 s).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// The spear-mcp control plane: validates McpServer/McpProfile resources and injects agents.
#[derive(Parser, Debug)]
#[command(name = "spear-operator", version, about)]
pub struct Args {
    #[command(flatten)]
    log: LogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the CustomResourceDefinitions generated from the Rust types (for `kubectl apply -f -`).
    Crds {
        /// Write one file per CRD into this directory instead of printing a YAML stream.
        #[arg(long, env = "SPEAR_CRDS_OUTPUT_DIR")]
        output_dir: Option<PathBuf>,
    },
    /// Run the operator: status controllers (leader only), admin server, webhook.
    Run(Box<RunArgs>),
}

/// Flags of `spear-operator run`.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The operator's own namespace (its leader Lease and webhook Secret live there). Unset:
    /// `POD_NAMESPACE` (the chart sets it from the downward API), else the client's namespace.
    #[arg(long, env = "SPEAR_NAMESPACE")]
    namespace: Option<String>,

    /// Watch McpServers, McpProfiles and namespaces in this namespace only (a namespaced
    /// install); unset watches the whole cluster.
    #[arg(long, env = "SPEAR_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,

    /// Admin server address: `/healthz`, `/readyz`, `/metrics`.
    #[arg(long, env = "SPEAR_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,

    /// Elect a leader with a Lease so that several replicas are safe (only the leader writes).
    #[arg(long, env = "SPEAR_LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    leader_election: bool,

    /// Name of the leader-election Lease in the operator's namespace.
    #[arg(long, env = "SPEAR_LEASE_NAME", default_value = rbac::OPERATOR_LEASE)]
    lease_name: String,

    /// Seconds between probes of a Streamable HTTP McpServer that answers (failures are
    /// retried sooner, backing off up to this).
    #[arg(long, env = "SPEAR_PROBE_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    probe_interval_seconds: u64,

    #[command(flatten)]
    webhook: WebhookArgs,
}

/// Where the webhook's serving certificate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CertMode {
    /// The operator's own CA and certificate, kept in a Secret and rotated; it keeps the
    /// webhook configuration's `caBundle` current.
    SelfSigned,
    /// `tls.crt` and `tls.key` from `--cert-dir` (for example a cert-manager Secret volume).
    Files,
}

/// Flags of the mutating webhook (served on every replica).
#[derive(clap::Args, Clone, Debug)]
pub struct WebhookArgs {
    /// Webhook HTTPS address.
    #[arg(long, env = "SPEAR_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub webhook_addr: SocketAddr,

    /// The MutatingWebhookConfiguration whose `caBundle` the operator keeps (self-signed mode).
    #[arg(long, env = "SPEAR_WEBHOOK_CONFIG_NAME", default_value = rbac::WEBHOOK_CONFIGURATION)]
    pub webhook_config_name: String,

    /// The webhook's Service; the certificate is issued for `<service>.<namespace>.svc`.
    #[arg(long, env = "SPEAR_WEBHOOK_SERVICE_NAME", default_value = "spear-operator-webhook")]
    pub webhook_service_name: String,

    /// Where the serving certificate comes from.
    #[arg(long, env = "SPEAR_CERT_MODE", value_enum, default_value_t = CertMode::SelfSigned)]
    pub cert_mode: CertMode,

    /// Directory holding `tls.crt` and `tls.key` (required with `--cert-mode files`).
    #[arg(long, env = "SPEAR_CERT_DIR", required_if_eq("cert_mode", "files"))]
    pub cert_dir: Option<PathBuf>,

    /// Image of the injected agent container.
    #[arg(long, env = "SPEAR_AGENT_IMAGE")]
    pub agent_image: Option<String>,

    /// Image of the init container that copies the static spearlet into the pod.
    #[arg(long, env = "SPEAR_SPEARLET_IMAGE")]
    pub spearlet_image: Option<String>,

    /// Inject stdio sidecars as native sidecars: `auto` asks the API server's version.
    #[arg(long, env = "SPEAR_NATIVE_SIDECARS", value_enum, default_value_t = NativeSidecars::Auto)]
    pub native_sidecars: NativeSidecars,
}

impl Args {
    /// Runs the selected subcommand.
    pub fn run(self) -> ExitCode {
        let Self { log, command } = self;
        if let Err(e) = log.init() {
            return super::usage_error(e);
        }
        match command {
            Command::Crds { output_dir } => crds(output_dir),
            Command::Run(args) => run(*args),
        }
    }
}

fn run(args: RunArgs) -> ExitCode {
    crate::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "spear-operator stopped");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        namespace,
        watch_namespace,
        metrics_addr,
        leader_election,
        lease_name,
        probe_interval_seconds,
        webhook,
    } = args;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster service account, or KUBECONFIG)")?;
    let namespace = namespace
        .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|ns| !ns.is_empty()))
        .unwrap_or_else(|| client.default_namespace().to_string());

    let (Some(agent_image), Some(spearlet_image)) = (webhook.agent_image.clone(), webhook.spearlet_image.clone())
    else {
        anyhow::bail!(
            "--agent-image and --spearlet-image (env SPEAR_AGENT_IMAGE, SPEAR_SPEARLET_IMAGE) are required: the \
             webhook injects them into pods (the Helm chart sets both)"
        );
    };

    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(registry.sub_registry_with_prefix("spear_operator"));
    let webhook_metrics =
        crate::operator::webhook::WebhookMetrics::register(registry.sub_registry_with_prefix("spear_operator_webhook"));
    let identity = leader::default_identity();
    let config = ControllerConfig {
        scope: watch_namespace.map_or(Scope::Cluster, Scope::Namespace),
        probe: ProbeConfig { interval: Duration::from_secs(probe_interval_seconds), ..ProbeConfig::default() },
        leader: leader_election.then(|| LeaderConfig::new(lease_name, namespace.as_str(), identity.as_str())),
        instance: identity,
        concurrency: controller::DEFAULT_CONCURRENCY,
        metrics: metrics.clone(),
    };
    tracing::info!(%namespace, scope = ?config.scope, leader_election, "spear-operator starting");

    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("binding the admin server on {metrics_addr} (is --metrics-addr free?)"))?;
    let admin_stop = shutdown.clone();
    let mut admin = tokio::spawn(async move {
        axum::serve(listener, controller::admin_router(metrics, Arc::new(registry)))
            .with_graceful_shutdown(async move { admin_stop.cancelled().await })
            .await
    });

    // The webhook serves on every replica (not only the leader): admission must not wait for
    // an election.
    let cert = match webhook.cert_mode {
        CertMode::SelfSigned => {
            let mut self_signed =
                crate::operator::certs::SelfSigned::new(namespace.as_str(), webhook.webhook_service_name.as_str());
            self_signed.webhook_config_name = Some(webhook.webhook_config_name.clone());
            crate::operator::certs::CertSource::SelfSigned(self_signed)
        }
        CertMode::Files => {
            let dir = webhook.cert_dir.clone().context("--cert-dir is required with --cert-mode files")?;
            crate::operator::certs::CertSource::Files(crate::operator::certs::Files::new(dir))
        }
    };
    let mut webhook_config = crate::operator::webhook::WebhookConfig::new(
        webhook.webhook_addr,
        crate::operator::inject::InjectConfig::new(agent_image, spearlet_image),
        webhook.native_sidecars,
        cert,
    );
    webhook_config.metrics = webhook_metrics;
    let mut webhook_task =
        tokio::spawn(crate::operator::webhook::serve(client.clone(), webhook_config, shutdown.clone()));

    let mut controllers = tokio::spawn(controller::run(client, config, shutdown.clone()));
    let outcome = tokio::select! {
        () = super::shutdown_signal() => {
            tracing::info!("shutdown signal: draining");
            Ok(())
        }
        result = &mut controllers => Err(match result {
            Ok(Ok(())) => anyhow::anyhow!("the controllers stopped unexpectedly"),
            Ok(Err(e)) => anyhow::Error::new(e).context("the controllers stopped"),
            Err(e) => anyhow::Error::new(e).context("the controller task panicked"),
        }),
        result = &mut webhook_task => Err(match result {
            Ok(Ok(())) => anyhow::anyhow!("the webhook server stopped unexpectedly"),
            Ok(Err(e)) => anyhow::Error::new(e).context("the webhook server failed"),
            Err(e) => anyhow::Error::new(e).context("the webhook task panicked"),
        }),
        result = &mut admin => Err(match result {
            Ok(Ok(())) => anyhow::anyhow!("the admin server stopped unexpectedly"),
            Ok(Err(e)) => anyhow::Error::new(e).context("the admin server failed"),
            Err(e) => anyhow::Error::new(e).context("the admin server task panicked"),
        }),
    };
    shutdown.cancel();
    // Bounded: the controllers finish running reconciles and release the Lease, so a standby
    // takes it at its next check.
    if !controllers.is_finished() && tokio::time::timeout(SHUTDOWN_GRACE, &mut controllers).await.is_err() {
        tracing::warn!("the controllers did not stop within {} s", SHUTDOWN_GRACE.as_secs());
    }
    if !webhook_task.is_finished() {
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, webhook_task).await;
    }
    if !admin.is_finished() {
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, admin).await;
    }
    outcome
}

fn crds(output_dir: Option<PathBuf>) -> ExitCode {
    let rendered = match crd::render() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: rendering CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(dir) = output_dir else {
        for (_, yaml) in rendered {
            print!("---\n{yaml}");
        }
        return ExitCode::SUCCESS;
    };
    for (file, yaml) in rendered {
        let path = dir.join(file);
        if let Err(e) = std::fs::write(&path, yaml) {
            eprintln!("error: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
