//! `spearlet run`: the in-pod agent (flags → [`PodConfig`] → [`run_in_pod`]). The injecting
//! webhook sets these flags' variables; `tests/it/cli.rs` parses its container with them.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use super::agent_args::AgentArgs;
use crate::agent::{PodConfig, run_in_pod};
use crate::api::keys;
use crate::cli::run_until_signal;

/// Run the in-pod agent (Kubernetes mode): the pod's McpProfile and its namespace's
/// McpServers from the API (in-cluster config, or --kubeconfig), stdio servers through the
/// bridge sockets; the same doors as `serve`. Exit status as for `serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The McpProfile this pod uses (the webhook sets it from the pod's `mcp.spear.dev/profile`
    /// annotation).
    #[arg(long, env = keys::ENV_PROFILE)]
    pub(crate) profile: Option<String>,
    /// The pod's namespace: the profile and the McpServers are read there (the webhook sets it
    /// from the downward API). Defaults to the service account's namespace in a pod, or the
    /// kubeconfig context's.
    #[arg(long, env = keys::ENV_POD_NAMESPACE)]
    pub(crate) namespace: Option<String>,
    /// The pod's name, told to approval webhooks (the webhook sets it from the downward API).
    #[arg(long, env = keys::ENV_POD_NAME)]
    pub(crate) pod_name: Option<String>,
    /// Directory of the stdio servers' bridge sockets (`<dir>/<server>/mcp.sock`), shared with their
    /// sidecars.
    #[arg(long, env = keys::ENV_SOCKET_DIR, value_name = "DIR", default_value = keys::RUN_DIR)]
    pub(crate) socket_dir: PathBuf,
    /// The stdio servers this pod has sidecars for, comma-separated (the webhook sets it). A
    /// stdio server of the profile outside the list joined it after the pod started: the agent
    /// reports it (log and `mcp_server_restart_required`) and its calls say to restart the pod.
    /// Unset: every stdio server is expected to have a sidecar.
    #[arg(long, env = keys::ENV_SIDECAR_SERVERS, value_name = "IDS", value_delimiter = ',')]
    pub(crate) sidecar_servers: Option<Vec<String>>,
    /// The secret-backed header values the webhook delivered, `<server>/<header>`,
    /// comma-separated (the webhook sets it). The agent reads a server's `SPEAR_SECRET_*`
    /// variable only when listed. Unset: every one is read.
    #[arg(long, env = keys::ENV_SECRET_REFS, value_name = "REFS", value_delimiter = ',')]
    pub(crate) secret_refs: Option<Vec<String>>,
    /// Where each Streamable HTTP server's delivered credentials were granted to go,
    /// `<server>=<hash>`, comma-separated (the webhook sets it). A server whose URL, issuer or
    /// token mode changed since is not connected until the pod is recreated. Unset: not checked.
    #[arg(long, env = keys::ENV_GRANTED_DESTINATIONS, value_name = "ENTRIES", value_delimiter = ',')]
    pub(crate) granted_destinations: Option<Vec<String>>,
    /// kubeconfig file(s), `:`-separated, for running outside a cluster. Without it the pod's
    /// service account is used, falling back to `~/.kube/config`.
    #[arg(long, env = keys::ENV_KUBECONFIG, value_name = "PATH")]
    pub(crate) kubeconfig: Option<OsString>,
    #[command(flatten)]
    pub(crate) agent: AgentArgs,
}

impl RunArgs {
    pub(crate) fn config(self) -> anyhow::Result<PodConfig> {
        Ok(PodConfig {
            profile: self.profile,
            namespace: self.namespace,
            pod_name: self.pod_name,
            socket_dir: self.socket_dir,
            sidecar_servers: self.sidecar_servers,
            secret_refs: self.secret_refs,
            granted_destinations: self.granted_destinations,
            kubeconfig: self.kubeconfig,
            agent: self.agent.config(std::net::Ipv4Addr::UNSPECIFIED, 0)?,
        })
    }

    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let threads = usize::from(self.agent.worker_threads);
        let config = self.config()?;
        run_until_signal(threads, |cancel| async move { super::agent_outcome(run_in_pod(config, cancel).await) })
    }
}
