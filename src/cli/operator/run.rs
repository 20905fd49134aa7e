//! `spear-operator run`: flags → [`OperatorConfig`] → [`crate::operator::run::run`]. The Helm
//! chart sets these flags; `tests/it/chart.rs` parses its Deployment's arguments with them.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, ValueEnum};

use crate::api::keys;
use crate::cli::{run_until_signal, usage};
use crate::operator::probe::{AddressDenyList, ProbeConfig, ProbeNamespaces};
use crate::operator::run::{CertMode, OperatorConfig};
use crate::operator::webhook::NativeSidecars;

/// Run the operator: status controllers (leader only), admin server, webhook.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// The operator's own namespace (its leader Lease and webhook Secret live there). Unset:
    /// `POD_NAMESPACE` (the chart sets it from the downward API), else the client's namespace.
    #[arg(long, env = keys::ENV_NAMESPACE)]
    namespace: Option<String>,

    /// Watch McpServers, McpProfiles and namespaces in this namespace only (a namespaced
    /// install); unset watches the whole cluster.
    #[arg(long, env = keys::ENV_WATCH_NAMESPACE)]
    watch_namespace: Option<String>,

    /// Admin server address: `/healthz`, `/readyz`, `/metrics`.
    #[arg(long, env = keys::ENV_METRICS_ADDR, default_value_t = SocketAddr::from((Ipv4Addr::UNSPECIFIED, keys::PORT_OPERATOR_METRICS)))]
    metrics_addr: SocketAddr,

    /// Elect a leader with a Lease so that several replicas are safe (only the leader writes).
    #[arg(long, env = keys::ENV_LEADER_ELECTION, default_value_t = true, action = ArgAction::Set)]
    leader_election: bool,

    /// Name of the leader-election Lease in the operator's namespace.
    #[arg(long, env = keys::ENV_LEASE_NAME, default_value = keys::OPERATOR_LEASE)]
    lease_name: String,

    /// Seconds between probes of a Streamable HTTP McpServer that answers (failures are
    /// retried sooner, backing off up to this).
    #[arg(long, env = keys::ENV_PROBE_INTERVAL_SECONDS, default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    probe_interval_seconds: u64,

    /// Which namespaces' Streamable HTTP McpServers the operator probes: `injection-enabled`
    /// (labelled mcp.spear.dev/injection=enabled, where pods can use them), `all` or `none`.
    #[arg(long, env = keys::ENV_PROBE_NAMESPACES, value_enum, default_value_t = ProbeNamespaces::InjectionEnabled)]
    probe_namespaces: ProbeNamespaces,

    /// Address ranges probes never connect to, comma-separated CIDRs; an empty value allows
    /// every address. Checked on the resolved addresses, so names that resolve there are
    /// refused too.
    #[arg(long, env = keys::ENV_PROBE_DENY_CIDRS, default_value = AddressDenyList::DEFAULT)]
    probe_deny_cidrs: AddressDenyList,

    #[command(flatten)]
    webhook: WebhookArgs,
}

/// Where the webhook's serving certificate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CertModeArg {
    /// The operator's own CA and certificate, kept in a Secret and rotated; it keeps the
    /// webhook configuration's `caBundle` current.
    SelfSigned,
    /// `tls.crt` and `tls.key` from `--cert-dir` (for example a cert-manager Secret volume).
    Files,
}

/// Flags of the mutating webhook (served on every replica).
#[derive(clap::Args, Clone, Debug)]
struct WebhookArgs {
    /// Webhook HTTPS address.
    #[arg(long, env = keys::ENV_WEBHOOK_ADDR, default_value_t = SocketAddr::from((Ipv4Addr::UNSPECIFIED, keys::PORT_WEBHOOK)))]
    webhook_addr: SocketAddr,

    /// The MutatingWebhookConfiguration whose `caBundle` the operator keeps (self-signed mode).
    #[arg(long, env = keys::ENV_WEBHOOK_CONFIG_NAME, default_value = keys::WEBHOOK_CONFIGURATION)]
    webhook_config_name: String,

    /// The webhook's Service; the certificate is issued for `<service>.<namespace>.svc`.
    #[arg(long, env = keys::ENV_WEBHOOK_SERVICE_NAME, default_value = keys::WEBHOOK_SERVICE)]
    webhook_service_name: String,

    /// Where the serving certificate comes from.
    #[arg(long, env = keys::ENV_CERT_MODE, value_enum, default_value_t = CertModeArg::SelfSigned)]
    cert_mode: CertModeArg,

    /// Directory holding `tls.crt` and `tls.key` (required with `--cert-mode files`).
    #[arg(long, env = keys::ENV_CERT_DIR, required_if_eq("cert_mode", "files"))]
    cert_dir: Option<PathBuf>,

    /// Image of the injected agent container.
    #[arg(long, env = keys::ENV_AGENT_IMAGE)]
    agent_image: Option<String>,

    /// Image of the init container that copies the static spearlet into the pod.
    #[arg(long, env = keys::ENV_SPEARLET_IMAGE)]
    spearlet_image: Option<String>,

    /// Inject stdio sidecars as native sidecars: `auto` asks the API server's version.
    #[arg(long, env = keys::ENV_NATIVE_SIDECARS, value_enum, default_value_t = NativeSidecars::Auto)]
    native_sidecars: NativeSidecars,
}

impl RunArgs {
    pub(crate) fn config(self) -> anyhow::Result<OperatorConfig> {
        let RunArgs {
            namespace,
            watch_namespace,
            metrics_addr,
            leader_election,
            lease_name,
            probe_interval_seconds,
            probe_namespaces,
            probe_deny_cidrs,
            webhook,
        } = self;
        let (Some(agent_image), Some(spearlet_image)) = (webhook.agent_image, webhook.spearlet_image) else {
            return Err(usage(format!(
                "--agent-image and --spearlet-image (env {}, {}) are required: the webhook injects them into pods \
                 (the Helm chart sets both)",
                keys::ENV_AGENT_IMAGE,
                keys::ENV_SPEARLET_IMAGE
            )));
        };
        let cert = match webhook.cert_mode {
            CertModeArg::SelfSigned => CertMode::SelfSigned { webhook_config_name: webhook.webhook_config_name },
            CertModeArg::Files => CertMode::Files {
                dir: webhook.cert_dir.ok_or_else(|| usage("--cert-dir is required with --cert-mode files"))?,
            },
        };
        let namespace = namespace.or_else(|| std::env::var(keys::ENV_POD_NAMESPACE).ok()).filter(|ns| !ns.is_empty());
        Ok(OperatorConfig {
            namespace,
            watch_namespace,
            metrics_addr,
            leader_election,
            lease_name,
            probe: ProbeConfig {
                interval: Duration::from_secs(probe_interval_seconds),
                namespaces: probe_namespaces,
                deny: probe_deny_cidrs,
                ..ProbeConfig::default()
            },
            webhook_addr: webhook.webhook_addr,
            webhook_service_name: webhook.webhook_service_name,
            cert,
            agent_image,
            spearlet_image,
            native_sidecars: webhook.native_sidecars,
        })
    }

    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.config()?;
        // One worker per core: the webhook answers while reconciles run.
        let threads = std::thread::available_parallelism().map_or(2, usize::from);
        run_until_signal(threads, |shutdown| async move {
            crate::operator::run::run(config, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        })
    }
}
