//! The flags of the agent's doors, shared by `spearlet serve` and `spearlet run`, and their
//! plain form ([`AgentConfig`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::agent::{AgentConfig, AuditTarget, PoolLimits};
use crate::api::api_key::ApiKey;
use crate::api::keys;
use crate::chat::UpstreamOverride;
use crate::cli::usage;
use crate::http_server::ConnectionLimits;

#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// Chat completions and /mcp (loopback: only the pod itself may use its tools).
    #[arg(long, env = keys::ENV_HTTP_ADDR, default_value_t = SocketAddr::from((Ipv4Addr::LOCALHOST, keys::PORT_HTTP)))]
    pub(crate) http_addr: SocketAddr,
    /// gRPC (McpSessions, McpRegistry).
    #[arg(long, env = keys::ENV_GRPC_ADDR, default_value_t = SocketAddr::from((Ipv4Addr::LOCALHOST, keys::PORT_GRPC)))]
    pub(crate) grpc_addr: SocketAddr,
    /// /healthz, /readyz, /metrics; /debug/effective answers loopback callers only. Default:
    /// 127.0.0.1:4042 for `serve` (a developer's machine), 0.0.0.0:4042 for `run` (the kubelet's
    /// probes and the scrapers reach it from outside the pod).
    #[arg(long, env = keys::ENV_ADMIN_ADDR)]
    pub(crate) admin_addr: Option<SocketAddr>,
    /// OpenAI-compatible upstream base URL (overrides the profile's chat.upstream.url).
    #[arg(long, env = keys::ENV_UPSTREAM_URL, value_name = "URL")]
    pub(crate) upstream_url: Option<String>,
    /// Name of the env var holding the upstream API key (its value is never logged); by default
    /// SPEAR_UPSTREAM_API_KEY, which the webhook sets from the profile's apiKeySecretRef.
    #[arg(long, env = keys::ENV_UPSTREAM_API_KEY_ENV, value_name = "VAR")]
    pub(crate) upstream_api_key_env: Option<String>,
    /// Audit log: `stderr`, `off`, or a file path (appended).
    #[arg(long, env = keys::ENV_AUDIT_LOG, default_value = "stderr")]
    pub(crate) audit_log: AuditTarget,
    /// Include tool-call arguments in audit lines (redacted by default: they may hold secrets).
    #[arg(long, env = keys::ENV_AUDIT_ARGUMENTS)]
    pub(crate) audit_arguments: bool,
    /// Seconds in-flight requests may take to finish after SIGTERM.
    #[arg(long, env = keys::ENV_SHUTDOWN_GRACE_SECONDS, default_value_t = 10)]
    pub(crate) shutdown_grace_seconds: u64,
    /// Runtime threads. 1 (the default) runs everything on one thread: a pod's agent is I/O-bound
    /// and usually has a fraction of a core.
    #[arg(long, env = keys::ENV_WORKER_THREADS, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) worker_threads: u16,
    /// `Host` header values chat completions, /mcp and the admin port accept (DNS-rebinding
    /// protection), repeatable; the admin port also accepts any IP address and `localhost`.
    #[arg(long = "allowed-host", env = keys::ENV_ALLOWED_HOSTS, value_delimiter = ',', default_values_t = ["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()])]
    pub(crate) allowed_hosts: Vec<String>,
    /// Web page origins (`scheme://host:port`) allowed to call chat completions and /mcp,
    /// repeatable; none by default: a request carrying any other `Origin` is refused.
    #[arg(long = "allowed-origin", env = keys::ENV_ALLOWED_ORIGINS, value_delimiter = ',')]
    pub(crate) allowed_origins: Vec<String>,
    /// Seconds a client may take to send a request head on port 4040, the gRPC door and the admin
    /// port, and may leave a keep-alive connection idle (slowloris protection).
    #[arg(long, env = keys::ENV_HEADER_READ_TIMEOUT_SECONDS, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) header_read_timeout_seconds: u64,
    /// Open connections each of port 4040, the gRPC door and the admin port keeps; more are
    /// closed at once.
    #[arg(long, env = keys::ENV_MAX_CONNECTIONS, default_value_t = 512, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) max_connections: u16,
    /// Seconds a /mcp session may go unused (no request, no call in flight) before the agent
    /// closes it; its client then gets 404 and initializes a new one.
    #[arg(long, env = keys::ENV_MCP_SESSION_IDLE_SECONDS, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) mcp_session_idle_seconds: u64,
    /// The key chat completions, /mcp and gRPC require as `Authorization: Bearer <key>` (16 to
    /// 512 characters of a bearer token's alphabet). The webhook sets it in a pod; unset in local
    /// mode, the doors take any caller on loopback. Prefer the variable: a flag's value shows in
    /// the process list.
    #[arg(long, env = keys::ENV_API_KEY, hide_env_values = true, value_name = "KEY", value_parser = parse_api_key)]
    pub(crate) api_key: Option<ApiKey>,
    /// Address ranges (CIDRs or addresses, comma-separated) the agent never connects to: remote
    /// MCP servers, OAuth, approval webhooks and the upstream model, checked on the addresses
    /// dialled. Default: link-local (cloud metadata), the metadata addresses outside it and
    /// 0.0.0.0/8, plus loopback in a pod. Empty: no range (HTTP(S)_PROXY is used only then).
    #[arg(long, env = keys::ENV_EGRESS_DENY_CIDRS, value_name = "CIDRS")]
    pub(crate) egress_deny_cidrs: Option<crate::egress::AddressDenyList>,
    /// Seconds a server's tools/list answer is reused (30 to 300) before it is asked again; a
    /// server's `notifications/tools/list_changed` refreshes it at once.
    #[arg(long, env = keys::ENV_TOOLS_TTL_SECONDS, default_value_t = 60, value_parser = clap::value_parser!(u64).range(30..=300))]
    pub(crate) tools_ttl_seconds: u64,
    /// Tool calls in flight over all servers at once; more wait (each server's
    /// `budgets.maxConcurrency` applies too).
    #[arg(long, env = keys::ENV_MAX_CONCURRENT_CALLS, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub(crate) max_concurrent_calls: u32,
    /// stdio servers run as child processes at once (local mode; in a pod they are sidecars).
    #[arg(long, env = keys::ENV_MAX_STDIO_CHILDREN, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) max_stdio_children: u32,
    /// Seconds a server's session may go without a call before it is closed (a stdio child is
    /// then stopped; the next call starts it again); 0 keeps sessions. Default: 600 for `serve`,
    /// 0 for `run` (a pod's sidecars run anyway, and a restart would cost the next call a start).
    #[arg(long, env = keys::ENV_SERVER_IDLE_SECONDS, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub(crate) server_idle_seconds: Option<u64>,
    /// Refuse a call whose arguments break the tool's listed inputSchema before it reaches the
    /// server (`mcp_invalid_arguments` naming the first violation). Off: the server validates.
    #[arg(long, env = keys::ENV_CHECK_ARGUMENTS)]
    pub(crate) check_arguments: bool,
}

