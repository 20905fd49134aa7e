//! `spear-operator run`: flags → [`OperatorConfig`] → [`crate::operator::run::run`]. The Helm
//! chart sets these flags; `tests/it/chart.rs` parses its Deployment's arguments with them.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, ValueEnum};

use crate::api::identity::{DEFAULT_FORBIDDEN_AUDIENCES, ForbiddenAudiences};
use crate::api::keys;
use crate::cli::{run_until_signal, usage};
use crate::operator::probe::{AddressDenyList, ProbeConfig, ProbeNamespaces};
use crate::operator::run::{AdminViewSettings, CertMode, OperatorConfig};
use crate::operator::webhook::NativeSidecars;
use crate::operator::webhook::client_auth::ClientAuth;
use crate::operator::webhook::rate_limit::{self, RateLimit};

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

    /// Address ranges the injected agents never connect to (their `--egress-deny-cidrs`):
    /// remote MCP servers, OAuth, approval webhooks, the upstream model. The default denies
    /// loopback, link-local (cloud metadata) and "this host"; an empty value allows every address.
    #[arg(long, env = keys::ENV_AGENT_EGRESS_DENY_CIDRS, default_value = AddressDenyList::AGENT_POD)]
    agent_egress_deny_cidrs: AddressDenyList,

    /// Seconds injected agents reuse a server's tools/list answer (their `--tools-ttl-seconds`,
    /// 30 to 300).
    #[arg(long, env = keys::ENV_AGENT_TOOLS_TTL_SECONDS, default_value_t = 60, value_parser = clap::value_parser!(u64).range(30..=300))]
    agent_tools_ttl_seconds: u64,

    /// Tool calls in flight at once in each injected agent, over all its servers (their
    /// `--max-concurrent-calls`).
    #[arg(long, env = keys::ENV_AGENT_MAX_CONCURRENT_CALLS, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    agent_max_concurrent_calls: u32,

    /// Token audiences (comma-separated patterns, `*` any run of characters, ASCII case
    /// ignored) an McpProfile's `identity.audiences: ["*"]` does not cover: the grant must list
    /// them literally. The default names the Kubernetes API server's and well-known cloud STSs';
    /// the cluster's service-account issuer is added when the operator can read it. Setting the
    /// flag replaces the list; an empty value forbids none.
    #[arg(long, env = keys::ENV_FORBIDDEN_TOKEN_AUDIENCES, value_delimiter = ',',
          default_values_t = DEFAULT_FORBIDDEN_AUDIENCES.iter().map(|a| a.to_string()).collect::<Vec<_>>())]
    forbidden_token_audiences: Vec<String>,

    #[command(flatten)]
    webhook: WebhookArgs,

    #[command(flatten)]
    admin_view: AdminViewArgs,
}

/// Flags of the read-only admin view (served on every replica when on).
#[derive(clap::Args, Clone, Debug)]
struct AdminViewArgs {
    /// Serve the read-only admin view (an HTML page, and its data at /view.json) on this
    /// address; unset: no admin view. 127.0.0.1:8090 for `kubectl port-forward`; 0.0.0.0:8090
    /// behind a Service. Pods are listed only with `list`/`watch` on pods (the chart grants
    /// them when it enables the view).
    #[arg(long, env = keys::ENV_ADMIN_VIEW_ADDR)]
    admin_view_addr: Option<SocketAddr>,

