//! `spearlet gateway`: the shared agent for callers without an injected one (flags →
//! [`GatewayConfig`] → [`run_gateway`]). Its own flags, not the per-pod agent's: it listens on
//! every interface, takes no pod key, and has no gRPC door or stdio children.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use crate::agent::{AgentConfig, AuditTarget, PoolLimits};
use crate::api::keys;
use crate::chat::UpstreamOverride;
use crate::cli::run_until_signal;
use crate::gateway::{DEFAULT_AUDIENCE, GatewayConfig, run_gateway};
use crate::http_server::ConnectionLimits;

/// Run the gateway: `/mcp` for callers that authenticate with a bearer token (a projected
/// ServiceAccount token with the gateway's audience, checked by TokenReview) and get the
/// McpProfile an McpProfileBinding gives them; health and metrics on --admin-addr. Exit status as
/// for `serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct GatewayArgs {
    /// The namespace whose McpServers, McpProfiles and McpProfileBindings are served; default:
    /// the service account's namespace in a pod, or the kubeconfig context's.
    #[arg(long)]
    pub(crate) namespace: Option<String>,
    /// kubeconfig file(s), `:`-separated; without it the pod's service account is used, falling
    /// back to `~/.kube/config`.
    #[arg(long, env = keys::ENV_KUBECONFIG, value_name = "PATH")]
    pub(crate) kubeconfig: Option<OsString>,
    /// The audience callers' tokens must carry (a projected ServiceAccount token's `audience`).
    #[arg(long, default_value = DEFAULT_AUDIENCE)]
    pub(crate) audience: String,
    /// The authorization server(s) the protected-resource metadata names (repeatable); default:
    /// the API server's service-account issuer.
    #[arg(long = "authorization-server", value_name = "URL")]
    pub(crate) authorization_servers: Vec<String>,
    /// The URL callers reach the gateway at (`https://mcp.example.com`), for the resource
    /// metadata; default: `http://<Host of the request>`.
    #[arg(long, value_name = "URL")]
    pub(crate) public_url: Option<String>,
    /// /mcp and the resource metadata.
    #[arg(long, default_value_t = SocketAddr::from((Ipv4Addr::UNSPECIFIED, keys::PORT_HTTP)))]
    pub(crate) http_addr: SocketAddr,
    /// /healthz, /readyz, /metrics.
    #[arg(long, default_value_t = SocketAddr::from((Ipv4Addr::UNSPECIFIED, keys::PORT_ADMIN)))]
    pub(crate) admin_addr: SocketAddr,
    /// `Host` header values accepted (repeatable); none: any (callers authenticate).
    #[arg(long = "allowed-host", value_delimiter = ',')]
    pub(crate) allowed_hosts: Vec<String>,
    /// Web page origins allowed (repeatable); none by default: a request with any `Origin` is
    /// refused.
    #[arg(long = "allowed-origin", value_delimiter = ',')]
    pub(crate) allowed_origins: Vec<String>,
    /// Audit log: `stderr`, `off`, or a file path (appended).
    #[arg(long, default_value = "stderr")]
    pub(crate) audit_log: AuditTarget,
    /// Include tool-call arguments in audit lines (redacted by default).
    #[arg(long)]
    pub(crate) audit_arguments: bool,
    /// Seconds in-flight requests may take to finish after SIGTERM.
    #[arg(long, default_value_t = 10)]
    pub(crate) shutdown_grace_seconds: u64,
    /// Runtime threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) worker_threads: u16,
    /// Seconds a client may take to send a request head, and leave a connection idle.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) header_read_timeout_seconds: u64,
    /// Open connections each port keeps; more are closed at once.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) max_connections: u16,
    /// Seconds a /mcp session may go unused before it is closed.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) mcp_session_idle_seconds: u64,
    /// Address ranges the gateway never connects to (as the agent's flag); default: link-local,
    /// the metadata addresses, 0.0.0.0/8 and loopback.
    #[arg(long, value_name = "CIDRS")]
    pub(crate) egress_deny_cidrs: Option<crate::egress::AddressDenyList>,
    /// Tool calls in flight over all servers, per profile.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub(crate) max_concurrent_calls: u32,
    /// Refuse arguments that break the tool's inputSchema before they leave.
    #[arg(long)]
    pub(crate) check_arguments: bool,
}

impl GatewayArgs {
    pub(crate) fn config(self) -> GatewayConfig {
        let pool = PoolLimits {
            max_concurrent_calls: self.max_concurrent_calls as usize,
            check_arguments: self.check_arguments,
            ..PoolLimits::default()
        };
        GatewayConfig {
            namespace: self.namespace,
            kubeconfig: self.kubeconfig,
            audience: self.audience,
            authorization_servers: self.authorization_servers,
            public_url: self.public_url,
            agent: AgentConfig {
                http_addr: self.http_addr,
                // No gRPC door in the gateway; never bound.
                grpc_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                admin_addr: self.admin_addr,
                shutdown_grace: Duration::from_secs(self.shutdown_grace_seconds),
                allowed_hosts: self.allowed_hosts,
                allowed_origins: self.allowed_origins,
                upstream: UpstreamOverride::default(),
                audit: self.audit_log,
                audit_arguments: self.audit_arguments,
                connection_limits: ConnectionLimits {
                    header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds),
                    max_connections: usize::from(self.max_connections),
                },
                mcp_session_idle: Duration::from_secs(self.mcp_session_idle_seconds),
                api_key: None,
                egress: self.egress_deny_cidrs,
                pool,
            },
        }
    }

    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let threads = usize::from(self.worker_threads);
        let config = self.config();
        run_until_signal(threads, |cancel| async move { super::agent_outcome(run_gateway(config, cancel).await) })
    }
}