/// `--api-key`'s parser: the key, or why it is not one.
pub(crate) fn parse_api_key(value: &str) -> Result<ApiKey, String> {
    ApiKey::parse(value).map_err(|e| format!("the key {e}"))
}

impl AgentArgs {
    /// The plain configuration; `admin_ip` is the admin port's address when `--admin-addr` is
    /// not given. Reads the key variable `--upstream-api-key-env` names; an unset one is a usage
    /// error rather than a chat door that fails every request later.
    pub(crate) fn config(self, admin_ip: Ipv4Addr, default_server_idle: u64) -> anyhow::Result<AgentConfig> {
        if let Some(var) = self.upstream_api_key_env.as_deref()
            && std::env::var(var).map_or(true, |v| v.is_empty())
        {
            return Err(usage(format!(
                "--upstream-api-key-env: the env var {var} is not set (export it, or drop the flag)"
            )));
        }
        Ok(AgentConfig {
            http_addr: self.http_addr,
            grpc_addr: self.grpc_addr,
            admin_addr: self.admin_addr.unwrap_or(SocketAddr::from((admin_ip, keys::PORT_ADMIN))),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_seconds),
            allowed_hosts: self.allowed_hosts,
            allowed_origins: self.allowed_origins,
            upstream: UpstreamOverride::from_flags(self.upstream_url, self.upstream_api_key_env.as_deref()),
            audit: self.audit_log,
            audit_arguments: self.audit_arguments,
            connection_limits: ConnectionLimits {
                header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds),
                max_connections: usize::from(self.max_connections),
            },
            mcp_session_idle: Duration::from_secs(self.mcp_session_idle_seconds),
            api_key: self.api_key,
            egress: self.egress_deny_cidrs,
            pool: PoolLimits {
                tools_ttl: Duration::from_secs(self.tools_ttl_seconds),
                max_concurrent_calls: self.max_concurrent_calls as usize,
                max_children: self.max_stdio_children as usize,
                server_idle: match self.server_idle_seconds.unwrap_or(default_server_idle) {
                    0 => None,
                    seconds => Some(Duration::from_secs(seconds)),
                },
                check_arguments: self.check_arguments,
            },
        })
    }
}