    /// Host names (comma-separated, without port) the admin view answers; any other `Host`
    /// gets 421, so a web page cannot read it through DNS rebinding. Add the Service's or
    /// Ingress's names when the view is reached through one.
    #[arg(long, env = keys::ENV_ADMIN_VIEW_ALLOWED_HOSTS, value_delimiter = ',',
          default_value = "localhost,127.0.0.1,::1")]
    admin_view_allowed_hosts: Vec<String>,
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

    /// PEM bundle of the CA(s) that issued the API server's webhook client certificate. Set: the
    /// webhook completes a TLS handshake only with a client presenting a certificate that chains
    /// to it (the file is re-read every 10 s, so a rotated bundle applies without a restart).
    /// Unset: no client certificate is asked for, and anyone who reaches the port gets reviews.
    #[arg(long, env = keys::ENV_WEBHOOK_CLIENT_CA_FILE)]
    webhook_client_ca_file: Option<PathBuf>,

    /// With --webhook-client-ca-file: accept only client certificates whose subject common name
    /// or a DNS subject alternative name is one of these (comma-separated; exact,
    /// case-insensitive). Needed when the CA also issues other certificates (a cluster CA).
    #[arg(long, env = keys::ENV_WEBHOOK_CLIENT_NAMES, value_delimiter = ',', requires = "webhook_client_ca_file")]
    webhook_client_names: Vec<String>,

    /// Sustained webhook requests per second from one source address (IPv6: per /64); over it,
    /// 429 with Retry-After before the request is read. 0 turns the limit off.
    #[arg(long, env = keys::ENV_WEBHOOK_RATE_LIMIT_PER_SECOND, default_value_t = rate_limit::DEFAULT_PER_SECOND)]
    webhook_rate_limit_per_second: u32,

    /// Webhook requests one source may send at once before the per-second rate applies.
    #[arg(long, env = keys::ENV_WEBHOOK_RATE_LIMIT_BURST, default_value_t = rate_limit::DEFAULT_BURST,
          value_parser = clap::value_parser!(u32).range(1..))]
    webhook_rate_limit_burst: u32,
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
            agent_egress_deny_cidrs,
            agent_tools_ttl_seconds,
            agent_max_concurrent_calls,
            forbidden_token_audiences,
            webhook,
            admin_view,
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
        let names: Vec<String> =
            webhook.webhook_client_names.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        if !webhook.webhook_client_names.is_empty() && names.is_empty() {
            return Err(usage(
                "--webhook-client-names names no name: give the client certificate's common name or DNS name, or leave the flag out",
            ));
        }
        let client_auth = webhook.webhook_client_ca_file.map(|file| ClientAuth::new(file, names));
        let allowed_hosts: Vec<String> = admin_view
            .admin_view_allowed_hosts
            .iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect();
        if admin_view.admin_view_addr.is_some() && allowed_hosts.is_empty() {
            return Err(usage(
                "--admin-view-allowed-hosts names no host: give the names the view is reached by (localhost for port-forward)",
            ));
        }
        let admin_view = admin_view.admin_view_addr.map(|addr| AdminViewSettings { addr, allowed_hosts });
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
            webhook_client_auth: client_auth,
            webhook_rate_limit: RateLimit {
                per_second: webhook.webhook_rate_limit_per_second,
                burst: webhook.webhook_rate_limit_burst,
            },
            admin_view,
            forbidden_audiences: ForbiddenAudiences::new(forbidden_token_audiences),
            agent_egress: agent_egress_deny_cidrs,
            agent_pool: vec![
                (keys::ENV_TOOLS_TTL_SECONDS.to_string(), agent_tools_ttl_seconds.to_string()),
                (keys::ENV_MAX_CONCURRENT_CALLS.to_string(), agent_max_concurrent_calls.to_string()),
            ],
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

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn config(extra: &[&str]) -> Result<OperatorConfig, String> {
        let base = ["spear-operator", "--agent-image=a:1", "--spearlet-image=s:1"];
        let cli = Cli::try_parse_from(base.iter().chain(extra)).map_err(|e| e.to_string())?;
        cli.run.config().map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn without_a_client_ca_no_client_certificate_is_asked_for_and_the_limit_has_its_defaults() {
        let config = config(&[]).expect("the defaults parse");
        assert_eq!(config.webhook_client_auth, None);
        assert_eq!(config.webhook_rate_limit, RateLimit::default());
    }

    #[test]
    fn client_ca_and_names_become_the_client_auth() {
        let config = config(&[
            "--webhook-client-ca-file=/client-ca/ca.crt",
            "--webhook-client-names=kube-apiserver-webhook-client, other",
            "--webhook-rate-limit-per-second=0",
            "--webhook-rate-limit-burst=7",
        ])
        .expect("the flags parse");
        let auth = config.webhook_client_auth.expect("client auth is on");
        assert_eq!(auth.ca_file, PathBuf::from("/client-ca/ca.crt"));
        assert_eq!(auth.names, ["kube-apiserver-webhook-client", "other"]);
        assert_eq!(config.webhook_rate_limit, RateLimit { per_second: 0, burst: 7 });
    }

    #[test]
    fn the_admin_view_is_off_unless_an_address_is_given_and_answers_loopback_names_by_default() {
        assert_eq!(config(&[]).expect("the defaults parse").admin_view, None);
        let view = config(&["--admin-view-addr=127.0.0.1:8090"]).expect("parses").admin_view.expect("on");
        assert_eq!(view.addr, SocketAddr::from(([127, 0, 0, 1], 8090)));
        assert_eq!(view.allowed_hosts, ["localhost", "127.0.0.1", "::1"]);
        let view = config(&["--admin-view-addr=0.0.0.0:8090", "--admin-view-allowed-hosts=view.example, x.svc"])
            .expect("parses")
            .admin_view
            .expect("on");
        assert_eq!(view.allowed_hosts, ["view.example", "x.svc"]);
        let error = config(&["--admin-view-addr=0.0.0.0:8090", "--admin-view-allowed-hosts=,"]).expect_err("no host");
        assert!(error.contains("--admin-view-allowed-hosts"), "{error}");
    }

    #[test]
    fn forbidden_token_audiences_default_to_the_api_servers_and_cloud_stss_and_can_be_replaced() {
        let defaults = config(&[]).expect("the defaults parse").forbidden_audiences;
        assert_eq!(defaults, ForbiddenAudiences::default());
        assert!(
            defaults.forbids("https://kubernetes.default.svc.cluster.local") && defaults.forbids("sts.amazonaws.com")
        );
        let replaced = config(&["--forbidden-token-audiences=https://issuer.example, aud-*"]).expect("parses");
        assert_eq!(replaced.forbidden_audiences.patterns(), ["https://issuer.example", "aud-*"]);
        let none = config(&["--forbidden-token-audiences="]).expect("parses");
        assert!(none.forbidden_audiences.patterns().is_empty());
    }

    #[test]
    fn injected_agents_deny_loopback_and_metadata_by_default_and_a_bad_range_fails_the_operator() {
        let defaults = config(&[]).expect("the defaults parse").agent_egress;
        assert!(
            defaults.denies("127.0.0.1".parse().expect("ip"))
                && defaults.denies("169.254.169.254".parse().expect("ip"))
        );
        let pool = config(&["--agent-tools-ttl-seconds=120"]).expect("parses").agent_pool;
        assert_eq!(
            pool,
            [("SPEAR_TOOLS_TTL_SECONDS".into(), "120".into()), ("SPEAR_MAX_CONCURRENT_CALLS".into(), "256".into())]
        );
        assert!(config(&["--agent-tools-ttl-seconds=5"]).is_err(), "under the 30 s floor");
        let none = config(&["--agent-egress-deny-cidrs="]).expect("parses").agent_egress;
        assert!(none.is_empty());
        let error = config(&["--agent-egress-deny-cidrs=10.0.0.0/8,metadata"]).expect_err("not a range");
        assert!(error.contains("--agent-egress-deny-cidrs") && error.contains("'metadata'"), "{error}");
    }

    #[test]
    fn names_without_a_ca_or_a_zero_burst_are_refused_naming_the_flag() {
        let error = config(&["--webhook-client-names=x"]).expect_err("names need a CA");
        assert!(error.contains("--webhook-client-ca-file"), "{error}");
        let error = config(&["--webhook-rate-limit-burst=0"]).expect_err("a burst of 0 admits nothing");
        assert!(error.contains("--webhook-rate-limit-burst"), "{error}");
        let error = config(&["--webhook-client-ca-file=/ca.crt", "--webhook-client-names=,"]).expect_err("no name");
        assert!(error.contains("--webhook-client-names"), "{error}");
    }
}
